//! Tolerances and the comparisons every case ends in: a backend's outputs against an f64
//! formula or against the oracle.

use super::Ctx;
use super::outcome::{CaseResult, Failure, fail};
use super::run::{Inputs, run_steps, vals};
use amk_core::testkit::dtype_eps;
use amk_core::{DType, Outputs, Program, Tensor, WeightStore};

/// Tolerance of a comparison: `atol + (rtol + eps(dtype))·|want|`.
#[derive(Debug, Clone, Copy)]
pub struct Tol {
    /// Relative part.
    pub rtol: f64,
    /// Absolute part.
    pub atol: f64,
}

/// f32 results against an f64 formula (small sizes: a few roundings per element).
pub(super) const F32_TOL: Tol = Tol {
    rtol: 1e-4,
    atol: 1e-5,
};
/// End-to-end f32 programs (errors pass through norms and several layers).
pub(super) const MODEL_TOL: Tol = Tol {
    rtol: 1e-3,
    atol: 1e-4,
};
/// Every f32 output against the oracle: max |error| / max |oracle value| (the backend must
/// agree with the CPU VM to 1e-5 relative, whatever its summation order).
const ORACLE_F32_REL: f64 = 1e-5;
/// bf16 programs against the oracle (every intermediate rounds to 8 bits).
pub(super) const BF16_TOL: Tol = Tol {
    rtol: 3e-2,
    atol: 3e-2,
};
/// f16 ops against their formula (every intermediate rounds to 11 bits: a sum in another order
/// may round one ulp, 4.9e-4 relative, the other way, and an epilogue multiplies two such).
pub(super) const F16_TOL: Tol = Tol {
    rtol: 1e-2,
    atol: 1e-2,
};

/// Checks `got` against `want`; integer dtypes must match exactly.
pub(super) fn close(what: &str, got: &Tensor, want: &[f64], tol: Tol) -> CaseResult {
    if got.numel() != want.len() {
        return Err(fail(format!(
            "{what}: {} elements (shape {:?}), expected {}",
            got.numel(),
            got.shape(),
            want.len()
        )));
    }
    let g = vals(got);
    let eps = dtype_eps(got.dtype());
    let mut bad = Vec::new();
    for (i, (&g, &w)) in g.iter().zip(want).enumerate() {
        let ok = if got.dtype().is_integer() {
            g == w
        } else if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            !g.is_nan() && (g - w).abs() <= tol.atol + (tol.rtol + eps) * w.abs()
        };
        if !ok {
            bad.push(format!("[{i}] got {g}, want {w}"));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        let n = bad.len();
        bad.truncate(6);
        Err(fail(format!(
            "{what} ({}, {:?}): {n} of {} element(s) off (rtol {}, atol {}): {}",
            got.dtype(),
            got.shape(),
            want.len(),
            tol.rtol,
            tol.atol,
            bad.join("; ")
        )))
    }
}

pub(super) fn output<'a>(o: &'a Outputs, name: &str, k: usize) -> Result<&'a Tensor, Failure> {
    o.get(name).ok_or_else(|| {
        let have: Vec<&str> = o.tensors.iter().map(|(n, _)| n.as_str()).collect();
        fail(format!(
            "step {k}: no output '{name}' (outputs: {})",
            have.join(", ")
        ))
    })
}

/// Same outputs (names, order, dtypes, shapes) and values within `tol`.
fn same_outputs(k: usize, got: &Outputs, want: &Outputs, tol: Tol) -> CaseResult {
    let names = |o: &Outputs| -> Vec<String> { o.tensors.iter().map(|(n, _)| n.clone()).collect() };
    if names(got) != names(want) {
        return Err(fail(format!(
            "step {k}: outputs {:?}, the oracle's {:?}",
            names(got),
            names(want)
        )));
    }
    for ((name, g), (_, w)) in got.tensors.iter().zip(&want.tensors) {
        if g.dtype() != w.dtype() || g.shape() != w.shape() {
            return Err(fail(format!(
                "step {k}: output '{name}' is {} {:?}, the oracle's {} {:?}",
                g.dtype(),
                g.shape(),
                w.dtype(),
                w.shape()
            )));
        }
        let want = vals(w);
        close(
            &format!("step {k}: output '{name}' vs the oracle"),
            g,
            &want,
            tol,
        )?;
        if g.dtype() == DType::F32 {
            close_rel(
                &format!("step {k}: output '{name}' vs the oracle"),
                g,
                &want,
            )?;
        }
    }
    Ok(())
}

/// `max |got − want| / max |want| ≤ ORACLE_F32_REL` (NaN and infinities must match exactly,
/// which [`close`] has checked).
fn close_rel(what: &str, got: &Tensor, want: &[f64]) -> CaseResult {
    let g = vals(got);
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f64, |m, w| m.max(w.abs()));
    let (mut worst, mut at) = (0.0f64, 0usize);
    for (i, (&g, &w)) in g.iter().zip(want).enumerate() {
        if w.is_finite() && (g - w).abs() > worst {
            (worst, at) = ((g - w).abs(), i);
        }
    }
    if worst <= ORACLE_F32_REL * scale {
        Ok(())
    } else {
        Err(fail(format!(
            "{what}: max error {worst:e} at [{at}] (got {}, want {}) is {:e} of max |value| \
             {scale:e}; the limit is {ORACLE_F32_REL:e}",
            g[at],
            want[at],
            worst / scale
        )))
    }
}

/// Runs `steps` on the backend under test and on the oracle and compares every step.
/// Returns the backend's outputs.
pub(super) fn against_oracle(
    c: &Ctx<'_>,
    p: &Program,
    w: &WeightStore,
    steps: &[Inputs],
    tol: Tol,
) -> Result<Vec<Outputs>, Failure> {
    let want =
        run_steps(&c.oracle, &c.registry, p, w, steps).map_err(|e| fail(format!("oracle: {e}")))?;
    let got = run_steps(c.backend, &c.registry, p, w, steps)?;
    for (k, (g, o)) in got.iter().zip(&want).enumerate() {
        same_outputs(k, g, o, tol)?;
    }
    Ok(got)
}
