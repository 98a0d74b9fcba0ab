//! CPU reference of COMBINE_GEMV `[partials, W (, bias), pos] -> y`:
//!
//! ```text
//! a    = round_to(dtype(W), combine(partials, pos))   (op_attention_split::reference::combine)
//! y[n] = Σ_k a[k] · f32(W[n, k]) (+ f32(bias[n]))     for n in [n_off, n_off + N_tile)
//! ```
//!
//! accumulated in fp32 in GEMV_TILE's order and cast on store; nothing outside the tile is
//! touched. The position must name a row of the attention's cache, which this op does not
//! see: any non-negative position is accepted, and the splits active there are merged.

use amk_core::{CpuCall, OpError, round_to};
use op_attention_split::reference::{check_partials, combine, split_geometry};
use op_gemv_tile::reference::{non_negative, positive};
use op_rmsnorm_gemv::reference::{float_operand, project_row};

/// Runs one COMBINE_GEMV task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(3, 4, 1)?;
    let k = positive(call, "K")?;
    let n_tile = positive(call, "N_tile")?;
    let n_off = non_negative(call, "n_off")?;
    let g = split_geometry(call)?;
    if (g.nh * g.hd) as usize != k {
        return Err(OpError::Shape(format!(
            "COMBINE_GEMV: param K = {k} must be n_heads x head_dim = {} x {}",
            g.nh, g.hd
        )));
    }
    let last = call.n_inputs() - 1;
    let p = op_attention_tile::reference::position(call, last)?;
    let parts = call.input(0)?;
    check_partials(parts, &g)?;
    let w = call.input(1)?;
    float_operand(w, "weight")?;
    let wdt = w.dtype();
    let need = crate::shared_bytes(&g, k as u64, wdt.bits().div_ceil(8));
    if need > u64::from(crate::SHARED_BYTES) {
        return Err(OpError::Shape(format!(
            "COMBINE_GEMV: the attention row and the merge take {need} bytes, beyond the tile's {}",
            crate::SHARED_BYTES
        )));
    }
    let a: Vec<f32> = combine(parts, &g, p)
        .into_iter()
        .map(|v| round_to(wdt, v))
        .collect();
    // The projection reads W and the bias: the position (always last) is not its.
    let mut proj = CpuCall {
        task: call.task,
        registry: call.registry,
        inputs: call.inputs.get(..last).unwrap_or(call.inputs),
        outputs: &mut *call.outputs,
    };
    project_row(&mut proj, "COMBINE_GEMV", &a, 1, n_tile, n_off)
}
