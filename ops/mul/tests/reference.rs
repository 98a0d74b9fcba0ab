//! MUL's CPU reference against an independent f64 formula: the two-input product and the
//! one-input `x * scale` (float, integer and default scale), random non-zero inputs, poisoned
//! outputs, every float dtype, ranks 0–4, viewed operands, and typed errors for bad calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Registry, Tensor};
use op_mul::reference::run;
use rstest::rstest;

/// f16's subnormal spacing: tiny values round to a multiple of 2^-24.
fn atol(d: DType) -> f64 {
    if d == DType::F16 { 2f64.powi(-24) } else { 0.0 }
}

#[rstest]
#[case(&[], &[], DType::F32, DType::F32)]
#[case(&[1], &[1], DType::F32, DType::F16)]
#[case(&[7], &[7], DType::F16, DType::F32)]
#[case(&[3, 5], &[15], DType::BF16, DType::BF16)]
#[case(&[2, 3, 4], &[4, 6], DType::F32, DType::BF16)]
#[case(&[1, 2, 3, 5], &[1, 2, 3, 5], DType::F16, DType::F16)]
#[case(&[4, 33], &[4, 33], DType::BF16, DType::F32)]
#[case(&[1, 4096], &[1, 4096], DType::F32, DType::F32)]
#[case(&[2, 1, 1, 3], &[2, 1, 1, 3], DType::I32, DType::F32)]
fn product_matches_f64_formula(
    #[case] sin: &[u64],
    #[case] sout: &[u64],
    #[case] din: DType,
    #[case] dout: DType,
) {
    let mut r = rng(sin.iter().sum::<u64>() * 17 + din as u64 * 31 + dout as u64);
    let a = random_nonzero(din, sin, &mut r, -4.0, 4.0);
    let b = random_nonzero(din, sin, &mut r, -4.0, 4.0);
    let mut out = [Tensor::poisoned(dout, sout)];
    call(run, &task(Opcode::MUL, 2, 1, &[]), &[&a, &b], &mut out).unwrap();
    let want: Vec<f64> = (0..a.numel())
        .map(|i| a.get_f32(i) as f64 * b.get_f32(i) as f64)
        .collect();
    assert_close(&out[0], &want, 1e-7, atol(dout));
}

#[rstest]
// shape, in dtype, out dtype, scale param (None = default 1.0), its value
#[case(&[], DType::F32, DType::F32, Some(Value::Float(0.125)), 0.125)]
#[case(&[9], DType::F32, DType::F32, None, 1.0)]
#[case(&[3, 5], DType::F16, DType::F32, Some(Value::Int(3)), 3.0)]
#[case(&[2, 3, 4], DType::BF16, DType::BF16, Some(Value::Float(-1.7)), -1.7)]
#[case(&[1, 2, 3, 5], DType::F32, DType::F16, Some(Value::Float(0.08838834764831845)), 0.08838834764831845)]
#[case(&[4, 33], DType::F32, DType::F32, Some(Value::Float(1e-3)), 1e-3)]
#[case(&[1, 64], DType::BF16, DType::F32, Some(Value::Int(-2)), -2.0)]
#[case(&[2, 1, 1, 3], DType::F16, DType::F16, None, 1.0)]
fn scale_matches_f64_formula(
    #[case] shape: &[u64],
    #[case] din: DType,
    #[case] dout: DType,
    #[case] scale: Option<Value>,
    #[case] s: f64,
) {
    let mut r = rng(shape.iter().sum::<u64>() * 19 + din as u64 * 31 + dout as u64);
    let x = random_nonzero(din, shape, &mut r, -4.0, 4.0);
    let params: Vec<(&str, Value)> = scale.into_iter().map(|v| ("scale", v)).collect();
    let mut out = [Tensor::poisoned(dout, shape)];
    call(run, &task(Opcode::MUL, 1, 1, &params), &[&x], &mut out).unwrap();
    let want: Vec<f64> = (0..x.numel()).map(|i| x.get_f32(i) as f64 * s).collect();
    assert_close(&out[0], &want, 1e-7, atol(dout));
}

#[test]
fn scale_is_ignored_with_two_inputs() {
    let a = Tensor::from_f32(DType::F32, &[3], &[1.5, -2.0, 3.0]).unwrap();
    let b = Tensor::from_f32(DType::F32, &[3], &[2.0, 0.25, -1.0]).unwrap();
    let t = task(Opcode::MUL, 2, 1, &[("scale", Value::Float(10.0))]);
    let mut out = [Tensor::poisoned(DType::F32, &[3])];
    call(run, &t, &[&a, &b], &mut out).unwrap();
    assert_eq!(out[0].to_f32_vec(), [3.0, -0.5, -3.0]);
}

#[test]
fn bad_calls_are_typed_errors() {
    let a = Tensor::zeros(DType::F32, &[4]);
    let b = Tensor::zeros(DType::F32, &[5]);
    let t2 = task(Opcode::MUL, 2, 1, &[]);
    let mut out = [Tensor::poisoned(DType::F32, &[4])];
    assert!(matches!(
        call(run, &t2, &[&a, &b], &mut out),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        call(run, &task(Opcode::MUL, 1, 1, &[]), &[&b], &mut out),
        Err(OpError::Shape(_))
    ));
    let bad_scale = task(Opcode::MUL, 1, 1, &[("scale", Value::Str("2".into()))]);
    assert!(matches!(
        call(run, &bad_scale, &[&a], &mut out),
        Err(OpError::BadParam { .. })
    ));
    assert!(matches!(
        call(run, &t2, &[], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t2, &[&a, &a, &a], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t2, &[&a, &a], &mut []),
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
    let r = reg.reference(Opcode::MUL).expect("MUL has a CPU reference");
    assert!(r.in_place.is_empty());
}
