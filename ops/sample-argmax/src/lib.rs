//! Opcode `SAMPLE_ARGMAX` (code 17): Index of the largest logit of each row (lowest index on ties), as I32.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference ([`reference`](mod@reference)) and its CUDA device
//! function (`sample-argmax.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{DType, Finding, OpRegistration, OpSpec, Opcode, Reference, TaskContext};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::SAMPLE_ARGMAX,
    name: Cow::Borrowed("SAMPLE_ARGMAX"),
    min_inputs: 1,
    max_inputs: Some(1),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed(
        "Index of the largest logit of each row (lowest index on ties), as I32.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("sample-argmax.cu"), "amk_op_sample_argmax")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    if let (Some(x), Some(out)) = (c.input(0), c.output(0)) {
        c.float(x, "logits");
        if out.dtype != DType::I32 {
            c.mismatch(format!(
                "the output {} must be I32 (token indices)",
                desc(out)
            ));
        }
        let rows = x.numel() / x.last_dim().max(1);
        c.numel_is(out, rows, "output");
    }
    c.finish()
}
