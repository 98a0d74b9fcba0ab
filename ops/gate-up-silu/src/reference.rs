//! CPU reference of GATE_UP_SILU `[x, Wg, Wu (, norm_w)] -> y`:
//!
//! ```text
//! xn   = x, or round_to(dtype(x), rmsnorm(x, norm_w, eps)) with a 4th input
//! g    = round_to(dtype(y), Σ_k xn[k] · f32(Wg[n, k]))       (GEMV_TILE's sum and order)
//! u    = round_to(dtype(y), Σ_k xn[k] · f32(Wu[n, k]))
//! y[n] = g / (1 + exp(−g)) · u                                 in f32, cast on store
//! ```
//!
//! for `n` in `[n_off, n_off + N_tile)`: exactly what (RMSNORM →) gate and up GEMV_TILEs into
//! activations of `y`'s dtype followed by SILU_MUL compute. `x` is one row of `K`; the output
//! is one row holding the tile; nothing outside the tile is touched.

use amk_core::{CpuCall, OpError, round_to};
use op_gemv_tile::reference::{float_row_dot, non_negative, positive};
use op_rmsnorm::reference::fused_input;
use op_rmsnorm_gemv::reference::{float_operand, tile_end};

/// Runs one GATE_UP_SILU task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(3, 4, 1)?;
    let k = positive(call, "K")?;
    let n_tile = positive(call, "N_tile")?;
    let n_off = non_negative(call, "n_off")?;
    let norm = (call.n_inputs() == 4).then_some(3);
    let xn = fused_input(call, norm, k)?;
    let (wg, wu) = (call.input(1)?, call.input(2)?);
    for (w, role) in [(wg, "gate weight"), (wu, "up weight")] {
        float_operand(w, role)?;
        if w.last_dim() != k {
            return Err(OpError::Shape(format!(
                "GATE_UP_SILU: param K = {k} must equal the last dim of the {role} {:?}",
                w.shape()
            )));
        }
    }
    if wg.shape() != wu.shape() {
        return Err(OpError::Shape(format!(
            "GATE_UP_SILU: the gate {:?} and up {:?} weights must have one shape",
            wg.shape(),
            wu.shape()
        )));
    }
    let n = wg.numel() / k;
    let end = tile_end(n_off, n_tile, n, "rows of the gate weight")?;
    let mut scratch = vec![0.0f32; k];
    let mut sums = Vec::with_capacity(n_tile);
    for col in n_off..end {
        let g = float_row_dot(&xn, wg, col, &mut scratch)?;
        let u = float_row_dot(&xn, wu, col, &mut scratch)?;
        sums.push((g, u));
    }
    let out = call.output(0)?;
    float_operand(out, "output")?;
    if end > out.last_dim() || out.numel() != out.last_dim() {
        return Err(OpError::Shape(format!(
            "GATE_UP_SILU: columns [{n_off}, {end}) must fit the one-row output {:?}",
            out.shape()
        )));
    }
    let dt = out.dtype();
    for (col, (g, u)) in (n_off..end).zip(sums) {
        let (g, u) = (round_to(dt, g), round_to(dt, u));
        out.set_f32(col, g / (1.0 + (-g).exp()) * u);
    }
    Ok(())
}
