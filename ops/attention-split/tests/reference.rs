//! ATTENTION_SPLIT: the split rule covers rows `0..=p` exactly once, in splits of whole
//! chunks; the CPU reference's partials of every split of every KV head, merged, equal
//! ATTENTION_TILE over rows `0..=p` (checked against its own formulas in its crate); an
//! inactive split writes nothing; bad calls are typed errors, and the shape rule refuses
//! what the device would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use op_attention_split::reference::combine;
use op_attention_split::{SplitGeometry, active_splits, split_rows, split_size};
use rstest::rstest;

#[test]
fn splits_cover_the_rows_written_so_far_once_in_whole_chunks() {
    for n_splits in [1u64, 2, 3, 7, 16, 32] {
        for chunk in [1u64, 2, 5, 64] {
            for p in (0..300u64).chain([1023, 4095, 32767]) {
                let size = split_size(p, n_splits, chunk);
                assert_eq!(size % chunk, 0);
                assert!(size * n_splits > p, "p {p} S {n_splits} c {chunk}");
                let active = active_splits(p, n_splits, chunk);
                assert!((1..=n_splits).contains(&active));
                let mut next = 0;
                for s in 0..n_splits {
                    let r = split_rows(p, s, n_splits, chunk);
                    if s < active {
                        assert_eq!(r.start, next, "p {p} S {n_splits} c {chunk} s {s}");
                        assert!(r.len >= 1 && r.len <= size);
                        next += r.len;
                    } else {
                        assert_eq!(r.len, 0, "p {p} S {n_splits} c {chunk} s {s}");
                    }
                }
                assert_eq!(next, p + 1, "p {p} S {n_splits} c {chunk}");
            }
        }
    }
    // The smallest chunk multiple: one split at position 0, all of them from S x chunk rows.
    assert_eq!(active_splits(0, 16, 64), 1);
    assert_eq!(active_splits(511, 16, 64), 8);
    assert_eq!(active_splits(1023, 16, 64), 16);
    assert_eq!(split_size(4095, 16, 64), 256);
}

fn params(g: &SplitGeometry, task_index: u64) -> Vec<(&'static str, Value)> {
    vec![
        ("head_dim", Value::Int(g.hd as i64)),
        ("n_heads", Value::Int(g.nh as i64)),
        ("n_kv_heads", Value::Int(g.nkv as i64)),
        ("scale", Value::Float(1.0 / (g.hd as f64).sqrt())),
        ("N_tile", Value::Int(g.tile() as i64)),
        ("n_off", Value::Int((task_index * g.tile()) as i64)),
        ("n_splits", Value::Int(g.n_splits as i64)),
        ("chunk", Value::Int(g.chunk as i64)),
    ]
}

fn pos(p: i64) -> Tensor {
    Tensor::from_i64(DType::I32, &[1], &[p]).unwrap()
}

/// Every split task of `g` at position `p` into one partials buffer (poisoned first).
fn all_splits(g: &SplitGeometry, ops: &[Tensor], p: i64) -> Tensor {
    let mut out = [Tensor::poisoned(DType::F32, &[g.partials_len()])];
    let pb = pos(p);
    for i in 0..g.nkv * g.n_splits {
        let t = task(Opcode::ATTENTION_SPLIT, 4, 1, &params(g, i));
        let ins = [&ops[0], &ops[1], &ops[2], &pb];
        call(op_attention_split::reference::run, &t, &ins, &mut out).unwrap();
    }
    let [out] = out;
    out
}

/// ATTENTION_TILE over rows `0..=p`, through its own reference.
fn whole(g: &SplitGeometry, ops: &[Tensor], max_seq: u64, p: u64) -> Tensor {
    let t = task(
        Opcode::ATTENTION_TILE,
        3,
        1,
        &[
            ("head_dim", Value::Int(g.hd as i64)),
            ("kv_start", Value::Int(0)),
            ("kv_len", Value::Int((p + 1).min(max_seq) as i64)),
            ("scale", Value::Float(1.0 / (g.hd as f64).sqrt())),
            ("n_heads", Value::Int(g.nh as i64)),
            ("n_kv_heads", Value::Int(g.nkv as i64)),
        ],
    );
    let mut out = [Tensor::poisoned(DType::F32, &[g.nh * g.hd])];
    let ins = [&ops[0], &ops[1], &ops[2]];
    call(op_attention_tile::reference::run, &t, &ins, &mut out).unwrap();
    let [out] = out;
    out
}

fn operands(g: &SplitGeometry, max_seq: u64, dtype: DType, seed: u64) -> Vec<Tensor> {
    let mut r = rng(seed);
    let cache = [max_seq, g.nkv, g.hd];
    vec![
        random_nonzero(dtype, &[g.nh, g.hd], &mut r, -2.0, 2.0),
        random_nonzero(dtype, &cache, &mut r, -1.0, 1.0),
        random_nonzero(dtype, &cache, &mut r, -1.0, 1.0),
    ]
}

#[rstest]
#[case::gqa(4, 2, 8, 4, 2, DType::F32)]
#[case::mqa_odd_chunk(6, 1, 16, 3, 5, DType::BF16)]
#[case::mha_one_split(3, 3, 8, 1, 4, DType::F16)]
#[case::many_splits(8, 2, 8, 32, 1, DType::F32)]
fn merged_splits_equal_the_whole_attention(
    #[case] nh: u64,
    #[case] nkv: u64,
    #[case] hd: u64,
    #[case] n_splits: u64,
    #[case] chunk: u64,
    #[case] dtype: DType,
) {
    let g = SplitGeometry {
        hd,
        nh,
        nkv,
        n_splits,
        chunk,
    };
    let max_seq = 70;
    let ops = operands(&g, max_seq, dtype, nh * 31 + n_splits);
    for p in [0u64, 1, 2, 5, 17, 40, 69] {
        let parts = all_splits(&g, &ops, p as i64);
        let got = combine(&parts, &g, p);
        let want = whole(&g, &ops, max_seq, p).to_f32_vec();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 2e-6 * b.abs().max(1.0),
                "p {p} element {i}: merged {a} whole {b}"
            );
        }
    }
}

#[test]
fn an_inactive_split_writes_nothing_and_bad_calls_are_typed_errors() {
    let g = SplitGeometry {
        hd: 8,
        nh: 4,
        nkv: 2,
        n_splits: 4,
        chunk: 2,
    };
    let ops = operands(&g, 20, DType::F32, 3);
    let pb = pos(1); // two rows: only split 0 of each KV head works
    let ins = [&ops[0], &ops[1], &ops[2], &pb];
    let mut out = [Tensor::poisoned(DType::F32, &[g.partials_len()])];
    let before = out[0].to_le_bytes();
    let t = task(Opcode::ATTENTION_SPLIT, 4, 1, &params(&g, 1));
    call(op_attention_split::reference::run, &t, &ins, &mut out).unwrap();
    assert_eq!(out[0].to_le_bytes(), before, "split 1 at position 1 wrote");
    let run = |p: i64, pr: &[(&str, Value)]| {
        let pb = pos(p);
        let ins = [&ops[0], &ops[1], &ops[2], &pb];
        let mut out = [Tensor::zeros(DType::F32, &[g.partials_len()])];
        let t = task(Opcode::ATTENTION_SPLIT, 4, 1, pr);
        call(op_attention_split::reference::run, &t, &ins, &mut out)
    };
    assert!(matches!(
        run(20, &params(&g, 0)),
        Err(OpError::IndexOutOfRange { .. })
    ));
    assert!(matches!(
        run(-1, &params(&g, 0)),
        Err(OpError::IndexOutOfRange { .. })
    ));
    assert!(matches!(
        run(3, &params(&g, 8)),
        Err(OpError::BadParam { .. })
    ));
    let mut odd = params(&g, 0);
    odd[5].1 = Value::Int(3);
    assert!(matches!(run(3, &odd), Err(OpError::BadParam { .. })));
    let mut too_many = params(&g, 0);
    too_many[6].1 = Value::Int(33);
    assert!(run(3, &too_many).is_err());
}

/// The tasks of one split a KV head with normalised rows (flags bit 0), into one row of
/// `dtype` (poisoned first).
fn normalized_rows(g: &SplitGeometry, ops: &[Tensor], p: i64, dtype: DType) -> Tensor {
    let mut out = [Tensor::poisoned(dtype, &[g.nh * g.hd])];
    let pb = pos(p);
    let tile = g.normalized_tile() as i64;
    for kv_head in 0..g.nkv as i64 {
        let mut pr = params(g, 0);
        pr[4].1 = Value::Int(tile);
        pr[5].1 = Value::Int(kv_head * tile);
        pr.push(("flags", Value::Int(op_attention_split::FLAG_NORMALIZED)));
        let t = task(Opcode::ATTENTION_SPLIT, 4, 1, &pr);
        let ins = [&ops[0], &ops[1], &ops[2], &pb];
        call(op_attention_split::reference::run, &t, &ins, &mut out).unwrap();
    }
    let [out] = out;
    out
}

/// One split a KV head, normalised: the row ATTENTION_TILE writes over rows `0..=p` (rounded
/// to the row's dtype), and the one partials merged give.
#[rstest]
#[case::gqa_f32(4, 2, 8, DType::F32)]
#[case::mqa_bf16(6, 1, 16, DType::BF16)]
#[case::mha_f16(3, 3, 8, DType::F16)]
fn normalized_rows_are_the_whole_attention(
    #[case] nh: u64,
    #[case] nkv: u64,
    #[case] hd: u64,
    #[case] dtype: DType,
) {
    let g = SplitGeometry {
        hd,
        nh,
        nkv,
        n_splits: 1,
        chunk: 4,
    };
    let max_seq = 40;
    let ops = operands(&g, max_seq, DType::F32, nh * 7 + hd);
    for p in [0u64, 1, 9, 39] {
        let got = normalized_rows(&g, &ops, p as i64, dtype).to_f32_vec();
        let merged = combine(&all_splits(&g, &ops, p as i64), &g, p);
        let want = whole(&g, &ops, max_seq, p).to_f32_vec();
        let bound = if dtype == DType::F32 { 2e-6 } else { 1e-2 };
        for (i, ((a, m), w)) in got.iter().zip(&merged).zip(&want).enumerate() {
            assert!(
                (a - w).abs() <= bound * w.abs().max(1.0),
                "p {p} [{i}]: {a} vs whole {w}"
            );
            // The merge of one split divides the same sums by the same l.
            let rounded = Tensor::from_f32(dtype, &[1], &[*m]).unwrap().get_f32(0);
            assert_eq!(
                a.to_bits(),
                rounded.to_bits(),
                "p {p} [{i}]: {a} vs merged {m}"
            );
        }
    }
}

#[test]
fn normalized_rows_need_one_split_and_a_row() {
    let g = SplitGeometry {
        hd: 8,
        nh: 4,
        nkv: 2,
        n_splits: 2,
        chunk: 2,
    };
    let ops = operands(&g, 10, DType::F32, 5);
    let run = |pr: &[(&str, Value)], numel: u64| {
        let pb = pos(3);
        let ins = [&ops[0], &ops[1], &ops[2], &pb];
        let mut out = [Tensor::zeros(DType::F32, &[numel])];
        let t = task(Opcode::ATTENTION_SPLIT, 4, 1, pr);
        call(op_attention_split::reference::run, &t, &ins, &mut out)
    };
    let mut pr = params(&g, 0);
    pr[4].1 = Value::Int(g.normalized_tile() as i64);
    pr.push(("flags", Value::Int(1)));
    // Two splits a KV head cannot be normalised alone.
    assert!(matches!(
        run(&pr, g.nh * g.hd),
        Err(OpError::BadParam { .. })
    ));
    pr[6].1 = Value::Int(1);
    assert!(run(&pr, g.nh * g.hd).is_ok());
    // The row, not the partials.
    assert!(matches!(
        run(&pr, g.nh * (g.hd + 2)),
        Err(OpError::Shape(_))
    ));
    // Undefined flag bits.
    pr[8].1 = Value::Int(3);
    assert!(matches!(
        run(&pr, g.nh * g.hd),
        Err(OpError::BadParam { .. })
    ));
}
