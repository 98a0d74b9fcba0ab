//! Opcode `ADD` (code 11): Element-wise sum.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`add.cu`).

use amk_core::opcheck::{self, Checker};
use amk_core::{Finding, OpRegistration, OpSpec, Opcode, Reference, TaskContext};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::ADD,
    name: Cow::Borrowed("ADD"),
    min_inputs: 2,
    max_inputs: Some(2),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed("Element-wise sum."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("add.cu"), "amk_op_add")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    opcheck::elementwise(&mut c);
    c.finish()
}
