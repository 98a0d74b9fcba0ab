//! CPU reference of SAMPLE_ARGMAX `[logits] -> out`: for every row of `logits` (all leading
//! dims; a rank-0 tensor is one row of one), the index of the largest value along the last
//! dim, written as an integer into an `I32` output that holds one element per row.
//!
//! Rule: the lowest index of the largest non-NaN value. Ties go to the lowest index (so an
//! all-`−inf` row gives 0); NaN never wins: NaN logits are skipped, so `[NaN, −inf]` gives 1,
//! and only an all-NaN row, which has no winner, gives 0. This differs from torch's `argmax`,
//! which returns the first NaN's index; a NaN logit is a bug upstream, and skipping it keeps
//! the sampled token a real one when any real one exists. Deliberate fix of the reference: the output is always an `I32` index,
//! never a float (any other output dtype is [`OpError::DType`]); logits must be floating point,
//! like the validator requires.

use amk_core::{CpuCall, DType, OpError};

/// Runs one SAMPLE_ARGMAX task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(1, 1, 1)?;
    let x = call.input(0)?;
    if x.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "SAMPLE_ARGMAX logits must be floating point, got {}",
            x.dtype()
        )));
    }
    let out = call.output(0)?;
    if out.dtype() != DType::I32 {
        return Err(OpError::DType(format!(
            "SAMPLE_ARGMAX writes I32 token indices, the output is {}",
            out.dtype()
        )));
    }
    let v = x.last_dim();
    if v == 0 {
        return Err(OpError::Shape(format!(
            "SAMPLE_ARGMAX needs a non-empty last dim, logits are {:?}",
            x.shape()
        )));
    }
    let rows = x.numel() / v;
    if out.numel() != rows {
        return Err(OpError::Shape(format!(
            "SAMPLE_ARGMAX output must hold one index per row ({rows}), has {} elements",
            out.numel()
        )));
    }
    for r in 0..rows {
        let base = r * v;
        let mut best: Option<(f32, usize)> = None;
        for j in 0..v {
            let l = x.get_f32(base + j);
            if !l.is_nan() && best.is_none_or(|(b, _)| l > b) {
                best = Some((l, j));
            }
        }
        out.set_i64(r, best.map_or(0, |(_, j)| j) as i64);
    }
    Ok(())
}
