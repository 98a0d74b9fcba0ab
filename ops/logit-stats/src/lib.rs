//! Opcode `LOGIT_STATS` (code 31): slices ("slots") of one logits row summarised for the
//! decode loop's tail — each slot's first largest logit, its count of valid ids and the sum of
//! `exp(l − max)` over them ([`Summary`]).
//!
//! **Why.** NEXT_TOKEN is one task on one SM. Reading a whole row of logits there (49,152 in
//! SmolLM2, 128,256 in a Llama 3) took about 30 µs of every decode pass even with 16-byte
//! loads in flight: the row is small, one SM's loads are the limit. Summaries of ~130 slots,
//! one task a slot on as many SMs, let NEXT_TOKEN merge ~130 records instead (its optional
//! input 6), and greedy decoding never reads the row on one SM: the tail 28 → 15 µs a pass
//! (docs/perf-notes.md rounds 39–40).
//!
//! # Operands
//!
//! Inputs, in order:
//! 0. `logits`: F32, F16 or BF16, one row: `numel == last dim == V ≥ 1`.
//! 1. `limits`: I32, `numel > VOCAB_LIMIT_AT`: NEXT_TOKEN's limits; element
//!    [`VOCAB_LIMIT_AT`] is the vocabulary limit (`≤ 0`: none).
//!
//! Output: `stats`, I32 `[4, G]`: column `g` is slot `g`'s [`Summary`] as four words
//! ([`Summary::to_words`]; rows [`ROW_MAX`], [`ROW_FIRST`], [`ROW_SUM`], [`ROW_COUNT`]).
//!
//! Params: `cols` (logits a slot), `N_tile` and `n_off` (the task's slots `[n_off, n_off +
//! N_tile)`, columns of the output). The slots must cover the row exactly: `G · cols ≥ V >
//! (G − 1) · cols`.
//!
//! # Semantics
//!
//! With `V' = min(limit, V)` when the limit is `> 0`, else `V` ([`effective_vocab`]), slot `g`
//! covers ids `[min(g · cols, V'), min((g + 1) · cols, V'))`, and its summary is
//! [`Summary::of`] those logits (as f32; NaN logits are not valid). The sum is carried in f64
//! on the CPU and rounded to f32 when stored; the device sums in f32 with CUDA's `expf`, so the
//! two agree on the maximum, its index and the count exactly and on the sum to about 1e-6
//! relative.
//!
//! This crate owns the op's spec, its static shape rule, the summary and its words, its CPU
//! reference ([`reference`](mod@reference)) and its CUDA device function (`logit-stats.cu`).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{Checker, desc, tile_within};
use amk_core::{
    Buffer, DType, Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference,
    TaskContext,
};
use oplib_logits as _;
use std::borrow::Cow;

pub mod reference;
mod summary;

pub use summary::{ROW_COUNT, ROW_FIRST, ROW_MAX, ROW_SUM, ROWS, Summary};

/// The element of NEXT_TOKEN's `limits` that holds the vocabulary limit.
pub const VOCAB_LIMIT_AT: usize = 5;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::LOGIT_STATS,
    name: Cow::Borrowed("LOGIT_STATS"),
    min_inputs: 2,
    max_inputs: Some(2),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("cols", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Slots [n_off, n_off+N_tile) of one logits row summarised: first largest logit, valid count, sum of exps.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("logit-stats.cu"), "amk_op_logit_stats")),
    }
}

/// The ids that take part: `min(vocab_limit, V)`, or `V` without a limit (`≤ 0`).
pub fn effective_vocab(v: usize, vocab_limit: i64) -> usize {
    match usize::try_from(vocab_limit) {
        Ok(lim) if lim > 0 => lim.min(v),
        _ => v,
    }
}

/// The ids of slot `g` of `cols` logits among the `vp` that take part.
pub fn slot_ids(g: usize, cols: usize, vp: usize) -> std::ops::Range<usize> {
    let lo = g.saturating_mul(cols).min(vp);
    let hi = g.saturating_add(1).saturating_mul(cols).min(vp);
    lo..hi
}

/// Why `slots` slots of `cols` logits do not cover a row of `v` exactly, if they do not.
pub fn cover_error(slots: u64, cols: u64, v: u64) -> Option<String> {
    let covered = slots.saturating_mul(cols);
    if covered < v {
        return Some(format!(
            "{slots} slots of {cols} logits cover {covered} of the row's {v}"
        ));
    }
    if slots > 0 && (slots - 1).saturating_mul(cols) >= v {
        return Some(format!(
            "{slots} slots of {cols} logits: the last starts past the row's {v}"
        ));
    }
    None
}

/// The shape rule of a row of logits (one non-empty row of F32, F16 or BF16), for this op and
/// NEXT_TOKEN.
pub fn check_logits_row(c: &mut Checker<'_, '_>, x: &Buffer) {
    if !matches!(x.dtype, DType::F32 | DType::F16 | DType::BF16) {
        c.mismatch(format!("the logits {} must be F32, F16 or BF16", desc(x)));
    }
    if x.numel() == 0 || x.numel() != x.last_dim() {
        c.mismatch(format!(
            "the logits {} must be one non-empty row (numel == last dim)",
            desc(x)
        ));
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let (Some(x), Some(limits), Some(out)) = (c.input(0), c.input(1), c.output(0)) else {
        return c.finish();
    };
    check_logits_row(&mut c, x);
    if limits.dtype != DType::I32 || limits.numel() <= VOCAB_LIMIT_AT as u64 {
        c.mismatch(format!(
            "the limits {} must be I32 with at least {} elements",
            desc(limits),
            VOCAB_LIMIT_AT + 1
        ));
    }
    if out.dtype != DType::I32 || out.rank() != 2 || out.shape[0] != ROWS {
        c.mismatch(format!(
            "the stats {} must be I32 [{ROWS}, slots]",
            desc(out)
        ));
        return c.finish();
    }
    let slots = out.last_dim();
    tile_within(&mut c, slots, "slots");
    if let Some(cols) = c.positive("cols")
        && let Some(why) = cover_error(slots, cols as u64, x.numel())
    {
        c.mismatch(why);
    }
    c.finish()
}
