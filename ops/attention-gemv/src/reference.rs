//! CPU reference of ATTENTION_GEMV `[q, k_cache, v_cache, W (, bias) (, pos)] -> y`:
//!
//! ```text
//! a    = round_to(dtype(q), attention(q, k_cache, v_cache))   (ATTENTION_TILE's reference)
//! y[n] = Σ_k a[k] · f32(W[n, k]) (+ f32(bias[n]))               for n in [n_off, n_off + N_tile)
//! ```
//!
//! accumulated in fp32 in GEMV_TILE's order and cast on store: exactly what ATTENTION_TILE into
//! an activation of `q`'s dtype followed by GEMV_TILE computes. `q` is one row of
//! `K = n_heads · head_dim`; the output is one row holding the tile; nothing outside the tile
//! is touched. With a position input the attention's rows are ATTENTION_TILE's window clipped
//! by it (`op_attention_tile::reference::geometry`), an empty window being an error.

use crate::{SHARED_BYTES, operand_slots};
use amk_core::{CpuCall, OpError, round_to};
use op_attention_tile::reference::{attend, geometry};
use op_gemv_tile::reference::{non_negative, positive};
use op_rmsnorm_gemv::reference::{float_operand, project_row};

/// Runs one ATTENTION_GEMV task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(4, 6, 1)?;
    let k = positive(call, "K")?;
    let n_tile = positive(call, "N_tile")?;
    let n_off = non_negative(call, "n_off")?;
    let input4_integer = call.input(4).is_ok_and(|t| t.dtype().is_integer());
    let (_, pos) = operand_slots(call.n_inputs(), input4_integer);
    let g = geometry(call, false, pos)?;
    let (q, kc, vc) = (call.input(0)?, call.input(1)?, call.input(2)?);
    float_operand(q, "query")?;
    if g.batch != 1 || g.nh * g.hd != k {
        return Err(OpError::Shape(format!(
            "ATTENTION_GEMV: param K = {k} must be n_heads x head_dim = {} x {} of one query row (batch {})",
            g.nh, g.hd, g.batch
        )));
    }
    let row_bytes = k.saturating_mul(crate::float_bytes(q.dtype()) as usize);
    if row_bytes > SHARED_BYTES as usize {
        return Err(OpError::Shape(format!(
            "ATTENTION_GEMV: the attention row ({row_bytes} bytes) exceeds the tile's {SHARED_BYTES} bytes"
        )));
    }
    // The attention row as the unfused program stores it: rounded to q's dtype.
    let qdt = q.dtype();
    let mut a = vec![0.0f32; k];
    attend(&g, q, kc, vc, |i, v| a[i] = round_to(qdt, v));
    // The projection reads W and the bias after it: the position (always last) is not its.
    let n_proj = call.n_inputs() - usize::from(pos.is_some());
    let mut proj = CpuCall {
        task: call.task,
        registry: call.registry,
        inputs: call.inputs.get(..n_proj).unwrap_or(call.inputs),
        outputs: &mut *call.outputs,
    };
    project_row(&mut proj, "ATTENTION_GEMV", &a, 3, n_tile, n_off)
}
