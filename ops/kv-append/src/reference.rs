//! CPU reference of KV_APPEND: writes new K or V rows into the cache at `pos`, in place.
//!
//! Inputs `[new, cache]` with param `pos`, or `[new, cache, pos]` with `pos` element 0 of that
//! integer buffer (then the param must be absent); output: the cache. The op declares the pair
//! (input 1, output 0), so a caller passes the cache as [`Input::InPlace`]`(0)` and the cache
//! tensor itself as output 0. (A caller that passes the cache as an ordinary input gets the
//! same result in a separate output: the cache is copied into it first, cast on store, then
//! the rows are written.)
//!
//! - Rank-2 or rank-3 cache `[max_seq, …]` with rows of `row = numel / max_seq` elements:
//!   `new` is viewed as `rows = new.numel / row` whole rows and written to cache rows
//!   `[pos, pos + rows)`.
//! - Rank-4 (batched) cache `[B, max_seq, n_kv, head_dim]`: `new` is viewed as
//!   `[B, n_kv · head_dim]` and `cache[b, pos] = new[b]` for every `b`.
//! - With params `n_off` and `N_tile` (rank 2 or 3 only): only columns `[n_off, n_off +
//!   N_tile)` of each row are written, from the same columns of `new`'s rows — one slice of a
//!   chunk's append, which several tasks then share.
//!
//! Every other cache element is left untouched. A `pos` (plus rows) beyond the cache, a
//! negative `pos`, or a `new` that is not a whole number of rows is an error, reported before
//! anything is written: [`OpError::BadParam`] for the param, [`OpError::IndexOutOfRange`] for
//! a position read from the input (data, as QKV_ROPE_APPEND's).

use amk_core::{CpuCall, Input, OpError};

/// Runs one KV_APPEND task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 3, 1)?;
    let new = call.input(0)?;
    let (pos_value, from_input) = position(call)?;
    let columns = columns(call)?;
    if !from_input && pos_value < 0 {
        return Err(OpError::BadParam {
            key: "pos".into(),
            why: format!("{pos_value} must not be negative"),
        });
    }
    // The row to write, if it is below `limit` (the first start row whose rows do not fit);
    // else the param's error, or the index's for a position read from the input.
    let start_row = |limit: usize, why: &dyn Fn() -> String| {
        usize::try_from(pos_value)
            .ok()
            .filter(|&p| p < limit)
            .ok_or_else(|| {
                if from_input {
                    OpError::IndexOutOfRange {
                        at: 0,
                        value: pos_value,
                        limit: limit as u64,
                    }
                } else {
                    OpError::BadParam {
                        key: "pos".into(),
                        why: why(),
                    }
                }
            })
    };
    // Where the cache lives: the in-place output, or a separate input copied into output 0.
    let (out_idx, separate) = match call.inputs.get(1) {
        Some(Input::InPlace(j)) => (*j, None),
        Some(Input::Tensor(t)) => (0, Some(*t)),
        None => {
            return Err(OpError::Arity {
                what: "inputs",
                expected: "2".into(),
                got: call.n_inputs(),
            });
        }
    };
    let cache = call.output(out_idx)?;
    if let Some(src) = separate
        && src.numel() != cache.numel()
    {
        return Err(OpError::Shape(format!(
            "the cache input {:?} and the output {:?} hold different element counts",
            src.shape(),
            cache.shape()
        )));
    }
    let shape = cache.shape().to_vec();
    if columns.is_some() && shape.len() == 4 {
        return Err(OpError::Shape(format!(
            "a column slice (n_off, N_tile) of the batched cache {shape:?}: slices take \
             [max_seq, n_kv, head_dim] caches"
        )));
    }
    // Destination element ranges (start, length) paired with the source offset in `new`.
    let mut spans: Vec<(usize, usize, usize)> = Vec::new();
    match shape.as_slice() {
        [max_seq, ..] if shape.len() == 2 || shape.len() == 3 => {
            let max_seq = *max_seq as usize;
            let row = cache.numel().checked_div(max_seq).unwrap_or(0);
            if row == 0 {
                return Err(OpError::Shape(format!(
                    "the cache {shape:?} has no elements to append to"
                )));
            }
            if new.numel() % row != 0 {
                return Err(OpError::Shape(format!(
                    "new rows {:?} ({} elements) are not a whole number of cache rows of \
                     {row} elements (cache {shape:?})",
                    new.shape(),
                    new.numel()
                )));
            }
            let rows = new.numel() / row;
            // Rows [pos, pos + rows) fit iff pos < max_seq + 1 - rows.
            let pos = start_row(max_seq.saturating_add(1).saturating_sub(rows), &|| {
                format!(
                    "rows [{pos_value}, {}) exceed the cache's {max_seq} rows",
                    pos_value.saturating_add(rows as i64)
                )
            })?;
            match columns {
                None => spans.push((pos * row, rows * row, 0)),
                Some(c) => {
                    if c.end > row {
                        return Err(OpError::BadParam {
                            key: "N_tile".into(),
                            why: format!(
                                "columns [{}, {}) exceed the cache's rows of {row}",
                                c.start, c.end
                            ),
                        });
                    }
                    for r in 0..rows {
                        spans.push((
                            (pos + r) * row + c.start,
                            c.end - c.start,
                            r * row + c.start,
                        ));
                    }
                }
            }
        }
        [b, max_seq, n_kv, hd] => {
            let (b, max_seq) = (*b as usize, *max_seq as usize);
            let per = (*n_kv as usize).saturating_mul(*hd as usize);
            if new.numel() != b.saturating_mul(per) {
                return Err(OpError::Shape(format!(
                    "new rows {:?} must hold B x n_kv x head_dim = {b} x {per} elements for \
                     the batched cache {shape:?}, has {}",
                    new.shape(),
                    new.numel()
                )));
            }
            let pos = start_row(max_seq, &|| {
                format!("{pos_value} is beyond the cache's {max_seq} positions")
            })?;
            if per > 0 {
                for i in 0..b {
                    spans.push(((i * max_seq + pos) * per, per, i * per));
                }
            }
        }
        _ => {
            return Err(OpError::Shape(format!(
                "the cache {shape:?} must be [max_seq, n_kv, head_dim] (or flat \
                 [max_seq, n_kv·head_dim]) or batched [B, max_seq, n_kv, head_dim]"
            )));
        }
    }
    if let Some(src) = separate {
        for i in 0..src.numel() {
            cache.set_f32(i, src.get_f32(i));
        }
    }
    for (dst, len, srcoff) in spans {
        for i in 0..len {
            cache.set_f32(dst + i, new.get_f32(srcoff + i));
        }
    }
    Ok(())
}

/// The columns of every row a task writes: params `n_off` and `N_tile` (both or neither;
/// `N_tile` > 0, `n_off` ≥ 0), or `None` for whole rows.
fn columns(call: &CpuCall<'_, '_>) -> Result<Option<std::ops::Range<usize>>, OpError> {
    let (off, tile) = match (call.int_opt("n_off")?, call.int_opt("N_tile")?) {
        (None, None) => return Ok(None),
        (Some(o), Some(t)) => (o, t),
        (None, Some(_)) => return Err(OpError::MissingParam("n_off".into())),
        (Some(_), None) => return Err(OpError::MissingParam("N_tile".into())),
    };
    let bad = |key: &str, why: String| OpError::BadParam {
        key: key.into(),
        why,
    };
    let start = usize::try_from(off).map_err(|_| bad("n_off", format!("{off} is negative")))?;
    let n = usize::try_from(tile)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| bad("N_tile", format!("{tile} must be positive")))?;
    let end = start
        .checked_add(n)
        .ok_or_else(|| bad("N_tile", format!("{off} + {tile} overflows")))?;
    Ok(Some(start..end))
}

/// The row to write: `(position, whether it came from the input)`. Element 0 of input 2 (a
/// non-empty integer buffer) when the task has it, and then no param `pos` (one source of
/// truth); the param otherwise.
fn position(call: &CpuCall<'_, '_>) -> Result<(i64, bool), OpError> {
    if call.n_inputs() < 3 {
        return Ok((call.int("pos")?, false));
    }
    if call.task.params.contains_key("pos") {
        return Err(OpError::BadParam {
            key: "pos".into(),
            why: "given together with a position input: give one".into(),
        });
    }
    let t = call.input(2)?;
    if !t.dtype().is_integer() || t.numel() == 0 {
        return Err(OpError::DType(format!(
            "KV_APPEND: the position buffer must be a non-empty integer buffer, got {} {:?}",
            t.dtype(),
            t.shape()
        )));
    }
    Ok((t.get_i64(0), true))
}
