//! ALLREDUCE_SHARD's CPU reference against an independent f64 sum: 1 to 8 random non-zero
//! shards, poisoned outputs, every float dtype, ranks 0–4, viewed operands, the f32
//! summation order, and typed errors for bad calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Registry, Tensor};
use op_allreduce_shard::reference::run;
use rstest::rstest;

#[rstest]
// shards, shard shape, out shape, shard dtype, out dtype
#[case(1, &[], &[], DType::F32, DType::F32)]
#[case(2, &[1], &[1], DType::F32, DType::F16)]
#[case(3, &[7], &[7], DType::F16, DType::F32)]
#[case(4, &[3, 5], &[15], DType::BF16, DType::BF16)]
#[case(5, &[2, 3, 4], &[2, 3, 4], DType::F32, DType::BF16)]
#[case(8, &[1, 2, 3, 5], &[6, 5], DType::F16, DType::F16)]
#[case(6, &[4, 33], &[4, 33], DType::BF16, DType::F32)]
#[case(8, &[1, 2048], &[1, 2048], DType::F32, DType::F32)]
#[case(7, &[2, 1, 1, 3], &[2, 1, 1, 3], DType::F32, DType::F32)]
fn matches_f64_sum(
    #[case] n: usize,
    #[case] sin: &[u64],
    #[case] sout: &[u64],
    #[case] din: DType,
    #[case] dout: DType,
) {
    let mut r = rng(n as u64 * 1000 + sin.iter().sum::<u64>() + din as u64 * 31 + dout as u64);
    let shards: Vec<Tensor> = (0..n)
        .map(|_| random_nonzero(din, sin, &mut r, -4.0, 4.0))
        .collect();
    let ins: Vec<&Tensor> = shards.iter().collect();
    let mut out = [Tensor::poisoned(dout, sout)];
    call(
        run,
        &task(Opcode::ALLREDUCE_SHARD, n, 1, &[]),
        &ins,
        &mut out,
    )
    .unwrap();
    let want: Vec<f64> = (0..shards[0].numel())
        .map(|i| shards.iter().map(|s| s.get_f32(i) as f64).sum())
        .collect();
    // Each of the n-1 f32 additions rounds a partial sum of magnitude ≤ 4n by ≤ 2^-24·4n;
    // f16 adds its subnormal spacing.
    let f32_rounding = (n * n) as f64 * 4.0 * 2f64.powi(-24);
    let sub = if dout == DType::F16 {
        2f64.powi(-24)
    } else {
        0.0
    };
    assert_close(&out[0], &want, 0.0, f32_rounding + sub);
}

#[test]
fn sums_in_f32_in_input_order() {
    // ((1e8 + 1) + -1e8) in f32 is 0 (the 1 is lost); another order would give 1.
    let a = Tensor::from_f32(DType::F32, &[1], &[1e8]).unwrap();
    let b = Tensor::from_f32(DType::F32, &[1], &[1.0]).unwrap();
    let c = Tensor::from_f32(DType::F32, &[1], &[-1e8]).unwrap();
    let mut out = [Tensor::poisoned(DType::F32, &[1])];
    let t = task(Opcode::ALLREDUCE_SHARD, 3, 1, &[]);
    call(run, &t, &[&a, &b, &c], &mut out).unwrap();
    assert_eq!(out[0].to_f32_vec(), [0.0]);
    call(run, &t, &[&a, &c, &b], &mut out).unwrap();
    assert_eq!(out[0].to_f32_vec(), [1.0]);
}

#[test]
fn bad_calls_are_typed_errors() {
    let a = Tensor::zeros(DType::F32, &[4]);
    let b = Tensor::zeros(DType::F32, &[5]);
    let t = task(Opcode::ALLREDUCE_SHARD, 2, 1, &[]);
    let mut out = [Tensor::poisoned(DType::F32, &[4])];
    assert!(matches!(
        call(run, &t, &[&a, &a, &b], &mut out),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        call(run, &t, &[&b], &mut out),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        call(run, &t, &[], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    let nine: Vec<&Tensor> = (0..9).map(|_| &a).collect();
    assert!(matches!(
        call(run, &t, &nine, &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t, &[&a, &a], &mut []),
        Err(OpError::Arity {
            what: "outputs",
            ..
        })
    ));
    let mut two = [
        Tensor::poisoned(DType::F32, &[4]),
        Tensor::poisoned(DType::F32, &[4]),
    ];
    assert!(matches!(
        call(run, &t, &[&a, &a], &mut two),
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
        .reference(Opcode::ALLREDUCE_SHARD)
        .expect("ALLREDUCE_SHARD has a CPU reference");
    assert!(r.in_place.is_empty());
}
