//! Counter bookkeeping and firing orders.
//!
//! [`WaitTable`] is built once per session: every counter's waits sorted by threshold, so an
//! increment touches only the waits it satisfies (a pass costs O(tasks + waits) plus the
//! ready-set operations). [`Counters`] is one pass's state. [`Picker`] decides which ready task
//! fires next: list-order sweeps, or a seeded random choice.

use amk_core::Program;
use amk_core::sim::SplitMix;
use std::collections::BTreeSet;

/// Every counter's waits, sorted by threshold, plus the per-pass starting state.
#[derive(Debug, Clone)]
pub(crate) struct WaitTable {
    /// `by_counter[c]`: `(threshold, task position)` of every wait on `c`, ascending.
    by_counter: Vec<Vec<(i64, u32)>>,
    /// Waits already satisfied at counter value 0, per counter (a prefix of `by_counter[c]`).
    init_cursor: Vec<usize>,
    /// Unsatisfied waits per task at the start of a pass (a wait on a counter that does not
    /// exist never holds).
    init_unmet: Vec<u32>,
}

impl WaitTable {
    /// Builds the table; tasks and counters are identified by position.
    pub(crate) fn new(p: &Program) -> Self {
        let n = p.counters.len();
        let mut by_counter: Vec<Vec<(i64, u32)>> = vec![Vec::new(); n];
        let mut init_unmet = vec![0u32; p.tasks.len()];
        for (i, t) in p.tasks.iter().enumerate() {
            for w in &t.waits {
                match by_counter.get_mut(w.counter as usize) {
                    Some(list) => list.push((w.threshold, i as u32)),
                    None => init_unmet[i] = init_unmet[i].saturating_add(1),
                }
            }
        }
        let mut init_cursor = vec![0usize; n];
        for (list, cur) in by_counter.iter_mut().zip(init_cursor.iter_mut()) {
            list.sort_unstable();
            *cur = list.partition_point(|&(thr, _)| thr <= 0);
            for &(_, t) in &list[*cur..] {
                init_unmet[t as usize] = init_unmet[t as usize].saturating_add(1);
            }
        }
        WaitTable {
            by_counter,
            init_cursor,
            init_unmet,
        }
    }

    /// Counters at zero; returns the state and the tasks ready at once, ascending.
    pub(crate) fn start(&self) -> (Counters, Vec<u32>) {
        let ready = self
            .init_unmet
            .iter()
            .enumerate()
            .filter(|&(_, &u)| u == 0)
            .map(|(i, _)| i as u32)
            .collect();
        (
            Counters {
                value: vec![0; self.by_counter.len()],
                cursor: self.init_cursor.clone(),
                unmet: self.init_unmet.clone(),
            },
            ready,
        )
    }
}

/// One pass's counter values and unsatisfied-wait counts.
#[derive(Debug)]
pub(crate) struct Counters {
    value: Vec<i64>,
    cursor: Vec<usize>,
    unmet: Vec<u32>,
}

impl Counters {
    /// Increments counter `c` (a dangling id is ignored); pushes the tasks that just became
    /// ready onto `out`.
    pub(crate) fn bump(&mut self, table: &WaitTable, c: u32, out: &mut Vec<u32>) {
        let c = c as usize;
        let (Some(v), Some(list), Some(cur)) = (
            self.value.get_mut(c),
            table.by_counter.get(c),
            self.cursor.get_mut(c),
        ) else {
            return;
        };
        *v = v.saturating_add(1);
        while let Some(&(thr, t)) = list.get(*cur) {
            if thr > *v {
                break;
            }
            if let Some(u) = self.unmet.get_mut(t as usize) {
                *u = u.saturating_sub(1);
                if *u == 0 {
                    out.push(t);
                }
            }
            *cur += 1;
        }
    }
}

/// Which ready task fires next.
pub(crate) enum Picker {
    /// Sweeps over the task list: every ready task at or after the cursor fires in list order;
    /// a task that becomes ready behind the cursor waits for the next sweep.
    List {
        now: BTreeSet<u32>,
        next: BTreeSet<u32>,
        cursor: u32,
    },
    /// A uniformly random ready task.
    Random { ready: Vec<u32>, rng: SplitMix },
}

impl Picker {
    /// List-order sweeps starting with `ready`.
    pub(crate) fn list(ready: Vec<u32>) -> Self {
        Picker::List {
            now: ready.into_iter().collect(),
            next: BTreeSet::new(),
            cursor: 0,
        }
    }

    /// Seeded random order starting with `ready`.
    pub(crate) fn random(ready: Vec<u32>, rng: SplitMix) -> Self {
        Picker::Random { ready, rng }
    }

    /// The next task to fire, removed from the ready set; `None` when nothing is ready.
    pub(crate) fn pick(&mut self) -> Option<u32> {
        match self {
            Picker::List { now, next, cursor } => loop {
                if let Some(&t) = now.range(*cursor..).next() {
                    now.remove(&t);
                    *cursor = t.saturating_add(1);
                    return Some(t);
                }
                // The sweep is over: start the next one.
                now.append(next);
                if now.is_empty() {
                    return None;
                }
                *cursor = 0;
            },
            Picker::Random { ready, rng } => {
                if ready.is_empty() {
                    return None;
                }
                let k = (rng.next() % ready.len() as u64) as usize;
                Some(ready.swap_remove(k))
            }
        }
    }

    /// Adds a task that just became ready.
    pub(crate) fn push(&mut self, t: u32) {
        match self {
            Picker::List { now, next, cursor } => {
                if t >= *cursor {
                    now.insert(t);
                } else {
                    next.insert(t);
                }
            }
            Picker::Random { ready, .. } => ready.push(t),
        }
    }

    /// Removes every ready task that satisfies `keep` and appends it to `out` (in a
    /// deterministic order: ascending for list order, ready-set order for random order).
    pub(crate) fn take_matching(&mut self, keep: impl Fn(u32) -> bool, out: &mut Vec<u32>) {
        match self {
            Picker::List { now, next, .. } => {
                for set in [now, next] {
                    let start = out.len();
                    out.extend(set.iter().copied().filter(|&t| keep(t)));
                    for t in &out[start..] {
                        set.remove(t);
                    }
                }
            }
            Picker::Random { ready, .. } => {
                ready.retain(|&t| {
                    if keep(t) {
                        out.push(t);
                        false
                    } else {
                        true
                    }
                });
            }
        }
    }
}
