//! QKV_ROPE_APPEND's CPU reference equals the unfused program it replaces — (RMSNORM →) Q, K
//! and V GEMV_TILEs into activations, ROPE on Q and K, KV_APPEND of K and V at `pos` — bit for
//! bit (those references are checked against f64 formulas in their own crates), across tiles
//! that split heads; cache rows other than `pos` keep their values; bad calls are typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::cpu::Input;
use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{CpuCall, DType, OpError, Opcode, Tensor};
use op_qkv_rope_append::reference::{Pair, pair_of};
use rstest::rstest;

struct Shape {
    k: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    seq: usize,
    pos: usize,
}

fn params(s: &Shape, n_off: usize, n_tile: usize, norm: bool) -> Vec<(&'static str, Value)> {
    let mut p = vec![
        ("K", Value::Int(s.k as i64)),
        ("N_tile", Value::Int(n_tile as i64)),
        ("n_off", Value::Int(n_off as i64)),
        ("head_dim", Value::Int(s.hd as i64)),
        ("n_heads", Value::Int(s.nh as i64)),
        ("n_kv_heads", Value::Int(s.nkv as i64)),
        ("theta", Value::Float(10000.0)),
    ];
    if norm {
        p.push(("eps", Value::Float(1e-5)));
    }
    p
}

fn gemv(x: &Tensor, w: &Tensor, k: usize, n: usize, dt: DType) -> Tensor {
    let t = task(
        Opcode::GEMV_TILE,
        2,
        1,
        &[
            ("K", Value::Int(k as i64)),
            ("N_tile", Value::Int(n as i64)),
            ("n_off", Value::Int(0)),
        ],
    );
    let mut o = [Tensor::poisoned(dt, &[1, n as u64])];
    call(op_gemv_tile::reference::run, &t, &[x, w], &mut o).unwrap();
    let [o] = o;
    o
}

/// ROPE (positions buffer `[pos]`, per-pair frequency factors when given) of `x` viewed as
/// `shape`.
fn rope(
    x: &Tensor,
    shape: &[u64],
    pos: usize,
    hd: usize,
    dt: DType,
    factors: Option<&Tensor>,
) -> Tensor {
    let mut v = Tensor::poisoned(dt, shape);
    for i in 0..x.numel() {
        v.set_f32(i, x.get_f32(i));
    }
    let p = Tensor::from_f32(DType::I32, &[1], &[pos as f32]).unwrap();
    let mut ins = vec![&v, &p];
    ins.extend(factors);
    let t = task(
        Opcode::ROPE,
        ins.len(),
        1,
        &[
            ("head_dim", Value::Int(hd as i64)),
            ("theta", Value::Float(10000.0)),
        ],
    );
    let mut o = [Tensor::poisoned(dt, shape)];
    call(op_rope::reference::run, &t, &ins, &mut o).unwrap();
    let [o] = o;
    o
}

/// RMSNORM over each `hd`-element head of `x` with weight `w` (Qwen3's q/k norm), given;
/// `x` otherwise.
fn head_norm(x: Tensor, hd: usize, w: Option<&Tensor>, dt: DType) -> Tensor {
    let Some(w) = w else { return x };
    let shape = [(x.numel() / hd) as u64, hd as u64];
    let mut v = Tensor::poisoned(dt, &shape);
    for i in 0..x.numel() {
        v.set_f32(i, x.get_f32(i));
    }
    let t = task(
        Opcode::RMSNORM,
        2,
        1,
        &[
            ("eps", Value::Float(1e-5)),
            ("hidden", Value::Int(hd as i64)),
        ],
    );
    let mut o = [Tensor::poisoned(dt, &shape)];
    call(op_rmsnorm::reference::run, &t, &[&v, w], &mut o).unwrap();
    let [o] = o;
    o
}

/// KV_APPEND of `new` into `cache` at `pos`, in place.
fn append(new: &Tensor, cache: &mut Tensor, pos: usize) {
    let t = task(Opcode::KV_APPEND, 2, 1, &[("pos", Value::Int(pos as i64))]);
    let ins = [Input::Tensor(new), Input::InPlace(0)];
    op_kv_append::reference::run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &ins,
        outputs: std::slice::from_mut(cache),
    })
    .unwrap();
}

#[rstest]
#[case::gqa_f32_one_tile(Shape { k: 16, nh: 4, nkv: 2, hd: 8, seq: 5, pos: 3 }, DType::F32, false, &[(0, 64)], false, false)]
#[case::gqa_bf16_norm_tiles(Shape { k: 32, nh: 4, nkv: 2, hd: 8, seq: 6, pos: 0 }, DType::BF16, true, &[(0, 20), (20, 24), (44, 20)], false, false)]
#[case::mqa_f16_odd_k(Shape { k: 13, nh: 3, nkv: 1, hd: 4, seq: 4, pos: 2 }, DType::F16, true, &[(0, 6), (6, 8), (14, 6)], false, false)]
// Llama 3's frequency factors: the last input, with and without the norm before it.
#[case::gqa_f32_factors(Shape { k: 16, nh: 4, nkv: 2, hd: 8, seq: 5, pos: 4 }, DType::F32, false, &[(0, 64)], true, false)]
#[case::gqa_bf16_norm_factors_tiles(Shape { k: 32, nh: 4, nkv: 2, hd: 16, seq: 9, pos: 7 }, DType::BF16, true, &[(0, 40), (40, 48), (88, 40)], true, false)]
// Qwen3's per-head q/k norms: tiles of whole heads; heads × head_dim ≠ K.
#[case::qwen3_f32_qk_norm(Shape { k: 16, nh: 4, nkv: 2, hd: 12, seq: 5, pos: 3 }, DType::F32, false, &[(0, 96)], false, true)]
#[case::qwen3_bf16_norm_qk_norm_tiles(Shape { k: 32, nh: 4, nkv: 2, hd: 8, seq: 6, pos: 5 }, DType::BF16, true, &[(0, 16), (16, 32), (48, 16)], false, true)]
#[case::qwen3_f16_qk_norm_factors(Shape { k: 24, nh: 2, nkv: 1, hd: 6, seq: 4, pos: 2 }, DType::F16, false, &[(0, 6), (6, 18)], true, true)]
fn equals_the_unfused_prologue(
    #[case] s: Shape,
    #[case] dt: DType,
    #[case] norm: bool,
    #[case] tiles: &[(usize, usize)],
    #[case] with_factors: bool,
    #[case] qk_norm: bool,
) {
    let mut r = rng((s.k * 7 + s.nh * 3 + s.pos) as u64);
    let (k, qd, kvd) = (s.k as u64, (s.nh * s.hd) as u64, (s.nkv * s.hd) as u64);
    let x = random_nonzero(dt, &[1, k], &mut r, -2.0, 2.0);
    let nw = random_nonzero(dt, &[k], &mut r, 0.5, 1.5);
    let wq = random_nonzero(dt, &[qd, k], &mut r, -1.0, 1.0);
    let wk = random_nonzero(dt, &[kvd, k], &mut r, -1.0, 1.0);
    let wv = random_nonzero(dt, &[kvd, k], &mut r, -1.0, 1.0);
    let cache_shape = [s.seq as u64, s.nkv as u64, s.hd as u64];
    // Caches start with random old rows, which the op must keep.
    let kc0 = random_nonzero(dt, &cache_shape, &mut r, -1.0, 1.0);
    let vc0 = random_nonzero(dt, &cache_shape, &mut r, -1.0, 1.0);
    let factors = random_nonzero(DType::F32, &[s.hd as u64 / 2], &mut r, 1.0, 8.0);
    let fac = with_factors.then_some(&factors);
    let qn = random_nonzero(dt, &[s.hd as u64], &mut r, 0.5, 1.5);
    let kn = random_nonzero(dt, &[s.hd as u64], &mut r, 0.5, 1.5);
    let (qn_in, kn_in) = (qk_norm.then_some(&qn), qk_norm.then_some(&kn));

    // Unfused.
    let xs = if norm {
        let t = task(
            Opcode::RMSNORM,
            2,
            1,
            &[
                ("eps", Value::Float(1e-5)),
                ("hidden", Value::Int(s.k as i64)),
            ],
        );
        let mut o = [Tensor::poisoned(dt, &[1, k])];
        call(op_rmsnorm::reference::run, &t, &[&x, &nw], &mut o).unwrap();
        let [o] = o;
        o
    } else {
        x.clone()
    };
    let q_want = rope(
        &head_norm(gemv(&xs, &wq, s.k, qd as usize, dt), s.hd, qn_in, dt),
        &[s.nh as u64, s.hd as u64],
        s.pos,
        s.hd,
        dt,
        fac,
    );
    let k_rot = rope(
        &head_norm(gemv(&xs, &wk, s.k, kvd as usize, dt), s.hd, kn_in, dt),
        &[1, s.nkv as u64, s.hd as u64],
        s.pos,
        s.hd,
        dt,
        fac,
    );
    let v_new = gemv(&xs, &wv, s.k, kvd as usize, dt);
    let (mut kc_want, mut vc_want) = (kc0.clone(), vc0.clone());
    append(&k_rot, &mut kc_want, s.pos);
    append(&v_new, &mut vc_want, s.pos);

    // Fused, tile by tile into the same outputs.
    let mut outs = [
        Tensor::poisoned(dt, &[s.nh as u64, s.hd as u64]),
        kc0.clone(),
        vc0.clone(),
    ];
    let posb = Tensor::from_f32(DType::I32, &[1], &[s.pos as f32]).unwrap();
    let mut ins = vec![&x, &wq, &wk, &wv, &posb];
    if norm {
        ins.push(&nw);
    }
    ins.extend(qn_in);
    ins.extend(kn_in);
    ins.extend(fac);
    for &(off, nt) in tiles {
        let mut p = params(&s, off, nt, norm || qk_norm);
        if with_factors {
            p.push(("rope_factors", Value::Int(1)));
        }
        if qk_norm {
            p.push(("qk_norm", Value::Int(1)));
        }
        let t = task(Opcode::QKV_ROPE_APPEND, ins.len(), 3, &p);
        call(op_qkv_rope_append::reference::run, &t, &ins, &mut outs).unwrap();
    }
    for (got, want, name) in [
        (&outs[0], &q_want, "q"),
        (&outs[1], &kc_want, "kcache"),
        (&outs[2], &vc_want, "vcache"),
    ] {
        for i in 0..want.numel() {
            let (a, b) = (got.get_f32(i), want.get_f32(i));
            assert_eq!(a.to_bits(), b.to_bits(), "{name}[{i}]: {a} vs {b}");
        }
    }
}

#[test]
fn units_pair_rows_of_one_head() {
    // head_dim 8, 2 Q heads, 1 KV head: units 0..16 are Q, 16..24 K, 24..32 V.
    assert_eq!(
        pair_of(0, 8, 2, 1),
        Pair {
            proj: 0,
            row: 0,
            i: 0
        }
    );
    assert_eq!(
        pair_of(6, 8, 2, 1),
        Pair {
            proj: 0,
            row: 3,
            i: 3
        }
    );
    assert_eq!(
        pair_of(10, 8, 2, 1),
        Pair {
            proj: 0,
            row: 9,
            i: 1
        }
    );
    assert_eq!(
        pair_of(18, 8, 2, 1),
        Pair {
            proj: 1,
            row: 1,
            i: 1
        }
    );
    assert_eq!(
        pair_of(30, 8, 2, 1),
        Pair {
            proj: 2,
            row: 3,
            i: 3
        }
    );
}

#[test]
fn bad_calls_are_typed_errors() {
    let s = Shape {
        k: 8,
        nh: 2,
        nkv: 1,
        hd: 4,
        seq: 3,
        pos: 1,
    };
    let mut r = rng(9);
    let x = random_nonzero(DType::F32, &[1, 8], &mut r, -1.0, 1.0);
    let wq = random_nonzero(DType::F32, &[8, 8], &mut r, -1.0, 1.0);
    let wk = random_nonzero(DType::F32, &[4, 8], &mut r, -1.0, 1.0);
    let posb = Tensor::from_f32(DType::I32, &[1], &[s.pos as f32]).unwrap();
    let fpos = Tensor::from_f32(DType::F32, &[1], &[1.0]).unwrap();
    let run = |p: &[(&str, Value)], wk: &Tensor, seq: u64, pos: &Tensor| {
        let mut outs = [
            Tensor::poisoned(DType::F32, &[2, 4]),
            Tensor::poisoned(DType::F32, &[seq, 1, 4]),
            Tensor::poisoned(DType::F32, &[seq, 1, 4]),
        ];
        let t = task(Opcode::QKV_ROPE_APPEND, 5, 3, p);
        call(
            op_qkv_rope_append::reference::run,
            &t,
            &[&x, &wq, wk, wk, pos],
            &mut outs,
        )
    };
    let p = params(&s, 0, 16, false);
    assert!(run(&p, &wk, 3, &posb).is_ok());
    assert!(matches!(
        run(&params(&s, 1, 4, false), &wk, 3, &posb),
        Err(OpError::BadParam { .. })
    ));
    assert!(matches!(
        run(&params(&s, 0, 18, false), &wk, 3, &posb),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(run(&p, &wq, 3, &posb), Err(OpError::Shape(_))));
    // Position 1 is beyond a one-row cache: an index error, as the device reports it.
    assert!(matches!(
        run(&p, &wk, 1, &posb),
        Err(OpError::IndexOutOfRange {
            value: 1,
            limit: 1,
            ..
        })
    ));
    assert!(matches!(run(&p, &wk, 3, &fpos), Err(OpError::DType(_))));
}

/// The shape the shape-rule tests use: K 16, 4 Q heads and 2 KV heads of 8, 5 cache rows.
fn rule_shape() -> Shape {
    Shape {
        k: 16,
        nh: 4,
        nkv: 2,
        hd: 8,
        seq: 5,
        pos: 0,
    }
}

/// [`rule_shape`]'s buffers: x, Wq, Wk, Wv, pos (ids 0-4), the three `optional` ones (5-7),
/// then q, kcache, vcache (8-10), all F32 but pos.
fn rule_buffers(optional: [(DType, &[u64]); 3]) -> [amk_core::ir::Buffer; 11] {
    let buf = amk_core::testkit::buffer;
    let [(d5, s5), (d6, s6), (d7, s7)] = optional;
    [
        buf(0, DType::F32, &[1, 16]),
        buf(1, DType::F32, &[32, 16]),
        buf(2, DType::F32, &[16, 16]),
        buf(3, DType::F32, &[16, 16]),
        buf(4, DType::I32, &[1]),
        buf(5, d5, s5),
        buf(6, d6, s6),
        buf(7, d7, s7),
        buf(8, DType::F32, &[4, 8]),
        buf(9, DType::F32, &[5, 2, 8]),
        buf(10, DType::F32, &[5, 2, 8]),
    ]
}

/// The shape rule of the frequency factors: `rope_factors` 0 or 1; with 1, the last input is
/// `head_dim / 2` floats (after the norm weight when there is one); 7 inputs need it.
#[test]
fn the_shape_rule_places_and_checks_the_frequency_factors() {
    use amk_core::ErrorKind;
    use amk_core::testkit::shape_rule_kinds;
    let s = rule_shape();
    let buffers = rule_buffers([
        (DType::F32, &[16]), // 5: norm weight
        (DType::F32, &[4]),  // 6: factors (head_dim / 2)
        (DType::F32, &[3]),  // 7: factors of the wrong length
    ]);
    let rule = |inputs: &[u32], factors: Option<i64>| {
        let norm = inputs.contains(&5);
        let mut p = params(&s, 0, 64, norm);
        if let Some(v) = factors {
            p.push(("rope_factors", Value::Int(v)));
        }
        let mut t = task(Opcode::QKV_ROPE_APPEND, inputs.len(), 3, &p);
        t.inputs = inputs.to_vec();
        t.outputs = vec![8, 9, 10];
        shape_rule_kinds(&op_qkv_rope_append::SPEC, &t, &buffers)
    };
    assert!(rule(&[0, 1, 2, 3, 4], None).is_empty());
    assert!(rule(&[0, 1, 2, 3, 4, 6], Some(1)).is_empty());
    assert!(rule(&[0, 1, 2, 3, 4, 5, 6], Some(1)).is_empty());
    assert!(rule(&[0, 1, 2, 3, 4, 5], Some(0)).is_empty());
    assert_eq!(
        rule(&[0, 1, 2, 3, 4, 5, 7], Some(1)),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        rule(&[0, 1, 2, 3, 4, 5, 6], None),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        rule(&[0, 1, 2, 3, 4], Some(1)),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        rule(&[0, 1, 2, 3, 4, 6], Some(2)),
        vec![ErrorKind::TileOutOfBounds]
    );
}

/// Where the optional inputs are, for each combination of options.
#[test]
fn optional_inputs_follow_the_options() {
    use op_qkv_rope_append::{OptionalInputs, Options, QkNormInputs, optional_inputs};
    let (factors, qk) = (
        Options {
            rope_factors: true,
            qk_norm: false,
        },
        Options {
            rope_factors: false,
            qk_norm: true,
        },
    );
    let both = Options {
        rope_factors: true,
        qk_norm: true,
    };
    let at = |norm, qk: Option<(usize, usize)>, factors| OptionalInputs {
        norm,
        qk_norm: qk.map(|(q, k)| QkNormInputs { q, k }),
        factors,
    };
    assert_eq!(
        optional_inputs(5, Options::default()),
        Some(at(None, None, None))
    );
    assert_eq!(
        optional_inputs(6, Options::default()),
        Some(at(Some(5), None, None))
    );
    assert_eq!(optional_inputs(7, Options::default()), None);
    assert_eq!(
        optional_inputs(7, factors),
        Some(at(Some(5), None, Some(6)))
    );
    assert_eq!(optional_inputs(6, factors), Some(at(None, None, Some(5))));
    assert_eq!(optional_inputs(7, qk), Some(at(None, Some((5, 6)), None)));
    assert_eq!(
        optional_inputs(8, qk),
        Some(at(Some(5), Some((6, 7)), None))
    );
    assert_eq!(
        optional_inputs(9, both),
        Some(at(Some(5), Some((6, 7)), Some(8)))
    );
    assert_eq!(
        optional_inputs(8, both),
        Some(at(None, Some((5, 6)), Some(7)))
    );
    assert_eq!(optional_inputs(7, both), None);
    assert_eq!(optional_inputs(6, qk), None);
}

/// The shape rule of the per-head norms: `qk_norm` 0 or 1; with 1, two float inputs of
/// `head_dim` elements, param `eps`, tiles of whole heads, and the row and the tile's heads
/// within the shared memory.
#[test]
fn the_shape_rule_checks_the_qk_norm() {
    use amk_core::ErrorKind;
    use amk_core::testkit::shape_rule_kinds;
    let s = rule_shape();
    let mut buffers = rule_buffers([
        (DType::F32, &[8]), // 5: q norm
        (DType::F32, &[8]), // 6: k norm
        (DType::F32, &[7]), // 7: a norm of the wrong length
    ])
    .to_vec();
    buffers.push(amk_core::testkit::buffer(11, DType::I32, &[8])); // an integer norm
    let rule = |inputs: &[u32], tile: (usize, usize), qk: Option<i64>, eps: bool| {
        let mut p = params(&s, tile.0, tile.1, eps);
        if let Some(v) = qk {
            p.push(("qk_norm", Value::Int(v)));
        }
        let mut t = task(Opcode::QKV_ROPE_APPEND, inputs.len(), 3, &p);
        t.inputs = inputs.to_vec();
        t.outputs = vec![8, 9, 10];
        shape_rule_kinds(&op_qkv_rope_append::SPEC, &t, &buffers)
    };
    let qk = [0, 1, 2, 3, 4, 5, 6];
    assert!(rule(&qk, (0, 64), Some(1), true).is_empty());
    assert!(rule(&qk, (8, 16), Some(1), true).is_empty());
    assert_eq!(
        rule(&qk, (0, 64), Some(0), true),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        rule(&qk, (0, 64), Some(1), false),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        rule(&qk, (0, 64), Some(2), true),
        vec![ErrorKind::TileOutOfBounds]
    );
    assert_eq!(
        rule(&qk, (4, 8), Some(1), true),
        vec![ErrorKind::TileOutOfBounds]
    );
    assert_eq!(
        rule(&qk, (0, 12), Some(1), true),
        vec![ErrorKind::TileOutOfBounds]
    );
    assert_eq!(
        rule(&[0, 1, 2, 3, 4, 5, 7], (0, 64), Some(1), true),
        vec![ErrorKind::ShapeMismatch]
    );
    assert!(!rule(&[0, 1, 2, 3, 4, 11, 6], (0, 64), Some(1), true).is_empty());
}
