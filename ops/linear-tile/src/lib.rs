//! Opcode `LINEAR_TILE` (code 27): rows `[m_off, m_off+M_tile)` × columns `[n_off,
//! n_off+N_tile)` of a linear layer `y = x·W^T` over many rows of `x` (a prompt chunk), with
//! an optional RMS-normalised input and an optional epilogue — the prefill program's
//! projections, each with the elementwise op around it that would otherwise be a one-task
//! phase over the whole chunk.
//!
//! Inputs, in order: `x` (`[rows, K]`), `W` (`[N, K]`), the norm weight (`K` elements) when
//! param `norm` = 1 (then `eps` is required), a bias (`N` elements, added to `x·W^T` before the
//! epilogue, as GEMV_TILE adds its bias) when param `flags` has bit 0, then by param
//! `epilogue`:
//! - `0` (default): nothing more; `y = x·W^T`;
//! - `1` (residual): `r`, of the output's shape; `y = round(x·W^T) + r`;
//! - `2` (SwiGLU): `U` (`[N, K]`, the up weight; `W` is the gate);
//!   `y = silu(round(x·W^T)) · round(x·U^T)`;
//! - `3` (RoPE): the positions (one per row of `x`), then with param `rope_factors` = 1 the
//!   per-pair frequency divisors; `y = rope(round(x·W^T))`, ROPE's rotate-half arithmetic
//!   over heads of `head_dim` at each row's position (params `head_dim`, `theta`): a Q or K
//!   projection and its RoPE in one task.
//!
//! The output is viewed as `[rows, width]` (`x`'s rows; any shape of that many elements, so a
//! projection can write `[rows, heads, head_dim]` for the RoPE after it). `round` is the
//! output dtype's rounding: every value equals what the unfused program (RMSNORM,
//! GEMM_TILE into an activation of the output's dtype, ADD, SILU_MUL or ROPE) stores. Params
//! `K`, `N_tile`, `n_off`, `M_tile`, `m_off` (all required), `eps`, `norm`, `flags`,
//! `epilogue`, `rope_factors`, `head_dim`, `theta`. Float operands only (F32, F16, BF16). Why
//! a tile of rows: a prompt chunk's `M` rows share each weight tile, so a task does `M_tile`
//! times the arithmetic of a decode tile per byte of weight, which is what the tensor cores
//! need.
//!
//! On the GPU, with `x`, `W` and `U` all BF16 or all F16 (the output may be any float), the
//! tile runs on the tensor cores (`mma.sync`, f32 accumulation); any other dtype mix, f32
//! programs included, runs f32 fused multiply-adds in K order (no TF32): not the reference's
//! summation order, so the two agree to rounding (the CPU VM's 1e-5), not bit for bit.
//!
//! This crate owns the op's spec, its static shape rule, its CPU reference
//! ([`reference`](mod@reference)) and its CUDA device function (`linear-tile.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{
    Buffer, DType, Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference,
    TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// Dynamic shared memory a task uses on the GPU: four pipeline stages of A (64 × 64) and B
/// (128 × 64) 16-bit tiles (or three of a [`WIDE_ROWS`]-row A, two of a [`WIDEST_ROWS`]-row
/// one), which the f32 output tile (at most 128 rows at a time) overlays after the K loop, then [`WIDE_ROWS`] row scales (f64), 64 RoPE pair frequencies
/// (f32) and the norm weight as f32 (up to [`MAX_NORM_K`] elements).
pub const SHARED_BYTES: u32 =
    4 * (64 * 64 + 128 * 64) * 2 + WIDE_ROWS as u32 * 8 + 64 * 4 + MAX_NORM_K as u32 * 4;

/// The longest row the device normalises (it stages the norm weight in shared memory).
pub const MAX_NORM_K: u64 = 8192;

/// Rows of `x` one device tile computes at a time (a task with more loops over them).
pub const DEVICE_ROWS: u64 = 64;
/// Rows a device tile takes at once on the tensor-core path (16-bit programs) when more than
/// [`DEVICE_ROWS`] of the task's rows are left: each weight tile then feeds twice the rows.
pub const WIDE_ROWS: u64 = 128;
/// Rows a device tile takes at once on the wgmma path (sm_90a, 16-bit programs, no norm) when
/// more than [`WIDE_ROWS`] of the task's rows are left: each weight tile feeds twice the rows
/// again (elsewhere such a task runs as [`WIDE_ROWS`]-row blocks).
pub const WIDEST_ROWS: u64 = 256;
/// Output columns one device tile computes at a time (64 with the SwiGLU epilogue, whose tile
/// holds the gate's and the up projection's columns side by side).
pub const DEVICE_COLS: u64 = 128;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::LINEAR_TILE,
    name: Cow::Borrowed("LINEAR_TILE"),
    min_inputs: 2,
    max_inputs: Some(6),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("K", ParamType::Int),
        ParamDecl::required("N_tile", ParamType::Int),
        ParamDecl::required("n_off", ParamType::Int),
        ParamDecl::required("M_tile", ParamType::Int),
        ParamDecl::required("m_off", ParamType::Int),
        ParamDecl::optional("eps", ParamType::Real),
        ParamDecl::optional("norm", ParamType::Int),
        ParamDecl::optional("epilogue", ParamType::Int),
        ParamDecl::optional("rope_factors", ParamType::Int),
        ParamDecl::optional("flags", ParamType::Int),
        ParamDecl::optional("head_dim", ParamType::Int),
        ParamDecl::optional("theta", ParamType::Real),
    ]),
    write_region: amk_core::WriteRegion::ColumnsAndRows,
    check: Some(check),
    summary: Cow::Borrowed(
        "Rows [m_off, m_off+M_tile) x columns [n_off, n_off+N_tile) of x·W^T (+ bias) over many rows, optionally RMS-normalised first, with a residual, SwiGLU or RoPE epilogue.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("linear-tile.cu"), "amk_op_linear_tile")
                .with_shared(SHARED_BYTES)
                .with_task_defines(task_defines),
        ),
    }
}

/// The device code a task asks of its kernel: the [`WIDEST_ROWS`]-row tile for a task of more
/// than [`WIDE_ROWS`] rows without a norm (`AMK_LT_256`; compiled only on the wgmma path,
/// sm_90a, and run only for 16-bit operands). Kernels without such a task leave the tile out:
/// its 128 accumulators a thread would weigh on every kernel's registers (docs/perf-notes.md
/// round 42 measured a wider tile's code alone costing a program that never ran it 5.5 %).
fn task_defines(task: &amk_core::Task) -> &'static [(&'static str, &'static str)] {
    let norm = task.param_i64("norm").unwrap_or(0) != 0;
    match task.param_i64("M_tile") {
        Some(m) if m > WIDE_ROWS as i64 && !norm => &[("AMK_LT_256", "1")],
        _ => &[],
    }
}

/// Whether a task of more than [`WIDE_ROWS`] rows runs [`WIDEST_ROWS`]-row blocks on a GPU of
/// compute capability `sm_arch` (90 for 9.0): the wgmma path (sm_90a), 16-bit operands, no norm
/// (its rows' scales would not fit). Elsewhere such a task runs [`WIDE_ROWS`]-row blocks, so a
/// lowering gives a task that many rows only where this holds.
pub fn runs_widest_rows(sm_arch: i64, dtype: DType, norm: bool) -> bool {
    sm_arch == 90 && dtype != DType::F32 && !norm
}

/// What a task computes after the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// `y = x·W^T`.
    None,
    /// `y = round(x·W^T) + r`.
    Residual,
    /// `y = silu(round(x·W^T)) · round(x·U^T)`.
    SwiGlu,
    /// `y = rope(round(x·W^T))` at each row's position: ROPE's rotate-half pairs of every head
    /// (params `head_dim`, `theta`; the operand is the positions, one per row of `x`; with
    /// param `rope_factors` = 1 a further input holds the per-pair frequency divisors).
    Rope,
}

impl Epilogue {
    /// The param's value.
    pub fn code(self) -> i64 {
        match self {
            Epilogue::None => 0,
            Epilogue::Residual => 1,
            Epilogue::SwiGlu => 2,
            Epilogue::Rope => 3,
        }
    }

    /// The epilogue a param value names.
    pub fn from_code(code: i64) -> Option<Epilogue> {
        match code {
            0 => Some(Epilogue::None),
            1 => Some(Epilogue::Residual),
            2 => Some(Epilogue::SwiGlu),
            3 => Some(Epilogue::Rope),
            _ => None,
        }
    }
}

/// Which optional inputs a task has (its params `norm`, `flags` bit 0, `epilogue` and
/// `rope_factors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The rows are RMS-normalised first (the norm weight follows `W`).
    pub norm: bool,
    /// A bias (`N` elements) is added to `x·W^T` before the epilogue (Qwen2's q/k/v).
    pub bias: bool,
    /// What follows the product.
    pub epilogue: Epilogue,
    /// With [`Epilogue::Rope`]: per-pair frequency divisors follow the positions.
    pub factors: bool,
}

/// Bit of param `flags`: the task has a bias input.
pub const FLAG_BIAS: i64 = 1;

/// Where a task's optional inputs sit: `[x, W, norm_w?, bias?, operand?, divisors?]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The norm weight's input.
    pub norm: Option<usize>,
    /// The bias's input.
    pub bias: Option<usize>,
    /// The epilogue.
    pub epilogue: Epilogue,
    /// The epilogue's operand (the residual, the up weight or the positions).
    pub extra: Option<usize>,
    /// The RoPE frequency divisors' input.
    pub factors: Option<usize>,
    /// Inputs the task must have.
    pub n_inputs: usize,
}

impl Layout {
    /// The layout of a task with these options (`factors` only counts with [`Epilogue::Rope`]).
    pub fn new(o: Options) -> Layout {
        let mut next = 2;
        let mut take = |present: bool| {
            let at = present.then_some(next);
            next += usize::from(present);
            at
        };
        let norm = take(o.norm);
        let bias = take(o.bias);
        let extra = take(o.epilogue != Epilogue::None);
        let factors = take(o.epilogue == Epilogue::Rope && o.factors);
        Layout {
            norm,
            bias,
            epilogue: o.epilogue,
            extra,
            factors,
            n_inputs: next,
        }
    }

    /// The layout the params `norm`, `flags`, `epilogue` and `rope_factors` name (`None` for
    /// a value outside 0/1, bits other than [`FLAG_BIAS`], 0..=3 and 0/1).
    pub fn from_params(
        norm: Option<i64>,
        flags: Option<i64>,
        epilogue: Option<i64>,
        rope_factors: Option<i64>,
    ) -> Option<Layout> {
        let flag = |v: Option<i64>| match v.unwrap_or(0) {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        };
        let flags = flags.unwrap_or(0);
        if flags & !FLAG_BIAS != 0 {
            return None;
        }
        Some(Layout::new(Options {
            norm: flag(norm)?,
            bias: flags & FLAG_BIAS != 0,
            epilogue: Epilogue::from_code(epilogue.unwrap_or(0))?,
            factors: flag(rope_factors)?,
        }))
    }
}

impl Epilogue {
    /// Columns of the output the device tile covers at a time.
    pub fn device_cols(self) -> u64 {
        match self {
            Epilogue::SwiGlu => DEVICE_COLS / 2,
            _ => DEVICE_COLS,
        }
    }
}

fn float(b: &Buffer) -> bool {
    matches!(b.dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let Some(layout) = Layout::from_params(
        c.int("norm"),
        c.int("flags"),
        c.int("epilogue"),
        c.int("rope_factors"),
    ) else {
        c.oob(
            "params norm (0 or 1), flags (bit 0: bias), epilogue (0 to 3) and rope_factors \
             (0 or 1) are out of range",
        );
        return c.finish();
    };
    if ctx.n_inputs() != layout.n_inputs {
        c.mismatch(format!(
            "norm, bias and epilogue {} need {} inputs, got {}",
            layout.epilogue.code(),
            layout.n_inputs,
            ctx.n_inputs()
        ));
        return c.finish();
    }
    let k = c.positive("K");
    let n_tile = c.positive("N_tile");
    let n_off = c.non_negative("n_off");
    let m_tile = c.positive("M_tile");
    let m_off = c.non_negative("m_off");
    let (Some(x), Some(w), Some(out), Some(k)) = (c.input(0), c.input(1), c.output(0), k) else {
        return c.finish();
    };
    let k = k as u64;
    for (b, role) in [(x, "input"), (w, "weight"), (out, "output")] {
        if !float(b) {
            c.mismatch(format!("{role} {} must be F32, F16 or BF16", desc(b)));
        }
    }
    for (b, role) in [(x, "input"), (w, "weight")] {
        if b.last_dim() != k {
            c.mismatch(format!(
                "param K = {k} must equal the last dim of the {role} {}",
                desc(b)
            ));
            return c.finish();
        }
    }
    if let Some(b) = layout.bias.and_then(|i| c.input(i)) {
        let n = w.numel() / k.max(1);
        if !float(b) || b.numel() != n {
            c.mismatch(format!(
                "the bias {} must be {n} floats, one per row of the weight",
                desc(b)
            ));
        }
    }
    if let Some(nw) = layout.norm.and_then(|i| c.input(i)) {
        if !float(nw) {
            c.mismatch(format!("norm weight {} must be F32, F16 or BF16", desc(nw)));
        }
        c.numel_is(nw, k, "norm weight");
        if k > MAX_NORM_K {
            c.oob(format!("a normalised row of K = {k} exceeds {MAX_NORM_K}"));
        }
        if c.real("eps").is_none() {
            c.mismatch("a norm weight input needs the param eps");
        }
    }
    let rows = x.numel() / k.max(1);
    if layout.epilogue == Epilogue::Rope {
        rope_rule(&mut c, &layout, rows, (n_off, n_tile));
    }
    if let Some(e) = layout.extra.and_then(|i| c.input(i))
        && layout.epilogue != Epilogue::Rope
    {
        let same = match layout.epilogue {
            Epilogue::SwiGlu => e.shape == w.shape,
            _ => e.numel() == out.numel(),
        };
        if !float(e) || !same {
            c.mismatch(format!(
                "the epilogue's operand {} must be a float buffer shaped like the {}",
                desc(e),
                if layout.epilogue == Epilogue::SwiGlu {
                    "weight"
                } else {
                    "output"
                }
            ));
        }
    }
    let n = w.numel() / k.max(1);
    if rows == 0 || out.numel() % rows != 0 {
        c.mismatch(format!(
            "the output {} must be {rows} row(s), like the input {}",
            desc(out),
            desc(x)
        ));
        return c.finish();
    }
    let width = out.numel() / rows;
    if let (Some(nt), Some(no)) = (n_tile, n_off) {
        let end = no.saturating_add(nt) as u64;
        if end > n || end > width {
            c.oob(format!(
                "columns [{no}, {end}) exceed the {n} rows of the weight {} or the output {}",
                desc(w),
                desc(out)
            ));
        }
    }
    if let (Some(mt), Some(mo)) = (m_tile, m_off) {
        let end = mo.saturating_add(mt) as u64;
        if end > rows {
            c.oob(format!(
                "rows [{mo}, {end}) exceed the {rows} row(s) of the input {}",
                desc(x)
            ));
        }
    }
    c.finish()
}

/// The RoPE epilogue's rule: a positive even `head_dim` and a positive `theta`, columns of whole
/// heads, integer positions one per row of `x`, and `head_dim / 2` float divisors with
/// `rope_factors`.
fn rope_rule(
    c: &mut Checker<'_, '_>,
    layout: &Layout,
    rows: u64,
    cols: (Option<i64>, Option<i64>),
) {
    let hd = c.int("head_dim").unwrap_or(0);
    if hd <= 0 || hd % 2 != 0 || hd as u64 > DEVICE_COLS {
        c.oob(format!(
            "the RoPE epilogue needs an even head_dim of at most {DEVICE_COLS}, got {hd}"
        ));
        return;
    }
    if !c.real("theta").is_some_and(|t| t.is_finite() && t > 0.0) {
        c.oob("the RoPE epilogue needs a positive finite theta");
    }
    if let (Some(no), Some(nt)) = cols
        && (no % hd != 0 || nt % hd != 0)
    {
        c.oob(format!(
            "columns [{no}, {}) must be whole heads of {hd} for the RoPE epilogue",
            no.saturating_add(nt)
        ));
    }
    if let Some(pos) = layout.extra.and_then(|i| c.input(i))
        && (!pos.dtype.is_integer() || pos.numel() != rows)
    {
        c.mismatch(format!(
            "the positions {} must be integers, one per row of x ({rows})",
            desc(pos)
        ));
    }
    if let Some(f) = layout.factors.and_then(|i| c.input(i))
        && (!float(f) || f.numel() != hd as u64 / 2)
    {
        c.mismatch(format!(
            "the RoPE frequency divisors {} must be head_dim / 2 floats",
            desc(f)
        ));
    }
}
