//! TOKEN_NLL's CPU reference against an independent formula (`ln Σ exp(x) - x[t]` summed
//! without a shift, in f64, over moderate logits): random logits in every float dtype and
//! rank, random targets, poisoned F32 outputs, row tiles that write their rows only, and typed
//! errors (a target outside the vocabulary, float targets, a wrong output, partial tile params).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use op_token_nll::reference::run;
use rstest::rstest;

/// Each row's `ln Σ exp(x) - x[t]`, unshifted, in f64.
fn nll_rows(x: &Tensor, targets: &[i64]) -> Vec<f64> {
    let v = x.last_dim();
    let xs = x.to_f32_vec();
    xs.chunks(v)
        .zip(targets)
        .map(|(row, &t)| {
            let s: f64 = row.iter().map(|&l| (l as f64).exp()).sum();
            s.ln() - row[t as usize] as f64
        })
        .collect()
}

fn targets_for(rows: usize, vocab: usize, seed: u64) -> Vec<i64> {
    (0..rows as u64)
        .map(|r| ((r * 7919 + seed * 31) % vocab as u64) as i64)
        .collect()
}

fn ints(values: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I32, &[values.len() as u64], values).unwrap()
}

fn tile(m_off: i64, m_tile: i64) -> Vec<(&'static str, Value)> {
    vec![
        ("m_off", Value::Int(m_off)),
        ("M_tile", Value::Int(m_tile)),
        ("n_off", Value::Int(0)),
        ("N_tile", Value::Int(1)),
    ]
}

fn nll(x: &Tensor, t: &Tensor, params: &[(&str, Value)], rows: u64) -> Result<Tensor, OpError> {
    let mut out = [Tensor::poisoned(DType::F32, &[rows])];
    call(
        run,
        &task(Opcode::TOKEN_NLL, 2, 1, params),
        &[x, t],
        &mut out,
    )?;
    let [out] = out;
    Ok(out)
}

#[rstest]
#[case(&[], DType::F32)]
#[case(&[9], DType::F16)]
#[case(&[3, 5], DType::BF16)]
#[case(&[2, 3, 40], DType::F32)]
#[case(&[4, 333], DType::BF16)]
#[case(&[2, 1000], DType::F16)]
#[case(&[3, 1, 4096], DType::F32)]
fn matches_the_formula(#[case] shape: &[u64], #[case] dtype: DType) {
    let mut r = rng(shape.iter().sum::<u64>() * 13 + dtype as u64);
    let x = random_nonzero(dtype, shape, &mut r, -8.0, 8.0);
    let vocab = x.last_dim();
    let rows = x.numel() / vocab;
    let targets = targets_for(rows, vocab, 3);
    let got = nll(&x, &ints(&targets), &[], rows as u64).unwrap();
    assert_close(&got, &nll_rows(&x, &targets), 1e-6, 1e-6);
}

#[test]
fn a_row_tile_writes_its_rows_only() {
    let mut r = rng(5);
    let x = random_nonzero(DType::BF16, &[6, 77], &mut r, -4.0, 4.0);
    let targets = targets_for(6, 77, 1);
    let got = nll(&x, &ints(&targets), &tile(2, 3), 6).unwrap();
    let want = nll_rows(&x, &targets);
    for (row, w) in want.iter().enumerate() {
        let v = got.get_f32(row) as f64;
        match row {
            2..=4 => assert!((v - w).abs() < 1e-5, "row {row}: {v} vs {w}"),
            _ => assert!(v.is_nan(), "row {row} outside the tile was written: {v}"),
        }
    }
}

#[test]
fn a_large_logit_does_not_overflow() {
    // exp(1000) is inf in f64: the reference must shift by the row's largest value.
    let x = Tensor::from_f32(DType::F32, &[1, 3], &[1000.0, 999.0, 0.0]).unwrap();
    let got = nll(&x, &ints(&[1]), &[], 1).unwrap();
    let want = (1.0f64 + (-1.0f64).exp() + (-1000.0f64).exp()).ln() + 1.0;
    assert!((got.get_f32(0) as f64 - want).abs() < 1e-6);
}

#[rstest]
#[case::negative(-1)]
#[case::past_the_vocabulary(5)]
fn a_target_outside_the_vocabulary_is_an_index_error(#[case] bad: i64) {
    let x = Tensor::from_f32(DType::F32, &[2, 5], &[0.5; 10]).unwrap();
    let err = nll(&x, &ints(&[0, bad]), &[], 2).unwrap_err();
    assert!(
        matches!(err, OpError::IndexOutOfRange { at: 1, value, limit: 5 } if value == bad),
        "{err}"
    );
}

#[test]
fn float_targets_are_a_dtype_error() {
    let x = Tensor::from_f32(DType::F32, &[2, 5], &[0.5; 10]).unwrap();
    let t = Tensor::from_f32(DType::F32, &[2], &[0.0, 1.0]).unwrap();
    assert!(matches!(nll(&x, &t, &[], 2), Err(OpError::DType(_))));
}

#[rstest]
#[case::too_few_targets(&[0], 2)]
#[case::output_too_short(&[0, 1], 1)]
fn counts_that_do_not_match_the_rows_are_shape_errors(#[case] t: &[i64], #[case] out: u64) {
    let x = Tensor::from_f32(DType::F32, &[2, 5], &[0.5; 10]).unwrap();
    assert!(matches!(
        nll(&x, &ints(t), &[], out),
        Err(OpError::Shape(_))
    ));
}

#[test]
fn a_tile_past_the_rows_is_a_shape_error() {
    let x = Tensor::from_f32(DType::F32, &[2, 5], &[0.5; 10]).unwrap();
    let err = nll(&x, &ints(&[0, 1]), &tile(1, 2), 2).unwrap_err();
    assert!(matches!(err, OpError::Shape(_)), "{err}");
}

#[test]
fn partial_tile_params_are_refused() {
    let x = Tensor::from_f32(DType::F32, &[2, 5], &[0.5; 10]).unwrap();
    let params = [("m_off", Value::Int(0)), ("M_tile", Value::Int(1))];
    let err = nll(&x, &ints(&[0, 1]), &params, 2).unwrap_err();
    assert!(matches!(err, OpError::BadParam { .. }), "{err}");
}
