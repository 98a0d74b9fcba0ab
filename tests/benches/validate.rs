//! Validator and loader throughput on Llama-shaped decode programs (≈3.4k and ≈20k tasks).
//!
//! Run: `cargo bench -p amk-conformance --bench validate`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a broken fixture should abort the bench

use amk_conformance::{preset_3k, preset_20k};
use amk_core::{Program, validate};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let reg = amk_ops::registry().expect("registry");
    for (name, p) in [("llama_3k", preset_3k()), ("llama_20k", preset_20k())] {
        let r = validate(&p, &reg);
        assert!(r.ok(), "{} must validate: {}", name, r.report());
        let label = format!("{name}/{}tasks", p.tasks.len());
        c.bench_function(&format!("validate/{label}"), |b| {
            b.iter(|| validate(black_box(&p), &reg))
        });
        let text = p.to_json(&reg).expect("serialise");
        c.bench_function(&format!("load_json/{label}/{}KB", text.len() / 1000), |b| {
            b.iter(|| Program::from_json(black_box(&text), &reg).expect("load"))
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench
}
criterion_main!(benches);
