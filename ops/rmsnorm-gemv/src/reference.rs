//! CPU reference of RMSNORM_GEMV `[x, norm_w, W (, bias)] -> y`:
//!
//! ```text
//! xn   = round_to(dtype(x), rmsnorm(x, norm_w, eps))      (RMSNORM's reference row)
//! y[n] = Σ_k xn[k] · f32(W[n, k]) (+ f32(bias[n]))          for n in [n_off, n_off + N_tile)
//! ```
//!
//! accumulated in fp32 in GEMV_TILE's order and cast on store: exactly what RMSNORM into an
//! activation of `x`'s dtype followed by GEMV_TILE computes. `x` is one row of `K`; the
//! output is one row holding the tile; nothing outside the tile is touched.

use amk_core::{CpuCall, OpError};
use op_gemv_tile::reference::{float_row_dot, non_negative, positive};
use op_rmsnorm::reference::fused_input;

/// Runs one RMSNORM_GEMV task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(3, 4, 1)?;
    let k = positive(call, "K")?;
    let n_tile = positive(call, "N_tile")?;
    let n_off = non_negative(call, "n_off")?;
    let xn = fused_input(call, Some(1), k)?;
    project_row(call, "RMSNORM_GEMV", &xn, 2, n_tile, n_off)
}

/// The projection of the one-row fused tiles (RMSNORM_GEMV, ATTENTION_GEMV) once their row is
/// prepared: columns `[n_off, n_off + n_tile)` of `row · W^T (+ bias)`, W being input `w_at`
/// (`[N, row.len()]`) and the bias (N elements) the input after it when the call has it,
/// accumulated in GEMV_TILE's order and stored into output 0 (one row; nothing outside the
/// tile is touched). `op` names the op in errors.
pub fn project_row(
    call: &mut CpuCall<'_, '_>,
    op: &str,
    row: &[f32],
    w_at: usize,
    n_tile: usize,
    n_off: usize,
) -> Result<(), OpError> {
    let k = row.len();
    let w = call.input(w_at)?;
    float_operand(w, "weight")?;
    if w.last_dim() != k {
        return Err(OpError::Shape(format!(
            "{op}: param K = {k} must equal the last dim of the weight {:?}",
            w.shape()
        )));
    }
    let n = w.numel() / k;
    let bias = if call.n_inputs() > w_at + 1 {
        let b = call.input(w_at + 1)?;
        float_operand(b, "bias")?;
        if b.numel() != n {
            return Err(OpError::Shape(format!(
                "{op}: the bias {:?} must hold the weight's {n} rows",
                b.shape()
            )));
        }
        Some(b.to_f32_vec())
    } else {
        None
    };
    let end = tile_end(n_off, n_tile, n, "rows of the weight")?;
    let mut scratch = vec![0.0f32; k];
    let mut vals = Vec::with_capacity(n_tile);
    for col in n_off..end {
        let b = bias.as_ref().map_or(0.0, |b| b[col]);
        vals.push(float_row_dot(row, w, col, &mut scratch)? + b);
    }
    let out = call.output(0)?;
    float_operand(out, "output")?;
    if end > out.last_dim() || out.numel() != out.last_dim() {
        return Err(OpError::Shape(format!(
            "{op}: columns [{n_off}, {end}) must fit the one-row output {:?}",
            out.shape()
        )));
    }
    for (col, v) in (n_off..end).zip(vals) {
        out.set_f32(col, v);
    }
    Ok(())
}

/// The fused tiles' operands are F32, F16 or BF16 (the device streams float weights only).
pub fn float_operand(t: &amk_core::Tensor, role: &str) -> Result<(), OpError> {
    use amk_core::DType;
    if matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        Ok(())
    } else {
        Err(OpError::DType(format!(
            "the {role} must be F32, F16 or BF16, got {}",
            t.dtype()
        )))
    }
}

/// End of the tile `[n_off, n_off + n_tile)`, which must lie within `n` `what`.
pub fn tile_end(n_off: usize, n_tile: usize, n: usize, what: &str) -> Result<usize, OpError> {
    n_off
        .checked_add(n_tile)
        .filter(|&e| e <= n)
        .ok_or_else(|| {
            OpError::Shape(format!(
                "columns [{n_off}, {n_off} + {n_tile}) exceed the {n} {what}"
            ))
        })
}
