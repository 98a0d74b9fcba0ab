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
//! **Per-head q/k norm.** With param `qk_norm` = 1 two inputs of `head_dim` elements follow
//! (after the norm weight, before the factors): the weights of Qwen3's RMSNorm over each Q
//! head and each K head, applied to the rounded projection before RoPE (`eps` required). A
//! norm needs its whole head, so such a tile holds whole heads (`n_off` and `N_tile`
//! multiples of `head_dim`) and keeps them in shared memory until every pair is summed: `K`
//! and `N_tile` floats together within [`SHARED_BYTES`].
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

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{self, Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_tile as _;
use std::borrow::Cow;

pub mod reference;

/// Dynamic shared memory a tile reserves: the projected row (GEMV_TILE's budget) and, with
/// `qk_norm`, its heads' sums beside it.
pub const SHARED_BYTES: u32 = op_rmsnorm_gemv::SHARED_BYTES;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::QKV_ROPE_APPEND,
    name: Cow::Borrowed("QKV_ROPE_APPEND"),
    min_inputs: 5,
    // One device instruction carries 8 inputs: the input norm, the q/k norms and the factors
    // together (9) are refused.
    max_inputs: Some(8),
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
        ParamDecl::optional("qk_norm", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Q/K/V projection tile of one row x (RMS-normalised first with a 6th input), per-head q/k RMS norms with qk_norm, RoPE on Q and K, K and V written to the caches at position pos[0].",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("qkv-rope-append.cu"), "amk_op_qkv_rope_append")
                .with_shared(SHARED_BYTES)
                .with_own_wait()
                .with_row_loop(0, &[1, 2, 3], 2),
        ),
    }
}

/// Where a task's optional inputs are: the norm weight, the per-head q/k norm weights and the
/// RoPE frequency factors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalInputs {
    /// The RMS norm weight (input 5), when the tile normalises `x` first.
    pub norm: Option<usize>,
    /// The per-head q and k norm weights, with `qk_norm` = 1.
    pub qk_norm: Option<QkNormInputs>,
    /// The per-pair frequency factors (the last input), with `rope_factors` = 1.
    pub factors: Option<usize>,
}

/// The inputs of the per-head norm weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkNormInputs {
    /// The weight every Q head is normalised with.
    pub q: usize,
    /// The weight every K head is normalised with.
    pub k: usize,
}

/// Which optional parts a task has: its params `rope_factors` and `qk_norm` (each 0 or 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// `rope_factors` = 1: the last input holds the frequency factors.
    pub rope_factors: bool,
    /// `qk_norm` = 1: two per-head norm weights precede the factors.
    pub qk_norm: bool,
}

/// The optional inputs of a task with `n_inputs` inputs and options `o` (the device function
/// reads them the same way): `[x, Wq, Wk, Wv, pos (, norm_w) (, q_norm, k_norm) (, factors)]`.
/// None when `n_inputs` is too few for the options.
pub fn optional_inputs(n_inputs: usize, o: Options) -> Option<OptionalInputs> {
    let fixed = 5 + usize::from(o.rope_factors) + 2 * usize::from(o.qk_norm);
    let with_norm = match n_inputs.checked_sub(fixed)? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let norm = with_norm.then_some(5);
    let next = 5 + usize::from(with_norm);
    Some(OptionalInputs {
        norm,
        qk_norm: o.qk_norm.then_some(QkNormInputs {
            q: next,
            k: next + 1,
        }),
        factors: o.rope_factors.then(|| n_inputs - 1),
    })
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let (Some(rope_factors), Some(qk_norm)) =
        (flag(&mut c, "rope_factors"), flag(&mut c, "qk_norm"))
    else {
        return c.finish();
    };
    let o = Options {
        rope_factors,
        qk_norm,
    };
    let Some(opt) = optional_inputs(ctx.n_inputs(), o) else {
        c.mismatch(format!(
            "{} inputs do not fit [x, Wq, Wk, Wv, pos (, norm_w){}{}]",
            ctx.n_inputs(),
            if qk_norm { ", q_norm, k_norm" } else { "" },
            if rope_factors { ", factors" } else { "" },
        ));
        return c.finish();
    };
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
    if let Some(qk) = opt.qk_norm {
        check_qk_norm(&mut c, qk, hd);
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
    let n_off = c.int("n_off").unwrap_or(0);
    if let Some(end) = opcheck::tile_within(&mut c, units, "Q/K/V output rows (heads × head_dim)")
    {
        if n_off % 2 != 0 || end % 2 != 0 {
            c.oob("n_off and N_tile must be even: a tile holds whole RoPE pairs");
        }
        if qk_norm && (n_off % hd as i64 != 0 || end % hd != 0) {
            c.oob(format!(
                "with qk_norm a tile holds whole heads: n_off and N_tile must be multiples of head_dim = {hd}"
            ));
        }
    }
    c.finish()
}

/// Param `key`, which must be absent, 0 or 1; None (a finding) otherwise.
fn flag(c: &mut Checker<'_, '_>, key: &str) -> Option<bool> {
    match c.int(key) {
        None | Some(0) => Some(false),
        Some(1) => Some(true),
        Some(v) => {
            c.oob(format!("param {key} = {v} must be 0 or 1"));
            None
        }
    }
}

/// The per-head norm's inputs (float, `head_dim` elements each), its `eps`, and the room its
/// heads take beside the row in shared memory.
fn check_qk_norm(c: &mut Checker<'_, '_>, qk: QkNormInputs, hd: u64) {
    for (i, what) in [(qk.q, "q norm weight"), (qk.k, "k norm weight")] {
        let Some(w) = c.input(i) else { continue };
        c.float(w, what);
        if w.numel() != hd {
            c.mismatch(format!(
                "the {what} {} must hold head_dim = {hd} elements",
                desc(w)
            ));
        }
    }
    if c.real("eps").is_none() {
        c.mismatch("qk_norm = 1 needs param eps".to_string());
    }
    let (k, n_tile) = (c.int("K").unwrap_or(0), c.int("N_tile").unwrap_or(0));
    let bytes = 4u64.saturating_mul(k.max(0) as u64 + n_tile.max(0) as u64);
    if bytes > u64::from(SHARED_BYTES) {
        c.oob(format!(
            "with qk_norm the row (K = {k}) and the tile's heads (N_tile = {n_tile}) take {bytes} bytes of shared memory as f32, more than {SHARED_BYTES}"
        ));
    }
}
