//! Opcode `RMSNORM_GEMV` (code 20): columns `[n_off, n_off+N_tile)` of `y = rmsnorm(x) @ W^T
//! (+ bias)` for one row `x` — the RMSNORM task before a projection folded into every tile.
//!
//! Inputs `[x, norm_w, W]` or `[x, norm_w, W, bias]`, one output; params `eps`, `K`,
//! `N_tile`, `n_off`. Each tile normalises the row itself (it is `K` elements: far cheaper
//! than the phase and the hand-off a separate RMSNORM costs in a decode step). The
//! normalised row is rounded to `x`'s dtype before the product, as the unfused program stores
//! it, so fusing changes no result. Float operands only (F32, F16, BF16).
//!
//! This crate owns the op's spec, its static shape rule, its CPU reference
//! ([`reference`](mod@reference)) and its CUDA device function (`rmsnorm-gemv.cu`).

// Linked with the op: the device code its CUDA source calls.
use amk_core::opcheck::{self, Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use oplib_tile as _;
use std::borrow::Cow;

pub mod reference;

/// Dynamic shared memory the device tile asks for: the normalised row (`K` elements of `x`'s
/// dtype; longer rows are normalised on the fly instead). GEMV_TILE's row budget
/// ([`op_gemv_tile::SHARED_BYTES`]), which says why it is that size.
pub const SHARED_BYTES: u32 = op_gemv_tile::SHARED_BYTES;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::RMSNORM_GEMV,
    name: Cow::Borrowed("RMSNORM_GEMV"),
    min_inputs: 3,
    max_inputs: Some(4),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("eps", ParamType::Real),
        ParamDecl::required("K", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::Columns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Columns [n_off, n_off+N_tile) of y = rmsnorm(x, norm_w, eps) @ W^T (+ bias), x one row.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("rmsnorm-gemv.cu"), "amk_op_rmsnorm_gemv")
                .with_shared(SHARED_BYTES)
                .with_own_wait()
                .with_row_loop(0, &[2], 1),
        ),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let Some((_, rows)) = opcheck::fused_row(&mut c, &[2], Some(1)) else {
        return c.finish();
    };
    let (Some(w), Some(out)) = (c.input(2), c.output(0)) else {
        return c.finish();
    };
    let n = rows.first().copied().unwrap_or(0);
    if let Some(b) = c.input(3) {
        c.numel_is(b, n, "bias");
    }
    let what = format!("rows of the weight {}", desc(w));
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
