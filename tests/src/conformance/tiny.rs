//! A tiny program builder for the hand-written cases, and the check that runs one against
//! its f64 formula.

use super::Ctx;
use super::compare::{Tol, close, output};
use super::outcome::{CaseResult, Failure};
use super::run::{Inputs, random_inputs, run_steps, vals};
use crate::r#gen;
use amk_core::json::Value;
use amk_core::sim::SplitMix;
use amk_core::testkit::random_nonzero;
use amk_core::{BufferId, BufferKind, CounterId, DType, Opcode, Program, WeightStore};

/// A tiny program under construction with its weights and its random source.
pub(super) struct Tiny {
    pub(super) p: Program,
    pub(super) w: WeightStore,
    pub(super) rng: SplitMix,
}

fn pv(kv: &[(&str, Value)]) -> amk_core::json::Map {
    r#gen::params(kv)
}

pub(super) fn int(v: i64) -> Value {
    Value::Int(v)
}

pub(super) fn real(v: f64) -> Value {
    Value::Float(v)
}

impl Tiny {
    pub(super) fn new(seed: u64) -> Self {
        Tiny {
            p: Program::new(),
            w: WeightStore::new(),
            rng: SplitMix(seed ^ 0xC0F0_2A4C_E5E7_0000),
        }
    }
    pub(super) fn input(&mut self, name: &str, dtype: DType, shape: &[u64]) -> BufferId {
        self.p.new_buffer(name, BufferKind::IO_INPUT, dtype, shape)
    }
    pub(super) fn output(&mut self, name: &str, dtype: DType, shape: &[u64]) -> BufferId {
        self.p.new_buffer(name, BufferKind::IO_OUTPUT, dtype, shape)
    }
    pub(super) fn act(&mut self, name: &str, shape: &[u64]) -> BufferId {
        self.p
            .new_buffer(name, BufferKind::ACTIVATION, DType::F32, shape)
    }
    pub(super) fn kv(&mut self, name: &str, shape: &[u64]) -> BufferId {
        self.p
            .new_buffer(name, BufferKind::KV_CACHE, DType::F32, shape)
    }
    /// A WEIGHT buffer with random non-zero values in `[lo, hi)`; returns the id and the values.
    pub(super) fn weight(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        lo: f64,
        hi: f64,
    ) -> (BufferId, Vec<f64>) {
        let t = random_nonzero(dtype, shape, &mut self.rng, lo, hi);
        let v = vals(&t);
        self.w.insert(name, t);
        (self.p.new_weight(name, dtype, shape, name), v)
    }
    pub(super) fn counter(&mut self) -> CounterId {
        let n = self.p.counters.len();
        self.p.new_counter(format!("c{n}"))
    }
    /// A task with its own new counter; returns the counter.
    pub(super) fn task(
        &mut self,
        op: Opcode,
        ins: &[BufferId],
        outs: &[BufferId],
        waits: &[(CounterId, i64)],
        params: &[(&str, Value)],
    ) -> CounterId {
        let c = self.counter();
        self.task_on(c, op, ins, outs, waits, params);
        c
    }
    /// A task signalling the (possibly shared) counter `c`.
    pub(super) fn task_on(
        &mut self,
        c: CounterId,
        op: Opcode,
        ins: &[BufferId],
        outs: &[BufferId],
        waits: &[(CounterId, i64)],
        params: &[(&str, Value)],
    ) {
        let label = format!("{op}#{}", self.p.tasks.len());
        self.p.push_task(op, ins, outs, c, waits, pv(params), label);
    }
}

/// Runs `nsteps` forward passes of `t` with fresh random inputs (`make` may adjust them) and
/// checks every pass's outputs against `formula(inputs)`: `(output name, values)` pairs.
pub(super) fn check_formula(
    c: &Ctx<'_>,
    t: Tiny,
    nsteps: usize,
    tol: Tol,
    mut make: impl FnMut(&mut Inputs, &mut SplitMix),
    formula: impl Fn(&Inputs) -> Result<Vec<(&'static str, Vec<f64>)>, Failure>,
) -> CaseResult {
    let Tiny { p, w, mut rng } = t;
    let steps: Vec<Inputs> = (0..nsteps)
        .map(|_| {
            let mut ins = random_inputs(&p, &mut rng);
            make(&mut ins, &mut rng);
            ins
        })
        .collect();
    let got = run_steps(c.backend, &c.registry, &p, &w, &steps)?;
    for (k, (o, ins)) in got.iter().zip(&steps).enumerate() {
        for (name, want) in formula(ins)? {
            close(
                &format!("step {k}: output '{name}'"),
                output(o, name, k)?,
                &want,
                tol,
            )?;
        }
    }
    Ok(())
}

pub(super) fn no_change(_: &mut Inputs, _: &mut SplitMix) {}
