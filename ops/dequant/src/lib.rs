//! Opcode `DEQUANT` (code 13): Group-wise dequantisation (q - zero) * scale.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference ([`reference`](mod@reference)) and its CUDA device
//! function (`dequant.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::DEQUANT,
    name: Cow::Borrowed("DEQUANT"),
    min_inputs: 2,
    max_inputs: Some(3),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("qdtype", ParamType::Int),
        ParamDecl::required("group", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed("Group-wise dequantisation (q - zero) * scale."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("dequant.cu"), "amk_op_dequant")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let (Some(q), Some(scales), Some(out)) = (c.input(0), c.input(1), c.output(0)) else {
        return Vec::new();
    };
    c.same_numel(q, out);
    c.float(out, "output");
    if let Some(qd) = c.int("qdtype")
        && !matches!(qd, 6 | 7)
    {
        c.mismatch(format!("param qdtype = {qd} must be 6 (int8) or 7 (int4)"));
    }
    let Some(group) = c.positive("group") else {
        return c.finish();
    };
    if q.last_dim() % group as u64 != 0 {
        c.mismatch(format!(
            "the last dim of {} must be a multiple of group = {group}",
            desc(q)
        ));
        return c.finish();
    }
    let groups = q.numel() / group as u64;
    c.numel_is(scales, groups, "scales");
    if let Some(z) = c.input(2) {
        c.numel_is(z, groups, "zeros");
    }
    c.finish()
}
