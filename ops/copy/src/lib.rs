//! Opcode `COPY` (code 1): Copies one buffer into another, cast to the output dtype.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`copy.cu`).

use amk_core::opcheck::Checker;
use amk_core::{Finding, OpRegistration, OpSpec, Opcode, Reference, TaskContext};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::COPY,
    name: Cow::Borrowed("COPY"),
    min_inputs: 1,
    max_inputs: Some(1),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed("Copies one buffer into another, cast to the output dtype."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("copy.cu"), "amk_op_copy")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    if let (Some(x), Some(y)) = (c.input(0), c.output(0)) {
        c.same_numel(x, y);
    }
    c.finish()
}
