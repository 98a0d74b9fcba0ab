//! CPU reference of ATTENTION_MERGE `[partials, pos] -> row`:
//!
//! ```text
//! row[n_off .. n_off + N_tile] = round_to(dtype(row), combine(partials, pos)[same columns])
//! ```
//!
//! with `combine` the split-KV merge of `op_attention_split::reference::combine_heads`, over
//! the heads `n_off / head_dim ..` the tile covers; nothing outside the tile is touched. The
//! position must name a row of the attention's cache, which this op does not see: any
//! non-negative position is accepted, and the splits active there are merged.

use amk_core::{CpuCall, OpError, round_to};
use op_attention_split::reference::{check_partials, combine_heads, split_geometry};
use op_gemv_tile::reference::{non_negative, positive};

/// Runs one ATTENTION_MERGE task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 2, 1)?;
    let g = split_geometry(call)?;
    let n_tile = positive(call, "N_tile")?;
    let n_off = non_negative(call, "n_off")?;
    let hd = g.hd as usize;
    let k = g.nh as usize * hd;
    if n_tile % hd != 0 || n_off % hd != 0 || n_off + n_tile > k {
        return Err(OpError::Shape(format!(
            "ATTENTION_MERGE: columns [{n_off}, {}) must be whole heads of head_dim = {hd} \
             within the row's {k}",
            n_off + n_tile
        )));
    }
    let p = op_attention_tile::reference::position(call, 1)?;
    let parts = call.input(0)?;
    check_partials(parts, &g)?;
    let merged = combine_heads(parts, &g, p, n_off / hd..(n_off + n_tile) / hd);
    let out = call.output(0)?;
    if out.dtype().is_integer() || out.numel() != k {
        return Err(OpError::Shape(format!(
            "ATTENTION_MERGE: the row must be {k} floats, got {} of {}",
            out.numel(),
            out.dtype()
        )));
    }
    let dt = out.dtype();
    for (i, v) in merged.into_iter().enumerate() {
        out.set_f32(n_off + i, round_to(dt, v));
    }
    Ok(())
}
