//! Opcode `SOFTMAX` (code 14): Softmax along one dimension (default: the last).
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`softmax.cu`).

use amk_core::opcheck::{self, Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::SOFTMAX,
    name: Cow::Borrowed("SOFTMAX"),
    min_inputs: 1,
    max_inputs: Some(1),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[ParamDecl::optional("dim", ParamType::Int)]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed("Softmax along one dimension (default: the last)."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("softmax.cu"), "amk_op_softmax")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    opcheck::elementwise(&mut c);
    if let (Some(x), Some(dim)) = (c.input(0), c.int("dim")) {
        let r = x.rank().max(1) as i64;
        if dim < -r || dim >= r {
            c.oob(format!(
                "param dim = {dim} is outside [-{r}, {r}) for {}",
                desc(x)
            ));
        }
    }
    c.finish()
}
