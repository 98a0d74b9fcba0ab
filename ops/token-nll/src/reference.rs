//! CPU reference of TOKEN_NLL `[logits, targets] -> out`: for every row `r` of `logits` (all
//! leading dims; a rank-0 tensor is one row of one), `out[r] = ln Σ_j exp(x_j) - x_t` with `t =
//! targets[r]`, the log-sum-exp shifted by the row's largest value and carried in f64 (as the
//! engine's host `nll` does), rounded once to F32 on store. With the row tile params
//! ([`crate::row_tile`]) only rows `[m_off, m_off + M_tile)` are written. A target outside
//! `[0, vocab)` is [`OpError::IndexOutOfRange`]; nothing is written before every checked
//! target of the task is known good.

use amk_core::{CpuCall, DType, OpError, Tensor};

/// Runs one TOKEN_NLL task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 2, 1)?;
    let mut keys = [None; 4];
    for (slot, key) in keys.iter_mut().zip(op_rmsnorm::ROW_TILE_KEYS) {
        *slot = call.int_opt(key)?;
    }
    let tile = crate::row_tile(keys).map_err(|why| OpError::BadParam {
        key: "M_tile".into(),
        why,
    })?;
    let (x, t) = (call.input(0)?, call.input(1)?);
    let rows = check_operands(x, t)?;
    let out = call.output(0)?;
    if out.dtype() != DType::F32 || out.numel() != rows {
        return Err(OpError::Shape(format!(
            "TOKEN_NLL writes one F32 a row ({rows}), the output is {} of {} elements",
            out.dtype(),
            out.numel()
        )));
    }
    let (first, end) = match tile {
        Some(tile) => (tile.m_off as usize, tile.end() as usize),
        None => (0, rows),
    };
    if end > rows {
        return Err(OpError::Shape(format!(
            "TOKEN_NLL rows [{first}, {end}) exceed the logits' {rows} rows"
        )));
    }
    let vocab = x.last_dim();
    let targets = (first..end)
        .map(|r| target(t, r, vocab))
        .collect::<Result<Vec<_>, _>>()?;
    let mut row = Vec::with_capacity(vocab);
    for (r, target) in (first..end).zip(targets) {
        row.clear();
        row.extend((r * vocab..(r + 1) * vocab).map(|i| x.get_f32(i)));
        out.set_f32(r, nll(&row, target) as f32);
    }
    Ok(())
}

/// The logits' rows, after checking the dtypes and that the targets hold one id a row.
fn check_operands(x: &Tensor, t: &Tensor) -> Result<usize, OpError> {
    if x.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "TOKEN_NLL logits must be floating point, got {}",
            x.dtype()
        )));
    }
    if !t.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "TOKEN_NLL targets must be integer ids, got {}",
            t.dtype()
        )));
    }
    let vocab = x.last_dim();
    if vocab == 0 {
        return Err(OpError::Shape(format!(
            "TOKEN_NLL needs a non-empty last dim, logits are {:?}",
            x.shape()
        )));
    }
    let rows = x.numel() / vocab;
    if t.numel() != rows {
        return Err(OpError::Shape(format!(
            "TOKEN_NLL needs one target a row ({rows}), has {}",
            t.numel()
        )));
    }
    Ok(rows)
}

/// Row `r`'s target id, checked against the vocabulary.
fn target(t: &Tensor, r: usize, vocab: usize) -> Result<usize, OpError> {
    let id = t.get_i64(r);
    match usize::try_from(id) {
        Ok(i) if i < vocab => Ok(i),
        _ => Err(OpError::IndexOutOfRange {
            at: r,
            value: id,
            limit: vocab as u64,
        }),
    }
}

/// `ln Σ exp(x) - x[target]` in f64, the sum shifted by the row's largest value.
pub fn nll(row: &[f32], target: usize) -> f64 {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
    m + s.ln() - row[target] as f64
}
