//! Opcode `ROPE` (code 8): Rotary position embedding (rotate-half) at the positions held in the pos buffer.
//!
//! Param `pairing` (optional int) picks which dims rotate together: `0` (default) is
//! rotate-half (Llama / NeoX, dims `i` and `i + head_dim/2`), `1` is adjacent pairs (GGUF's
//! layout, dims `2i` and `2i + 1`). The shape rule flags any other value as
//! `tile_out_of_bounds` (an out-of-range param value, like a non-positive `theta`).
//!
//! An optional third input holds `head_dim / 2` per-pair frequency divisors (Llama 3's
//! frequency scaling; GGUF's `rope_freqs.weight`): frequency `i` is divided by element `i`.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`rope.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::ROPE,
    name: Cow::Borrowed("ROPE"),
    min_inputs: 2,
    max_inputs: Some(3),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("head_dim", ParamType::Int),
        ParamDecl::required("theta", ParamType::Real),
        ParamDecl::optional("pairing", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed(
        "Rotary position embedding (rotate-half) at the positions held in the pos buffer.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("rope.cu"), "amk_op_rope")),
    }
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
    if let Some(theta) = c.real("theta")
        && theta <= 0.0
    {
        c.oob(format!("param theta = {theta} must be positive"));
    }
    if let Some(p) = c.int("pairing")
        && p != reference::PAIRING_ROTATE_HALF
        && p != reference::PAIRING_ADJACENT
    {
        c.oob(format!(
            "param pairing = {p} must be {} (rotate-half) or {} (adjacent pairs)",
            reference::PAIRING_ROTATE_HALF,
            reference::PAIRING_ADJACENT
        ));
    }
    let Some(hd) = c.positive("head_dim") else {
        return c.finish();
    };
    if hd % 2 != 0 {
        c.mismatch(format!(
            "head_dim = {hd} must be even (rotate-half pairs dims i and i + head_dim/2)"
        ));
    }
    if let Some(f) = c.input(2) {
        c.float(f, "frequency factors");
        let half = hd as u64 / 2;
        if f.numel() != half {
            c.mismatch(format!(
                "the frequency factors {} must hold head_dim / 2 = {half} elements",
                desc(f)
            ));
        }
    }
    if x.numel() % hd as u64 != 0 {
        c.mismatch(format!(
            "the input {} is not a whole number of heads of head_dim = {hd}",
            desc(x)
        ));
    }
    if x.rank() >= 3 {
        // One position per row of the leading dims: S for [S, heads, head_dim], B·S for
        // [B, S, heads, head_dim].
        let lead = &x.shape[..x.rank() - 2];
        let rows = lead.iter().fold(1u64, |a, &d| a.saturating_mul(d));
        if pos.numel() != rows {
            c.mismatch(format!(
                "an input {} with leading dims {lead:?} needs {rows} positions, the positions \
                 buffer {} has {}",
                desc(x),
                desc(pos),
                pos.numel()
            ));
        }
        let row_len = x.numel().checked_div(rows).unwrap_or(0);
        if row_len % hd as u64 != 0 {
            c.mismatch(format!(
                "rows of the input {} ({row_len} elements) are not whole heads of head_dim = {hd}",
                desc(x)
            ));
        }
    }
    c.finish()
}
