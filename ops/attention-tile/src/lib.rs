//! Opcode `ATTENTION_TILE` (code 7): GQA decode attention over cache rows [kv_start, kv_start+kv_len), clipped to rows <= pos[0] with a 4th input; flags bit 1 writes un-normalised [acc|m|l] partials.
//!
//! Inputs `[q, k_cache, v_cache]` or `[q, k_cache, v_cache, pos]`, one output; params
//! `head_dim`, `kv_start`, `kv_len`, `scale`, `n_heads`, `n_kv_heads` (and `flags`).
//!
//! **Position.** With the fourth input, an integer buffer whose element 0 is the position `p`,
//! the params are a static window (the whole cache, or a split-KV shard's fixed slice) and the
//! position clips it: the task attends rows `[kv_start, kv_start + n)` with
//! `n = min(kv_len, max(0, p + 1 − kv_start))`. Why: a decode step then sets one element of a
//! buffer instead of patching every attention task's params each token (as QKV_ROPE_APPEND
//! and ROPE read theirs). A negative `p` is an index error; an empty window is a split-KV
//! partial's empty shard (flags bit 1), an error otherwise. Both are known only when the task
//! runs, so the static rule checks only the buffer (integer, at least one element).
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`attention-tile.cu`).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_attention as _;
use std::borrow::Cow;

pub mod reference;

/// `flags` bit 1: write un-normalised `[acc | m | l]` partials (a split-KV shard).
pub const FLAG_PARTIAL_WRITE: i64 = 2;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::ATTENTION_TILE,
    name: Cow::Borrowed("ATTENTION_TILE"),
    min_inputs: 3,
    max_inputs: Some(4),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::required("kv_start", ParamType::Int),
        ParamDecl::required("kv_len", ParamType::Int),
        ParamDecl::required("scale", ParamType::Real),
        ParamDecl::required("n_heads", ParamType::Int),
        ParamDecl::required("n_kv_heads", ParamType::Int),
        ParamDecl::optional("flags", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed(
        "GQA decode attention over cache rows [kv_start, kv_start+kv_len), clipped to rows <= pos[0] with a 4th input; flags bit 1 writes un-normalised [acc|m|l] partials.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("attention-tile.cu"), "amk_op_attention_tile").with_own_wait(),
        ),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let Some(out) = c.output(0) else {
        return Vec::new();
    };
    let partial = c.int("flags").unwrap_or(0) & FLAG_PARTIAL_WRITE != 0;
    let pos = (ctx.n_inputs() == 4).then_some(3);
    let Some(g) = check_attention(&mut c, partial, pos) else {
        return c.finish();
    };
    let per_head = if partial { g.hd + 2 } else { g.hd };
    c.numel_is(out, g.batch.saturating_mul(g.nh * per_head), "output");
    c.float(out, "output");
    c.finish()
}

/// What [`check_attention`] found: batch, query heads and head size.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Batch (1 unless the caches are rank 4).
    pub batch: u64,
    /// Query heads.
    pub nh: u64,
    /// Elements per head.
    pub hd: u64,
}

/// The attention's own rule (inputs `[q, k_cache, v_cache, ..]` and the attention params;
/// `partial`: a split-KV shard, which may be empty; `pos`: the input holding the position that
/// clips the window, if any), shared with the ops that compute the attention inside another op
/// (ATTENTION_GEMV). `None` when an operand or a size param is missing or invalid (already
/// reported).
pub fn check_attention(
    c: &mut Checker<'_, '_>,
    partial: bool,
    pos: Option<usize>,
) -> Option<Heads> {
    let (q, kc, vc) = (c.input(0)?, c.input(1)?, c.input(2)?);
    if let Some(b) = pos.and_then(|i| c.input(i)) {
        check_position(c, b);
    }
    let hd = c.positive("head_dim");
    let nh = c.positive("n_heads");
    let nkv = c.positive("n_kv_heads");
    let kv_start = c.non_negative("kv_start");
    let kv_len = c.non_negative("kv_len");
    let (hd, nh, nkv) = (hd?, nh?, nkv?);
    if nh % nkv != 0 {
        c.mismatch(format!(
            "n_heads = {nh} must be a multiple of n_kv_heads = {nkv}"
        ));
    }
    let row = (nkv * hd) as u64;
    if kc.numel() != vc.numel() {
        c.same_numel(kc, vc);
    }
    // Batched caches are [B, max_seq, n_kv, hd]; otherwise the cache is max_seq rows of n_kv*hd.
    let (batch, max_seq) = if kc.rank() == 4 {
        (kc.shape[0], kc.shape[1])
    } else {
        (1, kc.numel() / row.max(1))
    };
    if kc.numel() != batch.saturating_mul(max_seq).saturating_mul(row) {
        c.mismatch(format!(
            "the cache {} is not a whole number of rows of n_kv_heads x head_dim = {row}",
            desc(kc)
        ));
    }
    if let (Some(s), Some(l)) = (kv_start, kv_len) {
        if l == 0 && !partial {
            c.oob("kv_len = 0 attends to nothing (only a split-KV shard may be empty)");
        }
        if (s.saturating_add(l)) as u64 > max_seq {
            c.oob(format!(
                "cache rows [{s}, {}) exceed the {max_seq} rows of the cache {}",
                s.saturating_add(l),
                desc(kc)
            ));
        }
    }
    c.numel_is(q, batch.saturating_mul((nh * hd) as u64), "query");
    c.float(q, "query");
    Some(Heads {
        batch,
        nh: nh as u64,
        hd: hd as u64,
    })
}

/// The rule on a position buffer: integers (the device reads element 0 with the integer
/// loads), at least one element. Its value is data, checked when the task runs.
pub fn check_position(c: &mut Checker<'_, '_>, pos: &amk_core::Buffer) {
    c.integer(pos, "position buffer");
    if pos.numel() == 0 {
        c.mismatch(format!("the position buffer {} is empty", desc(pos)));
    }
}
