//! ATTENTION_GEMV's CPU reference equals the unfused program it replaces — ATTENTION_TILE into
//! an activation of q's dtype, then GEMV_TILE — bit for bit (the unfused references are checked
//! against formulas in their own crates), touches nothing outside its tile, and refuses bad
//! calls with typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use rstest::rstest;

/// One attention call's shape: query heads, KV heads, head size, rows `[start, start + len)`
/// of a cache of `max_seq` rows.
#[derive(Clone, Copy)]
struct Att {
    nh: usize,
    nkv: usize,
    hd: usize,
    start: usize,
    len: usize,
    max_seq: usize,
}

fn att_params(a: Att) -> Vec<(&'static str, Value)> {
    vec![
        ("head_dim", Value::Int(a.hd as i64)),
        ("kv_start", Value::Int(a.start as i64)),
        ("kv_len", Value::Int(a.len as i64)),
        ("scale", Value::Float(1.0 / (a.hd as f64).sqrt())),
        ("n_heads", Value::Int(a.nh as i64)),
        ("n_kv_heads", Value::Int(a.nkv as i64)),
    ]
}

fn tile(k: usize, n_tile: usize, n_off: usize) -> Vec<(&'static str, Value)> {
    vec![
        ("K", Value::Int(k as i64)),
        ("N_tile", Value::Int(n_tile as i64)),
        ("n_off", Value::Int(n_off as i64)),
    ]
}

/// ATTENTION_TILE then GEMV_TILE through their own references.
fn unfused(ops: &[&Tensor], a: Att, p: &[(&str, Value)], out: &mut Tensor) {
    let t = task(Opcode::ATTENTION_TILE, 3, 1, &att_params(a));
    let q = ops[0];
    let mut attn = [Tensor::poisoned(q.dtype(), &[1, (a.nh * a.hd) as u64])];
    call(op_attention_tile::reference::run, &t, &ops[..3], &mut attn).unwrap();
    let mut ins = vec![&attn[0], ops[3]];
    ins.extend(ops.get(4).copied());
    let t = task(Opcode::GEMV_TILE, ins.len(), 1, p);
    call(
        op_gemv_tile::reference::run,
        &t,
        &ins,
        std::slice::from_mut(out),
    )
    .unwrap();
}

/// Random operands: q `[nh, hd]`, caches `[max_seq, nkv, hd]`, W `[n, nh·hd]`, bias `[n]`.
fn operands(a: Att, n: usize, qd: DType, wd: DType, bias: bool, seed: u64) -> Vec<Tensor> {
    let mut r = rng(seed);
    let cache = [a.max_seq as u64, a.nkv as u64, a.hd as u64];
    let k = (a.nh * a.hd) as u64;
    let mut v = vec![
        random_nonzero(qd, &[a.nh as u64, a.hd as u64], &mut r, -2.0, 2.0),
        random_nonzero(qd, &cache, &mut r, -1.0, 1.0),
        random_nonzero(qd, &cache, &mut r, -1.0, 1.0),
        random_nonzero(wd, &[n as u64, k], &mut r, -1.0, 1.0),
    ];
    if bias {
        v.push(random_nonzero(qd, &[n as u64], &mut r, -1.0, 1.0));
    }
    v
}

fn att(nh: usize, nkv: usize, hd: usize, start: usize, len: usize) -> Att {
    Att {
        nh,
        nkv,
        hd,
        start,
        len,
        max_seq: 12,
    }
}

#[rstest]
#[case::f32_bias(att(4, 2, 8, 0, 1), 9, 2, 5, DType::F32, DType::F32, true)]
#[case::bf16_gqa(att(8, 2, 16, 3, 7), 11, 0, 11, DType::BF16, DType::BF16, true)]
#[case::bf16_no_bias_ragged(att(6, 3, 8, 0, 12), 13, 8, 5, DType::BF16, DType::BF16, false)]
#[case::f16_q_bf16_w(att(2, 1, 12, 5, 4), 7, 1, 6, DType::F16, DType::BF16, true)]
#[case::odd_head_dim(att(3, 3, 5, 2, 3), 6, 3, 3, DType::F32, DType::F16, false)]
fn equals_attention_then_gemv(
    #[case] a: Att,
    #[case] n: usize,
    #[case] n_off: usize,
    #[case] n_tile: usize,
    #[case] qd: DType,
    #[case] wd: DType,
    #[case] bias: bool,
) {
    let ops = operands(a, n, qd, wd, bias, (a.nh * 100 + a.len + n) as u64);
    let ins: Vec<&Tensor> = ops.iter().collect();
    let k = a.nh * a.hd;
    let p = tile(k, n_tile, n_off);
    let mut want = Tensor::poisoned(qd, &[1, n as u64]);
    unfused(&ins, a, &p, &mut want);
    let mut got = [Tensor::poisoned(qd, &[1, n as u64])];
    let mut params = att_params(a);
    params.extend(p);
    let t = task(Opcode::ATTENTION_GEMV, ins.len(), 1, &params);
    call(op_attention_gemv::reference::run, &t, &ins, &mut got).unwrap();
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
    let a = att(4, 2, 8, 1, 3);
    let ops = operands(a, 6, DType::F32, DType::F32, false, 7);
    let ins: Vec<&Tensor> = ops.iter().collect();
    let mut r = rng(8);
    let wi = random_nonzero(DType::I8, &[6, 32], &mut r, -3.0, 3.0);
    let run = |ins: &[&Tensor], a: Att, p: &[(&str, Value)]| {
        let mut out = [Tensor::poisoned(DType::F32, &[1, 6])];
        let mut params = att_params(a);
        params.extend(p.iter().cloned());
        let t = task(Opcode::ATTENTION_GEMV, ins.len(), 1, &params);
        call(op_attention_gemv::reference::run, &t, ins, &mut out)
    };
    assert!(matches!(
        run(&ins[..3], a, &tile(32, 4, 0)),
        Err(OpError::Arity { .. })
    ));
    // the tile past the weight's rows
    assert!(matches!(
        run(&ins, a, &tile(32, 4, 3)),
        Err(OpError::Shape(_))
    ));
    // K is not n_heads x head_dim
    assert!(matches!(
        run(&ins, a, &tile(16, 4, 0)),
        Err(OpError::Shape(_))
    ));
    // rows past the cache
    assert!(matches!(
        run(&ins, att(4, 2, 8, 10, 3), &tile(32, 4, 0)),
        Err(OpError::BadParam { .. })
    ));
    // no rows: only a split-KV shard may be empty, and this op takes none
    assert!(matches!(
        run(&ins, att(4, 2, 8, 0, 0), &tile(32, 4, 0)),
        Err(OpError::BadParam { .. })
    ));
    let mut int_w = ins.clone();
    int_w[3] = &wi;
    assert!(matches!(
        run(&int_w, a, &tile(32, 4, 0)),
        Err(OpError::DType(_))
    ));
    let no_k: Vec<_> = tile(32, 4, 0)
        .into_iter()
        .filter(|(k, _)| *k != "K")
        .collect();
    assert!(matches!(run(&ins, a, &no_k), Err(OpError::MissingParam(_))));
    assert!(run(&ins, a, &tile(32, 4, 0)).is_ok());
}
