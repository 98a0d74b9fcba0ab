//! Opcode `ROPE` (code 8): Rotary position embedding (rotate-half) at the positions held in the pos buffer.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, and (as they land) its CPU reference and CUDA device function.

use amk_core::opcheck::{Checker, desc};
use amk_core::{Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, TaskContext};
use std::borrow::Cow;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::ROPE,
    name: Cow::Borrowed("ROPE"),
    min_inputs: 2,
    max_inputs: Some(2),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::required("theta", ParamType::Real),
    ]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed(
        "Rotary position embedding (rotate-half) at the positions held in the pos buffer.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration { spec: SPEC, reference: None }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let (Some(x), Some(pos), Some(out)) = (c.input(0), c.input(1), c.output(0)) else {
        return Vec::new();
    };
    c.integer(pos, "positions");
    c.float(x, "input");
    c.same_numel(x, out);
    if let Some(theta) = c.real("theta") {
        if theta <= 0.0 {
            c.oob(format!("param theta = {theta} must be positive"));
        }
    }
    let Some(hd) = c.positive("head_dim") else {
        return c.finish();
    };
    if hd % 2 != 0 {
        c.mismatch(format!(
            "head_dim = {hd} must be even (rotate-half pairs dims i and i + head_dim/2)"
        ));
    }
    if x.numel() % hd as u64 != 0 {
        c.mismatch(format!(
            "the input {} is not a whole number of heads of head_dim = {hd}",
            desc(x)
        ));
    }
    if x.rank() == 3 && pos.numel() != x.shape[0] {
        c.mismatch(format!("a [S, heads, head_dim] input {} needs S = {} positions, the positions buffer {} has {}", desc(x), x.shape[0], desc(pos), pos.numel()));
    }
    c.finish()
}
