//! Opcode `MUL` (code 12): Element-wise product, or x * scale with one input.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`mul.cu`).

use amk_core::opcheck::{self, Checker};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::MUL,
    name: Cow::Borrowed("MUL"),
    min_inputs: 1,
    max_inputs: Some(2),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[ParamDecl::optional("scale", ParamType::Real)]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed("Element-wise product, or x * scale with one input."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("mul.cu"), "amk_op_mul")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    opcheck::elementwise(&mut c);
    c.finish()
}
