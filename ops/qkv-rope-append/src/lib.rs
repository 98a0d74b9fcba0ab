//! Opcode `QKV_ROPE_APPEND` (code 22): a tile of a decode step's attention prologue — the
//! Q, K and V projections of one row `x` (optionally RMS-normalised first), rotary position
//! embedding (rotate-half) on Q and K, and K and V written into their caches at row `pos` —
//! in one task instead of six phases (RMSNORM, GEMV tiles, reshape, ROPE, KV_APPEND).
//!
//! Inputs `[x, Wq, Wk, Wv, pos]` or `[x, Wq, Wk, Wv, pos, norm_w]` (then param `eps` is
//! required); outputs `[q, kcache, vcache]` (`q` of `n_heads · head_dim` elements, the caches
//! `[max_seq, n_kv_heads, head_dim]` or `[max_seq, n_kv_heads · head_dim]`); params `K`,
//! `N_tile`, `n_off`, `head_dim`, `n_heads`, `n_kv_heads`, `theta` (and `eps`).
//!
//! **Frequency factors.** With param `rope_factors` = 1 the last input holds `head_dim / 2`
//! per-pair frequency divisors (Llama 3's scaling, GGUF's `rope_freqs.weight`), as ROPE's
//! optional third input: `[x, Wq, Wk, Wv, pos (, norm_w), factors]` ([`optional_inputs`]).
//!
//! **Position.** Element 0 of the integer buffer `pos` (as ROPE reads its positions), checked
//! when the task runs: a position outside the caches is an index error. It is an input rather
//! than a param like KV_APPEND's because a decode step would otherwise patch every Q/K/V tile
//! (thousands per step) instead of setting one element.
//!
//! **Units.** The tile covers units `[n_off, n_off + N_tile)` of the `(n_heads + 2·n_kv_heads)
//! · head_dim` output rows of Q, K and V (heads in that order) numbered so that the two rows
//! RoPE rotates together are adjacent: unit `u` is row `i + (u mod 2)·head_dim/2` of head
//! `u div head_dim`, where `i = (u mod head_dim) div 2`. `n_off` and `N_tile` are even, so a
//! tile holds whole pairs and its warps rotate in registers. Tiles are column tiles of that
//! numbering (`WriteRegion::Columns`): disjoint tiles write disjoint elements of every output.
//!
//! **Numerics.** Each projection sum is GEMV_TILE's (same order), rounded to its destination's
//! dtype as the unfused program stores it; the rotation is ROPE's (fp32, separate roundings,
//! `inv_freq` and `cos`/`sin` as in `op_rope::reference`). Fusing changes no result. Float
//! operands only (F32, F16, BF16).
//!
//! This crate owns the op's spec, its static shape rule, its CPU reference
//! ([`reference`](mod@reference)) and its CUDA device function (`qkv-rope-append.cu`).

use amk_core::opcheck::{self, Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::QKV_ROPE_APPEND,
    name: Cow::Borrowed("QKV_ROPE_APPEND"),
    min_inputs: 5,
    max_inputs: Some(7),
    n_outputs: Some(3),
    params: Cow::Borrowed(&[
        ParamDecl::required("K", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::required("n_heads", ParamType::Int),
        ParamDecl::required("n_kv_heads", ParamType::Int),
        ParamDecl::required("theta", ParamType::Real),
        ParamDecl::optional("eps", ParamType::Real),
        ParamDecl::optional("rope_factors", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Q/K/V projection tile of one row x (RMS-normalised first with a 6th input), RoPE on Q and K, K and V written to the caches at position pos[0].",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("qkv-rope-append.cu"), "amk_op_qkv_rope_append")
                .with_shared(op_rmsnorm_gemv::SHARED_BYTES)
                .with_own_wait()
                .with_row_loop(0, &[1, 2, 3], 2),
        ),
    }
}

/// Where a task's optional inputs are: the norm weight and the RoPE frequency factors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalInputs {
    /// The RMS norm weight (input 5), when the tile normalises `x` first.
    pub norm: Option<usize>,
    /// The per-pair frequency factors (the last input), with `rope_factors` = 1.
    pub factors: Option<usize>,
}

/// The optional inputs of a task with `n_inputs` inputs and param `rope_factors` (the device
/// function reads them the same way).
pub fn optional_inputs(n_inputs: usize, rope_factors: bool) -> OptionalInputs {
    let factors = (rope_factors && n_inputs >= 6).then(|| n_inputs - 1);
    let rest = n_inputs - usize::from(factors.is_some());
    OptionalInputs {
        norm: (rest == 6).then_some(5),
        factors,
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let with_factors = match c.int("rope_factors") {
        None | Some(0) => false,
        Some(1) => true,
        Some(v) => {
            c.oob(format!(
                "param rope_factors = {v} must be 0 or 1 (1: the last input holds the RoPE frequency factors)"
            ));
            return c.finish();
        }
    };
    if with_factors && ctx.n_inputs() < 6 {
        c.mismatch("rope_factors = 1 needs the frequency factors as the last input".to_string());
        return c.finish();
    }
    if !with_factors && ctx.n_inputs() == 7 {
        c.mismatch(
            "7 inputs need rope_factors = 1 (the last one the frequency factors)".to_string(),
        );
        return c.finish();
    }
    let opt = optional_inputs(ctx.n_inputs(), with_factors);
    let norm = opt.norm;
    let Some((_, rows)) = opcheck::fused_row(&mut c, &[1, 2, 3], norm) else {
        return c.finish();
    };
    if let Some(pos) = c.input(4) {
        c.integer(pos, "position buffer");
        if pos.numel() == 0 {
            c.mismatch(format!("the position buffer {} is empty", desc(pos)));
        }
    }
    let hd = c.positive("head_dim");
    let nh = c.positive("n_heads");
    let nkv = c.positive("n_kv_heads");
    let (Some(hd), Some(nh), Some(nkv)) = (hd, nh, nkv) else {
        return c.finish();
    };
    let (hd, nh, nkv) = (hd as u64, nh as u64, nkv as u64);
    if hd % 2 != 0 {
        c.mismatch(format!("head_dim = {hd} must be even (RoPE rotates pairs)"));
        return c.finish();
    }
    if let Some(f) = opt.factors.and_then(|i| c.input(i)) {
        c.float(f, "RoPE frequency factors");
        if f.numel() != hd / 2 {
            c.mismatch(format!(
                "the RoPE frequency factors {} must hold head_dim / 2 = {} elements",
                desc(f),
                hd / 2
            ));
        }
    }
    if let Some(t) = c.real("theta")
        && !(t.is_finite() && t > 0.0)
    {
        c.mismatch(format!("theta = {t} must be positive and finite"));
    }
    let want = [
        nh.saturating_mul(hd),
        nkv.saturating_mul(hd),
        nkv.saturating_mul(hd),
    ];
    for (i, (&have, &want)) in rows.iter().zip(&want).enumerate() {
        if have != want {
            let w = c.input(i + 1).map(desc).unwrap_or_default();
            c.mismatch(format!(
                "weight {w} must have {want} rows (heads × head_dim), has {have}"
            ));
        }
    }
    if let Some(q) = c.output(0) {
        c.numel_is(q, want[0], "q output");
    }
    for j in [1, 2] {
        let Some(cache) = c.output(j) else { continue };
        let row = want[1].max(1);
        let ok_shape = matches!(cache.rank(), 2 | 3)
            && cache.numel() % row == 0
            && cache.shape.first().copied() == Some(cache.numel() / row);
        if !ok_shape {
            c.mismatch(format!(
                "the cache {} must be [max_seq, n_kv_heads, head_dim] or [max_seq, n_kv_heads·head_dim]",
                desc(cache)
            ));
        }
    }
    let units = (nh.saturating_add(nkv.saturating_mul(2))).saturating_mul(hd);
    if let Some(end) = opcheck::tile_within(&mut c, units, "Q/K/V output rows (heads × head_dim)")
        && (c.int("n_off").unwrap_or(0) % 2 != 0 || end % 2 != 0)
    {
        c.oob("n_off and N_tile must be even: a tile holds whole RoPE pairs");
    }
    c.finish()
}
