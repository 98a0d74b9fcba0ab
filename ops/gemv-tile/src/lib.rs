//! Opcode `GEMV_TILE` (code 5): Columns [n_off, n_off+N_tile) of y = x @ W^T (+ bias); weights fp, or int8/int4 with fp16 group scales (and zeros).
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference ([`reference`](mod@reference), shared with GEMM_TILE
//! through [`reference::linear`]) and its CUDA device function (`gemv-tile.cu`).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{self, Checker};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_tile as _;
use std::borrow::Cow;

pub mod reference;
pub mod testing;

/// Dynamic shared memory a single-row tile asks for: its row of x (`K` elements of x's dtype,
/// normalised first by the fused tiles) is staged there when it fits, so that every warp
/// re-reads it from shared memory rather than through L1, which each task's acquire empties.
/// 64 KB holds a row of 32,768 16-bit elements: Llama-3.1-8B's down projection (K 14,336)
/// streamed 19 GB/s per SM reading its row through L1 with 16 KB, 23 GB/s staged (8B shape
/// 6.633 -> 6.41 ms a token; SmolLM2 and 1B shapes unchanged: docs/perf-notes.md round 10).
/// Longer rows are read in place.
pub const SHARED_BYTES: u32 = 64 << 10;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::GEMV_TILE,
    name: Cow::Borrowed("GEMV_TILE"),
    min_inputs: 2,
    max_inputs: Some(4),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("K", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
        ParamDecl::optional("qdtype", ParamType::Int),
        ParamDecl::optional("group", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Columns [n_off, n_off+N_tile) of y = x @ W^T (+ bias); weights fp, or int8/int4 with fp16 group scales (and zeros).",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("gemv-tile.cu"), "amk_op_gemv_tile")
                .with_shared(SHARED_BYTES)
                .with_own_wait()
                .with_row_loop(0, &[1], 1),
        ),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    opcheck::linear(&mut c, false);
    c.finish()
}
