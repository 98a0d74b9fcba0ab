//! Test support shared by the linear ops' suites (GEMV_TILE here, GEMM_TILE beside it): a
//! tile checker against an f64 dot product, and random quantised weights whose real values
//! are computed from the raw integers drawn — independently of the reference code.
#![allow(clippy::unwrap_used, clippy::panic)] // test support: a bad case should abort the test

use amk_core::sim::SplitMix;
use amk_core::testkit::{dtype_eps, random_nonzero};
use amk_core::{DType, Tensor};
use std::ops::Range;

/// Asserts `out` (rows of its last dim) holds `Σ_k x[m,k]·w[n,k] (+ bias[n])` on the tile
/// `rows × cols`, within a rigorous fp32-accumulation bound plus the output dtype's rounding,
/// and NaN (never written) everywhere else.
pub fn check_tile(
    out: &Tensor,
    x: &Tensor,
    w: &[f64],
    bias: Option<&[f64]>,
    k: usize,
    cols: Range<usize>,
    rows: Range<usize>,
) {
    let ldo = out.last_dim();
    let eps = dtype_eps(out.dtype());
    let mut written = 0;
    for i in 0..out.numel() {
        let (m, n) = (i / ldo, i % ldo);
        let got = out.get_f32(i) as f64;
        if rows.contains(&m) && cols.contains(&n) {
            let (mut want, mut mag) = (0.0f64, 0.0f64);
            for kk in 0..k {
                let t = x.get_f32(m * k + kk) as f64 * w[n * k + kk];
                want += t;
                mag += t.abs();
            }
            if let Some(b) = bias {
                want += b[n];
                mag += b[n].abs();
            }
            let tol = 2.0 * (k + 3) as f64 * 2f64.powi(-24) * mag + eps * want.abs() + 6e-8;
            assert!(
                (got - want).abs() <= tol,
                "out[{m}, {n}]: got {got}, want {want} (err {:.3e} > tol {tol:.3e}, {})",
                (got - want).abs(),
                out.dtype()
            );
            written += 1;
        } else {
            assert!(
                got.is_nan(),
                "out[{m}, {n}] is outside the tile but was written ({got})"
            );
        }
    }
    assert_eq!(written, rows.len() * cols.len());
}

/// Every element of `t` as f64.
pub fn as_f64(t: &Tensor) -> Vec<f64> {
    (0..t.numel()).map(|i| t.get_f32(i) as f64).collect()
}

/// Random quantised weights `[n, k]`: the raw integers are drawn here, and the real weights
/// are computed here from them: `(q − zero)·scale`, `zero` = 8 for symmetric int4, 0 for
/// symmetric int8. Returns `[qW, scales(, zeros)]` and the real weights.
pub fn quant_weights(
    r: &mut SplitMix,
    qdtype: i64,
    asym: bool,
    n: usize,
    k: usize,
    group: usize,
    sd: DType,
) -> (Vec<Tensor>, Vec<f64>) {
    let (lo, hi, wd) = match (qdtype, asym) {
        (7, _) => (0i64, 15i64, DType::I4),
        (6, false) => (-128, 127, DType::I8),
        (6, true) => (0, 255, DType::U8),
        _ => panic!("bad test case"),
    };
    let qv: Vec<i64> = (0..n * k)
        .map(|_| lo + (r.next() % (hi - lo + 1) as u64) as i64)
        .collect();
    let ng = k.div_ceil(group);
    let q = Tensor::from_i64(wd, &[n as u64, k as u64], &qv).unwrap();
    let scales = random_nonzero(sd, &[n as u64, ng as u64], r, -0.1, 0.1);
    let zeros = asym.then(|| random_nonzero(sd, &[n as u64, ng as u64], r, 0.0, hi as f64));
    let sym_zero = if qdtype == 7 { 8.0 } else { 0.0 };
    let mut real = vec![0.0f64; n * k];
    for row in 0..n {
        for c in 0..k {
            let g = row * ng + c / group;
            let z = zeros.as_ref().map_or(sym_zero, |z| z.get_f32(g) as f64);
            real[row * k + c] = (qv[row * k + c] as f64 - z) * scales.get_f32(g) as f64;
        }
    }
    let mut ts = vec![q, scales];
    ts.extend(zeros);
    (ts, real)
}
