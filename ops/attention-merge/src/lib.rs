//! Opcode `ATTENTION_MERGE` (code 30): columns `[n_off, n_off + N_tile)` — whole query heads —
//! of the decode attention row, merged from the split-KV partials that ATTENTION_SPLIT wrote
//! at the position.
//!
//! Inputs `[partials, pos]`, one output (the attention row, `n_heads · head_dim` elements of a
//! float dtype; rounded to it); params `head_dim`, `n_heads`, `n_kv_heads`, `n_splits`,
//! `chunk` (the split layout, as the ATTENTION_SPLIT tasks that wrote the partials had them)
//! and the column tile `N_tile`, `n_off`, both multiples of `head_dim`.
//!
//! **Why.** COMBINE_GEMV merges the whole row in every one of the output projection's ~130
//! tiles: the same merge done ~130 times over, all of them at once against L2, and measured at
//! 7 µs of a 1B layer at position 0 and 17 µs at 4,095 (docs/perf-notes.md rounds 29–32),
//! where a plain GEMV tile reading a finished row starts in 0.6 µs. A few tasks that merge each
//! head once cost one more hand-off (≈ 1 µs) and leave the projection plain GEMV tiles.
//!
//! **The merge** is COMBINE_GEMV's ([`op_attention_split::reference::combine`]): per query head
//! over the splits active at the position, `m = max_s m_s`, `w_s = exp(m_s − m)` (0 when
//! `l_s = 0`), `l = Σ_s l_s · w_s`, `row = Σ_s acc_s · w_s / max(l, 1e-20)`, in fp32, in split
//! order. Splits that are not active are not read.
//!
//! This crate owns the op's spec, its static shape rule, its CPU reference and its CUDA device
//! function (`attention-merge.cu`).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_attention as _;
use std::borrow::Cow;

pub mod reference;

/// Dynamic shared memory the device task asks for: each split's merge weight of its heads and
/// each head's denominator (a tile of more heads or splits than it holds merges without it).
pub const SHARED_BYTES: u32 = 4096;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::ATTENTION_MERGE,
    name: Cow::Borrowed("ATTENTION_MERGE"),
    min_inputs: 2,
    max_inputs: Some(2),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::required("n_heads", ParamType::Int),
        ParamDecl::required("n_kv_heads", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
        ParamDecl::required("n_splits", ParamType::Int),
        ParamDecl::required("chunk", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Columns [n_off, n_off+N_tile) (whole heads) of the attention row merged from split-KV partials at pos[0].",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("attention-merge.cu"), "amk_op_attention_merge")
                .with_own_wait()
                .with_f32_direct()
                .with_shared(SHARED_BYTES),
        ),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let (Some(parts), Some(pos), Some(out)) = (c.input(0), c.input(1), c.output(0)) else {
        return c.finish();
    };
    op_attention_tile::check_position(&mut c, pos);
    let Some(g) = op_attention_split::check_split_params(&mut c) else {
        return c.finish();
    };
    op_attention_split::check_partials(&mut c, parts, &g);
    c.float(out, "attention row");
    let k = g.nh.saturating_mul(g.hd);
    c.numel_is(out, k, "attention row (n_heads x head_dim)");
    if out.numel() != out.last_dim() {
        c.mismatch(format!("the attention row {} must be one row", desc(out)));
    }
    let (Some(n_tile), Some(n_off)) = (c.positive("N_tile"), c.non_negative("n_off")) else {
        return c.finish();
    };
    let (n_tile, n_off) = (n_tile as u64, n_off as u64);
    if n_tile % g.hd != 0 || n_off % g.hd != 0 {
        c.mismatch(format!(
            "N_tile = {n_tile} and n_off = {n_off} must be whole heads (multiples of head_dim = {})",
            g.hd
        ));
    }
    if n_off.saturating_add(n_tile) > k {
        c.oob(format!(
            "columns [{n_off}, {}) exceed the attention row's {k}",
            n_off.saturating_add(n_tile)
        ));
    }
    c.finish()
}
