//! COMBINE_GEMV's CPU reference equals the unfused computation it replaces — the partials
//! merged (op_attention_split's combine) into an activation of W's dtype, then GEMV_TILE —
//! bit for bit, touches nothing outside its tile, reads only the splits active at the
//! position, and refuses bad calls with typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor, round_to};
use op_attention_split::{SplitGeometry, active_splits};
use rstest::rstest;

fn params(g: &SplitGeometry, n_tile: u64, n_off: u64) -> Vec<(&'static str, Value)> {
    vec![
        ("head_dim", Value::Int(g.hd as i64)),
        ("n_heads", Value::Int(g.nh as i64)),
        ("n_kv_heads", Value::Int(g.nkv as i64)),
        ("K", Value::Int((g.nh * g.hd) as i64)),
        ("N_tile", Value::Int(n_tile as i64)),
        ("n_off", Value::Int(n_off as i64)),
        ("n_splits", Value::Int(g.n_splits as i64)),
        ("chunk", Value::Int(g.chunk as i64)),
    ]
}

/// Partials with finite `m` and positive `l` everywhere (as active splits write them).
fn partials(g: &SplitGeometry, seed: u64) -> Tensor {
    let mut r = rng(seed);
    let mut t = random_nonzero(DType::F32, &[g.partials_len()], &mut r, -1.0, 1.0);
    let stride = (g.hd + 2) as usize;
    for i in 0..(g.partials_len() as usize / stride) {
        let m = t.get_f32(i * stride + g.hd as usize);
        t.set_f32(i * stride + g.hd as usize, 3.0 * m);
        let l = t.get_f32(i * stride + g.hd as usize + 1);
        t.set_f32(i * stride + g.hd as usize + 1, 1.0 + l.abs() * 4.0);
    }
    t
}

#[rstest]
#[case::gqa_bf16(4, 2, 8, 4, 2, DType::BF16, true)]
#[case::mqa_f32(6, 1, 16, 3, 5, DType::F32, false)]
#[case::mha_f16(3, 3, 8, 2, 1, DType::F16, true)]
fn equals_merge_then_gemv_and_stays_in_its_tile(
    #[case] nh: u64,
    #[case] nkv: u64,
    #[case] hd: u64,
    #[case] n_splits: u64,
    #[case] chunk: u64,
    #[case] wd: DType,
    #[case] bias: bool,
) {
    let g = SplitGeometry {
        hd,
        nh,
        nkv,
        n_splits,
        chunk,
    };
    let (k, n) = (nh * hd, 20u64);
    let parts = partials(&g, k + n_splits);
    let mut r = rng(k);
    let w = random_nonzero(wd, &[n, k], &mut r, -1.0, 1.0);
    let b = random_nonzero(wd, &[n], &mut r, -1.0, 1.0);
    for p in [0u64, 3, 9, 40] {
        let pb = Tensor::from_i64(DType::I32, &[1], &[p as i64]).unwrap();
        // Unfused: the merge into an activation of W's dtype, then GEMV_TILE.
        let merged: Vec<f32> = op_attention_split::reference::combine(&parts, &g, p)
            .into_iter()
            .map(|v| round_to(wd, v))
            .collect();
        let x = Tensor::from_f32(wd, &[1, k], &merged).unwrap();
        let (n_tile, n_off) = (7u64, 6u64);
        let gemv = [
            ("K", Value::Int(k as i64)),
            ("N_tile", Value::Int(7)),
            ("n_off", Value::Int(6)),
        ];
        let mut want = [Tensor::poisoned(wd, &[1, n])];
        let mut ins = vec![&x, &w];
        if bias {
            ins.push(&b);
        }
        let t = task(Opcode::GEMV_TILE, ins.len(), 1, &gemv);
        call(op_gemv_tile::reference::run, &t, &ins, &mut want).unwrap();
        let mut got = [Tensor::poisoned(wd, &[1, n])];
        let mut ins = vec![&parts, &w];
        if bias {
            ins.push(&b);
        }
        ins.push(&pb);
        let t = task(
            Opcode::COMBINE_GEMV,
            ins.len(),
            1,
            &params(&g, n_tile, n_off),
        );
        call(op_combine_gemv::reference::run, &t, &ins, &mut got).unwrap();
        assert_eq!(got[0].to_le_bytes(), want[0].to_le_bytes(), "p {p}");
    }
}

#[test]
fn only_the_active_splits_are_read() {
    let g = SplitGeometry {
        hd: 8,
        nh: 4,
        nkv: 2,
        n_splits: 4,
        chunk: 2,
    };
    let parts = partials(&g, 5);
    let p = 2; // size 2: splits 0 and 1 work
    assert_eq!(active_splits(p, 4, 2), 2);
    let mut spoiled = parts.clone();
    let tile = g.tile() as usize;
    for kv in 0..2 {
        for s in 2..4 {
            for i in 0..tile {
                spoiled.set_f32((kv * 4 + s) * tile + i, f32::NAN);
            }
        }
    }
    let a = op_attention_split::reference::combine(&parts, &g, p);
    let b = op_attention_split::reference::combine(&spoiled, &g, p);
    assert_eq!(a, b);
    assert!(a.iter().all(|v| v.is_finite()));
}

#[test]
fn bad_calls_are_typed_errors() {
    let g = SplitGeometry {
        hd: 8,
        nh: 4,
        nkv: 2,
        n_splits: 4,
        chunk: 2,
    };
    let parts = partials(&g, 5);
    let mut r = rng(1);
    let w = random_nonzero(DType::F32, &[10, 32], &mut r, -1.0, 1.0);
    let run = |parts: &Tensor, p: i64, pr: &[(&str, Value)]| {
        let pb = Tensor::from_i64(DType::I32, &[1], &[p]).unwrap();
        let mut out = [Tensor::zeros(DType::F32, &[1, 10])];
        let t = task(Opcode::COMBINE_GEMV, 3, 1, pr);
        call(
            op_combine_gemv::reference::run,
            &t,
            &[parts, &w, &pb],
            &mut out,
        )
    };
    assert!(run(&parts, 3, &params(&g, 10, 0)).is_ok());
    assert!(matches!(
        run(&parts, -2, &params(&g, 10, 0)),
        Err(OpError::IndexOutOfRange { .. })
    ));
    let short = Tensor::zeros(DType::F32, &[g.partials_len() - 1]);
    assert!(matches!(
        run(&short, 3, &params(&g, 10, 0)),
        Err(OpError::Shape(_))
    ));
    let bf = Tensor::zeros(DType::BF16, &[g.partials_len()]);
    assert!(matches!(
        run(&bf, 3, &params(&g, 10, 0)),
        Err(OpError::DType(_))
    ));
    let mut bad_k = params(&g, 10, 0);
    bad_k[3].1 = Value::Int(31);
    assert!(matches!(run(&parts, 3, &bad_k), Err(OpError::Shape(_))));
    assert!(
        run(&parts, 3, &params(&g, 4, 8)).is_err(),
        "a tile past the weight's rows"
    );
}

/// The merge's scratch counts against the tile's shared memory: a Llama-70B-shaped row (64
/// heads of 128 dims, bf16) fits with 16 splits a KV head (61,760 bytes) and is refused with 32
/// (69,952 of 65,536), where the row alone (16 KiB) would fit either way.
#[test]
fn the_merge_scratch_counts_against_shared_memory() {
    let geometry = |n_splits| SplitGeometry {
        hd: 128,
        nh: 64,
        nkv: 8,
        n_splits,
        chunk: 64,
    };
    assert_eq!(
        op_combine_gemv::shared_bytes(&geometry(16), 8192, 2),
        61_760
    );
    assert_eq!(
        op_combine_gemv::shared_bytes(&geometry(32), 8192, 2),
        69_952
    );
    let mut r = rng(3);
    let w = random_nonzero(DType::BF16, &[2, 8192], &mut r, -1.0, 1.0);
    let pb = Tensor::from_i64(DType::I32, &[1], &[100]).unwrap();
    for (n_splits, fits) in [(16, true), (32, false)] {
        let g = geometry(n_splits);
        let parts = partials(&g, 9);
        let mut out = [Tensor::zeros(DType::F32, &[1, 2])];
        let t = task(Opcode::COMBINE_GEMV, 3, 1, &params(&g, 2, 0));
        let got = call(
            op_combine_gemv::reference::run,
            &t,
            &[&parts, &w, &pb],
            &mut out,
        );
        match (fits, got) {
            (true, Ok(())) => {}
            (false, Err(OpError::Shape(m))) => assert!(m.contains("69952"), "{m}"),
            (_, other) => panic!("{n_splits} splits: {other:?}"),
        }
    }
}
