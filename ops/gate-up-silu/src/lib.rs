//! Opcode `GATE_UP_SILU` (code 21): columns `[n_off, n_off+N_tile)` of
//! `silu(x·Wg^T) · (x·Wu^T)` for one row `x`, optionally RMS-normalised first — a SwiGLU MLP's
//! gate and up projections and its SILU_MUL (and the RMSNORM before them) in one task.
//!
//! Inputs `[x, Wg, Wu]` or `[x, Wg, Wu, norm_w]` (then param `eps` is required), one output;
//! params `K`, `N_tile`, `n_off` (and `eps`). A warp streams the gate and the up row of a
//! column together and combines them in registers. The gate and up sums are rounded to the
//! output's dtype before the SiLU, as the unfused program stores them, so fusing changes no
//! result. Float operands only (F32, F16, BF16).
//!
//! This crate owns the op's spec, its static shape rule, its CPU reference
//! ([`reference`](mod@reference)) and its CUDA device function (`gate-up-silu.cu`).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{self, Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_tile as _;
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::GATE_UP_SILU,
    name: Cow::Borrowed("GATE_UP_SILU"),
    min_inputs: 3,
    max_inputs: Some(4),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("K", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
        ParamDecl::optional("eps", ParamType::Real),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Columns [n_off, n_off+N_tile) of silu(x·Wg^T)·(x·Wu^T), x one row (RMS-normalised first with a 4th input).",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("gate-up-silu.cu"), "amk_op_gate_up_silu")
                .with_shared(op_rmsnorm_gemv::SHARED_BYTES)
                .with_own_wait()
                .with_row_loop(0, &[1, 2], 2),
        ),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let norm = (ctx.n_inputs() == 4).then_some(3);
    let Some((_, rows)) = opcheck::fused_row(&mut c, &[1, 2], norm) else {
        return c.finish();
    };
    let (Some(wg), Some(wu), Some(out)) = (c.input(1), c.input(2), c.output(0)) else {
        return c.finish();
    };
    if wg.shape != wu.shape {
        c.mismatch(format!(
            "the gate {} and up {} weights must have one shape",
            desc(wg),
            desc(wu)
        ));
        return c.finish();
    }
    let n = rows.first().copied().unwrap_or(0);
    let what = format!("rows of the gate weight {}", desc(wg));
    if let Some(end) = opcheck::tile_within(&mut c, n, &what)
        && (end > out.last_dim() || out.numel() != out.last_dim())
    {
        c.oob(format!(
            "columns [.., {end}) must fit the one-row output {}",
            desc(out)
        ));
    }
    c.finish()
}
