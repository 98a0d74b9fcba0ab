//! ATTENTION_GEMV's CPU reference equals the unfused program it replaces — ATTENTION_TILE into
//! an activation of q's dtype, then GEMV_TILE — bit for bit (the unfused references are checked
//! against formulas in their own crates), touches nothing outside its tile, and refuses bad
//! calls with typed errors; with a position input it equals the param-only task over the rows
//! the position leaves, and the shape rule places the bias and the position by dtype.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, shape_rule_kinds, task};
use amk_core::{DType, ErrorKind, OpError, Opcode, Tensor};
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

/// A position buffer (I32 `[2]`) whose element 0 is `p`; element 1 is a decoy.
fn pos_buffer(p: i64) -> Tensor {
    Tensor::from_i64(DType::I32, &[2], &[p, 1000]).unwrap()
}

/// Rows of the window `[start, start + len)` at or before `p`, counted one by one.
fn rows_upto(start: usize, len: usize, p: i64) -> usize {
    (start..start + len).filter(|&j| (j as i64) <= p).count()
}

/// With a position input the task computes what the param-only task over the rows the
/// position leaves computes, bit for bit (that one equals ATTENTION_TILE then GEMV_TILE,
/// above), and touches nothing outside its tile: the position after W or after the bias.
#[rstest]
#[case::whole_cache_first_row(0, 12, 0, true)]
#[case::whole_cache_middle(0, 12, 6, false)]
#[case::whole_cache_last_row(0, 12, 11, true)]
#[case::window_cut(3, 5, 5, false)]
#[case::beyond_the_window(3, 5, 30, true)]
#[case::window_start(3, 5, 3, false)]
fn the_position_form_equals_the_param_form(
    #[case] start: usize,
    #[case] len: usize,
    #[case] p: i64,
    #[case] bias: bool,
) {
    let window = att(4, 2, 8, start, len);
    let clipped = att(4, 2, 8, start, rows_upto(start, len, p));
    let (n, n_off, n_tile) = (7, 2, 4);
    let ops = operands(window, n, DType::BF16, DType::BF16, bias, 31 + p as u64);
    let pos = pos_buffer(p);
    let run = |ins: &[&Tensor], a: Att| {
        let mut out = [Tensor::poisoned(DType::BF16, &[1, n as u64])];
        let mut params = att_params(a);
        params.extend(tile(32, n_tile, n_off));
        let t = task(Opcode::ATTENTION_GEMV, ins.len(), 1, &params);
        call(op_attention_gemv::reference::run, &t, ins, &mut out).unwrap();
        let [out] = out;
        out
    };
    let mut ins: Vec<&Tensor> = ops.iter().collect();
    let want = run(&ins, clipped);
    ins.push(&pos);
    let got = run(&ins, window);
    for i in 0..n {
        let (g, w) = (got.get_f32(i), want.get_f32(i));
        if (n_off..n_off + n_tile).contains(&i) {
            assert_eq!(g.to_bits(), w.to_bits(), "column {i}: {g} vs {w}");
        } else {
            assert!(g.is_nan(), "column {i} outside the tile was written");
        }
    }
}

#[test]
fn a_fifth_input_is_the_bias_or_the_position_by_its_dtype() {
    use op_attention_gemv::operand_slots;
    assert_eq!(operand_slots(4, false), (None, None));
    assert_eq!(operand_slots(5, false), (Some(4), None));
    assert_eq!(operand_slots(5, true), (None, Some(4)));
    assert_eq!(operand_slots(6, false), (Some(4), Some(5)));
    assert_eq!(operand_slots(6, true), (Some(4), Some(5)));
    assert_eq!(op_attention_gemv::SPEC.max_inputs, Some(6));
}

#[test]
fn bad_positions_are_typed_errors() {
    let a = att(4, 2, 8, 2, 6);
    let ops = operands(a, 6, DType::F32, DType::F32, true, 9);
    let run = |ins: &[&Tensor]| {
        let mut out = [Tensor::poisoned(DType::F32, &[1, 6])];
        let mut params = att_params(a);
        params.extend(tile(32, 4, 0));
        let t = task(Opcode::ATTENTION_GEMV, ins.len(), 1, &params);
        let r = call(op_attention_gemv::reference::run, &t, ins, &mut out);
        if r.is_err() {
            assert!(
                out[0].to_f32_vec().iter().all(|x| x.is_nan()),
                "a failed call wrote"
            );
        }
        r
    };
    let (q, k, v, w, b) = (&ops[0], &ops[1], &ops[2], &ops[3], &ops[4]);
    // A negative position, with and without the bias.
    let neg = pos_buffer(-3);
    let index = Err(OpError::IndexOutOfRange {
        at: 0,
        value: -3,
        limit: 1 << 31,
    });
    assert_eq!(run(&[q, k, v, w, &neg]), index);
    assert_eq!(run(&[q, k, v, w, b, &neg]), index);
    // A position before the window: nothing to attend to, and this op writes no partials.
    assert!(matches!(
        run(&[q, k, v, w, b, &pos_buffer(1)]),
        Err(OpError::BadParam { .. })
    ));
    assert!(run(&[q, k, v, w, b, &pos_buffer(2)]).is_ok());
    // Six inputs: the fifth must be the (float) bias, the sixth the (integer) position.
    let p = pos_buffer(4);
    assert!(matches!(run(&[q, k, v, w, &p, &p]), Err(OpError::DType(_))));
    assert!(matches!(run(&[q, k, v, w, b, b]), Err(OpError::DType(_))));
    // Seven inputs.
    assert!(matches!(
        run(&[q, k, v, w, b, &p, &p]),
        Err(OpError::Arity { .. })
    ));
}

/// The static shape rule on `[q, kcache, vcache, W, extra..]` (the attention of
/// `bad_positions_are_typed_errors`, one 6-row output tile) with extra inputs of these dtypes.
fn findings(extra: &[(DType, &[u64])]) -> Vec<ErrorKind> {
    let buffer = amk_core::testkit::buffer;
    let mut buffers = vec![
        buffer(0, DType::F32, &[4, 8]),
        buffer(1, DType::F32, &[12, 2, 8]),
        buffer(2, DType::F32, &[12, 2, 8]),
        buffer(3, DType::F32, &[6, 32]),
    ];
    for (i, (dt, shape)) in extra.iter().enumerate() {
        buffers.push(buffer(4 + i as u32, *dt, shape));
    }
    let out = buffers.len() as u32;
    buffers.push(buffer(out, DType::F32, &[1, 6]));
    let mut params = att_params(att(4, 2, 8, 0, 12));
    params.extend(tile(32, 6, 0));
    let mut t = task(Opcode::ATTENTION_GEMV, 4 + extra.len(), 1, &params);
    t.outputs = vec![out];
    assert!(
        op_attention_gemv::SPEC.check.is_some(),
        "ATTENTION_GEMV has a shape rule"
    );
    shape_rule_kinds(&op_attention_gemv::SPEC, &t, &buffers)
}

#[test]
fn the_shape_rule_places_the_bias_and_the_position() {
    const BIAS: (DType, &[u64]) = (DType::F32, &[6]);
    const POS: (DType, &[u64]) = (DType::I32, &[1]);
    assert!(findings(&[]).is_empty());
    assert!(findings(&[BIAS]).is_empty());
    assert!(findings(&[POS]).is_empty());
    assert!(findings(&[(DType::U8, &[3])]).is_empty());
    assert!(findings(&[BIAS, POS]).is_empty());
    // A float position after the bias; an integer bias before the position; the position
    // first; an empty position buffer.
    let mismatch = vec![ErrorKind::ShapeMismatch];
    assert_eq!(findings(&[BIAS, (DType::F32, &[1])]), mismatch);
    assert_eq!(findings(&[(DType::I32, &[6]), POS]), mismatch);
    assert!(!findings(&[POS, BIAS]).is_empty());
    assert_eq!(findings(&[(DType::I32, &[0])]), mismatch);
}
