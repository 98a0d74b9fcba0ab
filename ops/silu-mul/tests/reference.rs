//! SILU_MUL's CPU reference against an independent f64 formula: random non-zero inputs,
//! poisoned outputs, every float dtype, ranks 0–4, viewed operands (only element counts must
//! agree), and typed errors for bad calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Registry, Tensor};
use op_silu_mul::reference::run;
use rstest::rstest;

/// f16's subnormal spacing: tiny values round to a multiple of 2^-24.
fn atol(d: DType) -> f64 {
    if d == DType::F16 { 2f64.powi(-24) } else { 0.0 }
}

/// `silu(g) * u` with the logistic written as `g * sigmoid(g)`, sigmoid via `tanh`.
fn silu_mul_f64(g: f64, u: f64) -> f64 {
    g * (0.5 + 0.5 * (0.5 * g).tanh()) * u
}

#[rstest]
// gate shape, up shape, out shape, gate dtype, up dtype, out dtype
#[case(&[], &[], &[], DType::F32, DType::F32, DType::F32)]
#[case(&[1], &[1], &[1], DType::F32, DType::F32, DType::F16)]
#[case(&[7], &[7], &[7], DType::F16, DType::F16, DType::F32)]
#[case(&[3, 5], &[15], &[5, 3], DType::BF16, DType::F32, DType::F32)]
#[case(&[2, 3, 4], &[2, 3, 4], &[2, 3, 4], DType::F32, DType::BF16, DType::BF16)]
#[case(&[1, 2, 3, 5], &[1, 2, 3, 5], &[30], DType::F16, DType::F32, DType::F16)]
#[case(&[4, 33], &[4, 33], &[4, 33], DType::BF16, DType::BF16, DType::BF16)]
#[case(&[1, 8192], &[1, 8192], &[1, 8192], DType::F32, DType::F32, DType::F32)]
#[case(&[2, 1, 1, 3], &[6], &[2, 1, 1, 3], DType::F32, DType::F16, DType::F32)]
fn matches_f64_formula(
    #[case] sg: &[u64],
    #[case] su: &[u64],
    #[case] so: &[u64],
    #[case] dg: DType,
    #[case] du: DType,
    #[case] dout: DType,
) {
    let mut r = rng(sg.iter().sum::<u64>() * 5 + dg as u64 * 31 + du as u64 * 7 + dout as u64);
    // Wide enough for the saturated tails of the logistic on both sides.
    let g = random_nonzero(dg, sg, &mut r, -12.0, 12.0);
    let u = random_nonzero(du, su, &mut r, -4.0, 4.0);
    let mut out = [Tensor::poisoned(dout, so)];
    call(run, &task(Opcode::SILU_MUL, 2, 1, &[]), &[&g, &u], &mut out).unwrap();
    let want: Vec<f64> = (0..g.numel())
        .map(|i| silu_mul_f64(g.get_f32(i) as f64, u.get_f32(i) as f64))
        .collect();
    assert_close(&out[0], &want, 1e-6, atol(dout));
}

#[test]
fn extreme_gates_do_not_overflow() {
    // exp(-g) overflows f32 for g < -88.7: silu(g) is then -0, never NaN.
    let g = Tensor::from_f32(DType::F32, &[4], &[-100.0, -1000.0, 100.0, 0.0]).unwrap();
    let u = Tensor::from_f32(DType::F32, &[4], &[2.0, 2.0, 2.0, 2.0]).unwrap();
    let mut out = [Tensor::poisoned(DType::F32, &[4])];
    call(run, &task(Opcode::SILU_MUL, 2, 1, &[]), &[&g, &u], &mut out).unwrap();
    assert_eq!(out[0].to_f32_vec(), [0.0, 0.0, 200.0, 0.0]);
}

#[test]
fn bad_calls_are_typed_errors() {
    let a = Tensor::zeros(DType::F32, &[4]);
    let b = Tensor::zeros(DType::F32, &[5]);
    let t = task(Opcode::SILU_MUL, 2, 1, &[]);
    let mut out = [Tensor::poisoned(DType::F32, &[4])];
    assert!(matches!(
        call(run, &t, &[&a, &b], &mut out),
        Err(OpError::Shape(_))
    ));
    let mut out5 = [Tensor::poisoned(DType::F32, &[5])];
    assert!(matches!(
        call(run, &t, &[&a, &a], &mut out5),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        call(run, &t, &[&a], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t, &[&a, &a, &a], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t, &[&a, &a], &mut []),
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
        .reference(Opcode::SILU_MUL)
        .expect("SILU_MUL has a CPU reference");
    assert!(r.in_place.is_empty());
}
