//! Opcode `GEMV_TILE` (code 5): Columns [n_off, n_off+N_tile) of y = x @ W^T (+ bias); weights fp, or int8/int4 with fp16 group scales (and zeros).
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference ([`reference`](mod@reference), shared with GEMM_TILE
//! through [`reference::linear`]) and its CUDA device function (`gemv-tile.cu`).

use amk_core::opcheck::{self, Checker};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;
pub mod testing;

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
            amk_core::CudaSource::builtin(include_str!("gemv-tile.cu"), "amk_op_gemv_tile").with_own_wait(),
        ),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    opcheck::linear(&mut c, false);
    c.finish()
}
