//! CPU reference of EMBED `[ids, table] -> out`: `out = table.index_select(0, ids.view(-1))`,
//! viewed as `out`, cast on store (through `f32`; through `i64` when the table and the output
//! both have integer dtypes, so large integers are copied exactly).
//!
//! The table's rows are its first dim (`rows = table.shape[0]`, 1 for a rank-0 table) and a
//! row holds `table.numel / rows` elements, whatever the table's other dims are. The output is
//! viewed too: it must hold exactly `len(ids) · row` elements, in any shape. That makes EMBED
//! also the lowering's reshape bridge (`ids = [0]` over a flat `[1, dim]` activation, written
//! as `[n_heads, head_dim]`).
//!
//! Every id is checked before anything is written: an id `< 0` or `≥ rows` is
//! [`OpError::IndexOutOfRange`] (never clamped, unlike the reference CUDA kernel), and the
//! output is left untouched. `ids` must have an integer dtype. The required param `hidden` is
//! read (it must be present and an integer) but does not enter the math.

use amk_core::{CpuCall, OpError};

/// Runs one EMBED task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 2, 1)?;
    call.int("hidden")?;
    let (ids, table) = (call.input(0)?, call.input(1)?);
    if !ids.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "EMBED ids must have an integer dtype, got {}",
            ids.dtype()
        )));
    }
    let rows = table.shape().first().copied().unwrap_or(1);
    let row = table.numel() / (rows as usize).max(1);
    let n_ids = ids.numel();
    let out = call.output(0)?;
    let want = n_ids
        .checked_mul(row)
        .ok_or_else(|| OpError::Shape(format!("EMBED: {n_ids} ids x {row} elements overflows")))?;
    if out.numel() != want {
        return Err(OpError::Shape(format!(
            "EMBED output must hold {n_ids} id(s) x {row} elements per table row = {want} elements, has {}",
            out.numel()
        )));
    }
    let mut picked = Vec::with_capacity(n_ids);
    for k in 0..n_ids {
        let id = ids.get_i64(k);
        if id < 0 || id as u64 >= rows {
            return Err(OpError::IndexOutOfRange {
                at: k,
                value: id,
                limit: rows,
            });
        }
        picked.push(id as usize);
    }
    let exact_ints = table.dtype().is_integer() && out.dtype().is_integer();
    for (k, &id) in picked.iter().enumerate() {
        let (src, dst) = (id * row, k * row);
        for j in 0..row {
            if exact_ints {
                out.set_i64(dst + j, table.get_i64(src + j));
            } else {
                out.set_f32(dst + j, table.get_f32(src + j));
            }
        }
    }
    Ok(())
}
