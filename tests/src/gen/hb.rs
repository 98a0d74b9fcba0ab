//! The happens-before relation of a generated program, computed here rather than taken from
//! the validator so the suite checks the validator against an independent reading.

use amk_core::{CounterId, Program, TaskId};

/// Happens-before relation of an acyclic program, as ancestor bitsets (own code: the suite does
/// not reuse the validator's reachability). `before(u, v)` is "u is a strict ancestor of v".
pub struct Hb {
    words: usize,
    bits: Vec<u64>,
    /// Segment of each task (all zero for [`Hb::full`]); see [`Hb::layered`].
    seg: Vec<u32>,
    /// Index of each task inside its segment.
    local: Vec<u32>,
    /// First bitset row of each segment.
    base: Vec<usize>,
}

/// Producers of every counter (dangling `out_counter`s skipped).
pub fn producers_of(p: &Program) -> Vec<Vec<TaskId>> {
    let mut prods = vec![Vec::new(); p.counters.len()];
    for t in &p.tasks {
        if let Some(v) = prods.get_mut(t.out_counter as usize) {
            v.push(t.id);
        }
    }
    prods
}

impl Hb {
    /// Full ancestor bitsets (memory n²/8 bytes: meant for small programs). `None` if the
    /// program has a cycle.
    pub fn full(p: &Program) -> Option<Hb> {
        Hb::layered(p, &vec![0; p.tasks.len()])
    }

    /// Ancestor bitsets inside each segment only. Valid when every task of segment `s` is an
    /// ancestor of every task of every later segment (true of
    /// [`llama_like`](super::llama_like)'s layers: each layer ends with the residual ADD that
    /// every task of the layer feeds and every task of the next layer waits on, transitively).
    /// `None` if a segment has a cycle.
    pub fn layered(p: &Program, seg: &[u32]) -> Option<Hb> {
        let n = p.tasks.len();
        let nseg = seg.iter().copied().max().map_or(0, |m| m as usize + 1);
        let mut count = vec![0usize; nseg];
        let mut local = vec![0u32; n];
        for (t, l) in local.iter_mut().enumerate() {
            let s = *seg.get(t)? as usize;
            *l = count[s] as u32;
            count[s] += 1;
        }
        let words_per: Vec<usize> = count.iter().map(|c| c.div_ceil(64).max(1)).collect();
        let words = words_per.iter().copied().max().unwrap_or(1);
        let mut base = vec![0usize; nseg];
        let mut acc = 0usize;
        for s in 0..nseg {
            base[s] = acc;
            acc += count[s];
        }
        let mut bits = vec![0u64; n * words];
        let prods = producers_of(p);
        // Intra-segment predecessor lists and Kahn order.
        let mut preds: Vec<Vec<TaskId>> = vec![Vec::new(); n];
        let mut succs: Vec<Vec<TaskId>> = vec![Vec::new(); n];
        for t in &p.tasks {
            let mut seen: Vec<CounterId> = Vec::new();
            for w in &t.waits {
                if seen.contains(&w.counter) {
                    continue;
                }
                seen.push(w.counter);
                if let Some(ps) = prods.get(w.counter as usize) {
                    for &q in ps {
                        if seg[q as usize] == seg[t.id as usize] {
                            preds[t.id as usize].push(q);
                            succs[q as usize].push(t.id);
                        }
                    }
                }
            }
        }
        let mut indeg: Vec<usize> = preds.iter().map(Vec::len).collect();
        let mut queue: Vec<TaskId> = (0..n as TaskId)
            .filter(|&t| indeg[t as usize] == 0)
            .collect();
        let mut done = 0usize;
        while let Some(t) = queue.pop() {
            done += 1;
            let ti = t as usize;
            let row = base[seg[ti] as usize] + local[ti] as usize;
            for &q in &preds[ti] {
                let qi = q as usize;
                let qrow = base[seg[qi] as usize] + local[qi] as usize;
                for w in 0..words {
                    let x = bits[qrow * words + w];
                    bits[row * words + w] |= x;
                }
                let l = local[qi] as usize;
                bits[row * words + l / 64] |= 1u64 << (l % 64);
            }
            for &s in &succs[ti] {
                indeg[s as usize] -= 1;
                if indeg[s as usize] == 0 {
                    queue.push(s);
                }
            }
        }
        if done != n {
            return None;
        }
        Some(Hb {
            words,
            bits,
            seg: seg.to_vec(),
            local,
            base,
        })
    }

    /// Whether `u` is a strict ancestor of `v`.
    pub fn before(&self, u: TaskId, v: TaskId) -> bool {
        let (u, v) = (u as usize, v as usize);
        if u >= self.seg.len() || v >= self.seg.len() || u == v {
            return false;
        }
        let (su, sv) = (self.seg[u], self.seg[v]);
        if su != sv {
            return su < sv;
        }
        let row = self.base[sv as usize] + self.local[v] as usize;
        let l = self.local[u] as usize;
        self.bits[row * self.words + l / 64] & (1u64 << (l % 64)) != 0
    }
}

/// Distinct tasks writing each buffer.
pub fn writers_of(p: &Program) -> Vec<Vec<TaskId>> {
    let mut w: Vec<Vec<TaskId>> = vec![Vec::new(); p.buffers.len()];
    for t in &p.tasks {
        for &b in &t.outputs {
            if let Some(v) = w.get_mut(b as usize)
                && v.last() != Some(&t.id)
            {
                v.push(t.id);
            }
        }
    }
    w
}

/// Distinct tasks reading or writing each buffer.
pub fn users_of(p: &Program) -> Vec<Vec<TaskId>> {
    let mut u: Vec<Vec<TaskId>> = vec![Vec::new(); p.buffers.len()];
    for t in &p.tasks {
        for &b in t.inputs.iter().chain(&t.outputs) {
            if let Some(v) = u.get_mut(b as usize)
                && v.last() != Some(&t.id)
            {
                v.push(t.id);
            }
        }
    }
    u
}

/// Every use of `a` happens-before every writer of `b` (the page-sharing condition).
pub fn all_before(hb: &Hb, uses_a: &[TaskId], writers_b: &[TaskId]) -> bool {
    writers_b
        .iter()
        .all(|&w| uses_a.iter().all(|&u| hb.before(u, w)))
}
