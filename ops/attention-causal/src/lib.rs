//! Opcode `ATTENTION_CAUSAL` (code 28): causal GQA attention of many query rows — a prompt
//! chunk — over the KV cache, each row attending to the cache rows up to its own position.
//!
//! Inputs `[q, k_cache, v_cache, pos]`, one output shaped like `q`. `q` is rows of `n_heads ×
//! head_dim` (roped), the caches `[max_seq, n_kv_heads, head_dim]` (the chunk's own rows
//! already appended), `pos` an integer buffer with one position per row of `q`. A task writes
//! rows `[m_off, m_off + M_tile)` and the heads of columns `[n_off, n_off + N_tile)` (whole
//! heads): for row `r` at position `p = pos[r]` and query head `h` (KV head `h / (n_heads /
//! n_kv_heads)`), `softmax_j(q[r,h]·k[j] · scale) · v[j]` over cache rows `j = 0..=p`, in f32,
//! cast on store. Params `head_dim`, `n_heads`, `n_kv_heads`, `scale`, `m_off`, `M_tile`,
//! `n_off`, `N_tile`. Why one position per row: the chunk's rows are at consecutive positions
//! after the cache's earlier rows, and the mask is the position, so the same op serves a first
//! chunk, a later chunk and a padded last one.
//!
//! On the GPU a 16-bit task with heads of 64 or 128 runs flash-attention style on the tensor
//! cores: up to 64 (row, head) pairs at once, two warps per 16 (each takes half of every key
//! block; the halves merge at the end), the KV head's cache rows in blocks of 64 through a
//! three-stage (head_dim 64) or two-stage pipeline, P rounded to the 16-bit type for the P·V
//! product. Its
//! key blocks run to the task's largest position, so a row multiplies the values of later rows
//! by a zero weight: those cache rows must hold finite values (a prefill chunk writes them in
//! the same pass), or a NaN there reaches the row. Any
//! other task stages the rows as f32 a block of 32 at a time and runs an online softmax for up
//! to 32 pairs at once on the CUDA cores (a lane per key for the scores, a lane per dim for the
//! values); head_dim up to 128.
//!
//! This crate owns the op's spec, its static shape rule, its CPU reference
//! ([`reference`](mod@reference)) and its CUDA device function (`attention-causal.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{
    DType, Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The largest head the device function takes.
pub const MAX_HEAD_DIM: u64 = 128;
/// (row, head) pairs the device function works on together on its tensor-core path (16-bit
/// programs; its CUDA-core path takes half as many at a time): a task whose rows × heads of one
/// KV head exceed it streams that KV head's rows once more for each further group.
pub const DEVICE_PAIRS: u64 = 64;

/// Dynamic shared memory a task uses on the GPU, the larger of its two paths' at the largest
/// head: the CUDA-core path's 32 queries and a block of 32 key and 32 value rows (f32, one pad
/// element a row); the tensor-core path's 64 queries and two stages of 64 key and 64 value rows
/// (16-bit; at head_dim 64 three stages take less).
pub const SHARED_BYTES: u32 = {
    let cores = 32 * MAX_HEAD_DIM * 4 + 2 * 32 * (MAX_HEAD_DIM + 1) * 4;
    let tensor = (64 + 4 * 64) * MAX_HEAD_DIM * 2;
    (if cores > tensor { cores } else { tensor }) as u32
};

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::ATTENTION_CAUSAL,
    name: Cow::Borrowed("ATTENTION_CAUSAL"),
    min_inputs: 4,
    max_inputs: Some(4),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::required("n_heads", ParamType::Int),
        ParamDecl::required("n_kv_heads", ParamType::Int),
        ParamDecl::required("scale", ParamType::Real),
        ParamDecl::required("m_off", ParamType::Int),
        ParamDecl::required("M_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::ColumnsAndRows,
    check: Some(check),
    summary: Cow::Borrowed(
        "Causal GQA attention of query rows [m_off, m_off+M_tile), heads of columns [n_off, n_off+N_tile), each row over the cache rows up to its position pos[row].",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("attention-causal.cu"), "amk_op_attention_causal")
                .with_shared(SHARED_BYTES),
        ),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let hd = c.positive("head_dim");
    let nh = c.positive("n_heads");
    let nkv = c.positive("n_kv_heads");
    let (m_off, m_tile) = (c.non_negative("m_off"), c.positive("M_tile"));
    let (n_off, n_tile) = (c.non_negative("n_off"), c.positive("N_tile"));
    if c.real("scale").is_some_and(|s| !s.is_finite()) {
        c.oob("param scale must be finite");
    }
    let (Some(q), Some(kc), Some(vc), Some(pos), Some(out)) =
        (c.input(0), c.input(1), c.input(2), c.input(3), c.output(0))
    else {
        return c.finish();
    };
    let (Some(hd), Some(nh), Some(nkv)) = (hd, nh, nkv) else {
        return c.finish();
    };
    let (hd, nh, nkv) = (hd as u64, nh as u64, nkv as u64);
    if nh % nkv != 0 {
        c.mismatch(format!(
            "n_heads = {nh} must be a multiple of n_kv_heads = {nkv}"
        ));
    }
    if hd > MAX_HEAD_DIM {
        c.oob(format!("head_dim = {hd} exceeds {MAX_HEAD_DIM}"));
    }
    for (b, role) in [
        (q, "query"),
        (kc, "key cache"),
        (vc, "value cache"),
        (out, "output"),
    ] {
        if !matches!(b.dtype, DType::F32 | DType::F16 | DType::BF16) {
            c.mismatch(format!("{role} {} must be F32, F16 or BF16", desc(b)));
        }
    }
    let width = nh.saturating_mul(hd);
    let row = nkv.saturating_mul(hd);
    if q.numel() % width.max(1) != 0 || out.numel() != q.numel() {
        c.mismatch(format!(
            "the query {} and the output {} must be whole rows of n_heads x head_dim = {width}",
            desc(q),
            desc(out)
        ));
        return c.finish();
    }
    if kc.numel() != vc.numel() || kc.numel() % row.max(1) != 0 {
        c.mismatch(format!(
            "the caches {} and {} must be whole rows of n_kv_heads x head_dim = {row}",
            desc(kc),
            desc(vc)
        ));
    }
    let rows = q.numel() / width.max(1);
    if !pos.dtype.is_integer() || pos.numel() != rows {
        c.mismatch(format!(
            "the positions {} must be integers, one per query row ({rows})",
            desc(pos)
        ));
    }
    if let (Some(mo), Some(mt)) = (m_off, m_tile)
        && mo.saturating_add(mt) as u64 > rows
    {
        c.oob(format!(
            "rows [{mo}, {}) exceed the query's {rows}",
            mo.saturating_add(mt)
        ));
    }
    if let (Some(no), Some(nt)) = (n_off, n_tile) {
        let (no, nt) = (no as u64, nt as u64);
        if no % hd != 0 || nt % hd != 0 || no.saturating_add(nt) > width {
            c.oob(format!(
                "columns [{no}, {}) must be whole heads of {hd} within {width}",
                no.saturating_add(nt)
            ));
        }
    }
    c.finish()
}
