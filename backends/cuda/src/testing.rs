//! Test-only entry points (`testing` feature; the CLI never enables it): loading a program
//! the validator has not seen, so tests can launch what no validated program can do — a task
//! that never becomes ready (the watchdog test) or a bad opcode (the trap path).

use crate::{CudaBackend, CudaError, CudaSession};
use amk_core::{Program, Registry, WeightStore};

/// Loads `program` without validating it. Its param patches are refused (no program id).
pub fn load_unvalidated(
    backend: &CudaBackend,
    program: &Program,
    weights: &WeightStore,
    registry: &Registry,
) -> Result<CudaSession, CudaError> {
    CudaSession::load(
        backend,
        program,
        u64::MAX,
        crate::device::WeightSource::Store(weights),
        registry,
        &[],
        None,
    )
}

/// Overwrites the opcode of task `task`'s device record (to exercise the dispatcher's
/// unknown-opcode trap, which no loadable program can reach).
pub fn overwrite_opcode(session: &mut CudaSession, task: usize, op: i32) -> Result<(), CudaError> {
    session.overwrite_opcode(task, op)
}
