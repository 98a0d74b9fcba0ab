//! ATTENTION_TILE's CPU reference against an independent f64 formula: GQA ratios 1/2/4/8,
//! odd head dims, flat and head-shaped operands, `kv_start > 0` windows, batched rank-3/4
//! operands, split-KV partial shards (including the empty shard), a position input that clips
//! the window (and equals the param form it replaces, bit for bit), typed errors for bad calls,
//! and the shape rule on the position buffer. Inputs are fresh random non-zero values, outputs
//! are poisoned before the call.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_arguments
)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, shape_rule_kinds};
use amk_core::{CpuCall, DType, ErrorKind, Input, OpError, Opcode, Task, Tensor};
use op_attention_tile::reference::run;
use rstest::rstest;

/// Geometry of one case.
#[derive(Clone, Copy)]
struct Geo {
    batch: usize,
    max_seq: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
}

fn params(g: Geo, kv_start: i64, kv_len: i64, scale: f64, flags: Option<i64>) -> Task {
    let mut p: Vec<(&str, Value)> = vec![
        ("head_dim", Value::Int(g.hd as i64)),
        ("kv_start", Value::Int(kv_start)),
        ("kv_len", Value::Int(kv_len)),
        ("scale", Value::Float(scale)),
        ("n_heads", Value::Int(g.nh as i64)),
        ("n_kv_heads", Value::Int(g.nkv as i64)),
    ];
    if let Some(f) = flags {
        p.push(("flags", Value::Int(f)));
    }
    amk_core::testkit::task(Opcode::ATTENTION_TILE, 3, 1, &p)
}

/// The naive f64 formula: per (b, h), `[acc | m | l]` over rows `[start, start + len)` of
/// the cache laid out `[B, max_seq, n_kv, hd]`; query head h reads kv head `h * nkv / nh`.
fn naive_partials(
    g: Geo,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    start: usize,
    len: usize,
    scale: f64,
) -> Vec<(Vec<f64>, f64, f64)> {
    let group = g.nh / g.nkv;
    let mut res = Vec::new();
    for b in 0..g.batch {
        for h in 0..g.nh {
            let kvh = h / group;
            let cache_at = |j: usize, d: usize| (((b * g.max_seq + j) * g.nkv + kvh) * g.hd) + d;
            let s: Vec<f64> = (start..start + len)
                .map(|j| {
                    (0..g.hd)
                        .map(|d| {
                            q.get_f32((b * g.nh + h) * g.hd + d) as f64
                                * k.get_f32(cache_at(j, d)) as f64
                        })
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum();
            let acc: Vec<f64> = (0..g.hd)
                .map(|d| {
                    (start..start + len)
                        .zip(&e)
                        .map(|(j, w)| w * v.get_f32(cache_at(j, d)) as f64)
                        .sum()
                })
                .collect();
            res.push((acc, m, l));
        }
    }
    res
}

fn naive_out(parts: &[(Vec<f64>, f64, f64)]) -> Vec<f64> {
    parts
        .iter()
        .flat_map(|(acc, _, l)| acc.iter().map(move |a| a / l))
        .collect()
}

/// Checks a `[acc | m | l]` output: infinite `m` must match exactly, the rest within tolerance.
fn assert_partials(got: &Tensor, want: &[(Vec<f64>, f64, f64)], tol: f64) {
    let hd = want[0].0.len();
    assert_eq!(got.numel(), want.len() * (hd + 2));
    let mut flat = Vec::new();
    for (h, (acc, m, l)) in want.iter().enumerate() {
        let base = h * (hd + 2);
        if m.is_infinite() {
            assert_eq!(got.get_f32(base + hd) as f64, *m, "head {h}: m");
            flat.extend(acc.iter().copied());
            flat.push(0.0); // checked above; patched below
            flat.push(*l);
        } else {
            flat.extend(acc.iter().copied());
            flat.push(*m);
            flat.push(*l);
        }
    }
    // Replace the exactly-checked infinite m slots by the got value so assert_close skips them.
    let mut patched = got.clone();
    for (h, (_, m, _)) in want.iter().enumerate() {
        if m.is_infinite() {
            patched.set_f32(h * (hd + 2) + hd, 0.0);
        }
    }
    assert_close(&patched, &flat, 1e-5, tol);
}

#[rstest]
// GQA 1, cache [seq, n_kv, hd], query [n_heads, hd], output [1, q_dim].
#[case(&[4, 8], &[16, 4, 8], &[1, 32], 4, 4, 8, 0, 16, 0.35, None, [DType::F32; 3])]
// GQA 2, window starting past 0, flat query and output.
#[case(&[128], &[10, 4, 16], &[128], 8, 4, 16, 3, 5, 0.25, None, [DType::F32; 3])]
// GQA 4, odd head_dim, flat rank-2 cache [seq, n_kv * hd].
#[case(&[1, 56], &[12, 14], &[8, 7], 8, 2, 7, 5, 7, 0.378, None, [DType::F32; 3])]
// GQA 8, a single cache row (the first decode step), head_dim 5.
#[case(&[8, 5], &[9, 1, 5], &[40], 8, 1, 5, 0, 1, 0.447, None, [DType::F32; 3])]
// GQA 8 over the last rows of the cache; causal bit set (ignored at decode).
#[case(&[16, 4], &[11, 2, 4], &[64], 16, 2, 4, 6, 5, 0.5, Some(1), [DType::F32; 3])]
// Batched: rank-3 query [B, n_heads, hd], rank-4 caches [B, max_seq, n_kv, hd].
#[case(&[3, 4, 8], &[3, 6, 2, 8], &[3, 32], 4, 2, 8, 1, 4, 0.35, None, [DType::F32; 3])]
// Batched GQA 8, odd head_dim, bf16 caches.
#[case(&[2, 8, 3], &[2, 5, 1, 3], &[2, 8, 3], 8, 1, 3, 2, 3, 0.577, None, [DType::F32, DType::BF16, DType::F32])]
// f16 everywhere, head_dim 64, GQA 2.
#[case(&[6, 64], &[20, 3, 64], &[1, 384], 6, 3, 64, 7, 13, 0.125, None, [DType::F16; 3])]
// bf16 query and output, GQA 4, head_dim 1.
#[case(&[8, 1], &[7, 2, 1], &[8], 8, 2, 1, 2, 5, 1.0, None, [DType::BF16, DType::F32, DType::BF16])]
// Long window, GQA 1, head_dim 33.
#[case(&[2, 33], &[70, 2, 33], &[66], 2, 2, 33, 9, 61, 0.174, Some(0), [DType::F32; 3])]
fn normalised_output_matches_f64_formula(
    #[case] qshape: &[u64],
    #[case] cshape: &[u64],
    #[case] oshape: &[u64],
    #[case] nh: usize,
    #[case] nkv: usize,
    #[case] hd: usize,
    #[case] start: usize,
    #[case] len: usize,
    #[case] scale: f64,
    #[case] flags: Option<i64>,
    #[case] dtypes: [DType; 3],
) {
    let [dq, dc, dout] = dtypes;
    let batch = if cshape.len() == 4 {
        cshape[0] as usize
    } else {
        1
    };
    let max_seq = cshape.iter().product::<u64>() as usize / (batch * nkv * hd);
    let g = Geo {
        batch,
        max_seq,
        nh,
        nkv,
        hd,
    };
    let mut r = rng((nh * 131 + nkv * 17 + hd * 7 + start * 3 + len) as u64);
    let q = random_nonzero(dq, qshape, &mut r, -1.5, 1.5);
    let k = random_nonzero(dc, cshape, &mut r, -1.5, 1.5);
    let v = random_nonzero(dc, cshape, &mut r, -1.0, 1.0);
    let t = params(g, start as i64, len as i64, scale, flags);
    let mut out = [Tensor::poisoned(dout, oshape)];
    call(run, &t, &[&q, &k, &v], &mut out).unwrap();
    let want = naive_out(&naive_partials(g, &q, &k, &v, start, len, scale));
    assert_close(&out[0], &want, 1e-5, 2e-6);
}

#[rstest]
// A shard in the middle of the cache, GQA 2.
#[case(&[4, 8], &[16, 2, 8], &[4, 10], 4, 2, 8, 4, 6, Some(2))]
// Batched shard covering the whole cache, GQA 1, extra flag bits set.
#[case(&[2, 4, 6], &[2, 7, 4, 6], &[2, 4, 8], 4, 4, 6, 0, 7, Some(3))]
// GQA 8, odd head_dim, a single-row shard at the end.
#[case(&[8, 3], &[5, 1, 3], &[40], 8, 1, 3, 4, 1, Some(2))]
// GQA 4, flat cache, flat output.
#[case(&[128], &[9, 32], &[8, 18], 8, 2, 16, 2, 7, Some(2))]
// Empty shard (kv_len = 0): acc = 0, m = -inf, l = 0.
#[case(&[4, 8], &[16, 2, 8], &[4, 10], 4, 2, 8, 5, 0, Some(2))]
// Empty shard at the very end of a batched cache.
#[case(&[2, 8, 5], &[2, 6, 2, 5], &[2, 8, 7], 8, 2, 5, 6, 0, Some(2))]
fn partial_shard_matches_f64_formula(
    #[case] qshape: &[u64],
    #[case] cshape: &[u64],
    #[case] oshape: &[u64],
    #[case] nh: usize,
    #[case] nkv: usize,
    #[case] hd: usize,
    #[case] start: usize,
    #[case] len: usize,
    #[case] flags: Option<i64>,
) {
    let batch = if cshape.len() == 4 {
        cshape[0] as usize
    } else {
        1
    };
    let max_seq = cshape.iter().product::<u64>() as usize / (batch * nkv * hd);
    let g = Geo {
        batch,
        max_seq,
        nh,
        nkv,
        hd,
    };
    let scale = 1.0 / (hd as f64).sqrt();
    let mut r = rng((nh * 31 + hd * 5 + start * 11 + len) as u64);
    let q = random_nonzero(DType::F32, qshape, &mut r, -2.0, 2.0);
    let k = random_nonzero(DType::F32, cshape, &mut r, -2.0, 2.0);
    let v = random_nonzero(DType::F32, cshape, &mut r, -1.0, 1.0);
    let t = params(g, start as i64, len as i64, scale, flags);
    let mut out = [Tensor::poisoned(DType::F32, oshape)];
    call(run, &t, &[&q, &k, &v], &mut out).unwrap();
    let want = naive_partials(g, &q, &k, &v, start, len, scale);
    if len == 0 {
        for (h, (acc, m, l)) in want.iter().enumerate() {
            assert!(acc.iter().all(|a| *a == 0.0) && *m == f64::NEG_INFINITY && *l == 0.0);
            for d in 0..hd {
                assert_eq!(out[0].get_f32(h * (hd + 2) + d), 0.0);
            }
            assert_eq!(out[0].get_f32(h * (hd + 2) + hd), f32::NEG_INFINITY);
            assert_eq!(out[0].get_f32(h * (hd + 2) + hd + 1), 0.0);
        }
    }
    assert_partials(&out[0], &want, 1e-5 * (len.max(1) as f64));
}

/// Rows a position `p` leaves of the window `[start, start + len)`, written out as the rule
/// states it: the rows `j` of the window with `j <= p`.
fn rows_upto(start: usize, len: usize, p: i64) -> usize {
    (start..start + len).filter(|&j| (j as i64) <= p).count()
}

/// A position buffer of `dtype` and `shape` whose element 0 is `p` (the rest are decoys the
/// op must not read: far past every window).
fn pos_buffer(dtype: DType, shape: &[u64], p: i64) -> Tensor {
    let n = shape.iter().product::<u64>() as usize;
    let mut v = vec![97i64; n];
    v[0] = p;
    Tensor::from_i64(dtype, shape, &v).unwrap()
}

#[rstest]
// The whole cache as the window (the lowering's single task): p = 0, a middle row, the last.
#[case(0, 12, 0, None, DType::I32)]
#[case(0, 12, 5, None, DType::I32)]
#[case(0, 12, 11, None, DType::I32)]
// A window starting past 0: p inside it, p beyond it (clipped to the window), p at its start.
#[case(3, 6, 6, None, DType::I32)]
#[case(3, 6, 40, None, DType::I8)]
#[case(3, 6, 3, None, DType::U8)]
// Split-KV shards: a middle shard that p cuts, one p has not reached (empty), the trailing one.
#[case(4, 4, 5, Some(2), DType::I32)]
#[case(8, 4, 5, Some(2), DType::I32)]
#[case(12, 0, 5, Some(2), DType::I32)]
#[case(0, 4, 0, Some(2), DType::I32)]
fn a_position_clips_the_window(
    #[case] start: usize,
    #[case] len: usize,
    #[case] p: i64,
    #[case] flags: Option<i64>,
    #[case] pdt: DType,
) {
    let g = Geo {
        batch: 1,
        max_seq: 12,
        nh: 4,
        nkv: 2,
        hd: 8,
    };
    let partial = flags.is_some();
    let scale = 0.35;
    let mut r = rng(start as u64 * 97 + len as u64 * 13 + p as u64);
    let q = random_nonzero(DType::F32, &[4, 8], &mut r, -1.5, 1.5);
    let k = random_nonzero(DType::F32, &[12, 2, 8], &mut r, -1.5, 1.5);
    let v = random_nonzero(DType::F32, &[12, 2, 8], &mut r, -1.0, 1.0);
    let pos = pos_buffer(pdt, &[3], p);
    let t = params(g, start as i64, len as i64, scale, flags);
    let per_head = if partial { 10 } else { 8 };
    let mut out = [Tensor::poisoned(DType::F32, &[4, per_head])];
    call(run, &t, &[&q, &k, &v, &pos], &mut out).unwrap();
    let n = rows_upto(start, len, p);
    let want = naive_partials(g, &q, &k, &v, start, n, scale);
    if partial {
        assert_partials(&out[0], &want, 1e-5);
        if n == 0 {
            for h in 0..4 {
                assert!((0..8).all(|d| out[0].get_f32(h * 10 + d) == 0.0));
                assert_eq!(out[0].get_f32(h * 10 + 8), f32::NEG_INFINITY);
                assert_eq!(out[0].get_f32(h * 10 + 9), 0.0);
            }
        }
    } else {
        assert!(n > 0);
        assert_close(&out[0], &naive_out(&want), 1e-5, 2e-6);
    }
}

/// The position form is the param form it replaces, bit for bit: `kv_len = p + 1` without a
/// position equals the whole cache with position `p` (single tasks and split-KV shards,
/// batched caches, bf16 caches).
#[rstest]
#[case(1, 9, 0, DType::F32)]
#[case(1, 9, 4, DType::F32)]
#[case(1, 9, 8, DType::BF16)]
#[case(2, 7, 3, DType::F32)]
#[case(3, 5, 4, DType::F16)]
fn the_position_form_equals_the_param_form(
    #[case] batch: usize,
    #[case] max_seq: usize,
    #[case] p: usize,
    #[case] dc: DType,
) {
    let g = Geo {
        batch,
        max_seq,
        nh: 4,
        nkv: 1,
        hd: 6,
    };
    let b = batch as u64;
    let (qshape, cshape): (Vec<u64>, Vec<u64>) = if batch > 1 {
        (vec![b, 4, 6], vec![b, max_seq as u64, 1, 6])
    } else {
        (vec![4, 6], vec![max_seq as u64, 1, 6])
    };
    let mut r = rng(p as u64 * 7 + batch as u64);
    let q = random_nonzero(DType::F32, &qshape, &mut r, -2.0, 2.0);
    let k = random_nonzero(dc, &cshape, &mut r, -2.0, 2.0);
    let v = random_nonzero(dc, &cshape, &mut r, -1.0, 1.0);
    let pos = pos_buffer(DType::I32, &[1], p as i64);
    let bits = |t: &Tensor| -> Vec<u32> { t.to_f32_vec().iter().map(|x| x.to_bits()).collect() };
    // One task over rows [0, p] against the whole cache clipped at p.
    let oshape = [b * 4 * 6];
    let mut by_param = [Tensor::poisoned(DType::F32, &oshape)];
    let by_len = params(g, 0, p as i64 + 1, 0.4, None);
    call(run, &by_len, &[&q, &k, &v], &mut by_param).unwrap();
    let mut by_pos = [Tensor::poisoned(DType::F32, &oshape)];
    let whole = params(g, 0, max_seq as i64, 0.4, None);
    call(run, &whole, &[&q, &k, &v, &pos], &mut by_pos).unwrap();
    assert_eq!(bits(&by_param[0]), bits(&by_pos[0]));
    // Shards of 3 rows: each static shard clipped at p against the shard's rows up to p.
    let pshape = [b * 4 * 8];
    for s0 in (0..max_seq).step_by(3) {
        let slen = 3.min(max_seq - s0);
        let live = rows_upto(s0, slen, p as i64);
        let mut by_param = [Tensor::poisoned(DType::F32, &pshape)];
        let t = params(g, s0 as i64, live as i64, 0.4, Some(2));
        call(run, &t, &[&q, &k, &v], &mut by_param).unwrap();
        let mut by_pos = [Tensor::poisoned(DType::F32, &pshape)];
        let t = params(g, s0 as i64, slen as i64, 0.4, Some(2));
        call(run, &t, &[&q, &k, &v, &pos], &mut by_pos).unwrap();
        assert_eq!(bits(&by_param[0]), bits(&by_pos[0]), "shard at {s0}");
    }
}

#[test]
fn bad_positions_are_typed_errors_and_write_nothing() {
    let g = Geo {
        batch: 1,
        max_seq: 8,
        nh: 4,
        nkv: 2,
        hd: 4,
    };
    let mut r = rng(17);
    let q = random_nonzero(DType::F32, &[4, 4], &mut r, -1.0, 1.0);
    let k = random_nonzero(DType::F32, &[8, 2, 4], &mut r, -1.0, 1.0);
    let v = random_nonzero(DType::F32, &[8, 2, 4], &mut r, -1.0, 1.0);
    let go = |t: &Task, pos: &Tensor, width: u64| {
        let mut out = [Tensor::poisoned(DType::F32, &[4, width])];
        let res = call(run, t, &[&q, &k, &v, pos], &mut out);
        assert!(
            out[0].to_f32_vec().iter().all(|x| x.is_nan()),
            "a failed call wrote its output"
        );
        res
    };
    // A negative position, for a task and for a shard.
    for flags in [None, Some(2)] {
        let width = if flags.is_some() { 6 } else { 4 };
        assert_eq!(
            go(
                &params(g, 0, 8, 0.5, flags),
                &pos_buffer(DType::I32, &[1], -1),
                width
            ),
            Err(OpError::IndexOutOfRange {
                at: 0,
                value: -1,
                limit: 1 << 31
            })
        );
    }
    // A window the position has not reached: empty, which only a partial may be.
    assert!(matches!(
        go(
            &params(g, 4, 4, 0.5, None),
            &pos_buffer(DType::I32, &[1], 3),
            4
        ),
        Err(OpError::BadParam { .. })
    ));
    // Not integers; no element.
    let fpos = random_nonzero(DType::F32, &[1], &mut r, 1.0, 2.0);
    assert!(matches!(
        go(&params(g, 0, 8, 0.5, None), &fpos, 4),
        Err(OpError::DType(_))
    ));
    let empty = Tensor::zeros(DType::I32, &[0]);
    assert!(matches!(
        go(&params(g, 0, 8, 0.5, None), &empty, 4),
        Err(OpError::DType(_))
    ));
    // The static window is still checked: past the cache, or empty for a non-partial task,
    // whatever the position.
    assert!(matches!(
        go(
            &params(g, 4, 5, 0.5, None),
            &pos_buffer(DType::I32, &[1], 2),
            4
        ),
        Err(OpError::BadParam { .. })
    ));
    assert!(matches!(
        go(
            &params(g, 0, 0, 0.5, None),
            &pos_buffer(DType::I32, &[1], 2),
            4
        ),
        Err(OpError::BadParam { .. })
    ));
}

/// The static shape rule on `[q, kcache, vcache, pos]`: the position buffer of `dtype` and
/// `shape`, the attention of `bad_calls_are_typed_errors`.
fn position_findings(dtype: DType, shape: &[u64], flags: Option<i64>) -> Vec<ErrorKind> {
    let buffer = amk_core::testkit::buffer;
    let width = if flags.is_some() { 6 } else { 4 };
    let buffers = [
        buffer(0, DType::F32, &[4, 4]),
        buffer(1, DType::F32, &[8, 2, 4]),
        buffer(2, DType::F32, &[8, 2, 4]),
        buffer(3, dtype, shape),
        buffer(4, DType::F32, &[4, width]),
    ];
    let g = Geo {
        batch: 1,
        max_seq: 8,
        nh: 4,
        nkv: 2,
        hd: 4,
    };
    let mut t = params(g, 0, 8, 0.5, flags);
    t.inputs = vec![0, 1, 2, 3];
    t.outputs = vec![4];
    assert!(
        op_attention_tile::SPEC.check.is_some(),
        "ATTENTION_TILE has a shape rule"
    );
    shape_rule_kinds(&op_attention_tile::SPEC, &t, &buffers)
}

#[test]
fn the_shape_rule_takes_an_integer_position_buffer() {
    assert_eq!(op_attention_tile::SPEC.max_inputs, Some(4));
    for dt in [DType::I32, DType::I8, DType::U8] {
        assert!(position_findings(dt, &[1], None).is_empty());
    }
    assert!(position_findings(DType::I32, &[4], Some(2)).is_empty());
    assert_eq!(
        position_findings(DType::F32, &[1], None),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        position_findings(DType::BF16, &[1], Some(2)),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        position_findings(DType::I32, &[0], None),
        vec![ErrorKind::ShapeMismatch]
    );
}

fn expect_err(t: &Task, ins: &[&Tensor], out_shape: &[u64], pred: fn(&OpError) -> bool) {
    let mut out = [Tensor::poisoned(DType::F32, out_shape)];
    let e = call(run, t, ins, &mut out).unwrap_err();
    assert!(pred(&e), "unexpected error {e:?}");
}

#[test]
fn bad_calls_are_typed_errors() {
    let g = Geo {
        batch: 1,
        max_seq: 8,
        nh: 4,
        nkv: 2,
        hd: 4,
    };
    let mut r = rng(99);
    let q = random_nonzero(DType::F32, &[4, 4], &mut r, -1.0, 1.0);
    let k = random_nonzero(DType::F32, &[8, 2, 4], &mut r, -1.0, 1.0);
    let v = random_nonzero(DType::F32, &[8, 2, 4], &mut r, -1.0, 1.0);
    let ok = params(g, 2, 3, 0.5, None);
    let arity = |e: &OpError| matches!(e, OpError::Arity { .. });
    let shape = |e: &OpError| matches!(e, OpError::Shape(_));
    let bad_param = |e: &OpError| matches!(e, OpError::BadParam { .. });

    // The good call works.
    let mut out = [Tensor::poisoned(DType::F32, &[16])];
    call(run, &ok, &[&q, &k, &v], &mut out).unwrap();

    // Arity.
    expect_err(&ok, &[&q, &k], &[16], arity);
    expect_err(&ok, &[&q, &k, &v, &v, &v], &[16], arity);
    assert!(matches!(
        call(run, &ok, &[&q, &k, &v], &mut []),
        Err(OpError::Arity { .. })
    ));
    // Each required param missing.
    for key in [
        "head_dim",
        "kv_start",
        "kv_len",
        "scale",
        "n_heads",
        "n_kv_heads",
    ] {
        let mut t = ok.clone();
        t.params.0.retain(|(k, _)| k != key);
        let mut out = [Tensor::poisoned(DType::F32, &[16])];
        assert_eq!(
            call(run, &t, &[&q, &k, &v], &mut out),
            Err(OpError::MissingParam(key.into()))
        );
    }
    // Bad param values.
    expect_err(
        &params(Geo { nkv: 3, ..g }, 0, 2, 0.5, None),
        &[&q, &k, &v],
        &[16],
        bad_param,
    );
    expect_err(
        &params(Geo { hd: 0, ..g }, 0, 2, 0.5, None),
        &[&q, &k, &v],
        &[16],
        bad_param,
    );
    expect_err(
        &params(g, -1, 2, 0.5, None),
        &[&q, &k, &v],
        &[16],
        bad_param,
    );
    expect_err(
        &params(g, 0, -2, 0.5, None),
        &[&q, &k, &v],
        &[16],
        bad_param,
    );
    let mut t = ok.clone();
    t.params.insert("scale", Value::Str("half".into()));
    expect_err(&t, &[&q, &k, &v], &[16], bad_param);
    // KV range beyond the cache, and an empty range without PARTIAL_WRITE.
    expect_err(&params(g, 6, 3, 0.5, None), &[&q, &k, &v], &[16], bad_param);
    expect_err(
        &params(g, 9, 0, 0.5, Some(2)),
        &[&q, &k, &v],
        &[24],
        bad_param,
    );
    expect_err(&params(g, 2, 0, 0.5, None), &[&q, &k, &v], &[16], bad_param);
    // Shapes: query, output (a partial needs hd + 2 per head), caches.
    let q_short = random_nonzero(DType::F32, &[3, 4], &mut r, -1.0, 1.0);
    expect_err(&ok, &[&q_short, &k, &v], &[16], shape);
    expect_err(&ok, &[&q, &k, &v], &[15], shape);
    expect_err(&params(g, 2, 3, 0.5, Some(2)), &[&q, &k, &v], &[16], shape);
    let v_short = random_nonzero(DType::F32, &[7, 2, 4], &mut r, -1.0, 1.0);
    expect_err(&ok, &[&q, &k, &v_short], &[16], shape);
    let ragged = random_nonzero(DType::F32, &[7, 9], &mut r, -1.0, 1.0);
    expect_err(&ok, &[&q, &ragged, &ragged], &[16], shape);
    // A batched cache whose batch does not match the query.
    let kb = random_nonzero(DType::F32, &[2, 8, 2, 4], &mut r, -1.0, 1.0);
    expect_err(&ok, &[&q, &kb, &kb], &[16], shape);
    // Dtypes: an integer query or output.
    let qi = random_nonzero(DType::I32, &[4, 4], &mut r, 1.0, 3.0);
    expect_err(&ok, &[&qi, &k, &v], &[16], |e| {
        matches!(e, OpError::DType(_))
    });
    let mut out_i = [Tensor::poisoned(DType::I32, &[16])];
    assert!(matches!(
        call(run, &ok, &[&q, &k, &v], &mut out_i),
        Err(OpError::DType(_))
    ));
    // An input passed in place (ATTENTION_TILE declares no in-place pair).
    let mut out = [Tensor::poisoned(DType::F32, &[16])];
    let ins = [Input::Tensor(&q), Input::InPlace(0), Input::Tensor(&v)];
    let e = run(&mut CpuCall {
        task: &ok,
        registry: None,
        inputs: &ins,
        outputs: &mut out,
    });
    assert_eq!(e, Err(OpError::InPlaceInput(1)));
}
