//! DEQUANT's CPU reference against an independent f64 formula computed from the raw integers
//! drawn here: int8 / uint8 / int32 / packed int4 (odd last dims), with and without zeros,
//! groups from 1 to the whole row, scales and outputs in F32/F16/BF16, outputs poisoned before
//! the call (every element must be written), and typed errors for bad calls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::too_many_arguments)] // rstest cases spell every dimension out

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Storage, Tensor};
use op_dequant::reference::run;
use rstest::rstest;

fn params(qdtype: i64, group: i64) -> Vec<(&'static str, Value)> {
    vec![("qdtype", Value::Int(qdtype)), ("group", Value::Int(group))]
}

/// The integer range drawn for each storage dtype.
fn range(qd: DType) -> (i64, i64) {
    match qd {
        DType::I4 => (0, 15),
        DType::I8 => (-128, 127),
        DType::U8 => (0, 255),
        DType::I32 => (-1000, 1000),
        _ => panic!("bad test case"),
    }
}

#[rstest]
#[case::i8_sym(6, DType::I8, &[4, 32], 8, false, DType::F16, DType::F32, None)]
#[case::u8_asym(6, DType::U8, &[2, 64], 16, true, DType::F16, DType::F16, None)]
#[case::i4_sym(7, DType::I4, &[3, 16], 4, false, DType::F16, DType::F32, None)]
#[case::i4_asym_odd_row(7, DType::I4, &[5, 21], 7, true, DType::F32, DType::F32, None)]
#[case::i4_sym_odd_row_bf16(7, DType::I4, &[1, 9], 3, false, DType::BF16, DType::BF16, None)]
#[case::i32_asym_rank3(6, DType::I32, &[2, 3, 10], 5, true, DType::F32, DType::F32, None)]
#[case::one_group(6, DType::I8, &[48], 48, false, DType::F32, DType::F32, None)]
#[case::group1(6, DType::I8, &[3, 7], 1, true, DType::BF16, DType::F32, None)]
#[case::flat_output_view(7, DType::I4, &[4, 12], 6, true, DType::F16, DType::F32, Some(&[48u64][..]))]
#[case::u8_holding_nibbles_no_offset(7, DType::U8, &[2, 8], 4, false, DType::F32, DType::F32, None)]
fn matches_f64_formula(
    #[case] qdtype: i64,
    #[case] qd: DType,
    #[case] shape: &[u64],
    #[case] group: usize,
    #[case] asym: bool,
    #[case] sd: DType,
    #[case] od: DType,
    #[case] out_shape: Option<&[u64]>,
) {
    let mut r = rng(shape.iter().sum::<u64>() * 13 + group as u64 + qd as u64 + u64::from(asym));
    let n: usize = shape.iter().product::<u64>() as usize;
    let (lo, hi) = range(qd);
    let qv: Vec<i64> = (0..n)
        .map(|_| lo + (r.next() % (hi - lo + 1) as u64) as i64)
        .collect();
    let q = Tensor::from_i64(qd, shape, &qv).unwrap();
    let groups = (n / group) as u64;
    // Scales/zeros shaped [rows, groups per row] (only their element count matters).
    let last = *shape.last().unwrap();
    let sshape = [n as u64 / last, last / group as u64];
    assert_eq!(sshape[0] * sshape[1], groups);
    let scales = random_nonzero(sd, &sshape, &mut r, -0.5, 0.5);
    let zeros = asym.then(|| random_nonzero(sd, &sshape, &mut r, 0.0, hi.max(1) as f64));
    // Symmetric int4 storage is offset by 8; nothing else is.
    let sym_zero = if qd == DType::I4 { 8.0 } else { 0.0 };
    let want: Vec<f64> = (0..n)
        .map(|i| {
            let g = i / group;
            let z = zeros.as_ref().map_or(sym_zero, |z| z.get_f32(g) as f64);
            (qv[i] as f64 - z) * scales.get_f32(g) as f64
        })
        .collect();
    let mut out = [Tensor::poisoned(od, out_shape.unwrap_or(shape))];
    let mut inputs = vec![&q, &scales];
    inputs.extend(zeros.as_ref());
    let t = task(
        Opcode::DEQUANT,
        inputs.len(),
        1,
        &params(qdtype, group as i64),
    );
    call(run, &t, &inputs, &mut out).unwrap();
    // (q − z) is exact in f32; the product rounds once, then the output dtype rounds.
    assert_close(&out[0], &want, 2f64.powi(-23), 1e-30);
}

/// Runs a call that must fail, and checks it wrote nothing.
fn fails(inputs: &[&Tensor], p: &[(&str, Value)], out_shape: &[u64], od: DType) -> OpError {
    let mut out = vec![Tensor::poisoned(od, out_shape)];
    let t = task(Opcode::DEQUANT, inputs.len(), 1, p);
    let e = call(run, &t, inputs, &mut out).expect_err("a bad call must fail");
    assert_eq!(
        format!("{:?}", out[0]),
        format!("{:?}", Tensor::poisoned(od, out_shape)),
        "a failed call wrote its output"
    );
    e
}

#[test]
fn bad_calls_are_typed_errors() {
    let q = Tensor::zeros(DType::I4, &[2, 12]);
    let s = Tensor::zeros(DType::F16, &[2, 3]);
    let p = params(7, 4);
    let o = &[2u64, 12][..];
    let f = DType::F32;
    let mut ok = [Tensor::poisoned(f, o)];
    call(
        run,
        &task(Opcode::DEQUANT, 3, 1, &p),
        &[&q, &s, &s],
        &mut ok,
    )
    .unwrap();

    let shape = |e: OpError| assert!(matches!(e, OpError::Shape(_)), "{e:?}");
    let bad_param = |e: OpError| assert!(matches!(e, OpError::BadParam { .. }), "{e:?}");
    // Arity.
    assert!(matches!(fails(&[&q], &p, o, f), OpError::Arity { .. }));
    assert!(matches!(
        fails(&[&q, &s, &s, &s], &p, o, f),
        OpError::Arity { .. }
    ));
    let t = task(Opcode::DEQUANT, 2, 0, &p);
    assert!(matches!(
        call(run, &t, &[&q, &s], &mut []),
        Err(OpError::Arity { .. })
    ));
    // Params.
    assert_eq!(
        fails(&[&q, &s], &p[1..], o, f),
        OpError::MissingParam("qdtype".into())
    );
    assert_eq!(
        fails(&[&q, &s], &p[..1], o, f),
        OpError::MissingParam("group".into())
    );
    bad_param(fails(&[&q, &s], &params(5, 4), o, f));
    bad_param(fails(&[&q, &s], &params(7, 0), o, f));
    bad_param(fails(&[&q, &s], &params(7, -4), o, f));
    bad_param(fails(
        &[&q, &s],
        &[("qdtype", Value::Int(7)), ("group", Value::Float(4.0))],
        o,
        f,
    ));
    // Shapes.
    shape(fails(&[&q, &s], &params(7, 5), o, f)); // 12 is not a multiple of 5
    shape(fails(&[&q, &Tensor::zeros(DType::F16, &[2, 2])], &p, o, f));
    shape(fails(&[&q, &s, &Tensor::zeros(DType::F16, &[7])], &p, o, f));
    shape(fails(&[&q, &s], &p, &[2, 11], f)); // output count != q count
    // Dtypes: the output must be a float.
    assert!(matches!(
        fails(&[&q, &s], &p, o, DType::I32),
        OpError::DType(_)
    ));
    // A packed I4 storage that does not hold its rows is refused, not indexed.
    let mut short = q.clone();
    *short.storage_mut() = Storage::I4(vec![0; 11]);
    shape(fails(&[&short, &s], &p, o, f));
}
