//! CPU reference of NEXT_TOKEN `[logits, pos, prompt, stop, limits, sampling(, stats)] ->
//! [pos (in place), token, halt, emitted]` (the crate doc has the semantics; [`crate::choose`]
//! the choice; with the stats, [`op_logit_stats::reference::merged`] their summary).
//!
//! A caller passes `pos` as [`Input::InPlace`]`(0)` and the position buffer itself as output
//! 0, as the validator requires. (A caller that passes it as an ordinary input gets the same
//! result in a separate output: the input is copied into output 0 first, cast on store, then
//! element 0 is set; the two must hold the same number of elements.)
//!
//! Every operand check, and every check on the data (a negative position, a prompt or
//! `emitted` row beyond its buffer), comes before the first write: an `Err` leaves every
//! output as it was.

use crate::choose::{self, Settings};
use crate::{LIMITS_LEN, SAMPLING_LEN};
use amk_core::{CpuCall, DType, Input, OpError, Tensor};

/// Requires `t` to be I32 with at least `n` elements.
fn i32_at_least(t: &Tensor, n: usize, role: &str) -> Result<(), OpError> {
    if t.dtype() != DType::I32 {
        return Err(OpError::DType(format!(
            "NEXT_TOKEN {role} must be I32, got {}",
            t.dtype()
        )));
    }
    if t.numel() < n {
        return Err(OpError::Shape(format!(
            "NEXT_TOKEN {role} must hold at least {n} element(s), has shape {:?}",
            t.shape()
        )));
    }
    Ok(())
}

/// Where the position lives: a separate input copied into output 0, or output 0 itself.
enum PosSource<'a> {
    Separate(&'a Tensor),
    InPlace,
}

/// What one call decided, computed before anything is written.
struct Decision {
    q: i64,
    token: i64,
    halt: bool,
    /// `(row, logprob bits)` when the token was chosen from the logits.
    emit: Option<(usize, u32)>,
}

/// Runs one NEXT_TOKEN task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(6, 7, 4)?;
    let logits = call.input(0)?;
    let pos_src = match call.inputs.get(1) {
        Some(Input::InPlace(0)) => PosSource::InPlace,
        Some(Input::InPlace(j)) => {
            return Err(OpError::Shape(format!(
                "NEXT_TOKEN advances the position (input 1) in place in output 0, not output {j}"
            )));
        }
        _ => PosSource::Separate(call.input(1)?),
    };
    let (prompt, stop, limits, sampling) = (
        call.input(2)?,
        call.input(3)?,
        call.input(4)?,
        call.input(5)?,
    );
    op_logit_stats::reference::check_logits("NEXT_TOKEN", logits)?;
    i32_at_least(prompt, 1, "prompt")?;
    i32_at_least(stop, 1, "stop ids")?;
    i32_at_least(limits, LIMITS_LEN, "limits")?;
    if sampling.dtype() != DType::F32 {
        return Err(OpError::DType(format!(
            "NEXT_TOKEN sampling settings must be F32, got {}",
            sampling.dtype()
        )));
    }
    if sampling.numel() < SAMPLING_LEN {
        return Err(OpError::Shape(format!(
            "NEXT_TOKEN sampling settings must hold [temperature, top_p], got shape {:?}",
            sampling.shape()
        )));
    }
    let stats = match call.inputs.len() {
        7 => {
            let st = call.input(6)?;
            op_logit_stats::reference::check_stats(st, "NEXT_TOKEN logit stats")?;
            Some(st)
        }
        _ => None,
    };
    let outs = &*call.outputs;
    let [pos_out, token_out, halt_out, emitted] = outs else {
        return Err(OpError::Arity {
            what: "outputs",
            expected: "4".into(),
            got: outs.len(),
        });
    };
    let pos_in = match pos_src {
        PosSource::Separate(t) => t,
        PosSource::InPlace => pos_out,
    };
    for (t, role) in [(pos_in, "position"), (pos_out, "position output")] {
        if !t.dtype().is_integer() {
            return Err(OpError::DType(format!(
                "NEXT_TOKEN {role} must be an integer buffer, got {}",
                t.dtype()
            )));
        }
    }
    if pos_in.numel() == 0 || pos_in.numel() != pos_out.numel() {
        return Err(OpError::Shape(format!(
            "NEXT_TOKEN position input {:?} and output {:?} must hold the same, non-zero \
             number of elements",
            pos_in.shape(),
            pos_out.shape()
        )));
    }
    i32_at_least(token_out, 1, "token output")?;
    i32_at_least(halt_out, 1, "halt output")?;
    i32_at_least(emitted, 0, "emitted tokens")?;
    if emitted.shape().len() != 2 || emitted.last_dim() != 2 {
        return Err(OpError::Shape(format!(
            "NEXT_TOKEN emitted tokens must be [R, 2], got {:?}",
            emitted.shape()
        )));
    }

    let d = decide(
        Logits { row: logits, stats },
        pos_in.get_i64(0),
        prompt,
        stop,
        limits,
        sampling,
        emitted,
    )?;

    // Every check has passed: write.
    let separate = match pos_src {
        PosSource::Separate(t) => Some(t),
        PosSource::InPlace => None,
    };
    let [pos_out, token_out, halt_out, emitted] = &mut *call.outputs else {
        return Ok(()); // unreachable: the arity was checked above
    };
    if let Some(src) = separate {
        for i in 0..src.numel() {
            pos_out.set_i64(i, src.get_i64(i));
        }
    }
    pos_out.set_i64(0, d.q);
    token_out.set_i64(0, d.token);
    halt_out.set_i64(0, i64::from(d.halt));
    if let Some((row, bits)) = d.emit {
        emitted.set_i64(2 * row, d.token);
        emitted.set_i64(2 * row + 1, i64::from(bits as i32));
    }
    Ok(())
}

/// The logits a choice reads, and their LOGIT_STATS summaries when the task has them.
struct Logits<'a> {
    row: &'a Tensor,
    stats: Option<&'a Tensor>,
}

/// The semantics proper, on checked operands: the next token, the new position, the halt flag
/// and the row to emit, or the index error that stops the task before any write.
fn decide(
    logits: Logits<'_>,
    p: i64,
    prompt: &Tensor,
    stop: &Tensor,
    limits: &Tensor,
    sampling: &Tensor,
    emitted: &Tensor,
) -> Result<Decision, OpError> {
    if p < 0 {
        return Err(OpError::IndexOutOfRange {
            at: 0,
            value: p,
            limit: i64::MAX as u64,
        });
    }
    let q = p + 1; // p ≤ i32::MAX: every integer dtype reads within i32
    let prompt_len = limits.get_i64(0);
    let end = limits.get_i64(1);
    let forcing = q < prompt_len;
    let (token, emit) = if forcing {
        let l = prompt.numel();
        let at = usize::try_from(q)
            .ok()
            .filter(|&at| at < l)
            .ok_or(OpError::IndexOutOfRange {
                at: 0,
                value: q,
                limit: l as u64,
            })?;
        (prompt.get_i64(at), None)
    } else {
        let rows = emitted.shape().first().copied().unwrap_or(0);
        let row = usize::try_from(q)
            .ok()
            .filter(|&r| (r as u64) < rows)
            .ok_or(OpError::IndexOutOfRange {
                at: 0,
                value: q,
                limit: rows,
            })?;
        let settings = Settings {
            temperature: sampling.get_f32(0),
            top_p: sampling.get_f32(1),
            top_k: limits.get_i64(2),
            seed: (limits.get_i64(3) as u32 as u64) | ((limits.get_i64(4) as u32 as u64) << 32),
            vocab_limit: limits.get_i64(5),
        };
        let xs = logits.row.to_f32_vec();
        let c = match logits.stats {
            Some(st) => {
                let summary = op_logit_stats::reference::merged(st);
                choose::choose_given(&xs, &settings, q as u64, &summary)
            }
            None => choose::choose(&xs, &settings, q as u64),
        };
        (c.token as i64, Some((row, c.logprob.to_bits())))
    };
    let stops =
        !forcing && (0..stop.numel()).any(|i| stop.get_i64(i) >= 0 && stop.get_i64(i) == token);
    Ok(Decision {
        q,
        token,
        halt: stops || q.saturating_add(1) >= end,
        emit,
    })
}
