//! SOFTMAX's CPU reference against an independent f64 formula: ranks 0–4, every axis in
//! positive and negative form, the default axis, large offsets (stability), every float
//! dtype, and typed errors for bad calls. Inputs are fresh random non-zero values, outputs
//! are poisoned before the call.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Task, Tensor};
use op_softmax::reference::run;
use rstest::rstest;

fn softmax_task(dim: Option<i64>) -> Task {
    match dim {
        Some(d) => task(Opcode::SOFTMAX, 1, 1, &[("dim", Value::Int(d))]),
        None => task(Opcode::SOFTMAX, 1, 1, &[]),
    }
}

/// Naive f64 softmax of `x` (row-major, `shape`) along `axis`: walk every element, gather
/// the elements that share all its other coordinates, and normalise.
fn naive(x: &Tensor, shape: &[u64], axis: usize) -> Vec<f64> {
    let n = x.numel();
    if shape.is_empty() {
        return vec![1.0; n];
    }
    let stride: usize = shape[axis + 1..].iter().product::<u64>() as usize;
    let len = shape[axis] as usize;
    (0..n)
        .map(|i| {
            let coord = (i / stride) % len;
            let first = i - coord * stride;
            let line: Vec<f64> = (0..len)
                .map(|j| x.get_f32(first + j * stride) as f64)
                .collect();
            let m = line.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = line.iter().map(|v| (v - m).exp()).sum();
            (x.get_f32(i) as f64 - m).exp() / z
        })
        .collect()
}

#[rstest]
// Rank 0 (a single element is 1), ranks 1–4, default and explicit axes.
#[case(&[], None, &[], 0.0, DType::F32, DType::F32)]
#[case(&[], Some(0), &[1], 0.0, DType::F32, DType::F32)]
#[case(&[1], None, &[1], 0.0, DType::F32, DType::F32)]
#[case(&[7], Some(0), &[7], 0.0, DType::F32, DType::F32)]
#[case(&[3, 5], None, &[3, 5], 0.0, DType::F32, DType::F32)]
#[case(&[3, 5], Some(0), &[15], 0.0, DType::F32, DType::F32)]
#[case(&[2, 3, 4], Some(1), &[2, 3, 4], 0.0, DType::F32, DType::F32)]
#[case(&[2, 3, 4], Some(-3), &[6, 4], 0.0, DType::F32, DType::F32)]
#[case(&[2, 1, 3, 5], Some(2), &[2, 1, 3, 5], 0.0, DType::F32, DType::F32)]
#[case(&[2, 1, 3, 5], Some(-1), &[30], 0.0, DType::F32, DType::F32)]
#[case(&[2, 1, 3, 5], Some(1), &[2, 1, 3, 5], 0.0, DType::F32, DType::F32)]
// A zero-sized axis: nothing to write, and no panic.
#[case(&[2, 0, 3], Some(1), &[0], 0.0, DType::F32, DType::F32)]
// Stability: logits near +1000 and -1000 (a naive exp overflows or underflows).
#[case(&[4, 33], None, &[4, 33], 1000.0, DType::F32, DType::F32)]
#[case(&[4, 33], Some(0), &[4, 33], -1000.0, DType::F32, DType::F32)]
// Half-precision operands, cast on store; a vocabulary-sized row.
#[case(&[2, 64], None, &[2, 64], 0.0, DType::F16, DType::F16)]
#[case(&[3, 8, 5], Some(-2), &[3, 8, 5], 0.0, DType::BF16, DType::F32)]
#[case(&[1, 2048], None, &[1, 2048], 0.0, DType::F32, DType::BF16)]
fn matches_f64_formula(
    #[case] shape: &[u64],
    #[case] dim: Option<i64>,
    #[case] out_shape: &[u64],
    #[case] offset: f64,
    #[case] din: DType,
    #[case] dout: DType,
) {
    let mut r =
        rng(shape.iter().product::<u64>() * 13 + (dim.unwrap_or(9) + 16) as u64 + din as u64);
    let mut x = random_nonzero(din, shape, &mut r, -6.0, 6.0);
    if offset != 0.0 {
        for i in 0..x.numel() {
            x.set_f32(i, x.get_f32(i) + offset as f32);
        }
    }
    let mut out = [Tensor::poisoned(dout, out_shape)];
    call(run, &softmax_task(dim), &[&x], &mut out).unwrap();
    let rank = shape.len().max(1) as i64;
    let d = dim.unwrap_or(-1);
    let axis = if d < 0 { d + rank } else { d } as usize;
    let want = naive(&x, shape, axis);
    assert_close(&out[0], &want, 1e-5, 1e-7);
}

#[test]
fn bad_calls_are_typed_errors() {
    let mut r = rng(21);
    let x = random_nonzero(DType::F32, &[3, 4], &mut r, -1.0, 1.0);
    let scalar = random_nonzero(DType::F32, &[], &mut r, -1.0, 1.0);
    let go = |t: &Task, ins: &[&Tensor], out_shape: &[u64]| {
        let mut out = [Tensor::poisoned(DType::F32, out_shape)];
        call(run, t, ins, &mut out)
    };
    assert!(go(&softmax_task(None), &[&x], &[12]).is_ok());
    // Arity.
    assert!(matches!(
        go(&softmax_task(None), &[], &[12]),
        Err(OpError::Arity { .. })
    ));
    assert!(matches!(
        go(&softmax_task(None), &[&x, &x], &[12]),
        Err(OpError::Arity { .. })
    ));
    assert!(matches!(
        call(run, &softmax_task(None), &[&x], &mut []),
        Err(OpError::Arity { .. })
    ));
    // dim outside [-rank, rank) (rank 0 counts as rank 1), or not an integer.
    for (t, d) in [(&x, 2), (&x, -3), (&x, 100), (&scalar, 1), (&scalar, -2)] {
        let n = t.numel() as u64;
        assert!(matches!(
            go(&softmax_task(Some(d)), &[t], &[n]),
            Err(OpError::BadParam { .. })
        ));
    }
    let t = task(Opcode::SOFTMAX, 1, 1, &[("dim", Value::Float(1.0))]);
    assert!(matches!(
        go(&t, &[&x], &[12]),
        Err(OpError::BadParam { .. })
    ));
    // Output size.
    assert!(matches!(
        go(&softmax_task(None), &[&x], &[11]),
        Err(OpError::Shape(_))
    ));
}
