//! CPU reference of GELU: the exact (erf) GELU `0.5 · x · (1 + erf(x / √2))`, cast on store.
//! Operands are viewed: only the element counts must agree.
//!
//! Inputs are read as `f32` values and evaluated in `f64` as `0.5 · x · erfc(−x / √2)` (the
//! same function: `1 + erf(z) = erfc(−z)`), rounded once on store. The `erfc` form keeps full
//! relative precision in the negative tail, where `1 + erf` would cancel catastrophically
//! (at `x = −5` an `f32` `1 + erf` keeps about one significant digit).

use amk_core::{CpuCall, OpError};
use std::f64::consts::FRAC_1_SQRT_2;

/// Runs one GELU task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(1, 1, 1)?;
    let x = call.input(0)?;
    let out = call.output(0)?;
    let n = out.numel();
    if x.numel() != n {
        return Err(OpError::Shape(format!(
            "GELU needs equal element counts, got {} -> {n}",
            x.numel()
        )));
    }
    for i in 0..n {
        out.set_f32(i, gelu(x.get_f32(i) as f64) as f32);
    }
    Ok(())
}

/// The exact GELU of one value.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * libm::erfc(-x * FRAC_1_SQRT_2)
}
