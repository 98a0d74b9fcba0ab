//! KV caches persist across steps, are written in place (never reallocated or copied), and
//! can be carried over to a program lowered for the next position.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use amk_backend_cpu::{CpuSession, FiringMode};
use amk_core::json::Map;
use amk_core::testkit::{random_nonzero, rng};
use amk_core::{BackendError, BufferKind, DType, Opcode, Program, Session, Tensor};
use common::*;
use rstest::rstest;

const ROWS: u64 = 6;
const ROW: u64 = 4;

/// `KV_APPEND(new_k → kcache at pos)`, then `COPY(kcache → cache_out)`.
fn append_program(pos: i64) -> Program {
    let mut p = Program::new();
    let new = p.new_buffer("new_k", BufferKind::IO_INPUT, DType::F32, &[1, ROW]);
    let cache = p.new_buffer("kcache", BufferKind::KV_CACHE, DType::F32, &[ROWS, ROW]);
    let out = p.new_buffer("cache_out", BufferKind::IO_OUTPUT, DType::F32, &[ROWS, ROW]);
    let ca = p.new_counter("appended");
    let cc = p.new_counter("copied");
    p.push_task(
        Opcode::KV_APPEND,
        &[new, cache],
        &[cache],
        ca,
        &[],
        int_params(&[("pos", pos)]),
        "kv_append",
    );
    p.push_task(
        Opcode::COPY,
        &[cache],
        &[out],
        cc,
        &[(ca, 1)],
        Map::new(),
        "copy_out",
    );
    p
}

fn row(t: &Tensor, r: u64) -> Vec<f32> {
    (0..ROW)
        .map(|i| t.get_f32((r * ROW + i) as usize))
        .collect()
}

fn cache_ptr(s: &CpuSession) -> *const f32 {
    s.buffer("kcache").unwrap().as_f32().unwrap().as_ptr()
}

#[rstest]
#[case(FiringMode::ListOrder)]
#[case(FiringMode::RaceHunt { seed: 4 })]
fn cache_rows_persist_across_steps_and_programs(#[case] mode: FiringMode) {
    let reg = registry();
    let p1 = validated(append_program(1), &reg);
    let weights = amk_core::WeightStore::new();
    let mut s = session(&p1, &weights, &reg, opts(mode, 1));
    let mut g = rng(21);
    let init = random_nonzero(DType::F32, &[ROWS, ROW], &mut g, -1.0, 1.0);
    s.set_kv_cache("kcache", init.clone()).unwrap();
    let ptr = cache_ptr(&s);

    let a = random_nonzero(DType::F32, &[1, ROW], &mut g, -1.0, 1.0);
    let o = s.step(&[("new_k", a.clone())]).unwrap();
    let out = o.get("cache_out").unwrap();
    for r in 0..ROWS {
        let want = if r == 1 { row(&a, 0) } else { row(&init, r) };
        assert_eq!(row(out, r), want, "step 1 row {r}");
    }

    // Step 2 overwrites row 1; every other row still holds the state before step 1.
    let b = random_nonzero(DType::F32, &[1, ROW], &mut g, -1.0, 1.0);
    let o = s.step(&[("new_k", b.clone())]).unwrap();
    let out = o.get("cache_out").unwrap();
    for r in 0..ROWS {
        let want = if r == 1 { row(&b, 0) } else { row(&init, r) };
        assert_eq!(row(out, r), want, "step 2 row {r}");
    }
    assert_eq!(s.buffer("kcache").unwrap(), out);
    assert_eq!(cache_ptr(&s), ptr, "the cache was written in place");

    // The next position's program carries the cache over.
    let p2 = validated(append_program(2), &reg);
    let mut s2 = session(&p2, &weights, &reg, opts(mode, 1));
    s2.set_kv_cache("kcache", s.buffer("kcache").unwrap().clone())
        .unwrap();
    let c = random_nonzero(DType::F32, &[1, ROW], &mut g, -1.0, 1.0);
    let o = s2.step(&[("new_k", c.clone())]).unwrap();
    let out = o.get("cache_out").unwrap();
    for r in 0..ROWS {
        let want = match r {
            1 => row(&b, 0),
            2 => row(&c, 0),
            _ => row(&init, r),
        };
        assert_eq!(row(out, r), want, "next program row {r}");
    }
}

#[test]
fn fresh_cache_starts_at_zero_and_set_kv_cache_checks_its_argument() {
    let reg = registry();
    let p = validated(append_program(0), &reg);
    let mut s = session(&p, &amk_core::WeightStore::new(), &reg, Default::default());
    assert!(
        s.buffer("kcache")
            .unwrap()
            .to_f32_vec()
            .iter()
            .all(|&v| v == 0.0)
    );
    let a = Tensor::from_f32(DType::F32, &[1, ROW], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let o = s.step(&[("new_k", a)]).unwrap();
    let v = o.get("cache_out").unwrap().to_f32_vec();
    assert_eq!(&v[..4], &[1.0, 2.0, 3.0, 4.0]);
    assert!(v[4..].iter().all(|&x| x == 0.0));

    for (name, t) in [
        ("kcache", Tensor::zeros(DType::F32, &[ROWS + 1, ROW])),
        ("kcache", Tensor::zeros(DType::BF16, &[ROWS, ROW])),
        ("new_k", Tensor::zeros(DType::F32, &[1, ROW])),
        ("nope", Tensor::zeros(DType::F32, &[1])),
    ] {
        match s.set_kv_cache(name, t) {
            Err(BackendError::Input { name: n, .. }) => assert_eq!(n, name),
            other => panic!("{name}: {other:?}"),
        }
    }
}
