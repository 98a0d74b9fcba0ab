//! CPU reference of RMSNORM `[x, w] -> y`: over the last dim (`hidden`) of `x`, every row
//! (all leading dims) becomes `y = x · rsqrt(mean(x²) + eps) · w`, cast on store.
//!
//! Operands are read as `f32` values; the row reduction and the per-element products are then
//! carried in `f64` and rounded once on store, so the result is independent of summation order
//! (and at least as accurate as an `f32` evaluation). `eps` is rounded to `f32` first, as the
//! device param block carries it. Params `eps` (real) and `hidden` (positive integer equal to
//! `x`'s last dim) are required; `w` and `y` are viewed (element counts `hidden` and
//! `x.numel` respectively). With the row tile params ([`crate::RowTile`]) only rows
//! `[m_off, m_off + M_tile)` are written.

use amk_core::{CpuCall, OpError, Tensor, round_to};

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
    let mut keys = [None; 4];
    for (slot, key) in keys.iter_mut().zip(crate::ROW_TILE_KEYS) {
        *slot = call.int_opt(key)?;
    }
    let tile = crate::RowTile::from_params(keys, hidden).map_err(|why| OpError::BadParam {
        key: "M_tile".into(),
        why,
    })?;
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
    let (first, end) = match tile {
        Some(t) => (t.m_off as usize, t.end() as usize),
        None => (0, n / h),
    };
    if end.checked_mul(h).is_none_or(|e| e > n) {
        return Err(OpError::Shape(format!(
            "RMSNORM rows [{first}, {end}) exceed the {} rows of x",
            n / h
        )));
    }
    let wv: Vec<f64> = (0..h).map(|j| w.get_f32(j) as f64).collect();
    let mut row = vec![0.0f64; h];
    let mut y = vec![0.0f32; h];
    for base in (first * h..end * h).step_by(h) {
        for (j, v) in row.iter_mut().enumerate() {
            *v = x.get_f32(base + j) as f64;
        }
        rms_row(&row, &wv, eps, &mut y);
        for (j, &v) in y.iter().enumerate() {
            out.set_f32(base + j, v);
        }
    }
    Ok(())
}

/// One row: `y[j] = (x[j] · rsqrt(mean(x²) + eps) · w[j])` carried in f64 and rounded once to
/// f32 (the caller casts on store). `eps` is the f32 param widened; the slices have one length.
pub fn rms_row(x: &[f64], w: &[f64], eps: f64, y: &mut [f32]) {
    let mean_sq = x.iter().map(|v| v * v).sum::<f64>() / x.len().max(1) as f64;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    for ((o, v), wj) in y.iter_mut().zip(x).zip(w) {
        *o = (v * inv * wj) as f32;
    }
}

/// The fused ops' prologue (RMSNORM_GEMV, GATE_UP_SILU, QKV_ROPE_APPEND): the normalised row
/// of the one-row `x` with weight `w` (both of `x.numel()` elements, checked by the caller),
/// rounded to `x`'s dtype — exactly what an RMSNORM task would store into an activation of
/// that dtype for the projection to read.
pub fn normed_row(x: &Tensor, w: &Tensor, eps: f32) -> Vec<f32> {
    normed_row_at(x, 0, w, eps)
}

/// [`normed_row`] of row `m` of `x` viewed as rows of `w.numel()` elements (a prompt chunk's
/// rows, LINEAR_TILE's prologue). The caller checks that the row lies within `x`.
pub fn normed_row_at(x: &Tensor, m: usize, w: &Tensor, eps: f32) -> Vec<f32> {
    let h = w.numel();
    let row: Vec<f64> = (m * h..(m + 1) * h).map(|j| x.get_f32(j) as f64).collect();
    let wv: Vec<f64> = (0..h).map(|j| w.get_f32(j) as f64).collect();
    let mut y = vec![0.0f32; h];
    rms_row(&row, &wv, eps as f64, &mut y);
    let dt = x.dtype();
    y.iter_mut().for_each(|v| *v = round_to(dt, *v));
    y
}

/// The row a fused decode tile multiplies (RMSNORM_GEMV, GATE_UP_SILU, QKV_ROPE_APPEND): input
/// 0 must be one row of `k` elements; with a norm weight (input `norm`, `k` elements, param
/// `eps` required) it is [`normed_row`], otherwise `x` as f32.
pub fn fused_input(
    call: &CpuCall<'_, '_>,
    norm: Option<usize>,
    k: usize,
) -> Result<Vec<f32>, OpError> {
    let x = call.input(0)?;
    if x.numel() != k || x.last_dim() != k {
        return Err(OpError::Shape(format!(
            "the input {:?} must be one row of K = {k} elements",
            x.shape()
        )));
    }
    if x.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "the input must be floating point, got {}",
            x.dtype()
        )));
    }
    let Some(i) = norm else {
        return Ok(x.to_f32_vec());
    };
    let w = call.input(i)?;
    if w.numel() != k {
        return Err(OpError::Shape(format!(
            "the norm weight {:?} must hold K = {k} elements",
            w.shape()
        )));
    }
    let eps = call.real("eps")? as f32;
    Ok(normed_row(x, w, eps))
}
