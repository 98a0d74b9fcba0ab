//! CPU reference of ADD: `out[i] = f32(a[i]) + f32(b[i])`, cast on store.

use amk_core::{CpuCall, OpError};

/// Runs one ADD task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 2, 1)?;
    let (a, b) = (call.input(0)?, call.input(1)?);
    let out = call.output(0)?;
    let n = out.numel();
    if a.numel() != n || b.numel() != n {
        return Err(OpError::Shape(format!(
            "ADD needs equal element counts, got {} + {} -> {n}",
            a.numel(),
            b.numel()
        )));
    }
    for i in 0..n {
        out.set_f32(i, a.get_f32(i) + b.get_f32(i));
    }
    Ok(())
}
