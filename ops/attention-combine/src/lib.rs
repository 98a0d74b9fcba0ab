//! Opcode `ATTENTION_COMBINE` (code 18): Merges split-KV attention partials [acc|m|l] into the normalised output.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`attention-combine.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::ATTENTION_COMBINE,
    name: Cow::Borrowed("ATTENTION_COMBINE"),
    min_inputs: 2,
    max_inputs: Some(8),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::optional("n_heads", ParamType::Int),
        ParamDecl::optional("n_kv_heads", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed(
        "Merges split-KV attention partials [acc|m|l] into the normalised output.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("attention-combine.cu"), "amk_op_attention_combine")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let Some(out) = c.output(0) else {
        return Vec::new();
    };
    c.float(out, "output");
    let Some(hd) = c.positive("head_dim") else {
        return c.finish();
    };
    let hd = hd as u64;
    if out.numel() % hd != 0 {
        c.mismatch(format!(
            "the output {} is not a whole number of heads of head_dim = {hd}",
            desc(out)
        ));
        return c.finish();
    }
    let heads = out.numel() / hd;
    if let Some(nh) = c.positive("n_heads")
        && nh as u64 != heads
    {
        c.mismatch(format!(
            "n_heads = {nh} but the output {} holds {heads} heads",
            desc(out)
        ));
    }
    for i in 0..c.ctx.n_inputs() {
        if let Some(part) = c.input(i) {
            c.numel_is(part, heads.saturating_mul(hd + 2), "partial [acc | m | l]");
        }
    }
    c.finish()
}
