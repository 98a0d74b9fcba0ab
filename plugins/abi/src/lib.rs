//! The versioned C ABI of amk op plugins.
//!
//! A plugin is a shared library (a Rust `cdylib` or anything that speaks C) exporting one
//! `extern "C"` entry symbol per ABI version it implements — [`ENTRY_SYMBOL`]
//! (`amk_plugin_entry_v1`) for this version. The entry returns a pointer to a
//! [`PluginDescriptorV1`]: the plugin's name and version, the ABI version and struct sizes it
//! was built against, and a table of [`OpDescriptorV1`]s (namespaced name, requested code
//! ≥ 1000, arity, params, a CPU reference function, optional CUDA source).
//!
//! Two sides live here:
//! - plugin authors build descriptors with the `const fn` constructors and export them with
//!   [`export_plugin!`]; [`cpu_reference!`] wraps a safe Rust function into the C reference
//!   signature, catching panics so that none ever unwinds into the host;
//! - the host loads a library with [`PluginRegistry::load_plugin`] (implemented for
//!   [`amk_core::Registry`]), which checks the descriptor, copies every name and source into
//!   owned data and registers the ops with a dynamic CPU reference.
//!
//! Versioning rule: a layout change of any `#[repr(C)]` struct here, or of the meaning of a
//! field, is a new ABI version with a new entry symbol (`amk_plugin_entry_v2`); the host
//! refuses descriptors whose `abi_version` or struct sizes differ from its own.

mod error;
mod host;
pub mod plugin;

pub use error::PluginError;
pub use host::{
    CudaSource, LoadedOp, LoadedPlugin, PluginRegistry, find_built_cdylib, load_plugin_with_entry,
    register_descriptor,
};

/// The ABI version this crate speaks.
pub const ABI_VERSION: u32 = 1;

/// The entry symbol of ABI version 1.
pub const ENTRY_SYMBOL: &str = "amk_plugin_entry_v1";

/// Smallest code a plugin op may request (codes below are the built-in ABI opcodes).
pub const FIRST_PLUGIN_CODE: u32 = 1000;

/// Param type tag: a JSON integer (within int32 for the device).
pub const PARAM_INT: u32 = 0;
/// Param type tag: a JSON number.
pub const PARAM_REAL: u32 = 1;

/// Status a reference returns on success; anything else is an error.
pub const STATUS_OK: i32 = 0;
/// Status for an error the plugin reported (its message is in the error buffer).
pub const STATUS_ERROR: i32 = 1;
/// Status for a panic caught inside the plugin.
pub const STATUS_PANIC: i32 = 2;

/// The type of the entry symbol: returns the plugin's descriptor (never null for a valid
/// plugin), which must stay valid and unchanged for as long as the library is loaded.
pub type EntryFnV1 = unsafe extern "C" fn() -> *const PluginDescriptorV1;

/// A CPU reference implementation. `args` is valid for the duration of the call; the function
/// writes its outputs through `args.outputs`, returns [`STATUS_OK`] or a non-zero status, and on
/// error may write a UTF-8 message of at most `err_cap` bytes into `err` (NUL-terminated if it
/// fits). It must not unwind.
pub type CpuReferenceFnV1 =
    unsafe extern "C" fn(args: *const CpuArgsV1, err: *mut u8, err_cap: usize) -> i32;

/// A borrowed UTF-8 string: pointer and byte length (no NUL terminator needed). `len == 0`
/// with a null pointer is the empty string / "absent".
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AmkStr {
    /// First byte (may be null only when `len == 0`).
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

impl AmkStr {
    /// The empty / absent string.
    pub const EMPTY: AmkStr = AmkStr {
        ptr: std::ptr::null(),
        len: 0,
    };

    /// Borrows a static string.
    pub const fn new(s: &'static str) -> Self {
        AmkStr {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }
}

/// A param an op declares.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ParamDeclV1 {
    /// Key.
    pub name: AmkStr,
    /// [`PARAM_INT`] or [`PARAM_REAL`].
    pub ty: u32,
    /// Non-zero if every task must carry it.
    pub required: u32,
}

impl ParamDeclV1 {
    /// A required param of type `ty` ([`PARAM_INT`] / [`PARAM_REAL`]).
    pub const fn required(name: &'static str, ty: u32) -> Self {
        ParamDeclV1 {
            name: AmkStr::new(name),
            ty,
            required: 1,
        }
    }
    /// An optional param of type `ty`.
    pub const fn optional(name: &'static str, ty: u32) -> Self {
        ParamDeclV1 {
            name: AmkStr::new(name),
            ty,
            required: 0,
        }
    }
}

/// One op a plugin provides.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OpDescriptorV1 {
    /// Namespaced name, `namespace.op` (e.g. `example.gelu_tanh`).
    pub name: AmkStr,
    /// One line for listings (may be empty).
    pub summary: AmkStr,
    /// Requested opcode, ≥ [`FIRST_PLUGIN_CODE`].
    pub code: u32,
    /// Fewest inputs.
    pub min_inputs: u32,
    /// Most inputs.
    pub max_inputs: u32,
    /// Exact number of outputs.
    pub n_outputs: u32,
    /// Declared params (`n_params` entries; may be null when `n_params == 0`).
    pub params: *const ParamDeclV1,
    /// Number of declared params.
    pub n_params: usize,
    /// The CPU reference, if any.
    pub cpu_reference: Option<CpuReferenceFnV1>,
    /// CUDA device-function source text (empty: no CUDA implementation). Carried by the host,
    /// not compiled yet.
    pub cuda_source: AmkStr,
    /// Name of the device function in `cuda_source`.
    pub cuda_entry: AmkStr,
    /// Dynamic shared memory the device function needs, in bytes.
    pub cuda_shared_bytes: u32,
}

impl OpDescriptorV1 {
    /// An op with no params, no summary and no CUDA source.
    pub const fn new(
        name: &'static str,
        code: u32,
        min_inputs: u32,
        max_inputs: u32,
        n_outputs: u32,
        cpu_reference: Option<CpuReferenceFnV1>,
    ) -> Self {
        OpDescriptorV1 {
            name: AmkStr::new(name),
            summary: AmkStr::EMPTY,
            code,
            min_inputs,
            max_inputs,
            n_outputs,
            params: std::ptr::null(),
            n_params: 0,
            cpu_reference,
            cuda_source: AmkStr::EMPTY,
            cuda_entry: AmkStr::EMPTY,
            cuda_shared_bytes: 0,
        }
    }
    /// With declared params.
    pub const fn with_params(mut self, params: &'static [ParamDeclV1]) -> Self {
        self.params = params.as_ptr();
        self.n_params = params.len();
        self
    }
    /// With a one-line summary.
    pub const fn with_summary(mut self, summary: &'static str) -> Self {
        self.summary = AmkStr::new(summary);
        self
    }
    /// With a CUDA device function (source text, function name, shared-memory bytes).
    pub const fn with_cuda(
        mut self,
        source: &'static str,
        entry: &'static str,
        shared_bytes: u32,
    ) -> Self {
        self.cuda_source = AmkStr::new(source);
        self.cuda_entry = AmkStr::new(entry);
        self.cuda_shared_bytes = shared_bytes;
        self
    }
}

/// What the entry symbol returns.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PluginDescriptorV1 {
    /// [`ABI_VERSION`] the plugin was built against.
    pub abi_version: u32,
    /// `size_of::<PluginDescriptorV1>()` as the plugin sees it.
    pub struct_size: u32,
    /// `size_of::<OpDescriptorV1>()` as the plugin sees it.
    pub op_struct_size: u32,
    /// Plugin name.
    pub name: AmkStr,
    /// Plugin version (free text, e.g. `0.1.0`).
    pub version: AmkStr,
    /// The op table (`n_ops` entries).
    pub ops: *const OpDescriptorV1,
    /// Number of ops.
    pub n_ops: usize,
}

impl PluginDescriptorV1 {
    /// A descriptor for this ABI version, sizes filled in.
    pub const fn new(
        name: &'static str,
        version: &'static str,
        ops: &'static [OpDescriptorV1],
    ) -> Self {
        PluginDescriptorV1 {
            abi_version: ABI_VERSION,
            struct_size: std::mem::size_of::<PluginDescriptorV1>() as u32,
            op_struct_size: std::mem::size_of::<OpDescriptorV1>() as u32,
            name: AmkStr::new(name),
            version: AmkStr::new(version),
            ops: ops.as_ptr(),
            n_ops: ops.len(),
        }
    }
}

// The descriptor types hold raw pointers, which are not `Sync`; plugins keep them in statics.
// SAFETY: every constructor above only stores pointers to `&'static` data, which is immutable
// and shareable between threads; neither side ever writes through these pointers.
#[allow(unsafe_code)]
unsafe impl Sync for AmkStr {}
// SAFETY: as for `AmkStr` (pointers to immutable static data only).
#[allow(unsafe_code)]
unsafe impl Sync for ParamDeclV1 {}
// SAFETY: as for `AmkStr` (pointers to immutable static data and a function pointer).
#[allow(unsafe_code)]
unsafe impl Sync for OpDescriptorV1 {}
// SAFETY: as for `AmkStr` (pointers to immutable static data only).
#[allow(unsafe_code)]
unsafe impl Sync for PluginDescriptorV1 {}

/// One tensor operand of a reference call. Inputs are read-only; outputs arrive holding the
/// buffer's current contents (elements the op does not write keep them).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TensorV1 {
    /// Element type: the amk `DType` ABI code (0 = F32, 1 = F16, 2 = BF16, …).
    pub dtype: u32,
    /// Number of dimensions.
    pub rank: u32,
    /// `rank` extents, outermost first.
    pub shape: *const u64,
    /// Little-endian element bytes (row-major, packed I4 two per byte).
    pub data: *mut u8,
    /// Length of `data` in bytes.
    pub nbytes: usize,
}

/// One integer or real param of the task being run.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ParamV1 {
    /// Key.
    pub name: AmkStr,
    /// [`PARAM_INT`] (`int_value` holds it) or [`PARAM_REAL`] (`real_value` holds it).
    pub ty: u32,
    /// The value of an integer param (also set, truncated, for reals).
    pub int_value: i64,
    /// The value of a real param (also set for integers).
    pub real_value: f64,
}

/// The arguments of one reference call; valid only for the duration of the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CpuArgsV1 {
    /// `size_of::<CpuArgsV1>()` as the host sees it.
    pub struct_size: u32,
    /// Inputs (`n_inputs` entries).
    pub inputs: *const TensorV1,
    /// Number of inputs.
    pub n_inputs: usize,
    /// Outputs (`n_outputs` entries).
    pub outputs: *const TensorV1,
    /// Number of outputs.
    pub n_outputs: usize,
    /// The task's integer and real params (`n_params` entries).
    pub params: *const ParamV1,
    /// Number of params.
    pub n_params: usize,
}
