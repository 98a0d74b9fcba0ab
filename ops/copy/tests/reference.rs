//! COPY's CPU reference against the plain element-wise copy: random non-zero inputs, poisoned
//! outputs, every float dtype both ways, ranks 0–4, viewed shapes (only element counts must
//! agree), exact integer copies, and typed errors for bad calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Registry, Tensor};
use op_copy::reference::run;
use rstest::rstest;

/// f16's subnormal spacing: tiny values round to a multiple of 2^-24.
fn atol(d: DType) -> f64 {
    if d == DType::F16 { 2f64.powi(-24) } else { 0.0 }
}

#[rstest]
#[case(&[], &[], DType::F32, DType::F32)]
#[case(&[1], &[1], DType::F32, DType::F16)]
#[case(&[7], &[7], DType::F16, DType::F32)]
#[case(&[3, 5], &[5, 3], DType::BF16, DType::F32)]
#[case(&[2, 3, 4], &[24], DType::F32, DType::BF16)]
#[case(&[1, 2, 3, 5], &[6, 5], DType::F16, DType::BF16)]
#[case(&[4, 33], &[4, 33], DType::BF16, DType::F16)]
#[case(&[1, 576], &[8, 72], DType::F32, DType::F32)]
#[case(&[3, 1, 1, 7], &[21], DType::I8, DType::F32)]
fn matches_plain_copy(
    #[case] sin: &[u64],
    #[case] sout: &[u64],
    #[case] din: DType,
    #[case] dout: DType,
) {
    let mut r = rng(sin.iter().sum::<u64>() * 7 + din as u64 * 31 + dout as u64);
    let x = random_nonzero(din, sin, &mut r, -100.0, 100.0);
    let mut out = [Tensor::poisoned(dout, sout)];
    let t = task(Opcode::COPY, 1, 1, &[]);
    call(run, &t, &[&x], &mut out).unwrap();
    let want: Vec<f64> = (0..x.numel()).map(|i| x.get_f32(i) as f64).collect();
    assert_close(&out[0], &want, 0.0, atol(dout));
}

#[test]
fn integer_copies_are_exact() {
    // Beyond 2^24 an f32 round trip would lose these.
    let vals = [
        16_777_217i64,
        -2_147_483_647,
        2_147_483_647,
        -3,
        0,
        123_456_789,
    ];
    let x = Tensor::from_i64(DType::I32, &[2, 3], &vals).unwrap();
    let mut out = [Tensor::poisoned(DType::I32, &[6])];
    call(run, &task(Opcode::COPY, 1, 1, &[]), &[&x], &mut out).unwrap();
    let got: Vec<i64> = (0..6).map(|i| out[0].get_i64(i)).collect();
    assert_eq!(got, vals);
}

#[test]
fn float_to_integer_truncates_and_saturates() {
    let x = Tensor::from_f32(DType::F32, &[5], &[2.7, -2.7, 300.0, -300.0, 0.5]).unwrap();
    let mut out = [Tensor::poisoned(DType::I8, &[5])];
    call(run, &task(Opcode::COPY, 1, 1, &[]), &[&x], &mut out).unwrap();
    let got: Vec<i64> = (0..5).map(|i| out[0].get_i64(i)).collect();
    assert_eq!(got, [2, -2, 127, -128, 0]);
}

#[test]
fn bad_calls_are_typed_errors() {
    let x = Tensor::zeros(DType::F32, &[2, 3]);
    let t = task(Opcode::COPY, 1, 1, &[]);
    let mut out = [Tensor::poisoned(DType::F32, &[7])];
    assert!(matches!(
        call(run, &t, &[&x], &mut out),
        Err(OpError::Shape(_))
    ));
    let mut out = [Tensor::poisoned(DType::F32, &[6])];
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
        .reference(Opcode::COPY)
        .expect("COPY has a CPU reference");
    assert!(r.in_place.is_empty());
}
