//! Opcode `FUSED` (code 19): Runs a recipe of primitive steps as one task.
//!
//! This crate owns everything about the op: its spec (arity, params), its static recipe rule
//! for the validator ([`recipe`]), its CPU reference ([`mod@reference`], which runs each step
//! through the registry's reference of the step's op) and its CUDA device function
//! (`fused.cu`, which runs the steps the backend laid out at load from the recipe's
//! backend-neutral expansion, [`expand`], registered with the registry).

pub mod expand;
pub mod recipe;
pub mod reference;

use amk_core::opcheck::Checker;
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
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
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("fused.cu"), "amk_op_fused")),
    }
}

amk_core::inventory::submit! {
    amk_core::registry::OpExpansion { op: Opcode::FUSED, expand: expand::expand_task }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    recipe::check(&mut c);
    c.finish()
}
