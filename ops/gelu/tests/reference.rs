//! GELU's CPU reference against an independent f64 exact GELU (an erf written here: a Taylor
//! series near 0 and a continued fraction for erfc in the tails, no libm): random non-zero
//! inputs, poisoned outputs, every float dtype, ranks 0–4, viewed outputs, deep negative tails
//! (where `1 + erf` cancels), and typed errors for bad calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Registry, Tensor};
use op_gelu::reference::run;
use rstest::rstest;

const FRAC_2_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;

/// erfc(z) for z ≥ 2.5 by the continued fraction
/// `erfc(z) = exp(-z²)/√π · 1/(z + (1/2)/(z + 1/(z + (3/2)/(z + …))))`, evaluated backwards.
fn erfc_cf(z: f64) -> f64 {
    let mut t = z;
    for k in (1..=120).rev() {
        t = z + (k as f64 / 2.0) / t;
    }
    (-z * z).exp() * (FRAC_2_SQRT_PI / 2.0) / t
}

/// erf(z) by its Maclaurin series `2/√π Σ (-1)^n z^(2n+1) / (n! (2n+1))` (|z| < 2.5).
fn erf_series(z: f64) -> f64 {
    let (mut sum, mut p) = (0.0f64, z); // p = (-1)^n z^(2n+1) / n!
    for n in 0..200 {
        let term = p / (2 * n + 1) as f64;
        sum += term;
        if term.abs() < 1e-18 * sum.abs() {
            break;
        }
        p *= -z * z / (n + 1) as f64;
    }
    FRAC_2_SQRT_PI * sum
}

/// `1 + erf(z)`, without cancellation in the negative tail.
fn one_plus_erf(z: f64) -> f64 {
    if z <= -2.5 {
        erfc_cf(-z)
    } else if z >= 2.5 {
        2.0 - erfc_cf(z)
    } else {
        1.0 + erf_series(z)
    }
}

fn gelu_f64(x: f64) -> f64 {
    0.5 * x * one_plus_erf(x / 2f64.sqrt())
}

/// f16's subnormal spacing: tiny values round to a multiple of 2^-24.
fn atol(d: DType) -> f64 {
    if d == DType::F16 { 2f64.powi(-24) } else { 0.0 }
}

#[test]
fn the_test_erf_is_right() {
    // Tabulated values (Abramowitz & Stegun 7.1, and erfc(5) = 1.5374597944280348e-12).
    let close = |a: f64, b: f64, tol: f64| assert!((a - b).abs() <= tol * b.abs(), "{a} vs {b}");
    close(erf_series(0.5), 0.520_499_877_813_046_5, 1e-14);
    close(erf_series(1.0), 0.842_700_792_949_714_9, 1e-14);
    close(erf_series(2.0), 0.995_322_265_018_952_7, 1e-14);
    close(erfc_cf(3.0), 2.209_049_699_858_544e-5, 1e-12);
    close(erfc_cf(5.0), 1.537_459_794_428_034_8e-12, 1e-12);
    // The two branches agree where they meet.
    close(1.0 - erf_series(2.5), erfc_cf(2.5), 1e-10);
}

#[rstest]
// in shape, out shape, in dtype, out dtype, range
#[case(&[], &[], DType::F32, DType::F32, 3.0)]
#[case(&[1], &[1], DType::F32, DType::F16, 3.0)]
#[case(&[7], &[7], DType::F16, DType::F32, 6.0)]
#[case(&[3, 5], &[15], DType::BF16, DType::F32, 6.0)]
#[case(&[2, 3, 4], &[2, 3, 4], DType::F32, DType::BF16, 6.0)]
#[case(&[1, 2, 3, 5], &[6, 5], DType::F16, DType::F16, 6.0)]
#[case(&[4, 33], &[4, 33], DType::BF16, DType::BF16, 6.0)]
#[case(&[1, 3072], &[1, 3072], DType::F32, DType::F32, 10.0)]
#[case(&[2, 1, 1, 3], &[2, 1, 1, 3], DType::F32, DType::F32, 12.0)]
fn matches_f64_formula(
    #[case] sin: &[u64],
    #[case] sout: &[u64],
    #[case] din: DType,
    #[case] dout: DType,
    #[case] range: f64,
) {
    let mut r = rng(sin.iter().sum::<u64>() * 11 + din as u64 * 31 + dout as u64);
    let x = random_nonzero(din, sin, &mut r, -range, range);
    let mut out = [Tensor::poisoned(dout, sout)];
    call(run, &task(Opcode::GELU, 1, 1, &[]), &[&x], &mut out).unwrap();
    let want: Vec<f64> = (0..x.numel())
        .map(|i| gelu_f64(x.get_f32(i) as f64))
        .collect();
    assert_close(&out[0], &want, 1e-6, atol(dout));
}

#[test]
fn negative_tail_keeps_relative_precision() {
    // 1 + erf(x/√2) cancels here; the result must still be accurate to f32 precision.
    let xs = [-4.0f32, -5.0, -6.5, -8.0, -9.5, -12.0];
    let x = Tensor::from_f32(DType::F32, &[6], &xs).unwrap();
    let mut out = [Tensor::poisoned(DType::F32, &[6])];
    call(run, &task(Opcode::GELU, 1, 1, &[]), &[&x], &mut out).unwrap();
    let want: Vec<f64> = xs.iter().map(|&v| gelu_f64(v as f64)).collect();
    assert_close(&out[0], &want, 1e-6, 0.0);
    assert!(out[0].to_f32_vec().iter().all(|&v| v < 0.0));
}

#[test]
fn bad_calls_are_typed_errors() {
    let x = Tensor::zeros(DType::F32, &[4]);
    let t = task(Opcode::GELU, 1, 1, &[]);
    let mut out = [Tensor::poisoned(DType::F32, &[5])];
    assert!(matches!(
        call(run, &t, &[&x], &mut out),
        Err(OpError::Shape(_))
    ));
    let mut out = [Tensor::poisoned(DType::F32, &[4])];
    assert!(matches!(
        call(run, &t, &[], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t, &[&x, &x], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t, &[&x], &mut []),
        Err(OpError::Arity {
            what: "outputs",
            ..
        })
    ));
    assert!(out[0].to_f32_vec().iter().all(|v| v.is_nan()));
}

#[test]
fn registered_with_its_reference() {
    let reg = Registry::builtin().unwrap();
    let r = reg
        .reference(Opcode::GELU)
        .expect("GELU has a CPU reference");
    assert!(r.in_place.is_empty());
}
