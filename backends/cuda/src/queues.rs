//! Per-block task queues. Every queue runs in one global order `T`, a topological order of
//! the dependency edges plus each SM's list order (the validator proved that union acyclic).
//! With every block co-resident (cooperative launch), the earliest unfinished task in `T` has
//! all its producers and all its queue predecessors done, so it can always run: no deadlock,
//! however queues are folded onto fewer blocks.

use amk_core::Program;
use amk_core::graph::{queue_successors, topo_order_with};

/// Queues, flattened: queue q runs `tasks[off[q]..off[q + 1]]` (task indices) in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queues {
    /// Task indices, queue after queue.
    pub tasks: Vec<i32>,
    /// `n_queues + 1` offsets into `tasks`.
    pub off: Vec<i32>,
}

impl Queues {
    /// Number of queues (= blocks launched).
    pub fn len(&self) -> usize {
        self.off.len().saturating_sub(1)
    }
    /// Whether there are no queues.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The tasks of queue `q`.
    pub fn queue(&self, q: usize) -> &[i32] {
        &self.tasks[self.off[q] as usize..self.off[q + 1] as usize]
    }
}

/// Builds the queues: a task with `sm = Some(s)` goes to queue `s` (folded to `s mod
/// max_blocks` when the device holds fewer blocks); unassigned tasks are dealt round-robin in
/// `T` order over the queues — never all to one. There are `min(max_blocks, max(assigned SMs,
/// tasks))` queues, at least one.
pub fn build_queues(p: &Program, max_blocks: usize) -> Result<Queues, String> {
    let idx = p.counter_index();
    let next = queue_successors(p);
    let order = topo_order_with(p, &idx, Some(&next)).ok_or_else(|| {
        "the dependency edges and SM queue orders form a cycle (the program cannot be run)"
            .to_string()
    })?;
    let max_blocks = max_blocks.max(1);
    let max_sm = p.tasks.iter().filter_map(|t| t.sm).max();
    if let Some(s) = p.tasks.iter().filter_map(|t| t.sm).min()
        && s < 0
    {
        return Err(format!("SM index {s} is negative"));
    }
    let wanted = match max_sm {
        Some(s) => (s as usize + 1).max(1),
        None => p.tasks.len().max(1),
    };
    let n_queues = wanted.min(max_blocks);
    let mut per: Vec<Vec<i32>> = vec![Vec::new(); n_queues];
    let mut rr = 0usize;
    for &t in &order {
        let q = match p.tasks[t as usize].sm {
            Some(s) => s as usize % n_queues,
            None => {
                let q = rr % n_queues;
                rr += 1;
                q
            }
        };
        per[q].push(t as i32);
    }
    let mut tasks = Vec::with_capacity(p.tasks.len());
    let mut off = Vec::with_capacity(n_queues + 1);
    off.push(0);
    for q in per {
        tasks.extend(q);
        off.push(tasks.len() as i32);
    }
    Ok(Queues { tasks, off })
}
