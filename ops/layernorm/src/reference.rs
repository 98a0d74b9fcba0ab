//! CPU reference of LAYERNORM `[x, w(, b)] -> y`: torch's `layer_norm` over the last dim
//! (`hidden`) of `x`, every row (all leading dims) becoming
//! `y = (x − mean) / sqrt(var + eps) · w (+ b)` with the biased variance `mean((x − mean)²)`,
//! cast on store.
//!
//! Operands are read as `f32` values; mean, variance (two-pass) and the per-element arithmetic
//! are carried in `f64` and rounded once on store (so `x ≈ mean` loses nothing to
//! cancellation). `eps` is rounded to `f32` first, as the device param block carries it.
//! Params `eps` (real) and `hidden` (positive integer equal to `x`'s last dim) are required;
//! `w`, `b` and `y` are viewed (element counts `hidden`, `hidden`, `x.numel`).

use amk_core::{CpuCall, OpError};

/// Runs one LAYERNORM task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 3, 1)?;
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
    let b = if call.n_inputs() == 3 {
        Some(call.input(2)?)
    } else {
        None
    };
    if x.last_dim() != h {
        return Err(OpError::Shape(format!(
            "LAYERNORM param hidden = {h} must equal the last dim of x {:?}",
            x.shape()
        )));
    }
    for (t, what) in [(Some(w), "weight"), (b, "bias")] {
        if let Some(t) = t
            && t.numel() != h
        {
            return Err(OpError::Shape(format!(
                "LAYERNORM {what} must have hidden = {h} elements, has {}",
                t.numel()
            )));
        }
    }
    let out = call.output(0)?;
    let n = x.numel();
    if out.numel() != n {
        return Err(OpError::Shape(format!(
            "LAYERNORM output must have {n} elements like x, has {}",
            out.numel()
        )));
    }
    let wv: Vec<f64> = (0..h).map(|j| w.get_f32(j) as f64).collect();
    let bv: Vec<f64> = match b {
        Some(b) => (0..h).map(|j| b.get_f32(j) as f64).collect(),
        None => vec![0.0; h],
    };
    let mut row = vec![0.0f64; h];
    for base in (0..n).step_by(h) {
        for (j, v) in row.iter_mut().enumerate() {
            *v = x.get_f32(base + j) as f64;
        }
        let mean = row.iter().sum::<f64>() / h as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (j, v) in row.iter().enumerate() {
            out.set_f32(base + j, ((v - mean) * rstd * wv[j] + bv[j]) as f32);
        }
    }
    Ok(())
}
