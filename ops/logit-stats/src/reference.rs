//! CPU reference of LOGIT_STATS `[logits, limits] -> stats` (the crate doc has the semantics),
//! and the reading of a whole stats buffer back into one [`Summary`] (NEXT_TOKEN's merge).
//!
//! Every operand and param check comes before the first write: an `Err` leaves the output as
//! it was.

use crate::{ROW_COUNT, ROW_FIRST, ROW_MAX, ROW_SUM, ROWS, Summary, VOCAB_LIMIT_AT};
use amk_core::{CpuCall, DType, OpError, Tensor};

/// Runs one LOGIT_STATS task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 2, 1)?;
    let cols = call.int("cols")?;
    let n_tile = call.int("N_tile")?;
    let n_off = call.int("n_off")?;
    let (logits, limits) = (call.input(0)?, call.input(1)?);
    check_logits("LOGIT_STATS", logits)?;
    if limits.dtype() != DType::I32 || limits.numel() <= VOCAB_LIMIT_AT {
        return Err(OpError::Shape(format!(
            "LOGIT_STATS limits must be I32 with at least {} elements, got {} {:?}",
            VOCAB_LIMIT_AT + 1,
            limits.dtype(),
            limits.shape()
        )));
    }
    let out = call.output(0)?;
    let slots = check_stats(out, "LOGIT_STATS output")?;
    let v = logits.numel();
    let bad = |key: &str, why: String| OpError::BadParam {
        key: key.into(),
        why,
    };
    let cols = usize::try_from(cols)
        .ok()
        .filter(|&c| c > 0)
        .ok_or_else(|| bad("cols", format!("must be positive, got {cols}")))?;
    if let Some(why) = crate::cover_error(slots as u64, cols as u64, v as u64) {
        return Err(bad("cols", why));
    }
    let first = usize::try_from(n_off).map_err(|_| bad("n_off", format!("{n_off} < 0")))?;
    let end = usize::try_from(n_tile)
        .ok()
        .filter(|&n| n > 0)
        .and_then(|n| first.checked_add(n))
        .filter(|&e| e <= slots)
        .ok_or_else(|| {
            bad(
                "N_tile",
                format!("slots [{n_off}, {n_off} + {n_tile}) are not within the {slots}"),
            )
        })?;
    let vp = crate::effective_vocab(v, limits.get_i64(VOCAB_LIMIT_AT));
    let row = logits.to_f32_vec();
    let out = call.output(0)?;
    for g in first..end {
        let ids = crate::slot_ids(g, cols, vp);
        let s = Summary::of(&row[ids.clone()], ids.start);
        for (r, w) in s.to_words().into_iter().enumerate() {
            out.set_i64(r * slots + g, w as i64);
        }
    }
    Ok(())
}

/// The logits of `op` must be one non-empty row of F32, F16 or BF16 (this op's and NEXT_TOKEN's
/// rule).
pub fn check_logits(op: &str, logits: &Tensor) -> Result<(), OpError> {
    if !matches!(logits.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(OpError::DType(format!(
            "{op} logits must be F32, F16 or BF16, got {}",
            logits.dtype()
        )));
    }
    if logits.numel() == 0 || logits.numel() != logits.last_dim() {
        return Err(OpError::Shape(format!(
            "{op} logits must be one non-empty row, got shape {:?}",
            logits.shape()
        )));
    }
    Ok(())
}

/// A stats buffer's slots, after checking it is I32 `[4, slots]` (`role` names it in the
/// error).
pub fn check_stats(stats: &Tensor, role: &str) -> Result<usize, OpError> {
    if stats.dtype() != DType::I32 {
        return Err(OpError::DType(format!(
            "{role} must be I32, got {}",
            stats.dtype()
        )));
    }
    match stats.shape() {
        [rows, slots] if *rows == ROWS && *slots > 0 => Ok(*slots as usize),
        shape => Err(OpError::Shape(format!(
            "{role} must be [{ROWS}, slots], got {shape:?}"
        ))),
    }
}

/// Every slot of a checked stats buffer merged in slot order ([`Summary::merge`]).
pub fn merged(stats: &Tensor) -> Summary {
    let slots = stats.last_dim();
    let word = |r: usize, g: usize| stats.get_i64(r * slots + g) as i32;
    let parts: Vec<Summary> = (0..slots)
        .map(|g| {
            let mut w = [0i32; 4];
            for r in [ROW_MAX, ROW_FIRST, ROW_SUM, ROW_COUNT] {
                w[r] = word(r, g);
            }
            Summary::from_words(w)
        })
        .collect();
    Summary::merge(&parts)
}
