//! Opcode `LAYERNORM` (code 4): Layer normalisation with weight and optional bias.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`layernorm.cu`).

use amk_core::opcheck::{self, Checker};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::LAYERNORM,
    name: Cow::Borrowed("LAYERNORM"),
    min_inputs: 2,
    max_inputs: Some(3),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("eps", ParamType::Real),
        ParamDecl::required("hidden", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed("Layer normalisation with weight and optional bias."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("layernorm.cu"), "amk_op_layernorm")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    opcheck::norm(&mut c);
    c.finish()
}
