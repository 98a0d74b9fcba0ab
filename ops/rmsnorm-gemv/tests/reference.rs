//! RMSNORM_GEMV's CPU reference equals the unfused program it replaces — RMSNORM into an
//! activation of x's dtype, then GEMV_TILE — bit for bit (the unfused references are checked
//! against f64 formulas in their own crates), touches nothing outside its tile, and refuses
//! bad calls with typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use rstest::rstest;

fn tile(k: usize, n_tile: usize, n_off: usize) -> Vec<(&'static str, Value)> {
    vec![
        ("eps", Value::Float(1e-5)),
        ("K", Value::Int(k as i64)),
        ("N_tile", Value::Int(n_tile as i64)),
        ("n_off", Value::Int(n_off as i64)),
    ]
}

/// RMSNORM then GEMV_TILE through their own references.
fn unfused(
    x: &Tensor,
    nw: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &[(&str, Value)],
    out: &mut Tensor,
) {
    let k = x.numel();
    let norm = task(
        Opcode::RMSNORM,
        2,
        1,
        &[
            ("eps", Value::Float(1e-5)),
            ("hidden", Value::Int(k as i64)),
        ],
    );
    let mut xn = [Tensor::poisoned(x.dtype(), x.shape())];
    call(op_rmsnorm::reference::run, &norm, &[x, nw], &mut xn).unwrap();
    let gemv: Vec<(&str, Value)> = p.iter().filter(|(key, _)| *key != "eps").cloned().collect();
    let mut ins = vec![&xn[0], w];
    ins.extend(bias);
    let t = task(Opcode::GEMV_TILE, ins.len(), 1, &gemv);
    call(
        op_gemv_tile::reference::run,
        &t,
        &ins,
        std::slice::from_mut(out),
    )
    .unwrap();
}

#[rstest]
#[case::f32_bias(32, 12, 4, 5, DType::F32, DType::F32, true)]
#[case::bf16(64, 9, 0, 9, DType::BF16, DType::BF16, false)]
#[case::bf16_bias_ragged(40, 11, 8, 3, DType::BF16, DType::BF16, true)]
#[case::f16_x_bf16_w(24, 6, 2, 4, DType::F16, DType::BF16, false)]
#[case::odd_k(13, 7, 1, 6, DType::F32, DType::F16, true)]
fn equals_rmsnorm_then_gemv(
    #[case] k: usize,
    #[case] n: usize,
    #[case] n_off: usize,
    #[case] n_tile: usize,
    #[case] xd: DType,
    #[case] wd: DType,
    #[case] with_bias: bool,
) {
    let mut r = rng((k * 100 + n) as u64);
    let x = random_nonzero(xd, &[1, k as u64], &mut r, -2.0, 2.0);
    let nw = random_nonzero(xd, &[k as u64], &mut r, 0.5, 1.5);
    let w = random_nonzero(wd, &[n as u64, k as u64], &mut r, -1.0, 1.0);
    let b = with_bias.then(|| random_nonzero(DType::F32, &[n as u64], &mut r, -1.0, 1.0));
    let p = tile(k, n_tile, n_off);
    let mut want = Tensor::poisoned(xd, &[1, n as u64]);
    unfused(&x, &nw, &w, b.as_ref(), &p, &mut want);
    let mut got = [Tensor::poisoned(xd, &[1, n as u64])];
    let mut ins = vec![&x, &nw, &w];
    ins.extend(b.as_ref());
    let t = task(Opcode::RMSNORM_GEMV, ins.len(), 1, &p);
    call(op_rmsnorm_gemv::reference::run, &t, &ins, &mut got).unwrap();
    for i in 0..n {
        let (g, w) = (got[0].get_f32(i), want.get_f32(i));
        if (n_off..n_off + n_tile).contains(&i) {
            assert_eq!(g.to_bits(), w.to_bits(), "column {i}: {g} vs {w}");
        } else {
            assert!(g.is_nan(), "column {i} outside the tile was written");
        }
    }
}

#[test]
fn bad_calls_are_typed_errors() {
    let mut r = rng(5);
    let x = random_nonzero(DType::F32, &[1, 8], &mut r, -1.0, 1.0);
    let x2 = random_nonzero(DType::F32, &[2, 8], &mut r, -1.0, 1.0);
    let nw = random_nonzero(DType::F32, &[8], &mut r, 0.5, 1.5);
    let w = random_nonzero(DType::F32, &[4, 8], &mut r, -1.0, 1.0);
    let wi = random_nonzero(DType::I8, &[4, 8], &mut r, -3.0, 3.0);
    let run = |ins: &[&Tensor], p: &[(&str, Value)]| {
        let mut out = [Tensor::poisoned(DType::F32, &[1, 4])];
        let t = task(Opcode::RMSNORM_GEMV, ins.len(), 1, p);
        call(op_rmsnorm_gemv::reference::run, &t, ins, &mut out)
    };
    assert!(matches!(
        run(&[&x, &nw], &tile(8, 4, 0)),
        Err(OpError::Arity { .. })
    ));
    assert!(matches!(
        run(&[&x, &nw, &w], &tile(8, 4, 1)),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        run(&[&x2, &nw, &w], &tile(8, 4, 0)),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        run(&[&x, &nw, &w], &tile(6, 4, 0)),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        run(&[&x, &nw, &wi], &tile(8, 4, 0)),
        Err(OpError::DType(_))
    ));
    let no_eps: Vec<_> = tile(8, 4, 0)
        .into_iter()
        .filter(|(k, _)| *k != "eps")
        .collect();
    assert!(matches!(
        run(&[&x, &nw, &w], &no_eps),
        Err(OpError::MissingParam(_))
    ));
    assert!(run(&[&x, &nw, &w], &tile(8, 4, 0)).is_ok());
}
