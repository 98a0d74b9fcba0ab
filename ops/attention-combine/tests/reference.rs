//! ATTENTION_COMBINE's CPU reference against an independent f64 formula (random partials
//! with empty shards and wide max spreads, 2–8 parts, odd head dims, every float dtype),
//! the split-KV end-to-end property (ATTENTION_TILE shards + ATTENTION_COMBINE = un-split
//! ATTENTION_TILE = f64 attention, also with shards a position input clips, empty ones
//! included), and typed errors for bad calls.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_arguments
)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use op_attention_combine::reference::run;
use rstest::rstest;

/// Random `[heads, hd + 2]` partials: acc uniform, `m` in `[-m_spread, m_spread]`, `l` in
/// `[0.5, 6)`; part `p` is an empty shard (acc 0, m −inf, l 0) when bit `p` of `empty` is set.
fn random_parts(
    n_parts: usize,
    heads: usize,
    hd: usize,
    dtype: DType,
    empty: u32,
    m_spread: f64,
    seed: u64,
) -> Vec<Tensor> {
    let mut r = rng(seed);
    (0..n_parts)
        .map(|p| {
            let mut t = random_nonzero(dtype, &[heads as u64, hd as u64 + 2], &mut r, -3.0, 3.0);
            let ms = random_nonzero(DType::F32, &[heads as u64], &mut r, -m_spread, m_spread);
            let ls = random_nonzero(DType::F32, &[heads as u64], &mut r, 0.5, 6.0);
            for h in 0..heads {
                let base = h * (hd + 2);
                if empty & (1 << p) != 0 {
                    for d in 0..hd {
                        t.set_f32(base + d, 0.0);
                    }
                    t.set_f32(base + hd, f32::NEG_INFINITY);
                    t.set_f32(base + hd + 1, 0.0);
                } else {
                    t.set_f32(base + hd, ms.get_f32(h));
                    t.set_f32(base + hd + 1, ls.get_f32(h));
                }
            }
            t
        })
        .collect()
}

/// The naive f64 merge of `[acc | m | l]` partials.
fn naive_combine(parts: &[Tensor], heads: usize, hd: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(heads * hd);
    for h in 0..heads {
        let base = h * (hd + 2);
        let m_of = |t: &Tensor| t.get_f32(base + hd) as f64;
        let l_of = |t: &Tensor| t.get_f32(base + hd + 1) as f64;
        let m = parts.iter().map(m_of).fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = parts
            .iter()
            .map(|t| {
                if l_of(t) > 0.0 {
                    (m_of(t) - m).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let l: f64 = parts.iter().zip(&w).map(|(t, w)| l_of(t) * w).sum();
        for d in 0..hd {
            let acc: f64 = parts
                .iter()
                .zip(&w)
                .map(|(t, w)| {
                    if *w == 0.0 {
                        0.0
                    } else {
                        t.get_f32(base + d) as f64 * w
                    }
                })
                .sum();
            out.push(acc / l.max(1e-20));
        }
    }
    out
}

#[rstest]
// Two parts, both full, Llama-ish head count, output [1, q_dim].
#[case(2, 8, 16, &[1, 128], Some(8), 0b00, 3.0, DType::F32, DType::F32)]
// Three parts, one empty, odd head_dim.
#[case(3, 4, 7, &[28], Some(4), 0b010, 3.0, DType::F32, DType::F32)]
// Four parts, the first empty, head_dim 1, head-shaped output.
#[case(4, 6, 1, &[6, 1], None, 0b0001, 2.0, DType::F32, DType::F32)]
// Eight parts (the arity cap), two empty, wide max spread (weights down to e^-60).
#[case(8, 3, 5, &[3, 5], Some(3), 0b1000_0100, 30.0, DType::F32, DType::F32)]
// f16 partials and output.
#[case(2, 16, 64, &[16, 64], Some(16), 0b00, 4.0, DType::F16, DType::F16)]
// bf16 partials, f32 output, a batch of 2 x 4 heads seen as 8 heads.
#[case(3, 8, 6, &[2, 24], None, 0b000, 3.0, DType::BF16, DType::F32)]
// f32 partials into a bf16 output.
#[case(5, 2, 33, &[66], Some(2), 0b10000, 8.0, DType::F32, DType::BF16)]
// Every shard empty: the output is exactly zero.
#[case(2, 4, 3, &[12], Some(4), 0b11, 1.0, DType::F32, DType::F32)]
// Six parts with maxima spread over [-80, 80] (most weights underflow in fp32).
#[case(6, 2, 4, &[2, 4], None, 0b000000, 80.0, DType::F32, DType::F32)]
fn matches_f64_formula(
    #[case] n_parts: usize,
    #[case] heads: usize,
    #[case] hd: usize,
    #[case] oshape: &[u64],
    #[case] n_heads: Option<i64>,
    #[case] empty: u32,
    #[case] m_spread: f64,
    #[case] dpart: DType,
    #[case] dout: DType,
) {
    let seed = (n_parts * 1000 + heads * 37 + hd) as u64 + empty as u64;
    let parts = random_parts(n_parts, heads, hd, dpart, empty, m_spread, seed);
    let mut p: Vec<(&str, Value)> = vec![("head_dim", Value::Int(hd as i64))];
    if let Some(nh) = n_heads {
        p.push(("n_heads", Value::Int(nh)));
    }
    let t = task(Opcode::ATTENTION_COMBINE, n_parts, 1, &p);
    let refs: Vec<&Tensor> = parts.iter().collect();
    let mut out = [Tensor::poisoned(dout, oshape)];
    call(run, &t, &refs, &mut out).unwrap();
    let want = naive_combine(&parts, heads, hd);
    assert_close(&out[0], &want, 1e-5, 1e-6);
    if empty.count_ones() as usize == n_parts {
        assert!(out[0].to_f32_vec().iter().all(|x| *x == 0.0));
    }
}

/// Geometry of an attention call for the end-to-end test.
#[derive(Clone, Copy)]
struct Geo {
    batch: usize,
    max_seq: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
}

fn tile_task(g: Geo, start: usize, len: usize, scale: f64, flags: i64) -> amk_core::Task {
    task(
        Opcode::ATTENTION_TILE,
        3,
        1,
        &[
            ("head_dim", Value::Int(g.hd as i64)),
            ("kv_start", Value::Int(start as i64)),
            ("kv_len", Value::Int(len as i64)),
            ("scale", Value::Float(scale)),
            ("n_heads", Value::Int(g.nh as i64)),
            ("n_kv_heads", Value::Int(g.nkv as i64)),
            ("flags", Value::Int(flags)),
        ],
    )
}

/// Naive f64 GQA decode attention over rows `[start, start + len)` of a `[B, max_seq, nkv, hd]`
/// cache (B = 1 for an unbatched cache).
fn naive_attention(
    g: Geo,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    start: usize,
    len: usize,
    scale: f64,
) -> Vec<f64> {
    let mut out = Vec::new();
    for b in 0..g.batch {
        for h in 0..g.nh {
            let kvh = h * g.nkv / g.nh;
            let at = |j: usize, d: usize| ((b * g.max_seq + j) * g.nkv + kvh) * g.hd + d;
            let qh = |d: usize| q.get_f32((b * g.nh + h) * g.hd + d) as f64;
            let s: Vec<f64> = (start..start + len)
                .map(|j| {
                    scale
                        * (0..g.hd)
                            .map(|d| qh(d) * k.get_f32(at(j, d)) as f64)
                            .sum::<f64>()
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = p.iter().sum();
            for d in 0..g.hd {
                let num: f64 = (start..start + len)
                    .zip(&p)
                    .map(|(j, p)| p * v.get_f32(at(j, d)) as f64)
                    .sum();
                out.push(num / z);
            }
        }
    }
    out
}

#[rstest]
// Two shards, GQA 1.
#[case(&[4, 8], &[16, 4, 8], 4, 4, 8, 0, 16, &[9, 7])]
// Three shards of a window starting at 5, GQA 2, odd head_dim.
#[case(&[8, 5], &[24, 4, 5], 8, 4, 5, 5, 17, &[6, 6, 5])]
// Four shards, GQA 4, one of them empty.
#[case(&[8, 16], &[32, 32], 8, 2, 16, 3, 25, &[10, 0, 8, 7])]
// Four single-row shards, GQA 8.
#[case(&[16, 4], &[6, 2, 4], 16, 2, 4, 2, 4, &[1, 1, 1, 1])]
// Batched rank-3 query with rank-4 caches, three shards, GQA 2.
#[case(&[2, 4, 6], &[2, 12, 2, 6], 4, 2, 6, 1, 11, &[4, 4, 3])]
// Batched, GQA 8, head_dim 64, two shards of very unequal size.
#[case(&[3, 8, 64], &[3, 40, 1, 64], 8, 1, 64, 0, 40, &[37, 3])]
fn split_kv_then_combine_equals_unsplit(
    #[case] qshape: &[u64],
    #[case] cshape: &[u64],
    #[case] nh: usize,
    #[case] nkv: usize,
    #[case] hd: usize,
    #[case] start: usize,
    #[case] len: usize,
    #[case] shards: &[usize],
) {
    assert_eq!(shards.iter().sum::<usize>(), len, "bad case");
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
    let mut r = rng((len * 97 + shards.len() * 13 + hd) as u64);
    let q = random_nonzero(DType::F32, qshape, &mut r, -2.0, 2.0);
    let k = random_nonzero(DType::F32, cshape, &mut r, -2.0, 2.0);
    let v = random_nonzero(DType::F32, cshape, &mut r, -1.0, 1.0);
    let heads = (batch * nh) as u64;

    // Un-split.
    let mut whole = [Tensor::poisoned(DType::F32, &[heads * hd as u64])];
    let t = tile_task(g, start, len, scale, 0);
    call(
        op_attention_tile::reference::run,
        &t,
        &[&q, &k, &v],
        &mut whole,
    )
    .unwrap();

    // Split into shards, then combine.
    let mut parts = Vec::new();
    let mut s0 = start;
    for &n in shards {
        let mut part = [Tensor::poisoned(DType::F32, &[heads, hd as u64 + 2])];
        let t = tile_task(g, s0, n, scale, op_attention_tile::FLAG_PARTIAL_WRITE);
        call(
            op_attention_tile::reference::run,
            &t,
            &[&q, &k, &v],
            &mut part,
        )
        .unwrap();
        let [part] = part;
        parts.push(part);
        s0 += n;
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    let t = task(
        Opcode::ATTENTION_COMBINE,
        refs.len(),
        1,
        &[("head_dim", Value::Int(hd as i64))],
    );
    let mut combined = [Tensor::poisoned(
        DType::F32,
        &[batch as u64, (nh * hd) as u64],
    )];
    call(run, &t, &refs, &mut combined).unwrap();

    let want = naive_attention(g, &q, &k, &v, start, len, scale);
    assert_close(&whole[0], &want, 1e-5, 2e-6);
    assert_close(&combined[0], &want, 1e-5, 2e-6);
    let whole_f64: Vec<f64> = whole[0].to_f32_vec().iter().map(|&x| x as f64).collect();
    assert_close(&combined[0], &whole_f64, 1e-5, 2e-6);
}

/// Split-KV shards with a position input (the lowering's static slices of the whole cache,
/// each clipped by the position): the shards past the position are empty partials, and the
/// combine of all of them is the attention over rows `[0, p]`.
#[rstest]
#[case(0)]
#[case(3)]
#[case(4)]
#[case(9)]
#[case(15)]
fn shards_clipped_by_a_position_combine_to_the_attention_up_to_it(#[case] p: usize) {
    let g = Geo {
        batch: 1,
        max_seq: 16,
        nh: 4,
        nkv: 2,
        hd: 8,
    };
    let scale = 0.35;
    let mut r = rng(p as u64 + 500);
    let q = random_nonzero(DType::F32, &[4, 8], &mut r, -2.0, 2.0);
    let k = random_nonzero(DType::F32, &[16, 2, 8], &mut r, -2.0, 2.0);
    let v = random_nonzero(DType::F32, &[16, 2, 8], &mut r, -1.0, 1.0);
    let pos = Tensor::from_i64(DType::I32, &[1], &[p as i64]).unwrap();
    let mut parts = Vec::new();
    for s0 in [0, 4, 8, 12] {
        let mut part = [Tensor::poisoned(DType::F32, &[4, 10])];
        let t = tile_task(g, s0, 4, scale, op_attention_tile::FLAG_PARTIAL_WRITE);
        call(
            op_attention_tile::reference::run,
            &t,
            &[&q, &k, &v, &pos],
            &mut part,
        )
        .unwrap();
        let [part] = part;
        if s0 > p {
            for h in 0..4 {
                assert_eq!(part.get_f32(h * 10 + 8), f32::NEG_INFINITY, "shard {s0}: m");
                assert_eq!(part.get_f32(h * 10 + 9), 0.0, "shard {s0}: l");
            }
        }
        parts.push(part);
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    let t = task(
        Opcode::ATTENTION_COMBINE,
        refs.len(),
        1,
        &[("head_dim", Value::Int(8))],
    );
    let mut combined = [Tensor::poisoned(DType::F32, &[1, 32])];
    call(run, &t, &refs, &mut combined).unwrap();
    let want = naive_attention(g, &q, &k, &v, 0, p + 1, scale);
    assert_close(&combined[0], &want, 1e-5, 2e-6);
}

#[test]
fn bad_calls_are_typed_errors() {
    let parts = random_parts(3, 4, 6, DType::F32, 0, 2.0, 7);
    let (a, b, c) = (&parts[0], &parts[1], &parts[2]);
    let ok = task(
        Opcode::ATTENTION_COMBINE,
        2,
        1,
        &[("head_dim", Value::Int(6))],
    );
    let run_with = |t: &amk_core::Task, ins: &[&Tensor], shape: &[u64], dtype: DType| {
        let mut out = [Tensor::poisoned(dtype, shape)];
        call(run, t, ins, &mut out)
    };
    assert!(run_with(&ok, &[a, b], &[24], DType::F32).is_ok());
    // Arity: one part, nine parts, no output.
    assert!(matches!(
        run_with(&ok, &[a], &[24], DType::F32),
        Err(OpError::Arity { .. })
    ));
    let nine = [a, b, c, a, b, c, a, b, c];
    assert!(matches!(
        run_with(&ok, &nine, &[24], DType::F32),
        Err(OpError::Arity { .. })
    ));
    assert!(matches!(
        call(run, &ok, &[a, b], &mut []),
        Err(OpError::Arity { .. })
    ));
    // Params: missing, non-positive, wrongly typed head_dim; n_heads disagreeing with the output.
    let t = task(Opcode::ATTENTION_COMBINE, 2, 1, &[]);
    assert_eq!(
        run_with(&t, &[a, b], &[24], DType::F32),
        Err(OpError::MissingParam("head_dim".into()))
    );
    for bad in [Value::Int(0), Value::Int(-6), Value::Float(6.5)] {
        let t = task(Opcode::ATTENTION_COMBINE, 2, 1, &[("head_dim", bad)]);
        assert!(matches!(
            run_with(&t, &[a, b], &[24], DType::F32),
            Err(OpError::BadParam { .. })
        ));
    }
    let t = task(
        Opcode::ATTENTION_COMBINE,
        2,
        1,
        &[("head_dim", Value::Int(6)), ("n_heads", Value::Int(3))],
    );
    assert!(matches!(
        run_with(&t, &[a, b], &[24], DType::F32),
        Err(OpError::BadParam { .. })
    ));
    // Shapes: the output is not whole heads; a part of the wrong size.
    assert!(matches!(
        run_with(&ok, &[a, b], &[25], DType::F32),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        run_with(&ok, &[a, b], &[18], DType::F32),
        Err(OpError::Shape(_))
    ));
    let short = random_nonzero(DType::F32, &[4, 7], &mut rng(1), -1.0, 1.0);
    assert!(matches!(
        run_with(&ok, &[a, &short], &[24], DType::F32),
        Err(OpError::Shape(_))
    ));
    // An integer output.
    assert!(matches!(
        run_with(&ok, &[a, b], &[24], DType::I32),
        Err(OpError::DType(_))
    ));
}
