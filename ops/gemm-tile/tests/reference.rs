//! GEMM_TILE's CPU reference against an independent f64 formula: several rows of `x`, row
//! sub-ranges `[m_off, m_off + M_tile)` (every row when `m_off` is absent), ragged column
//! tiles, odd K, bias, F32/F16/BF16 operands, int8/int4 weights (symmetric and asymmetric)
//! dequantised here from the raw integers; outputs poisoned so anything outside the tile must
//! stay NaN; typed errors for bad calls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::too_many_arguments)] // rstest cases spell every dimension out

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use op_gemm_tile::reference::run;
use op_gemv_tile::testing::{as_f64, check_tile, quant_weights};
use rstest::rstest;
use std::ops::Range;

fn params(
    k: usize,
    n_tile: usize,
    n_off: usize,
    m_tile: usize,
    m_off: Option<usize>,
) -> Vec<(&'static str, Value)> {
    let mut p = vec![
        ("M_tile", Value::Int(m_tile as i64)),
        ("K", Value::Int(k as i64)),
        ("N_tile", Value::Int(n_tile as i64)),
        ("n_off", Value::Int(n_off as i64)),
    ];
    if let Some(mo) = m_off {
        p.push(("m_off", Value::Int(mo as i64)));
    }
    p
}

/// The rows a call writes: `[m_off, m_off + M_tile)`, or all `m` rows without `m_off`.
fn written_rows(m: usize, m_tile: usize, m_off: Option<usize>) -> Range<usize> {
    m_off.map_or(0..m, |mo| mo..mo + m_tile)
}

#[rstest]
#[case::all_rows(&[4, 33], 10, 0, 10, 4, None, DType::F32, DType::F32, None, DType::F32)]
#[case::row_subrange(&[4, 33], 10, 3, 5, 2, Some(1), DType::F32, DType::F32, None, DType::F32)]
#[case::last_row_ragged_tile(&[5, 64], 37, 32, 5, 1, Some(4), DType::F32, DType::F32, Some(DType::F32), DType::F32)]
#[case::rank3_x(&[2, 3, 17], 8, 2, 3, 3, Some(3), DType::F32, DType::F32, None, DType::F32)]
#[case::bf16_weights_bias_out(&[3, 130], 20, 16, 4, 3, None, DType::F32, DType::BF16, Some(DType::BF16), DType::BF16)]
#[case::f16_everything(&[6, 31], 9, 0, 9, 2, Some(0), DType::F16, DType::F16, Some(DType::F16), DType::F16)]
#[case::k2048(&[8, 2048], 4, 1, 2, 8, None, DType::F32, DType::F32, None, DType::F32)]
#[case::k1(&[4, 1], 5, 4, 1, 2, Some(2), DType::F32, DType::F32, Some(DType::F32), DType::F32)]
#[case::m_tile_without_m_off_writes_all(&[4, 20], 6, 1, 4, 2, None, DType::BF16, DType::F32, None, DType::F32)]
#[case::middle_rows_middle_cols(&[7, 45], 30, 11, 7, 3, Some(2), DType::F32, DType::BF16, None, DType::F16)]
fn float_weights_match_f64_formula(
    #[case] x_shape: &[u64],
    #[case] n: usize,
    #[case] n_off: usize,
    #[case] n_tile: usize,
    #[case] m_tile: usize,
    #[case] m_off: Option<usize>,
    #[case] xd: DType,
    #[case] wd: DType,
    #[case] bias: Option<DType>,
    #[case] od: DType,
) {
    let k = *x_shape.last().unwrap() as usize;
    let m = x_shape.iter().product::<u64>() as usize / k;
    let mut r = rng((k * 1000 + n * 10 + n_off + m) as u64 + wd as u64);
    let x = random_nonzero(xd, x_shape, &mut r, -1.0, 1.0);
    let w = random_nonzero(wd, &[n as u64, k as u64], &mut r, -1.0, 1.0);
    let b = bias.map(|bd| random_nonzero(bd, &[n as u64], &mut r, -1.0, 1.0));
    let mut out_shape = x_shape.to_vec();
    *out_shape.last_mut().unwrap() = n as u64;
    let mut out = [Tensor::poisoned(od, &out_shape)];
    let mut inputs = vec![&x, &w];
    inputs.extend(b.as_ref());
    let t = task(
        Opcode::GEMM_TILE,
        inputs.len(),
        1,
        &params(k, n_tile, n_off, m_tile, m_off),
    );
    call(run, &t, &inputs, &mut out).unwrap();
    let bv = b.as_ref().map(as_f64);
    check_tile(
        &out[0],
        &x,
        &as_f64(&w),
        bv.as_deref(),
        k,
        n_off..n_off + n_tile,
        written_rows(m, m_tile, m_off),
    );
}

#[rstest]
#[case::i8_sym_rows_1_3(6, false, &[3, 33], 9, Some(8), 2, 5, 2, Some(1), DType::F32)]
#[case::i8_asym_all_rows(6, true, &[4, 40], 6, Some(16), 0, 6, 4, None, DType::F16)]
#[case::i4_sym_odd_k(7, false, &[2, 31], 7, Some(7), 3, 4, 2, Some(0), DType::F32)]
#[case::i4_asym_rows_2_5(7, true, &[5, 45], 12, Some(10), 9, 3, 3, Some(2), DType::BF16)]
#[case::i4_asym_default_group(7, true, &[3, 9], 4, None, 0, 4, 3, None, DType::F32)]
#[case::i8_asym_one_row(6, true, &[6, 17], 5, Some(5), 1, 3, 1, Some(5), DType::F32)]
fn quantised_weights_match_f64_formula(
    #[case] qdtype: i64,
    #[case] asym: bool,
    #[case] x_shape: &[u64],
    #[case] n: usize,
    #[case] group: Option<usize>,
    #[case] n_off: usize,
    #[case] n_tile: usize,
    #[case] m_tile: usize,
    #[case] m_off: Option<usize>,
    #[case] od: DType,
) {
    let k = *x_shape.last().unwrap() as usize;
    let m = x_shape.iter().product::<u64>() as usize / k;
    let mut r = rng(qdtype as u64 * 7919 + k as u64 * 31 + n as u64 + u64::from(asym));
    let x = random_nonzero(DType::F32, x_shape, &mut r, -1.0, 1.0);
    let (ws, real) = quant_weights(&mut r, qdtype, asym, n, k, group.unwrap_or(k), DType::F16);
    let mut p = params(k, n_tile, n_off, m_tile, m_off);
    p.push(("qdtype", Value::Int(qdtype)));
    if let Some(g) = group {
        p.push(("group", Value::Int(g as i64)));
    }
    let mut inputs = vec![&x];
    inputs.extend(ws.iter());
    let t = task(Opcode::GEMM_TILE, inputs.len(), 1, &p);
    let mut out = [Tensor::poisoned(od, &[m as u64, n as u64])];
    call(run, &t, &inputs, &mut out).unwrap();
    check_tile(
        &out[0],
        &x,
        &real,
        None,
        k,
        n_off..n_off + n_tile,
        written_rows(m, m_tile, m_off),
    );
}

/// Runs a call that must fail, and checks it wrote nothing.
fn fails(inputs: &[&Tensor], p: &[(&str, Value)], out_shape: &[u64]) -> OpError {
    let mut out = vec![Tensor::poisoned(DType::F32, out_shape)];
    let t = task(Opcode::GEMM_TILE, inputs.len(), 1, p);
    let e = call(run, &t, inputs, &mut out).expect_err("a bad call must fail");
    assert!(
        out[0].to_f32_vec().iter().all(|v| v.is_nan()),
        "a failed call wrote its output"
    );
    e
}

fn with(p: &[(&'static str, Value)], key: &'static str, v: Value) -> Vec<(&'static str, Value)> {
    let mut p: Vec<_> = p.iter().filter(|(k, _)| *k != key).cloned().collect();
    p.push((key, v));
    p
}

#[test]
fn bad_calls_are_typed_errors() {
    let mut r = rng(3);
    let x = random_nonzero(DType::F32, &[4, 8], &mut r, -1.0, 1.0);
    let w = random_nonzero(DType::F32, &[6, 8], &mut r, -1.0, 1.0);
    let p = params(8, 3, 2, 2, Some(1));
    let o = &[4u64, 6][..];
    let mut out = [Tensor::poisoned(DType::F32, o)];
    call(run, &task(Opcode::GEMM_TILE, 2, 1, &p), &[&x, &w], &mut out).unwrap();

    let shape = |e: OpError| assert!(matches!(e, OpError::Shape(_)), "{e:?}");
    let bad_param = |e: OpError| assert!(matches!(e, OpError::BadParam { .. }), "{e:?}");
    // M_tile is required (GEMM's spec); m_off is optional but must be an integer ≥ 0.
    let no_m_tile: Vec<_> = p.iter().filter(|(k, _)| *k != "M_tile").cloned().collect();
    assert_eq!(
        fails(&[&x, &w], &no_m_tile, o),
        OpError::MissingParam("M_tile".into())
    );
    bad_param(fails(&[&x, &w], &with(&p, "M_tile", Value::Int(0)), o));
    bad_param(fails(&[&x, &w], &with(&p, "m_off", Value::Int(-1)), o));
    bad_param(fails(
        &[&x, &w],
        &with(&p, "m_off", Value::Str("1".into())),
        o,
    ));
    // Row ranges beyond x's rows, with and without m_off (the validator's rule).
    shape(fails(&[&x, &w], &with(&p, "m_off", Value::Int(3)), o));
    shape(fails(
        &[&x, &w],
        &with(&p, "M_tile", Value::Int(i64::MAX)),
        o,
    ));
    let no_m_off: Vec<_> = p.iter().filter(|(k, _)| *k != "m_off").cloned().collect();
    shape(fails(
        &[&x, &w],
        &with(&no_m_off, "M_tile", Value::Int(5)),
        o,
    ));
    // The linear tile's own rules hold for GEMM too.
    shape(fails(&[&x, &w], &with(&p, "K", Value::Int(9)), o));
    shape(fails(&[&x, &w], &with(&p, "n_off", Value::Int(4)), o));
    shape(fails(&[&x, &w], &p, &[2, 6])); // output rows != x rows
    assert!(matches!(fails(&[&x], &p, o), OpError::Arity { .. }));
    let wi = Tensor::zeros(DType::I4, &[6, 8]);
    assert!(matches!(fails(&[&x, &wi], &p, o), OpError::DType(_)));
    let s = Tensor::zeros(DType::F16, &[6, 1]);
    let p4 = with(&p, "qdtype", Value::Int(7));
    shape(fails(
        &[&x, &wi, &Tensor::zeros(DType::F16, &[6, 2])],
        &p4,
        o,
    ));
    let mut ok = [Tensor::poisoned(DType::F32, o)];
    call(
        run,
        &task(Opcode::GEMM_TILE, 3, 1, &p4),
        &[&x, &wi, &s],
        &mut ok,
    )
    .unwrap();
}
