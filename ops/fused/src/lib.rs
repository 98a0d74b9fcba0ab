//! Opcode `FUSED` (code 19): Runs a recipe of primitive steps as one task.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, and (as they land) its CPU reference and CUDA device function.

pub mod recipe;

use amk_core::opcheck::Checker;
use amk_core::{Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, TaskContext};
use std::borrow::Cow;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::FUSED,
    name: Cow::Borrowed("FUSED"),
    min_inputs: 1,
    max_inputs: None,
    n_outputs: Some(1),
    params: Cow::Borrowed(&[ParamDecl::required("recipe", ParamType::Object)]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed("Runs a recipe of primitive steps as one task."),
};

amk_core::inventory::submit! {
    OpRegistration { spec: SPEC, reference: None }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    recipe::check(&mut c);
    c.finish()
}
