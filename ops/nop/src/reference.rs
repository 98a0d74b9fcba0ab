//! CPU reference of NOP: no operands, no effect. The only thing it checks is the arity
//! (0 inputs, 0 outputs), so a malformed NOP is a typed error rather than a silent success.

use amk_core::{CpuCall, OpError};

/// Runs one NOP task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(0, 0, 0)
}
