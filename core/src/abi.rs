//! ABI constants of the device instruction format, in one place. The CUDA backend mirrors them
//! in its C header and checks the two agree.

/// ABI major version.
pub const VERSION_MAJOR: u32 = 0;
/// ABI minor version.
pub const VERSION_MINOR: u32 = 2;
/// Most inputs one instruction holds.
pub const MAX_INPUTS: usize = 8;
/// Most outputs one instruction holds.
pub const MAX_OUTPUTS: usize = 4;
/// Most waits one instruction holds.
pub const MAX_WAITS: usize = 8;
/// Highest buffer rank the device describes.
pub const MAX_RANK: usize = 4;
