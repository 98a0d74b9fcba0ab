//! Small helpers for testing op references against independent f64 formulas: task and call
//! construction, random non-zero inputs, poisoned outputs, dtype-aware closeness.
//! (Public so every op crate's tests share them; nothing here is used by the runtime.)

use crate::cpu::{CpuCall, Input, OpError, ReferenceFn};
use crate::ir::{DType, Opcode, Task};
use crate::json::{Map, Value};
use crate::registry::Registry;
use crate::sim::SplitMix;
use crate::tensor::Tensor;

/// An HBM activation buffer `b{id}` of `dtype` and `shape`, for a shape rule's buffer table
/// ([`shape_rule_kinds`]).
pub fn buffer(id: u32, dtype: DType, shape: &[u64]) -> crate::ir::Buffer {
    crate::ir::Buffer {
        id,
        name: format!("b{id}"),
        kind: crate::ir::BufferKind::ACTIVATION,
        dtype,
        shape: shape.to_vec(),
        space: crate::ir::MemSpace::HBM,
        source: None,
    }
}

/// A task of `op` with `n_in` inputs, `n_out` outputs and the given params (ids are dummies:
/// references only read params).
pub fn task(op: Opcode, n_in: usize, n_out: usize, params: &[(&str, Value)]) -> Task {
    let mut t = Task::new(
        0,
        op,
        (0..n_in as u32).collect(),
        (100..100 + n_out as u32).collect(),
        0,
    );
    let mut m = Map::new();
    for (k, v) in params {
        m.insert(*k, v.clone());
    }
    t.params = m;
    t
}

/// The kinds of what `spec`'s static shape rule finds in `task` over `buffers` (none for an
/// op without a rule), as the validator would run it.
pub fn shape_rule_kinds(
    spec: &crate::spec::OpSpec,
    task: &Task,
    buffers: &[crate::ir::Buffer],
) -> Vec<crate::ErrorKind> {
    let reg = Registry::empty();
    let ctx = crate::spec::TaskContext {
        task,
        buffers,
        registry: &reg,
    };
    spec.check
        .map(|check| check(&ctx).into_iter().map(|f| f.kind).collect())
        .unwrap_or_default()
}

/// Runs `run` on `task` with read-only `inputs` and the given (poisoned) `outputs`.
pub fn call(
    run: ReferenceFn,
    task: &Task,
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
) -> Result<(), OpError> {
    call_with(run, task, inputs, outputs, None)
}

/// [`call`] with a registry (for ops that run other ops, like FUSED).
pub fn call_with(
    run: ReferenceFn,
    task: &Task,
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    registry: Option<&Registry>,
) -> Result<(), OpError> {
    let ins: Vec<Input<'_>> = inputs.iter().map(|t| Input::Tensor(t)).collect();
    run(&mut CpuCall {
        task,
        registry: registry.map(|r| r as &dyn crate::cpu::OpTable),
        inputs: &ins,
        outputs,
    })
}

/// A deterministic generator for a test case.
pub fn rng(seed: u64) -> SplitMix {
    SplitMix(seed ^ 0x005E_ED0F_A11C_0DE5)
}

/// Random values in `[lo, hi)` that are never exactly zero (a zero input hides bugs).
pub fn random_nonzero(dtype: DType, shape: &[u64], rng: &mut SplitMix, lo: f64, hi: f64) -> Tensor {
    let mut t = Tensor::random(dtype, shape, rng, lo, hi);
    for i in 0..t.numel() {
        if t.get_f32(i) == 0.0 {
            t.set_f32(i, if dtype.is_integer() { 1.0 } else { 0.5 });
        }
    }
    t
}

/// Relative precision of a dtype's significand (half an ulp at 1.0).
pub fn dtype_eps(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f32::EPSILON as f64 / 2.0,
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F8E4M3 => 2f64.powi(-4),
        DType::F8E5M2 => 2f64.powi(-3),
        _ => 0.0,
    }
}

/// Asserts every element of `got` matches `want` (computed in f64 by the test) within
/// `atol + rtol·|want|` plus the rounding of `got`'s dtype, and that no element is still
/// poison (NaN). Returns the largest error seen, for reporting.
pub fn assert_close(got: &Tensor, want: &[f64], rtol: f64, atol: f64) -> f64 {
    assert_eq!(got.numel(), want.len(), "element count");
    let eps = dtype_eps(got.dtype());
    let mut worst = 0.0f64;
    for (i, &w) in want.iter().enumerate() {
        let g = got.get_f32(i) as f64;
        assert!(
            !g.is_nan() || w.is_nan(),
            "element {i} is NaN (never written?), want {w}"
        );
        let tol = atol + (rtol + eps) * w.abs();
        let err = (g - w).abs();
        assert!(
            err <= tol,
            "element {i}: got {g}, want {w} (err {err:.3e} > tol {tol:.3e}, dtype {})",
            got.dtype()
        );
        worst = worst.max(err);
    }
    worst
}

/// How far `got` is from the reference `want`: the largest absolute difference over the
/// largest `|want|` (floored at 1e-6), the measure the checks against HF logits bound by 1e-5.
pub fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs() / scale)
        .fold(0.0, f64::max)
}

/// Every row of `got` against the reference rows `want` (transformers' logits): the same
/// width, within `bound` by [`max_rel_err`] and, with `greedy`, the same argmax
/// ([`crate::decode::argmax`]). The worst error, or what failed first (its row).
pub fn check_rows(
    got: &[Vec<f32>],
    want: &[Vec<f64>],
    greedy: Option<&[u32]>,
    bound: f64,
) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!(
            "{} rows against {} reference rows",
            got.len(),
            want.len()
        ));
    }
    let mut worst = 0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.len() != w.len() {
            return Err(format!("row {i}: {} logits against {}", g.len(), w.len()));
        }
        let err = max_rel_err(g, w);
        worst = worst.max(err);
        if err > bound {
            return Err(format!(
                "row {i}: max |got − want| / max |want| = {err:e} > {bound:e}"
            ));
        }
        if let Some(&t) = greedy.and_then(|t| t.get(i))
            && crate::decode::argmax(g) != t
        {
            return Err(format!(
                "row {i}: greedy token {} against {t}",
                crate::decode::argmax(g)
            ));
        }
    }
    Ok(worst)
}
