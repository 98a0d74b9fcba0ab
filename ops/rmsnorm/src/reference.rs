//! CPU reference of RMSNORM `[x, w] -> y`: over the last dim (`hidden`) of `x`, every row
//! (all leading dims) becomes `y = x · rsqrt(mean(x²) + eps) · w`, cast on store.
//!
//! Operands are read as `f32` values; the row reduction and the per-element products are then
//! carried in `f64` and rounded once on store, so the result is independent of summation order
//! (and at least as accurate as an `f32` evaluation). `eps` is rounded to `f32` first, as the
//! device param block carries it. Params `eps` (real) and `hidden` (positive integer equal to
//! `x`'s last dim) are required; `w` and `y` are viewed (element counts `hidden` and
//! `x.numel` respectively).

use amk_core::{CpuCall, OpError};

/// Runs one RMSNORM task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 2, 1)?;
    let eps = call.real("eps")? as f32 as f64;
    let hidden = call.int("hidden")?;
    if hidden <= 0 {
        return Err(OpError::BadParam {
            key: "hidden".into(),
            why: format!("must be positive, got {hidden}"),
        });
    }
    let h = hidden as usize;
    let (x, w) = (call.input(0)?, call.input(1)?);
    if x.last_dim() != h {
        return Err(OpError::Shape(format!(
            "RMSNORM param hidden = {h} must equal the last dim of x {:?}",
            x.shape()
        )));
    }
    if w.numel() != h {
        return Err(OpError::Shape(format!(
            "RMSNORM weight must have hidden = {h} elements, has {}",
            w.numel()
        )));
    }
    let out = call.output(0)?;
    let n = x.numel();
    if out.numel() != n {
        return Err(OpError::Shape(format!(
            "RMSNORM output must have {n} elements like x, has {}",
            out.numel()
        )));
    }
    let wv: Vec<f64> = (0..h).map(|j| w.get_f32(j) as f64).collect();
    let mut row = vec![0.0f64; h];
    for base in (0..n).step_by(h) {
        for (j, v) in row.iter_mut().enumerate() {
            *v = x.get_f32(base + j) as f64;
        }
        let mean_sq = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for (j, (v, wj)) in row.iter().zip(&wv).enumerate() {
            out.set_f32(base + j, (v * inv * wj) as f32);
        }
    }
    Ok(())
}
