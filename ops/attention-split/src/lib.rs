//! Opcode `ATTENTION_SPLIT` (code 25): one (KV head × split) piece of the decode attention,
//! its rows chosen by the position; writes the un-normalised `[acc | m | l]` partials of the
//! KV head's query heads.
//!
//! Inputs `[q, k_cache, v_cache, pos]`, one output (the layer's partials, F32); params
//! `head_dim`, `n_heads`, `n_kv_heads`, `scale`, `N_tile`, `n_off` and the op's own
//! `n_splits`, `chunk`.
//!
//! **Why.** One attention task per layer walks the whole cache on one SM: its time grows with
//! the position while every other SM idles. A layer's attention as `n_kv_heads × n_splits`
//! of these tasks spreads the cache over the chip, each task reads its rows of one KV head
//! once for all the query heads that share it, and the output projection merges the partials
//! (COMBINE_GEMV), so the split costs no phase of its own.
//!
//! **Which rows** ([`split_rows`]): the rows written so far, `0..=p` (`p` = element 0 of the
//! position buffer), cut into splits of `size` rows, `size` the smallest multiple of `chunk`
//! with `n_splits · size ≥ p + 1`. Split `s` attends rows `[s · size, min((s + 1) · size,
//! p + 1))`; the splits past the last row are inactive. The program is the same at every
//! position: how many splits work, and on how many rows, is data — at position 0 one split a
//! KV head works on one row, from `chunk · n_splits` rows on all of them.
//!
//! **Layout.** The partials buffer is `[n_kv_heads, n_splits, rep, head_dim + 2]` (F32,
//! `rep = n_heads / n_kv_heads`), one `[acc | m | l]` per (KV head, split, query head of the
//! group). A task writes its contiguous `N_tile = rep · (head_dim + 2)` elements at `n_off`,
//! which names the task: `n_off / N_tile = kv_head · n_splits + split` (GEMV_TILE's column
//! region, so the validator sees the tasks' writes as disjoint tiles of one buffer).
//!
//! **One split a KV head, normalised** (`flags` bit 0, [`FLAG_NORMALIZED`], with `n_splits`
//! = 1): the task is the whole attention of its KV head's query heads and writes their rows
//! normalised, `acc / l` as ATTENTION_TILE writes them, into the attention row `[n_heads ·
//! head_dim]` (any float dtype; rounded to it): `N_tile = rep · head_dim` at `n_off =
//! kv_head · N_tile`. Why: with one split there is nothing to merge, and the output projection
//! is then a plain GEMV over that row instead of COMBINE_GEMV tiles that each merge every
//! head's partials (7 µs of a 1B layer's 70 at position 0 on an H200, docs/perf-notes.md
//! round 36). A program for short contexts (`amk_engine`'s short-context program) takes it.
//!
//! **Inactive splits** read nothing and write nothing (their region keeps what it held; the
//! combine reads only the active splits' regions, which it derives from the same position),
//! and so need not wait for q or the caches: on the device such a task is done as soon as it
//! has read the position.
//!
//! This crate owns everything about the op: its spec, its static shape rule for the
//! validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`attention-split.cu`: a direct path of its own for the cases decode programs have — rows
//! into registers, a lane group a row, the groups merged once — and the backend's general
//! attention, `amk_attention.cuh`, for the rest and for the normalised tasks of one split a KV
//! head while they have at most 8 rows).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{Checker, desc};
use amk_core::{
    DType, Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_attention as _;
use std::borrow::Cow;

pub mod reference;

/// Dynamic shared memory the device task asks for: its direct path merges its warps' sums
/// there (8 warps × 4 heads × head_dim f32; a task that gets less takes the general path), the
/// same budget as the output projection's tiles that follow it in a layer.
pub const SHARED_BYTES: u32 = op_gemv_tile::SHARED_BYTES;

/// Most splits per KV head: the combine gives one lane of a warp to each split.
pub const MAX_SPLITS: i64 = 32;

/// `flags` bit 0: with one split a KV head, write the normalised attention rows of the KV
/// head's query heads instead of partials (crate docs).
pub const FLAG_NORMALIZED: i64 = 1;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::ATTENTION_SPLIT,
    name: Cow::Borrowed("ATTENTION_SPLIT"),
    min_inputs: 4,
    max_inputs: Some(4),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::required("n_heads", ParamType::Int),
        ParamDecl::required("n_kv_heads", ParamType::Int),
        ParamDecl::required("scale", ParamType::Real),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
        ParamDecl::required("n_splits", ParamType::Int),
        ParamDecl::required("chunk", ParamType::Int),
        ParamDecl::optional("flags", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "One (KV head x split) piece of the decode attention over rows <= pos[0], the split's rows chosen by the position; writes un-normalised [acc|m|l] partials (flags bit 0, one split: the normalised rows of its heads).",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("attention-split.cu"), "amk_op_attention_split")
                .with_own_wait()
                .with_f32_direct()
                .with_shared(SHARED_BYTES)
                .with_task_defines(task_defines),
        ),
    }
}

/// The device code a task asks of its kernel: for a normalised task ([`FLAG_NORMALIZED`]),
/// the short path (`AMK_AS_SHORT_ROWS`: the first positions of a decode, where the attention
/// is a few KB and its time the chain of steps after the wait). Up to 32 rows where the
/// tensor-core path takes the rest (head_dim 64, at most 4 query heads a KV head: from 33 rows
/// it measured faster than the short path's two warps a head, docs/perf-notes.md round 55);
/// otherwise up to 128 rows with at most 3 query heads a KV head, else 64 (round 54). Kernels
/// without such a task (the split program's, whose tasks write partials) leave the path out:
/// its code alone made that program's step up to 2.3 % slower on SmolLM2 (round 52).
fn task_defines(task: &amk_core::Task) -> &'static [(&'static str, &'static str)] {
    let normalised = task
        .param_i64("flags")
        .is_some_and(|f| f & FLAG_NORMALIZED != 0);
    if !normalised {
        return &[];
    }
    let rep = match (task.param_i64("n_heads"), task.param_i64("n_kv_heads")) {
        (Some(h), Some(kv)) if kv > 0 => h / kv,
        _ => i64::MAX,
    };
    let tensor_cores = task.param_i64("head_dim") == Some(64) && rep <= 4;
    match (tensor_cores, rep <= 3) {
        (true, _) => &[("AMK_AS_SHORT_ROWS", "32")],
        (false, true) => &[("AMK_AS_SHORT_ROWS", "128")],
        (false, false) => &[("AMK_AS_SHORT_ROWS", "64")],
    }
}

/// The rows one split attends: `start..start + len` (`len` 0: the split is inactive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitRows {
    /// First cache row.
    pub start: u64,
    /// Rows (0 for an inactive split).
    pub len: u64,
}

/// Rows a split covers at position `p` with `n_splits` splits of a multiple of `chunk` rows:
/// the smallest multiple of `chunk` that lets `n_splits` splits cover rows `0..=p`.
pub fn split_size(p: u64, n_splits: u64, chunk: u64) -> u64 {
    let chunk = chunk.max(1);
    (p + 1)
        .div_ceil(n_splits.max(1))
        .div_ceil(chunk)
        .saturating_mul(chunk)
}

/// Splits with rows at position `p` (at least 1): `⌈(p + 1) / size⌉`.
pub fn active_splits(p: u64, n_splits: u64, chunk: u64) -> u64 {
    (p + 1).div_ceil(split_size(p, n_splits, chunk))
}

/// The rows of split `s` at position `p` (crate docs).
pub fn split_rows(p: u64, s: u64, n_splits: u64, chunk: u64) -> SplitRows {
    let size = split_size(p, n_splits, chunk);
    let start = s.saturating_mul(size);
    let len = if start > p {
        0
    } else {
        size.min(p + 1 - start)
    };
    SplitRows { start, len }
}

/// Which (KV head, split) an ATTENTION_SPLIT task is: its `n_off / N_tile` is
/// `kv_head · n_splits + split`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitTask {
    /// The KV head whose rows it attends.
    pub kv_head: u64,
    /// Its split of that head's rows.
    pub split: u64,
}

impl SplitTask {
    /// The task at `n_off` with tiles of `n_tile` elements and `n_splits` splits a KV head
    /// (both taken as at least 1).
    pub fn of(n_off: u64, n_tile: u64, n_splits: u64) -> SplitTask {
        let (task, n) = (n_off / n_tile.max(1), n_splits.max(1));
        SplitTask {
            kv_head: task / n,
            split: task % n,
        }
    }
}

/// The checked shape of a split-KV attention: its heads, its splits and its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitGeometry {
    /// Elements per head.
    pub hd: u64,
    /// Query heads.
    pub nh: u64,
    /// KV heads.
    pub nkv: u64,
    /// Splits per KV head.
    pub n_splits: u64,
    /// Split sizes are multiples of this many rows.
    pub chunk: u64,
}

impl SplitGeometry {
    /// Query heads per KV head.
    pub fn rep(&self) -> u64 {
        self.nh / self.nkv.max(1)
    }

    /// Elements of one task's partials: `rep · (head_dim + 2)`.
    pub fn tile(&self) -> u64 {
        self.rep().saturating_mul(self.hd + 2)
    }

    /// Elements of one normalised task's rows: `rep · head_dim`.
    pub fn normalized_tile(&self) -> u64 {
        self.rep().saturating_mul(self.hd)
    }

    /// Elements of the layer's partials buffer: `n_kv_heads · n_splits` tiles.
    pub fn partials_len(&self) -> u64 {
        self.nkv
            .saturating_mul(self.n_splits)
            .saturating_mul(self.tile())
    }
}

/// The split-KV params every op of the family carries (`head_dim`, `n_heads`, `n_kv_heads`,
/// `n_splits`, `chunk`), checked; `None` when one is missing or invalid (already reported).
/// Shared with COMBINE_GEMV, which reads the partials.
pub fn check_split_params(c: &mut Checker<'_, '_>) -> Option<SplitGeometry> {
    let hd = c.positive("head_dim");
    let nh = c.positive("n_heads");
    let nkv = c.positive("n_kv_heads");
    let n_splits = c.positive("n_splits");
    let chunk = c.positive("chunk");
    let (hd, nh, nkv, n_splits, chunk) = (hd?, nh?, nkv?, n_splits?, chunk?);
    if nh % nkv != 0 {
        c.mismatch(format!(
            "n_heads = {nh} must be a multiple of n_kv_heads = {nkv}"
        ));
        return None;
    }
    if n_splits > MAX_SPLITS {
        c.mismatch(format!(
            "n_splits = {n_splits} exceeds the {MAX_SPLITS} splits a KV head may have"
        ));
        return None;
    }
    Some(SplitGeometry {
        hd: hd as u64,
        nh: nh as u64,
        nkv: nkv as u64,
        n_splits: n_splits as u64,
        chunk: chunk as u64,
    })
}

/// The rule on a partials buffer of `g`: F32, `n_kv_heads · n_splits · rep · (head_dim + 2)`
/// elements.
pub fn check_partials(c: &mut Checker<'_, '_>, b: &amk_core::Buffer, g: &SplitGeometry) {
    if b.dtype != DType::F32 {
        c.mismatch(format!("the partials {} must be F32", desc(b)));
    }
    c.numel_is(
        b,
        g.partials_len(),
        "partials [n_kv_heads, n_splits, rep, head_dim + 2]",
    );
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let (Some(q), Some(kc), Some(vc), Some(pos), Some(out)) =
        (c.input(0), c.input(1), c.input(2), c.input(3), c.output(0))
    else {
        return c.finish();
    };
    op_attention_tile::check_position(&mut c, pos);
    let scale = c.real("scale");
    if scale.is_some_and(|s| !(s as f32).is_finite()) {
        c.mismatch("scale must be a finite fp32 number");
    }
    let Some(g) = check_split_params(&mut c) else {
        return c.finish();
    };
    c.float(q, "query");
    c.numel_is(
        q,
        g.nh.saturating_mul(g.hd),
        "query (one row of n_heads x head_dim)",
    );
    if kc.dtype.is_integer() || vc.dtype.is_integer() {
        c.mismatch("the caches must be floating point");
    }
    let row = g.nkv.saturating_mul(g.hd);
    if kc.numel() != vc.numel() {
        c.same_numel(kc, vc);
    }
    let batched = kc.rank() == 4 && kc.shape[0] != 1;
    if batched || row == 0 || kc.numel() % row != 0 {
        c.mismatch(format!(
            "the cache {} must be one sequence of rows of n_kv_heads x head_dim = {row}",
            desc(kc)
        ));
    }
    let flags = c.int("flags").unwrap_or(0);
    if flags & !FLAG_NORMALIZED != 0 {
        c.mismatch(format!(
            "flags = {flags}: only bit 0 (normalised rows) is defined"
        ));
    }
    let normalized = flags & FLAG_NORMALIZED != 0;
    let tile = if normalized {
        if g.n_splits != 1 {
            c.mismatch(format!(
                "normalised rows (flags bit 0) need one split a KV head, got n_splits = {}",
                g.n_splits
            ));
        }
        c.float(out, "attention row");
        c.numel_is(
            out,
            g.nh.saturating_mul(g.hd),
            "attention row (n_heads x head_dim)",
        );
        g.normalized_tile()
    } else {
        check_partials(&mut c, out, &g);
        g.tile()
    };
    let (Some(n_tile), Some(n_off)) = (c.positive("N_tile"), c.non_negative("n_off")) else {
        return c.finish();
    };
    let (n_tile, n_off) = (n_tile as u64, n_off as u64);
    if n_tile != tile {
        c.mismatch(format!(
            "N_tile = {n_tile} must be one KV head's {}, {tile} elements",
            if normalized {
                "rows, rep x head_dim"
            } else {
                "partials, rep x (head_dim + 2)"
            }
        ));
    } else if n_off % n_tile != 0 || n_off / n_tile >= g.nkv.saturating_mul(g.n_splits) {
        c.oob(format!(
            "n_off = {n_off} must be (kv_head x n_splits + split) x N_tile with kv_head < {} \
             and split < {}",
            g.nkv, g.n_splits
        ));
    }
    c.finish()
}
