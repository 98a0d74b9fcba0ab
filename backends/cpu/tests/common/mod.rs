//! Shared helpers of the CPU backend's tests.
#![allow(dead_code)] // each test file uses a different subset
#![allow(clippy::expect_used, clippy::panic)] // test helpers fail loudly

use amk_backend_cpu::{CpuBackend, CpuOptions, CpuSession, FiringMode};
use amk_core::json::{Map, Value};
use amk_core::testkit::random_nonzero;
use amk_core::{
    BufferKind, DType, Outputs, Program, Registry, Session, Tensor, ValidatedProgram, WeightStore,
    validate_owned,
};

/// The registry of every built-in op.
pub fn registry() -> Registry {
    amk_ops::registry().expect("built-in registry")
}

/// Validates `p`, panicking with the report if it is rejected.
pub fn validated(p: Program, reg: &Registry) -> ValidatedProgram {
    match validate_owned(p, reg) {
        Ok(v) => v,
        Err(r) => panic!("program rejected:\n{}", r.report()),
    }
}

/// Params from `(key, integer)` pairs.
pub fn int_params(kv: &[(&str, i64)]) -> Map {
    let mut m = Map::new();
    for (k, v) in kv {
        m.insert(*k, Value::Int(*v));
    }
    m
}

/// Random non-zero tensors in `[lo, hi)` for every WEIGHT/CONST buffer, named by `source`.
pub fn random_weights(p: &Program, seed: u64, lo: f64, hi: f64) -> WeightStore {
    let mut rng = amk_core::testkit::rng(seed);
    let mut w = WeightStore::new();
    for b in &p.buffers {
        if matches!(b.kind, BufferKind::WEIGHT | BufferKind::CONST) {
            let name = b.source.clone().expect("weights have a source");
            if w.get(&name).is_none() {
                w.insert(name, random_nonzero(b.dtype, &b.shape, &mut rng, lo, hi));
            }
        }
    }
    w
}

/// Options with a mode and a thread count.
pub fn opts(mode: FiringMode, threads: usize) -> CpuOptions {
    CpuOptions { mode, threads }
}

/// Loads `p` with `options`, as the concrete session.
pub fn session(
    p: &ValidatedProgram,
    w: &WeightStore,
    reg: &Registry,
    options: CpuOptions,
) -> CpuSession {
    CpuBackend::new(options)
        .load_session(p, w, reg)
        .expect("load")
}

/// An `I32` tensor of shape `[1]`.
pub fn scalar_i32(v: i64) -> Tensor {
    Tensor::from_i64(DType::I32, &[1], &[v]).expect("scalar")
}

/// The IO inputs of a `llama_like` program: token id, position, reshape id 0.
pub fn llama_inputs(token: i64, pos: i64) -> Vec<(&'static str, Tensor)> {
    vec![
        ("token_id", scalar_i32(token)),
        ("pos", scalar_i32(pos)),
        ("reshape_id0", scalar_i32(0)),
    ]
}

/// Every output's name and little-endian bytes (bit-exact comparison, NaN included).
pub fn bits(o: &Outputs) -> Vec<(String, Vec<u8>)> {
    o.tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.to_le_bytes()))
        .collect()
}

/// Runs `steps` (one input list per step) and returns every step's output bits.
pub fn run_steps(
    s: &mut dyn Session,
    steps: &[Vec<(&str, Tensor)>],
) -> Vec<Vec<(String, Vec<u8>)>> {
    steps
        .iter()
        .map(|inputs| bits(&s.step(inputs).expect("step")))
        .collect()
}
