//! Helpers for op crates' static shape rules ([`crate::CheckFn`]), so each rule reads as a
//! short list of facts about its operands.

use crate::ir::Buffer;
use crate::json::Value;
use crate::spec::{Finding, PARAM_FIELDS, TaskContext, param_field_index};
use crate::validate::ErrorKind;

/// Collects findings for one task.
pub struct Checker<'c, 'a> {
    /// The task being checked.
    pub ctx: &'c TaskContext<'a>,
    findings: Vec<Finding>,
    /// The task's device param fields, indexed like `PARAM_FIELDS` (one pass over the params).
    fields: [Option<&'a Value>; PARAM_FIELDS.len()],
}

/// `#3 'x' [1, 64] F32`, for messages.
pub fn desc(b: &Buffer) -> String {
    format!("#{} '{}' {:?} {}", b.id, b.name, b.shape, b.dtype)
}

impl<'c, 'a> Checker<'c, 'a> {
    /// Starts checking `ctx`.
    pub fn new(ctx: &'c TaskContext<'a>) -> Self {
        let mut fields = [None; PARAM_FIELDS.len()];
        for (k, v) in ctx.task.params.iter() {
            if let Some(i) = param_field_index(k) {
                fields[i] = Some(v);
            }
        }
        Checker {
            ctx,
            findings: Vec::new(),
            fields,
        }
    }

    fn param(&self, key: &str) -> Option<&'a Value> {
        match param_field_index(key) {
            Some(i) => self.fields[i],
            None => self.ctx.task.params.get(key),
        }
    }
    /// Input `i` (arity was checked before the rule runs, but stay total).
    pub fn input(&self, i: usize) -> Option<&'a Buffer> {
        self.ctx.input(i)
    }
    /// Output `i`.
    pub fn output(&self, i: usize) -> Option<&'a Buffer> {
        self.ctx.output(i)
    }
    /// An integer param.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.param(key).and_then(Value::as_i64)
    }
    /// A real param.
    pub fn real(&self, key: &str) -> Option<f64> {
        self.param(key).and_then(Value::as_f64)
    }
    /// Records a `shape_mismatch`.
    pub fn mismatch(&mut self, msg: impl Into<String>) {
        self.findings
            .push(Finding::new(ErrorKind::ShapeMismatch, msg));
    }
    /// Records a `tile_out_of_bounds`.
    pub fn oob(&mut self, msg: impl Into<String>) {
        self.findings
            .push(Finding::new(ErrorKind::TileOutOfBounds, msg));
    }
    /// Records a finding of any kind.
    pub fn push(&mut self, kind: ErrorKind, msg: impl Into<String>) {
        self.findings.push(Finding::new(kind, msg));
    }
    /// An integer param that must be > 0 (`tile_out_of_bounds` otherwise); `None` if absent
    /// or bad.
    pub fn positive(&mut self, key: &str) -> Option<i64> {
        let v = self.int(key)?;
        if v <= 0 {
            self.oob(format!("param {key} = {v} must be positive"));
            return None;
        }
        Some(v)
    }
    /// An integer param that must be ≥ 0.
    pub fn non_negative(&mut self, key: &str) -> Option<i64> {
        let v = self.int(key)?;
        if v < 0 {
            self.oob(format!("param {key} = {v} must not be negative"));
            return None;
        }
        Some(v)
    }
    /// Requires equal element counts (operands are viewed, so dims may differ).
    pub fn same_numel(&mut self, a: &Buffer, b: &Buffer) {
        if a.numel() != b.numel() {
            self.mismatch(format!(
                "{} and {} must have the same number of elements ({} vs {})",
                desc(a),
                desc(b),
                a.numel(),
                b.numel()
            ));
        }
    }
    /// Requires a floating-point element type.
    pub fn float(&mut self, b: &Buffer, role: &str) {
        if b.dtype.is_integer() {
            self.mismatch(format!(
                "{role} {} must have a floating-point dtype",
                desc(b)
            ));
        }
    }
    /// Requires an integer element type.
    pub fn integer(&mut self, b: &Buffer, role: &str) {
        if !b.dtype.is_integer() {
            self.mismatch(format!("{role} {} must have an integer dtype", desc(b)));
        }
    }
    /// Requires a buffer to have exactly `n` elements.
    pub fn numel_is(&mut self, b: &Buffer, n: u64, role: &str) {
        if b.numel() != n {
            self.mismatch(format!(
                "{role} {} must have {n} elements, has {}",
                desc(b),
                b.numel()
            ));
        }
    }
    /// The findings.
    pub fn finish(self) -> Vec<Finding> {
        self.findings
    }
}

/// Element-wise ops: every input and the output hold the same number of elements.
pub fn elementwise(c: &mut Checker<'_, '_>) {
    let Some(out) = c.output(0) else { return };
    for i in 0..c.ctx.n_inputs() {
        if let Some(x) = c.input(i) {
            c.same_numel(x, out);
        }
    }
}

/// Row normalisation `[x, w(, b)] -> y` with param `hidden` = the normalised (last) dim.
pub fn norm(c: &mut Checker<'_, '_>) {
    let (Some(x), Some(out)) = (c.input(0), c.output(0)) else {
        return;
    };
    let Some(hidden) = c.positive("hidden") else {
        return;
    };
    if x.last_dim() != hidden as u64 {
        c.mismatch(format!(
            "param hidden = {hidden} must equal the last dim of the input {}",
            desc(x)
        ));
    }
    for i in 1..c.ctx.n_inputs() {
        if let Some(w) = c.input(i) {
            c.numel_is(w, hidden as u64, if i == 1 { "weight" } else { "bias" });
        }
    }
    c.same_numel(x, out);
}

/// Quantised weight modes of GEMV/GEMM tiles (`params.qdtype`).
pub const QDTYPE_I8: i64 = 6;
/// 4-bit packed weights.
pub const QDTYPE_I4: i64 = 7;

/// Tiled linear layers: `[x, W(, bias)]` or `[x, qW, scales(, zeros)]` writing columns
/// `[n_off, n_off + N_tile)` (and rows `[m_off, m_off + M_tile)` for GEMM) of `y = x @ W^T`.
pub fn linear(c: &mut Checker<'_, '_>, gemm: bool) {
    let (Some(x), Some(w), Some(out)) = (c.input(0), c.input(1), c.output(0)) else {
        return;
    };
    let k = c.positive("K");
    let n_tile = c.positive("N_tile");
    let n_off = c.non_negative("n_off");
    let Some(k) = k else { return };
    let k = k as u64;
    if w.last_dim() != k {
        c.mismatch(format!(
            "param K = {k} must equal the last dim of the weight {}",
            desc(w)
        ));
        return;
    }
    if x.last_dim() != k {
        c.mismatch(format!(
            "param K = {k} must equal the last dim of the input {}",
            desc(x)
        ));
        return;
    }
    let n = w.numel() / k;
    let m = x.numel() / k;
    c.float(x, "input");
    c.float(out, "output");
    let qdtype = c.int("qdtype");
    let quant = matches!(qdtype, Some(QDTYPE_I8 | QDTYPE_I4));
    if let Some(q) = qdtype
        && !quant
    {
        c.mismatch(format!(
            "param qdtype = {q} is not a weight-only mode (6 = int8, 7 = int4)"
        ));
    }
    let ni = c.ctx.n_inputs();
    if quant {
        if ni < 3 {
            c.mismatch("quantised weights need [x, qW, scales] or [x, qW, scales, zeros]");
            return;
        }
        let want = if qdtype == Some(QDTYPE_I4) {
            &[crate::DType::I4][..]
        } else if ni == 4 {
            &[crate::DType::U8][..]
        } else {
            &[crate::DType::I8][..]
        };
        if !want.contains(&w.dtype) {
            c.mismatch(format!(
                "quantised weight {} must be {} for this mode",
                desc(w),
                want[0]
            ));
        }
        let group = match c.int("group") {
            None => k,
            Some(g) if g > 0 => g as u64,
            Some(g) => {
                c.oob(format!("param group = {g} must be positive"));
                return;
            }
        };
        let n_groups = k.div_ceil(group);
        for (i, role) in [(2usize, "scales"), (3, "zeros")] {
            if let Some(s) = c.input(i) {
                c.float(s, role);
                c.numel_is(s, n.saturating_mul(n_groups), role);
            }
        }
    } else {
        c.float(w, "weight");
        if ni == 4 {
            c.mismatch("4 inputs are only valid with a quantised weight (qdtype 6 or 7)");
        }
        if let Some(bias) = c.input(2) {
            c.float(bias, "bias");
            c.numel_is(bias, n, "bias");
        }
    }
    if let (Some(n_tile), Some(n_off)) = (n_tile, n_off) {
        let end = n_off.saturating_add(n_tile) as u64;
        if end > n {
            c.oob(format!(
                "columns [{n_off}, {end}) exceed the {n} rows of the weight {}",
                desc(w)
            ));
        }
        if end > out.last_dim() {
            c.oob(format!(
                "columns [{n_off}, {end}) exceed the last dim of the output {}",
                desc(out)
            ));
        }
    }
    if out.numel() / out.last_dim().max(1) != m {
        c.mismatch(format!(
            "the output {} must have {m} row(s), like the input {}",
            desc(out),
            desc(x)
        ));
    }
    if gemm {
        let mt = c.positive("M_tile");
        if let (Some(mt), Some(mo)) = (mt, c.int("m_off").or(Some(0))) {
            if mo < 0 {
                c.oob(format!("param m_off = {mo} must not be negative"));
            } else if (mo.saturating_add(mt)) as u64 > m {
                c.oob(format!(
                    "rows [{mo}, {}) exceed the {m} row(s) of the input {}",
                    mo + mt,
                    desc(x)
                ));
            }
        }
    }
}

/// The operand rule shared by the fused decode tiles (RMSNORM_GEMV, GATE_UP_SILU,
/// QKV_ROPE_APPEND): `x` (input `x_in`) is one row of `K` elements, every weight in `weights`
/// (input indices) is `[N, K]` with `N` rows, the optional RMS-norm weight (input `norm`) holds
/// `K` elements and then param `eps` is required; every operand and the outputs are F32, F16
/// or BF16 (the fused device tiles stream float weights only). Returns `(K, rows of each
/// weight)`, or `None` when a later rule has nothing to check against.
pub fn fused_row(
    c: &mut Checker<'_, '_>,
    weights: &[usize],
    norm: Option<usize>,
) -> Option<(u64, Vec<u64>)> {
    let x = c.input(0)?;
    let k = c.positive("K")? as u64;
    fn vec_dtype(c: &mut Checker<'_, '_>, b: &Buffer, role: &str) -> bool {
        let ok = matches!(
            b.dtype,
            crate::DType::F32 | crate::DType::F16 | crate::DType::BF16
        );
        if !ok {
            c.mismatch(format!("{role} {} must be F32, F16 or BF16", desc(b)));
        }
        ok
    }
    let mut ok = vec_dtype(c, x, "input");
    if x.last_dim() != k || x.numel() != k {
        c.mismatch(format!(
            "the input {} must be one row of K = {k} elements",
            desc(x)
        ));
        ok = false;
    }
    let mut rows = Vec::with_capacity(weights.len());
    for &i in weights {
        let w = c.input(i)?;
        ok &= vec_dtype(c, w, "weight");
        if w.last_dim() != k {
            c.mismatch(format!(
                "param K = {k} must equal the last dim of the weight {}",
                desc(w)
            ));
            ok = false;
        }
        rows.push(w.numel() / k.max(1));
    }
    if let Some(i) = norm {
        let nw = c.input(i)?;
        ok &= vec_dtype(c, nw, "norm weight");
        c.numel_is(nw, k, "norm weight");
        if c.real("eps").is_none() {
            c.mismatch("a norm weight input needs the param eps");
            ok = false;
        }
    }
    for j in 0..c.ctx.n_outputs() {
        if let Some(o) = c.output(j) {
            ok &= vec_dtype(c, o, "output");
        }
    }
    ok.then_some((k, rows))
}

/// A column tile `[n_off, n_off + N_tile)` must lie within `n` (what it indexes, named by
/// `what`); returns the tile's end.
pub fn tile_within(c: &mut Checker<'_, '_>, n: u64, what: &str) -> Option<u64> {
    let n_tile = c.positive("N_tile");
    let n_off = c.non_negative("n_off");
    let (n_tile, n_off) = (n_tile?, n_off?);
    let end = n_off.saturating_add(n_tile) as u64;
    if end > n {
        c.oob(format!("columns [{n_off}, {end}) exceed the {n} {what}"));
        return None;
    }
    Some(end)
}
