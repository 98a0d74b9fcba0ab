//! Llama-shaped decode programs with random weights: RaceHunt equals ListOrder bit for bit on
//! several seeds, two threads equal one, and the weights' typed errors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use amk_backend_cpu::{CpuBackend, FiringMode};
use amk_conformance::{LlamaConfig, llama_like_with};
use amk_core::{Backend, BackendError, DType, Session, Tensor, ValidatedProgram, WeightStore};
use common::*;
use rstest::rstest;

fn small() -> LlamaConfig {
    LlamaConfig::new(2, 64, 4, 2, 16, 128, 200, 16)
}

fn split_kv() -> LlamaConfig {
    let mut c = small();
    c.pos = 5;
    c.max_seq = 16;
    c.split_kv = 3;
    c
}

fn bf16_pages() -> LlamaConfig {
    let mut c = LlamaConfig::new(3, 96, 6, 2, 16, 160, 300, 32);
    c.dtype = DType::BF16;
    c.pages = true;
    c.sm_round_robin = true;
    c
}

fn build(cfg: &LlamaConfig) -> (ValidatedProgram, WeightStore, amk_core::Registry) {
    let reg = registry();
    let p = validated(llama_like_with(cfg), &reg);
    let w = random_weights(p.program(), 0xC0FFEE, -0.5, 0.5);
    (p, w, reg)
}

fn steps(cfg: &LlamaConfig) -> Vec<Vec<(&'static str, Tensor)>> {
    [3i64, 17, 150]
        .iter()
        .map(|&tok| llama_inputs(tok, cfg.pos as i64))
        .collect()
}

#[rstest]
#[case::small(small())]
#[case::split_kv(split_kv())]
#[case::bf16_pages(bf16_pages())]
fn race_hunt_equals_list_order_bit_for_bit(#[case] cfg: LlamaConfig) {
    let (p, w, reg) = build(&cfg);
    let steps = steps(&cfg);
    let mut base = CpuBackend::default().load(&p, &w, &reg).unwrap();
    let want = run_steps(base.as_mut(), &steps);
    // Sanity: finite logits that depend on the token.
    let logits = base.step(&steps[0]).unwrap();
    let l = logits.get("logits").unwrap().to_f32_vec();
    assert!(l.iter().all(|v| v.is_finite()));
    assert_ne!(want[0], want[1]);
    for seed in [0u64, 1, 2, 3, 0xDEAD_BEEF, u64::MAX] {
        let mut s = session(&p, &w, &reg, opts(FiringMode::RaceHunt { seed }, 1));
        assert_eq!(run_steps(&mut s, &steps), want, "seed {seed}");
    }
}

#[rstest]
#[case::small(small())]
#[case::split_kv(split_kv())]
#[case::bf16_pages(bf16_pages())]
fn threads_are_bit_identical_to_one_thread(#[case] cfg: LlamaConfig) {
    let (p, w, reg) = build(&cfg);
    let steps = steps(&cfg);
    let mut one = session(&p, &w, &reg, opts(FiringMode::ListOrder, 1));
    let want = run_steps(&mut one, &steps);
    for (mode, threads) in [
        (FiringMode::ListOrder, 2),
        (FiringMode::ListOrder, 3),
        (FiringMode::RaceHunt { seed: 5 }, 2),
    ] {
        let mut s = session(&p, &w, &reg, opts(mode, threads));
        assert_eq!(run_steps(&mut s, &steps), want, "{mode:?} x{threads}");
        assert!(
            s.parallel_batches() > 0,
            "the tiles never ran on several threads"
        );
    }
    assert_eq!(one.parallel_batches(), 0);
}

#[test]
fn kv_caches_hold_this_position_after_a_step() {
    let cfg = split_kv();
    let (p, w, reg) = build(&cfg);
    let mut s = session(&p, &w, &reg, Default::default());
    s.step(&llama_inputs(7, cfg.pos as i64)).unwrap();
    let kc = s.buffer("L0.kcache").unwrap();
    let row = (cfg.kv_heads * cfg.head_dim) as usize;
    let pos = cfg.pos as usize;
    let values = kc.to_f32_vec();
    for (r, chunk) in values.chunks(row).enumerate() {
        let written = chunk.iter().any(|&v| v != 0.0);
        assert_eq!(written, r == pos, "row {r}");
    }
}

#[test]
fn missing_weight_tensor_names_the_buffer() {
    let cfg = small();
    let (p, full, reg) = build(&cfg);
    let mut w = WeightStore::new();
    for name in full.names().filter(|&n| n != "layers.1.post_norm") {
        w.insert(name, Tensor::clone(full.get(name).unwrap()));
    }
    match CpuBackend::default().load(&p, &w, &reg).err() {
        Some(BackendError::Weights { buffer, message }) => {
            assert_eq!(buffer, "layers.1.post_norm");
            assert!(message.contains("not in the weights"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn shape_mismatched_weight_names_the_buffer() {
    let cfg = small();
    let (p, mut w, reg) = build(&cfg);
    w.insert(
        "layers.0.attn.k_proj.weight",
        Tensor::zeros(DType::F32, &[cfg.hidden, cfg.kv_heads * cfg.head_dim]),
    );
    match CpuBackend::default().load(&p, &w, &reg).err() {
        Some(BackendError::Weights { buffer, .. }) => {
            assert_eq!(buffer, "layers.0.attn.k_proj.weight");
        }
        other => panic!("{other:?}"),
    }
}
