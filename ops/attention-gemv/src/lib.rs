//! Opcode `ATTENTION_GEMV` (code 23): columns `[n_off, n_off+N_tile)` of
//! `y = attention(q, k_cache, v_cache) @ W^T (+ bias)` — the layer's decode attention computed
//! inside every tile of the output projection that reads it.
//!
//! Inputs `[q, k_cache, v_cache, W]`, `[q, k_cache, v_cache, W, bias]`,
//! `[q, k_cache, v_cache, W, pos]` or `[q, k_cache, v_cache, W, bias, pos]`, one output; params
//! ATTENTION_TILE's (`head_dim`, `kv_start`, `kv_len`, `scale`, `n_heads`, `n_kv_heads`; no
//! split-KV `flags`) and GEMV_TILE's (`K`, `N_tile`, `n_off`). The bias is float and the
//! position `pos` an integer buffer, so a fifth input is the one its dtype says
//! ([`operand_slots`]); with a position, the attended rows are ATTENTION_TILE's window clipped
//! to rows `<= pos[0]` (a negative position, or a window that ends up empty, is an error when
//! the task runs: this op writes no split-KV partials). Why: in a decode step the
//! attention reads only q and the cache rows the step just wrote, a few KB at the first
//! positions, while an attention task of its own costs a phase and two hand-offs between the
//! Q/K/V tiles and the output projection (docs/perf-notes.md round 13). Every tile needs the
//! whole attention row (its `K` spans every head), so each computes it, redundantly.
//!
//! The attention row is rounded to `q`'s dtype before the products, as the unfused program
//! stores it into an activation of that dtype, so fusing changes no result. `q` is one row
//! (`K = n_heads · head_dim` elements, batch 1) that must fit [`SHARED_BYTES`] (the device
//! keeps it in shared memory); float operands only (F32, F16, BF16).
//!
//! This crate owns the op's spec, its static shape rule, its CPU reference
//! ([`reference`](mod@reference)) and its CUDA device function (`attention-gemv.cu`; the
//! attention itself is `oplib-attention`'s `amk_attention.cuh`, shared with ATTENTION_TILE).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{self, Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_attention as _;
use oplib_tile as _;
use std::borrow::Cow;

pub mod reference;

/// Dynamic shared memory the device tile asks for, which bounds the attention row it keeps
/// there: GEMV_TILE's row budget ([`op_gemv_tile::SHARED_BYTES`]).
pub const SHARED_BYTES: u32 = op_gemv_tile::SHARED_BYTES;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::ATTENTION_GEMV,
    name: Cow::Borrowed("ATTENTION_GEMV"),
    min_inputs: 4,
    max_inputs: Some(6),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::required("kv_start", ParamType::Int),
        ParamDecl::required("kv_len", ParamType::Int),
        ParamDecl::required("scale", ParamType::Real),
        ParamDecl::required("n_heads", ParamType::Int),
        ParamDecl::required("n_kv_heads", ParamType::Int),
        ParamDecl::required("K", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Columns [n_off, n_off+N_tile) of y = attention(q, k_cache, v_cache) @ W^T (+ bias), the attention computed in the tile (its rows clipped to <= pos[0] with a position input).",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("attention-gemv.cu"), "amk_op_attention_gemv")
                .with_shared(SHARED_BYTES)
                .with_own_wait()
                .with_row_loop(0, &[3], 1),
        ),
    }
}

/// Bytes of one element of a float dtype (F32 4, F16/BF16 2).
pub(crate) fn float_bytes(d: amk_core::DType) -> u64 {
    d.bits().div_ceil(8)
}

/// The inputs holding the bias and the position, `(bias, pos)`, of a task with `n_inputs`
/// inputs whose input 4 is (`input4_integer`) or is not an integer buffer: both follow `W`,
/// the bias first, and a lone fifth input is the position when it holds integers (a bias is
/// float). One rule for the validator, the CPU reference and the device (`ag_setup`).
pub fn operand_slots(n_inputs: usize, input4_integer: bool) -> (Option<usize>, Option<usize>) {
    match n_inputs {
        5 if input4_integer => (None, Some(4)),
        5 => (Some(4), None),
        6 => (Some(4), Some(5)),
        _ => (None, None),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let input4_integer = c.input(4).is_some_and(|b| b.dtype.is_integer());
    let (bias, pos) = operand_slots(ctx.n_inputs(), input4_integer);
    let heads = op_attention_tile::check_attention(&mut c, false, pos);
    let (Some(q), Some(w), Some(out), Some(k)) =
        (c.input(0), c.input(3), c.output(0), c.positive("K"))
    else {
        return c.finish();
    };
    let k = k as u64;
    if let Some(h) = heads
        && (h.batch != 1 || h.nh.saturating_mul(h.hd) != k)
    {
        c.mismatch(format!(
            "param K = {k} must be n_heads x head_dim = {} x {} of one query row (batch {})",
            h.nh, h.hd, h.batch
        ));
    }
    let vec = |b: &amk_core::Buffer| {
        matches!(
            b.dtype,
            amk_core::DType::F32 | amk_core::DType::F16 | amk_core::DType::BF16
        )
    };
    for (b, role) in [(q, "query"), (w, "weight"), (out, "output")] {
        if !vec(b) {
            c.mismatch(format!("the {role} {} must be F32, F16 or BF16", desc(b)));
        }
    }
    if vec(q) && k.saturating_mul(float_bytes(q.dtype)) > u64::from(SHARED_BYTES) {
        c.mismatch(format!(
            "the attention row of K = {k} elements of {} exceeds the tile's {SHARED_BYTES} bytes of shared memory",
            q.dtype
        ));
    }
    if w.last_dim() != k {
        c.mismatch(format!(
            "param K = {k} must equal the last dim of the weight {}",
            desc(w)
        ));
    }
    let n = w.numel() / k.max(1);
    if let Some(b) = bias.and_then(|i| c.input(i)) {
        c.numel_is(b, n, "bias");
        if !vec(b) {
            c.mismatch(format!("the bias {} must be F32, F16 or BF16", desc(b)));
        }
    }
    let what = format!("rows of the weight {}", desc(w));
    if let Some(end) = opcheck::tile_within(&mut c, n, &what)
        && (end > out.last_dim() || out.numel() != out.last_dim())
    {
        c.oob(format!(
            "columns [.., {end}) must fit the one-row output {}",
            desc(out)
        ));
    }
    c.finish()
}
