//! CPU reference of MUL: with two inputs `out[i] = a[i] · b[i]`; with one input
//! `out[i] = x[i] · scale` (param `scale`, default 1.0, rounded to `f32` as the device param
//! block carries it). Computed in `f32`, cast on store; operands are viewed (only the element
//! counts must agree).
//!
//! As in the reference, `scale` only applies to the one-input form: with two inputs it is
//! ignored (but, like any param, must be a number if present).

use amk_core::{CpuCall, OpError};

/// Runs one MUL task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(1, 2, 1)?;
    let scale = call.real_opt("scale")?.unwrap_or(1.0) as f32;
    let a = call.input(0)?;
    let b = if call.n_inputs() == 2 {
        Some(call.input(1)?)
    } else {
        None
    };
    let out = call.output(0)?;
    let n = out.numel();
    if a.numel() != n || b.is_some_and(|b| b.numel() != n) {
        return Err(OpError::Shape(format!(
            "MUL needs equal element counts, got {}{} -> {n}",
            a.numel(),
            b.map(|b| format!(" * {}", b.numel())).unwrap_or_default()
        )));
    }
    match b {
        Some(b) => {
            for i in 0..n {
                out.set_f32(i, a.get_f32(i) * b.get_f32(i));
            }
        }
        None => {
            for i in 0..n {
                out.set_f32(i, a.get_f32(i) * scale);
            }
        }
    }
    Ok(())
}
