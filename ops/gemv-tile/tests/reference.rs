//! GEMV_TILE's CPU reference against an independent f64 formula: random non-zero inputs,
//! poisoned outputs (everything outside the column tile must stay NaN), ragged tiles, odd K,
//! several `n_off`, bias, F32/F16/BF16 operands, int8 and int4 weights (symmetric and
//! asymmetric, groups that do not divide K) dequantised here from the raw integers, and typed
//! errors for bad calls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::too_many_arguments)] // rstest cases spell every dimension out

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Storage, Tensor};
use op_gemv_tile::reference::run;
use op_gemv_tile::testing::{as_f64, check_tile, quant_weights};
use rstest::rstest;

fn base_params(k: usize, n_tile: usize, n_off: usize) -> Vec<(&'static str, Value)> {
    vec![
        ("K", Value::Int(k as i64)),
        ("N_tile", Value::Int(n_tile as i64)),
        ("n_off", Value::Int(n_off as i64)),
    ]
}

#[rstest]
#[case::whole(&[1, 32], 16, 0, 16, 16, DType::F32, DType::F32, None, DType::F32)]
#[case::ragged_last_tile(&[1, 33], 37, 32, 5, 37, DType::F32, DType::F32, Some(DType::F32), DType::F32)]
#[case::middle_tile(&[1, 33], 37, 8, 8, 37, DType::F32, DType::F32, None, DType::F32)]
#[case::k1(&[1, 1], 10, 3, 4, 10, DType::F32, DType::F32, Some(DType::F32), DType::F32)]
#[case::f16_weights(&[1, 67], 12, 5, 6, 12, DType::F32, DType::F16, None, DType::F16)]
#[case::bf16_all(&[1, 129], 9, 1, 7, 9, DType::BF16, DType::BF16, Some(DType::BF16), DType::BF16)]
#[case::f16_x_bf16_w(&[1, 47], 20, 0, 13, 20, DType::F16, DType::BF16, None, DType::F32)]
#[case::bf16_w_tail(&[1, 100], 50, 48, 2, 50, DType::F32, DType::BF16, None, DType::F32)]
#[case::three_rows(&[3, 130], 40, 20, 13, 40, DType::F32, DType::F32, Some(DType::F16), DType::F32)]
#[case::rank1_x_k2048(&[2048], 8, 6, 2, 8, DType::F32, DType::F32, None, DType::F32)]
#[case::wide_output(&[1, 40], 16, 10, 6, 19, DType::F32, DType::F32, Some(DType::F32), DType::F32)]
fn float_weights_match_f64_formula(
    #[case] x_shape: &[u64],
    #[case] n: usize,
    #[case] n_off: usize,
    #[case] n_tile: usize,
    #[case] ldo: usize,
    #[case] xd: DType,
    #[case] wd: DType,
    #[case] bias: Option<DType>,
    #[case] od: DType,
) {
    let k = *x_shape.last().unwrap() as usize;
    let m = x_shape.iter().product::<u64>() as usize / k;
    let mut r = rng((k * 1000 + n * 10 + n_off) as u64 + wd as u64);
    let x = random_nonzero(xd, x_shape, &mut r, -1.0, 1.0);
    let w = random_nonzero(wd, &[n as u64, k as u64], &mut r, -1.0, 1.0);
    let b = bias.map(|bd| random_nonzero(bd, &[n as u64], &mut r, -1.0, 1.0));
    let out_shape: Vec<u64> = if x_shape.len() == 1 {
        vec![ldo as u64]
    } else {
        vec![m as u64, ldo as u64]
    };
    let mut out = [Tensor::poisoned(od, &out_shape)];
    let mut inputs = vec![&x, &w];
    inputs.extend(b.as_ref());
    let t = task(
        Opcode::GEMV_TILE,
        inputs.len(),
        1,
        &base_params(k, n_tile, n_off),
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
        0..m,
    );
}

#[rstest]
#[case::i8_sym_group8_odd_k(6, false, &[1, 33], 9, Some(8), 2, 5, DType::F16, DType::F32)]
#[case::i8_asym_u8(6, true, &[1, 64], 6, Some(16), 0, 6, DType::F16, DType::F32)]
#[case::i4_sym_odd_k(7, false, &[1, 31], 7, Some(7), 3, 4, DType::F16, DType::F32)]
#[case::i4_asym_ragged_group(7, true, &[1, 31], 7, Some(10), 0, 7, DType::F16, DType::F16)]
#[case::i4_sym_default_group(7, false, &[1, 20], 5, None, 1, 3, DType::F32, DType::F32)]
#[case::i4_asym_k1(7, true, &[1, 1], 4, None, 0, 4, DType::BF16, DType::F32)]
#[case::i8_sym_two_rows(6, false, &[2, 40], 6, Some(40), 2, 4, DType::BF16, DType::F16)]
#[case::i4_asym_k129(7, true, &[1, 129], 10, Some(32), 7, 3, DType::F32, DType::BF16)]
#[case::i8_asym_group5(6, true, &[1, 17], 3, Some(5), 2, 1, DType::F16, DType::F32)]
fn quantised_weights_match_f64_formula(
    #[case] qdtype: i64,
    #[case] asym: bool,
    #[case] x_shape: &[u64],
    #[case] n: usize,
    #[case] group: Option<usize>,
    #[case] n_off: usize,
    #[case] n_tile: usize,
    #[case] sd: DType,
    #[case] od: DType,
) {
    let k = *x_shape.last().unwrap() as usize;
    let m = x_shape.iter().product::<u64>() as usize / k;
    let mut r = rng(qdtype as u64 * 7919 + k as u64 * 31 + n as u64 + u64::from(asym));
    let x = random_nonzero(DType::F32, x_shape, &mut r, -1.0, 1.0);
    let (ws, real) = quant_weights(&mut r, qdtype, asym, n, k, group.unwrap_or(k), sd);
    let mut params = base_params(k, n_tile, n_off);
    params.push(("qdtype", Value::Int(qdtype)));
    if let Some(g) = group {
        params.push(("group", Value::Int(g as i64)));
    }
    let mut inputs = vec![&x];
    inputs.extend(ws.iter());
    let t = task(Opcode::GEMV_TILE, inputs.len(), 1, &params);
    let mut out = [Tensor::poisoned(od, &[m as u64, n as u64])];
    call(run, &t, &inputs, &mut out).unwrap();
    check_tile(&out[0], &x, &real, None, k, n_off..n_off + n_tile, 0..m);
}

/// The int4 zero-point rule on hand-picked values: symmetric `(nibble − 8)·s`, asymmetric
/// `(nibble − zero)·s` with no extra −8 (our deliberate fix of the reference's bug).
#[test]
fn int4_offsets_are_exact() {
    let x = Tensor::from_f32(DType::F32, &[1, 3], &[1.0, 1.0, 1.0]).unwrap();
    let q = Tensor::from_i64(DType::I4, &[1, 3], &[15, 0, 9]).unwrap();
    let s = Tensor::from_f32(DType::F32, &[1, 1], &[0.5]).unwrap();
    let z = Tensor::from_f32(DType::F32, &[1, 1], &[3.0]).unwrap();
    let mut params = base_params(3, 1, 0);
    params.push(("qdtype", Value::Int(7)));
    let mut out = [Tensor::poisoned(DType::F32, &[1, 1])];
    call(
        run,
        &task(Opcode::GEMV_TILE, 3, 1, &params),
        &[&x, &q, &s],
        &mut out,
    )
    .unwrap();
    assert_eq!(
        out[0].get_f32(0),
        ((15 - 8) + (0 - 8) + (9 - 8)) as f32 * 0.5
    );
    call(
        run,
        &task(Opcode::GEMV_TILE, 4, 1, &params),
        &[&x, &q, &s, &z],
        &mut out,
    )
    .unwrap();
    assert_eq!(
        out[0].get_f32(0),
        ((15 - 3) + (0 - 3) + (9 - 3)) as f32 * 0.5
    );
}

/// A valid float call `[x [2, 8], W [6, 8]] -> out [2, 6]`, columns [2, 5).
fn valid() -> (Tensor, Tensor, Vec<(&'static str, Value)>) {
    let mut r = rng(99);
    (
        random_nonzero(DType::F32, &[2, 8], &mut r, -1.0, 1.0),
        random_nonzero(DType::F32, &[6, 8], &mut r, -1.0, 1.0),
        base_params(8, 3, 2),
    )
}

/// Runs a call that must fail, and checks it wrote nothing.
fn fails(inputs: &[&Tensor], params: &[(&str, Value)], out_shape: &[u64], od: DType) -> OpError {
    let mut out = vec![Tensor::poisoned(od, out_shape)];
    let t = task(Opcode::GEMV_TILE, inputs.len(), 1, params);
    let e = call(run, &t, inputs, &mut out).expect_err("a bad call must fail");
    let untouched = Tensor::poisoned(od, out_shape);
    assert_eq!(
        format!("{:?}", out[0]),
        format!("{untouched:?}"),
        "a failed call wrote its output"
    );
    e
}

fn with(
    params: &[(&'static str, Value)],
    key: &'static str,
    v: Value,
) -> Vec<(&'static str, Value)> {
    let mut p: Vec<_> = params.iter().filter(|(k, _)| *k != key).cloned().collect();
    p.push((key, v));
    p
}

fn without(params: &[(&'static str, Value)], key: &str) -> Vec<(&'static str, Value)> {
    params.iter().filter(|(k, _)| *k != key).cloned().collect()
}

#[test]
fn bad_float_calls_are_typed_errors() {
    let (x, w, p) = valid();
    let o = &[2u64, 6][..];
    let f = DType::F32;
    // The valid call itself succeeds.
    let mut out = [Tensor::poisoned(f, o)];
    call(run, &task(Opcode::GEMV_TILE, 2, 1, &p), &[&x, &w], &mut out).unwrap();

    // Arity.
    assert!(matches!(fails(&[&x], &p, o, f), OpError::Arity { .. }));
    assert!(matches!(
        fails(&[&x, &w, &w, &w, &w], &p, o, f),
        OpError::Arity { .. }
    ));
    let b6 = Tensor::zeros(f, &[6]);
    assert!(matches!(
        fails(&[&x, &w, &b6, &b6], &p, o, f),
        OpError::Arity { .. }
    ));
    let t = task(Opcode::GEMV_TILE, 2, 0, &p);
    assert!(matches!(
        call(run, &t, &[&x, &w], &mut []),
        Err(OpError::Arity { .. })
    ));
    let mut two = [Tensor::poisoned(f, o), Tensor::poisoned(f, o)];
    assert!(matches!(
        call(run, &t, &[&x, &w], &mut two),
        Err(OpError::Arity { .. })
    ));

    // Params: missing, ill-typed, out of range.
    for key in ["K", "N_tile", "n_off"] {
        assert_eq!(
            fails(&[&x, &w], &without(&p, key), o, f),
            OpError::MissingParam(key.into())
        );
        let e = fails(&[&x, &w], &with(&p, key, Value::Float(2.5)), o, f);
        assert!(
            matches!(e, OpError::BadParam { key: ref k, .. } if k == key),
            "{e:?}"
        );
        let e = fails(&[&x, &w], &with(&p, key, Value::Int(-1)), o, f);
        assert!(matches!(e, OpError::BadParam { .. }), "{e:?}");
    }
    for key in ["K", "N_tile"] {
        let e = fails(&[&x, &w], &with(&p, key, Value::Int(0)), o, f);
        assert!(matches!(e, OpError::BadParam { .. }), "{e:?}");
    }
    let e = fails(&[&x, &w], &with(&p, "qdtype", Value::Int(5)), o, f);
    assert!(matches!(e, OpError::BadParam { .. }), "{e:?}");

    // Shapes against the params.
    let shape = |e: OpError| assert!(matches!(e, OpError::Shape(_)), "{e:?}");
    shape(fails(&[&x, &w], &with(&p, "K", Value::Int(7)), o, f));
    let w9 = Tensor::zeros(f, &[6, 9]);
    shape(fails(&[&x, &w9], &with(&p, "K", Value::Int(9)), o, f)); // x's last dim is 8
    shape(fails(&[&x, &w], &with(&p, "n_off", Value::Int(4)), o, f)); // [4, 7) > 6 rows
    shape(fails(
        &[&x, &w],
        &with(&p, "N_tile", Value::Int(i64::MAX)),
        o,
        f,
    ));
    shape(fails(&[&x, &w], &p, &[2, 4], f)); // output narrower than the tile's end
    shape(fails(&[&x, &w], &p, &[3, 6], f)); // output rows != x rows
    shape(fails(&[&x, &w, &Tensor::zeros(f, &[5])], &p, o, f)); // bias count

    // Dtypes.
    let dtype = |e: OpError| assert!(matches!(e, OpError::DType(_)), "{e:?}");
    let xi = Tensor::zeros(DType::I32, &[2, 8]);
    dtype(fails(&[&xi, &w], &p, o, f));
    let wi = Tensor::zeros(DType::I8, &[6, 8]);
    dtype(fails(&[&x, &wi], &p, o, f)); // integer weight without qdtype
    dtype(fails(&[&x, &w, &Tensor::zeros(DType::I32, &[6])], &p, o, f));
    dtype(fails(&[&x, &w], &p, o, DType::I32));

    // Storage that does not hold the shape is refused, not indexed.
    let mut short = w.clone();
    *short.storage_mut() = Storage::F32(vec![0.0; 3]);
    shape(fails(&[&x, &short], &p, o, f));
    let mut mixed = w.clone();
    *mixed.storage_mut() = Storage::I8(vec![0; 48]);
    dtype(fails(&[&x, &mixed], &p, o, f));
}

#[test]
fn bad_quantised_calls_are_typed_errors() {
    let mut r = rng(5);
    let x = random_nonzero(DType::F32, &[1, 10], &mut r, -1.0, 1.0);
    let (ws, _) = quant_weights(&mut r, 7, true, 4, 10, 4, DType::F16);
    let (q4, s, z) = (&ws[0], &ws[1], &ws[2]);
    let mut p = base_params(10, 4, 0);
    p.push(("qdtype", Value::Int(7)));
    p.push(("group", Value::Int(4)));
    let o = &[1u64, 4][..];
    let f = DType::F32;
    let mut out = [Tensor::poisoned(f, o)];
    call(
        run,
        &task(Opcode::GEMV_TILE, 4, 1, &p),
        &[&x, q4, s, z],
        &mut out,
    )
    .unwrap();

    let shape = |e: OpError| assert!(matches!(e, OpError::Shape(_)), "{e:?}");
    let dtype = |e: OpError| assert!(matches!(e, OpError::DType(_)), "{e:?}");
    // Quantised mode needs scales.
    assert!(matches!(fails(&[&x, q4], &p, o, f), OpError::Arity { .. }));
    // Weight dtype must fit the mode: int4 needs I4; int8 needs I8 (sym) / U8 (asym).
    let i8w = Tensor::zeros(DType::I8, &[4, 10]);
    let u8w = Tensor::zeros(DType::U8, &[4, 10]);
    dtype(fails(&[&x, &i8w, s, z], &p, o, f));
    let p8 = with(&p, "qdtype", Value::Int(6));
    dtype(fails(&[&x, q4, s], &p8, o, f));
    dtype(fails(&[&x, &u8w, s], &p8, o, f));
    dtype(fails(&[&x, &i8w, s, z], &p8, o, f));
    let mut ok = [Tensor::poisoned(f, o)];
    call(
        run,
        &task(Opcode::GEMV_TILE, 3, 1, &p8),
        &[&x, &i8w, s],
        &mut ok,
    )
    .unwrap();
    call(
        run,
        &task(Opcode::GEMV_TILE, 4, 1, &p8),
        &[&x, &u8w, s, z],
        &mut ok,
    )
    .unwrap();
    // Float weights with a quantised mode.
    dtype(fails(&[&x, &Tensor::zeros(f, &[4, 10]), s], &p, o, f));
    // Group.
    for g in [0, -3] {
        let e = fails(&[&x, q4, s], &with(&p, "group", Value::Int(g)), o, f);
        assert!(matches!(e, OpError::BadParam { .. }), "{e:?}");
    }
    shape(fails(&[&x, q4, s], &with(&p, "group", Value::Int(5)), o, f)); // 2 groups, scales hold 3
    // Scale / zero counts and dtypes.
    let s_short = Tensor::zeros(DType::F16, &[4, 2]);
    shape(fails(&[&x, q4, &s_short], &p, o, f));
    shape(fails(&[&x, q4, s, &s_short], &p, o, f));
    dtype(fails(
        &[&x, q4, &Tensor::zeros(DType::I32, &[4, 3])],
        &p,
        o,
        f,
    ));
    dtype(fails(
        &[&x, q4, s, &Tensor::zeros(DType::U8, &[4, 3])],
        &p,
        o,
        f,
    ));
    // Tile beyond the weight's rows.
    shape(fails(&[&x, q4, s], &with(&p, "n_off", Value::Int(1)), o, f));
    // A packed I4 storage that does not hold its rows.
    let mut short = q4.clone();
    *short.storage_mut() = Storage::I4(vec![0; 19]);
    shape(fails(&[&x, &short, s], &p, o, f));
}
