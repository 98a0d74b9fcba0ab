//! The records of a program: buffers, counters, waits, tasks and pages.

use super::enums::{BufferKind, DType, MemSpace};
use super::opcode::Opcode;
use crate::json::{Map, Value};

/// Index of a buffer in `Program::buffers` (ids are canonical: `buffers[i].id == i`).
pub type BufferId = u32;
/// Index of a counter in `Program::counters`.
pub type CounterId = u32;
/// Index of a task in `Program::tasks`.
pub type TaskId = u32;
/// Index of a page in `PageAllocation::pages`.
pub type PageId = u32;

/// A named tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Buffer {
    /// Canonical id (= index).
    pub id: BufferId,
    /// Human name (unique by convention, not required).
    pub name: String,
    /// What it holds.
    pub kind: BufferKind,
    /// Element type.
    pub dtype: DType,
    /// Logical shape; every dim ≥ 1; rank 0 is a scalar.
    pub shape: Vec<u64>,
    /// Memory space.
    pub space: MemSpace,
    /// Weight key for WEIGHT/CONST buffers.
    pub source: Option<String>,
}

impl Buffer {
    /// Whether `other` is the same slot in another program: the same name, kind, dtype and
    /// shape (two programs loaded beside each other share such KV caches and weights).
    pub fn same_slot(&self, other: &Buffer) -> bool {
        self.name == other.name
            && self.kind == other.kind
            && self.dtype == other.dtype
            && self.shape == other.shape
    }
    /// Number of elements (1 for rank 0); saturates instead of overflowing.
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }
    /// Bytes needed (packed types round up).
    pub fn nbytes(&self) -> u64 {
        self.dtype.nbytes(self.numel())
    }
    /// Row-major element strides.
    pub fn strides(&self) -> Vec<u64> {
        let mut s = vec![1u64; self.shape.len()];
        for i in (0..self.shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1].saturating_mul(self.shape[i + 1]);
        }
        s
    }
    /// Rank.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Last dimension (1 for rank 0).
    pub fn last_dim(&self) -> u64 {
        self.shape.last().copied().unwrap_or(1)
    }
}

/// A synchronisation counter.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Counter {
    /// Canonical id (= index).
    pub id: CounterId,
    /// Initial value; must be 0 (the device zeroes counters every launch).
    pub init: i64,
    /// Free text.
    pub note: String,
}

/// "Do not start until `counters[counter] >= threshold`."
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// Counter waited on (may be dangling in a malformed program).
    pub counter: CounterId,
    /// Static threshold (validated to be ≥ 1 and ≤ #producers).
    pub threshold: i64,
}

/// One instruction invocation: reads `inputs`, writes `outputs`, then increments `out_counter`.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Canonical id (= index).
    pub id: TaskId,
    /// Opcode.
    pub op: Opcode,
    /// Buffers read.
    pub inputs: Vec<BufferId>,
    /// Buffers written.
    pub outputs: Vec<BufferId>,
    /// Counter incremented once on completion.
    pub out_counter: CounterId,
    /// Preconditions.
    pub waits: Vec<Wait>,
    /// Op-specific parameters, in file order.
    pub params: Map,
    /// SM assignment (a lowering output); `None` = unassigned, and always `None` for a
    /// floating task.
    pub sm: Option<i32>,
    /// A floating task sits in no SM's queue: the block whose signal brings its one wait's
    /// counter to the threshold runs it right after its own task. It never waits (its wait
    /// holds when it runs), so it cannot be on a wait cycle; the validator's `floating_task`
    /// rules keep its runner the one completing signal (docs/ir.md).
    pub floating: bool,
    /// Cost hint: bytes moved.
    pub est_bytes: i64,
    /// Cost hint: flops.
    pub est_flops: i64,
    /// Human label.
    pub label: String,
}

impl Task {
    /// A task with no waits, params, SM or costs.
    pub fn new(
        id: TaskId,
        op: Opcode,
        inputs: Vec<BufferId>,
        outputs: Vec<BufferId>,
        out_counter: CounterId,
    ) -> Self {
        Task {
            id,
            op,
            inputs,
            outputs,
            out_counter,
            waits: Vec::new(),
            params: Map::new(),
            sm: None,
            floating: false,
            est_bytes: 0,
            est_flops: 0,
            label: String::new(),
        }
    }
    /// An integer param (never a bool or float).
    pub fn param_i64(&self, key: &str) -> Option<i64> {
        self.params.get(key).and_then(Value::as_i64)
    }
    /// A real param (int or float).
    pub fn param_f64(&self, key: &str) -> Option<f64> {
        self.params.get(key).and_then(Value::as_f64)
    }
    /// The label, or the opcode's name when the label is empty (as messages show tasks).
    pub fn display_label(&self) -> String {
        if self.label.is_empty() {
            self.op.to_string()
        } else {
            self.label.clone()
        }
    }
}

/// A physical scratch slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// Canonical id (= index).
    pub id: PageId,
    /// Memory space.
    pub space: MemSpace,
    /// Size.
    pub nbytes: u64,
    /// First task index of the live range (-1 = unknown).
    pub live_start: i64,
    /// Last task index of the live range (-1 = unknown).
    pub live_end: i64,
}

/// Buffer → page binding (the allocator's output).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PageAllocation {
    /// (buffer, page) pairs in file order.
    pub buffer_to_page: Vec<(BufferId, PageId)>,
    /// The pages.
    pub pages: Vec<Page>,
}
