//! The fuzz targets on stable, as CI runs them: every target over its seed corpus and a few
//! thousand seeded mutants of it, in a bounded time (a few seconds a target), with no panic
//! and no input slower than a bound. libFuzzer's long runs (`docs/fuzzing.md`) go much
//! further; this keeps every target building and its seeds clean.
#![allow(clippy::panic)] // test file: a panic is the finding

use amk_core::sim::SplitMix;
use amk_fuzz_targets::{TARGETS, mutate::mutate, seeds};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// Time a target gets, and the slowest a single input may be (debug build).
const BUDGET: Duration = Duration::from_secs(6);
const SLOWEST: Duration = Duration::from_secs(10);

#[test]
fn every_target_survives_its_seeds_and_their_mutants() {
    let mut report = Vec::new();
    for t in TARGETS {
        let corpus = seeds(t.name);
        assert!(!corpus.is_empty(), "{}: no seeds", t.name);
        let mut rng = SplitMix(0xF022 ^ t.name.len() as u64);
        let start = Instant::now();
        let (mut runs, mut slowest) = (0usize, Duration::ZERO);
        while runs < corpus.len() || (start.elapsed() < BUDGET && runs < 20_000) {
            let input = match corpus.get(runs) {
                Some(seed) => seed.clone(),
                None => {
                    let seed = &corpus[(rng.next() % corpus.len() as u64) as usize];
                    let rounds = 1 + (rng.next() % 8) as usize;
                    mutate(seed, &mut rng, rounds)
                }
            };
            let t0 = Instant::now();
            if catch_unwind(AssertUnwindSafe(|| (t.run)(&input))).is_err() {
                let head: Vec<u8> = input.iter().take(256).copied().collect();
                panic!(
                    "{} panicked on input {runs} ({} bytes; first 256: {head:?})",
                    t.name,
                    input.len()
                );
            }
            slowest = slowest.max(t0.elapsed());
            runs += 1;
        }
        assert!(slowest <= SLOWEST, "{}: an input took {slowest:?}", t.name);
        report.push(format!("{}: {runs} inputs, slowest {slowest:?}", t.name));
    }
    println!("{}", report.join("\n"));
}
