//! LOGIT_STATS's CPU reference against a naive model written here (each slot's ids listed,
//! the maximum by a fold over (value, id) pairs, the count by a filter, the sum of exps in
//! f64): random rows in every float dtype and slot layouts that leave a short last slot, NaN
//! and infinite logits, the vocabulary limit, poisoned outputs that only the task's columns
//! overwrite, the merge of every slot against the whole row, and typed errors (nothing
//! written) and the validator's shape rule.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::too_many_arguments)] // rstest cases spell every operand out

use amk_core::json::Value;
use amk_core::testkit::{buffer, call, rng, shape_rule_kinds, task};
use amk_core::{DType, ErrorKind, OpError, Opcode, Tensor};
use op_logit_stats::reference::{merged, run};
use op_logit_stats::{ROW_COUNT, ROW_FIRST, ROW_MAX, ROW_SUM, SPEC, Summary};
use rstest::rstest;

/// One slot as the naive model sees it: (first id of the maximum, maximum, count, sum).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Naive {
    first: i64,
    max: f32,
    count: i64,
    sum: f64,
}

/// The naive summary of ids `ids` of `row`.
fn naive(row: &[f32], ids: std::ops::Range<usize>) -> Naive {
    let valid: Vec<(usize, f32)> = ids
        .map(|i| (i, row[i]))
        .filter(|(_, l)| !l.is_nan())
        .collect();
    let best = valid
        .iter()
        .copied()
        .fold(None::<(usize, f32)>, |b, (i, l)| match b {
            Some((_, bl)) if bl >= l => b,
            _ => Some((i, l)),
        });
    let (first, max) = best.map_or((-1, f32::NEG_INFINITY), |(i, l)| (i as i64, l));
    let sum = if first >= 0 && max.is_finite() {
        valid
            .iter()
            .map(|&(_, l)| (l as f64 - max as f64).exp())
            .sum()
    } else {
        0.0
    };
    Naive {
        first,
        max,
        count: valid.len() as i64,
        sum,
    }
}

fn limits(vocab_limit: i64) -> Tensor {
    Tensor::from_i64(DType::I32, &[6], &[0, 100, 0, 0, 0, vocab_limit]).unwrap()
}

fn params(cols: i64, n_off: i64, n_tile: i64) -> Vec<(&'static str, Value)> {
    vec![
        ("cols", Value::Int(cols)),
        ("n_off", Value::Int(n_off)),
        ("N_tile", Value::Int(n_tile)),
    ]
}

/// Runs one task over `out` (poisoned by the caller).
fn stats_into(
    logits: &Tensor,
    vocab_limit: i64,
    p: &[(&str, Value)],
    out: &mut [Tensor; 1],
) -> Result<(), OpError> {
    call(
        run,
        &task(Opcode::LOGIT_STATS, 2, 1, p),
        &[logits, &limits(vocab_limit)],
        out,
    )
}

/// Every slot of `cols` logits, one task a slot.
fn all_slots(logits: &Tensor, cols: usize, vocab_limit: i64) -> Tensor {
    let g = logits.numel().div_ceil(cols);
    let mut out = [Tensor::poisoned(DType::I32, &[4, g as u64])];
    for s in 0..g {
        stats_into(
            logits,
            vocab_limit,
            &params(cols as i64, s as i64, 1),
            &mut out,
        )
        .unwrap();
    }
    let [out] = out;
    out
}

/// Column `g`'s words as the naive model's fields.
fn column(stats: &Tensor, g: usize) -> Naive {
    let slots = stats.last_dim();
    let w = |r: usize| stats.get_i64(r * slots + g);
    Naive {
        first: w(ROW_FIRST),
        max: f32::from_bits(w(ROW_MAX) as i32 as u32),
        count: w(ROW_COUNT),
        sum: f32::from_bits(w(ROW_SUM) as i32 as u32) as f64,
    }
}

fn assert_slot(got: Naive, want: Naive, at: &str) {
    assert_eq!(
        (got.first, got.max.to_bits(), got.count),
        (want.first, want.max.to_bits(), want.count),
        "{at}: got {got:?}, want {want:?}"
    );
    assert!(
        (got.sum - want.sum).abs() <= 1e-7 * want.sum.abs().max(1.0),
        "{at}: sum {} against {}",
        got.sum,
        want.sum
    );
}

#[rstest]
#[case(DType::F32, 1, 1)]
#[case(DType::BF16, 7, 3)]
#[case(DType::F16, 1000, 64)]
#[case(DType::F32, 1000, 1000)]
#[case(DType::BF16, 49152, 384)]
#[case(DType::F16, 32000, 248)]
#[case(DType::BF16, 128256, 976)]
fn every_slot_matches_the_naive_model(#[case] dtype: DType, #[case] v: u64, #[case] cols: usize) {
    let logits = Tensor::random(dtype, &[1, v], &mut rng(v), -12.0, 12.0);
    let stats = all_slots(&logits, cols, 0);
    let row = logits.to_f32_vec();
    for g in 0..stats.last_dim() {
        let ids = g * cols..((g + 1) * cols).min(v as usize);
        assert_slot(column(&stats, g), naive(&row, ids), &format!("slot {g}"));
    }
}

#[rstest]
#[case(&[1.0, 5.0, 2.0, 5.0, 5.0, 0.0], 2)]
#[case(&[f32::NAN, 1.0, 3.0, 3.0, f32::NAN, 3.0], 4)]
#[case(&[f32::NAN; 6], 4)]
#[case(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY, 1.0, -2.0, 1.0], 3)]
#[case(&[f32::NEG_INFINITY, f32::INFINITY, 2.0, f32::INFINITY, f32::NAN, 0.5], 2)]
#[case(&[0.0, -0.0, 0.0, -1.0, -0.0, 7.0], 5)]
fn ties_nans_and_infinities(#[case] row: &[f32], #[case] cols: usize) {
    let logits = Tensor::from_f32(DType::F32, &[row.len() as u64], row).unwrap();
    let stats = all_slots(&logits, cols, 0);
    for g in 0..stats.last_dim() {
        let ids = g * cols..((g + 1) * cols).min(row.len());
        assert_slot(column(&stats, g), naive(row, ids), &format!("slot {g}"));
    }
    let whole = Summary::of(row, 0);
    let m = merged(&stats);
    assert_eq!(
        (m.first, m.max.to_bits(), m.count),
        (whole.first, whole.max.to_bits(), whole.count)
    );
    assert!((m.sum_exp - whole.sum_exp).abs() <= 1e-6 * whole.sum_exp.max(1.0));
}

#[rstest]
#[case(1000, 100, 0, 1000)]
#[case(1000, 100, 650, 650)]
#[case(1000, 100, 599, 599)]
#[case(1000, 100, 1, 1)]
#[case(1000, 100, 5000, 1000)]
#[case(1000, 100, -3, 1000)]
fn ids_beyond_the_vocabulary_limit_take_no_part(
    #[case] v: u64,
    #[case] cols: usize,
    #[case] limit: i64,
    #[case] vp: usize,
) {
    let logits = Tensor::random(DType::BF16, &[v], &mut rng(limit as u64), -8.0, 8.0);
    let stats = all_slots(&logits, cols, limit);
    let row = logits.to_f32_vec();
    for g in 0..stats.last_dim() {
        let ids = (g * cols).min(vp)..((g + 1) * cols).min(vp);
        assert_slot(column(&stats, g), naive(&row, ids), &format!("slot {g}"));
    }
    let m = merged(&stats);
    assert_eq!(m.count, vp as u64);
    let whole = naive(&row, 0..vp);
    assert_eq!(m.first.map_or(-1, |i| i as i64), whole.first);
}

/// The merge of every slot is the whole row's summary: the same maximum, first id and count,
/// the sum within the f32 rounding of the slots' sums.
#[rstest]
#[case(DType::BF16, 49152, 384, 3)]
#[case(DType::F32, 5000, 39, 4)]
#[case(DType::F16, 128256, 972, 5)]
fn merged_slots_are_the_whole_row(
    #[case] dtype: DType,
    #[case] v: u64,
    #[case] cols: usize,
    #[case] seed: u64,
) {
    let mut logits = Tensor::random(dtype, &[v], &mut rng(seed), -20.0, 20.0);
    // a tie for the maximum across two slots: the lower id must win
    logits.set_f32(7 * cols + 3, 30.0);
    logits.set_f32(2 * cols + 1, 30.0);
    let stats = all_slots(&logits, cols, 0);
    let row = logits.to_f32_vec();
    let m = merged(&stats);
    let whole = naive(&row, 0..v as usize);
    assert_eq!(m.first, Some(2 * cols + 1));
    assert_eq!(
        (m.first.map_or(-1, |i| i as i64), m.max, m.count as i64),
        (whole.first, whole.max, whole.count)
    );
    assert!(
        (m.sum_exp - whole.sum).abs() <= 1e-6 * whole.sum,
        "merged sum {} against {}",
        m.sum_exp,
        whole.sum
    );
}

#[test]
fn a_task_writes_its_slots_only() {
    let logits = Tensor::random(DType::F32, &[100], &mut rng(9), -4.0, 4.0);
    let mut out = [Tensor::poisoned(DType::I32, &[4, 10])];
    stats_into(&logits, 0, &params(10, 3, 4), &mut out).unwrap();
    let row = logits.to_f32_vec();
    for g in 0..10 {
        for r in 0..4 {
            let w = out[0].get_i64(r * 10 + g);
            if (3..7).contains(&g) {
                assert_ne!(w, i32::MIN as i64, "slot {g} row {r} not written");
            } else {
                assert_eq!(w, i32::MIN as i64, "slot {g} row {r} written");
            }
        }
        if (3..7).contains(&g) {
            assert_slot(column(&out[0], g), naive(&row, g * 10..g * 10 + 10), "slot");
        }
    }
}

fn err_of(logits: &Tensor, out_shape: &[u64], out_dtype: DType, p: &[(&str, Value)]) -> OpError {
    let mut out = [Tensor::poisoned(out_dtype, out_shape)];
    let bits = |t: &Tensor| {
        format!(
            "{:?}",
            t.to_f32_vec()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        )
    };
    let before = bits(&out[0]);
    let e = stats_into(logits, 0, p, &mut out).unwrap_err();
    assert_eq!(bits(&out[0]), before, "an erroring call wrote");
    e
}

#[test]
fn bad_operands_and_params_are_typed_errors_that_write_nothing() {
    let x = Tensor::random(DType::F32, &[100], &mut rng(1), -1.0, 1.0);
    let bad_param = |e: OpError, key: &str| match e {
        OpError::BadParam { key: k, .. } => assert_eq!(k, key),
        other => panic!("want a bad {key}, got {other:?}"),
    };
    bad_param(err_of(&x, &[4, 10], DType::I32, &params(9, 0, 1)), "cols");
    bad_param(err_of(&x, &[4, 10], DType::I32, &params(12, 0, 1)), "cols");
    bad_param(err_of(&x, &[4, 10], DType::I32, &params(0, 0, 1)), "cols");
    bad_param(
        err_of(&x, &[4, 10], DType::I32, &params(10, 8, 3)),
        "N_tile",
    );
    bad_param(
        err_of(&x, &[4, 10], DType::I32, &params(10, -1, 1)),
        "n_off",
    );
    assert!(matches!(
        err_of(&x, &[3, 10], DType::I32, &params(10, 0, 1)),
        OpError::Shape(_)
    ));
    assert!(matches!(
        err_of(&x, &[4, 10], DType::F32, &params(10, 0, 1)),
        OpError::DType(_)
    ));
    let ints = Tensor::from_i64(DType::I32, &[100], &[1; 100]).unwrap();
    assert!(matches!(
        err_of(&ints, &[4, 10], DType::I32, &params(10, 0, 1)),
        OpError::DType(_)
    ));
    let rows = Tensor::random(DType::F32, &[2, 50], &mut rng(2), -1.0, 1.0);
    assert!(matches!(
        err_of(&rows, &[4, 10], DType::I32, &params(10, 0, 1)),
        OpError::Shape(_)
    ));
    let mut out = [Tensor::poisoned(DType::I32, &[4, 10])];
    let short = Tensor::from_i64(DType::I32, &[5], &[0; 5]).unwrap();
    let e = call(
        run,
        &task(Opcode::LOGIT_STATS, 2, 1, &params(10, 0, 1)),
        &[&x, &short],
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(e, OpError::Shape(_)), "{e:?}");
}

/// The validator's shape rule: what the reference refuses, the rule refuses before a launch.
#[rstest]
#[case(&[1, 100], DType::BF16, &[4, 10], DType::I32, 10, 0, 1, &[])]
#[case(&[100], DType::F32, &[4, 10], DType::I32, 10, 9, 1, &[])]
#[case(&[100], DType::F32, &[4, 10], DType::I32, 9, 0, 1, &[ErrorKind::ShapeMismatch])]
#[case(&[100], DType::F32, &[4, 10], DType::I32, 12, 0, 1, &[ErrorKind::ShapeMismatch])]
#[case(&[100], DType::F32, &[4, 10], DType::I32, 10, 9, 2, &[ErrorKind::TileOutOfBounds])]
#[case(&[100], DType::F32, &[3, 10], DType::I32, 10, 0, 1, &[ErrorKind::ShapeMismatch])]
#[case(&[100], DType::F32, &[4, 10], DType::F32, 10, 0, 1, &[ErrorKind::ShapeMismatch])]
#[case(&[2, 50], DType::F32, &[4, 10], DType::I32, 10, 0, 1, &[ErrorKind::ShapeMismatch])]
#[case(&[100], DType::I32, &[4, 10], DType::I32, 10, 0, 1, &[ErrorKind::ShapeMismatch])]
fn the_shape_rule(
    #[case] x_shape: &[u64],
    #[case] x_dtype: DType,
    #[case] out_shape: &[u64],
    #[case] out_dtype: DType,
    #[case] cols: i64,
    #[case] n_off: i64,
    #[case] n_tile: i64,
    #[case] want: &[ErrorKind],
) {
    let mut t = task(Opcode::LOGIT_STATS, 2, 1, &params(cols, n_off, n_tile));
    t.outputs = vec![2];
    let bufs = [
        buffer(0, x_dtype, x_shape),
        buffer(1, DType::I32, &[6]),
        buffer(2, out_dtype, out_shape),
    ];
    assert_eq!(shape_rule_kinds(&SPEC, &t, &bufs), want);
}
