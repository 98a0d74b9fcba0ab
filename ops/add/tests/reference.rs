//! ADD's CPU reference against an independent f64 formula: random non-zero inputs, poisoned
//! outputs, every float dtype, ranks 0–4, and typed errors for bad calls.

use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use op_add::reference::run;
use rstest::rstest;

#[rstest]
#[case(&[], DType::F32, DType::F32)]
#[case(&[1], DType::F32, DType::F32)]
#[case(&[7], DType::F32, DType::F32)]
#[case(&[3, 5], DType::F32, DType::F32)]
#[case(&[2, 3, 4], DType::F16, DType::F32)]
#[case(&[1, 2, 3, 5], DType::BF16, DType::BF16)]
#[case(&[4, 33], DType::F32, DType::F16)]
#[case(&[1, 576], DType::BF16, DType::F32)]
#[case(&[2, 1, 1, 3], DType::I32, DType::F32)]
fn matches_f64_formula(#[case] shape: &[u64], #[case] din: DType, #[case] dout: DType) {
    let mut r = rng(shape.iter().sum::<u64>() + din as u64 * 31 + dout as u64);
    let a = random_nonzero(din, shape, &mut r, -4.0, 4.0);
    let b = random_nonzero(din, shape, &mut r, -4.0, 4.0);
    let mut out = [Tensor::poisoned(dout, shape)];
    let t = task(Opcode::ADD, 2, 1, &[]);
    call(run, &t, &[&a, &b], &mut out).unwrap();
    let want: Vec<f64> = (0..a.numel())
        .map(|i| a.get_f32(i) as f64 + b.get_f32(i) as f64)
        .collect();
    assert_close(&out[0], &want, 1e-7, 0.0);
}

#[test]
fn bad_calls_are_typed_errors() {
    let a = Tensor::zeros(DType::F32, &[4]);
    let b = Tensor::zeros(DType::F32, &[5]);
    let t = task(Opcode::ADD, 2, 1, &[]);
    let mut out = [Tensor::zeros(DType::F32, &[4])];
    assert!(matches!(
        call(run, &t, &[&a, &b], &mut out),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        call(run, &t, &[&a], &mut out),
        Err(OpError::Arity { .. })
    ));
    assert!(matches!(
        call(run, &t, &[&a, &a], &mut []),
        Err(OpError::Arity { .. })
    ));
}
