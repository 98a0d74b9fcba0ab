//! Opcode `EMBED` (code 2): Gathers table rows by integer ids; also the flat-to-heads reshape bridge.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`embed.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::EMBED,
    name: Cow::Borrowed("EMBED"),
    min_inputs: 2,
    max_inputs: Some(2),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[ParamDecl::required("hidden", ParamType::Int)]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed(
        "Gathers table rows by integer ids; also the flat-to-heads reshape bridge.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("embed.cu"), "amk_op_embed")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    if let (Some(ids), Some(table), Some(out)) = (c.input(0), c.input(1), c.output(0)) {
        c.integer(ids, "ids");
        let rows = table.shape.first().copied().unwrap_or(1);
        let row = table.numel() / rows.max(1);
        let want = ids.numel().saturating_mul(row);
        if out.numel() != want {
            c.mismatch(format!(
                "the output {} must hold {} id(s) x {row} elements per table row = {want} elements, has {}",
                desc(out), ids.numel(), out.numel()
            ));
        }
    }
    c.finish()
}
