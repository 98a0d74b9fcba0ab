//! Opcode `GEMM_TILE` (code 6): A column tile of Y = X @ W^T over a few rows (batched decode).
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference ([`reference`](mod@reference): GEMV_TILE's linear
//! tile over a row range) and its CUDA device function (`gemm-tile.cu`).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{self, Checker};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_tile as _;
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::GEMM_TILE,
    name: Cow::Borrowed("GEMM_TILE"),
    min_inputs: 2,
    max_inputs: Some(4),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("M_tile", ParamType::Int),
        ParamDecl::required("K", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
        ParamDecl::optional("m_off", ParamType::Int),
        ParamDecl::optional("qdtype", ParamType::Int),
        ParamDecl::optional("group", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::ColumnsAndRows,
    check: Some(check),
    summary: Cow::Borrowed("A column tile of Y = X @ W^T over a few rows (batched decode)."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("gemm-tile.cu"), "amk_op_gemm_tile").with_own_wait(),
        ),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    opcheck::linear(&mut c, true);
    c.finish()
}
