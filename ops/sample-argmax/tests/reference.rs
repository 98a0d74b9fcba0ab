//! SAMPLE_ARGMAX's CPU reference against an independent argmax (max first, then the first
//! index holding it): random logits in every float dtype (bf16/f16 rows full of ties), ranks
//! 0–4, poisoned I32 outputs, explicit ties, the NaN rule (NaN never wins), and typed errors
//! (a float output is a DType error: the index is always I32).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Registry, Tensor};
use op_sample_argmax::reference::run;
use rstest::rstest;

/// Per row of `v` values: the largest non-NaN value, then the first index equal to it
/// (0 when the row is all NaN).
fn argmax_rows(x: &Tensor, v: usize) -> Vec<i64> {
    let xs = x.to_f32_vec();
    xs.chunks(v)
        .map(|row| {
            let m = row
                .iter()
                .filter(|l| !l.is_nan())
                .fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
            row.iter().position(|&l| l as f64 == m).unwrap_or(0) as i64
        })
        .collect()
}

fn argmax(x: &Tensor, out_shape: &[u64]) -> Vec<i64> {
    let mut out = [Tensor::poisoned(DType::I32, out_shape)];
    call(run, &task(Opcode::SAMPLE_ARGMAX, 1, 1, &[]), &[x], &mut out).unwrap();
    (0..out[0].numel()).map(|i| out[0].get_i64(i)).collect()
}

#[rstest]
// logits shape, out shape, logits dtype, value range (narrow ranges in bf16/f16 force ties)
#[case(&[], &[], DType::F32, 4.0)]
#[case(&[1], &[1], DType::F16, 4.0)]
#[case(&[7], &[1], DType::F32, 4.0)]
#[case(&[3, 5], &[3], DType::BF16, 4.0)]
#[case(&[2, 3, 4], &[2, 3], DType::F32, 4.0)]
#[case(&[1, 2, 3, 5], &[6], DType::F16, 4.0)]
#[case(&[4, 333], &[4], DType::BF16, 1.0)]
#[case(&[2, 1000], &[2, 1], DType::F16, 0.5)]
#[case(&[1, 32000], &[1], DType::F32, 20.0)]
#[case(&[3, 1, 1, 17], &[3, 1, 1], DType::BF16, 4.0)]
fn matches_independent_argmax(
    #[case] sx: &[u64],
    #[case] sout: &[u64],
    #[case] dx: DType,
    #[case] range: f64,
) {
    let mut r = rng(sx.iter().sum::<u64>() * 23 + dx as u64);
    let x = random_nonzero(dx, sx, &mut r, -range, range);
    let v = x.last_dim();
    assert_eq!(argmax(&x, sout), argmax_rows(&x, v));
}

#[test]
fn ties_go_to_the_lowest_index() {
    let x = Tensor::from_f32(
        DType::F32,
        &[4, 5],
        &[
            1.0,
            5.0,
            2.0,
            5.0,
            5.0, //
            -3.0,
            -3.0,
            -3.0,
            -3.0,
            -3.0, //
            0.0,
            -0.0,
            0.0,
            -1.0,
            -2.0, // -0 == 0: a tie
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
        ],
    )
    .unwrap();
    assert_eq!(argmax(&x, &[4]), [1, 0, 0, 0]);
    // Ties that only appear after rounding to bf16.
    let x = Tensor::from_f32(DType::BF16, &[1, 3], &[1.0, 1.001, 1.002]).unwrap();
    assert_eq!(argmax(&x, &[1]), [0]);
}

#[test]
fn nan_never_wins() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let x = Tensor::from_f32(
        DType::F32,
        &[5, 4],
        &[
            nan,
            1.0,
            3.0,
            3.0, // NaN first: skipped
            2.0,
            nan,
            9.0,
            nan, // NaN around the max
            nan,
            f32::NEG_INFINITY,
            nan,
            nan, // only -inf is real
            nan,
            nan,
            nan,
            nan, // no winner: 0
            -inf,
            nan,
            inf,
            inf, // +inf wins, first of them
        ],
    )
    .unwrap();
    assert_eq!(argmax(&x, &[5]), [2, 2, 1, 0, 2]);
    let h = Tensor::from_f32(DType::F16, &[1, 3], &[nan, -7.0, nan]).unwrap();
    assert_eq!(argmax(&h, &[1]), [1]);
}

#[test]
fn bad_calls_are_typed_errors() {
    let x = Tensor::zeros(DType::F32, &[3, 4]);
    let t = task(Opcode::SAMPLE_ARGMAX, 1, 1, &[]);
    // Float (or any non-I32) output: the index is always I32.
    for d in [DType::F32, DType::F16, DType::BF16, DType::I8] {
        let mut out = [Tensor::poisoned(d, &[3])];
        assert!(matches!(
            call(run, &t, &[&x], &mut out),
            Err(OpError::DType(_))
        ));
    }
    // Integer logits.
    let ix = Tensor::zeros(DType::I32, &[3, 4]);
    let mut out = [Tensor::poisoned(DType::I32, &[3])];
    assert!(matches!(
        call(run, &t, &[&ix], &mut out),
        Err(OpError::DType(_))
    ));
    // Not one index per row.
    let mut wrong = [Tensor::poisoned(DType::I32, &[4])];
    assert!(matches!(
        call(run, &t, &[&x], &mut wrong),
        Err(OpError::Shape(_))
    ));
    // Empty rows have no argmax.
    let empty = Tensor::zeros(DType::F32, &[3, 0]);
    assert!(matches!(
        call(run, &t, &[&empty], &mut out),
        Err(OpError::Shape(_))
    ));
    // Arity.
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
    assert!((0..3).all(|i| out[0].get_i64(i) == i32::MIN as i64));
}

#[test]
fn registered_with_its_reference() {
    let reg = Registry::builtin().unwrap();
    let r = reg
        .reference(Opcode::SAMPLE_ARGMAX)
        .expect("SAMPLE_ARGMAX has a CPU reference");
    assert!(r.in_place.is_empty());
}
