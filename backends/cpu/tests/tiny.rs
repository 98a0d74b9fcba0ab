//! A hand-built program (two GEMV tiles + ADD) against an f64 formula in every firing mode,
//! and the typed errors of `load` and `step`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use amk_backend_cpu::{CpuBackend, CpuOptions, FiringMode};
use amk_core::json::Map;
use amk_core::testkit::{assert_close, random_nonzero, rng};
use amk_core::{
    Backend, BackendError, BufferKind, DType, Opcode, Program, Registry, Session, Tensor,
    WeightStore,
};
use common::*;
use rstest::rstest;

const K: u64 = 40;
const N: u64 = 12;

/// `out = x @ W^T + r`: GEMV tiles of width `n_tile` into `y`, then ADD with the IO input `r`.
fn tiny(n_tile: u64) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, K]);
    let w = p.new_weight("w", DType::F32, &[N, K], "proj.weight");
    let r = p.new_buffer("r", BufferKind::IO_INPUT, DType::F32, &[1, N]);
    let y = p.new_buffer("y", BufferKind::ACTIVATION, DType::F32, &[1, N]);
    let out = p.new_buffer("out", BufferKind::IO_OUTPUT, DType::F32, &[1, N]);
    let cy = p.new_counter("y ready");
    let co = p.new_counter("out ready");
    let mut off = 0;
    let mut tiles = 0;
    while off < N {
        let nt = n_tile.min(N - off);
        p.push_task(
            Opcode::GEMV_TILE,
            &[x, w],
            &[y],
            cy,
            &[],
            int_params(&[
                ("K", K as i64),
                ("N_tile", nt as i64),
                ("n_off", off as i64),
            ]),
            format!("proj[{tiles}]"),
        );
        off += nt;
        tiles += 1;
    }
    p.push_task(
        Opcode::ADD,
        &[y, r],
        &[out],
        co,
        &[(cy, tiles)],
        Map::new(),
        "residual",
    );
    p
}

fn formula(x: &Tensor, w: &Tensor, r: &Tensor) -> Vec<f64> {
    (0..N as usize)
        .map(|n| {
            let dot: f64 = (0..K as usize)
                .map(|k| x.get_f32(k) as f64 * w.get_f32(n * K as usize + k) as f64)
                .sum();
            dot + r.get_f32(n) as f64
        })
        .collect()
}

#[rstest]
#[case(FiringMode::ListOrder, 1, 12)]
#[case(FiringMode::ListOrder, 1, 5)]
#[case(FiringMode::ListOrder, 2, 5)]
#[case(FiringMode::ListOrder, 3, 1)]
#[case(FiringMode::RaceHunt { seed: 1 }, 1, 5)]
#[case(FiringMode::RaceHunt { seed: 7 }, 2, 3)]
fn gemv_tiles_plus_add_match_f64_formula(
    #[case] mode: FiringMode,
    #[case] threads: usize,
    #[case] n_tile: u64,
) {
    let reg = registry();
    let p = validated(tiny(n_tile), &reg);
    let weights = random_weights(p.program(), 11, -1.0, 1.0);
    let w = weights.get("proj.weight").unwrap();
    let mut s = CpuBackend::new(opts(mode, threads))
        .load(&p, &weights, &reg)
        .unwrap();
    let mut g = rng(5);
    let x1 = random_nonzero(DType::F32, &[1, K], &mut g, -1.0, 1.0);
    let r = random_nonzero(DType::F32, &[1, N], &mut g, -1.0, 1.0);
    let o1 = s.step(&[("x", x1.clone()), ("r", r.clone())]).unwrap();
    assert_eq!(o1.tensors.len(), 1);
    assert_close(o1.get("out").unwrap(), &formula(&x1, w, &r), 1e-5, 1e-6);
    // Second step: a new x; r persists from the first step.
    let x2 = random_nonzero(DType::F32, &[1, K], &mut g, -1.0, 1.0);
    let o2 = s.step(&[("x", x2.clone())]).unwrap();
    assert_close(o2.get("out").unwrap(), &formula(&x2, w, &r), 1e-5, 1e-6);
}

#[test]
fn every_mode_and_thread_count_agree_bit_for_bit() {
    let reg = registry();
    let p = validated(tiny(3), &reg);
    let weights = random_weights(p.program(), 3, -1.0, 1.0);
    let mut g = rng(9);
    let steps: Vec<Vec<(&str, Tensor)>> = (0..3)
        .map(|_| {
            vec![
                ("x", random_nonzero(DType::F32, &[1, K], &mut g, -2.0, 2.0)),
                ("r", random_nonzero(DType::F32, &[1, N], &mut g, -2.0, 2.0)),
            ]
        })
        .collect();
    let mut base = session(&p, &weights, &reg, CpuOptions::default());
    let want = run_steps(&mut base, &steps);
    for (mode, threads) in [
        (FiringMode::ListOrder, 2),
        (FiringMode::ListOrder, 4),
        (FiringMode::RaceHunt { seed: 0 }, 1),
        (FiringMode::RaceHunt { seed: 99 }, 2),
    ] {
        let mut s = session(&p, &weights, &reg, opts(mode, threads));
        assert_eq!(run_steps(&mut s, &steps), want, "{mode:?} x{threads}");
        assert_eq!(s.parallel_batches() > 0, threads > 1, "{mode:?} x{threads}");
    }
}

#[test]
fn backend_name_and_defaults() {
    let b = CpuBackend::default();
    assert_eq!(b.name(), "cpu");
    assert_eq!(b.options.mode, FiringMode::ListOrder);
    assert_eq!(b.options.threads, 1);
    assert_eq!(CpuBackend::new(CpuOptions::default()).options, b.options);
}

fn loaded() -> (Box<dyn Session>, Registry) {
    let reg = registry();
    let p = validated(tiny(4), &reg);
    let weights = random_weights(p.program(), 1, -1.0, 1.0);
    (CpuBackend::default().load(&p, &weights, &reg).unwrap(), reg)
}

fn input_error(r: Result<amk_core::Outputs, BackendError>) -> (String, String) {
    match r {
        Err(BackendError::Input { name, message }) => (name, message),
        other => panic!("expected an input error, got {other:?}"),
    }
}

#[test]
fn unknown_input_name_is_an_input_error() {
    let (mut s, _) = loaded();
    let x = Tensor::zeros(DType::F32, &[1, K]);
    let r = Tensor::zeros(DType::F32, &[1, N]);
    let (name, msg) = input_error(s.step(&[("x", x), ("r", r), ("nope", scalar_i32(1))]));
    assert_eq!(name, "nope");
    assert!(msg.contains("no buffer"), "{msg}");
}

#[test]
fn input_to_a_non_io_input_buffer_is_an_input_error() {
    let (mut s, _) = loaded();
    let (name, msg) = input_error(s.step(&[("y", Tensor::zeros(DType::F32, &[1, N]))]));
    assert_eq!(name, "y");
    assert!(msg.contains("ACTIVATION"), "{msg}");
}

#[rstest]
#[case(DType::F32, &[1, K + 1])]
#[case(DType::F32, &[K])]
#[case(DType::BF16, &[1, K])]
fn mistyped_input_is_an_input_error(#[case] dtype: DType, #[case] shape: &[u64]) {
    let (mut s, _) = loaded();
    let (name, msg) = input_error(s.step(&[
        ("x", Tensor::zeros(dtype, shape)),
        ("r", Tensor::zeros(DType::F32, &[1, N])),
    ]));
    assert_eq!(name, "x");
    assert!(msg.contains("expected F32"), "{msg}");
}

#[test]
fn input_never_set_is_an_input_error() {
    let (mut s, _) = loaded();
    let (name, msg) = input_error(s.step(&[("x", Tensor::zeros(DType::F32, &[1, K]))]));
    assert_eq!(name, "r");
    assert!(msg.contains("never set"), "{msg}");
    let ok = s.step(&[("r", Tensor::zeros(DType::F32, &[1, N]))]);
    assert!(
        ok.is_ok(),
        "x was set by the first call, r by this one: {ok:?}"
    );
}

#[test]
fn a_rejected_input_list_sets_nothing() {
    let (mut s, _) = loaded();
    let (name, _) = input_error(s.step(&[
        ("x", Tensor::zeros(DType::F32, &[1, K])),
        ("r", Tensor::zeros(DType::F32, &[1, N + 1])),
    ]));
    assert_eq!(name, "r");
    let (name, msg) = input_error(s.step(&[("r", Tensor::zeros(DType::F32, &[1, N]))]));
    assert_eq!(name, "x");
    assert!(msg.contains("never set"), "{msg}");
}

#[test]
fn missing_weight_tensor_is_a_weights_error_naming_the_buffer() {
    let reg = registry();
    let p = validated(tiny(4), &reg);
    let err = CpuBackend::default()
        .load(&p, &WeightStore::new(), &reg)
        .err()
        .expect("load must fail");
    match err {
        BackendError::Weights { buffer, message } => {
            assert_eq!(buffer, "w");
            assert!(message.contains("proj.weight"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn shape_mismatched_weight_is_a_weights_error() {
    let reg = registry();
    let p = validated(tiny(4), &reg);
    let mut weights = WeightStore::new();
    weights.insert("proj.weight", Tensor::zeros(DType::F32, &[N, K + 1]));
    match CpuBackend::default().load(&p, &weights, &reg).err() {
        Some(BackendError::Weights { buffer, message }) => {
            assert_eq!(buffer, "w");
            assert!(message.contains("F32"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let mut weights = WeightStore::new();
    weights.insert("proj.weight", Tensor::zeros(DType::BF16, &[N, K]));
    assert!(matches!(
        CpuBackend::default().load(&p, &weights, &reg),
        Err(BackendError::Weights { .. })
    ));
}

#[test]
fn op_without_a_reference_is_unsupported() {
    let full = registry();
    let p = validated(tiny(4), &full);
    // The same ops, registered without their CPU references.
    let mut bare = Registry::empty();
    for (spec, origin) in full.iter() {
        bare.register(spec.clone(), origin.clone()).unwrap();
    }
    let weights = random_weights(p.program(), 1, -1.0, 1.0);
    match CpuBackend::default().load(&p, &weights, &bare).err() {
        Some(BackendError::Unsupported(msg)) => {
            assert!(msg.contains("GEMV_TILE"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn op_errors_name_the_task() {
    // An op error the validator cannot foresee: EMBED given an out-of-range token id.
    let reg = registry();
    let mut p = Program::new();
    let ids = p.new_buffer("ids", BufferKind::IO_INPUT, DType::I32, &[1]);
    let table = p.new_weight("table", DType::F32, &[4, 3], "table");
    let out = p.new_buffer("out", BufferKind::IO_OUTPUT, DType::F32, &[1, 3]);
    let c = p.new_counter("out ready");
    p.push_task(
        Opcode::EMBED,
        &[ids, table],
        &[out],
        c,
        &[],
        int_params(&[("hidden", 3)]),
        "embed",
    );
    let p = validated(p, &reg);
    let weights = random_weights(p.program(), 2, -1.0, 1.0);
    for mode in [FiringMode::ListOrder, FiringMode::RaceHunt { seed: 3 }] {
        let mut s = session(&p, &weights, &reg, opts(mode, 1));
        match s.step(&[("ids", scalar_i32(9))]) {
            Err(BackendError::Op { task, label, .. }) => {
                assert_eq!((task, label.as_str()), (0, "embed"));
            }
            other => panic!("{other:?}"),
        }
        // The session stays usable.
        let o = s.step(&[("ids", scalar_i32(2))]).unwrap();
        let want: Vec<f64> = (0..3)
            .map(|i| weights.get("table").unwrap().get_f32(6 + i) as f64)
            .collect();
        assert_close(o.get("out").unwrap(), &want, 0.0, 0.0);
    }
}

/// `out = X @ W^T` for `X [M, K]` by GEMM tiles of `m_tile × n_tile` (disjoint row and column
/// blocks sharing one counter), copied to the IO output.
fn gemm_blocks(m: u64, n: u64, k: u64, m_tile: u64, n_tile: u64) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[m, k]);
    let w = p.new_weight("w", DType::F32, &[n, k], "w");
    let y = p.new_buffer("y", BufferKind::ACTIVATION, DType::F32, &[m, n]);
    let out = p.new_buffer("out", BufferKind::IO_OUTPUT, DType::F32, &[m, n]);
    let cy = p.new_counter("y ready");
    let co = p.new_counter("out ready");
    let mut tiles = 0;
    for m_off in (0..m).step_by(m_tile as usize) {
        for n_off in (0..n).step_by(n_tile as usize) {
            p.push_task(
                Opcode::GEMM_TILE,
                &[x, w],
                &[y],
                cy,
                &[],
                int_params(&[
                    ("K", k as i64),
                    ("M_tile", m_tile.min(m - m_off) as i64),
                    ("m_off", m_off as i64),
                    ("N_tile", n_tile.min(n - n_off) as i64),
                    ("n_off", n_off as i64),
                ]),
                format!("gemm[{tiles}]"),
            );
            tiles += 1;
        }
    }
    p.push_task(
        Opcode::COPY,
        &[y],
        &[out],
        co,
        &[(cy, tiles)],
        Map::new(),
        "out",
    );
    p
}

#[rstest]
#[case(1, FiringMode::ListOrder)]
#[case(2, FiringMode::ListOrder)]
#[case(3, FiringMode::RaceHunt { seed: 8 })]
fn gemm_row_and_column_blocks_match_f64_formula(#[case] threads: usize, #[case] mode: FiringMode) {
    let (m, n, k) = (5, 9, 33);
    let reg = registry();
    let p = validated(gemm_blocks(m, n, k, 2, 4), &reg);
    let weights = random_weights(p.program(), 4, -1.0, 1.0);
    let w = weights.get("w").unwrap();
    let x = random_nonzero(DType::F32, &[m, k], &mut rng(12), -1.0, 1.0);
    let mut s = session(&p, &weights, &reg, opts(mode, threads));
    let o = s.step(&[("x", x.clone())]).unwrap();
    let want: Vec<f64> = (0..(m * n) as usize)
        .map(|i| {
            let (r, c) = (i / n as usize, i % n as usize);
            (0..k as usize)
                .map(|j| {
                    x.get_f32(r * k as usize + j) as f64 * w.get_f32(c * k as usize + j) as f64
                })
                .sum()
        })
        .collect();
    assert_close(o.get("out").unwrap(), &want, 1e-5, 1e-6);
    assert_eq!(s.parallel_batches() > 0, threads > 1);
    let mut one = session(&p, &weights, &reg, CpuOptions::default());
    assert_eq!(
        bits(&one.step(&[("x", x)]).unwrap()),
        bits(&o),
        "bit-identical to one thread"
    );
}
