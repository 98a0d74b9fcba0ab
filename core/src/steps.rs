//! Tasks that run as several ops in a row: an op whose task is a sequence of steps (FUSED and
//! its recipe) registers how to expand a task into these [`Step`]s
//! ([`crate::registry::OpExpansion`]), and a backend runs those steps without knowing the op
//! that expands them — the backend learns of the op through the registry
//! ([`crate::Registry::expansion`]) alone. Plain data, below the registry.

use crate::ir::{DType, Opcode};
use crate::json::Map;

/// Where a step's argument comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepArg {
    /// The task's input `k`.
    Input(usize),
    /// The tensor an earlier step last wrote to scratch slot `k`.
    Slot(i64),
}

/// Where a step's output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOut {
    /// The task's output itself (not cleared first).
    Final,
    /// A fresh zero-filled scratch tensor that then holds slot `slot`: of `shape` (`None`: the
    /// task output's shape) and `dtype`.
    Slot {
        /// The slot.
        slot: i64,
        /// Its shape, when it is not the task output's.
        shape: Option<Vec<u64>>,
        /// Its element type.
        dtype: DType,
    },
}

/// One step: an op over arguments with its params, writing one output.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The step's op (never one that expands itself).
    pub op: Opcode,
    /// Its operands, in order.
    pub args: Vec<StepArg>,
    /// Its params.
    pub params: Map,
    /// Its output.
    pub out: StepOut,
}
