//! Decode-step time of a SmolLM2-135M-shaped program (30 layers, hidden 576, 9/3 heads × 64,
//! intermediate 1536, vocab 49152, f32, random non-zero weights). Run with
//! `cargo test --release -p amk-backend-cpu --test perf -- --ignored --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use amk_backend_cpu::FiringMode;
use amk_conformance::{LlamaConfig, llama_like_with};
use amk_core::Session;
use common::*;
use std::time::{Duration, Instant};

fn measure(threads: usize, n_tile: u64) -> Duration {
    let cfg = LlamaConfig::new(30, 576, 9, 3, 64, 1536, 49152, n_tile);
    let reg = registry();
    let t0 = Instant::now();
    let p = validated(llama_like_with(&cfg), &reg);
    let w = random_weights(p.program(), 135, -0.5, 0.5);
    let mut s = session(&p, &w, &reg, opts(FiringMode::ListOrder, threads));
    let setup = t0.elapsed();
    // Warm-up step (first touch of every buffer), then timed steps.
    let first = s.step(&llama_inputs(1, 0)).expect("step");
    let mut times = Vec::new();
    for tok in 0..7 {
        let t = Instant::now();
        let o = s.step(&llama_inputs(100 + tok, 0)).expect("step");
        times.push(t.elapsed());
        assert!(
            o.get("logits")
                .is_some_and(|l| l.to_f32_vec().iter().all(|v| v.is_finite()))
        );
    }
    assert!(first.get("logits").is_some());
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "SmolLM2-135M shape, n_tile {n_tile}, threads {threads}: {} tasks, {:.0} MB weights; \
         setup {setup:.2?}; decode step min {:.1?} median {:.1?} max {:.1?}",
        p.program().tasks.len(),
        p.program().total_weight_bytes() as f64 / 1e6,
        times[0],
        median,
        times[times.len() - 1],
    );
    median
}

#[test]
#[ignore = "slow in debug builds; run in release with --ignored"]
fn smollm2_135m_decode_step_under_half_a_second() {
    for (threads, n_tile) in [(1, 64), (1, 128), (2, 64), (2, 128)] {
        let median = measure(threads, n_tile);
        assert!(
            median < Duration::from_millis(500),
            "threads {threads}, n_tile {n_tile}: median decode step {median:?} ≥ 0.5 s"
        );
    }
}
