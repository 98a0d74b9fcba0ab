//! `amk-backend-cpu`: the CPU reference VM, the numeric oracle every other backend is judged
//! against.
//!
//! [`CpuBackend::load`](amk_core::Backend::load) binds a [`ValidatedProgram`]'s WEIGHT/CONST
//! buffers with [`WeightStore::bind`], allocates every other buffer as a zeroed
//! [`Tensor`](amk_core::Tensor) of its dtype and shape, and refuses any op without a CPU
//! reference in the registry. Each [`Session::step`] sets IO inputs by buffer name (they
//! persist to later steps), zeroes the counters and runs one forward pass by counter-driven
//! firing (docs/ir.md, opening paragraph): a task fires once every `(counter, threshold)` wait
//! holds, runs its op's reference over its buffers, then increments its `out_counter` by one.
//! KV caches persist across steps and are written in place (never copied);
//! [`CpuSession::set_kv_cache`] carries them over to a program lowered for the next position.
//!
//! Firing modes ([`FiringMode`]):
//! - [`FiringMode::ListOrder`]: repeated sweeps over the task list, firing every ready task in
//!   list order (deterministic; the same order as `Program::simulate_counters`).
//! - [`FiringMode::RaceHunt`]: transient buffers (ACTIVATION, IO_OUTPUT) are poisoned before each
//!   pass, ready tasks fire in a seeded random order, and a task that reads a transient buffer
//!   no fired task has written yet fails the step with [`BackendError::Race`]. On a valid
//!   program the results equal ListOrder's bit for bit.
//!
//! With [`CpuOptions::threads`] > 1, GEMV_TILE/GEMM_TILE tasks that are ready together and write
//! disjoint tiles run on scoped threads, each into a per-worker scratch copy of its output whose
//! tile is then copied back: every tile is computed by the same reference code, so the results
//! are bit-identical to one thread.

mod exec;
mod schedule;
mod tiles;

pub use exec::CpuSession;

use amk_core::{Backend, BackendError, Registry, Session, ValidatedProgram, WeightStore};

/// In which order ready tasks fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FiringMode {
    /// Repeated sweeps over the task list, firing every ready task in list order.
    #[default]
    ListOrder,
    /// Ready tasks fire in a seeded random order; transient buffers are poisoned before each
    /// pass and a read of a transient buffer no fired task has written is a
    /// [`BackendError::Race`].
    RaceHunt {
        /// Seed of the firing order (pass `i` of a session uses a generator derived from
        /// `seed` and `i`, so pass 0 of two sessions with one seed fire identically).
        seed: u64,
    },
}

/// Options of the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuOptions {
    /// Firing order.
    pub mode: FiringMode,
    /// Worker threads for GEMV/GEMM tiles ready together (0 and 1 both mean one thread).
    pub threads: usize,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            mode: FiringMode::ListOrder,
            threads: 1,
        }
    }
}

/// The CPU reference backend.
#[derive(Debug, Clone, Default)]
pub struct CpuBackend {
    /// Options every session loaded by this backend runs with.
    pub options: CpuOptions,
}

impl CpuBackend {
    /// A backend with the given options.
    pub fn new(options: CpuOptions) -> Self {
        CpuBackend { options }
    }

    /// [`Backend::load`] returning the concrete session, which can also show and set buffers
    /// (KV caches, activations) by name.
    pub fn load_session(
        &self,
        program: &ValidatedProgram,
        weights: &WeightStore,
        registry: &Registry,
    ) -> Result<CpuSession, BackendError> {
        CpuSession::new(
            program.program().clone(),
            program.id(),
            weights,
            registry,
            self.options,
        )
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn load(
        &self,
        program: &ValidatedProgram,
        weights: &WeightStore,
        registry: &Registry,
    ) -> Result<Box<dyn Session>, BackendError> {
        Ok(Box::new(self.load_session(program, weights, registry)?))
    }
}
