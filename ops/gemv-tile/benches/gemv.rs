//! GEMV_TILE CPU reference throughput, single-threaded, in weight bytes streamed per second:
//! a 2048 × 2048 weight (x `[1, 2048]`, `N_tile` 2048) in F32, BF16, F16 and int4/int8 groups.
//!
//! Run: `cargo bench -p op-gemv-tile --bench gemv`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a broken setup should abort the bench

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, Opcode, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use op_gemv_tile::reference::run;
use std::hint::black_box;

const K: u64 = 2048;
const N: u64 = 2048;

fn bench(c: &mut Criterion) {
    let mut r = rng(7);
    let x = random_nonzero(DType::F32, &[1, K], &mut r, -1.0, 1.0);
    let base = [
        ("K", Value::Int(K as i64)),
        ("N_tile", Value::Int(N as i64)),
        ("n_off", Value::Int(0)),
    ];
    let mut g = c.benchmark_group("gemv_tile_2048x2048");
    for wd in [DType::F32, DType::BF16, DType::F16] {
        let w = random_nonzero(wd, &[N, K], &mut r, -1.0, 1.0);
        let t = task(Opcode::GEMV_TILE, 2, 1, &base);
        let mut out = [Tensor::poisoned(DType::F32, &[1, N])];
        // Correctness gate: no timing for a wrong result.
        call(run, &t, &[&x, &w], &mut out).expect("run");
        for n in (0..N as usize).step_by(97) {
            let want: f64 = (0..K as usize)
                .map(|k| x.get_f32(k) as f64 * w.get_f32(n * K as usize + k) as f64)
                .sum();
            let got = out[0].get_f32(n) as f64;
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "row {n}: {got} vs {want}"
            );
        }
        g.throughput(Throughput::Bytes(wd.nbytes(N * K)));
        g.bench_function(format!("{wd}"), |b| {
            b.iter(|| call(run, &t, &[black_box(&x), black_box(&w)], &mut out).expect("run"))
        });
    }
    for (qd, wd) in [(7, DType::I4), (6, DType::I8)] {
        let q = Tensor::random(wd, &[N, K], &mut r, -8.0, 15.0);
        let s = random_nonzero(DType::F16, &[N, K / 128], &mut r, -0.1, 0.1);
        let mut params = base.to_vec();
        params.push(("qdtype", Value::Int(qd)));
        params.push(("group", Value::Int(128)));
        let t = task(Opcode::GEMV_TILE, 3, 1, &params);
        let mut out = [Tensor::zeros(DType::F32, &[1, N])];
        g.throughput(Throughput::Bytes(wd.nbytes(N * K)));
        g.bench_function(format!("{wd}_group128"), |b| {
            b.iter(|| call(run, &t, &[black_box(&x), &q, &s], &mut out).expect("run"))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench
}
criterion_main!(benches);
