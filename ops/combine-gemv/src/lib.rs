//! Opcode `COMBINE_GEMV` (code 26): columns `[n_off, n_off+N_tile)` of
//! `y = combine(partials) @ W^T (+ bias)` — the split-KV attention's partials (ATTENTION_SPLIT)
//! merged inside every tile of the output projection that reads them.
//!
//! Inputs `[partials, W, pos]` or `[partials, W, bias, pos]`, one output; params `head_dim`,
//! `n_heads`, `n_kv_heads`, `n_splits`, `chunk` (the split layout, as the ATTENTION_SPLIT
//! tasks that wrote the partials had them) and GEMV_TILE's `K`, `N_tile`, `n_off`.
//!
//! **Why.** A combine task of its own would put a phase and a hand-off between the attention
//! and the output projection. Every tile needs the whole attention row anyway (its `K` spans
//! every head), so each merges it from the partials, redundantly, as ATTENTION_GEMV computes
//! the whole attention in each tile.
//!
//! **The merge** (per query head `h` of KV head `g = h / rep`, over the splits `s` that are
//! active at the position, [`op_attention_split::active_splits`]): `m = max_s m_s`,
//! `w_s = exp(m_s − m)` (0 when `l_s = 0`), `l = Σ_s l_s · w_s`, `row = Σ_s acc_s · w_s / l`,
//! in fp32; the row is rounded to `W`'s dtype (the program's activation dtype) before the
//! products, as a combine into an activation would store it. Splits that are not active are
//! not read (ATTENTION_SPLIT leaves their regions as they were).
//!
//! This crate owns the op's spec, its static shape rule, its CPU reference and its CUDA
//! device function (`combine-gemv.cu`).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{self, Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_attention as _;
use oplib_tile as _;
use std::borrow::Cow;

pub mod reference;

/// Dynamic shared memory the device tile asks for, which bounds what it keeps there (the row
/// and the merge's scratch, [`shared_bytes`]): GEMV_TILE's row budget.
pub const SHARED_BYTES: u32 = op_gemv_tile::SHARED_BYTES;

/// Shared memory a tile needs at least: the merged row of `k` elements of the weight's dtype
/// (`w_bytes` each), then the merge's scratch in f32 (the row's un-normalised sums, every
/// head's split maxima, sums and denominator), then room to stage one split's partials of one
/// KV head (the tile copies the partials there, as many splits at a time as the rest of its
/// shared memory holds), each part 16-byte aligned. The device's `cg_row_bytes`,
/// `cg_scratch_bytes` and `cg_split_bytes` compute the same.
pub fn shared_bytes(g: &op_attention_split::SplitGeometry, k: u64, w_bytes: u64) -> u64 {
    let align = |b: u64| b.div_ceil(16).saturating_mul(16);
    let row = align(k.saturating_mul(w_bytes));
    let scratch =
        g.nh.saturating_mul(2u64.saturating_mul(g.n_splits).saturating_add(1))
            .saturating_add(k)
            .saturating_mul(4);
    let split = g.rep().saturating_mul(g.hd + 2).saturating_mul(4);
    row.saturating_add(align(scratch))
        .saturating_add(align(split))
}

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::COMBINE_GEMV,
    name: Cow::Borrowed("COMBINE_GEMV"),
    min_inputs: 3,
    max_inputs: Some(4),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::required("n_heads", ParamType::Int),
        ParamDecl::required("n_kv_heads", ParamType::Int),
        ParamDecl::required("K", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
        ParamDecl::required("n_splits", ParamType::Int),
        ParamDecl::required("chunk", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Columns [n_off, n_off+N_tile) of y = combine(split-KV partials at pos[0]) @ W^T (+ bias), the partials merged in the tile.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        // The row the weights multiply is rounded to W's dtype: W is the row's dtype too.
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("combine-gemv.cu"), "amk_op_combine_gemv")
                .with_shared(SHARED_BYTES)
                .with_own_wait()
                .with_row_loop(1, &[1], 1)
                .with_f32_direct(),
        ),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let n = ctx.n_inputs();
    let (Some(parts), Some(w), Some(pos), Some(out)) = (
        c.input(0),
        c.input(1),
        c.input(n.saturating_sub(1)),
        c.output(0),
    ) else {
        return c.finish();
    };
    op_attention_tile::check_position(&mut c, pos);
    let Some(g) = op_attention_split::check_split_params(&mut c) else {
        return c.finish();
    };
    op_attention_split::check_partials(&mut c, parts, &g);
    let Some(k) = c.positive("K") else {
        return c.finish();
    };
    let k = k as u64;
    if k != g.nh.saturating_mul(g.hd) {
        c.mismatch(format!(
            "param K = {k} must be n_heads x head_dim = {} x {}",
            g.nh, g.hd
        ));
    }
    let vec = |b: &amk_core::Buffer| {
        matches!(
            b.dtype,
            amk_core::DType::F32 | amk_core::DType::F16 | amk_core::DType::BF16
        )
    };
    for (b, role) in [(w, "weight"), (out, "output")] {
        if !vec(b) {
            c.mismatch(format!("the {role} {} must be F32, F16 or BF16", desc(b)));
        }
    }
    let need = shared_bytes(&g, k, w.dtype.bits().div_ceil(8));
    if vec(w) && need > u64::from(SHARED_BYTES) {
        c.mismatch(format!(
            "the attention row of K = {k} elements of {} and the merge of {} heads x {} splits \
             take {need} bytes, beyond the tile's {SHARED_BYTES} bytes of shared memory",
            w.dtype, g.nh, g.n_splits
        ));
    }
    if w.last_dim() != k {
        c.mismatch(format!(
            "param K = {k} must equal the last dim of the weight {}",
            desc(w)
        ));
    }
    let rows = w.numel() / k.max(1);
    if n == 4
        && let Some(b) = c.input(2)
    {
        c.numel_is(b, rows, "bias");
        if !vec(b) {
            c.mismatch(format!("the bias {} must be F32, F16 or BF16", desc(b)));
        }
    }
    let what = format!("rows of the weight {}", desc(w));
    if let Some(end) = opcheck::tile_within(&mut c, rows, &what)
        && (end > out.last_dim() || out.numel() != out.last_dim())
    {
        c.oob(format!(
            "columns [.., {end}) must fit the one-row output {}",
            desc(out)
        ));
    }
    c.finish()
}
