//! Dynamic cross-checks of the static proofs: a counter-driven firing simulation.

use crate::ir::{BufferKind, CounterId, Program, TaskId};
use std::collections::{BTreeSet, HashMap};

/// Result of [`Program::simulate_counters`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSimulation {
    /// Firing order (sweeps over the task list, firing every task whose waits hold).
    pub order: Vec<TaskId>,
    /// Tasks that can never fire.
    pub stuck: Vec<TaskId>,
}

/// One read of a transient buffer before any fired task wrote it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// The reader.
    pub task: TaskId,
    /// The buffer.
    pub buffer: u32,
    /// The seed whose firing order exposed it.
    pub seed: u64,
}

/// Per-counter wait lists sorted by threshold, so each increment touches only the waits it
/// satisfies: the whole simulation is O((tasks + waits) · log tasks).
struct Waits {
    by_counter: HashMap<CounterId, Vec<(i64, TaskId)>>,
    cursor: HashMap<CounterId, usize>,
    value: HashMap<CounterId, i64>,
    unmet: Vec<usize>,
}

impl Waits {
    fn new(p: &Program) -> (Self, Vec<TaskId>) {
        let mut by_counter: HashMap<CounterId, Vec<(i64, TaskId)>> = HashMap::new();
        let mut value = HashMap::new();
        // Tasks and counters are identified by position (a loaded program's ids equal them).
        for (i, c) in p.counters.iter().enumerate() {
            value.insert(i as CounterId, c.init);
        }
        let mut unmet = vec![0usize; p.tasks.len()];
        for (i, t) in p.tasks.iter().enumerate() {
            for w in &t.waits {
                by_counter
                    .entry(w.counter)
                    .or_default()
                    .push((w.threshold, i as TaskId));
            }
        }
        let mut cursor = HashMap::new();
        let mut ready = Vec::new();
        for (c, list) in by_counter.iter_mut() {
            list.sort_unstable();
            let v = value.get(c).copied().unwrap_or(0);
            let k = list.partition_point(|&(thr, _)| thr <= v);
            for &(_, t) in &list[k..] {
                unmet[t as usize] += 1;
            }
            cursor.insert(*c, k);
        }
        for (i, &u) in unmet.iter().enumerate() {
            if u == 0 {
                ready.push(i as TaskId);
            }
        }
        (
            Waits {
                by_counter,
                cursor,
                value,
                unmet,
            },
            ready,
        )
    }

    /// Increments `c`; returns tasks that just became ready.
    fn bump(&mut self, c: CounterId, out: &mut Vec<TaskId>) {
        let v = self.value.entry(c).or_insert(0);
        *v = v.saturating_add(1);
        let v = *v;
        let Some(list) = self.by_counter.get(&c) else {
            return;
        };
        let cur = self.cursor.entry(c).or_insert(0);
        while *cur < list.len() && list[*cur].0 <= v {
            let t = list[*cur].1 as usize;
            self.unmet[t] -= 1;
            if self.unmet[t] == 0 {
                out.push(t as TaskId);
            }
            *cur += 1;
        }
    }
}

impl Program {
    /// Static reachability: repeated sweeps in list order fire every task whose waits hold
    /// (counters start at `init`); returns the firing order and the tasks that never fire.
    pub fn simulate_counters(&self) -> CounterSimulation {
        let (mut w, ready) = Waits::new(self);
        // Tasks ready for the current sweep (ids ≥ cursor) and for the next one.
        let mut now: BTreeSet<TaskId> = ready.into_iter().collect();
        let mut next: BTreeSet<TaskId> = BTreeSet::new();
        let mut fired = vec![false; self.tasks.len()];
        let mut order = Vec::with_capacity(self.tasks.len());
        let mut newly = Vec::new();
        loop {
            let mut cursor: TaskId = 0;
            while let Some(&t) = now.range(cursor..).next() {
                now.remove(&t);
                cursor = t + 1;
                fired[t as usize] = true;
                order.push(t);
                newly.clear();
                w.bump(self.tasks[t as usize].out_counter, &mut newly);
                for &n in &newly {
                    if n >= cursor {
                        now.insert(n);
                    } else {
                        next.insert(n);
                    }
                }
            }
            now.append(&mut next);
            if now.is_empty() {
                break;
            }
        }
        let stuck = (0..self.tasks.len() as TaskId)
            .filter(|&t| !fired[t as usize])
            .collect();
        CounterSimulation { order, stuck }
    }

    /// Fires ready tasks in seeded random orders and reports every read of a transient
    /// (non-read-only) buffer that no already-fired task has written. A KV cache no task
    /// writes holds the previous steps' state, and a task reading a KV cache it appends to
    /// reads that state; neither is reported. Stops after the first seed that finds something.
    pub fn simulate_adversarial(&self, seeds: u64) -> Vec<Violation> {
        let mut writers = vec![0usize; self.buffers.len()];
        for t in &self.tasks {
            for &b in &t.outputs {
                if let Some(n) = writers.get_mut(b as usize) {
                    *n += 1;
                }
            }
        }
        for seed in 0..seeds {
            let mut rng = SplitMix(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5A5);
            let (mut w, mut ready) = Waits::new(self);
            let mut written = vec![false; self.buffers.len()];
            let mut found = BTreeSet::new();
            let mut newly = Vec::new();
            while !ready.is_empty() {
                let k = (rng.next() % ready.len() as u64) as usize;
                let t = ready.swap_remove(k);
                let task = &self.tasks[t as usize];
                for &b in &task.inputs {
                    let Some(buf) = self.buffers.get(b as usize) else {
                        continue;
                    };
                    // STATE: a read before its writer is the previous pass's value.
                    if buf.kind.is_read_only()
                        || buf.kind == BufferKind::STATE
                        || written[b as usize]
                    {
                        continue;
                    }
                    if buf.kind == BufferKind::KV_CACHE
                        && (writers[b as usize] == 0 || task.outputs.contains(&b))
                    {
                        continue;
                    }
                    found.insert(Violation {
                        task: t,
                        buffer: b,
                        seed,
                    });
                }
                for &b in &task.outputs {
                    if let Some(x) = written.get_mut(b as usize) {
                        *x = true;
                    }
                }
                newly.clear();
                w.bump(task.out_counter, &mut newly);
                ready.extend_from_slice(&newly);
            }
            if !found.is_empty() {
                return found.into_iter().collect();
            }
        }
        Vec::new()
    }
}

/// A tiny deterministic generator (SplitMix64), so simulations are reproducible by seed.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// Next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
