//! Opcode `NEXT_TOKEN` (code 24): the tail of one iteration of a decode loop that runs on the
//! device.
//!
//! A decode loop that stays on the device needs one task, at the end of each iteration, that
//! does what a host would do between two forward passes: pick the token to feed next, keep the
//! tokens the model chose for the host to read, move the position on and decide whether the
//! loop stops. This crate owns that op: its spec, its static shape rule for the validator, its
//! CPU reference ([`reference`](mod@reference), with the choice itself in [`choose`] and the
//! random stream in [`noise`]) and its CUDA device function (`next-token.cu`).
//!
//! # Operands
//!
//! Inputs, in order:
//! 0. `logits`: F32, F16 or BF16, one row: `numel == last dim == V ≥ 1` (`[V]` or `[1, V]`).
//! 1. `pos`: any integer dtype, `numel ≥ 1`; element 0 is `p`, the position of the token fed
//!    in this iteration.
//! 2. `prompt`: I32, `numel = L ≥ 1`: the sequence's known tokens.
//! 3. `stop`: I32, `numel ≥ 1`: stop token ids; negative entries are unused slots.
//! 4. `limits`: I32, `numel ≥ 6`: `[P, E, top_k, seed_lo, seed_hi, vocab_limit]` — the prompt
//!    length, the end position, top-k (≤ 0: off), the seed as two 32-bit words
//!    (`seed = (u32)seed_lo | (u32)seed_hi << 32`) and the vocabulary limit (≤ 0: `V`).
//! 5. `sampling`: F32, `numel ≥ 2`: `[temperature, top_p]`.
//! 6. (optional) `stats`: I32 `[4, G]`, LOGIT_STATS's summaries of slots of these logits
//!    ([`op_logit_stats`]): the largest valid logit, its first id, the valid count and the sum
//!    of exps then come from merging the slots ([`op_logit_stats::Summary::merge`]) instead of
//!    a pass over the logits on one SM. Whoever builds the program makes the slots cover the
//!    logits (the validator orders the stats' writers before this task, not their columns).
//!
//! Outputs, in order:
//! 0. the `pos` buffer itself, updated in place (the shape rule requires `outputs[0] ==
//!    inputs[1]`; the reference declares the pair `(1, 0)`): element 0 becomes `q = p + 1`.
//! 1. `token`: I32, `numel ≥ 1`: element 0 is the next token.
//! 2. `halt`: I32, `numel ≥ 1`: element 0 is 1 when the loop stops after this iteration.
//! 3. `emitted`: I32 `[R, 2]`: row `q` becomes `(token, f32 bits of its log-probability)` when
//!    the token was chosen from the logits; every other row, and row `q` when the token came
//!    from the prompt, is left as it was.
//!
//! No params.
//!
//! # Semantics (`q = p + 1`)
//!
//! - `p < 0` is an index error.
//! - Teacher forcing, `q < P`: the next token is `prompt[q]` (an index error when `q ≥ L`),
//!   passed through unchecked (the embedding that reads it checks it). Nothing is written to
//!   `emitted`, and a prompt token that is a stop id does not halt.
//! - Otherwise the next token is [`choose::choose`] of the logits, and row `q` of `emitted`
//!   receives it (an index error when `q ≥ R`).
//! - `pos = q`, `token = next`, `halt = (q ≥ P and next is a non-negative stop id) or
//!   q + 1 ≥ E`.
//! - Every check, on data as well as on shapes, happens before the first write: a task that
//!   fails writes nothing.
//!
//! The choice (greedy or seeded sampling with temperature, top-k and top-p, by a Gumbel-max
//! draw that is exact sampling from the truncated softmax) is specified in [`choose`]; the
//! random stream in [`noise`].
//!
//! # Device and CPU
//!
//! The device computes in f32 with CUDA's IEEE `expf` / `logf`; the CPU reference uses Rust's
//! `f32::exp` / `f32::ln` for the same f32 formulas (and f64 for the log-probability, rounded
//! to f32). The two libraries may differ by an ulp or two, so the device and the CPU agree on
//! the token except when two candidates are within a few ulps of each other at a top-k / top-p
//! threshold or in the Gumbel argmax (about 1e-6 of draws); greedy choices agree exactly, and
//! log-probabilities to about 1e-6 relative.

// Linked with the op: the device code its CUDA source calls.
use amk_core::Buffer;
use amk_core::opcheck::{Checker, desc};
use amk_core::{DType, Finding, OpRegistration, OpSpec, Opcode, Reference, TaskContext};
use oplib_logits as _;
use std::borrow::Cow;

pub mod choose;
pub mod noise;
pub mod reference;

/// Minimum element counts of the I32 `limits` and F32 `sampling` inputs.
pub const LIMITS_LEN: usize = 6;
/// See [`LIMITS_LEN`].
pub const SAMPLING_LEN: usize = 2;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::NEXT_TOKEN,
    name: Cow::Borrowed("NEXT_TOKEN"),
    min_inputs: 6,
    max_inputs: Some(7),
    n_outputs: Some(4),
    params: Cow::Borrowed(&[]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed(
        "Decode-loop tail: the next token (prompt or sampled), the position advanced in place, \
         the halt flag, sampled tokens recorded.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[(1, 0)] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("next-token.cu"), "amk_op_next_token")
                .with_own_wait()
        ),
    }
}

/// Requires `b` to be I32 with at least `n` elements.
fn i32_at_least(c: &mut Checker<'_, '_>, b: &Buffer, n: u64, role: &str) {
    if b.dtype != DType::I32 {
        c.mismatch(format!("{role} {} must be I32", desc(b)));
    }
    if b.numel() < n {
        c.mismatch(format!(
            "{role} {} must have at least {n} element(s), has {}",
            desc(b),
            b.numel()
        ));
    }
}

/// Static shape rule, run by the validator (arity is checked before it runs; it stays total).
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    if let Some(x) = c.input(0) {
        op_logit_stats::check_logits_row(&mut c, x);
    }
    if let Some(pos) = c.input(1) {
        c.integer(pos, "the position");
        if pos.numel() == 0 {
            c.mismatch(format!("the position {} holds no element", desc(pos)));
        }
        match c.output(0) {
            Some(out) if out.id != pos.id => c.mismatch(format!(
                "NEXT_TOKEN advances the position in place: output 0 must be input 1 {}, not {}",
                desc(pos),
                desc(out)
            )),
            _ => {}
        }
    }
    for (i, n, role) in [
        (2, 1, "the prompt"),
        (3, 1, "the stop ids"),
        (4, LIMITS_LEN as u64, "the limits"),
    ] {
        if let Some(b) = c.input(i) {
            i32_at_least(&mut c, b, n, role);
        }
    }
    if let Some(s) = c.input(5) {
        if s.dtype != DType::F32 {
            c.mismatch(format!("the sampling settings {} must be F32", desc(s)));
        }
        if s.numel() < SAMPLING_LEN as u64 {
            c.mismatch(format!(
                "the sampling settings {} must hold [temperature, top_p]",
                desc(s)
            ));
        }
    }
    if let Some(st) = c.input(6)
        && (st.dtype != DType::I32 || st.rank() != 2 || st.shape[0] != op_logit_stats::ROWS)
    {
        c.mismatch(format!(
            "the logit stats {} must be I32 [{}, slots]",
            desc(st),
            op_logit_stats::ROWS
        ));
    }
    for (j, role) in [(1, "the token output"), (2, "the halt output")] {
        if let Some(b) = c.output(j) {
            i32_at_least(&mut c, b, 1, role);
        }
    }
    if let Some(e) = c.output(3) {
        if e.dtype != DType::I32 {
            c.mismatch(format!("the emitted tokens {} must be I32", desc(e)));
        }
        if e.rank() != 2 || e.last_dim() != 2 {
            c.mismatch(format!(
                "the emitted tokens {} must be [R, 2] (token, log-probability bits)",
                desc(e)
            ));
        }
    }
    c.finish()
}
