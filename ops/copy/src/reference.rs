//! CPU reference of COPY: `out[i] = in[i]`, cast on store. Operands are viewed: only the
//! element counts must agree, not the dims.
//!
//! Floating values go through `f32` (every supported dtype converts to `f32` exactly). When both
//! operands have integer dtypes the copy goes through `i64` instead, so large `I32` values
//! (beyond 2^24, where `f32` loses integers) are copied exactly.

use amk_core::{CpuCall, OpError};

/// Runs one COPY task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(1, 1, 1)?;
    let x = call.input(0)?;
    let out = call.output(0)?;
    let n = out.numel();
    if x.numel() != n {
        return Err(OpError::Shape(format!(
            "COPY needs equal element counts, got {} -> {n}",
            x.numel()
        )));
    }
    if x.dtype().is_integer() && out.dtype().is_integer() {
        for i in 0..n {
            out.set_i64(i, x.get_i64(i));
        }
    } else {
        for i in 0..n {
            out.set_f32(i, x.get_f32(i));
        }
    }
    Ok(())
}
