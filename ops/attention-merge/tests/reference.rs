//! ATTENTION_MERGE's CPU reference against an independent merge: partials made from a real
//! attention over random rows (each split's `[acc | m | l]` computed in f64 from its rows),
//! merged by this op at several positions and head tiles, compared with the attention over
//! all the rows in f64 (the merge is exact in exact arithmetic); tiles write their columns
//! only, rows are rounded to their dtype, inactive splits are never read (poisoned), and bad
//! params are typed errors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{call, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use op_attention_merge::reference::run;
use op_attention_split::{SplitGeometry, split_rows};
use rstest::rstest;

const G: SplitGeometry = SplitGeometry {
    hd: 4,
    nh: 6,
    nkv: 2,
    n_splits: 4,
    chunk: 2,
};

/// Scores and values of one KV head's rows: `scores[h][j]`, `values[j][d]` (random, seeded).
struct Rows {
    scores: Vec<Vec<f64>>,
    values: Vec<Vec<f64>>,
}

fn rows_of(g: &SplitGeometry, n: usize, seed: u64) -> Vec<Rows> {
    let mut r = rng(seed);
    let mut draw =
        |lo: f64, hi: f64| lo + (hi - lo) * (r.next() >> 11) as f64 / (1u64 << 53) as f64;
    (0..g.nkv)
        .map(|_| Rows {
            scores: (0..g.rep())
                .map(|_| (0..n).map(|_| draw(-3.0, 3.0)).collect())
                .collect(),
            values: (0..n)
                .map(|_| (0..g.hd).map(|_| draw(-1.0, 1.0)).collect())
                .collect(),
        })
        .collect()
}

/// The partials ATTENTION_SPLIT would write at position `p` (f64 sums, stored as f32); the
/// inactive splits' regions are NaN, so a merge that reads them fails the comparison.
fn partials(g: &SplitGeometry, rows: &[Rows], p: u64) -> Tensor {
    let (hd, rep, ns) = (g.hd as usize, g.rep() as usize, g.n_splits as usize);
    let mut t = Tensor::zeros(DType::F32, &[g.nkv, g.n_splits, g.rep(), g.hd + 2]);
    for (kv, kvrows) in rows.iter().enumerate() {
        for s in 0..ns {
            let sr = split_rows(p, s as u64, g.n_splits, g.chunk);
            for r in 0..rep {
                let base = ((kv * ns + s) * rep + r) * (hd + 2);
                if sr.len == 0 {
                    (0..hd + 2).for_each(|i| t.set_f32(base + i, f32::NAN));
                    continue;
                }
                let span = sr.start as usize..(sr.start + sr.len) as usize;
                let sc = &kvrows.scores[r][span.clone()];
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                for d in 0..hd {
                    let acc: f64 = span
                        .clone()
                        .zip(&e)
                        .map(|(j, w)| kvrows.values[j][d] * w)
                        .sum();
                    t.set_f32(base + d, acc as f32);
                }
                t.set_f32(base + hd, m as f32);
                t.set_f32(base + hd + 1, e.iter().sum::<f64>() as f32);
            }
        }
    }
    t
}

/// The attention of every query head over rows `0..=p`, in f64: the merge's exact answer.
fn attention(g: &SplitGeometry, rows: &[Rows], p: u64) -> Vec<f64> {
    let mut out = Vec::new();
    for kvrows in rows {
        for sc in &kvrows.scores {
            let sc = &sc[..=p as usize];
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for d in 0..g.hd as usize {
                out.push(
                    e.iter()
                        .enumerate()
                        .map(|(j, w)| kvrows.values[j][d] * w)
                        .sum::<f64>()
                        / l,
                );
            }
        }
    }
    out
}

fn params(g: &SplitGeometry, n_off: u64, n_tile: u64) -> Vec<(&'static str, Value)> {
    [
        ("head_dim", g.hd),
        ("n_heads", g.nh),
        ("n_kv_heads", g.nkv),
        ("n_splits", g.n_splits),
        ("chunk", g.chunk),
        ("n_off", n_off),
        ("N_tile", n_tile),
    ]
    .into_iter()
    .map(|(k, v)| (k, Value::Int(v as i64)))
    .collect()
}

fn position(p: i64) -> Tensor {
    Tensor::from_i64(DType::I32, &[1], &[p]).unwrap()
}

fn merge(parts: &Tensor, p: i64, pr: &[(&str, Value)], row: &mut Tensor) -> Result<(), OpError> {
    let t = task(Opcode::ATTENTION_MERGE, 2, 1, pr);
    call(run, &t, &[parts, &position(p)], std::slice::from_mut(row))
}

#[rstest]
#[case(0)]
#[case(1)]
#[case(2)]
#[case(5)]
#[case(8)]
#[case(13)]
#[case(15)]
fn the_merge_is_the_attention_over_every_row(#[case] p: u64) {
    let rows = rows_of(&G, 16, 7 + p);
    let parts = partials(&G, &rows, p);
    let want = attention(&G, &rows, p);
    let k = G.nh * G.hd;
    let mut row = Tensor::poisoned(DType::F32, &[1, k]);
    // Three tiles of two heads each: together the whole row.
    for t in 0..3 {
        merge(&parts, p as i64, &params(&G, 8 * t, 8), &mut row).unwrap();
    }
    for (i, (&got, &w)) in row.to_f32_vec().iter().zip(&want).enumerate() {
        assert!(
            (got as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "p {p} element {i}: {got} against {w}"
        );
    }
}

#[test]
fn a_tile_writes_its_heads_only_rounded_to_the_row() {
    let rows = rows_of(&G, 16, 3);
    let parts = partials(&G, &rows, 11);
    let want = attention(&G, &rows, 11);
    let mut row = Tensor::poisoned(DType::BF16, &[1, G.nh * G.hd]);
    let before = row.to_f32_vec();
    merge(&parts, 11, &params(&G, 12, 4), &mut row).unwrap();
    let got = row.to_f32_vec();
    for i in 0..got.len() {
        if (12..16).contains(&i) {
            let w = amk_core::round_to(DType::BF16, want[i] as f32);
            assert!(
                (got[i] - w).abs() <= w.abs() * 8e-3,
                "{i}: {} vs {w}",
                got[i]
            );
        } else {
            assert_eq!(
                got[i].to_bits(),
                before[i].to_bits(),
                "element {i} was written"
            );
        }
    }
}

#[rstest]
#[case::tile_not_whole_heads(params(&G, 0, 6), 3)]
#[case::offset_not_whole_heads(params(&G, 2, 4), 3)]
#[case::past_the_row(params(&G, 20, 8), 3)]
#[case::negative_position(params(&G, 0, 8), -1)]
fn bad_tiles_and_positions_are_errors(#[case] pr: Vec<(&'static str, Value)>, #[case] p: i64) {
    let rows = rows_of(&G, 16, 1);
    let parts = partials(&G, &rows, 3);
    let mut row = Tensor::poisoned(DType::F32, &[1, G.nh * G.hd]);
    assert!(merge(&parts, p, &pr, &mut row).is_err());
}

#[test]
fn partials_of_another_layout_are_refused() {
    let parts = Tensor::zeros(DType::F32, &[G.partials_len() - 1]);
    let mut row = Tensor::poisoned(DType::F32, &[1, G.nh * G.hd]);
    let err = merge(&parts, 0, &params(&G, 0, 8), &mut row).unwrap_err();
    assert!(matches!(err, OpError::Shape(_)), "{err:?}");
    let parts = Tensor::zeros(DType::BF16, &[G.partials_len()]);
    let err = merge(&parts, 0, &params(&G, 0, 8), &mut row).unwrap_err();
    assert!(matches!(err, OpError::DType(_)), "{err:?}");
}
