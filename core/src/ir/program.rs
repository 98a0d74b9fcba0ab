//! `Program`: the whole schedule, with builders and graph helpers.

use super::config::{GpuTarget, ScheduleConfig};
use super::enums::{BufferKind, DType, MemSpace};
use super::opcode::Opcode;
use super::records::{Buffer, BufferId, Counter, CounterId, PageAllocation, Task, TaskId, Wait};
use crate::json::Map;

/// On-disk format version written by this build.
pub const IR_VERSION: &str = "0.2.0";
/// On-device ABI version written by this build.
pub const ABI_VERSION: &str = "0.2";

/// A complete megakernel schedule: a DAG of tasks synchronised only by counters.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// Provenance (model, gpu, regime, …), in file order.
    pub meta: Map,
    /// The GPU described as data.
    pub target: Option<GpuTarget>,
    /// Every tensor.
    pub buffers: Vec<Buffer>,
    /// Every counter.
    pub counters: Vec<Counter>,
    /// The DAG nodes, in queue order.
    pub tasks: Vec<Task>,
    /// Scratch page binding.
    pub pages: Option<PageAllocation>,
    /// The search point that produced this program.
    pub config: Option<ScheduleConfig>,
    /// Format version string as read or written.
    pub ir_version: String,
    /// ABI version string as read or written.
    pub abi_version: String,
    /// Present when the program may run as the body of a decode loop: several passes in one
    /// launch, counters counting on across passes (see [`StepLoop`]).
    pub step_loop: Option<StepLoop>,
}

/// How a program runs as the body of a loop of passes inside one launch.
///
/// Pass k (k = 1, 2, …) waits for `threshold × k` on every counter: counters are not reset
/// between passes, and every wait is a full wait (the validator's `partial_shared_wait` rule),
/// so after pass k every counter holds exactly k times its producer count. Before pass k + 1
/// each block waits until the `gate` counter holds k times its producers, then reads element 0
/// of the `halt` buffer: non-zero ends the loop. The validator proves that every task reaches a
/// producer of `gate` (so the gate is a barrier: all of pass k happens before any of pass
/// k + 1) and that `halt` is an integer STATE buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLoop {
    /// The counter whose full count ends a pass.
    pub gate: CounterId,
    /// An integer STATE buffer: element 0 non-zero after a pass stops the loop.
    pub halt: BufferId,
}

impl Default for Program {
    fn default() -> Self {
        Program {
            meta: Map::new(),
            target: None,
            buffers: Vec::new(),
            counters: Vec::new(),
            tasks: Vec::new(),
            pages: None,
            config: None,
            ir_version: IR_VERSION.to_string(),
            abi_version: ABI_VERSION.to_string(),
            step_loop: None,
        }
    }
}

/// Producers and waiters of every counter, in compressed (CSR) form. Dangling ids are
/// skipped, so this is safe to build for any loaded program.
#[derive(Debug, Clone)]
pub struct CounterIndex {
    prod_off: Vec<u32>,
    prod: Vec<TaskId>,
    wait_off: Vec<u32>,
    wait: Vec<TaskId>,
}

impl CounterIndex {
    /// Builds the index.
    pub fn new(p: &Program) -> Self {
        let n = p.counters.len();
        let mut prod_off = vec![0u32; n + 1];
        let mut wait_off = vec![0u32; n + 1];
        for t in &p.tasks {
            if (t.out_counter as usize) < n {
                prod_off[t.out_counter as usize + 1] += 1;
            }
            for (i, w) in t.waits.iter().enumerate() {
                let c = w.counter as usize;
                if c < n && !t.waits[..i].iter().any(|x| x.counter == w.counter) {
                    wait_off[c + 1] += 1;
                }
            }
        }
        for c in 0..n {
            prod_off[c + 1] += prod_off[c];
            wait_off[c + 1] += wait_off[c];
        }
        let mut prod = vec![0; prod_off[n] as usize];
        let mut wait = vec![0; wait_off[n] as usize];
        let mut pf: Vec<u32> = prod_off[..n].to_vec();
        let mut wf: Vec<u32> = wait_off[..n].to_vec();
        for t in &p.tasks {
            if let Some(f) = pf.get_mut(t.out_counter as usize) {
                prod[*f as usize] = t.id;
                *f += 1;
            }
            for (i, w) in t.waits.iter().enumerate() {
                let c = w.counter as usize;
                if c < n && !t.waits[..i].iter().any(|x| x.counter == w.counter) {
                    wait[wf[c] as usize] = t.id;
                    wf[c] += 1;
                }
            }
        }
        CounterIndex {
            prod_off,
            prod,
            wait_off,
            wait,
        }
    }
    /// Number of counters indexed.
    pub fn n_counters(&self) -> usize {
        self.prod_off.len() - 1
    }
    /// Tasks whose `out_counter` is `c`, ascending (empty for a dangling id).
    pub fn producers(&self, c: CounterId) -> &[TaskId] {
        let c = c as usize;
        if c >= self.n_counters() {
            return &[];
        }
        &self.prod[self.prod_off[c] as usize..self.prod_off[c + 1] as usize]
    }
    /// Tasks with at least one wait on `c`, ascending, de-duplicated.
    pub fn waiters(&self, c: CounterId) -> &[TaskId] {
        let c = c as usize;
        if c >= self.n_counters() {
            return &[];
        }
        &self.wait[self.wait_off[c] as usize..self.wait_off[c + 1] as usize]
    }
    /// Number of producers of `c` (0 for a dangling id).
    pub fn n_producers(&self, c: CounterId) -> usize {
        self.producers(c).len()
    }
}

impl Program {
    /// An empty program with current versions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a buffer and returns its id.
    pub fn new_buffer(
        &mut self,
        name: impl Into<String>,
        kind: BufferKind,
        dtype: DType,
        shape: &[u64],
    ) -> BufferId {
        let id = self.buffers.len() as BufferId;
        self.buffers.push(Buffer {
            id,
            name: name.into(),
            kind,
            dtype,
            shape: shape.to_vec(),
            space: MemSpace::HBM,
            source: None,
        });
        id
    }

    /// Appends a weight buffer bound to `source`.
    pub fn new_weight(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: &[u64],
        source: impl Into<String>,
    ) -> BufferId {
        let id = self.new_buffer(name, BufferKind::WEIGHT, dtype, shape);
        self.buffers[id as usize].source = Some(source.into());
        id
    }

    /// Appends a counter and returns its id.
    pub fn new_counter(&mut self, note: impl Into<String>) -> CounterId {
        let id = self.counters.len() as CounterId;
        self.counters.push(Counter {
            id,
            init: 0,
            note: note.into(),
        });
        id
    }

    /// Appends a task (its id is set to its index) and returns the id.
    pub fn add_task(&mut self, mut task: Task) -> TaskId {
        let id = self.tasks.len() as TaskId;
        task.id = id;
        self.tasks.push(task);
        id
    }

    /// Appends a task built from parts; `waits` are `(counter, threshold)` pairs.
    #[allow(clippy::too_many_arguments)] // one argument per task field keeps call sites flat
    pub fn push_task(
        &mut self,
        op: Opcode,
        inputs: &[BufferId],
        outputs: &[BufferId],
        out_counter: CounterId,
        waits: &[(CounterId, i64)],
        params: Map,
        label: impl Into<String>,
    ) -> TaskId {
        let mut t = Task::new(0, op, inputs.to_vec(), outputs.to_vec(), out_counter);
        t.waits = waits
            .iter()
            .map(|&(counter, threshold)| Wait { counter, threshold })
            .collect();
        t.params = params;
        t.label = label.into();
        self.add_task(t)
    }

    /// Producer/waiter index of the counters.
    pub fn counter_index(&self) -> CounterIndex {
        CounterIndex::new(self)
    }

    /// Distinct producer→consumer edges `(p, t)`: `t` waits on the counter `p` increments.
    /// Self edges are kept. Sorted.
    pub fn dependency_edges(&self) -> Vec<(TaskId, TaskId)> {
        let idx = self.counter_index();
        let mut edges = Vec::new();
        for t in &self.tasks {
            let mut seen: Vec<CounterId> = Vec::with_capacity(t.waits.len());
            for w in &t.waits {
                if seen.contains(&w.counter) {
                    continue;
                }
                seen.push(w.counter);
                edges.extend(idx.producers(w.counter).iter().map(|&p| (p, t.id)));
            }
        }
        edges.sort_unstable();
        edges.dedup();
        edges
    }

    /// Number of distinct dependency edges, counted without materialising them (producer sets of
    /// distinct counters are disjoint, since each task has exactly one `out_counter`).
    pub fn edge_count(&self) -> u64 {
        self.edge_count_with(&self.counter_index())
    }

    /// [`Program::edge_count`] with a prebuilt counter index.
    pub fn edge_count_with(&self, idx: &CounterIndex) -> u64 {
        let mut n = 0u64;
        for t in &self.tasks {
            let mut seen: Vec<CounterId> = Vec::with_capacity(t.waits.len());
            for w in &t.waits {
                if !seen.contains(&w.counter) {
                    seen.push(w.counter);
                    n += idx.n_producers(w.counter) as u64;
                }
            }
        }
        n
    }

    /// Sum of the sizes of every WEIGHT buffer.
    pub fn total_weight_bytes(&self) -> u64 {
        self.buffers
            .iter()
            .filter(|b| b.kind == BufferKind::WEIGHT)
            .map(Buffer::nbytes)
            .fold(0u64, u64::saturating_add)
    }

    /// Whether any task carries an SM assignment.
    pub fn sm_assigned(&self) -> bool {
        self.tasks.iter().any(|t| t.sm.is_some())
    }

    /// One-line summary.
    pub fn summary(&self) -> String {
        format!(
            "{} tasks, {} buffers, {} counters, {:.2} MB weights",
            self.tasks.len(),
            self.buffers.len(),
            self.counters.len(),
            self.total_weight_bytes() as f64 / 1e6
        )
    }
}
