//! An **independent dynamic oracle**: a counter-machine simulator that runs a program under
//! many adversarial interleavings and reports what actually goes wrong. It shares no code with
//! the validator (no `amk_core::validate`, no `amk_core::graph`, no `amk_core::sim`): only the
//! IR data types.
//!
//! Machine model. Counters start at `Counter.init` (a dangling counter id reads 0 forever). A
//! task is *enabled* when every wait `(c, thr)` has `value(c) ≥ thr`; firing is atomic (reads,
//! then writes, then `out_counter += 1`). The free model lets any enabled task fire (counters
//! are the IR's only synchronisation: SM placement is a schedule choice a backend may revisit);
//! the SM model additionally runs each SM's tasks one at a time, in task-list order (tasks
//! without an SM fire freely; a task on an SM outside `[0, num_sms)` — or a negative one
//! without a target — never runs).
//!
//! Hazards, each observed at a reachable state of some run:
//! - [`Hazard::Deadlock`]: a maximal free run leaves tasks unfired;
//! - [`Hazard::SmQueueDeadlock`]: the SM model leaves tasks unfired that the free model fires;
//! - [`Hazard::UnorderedRead`]: a task reads a transient buffer (not WEIGHT/CONST/IO_INPUT) while
//!   it is enabled and some *other* writer of that buffer has not completed — it could fire now
//!   and read stale data, or that writer overwrites after the read;
//! - [`Hazard::UninitRead`]: a read of a non-KV transient buffer that no other task writes
//!   (never produced, or only the reader itself writes it); a KV cache without another writer
//!   holds the previous steps' state and is fine;
//! - [`Hazard::ConcurrentWrite`]: two tasks writing overlapping regions of one buffer (GEMV/GEMM
//!   tiles write columns `[n_off, n_off + N_tile)` and, for GEMM, rows
//!   `[m_off, m_off + M_tile)`; any other op writes the whole buffer) enabled at the same time;
//! - [`Hazard::PageClobber`]: a task could touch a paged buffer inside the live interval (first
//!   to last use in that run) of another buffer on the same page — checked whenever the task
//!   becomes enabled, when it fires, and whenever a sharer becomes live while it is enabled;
//! - [`Hazard::OnchipCrossSm`]: an SMEM/REGISTER buffer touched from two different SMs;
//! - [`Hazard::WriteReadonly`]: a firing task writes a WEIGHT/CONST/IO_INPUT buffer (it
//!   corrupts what every later launch reads);
//! - [`Hazard::OutputUnwritten`]: the host reads an IO_OUTPUT buffer no task wrote.
//!
//! Strategies: lowest-id-first, highest-id-first, oldest-enabled-first (breadth-first),
//! newest-enabled-first (depth-first), seeded random picks, and "delay task d as long as
//! possible" (d fires only when nothing else is enabled; otherwise lowest-id or
//! oldest-enabled first, alternately) for every task when the program is small, else for a
//! random sample. Delaying d makes d concurrent with every task not ordered
//! with it, which is what exposes unordered reads and writes.

use crate::r#gen::Rng;
use amk_core::{BufferKind, MemSpace, Opcode, Program, TaskId};
use std::collections::BTreeSet;

/// What the oracle saw go wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hazard {
    /// Some task never fires (free model).
    Deadlock,
    /// Some task never fires once SM queues serialise their tasks in list order.
    SmQueueDeadlock,
    /// A read while another writer of the buffer is still pending.
    UnorderedRead,
    /// A read of data nobody else produced.
    UninitRead,
    /// Two enabled tasks write overlapping regions.
    ConcurrentWrite,
    /// Page sharers' live intervals interleave.
    PageClobber,
    /// An on-chip buffer used from two SMs.
    OnchipCrossSm,
    /// A write to a read-only buffer.
    WriteReadonly,
    /// An IO_OUTPUT buffer left unwritten.
    OutputUnwritten,
}

impl Hazard {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Hazard::Deadlock => "deadlock",
            Hazard::SmQueueDeadlock => "sm_queue_deadlock",
            Hazard::UnorderedRead => "unordered_read",
            Hazard::UninitRead => "uninit_read",
            Hazard::ConcurrentWrite => "concurrent_write",
            Hazard::PageClobber => "page_clobber",
            Hazard::OnchipCrossSm => "onchip_cross_sm",
            Hazard::WriteReadonly => "write_readonly",
            Hazard::OutputUnwritten => "output_unwritten",
        }
    }
}

/// One observation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// What.
    pub hazard: Hazard,
    /// The task concerned (reader, writer, never-fired task), if any.
    pub task: Option<TaskId>,
    /// The other task (pending writer, concurrent writer), if any.
    pub other: Option<TaskId>,
    /// The buffer concerned, if any.
    pub buffer: Option<u32>,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.hazard.name())?;
        if let Some(t) = self.task {
            write!(f, " task {t}")?;
        }
        if let Some(o) = self.other {
            write!(f, " vs task {o}")?;
        }
        if let Some(b) = self.buffer {
            write!(f, " buffer #{b}")?;
        }
        Ok(())
    }
}

/// How hard to look.
#[derive(Debug, Clone)]
pub struct Config {
    /// Seeded random runs.
    pub random_runs: usize,
    /// Delay every task (one run each) when the program has at most this many tasks.
    pub delay_all_up_to: usize,
    /// Otherwise, delay this many randomly chosen tasks.
    pub sampled_delays: usize,
    /// Seed of the random strategies.
    pub seed: u64,
    /// Stop after the first run that finds something.
    pub stop_at_first: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            random_runs: 4,
            delay_all_up_to: 128,
            sampled_delays: 64,
            seed: 1,
            stop_at_first: true,
        }
    }
}

/// The oracle's verdict.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Distinct findings (at most 64 are kept).
    pub findings: Vec<Finding>,
    /// Runs executed.
    pub runs: usize,
}

impl Report {
    /// Whether the program is unsafe.
    pub fn is_unsafe(&self) -> bool {
        !self.findings.is_empty()
    }
    /// Distinct hazards seen.
    pub fn hazards(&self) -> Vec<Hazard> {
        let mut h: Vec<Hazard> = self.findings.iter().map(|f| f.hazard).collect();
        h.sort();
        h.dedup();
        h
    }
    /// One-line summary.
    pub fn summary(&self) -> String {
        if self.findings.is_empty() {
            return format!("safe ({} runs)", self.runs);
        }
        let shown: Vec<String> = self
            .findings
            .iter()
            .take(4)
            .map(|f| f.to_string())
            .collect();
        format!(
            "UNSAFE after {} runs: {}{}",
            self.runs,
            shown.join("; "),
            if self.findings.len() > 4 { "; …" } else { "" }
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Region {
    Whole,
    Tile { c0: i64, c1: i64, r0: i64, r1: i64 },
}

fn overlap(a: Region, b: Region) -> bool {
    match (a, b) {
        (
            Region::Tile { c0, c1, r0, r1 },
            Region::Tile {
                c0: d0,
                c1: d1,
                r0: s0,
                r1: s1,
            },
        ) => c0 < d1 && d0 < c1 && r0 < s1 && s0 < r1,
        _ => true,
    }
}

fn region_of(t: &amk_core::Task) -> Region {
    let gemm = t.op == Opcode::GEMM_TILE;
    if t.op != Opcode::GEMV_TILE && !gemm {
        return Region::Whole;
    }
    let (Some(n_off), Some(nt)) = (t.param_i64("n_off"), t.param_i64("N_tile")) else {
        return Region::Whole;
    };
    if n_off < 0 || nt <= 0 {
        return Region::Whole;
    }
    let (mut r0, mut r1) = (0i64, i64::MAX);
    if gemm && let Some(mt) = t.param_i64("M_tile").filter(|&m| m > 0) {
        r0 = t.param_i64("m_off").unwrap_or(0);
        if r0 < 0 {
            return Region::Whole;
        }
        r1 = r0.saturating_add(mt);
    }
    Region::Tile {
        c0: n_off,
        c1: n_off.saturating_add(nt),
        r0,
        r1,
    }
}

/// Static facts about the program, shared by every run.
struct Model<'a> {
    p: &'a Program,
    n: usize,
    /// Per counter: waits `(threshold, task)` sorted by threshold.
    by_counter: Vec<Vec<(i64, u32)>>,
    /// Per task: waits that can never hold (dangling counter, threshold > 0).
    dead_waits: Vec<u32>,
    /// Per task: distinct transient buffers read.
    reads: Vec<Vec<u32>>,
    /// Per task: distinct buffers written, with the written region.
    writes: Vec<Vec<(u32, Region)>>,
    /// Per task: distinct buffers used.
    uses: Vec<Vec<u32>>,
    /// Per buffer: distinct writer tasks.
    writers_n: Vec<u32>,
    /// Per buffer: distinct user tasks.
    users_n: Vec<u32>,
    /// Per buffer: page groups it belongs to.
    pages_of: Vec<Vec<u32>>,
    /// Per page group: distinct member buffers.
    members: Vec<Vec<u32>>,
    /// Whether each task writes a read-only buffer.
    writes_ro: Vec<Option<u32>>,
}

impl<'a> Model<'a> {
    fn new(p: &'a Program) -> Self {
        let n = p.tasks.len();
        let nb = p.buffers.len();
        let nc = p.counters.len();
        let mut by_counter: Vec<Vec<(i64, u32)>> = vec![Vec::new(); nc];
        let mut dead_waits = vec![0u32; n];
        let mut reads = vec![Vec::new(); n];
        let mut writes = vec![Vec::new(); n];
        let mut uses = vec![Vec::new(); n];
        let mut writers_n = vec![0u32; nb];
        let mut users_n = vec![0u32; nb];
        let mut writes_ro = vec![None; n];
        for (i, t) in p.tasks.iter().enumerate() {
            for w in &t.waits {
                match by_counter.get_mut(w.counter as usize) {
                    Some(list) => list.push((w.threshold, i as u32)),
                    None => {
                        if w.threshold > 0 {
                            dead_waits[i] += 1;
                        }
                    }
                }
            }
            let region = region_of(t);
            for &b in &t.outputs {
                let Some(buf) = p.buffers.get(b as usize) else {
                    continue;
                };
                if writes[i].iter().any(|&(x, _)| x == b) {
                    continue;
                }
                writes[i].push((b, region));
                writers_n[b as usize] += 1;
                if buf.kind.is_read_only() && writes_ro[i].is_none() {
                    writes_ro[i] = Some(b);
                }
            }
            for &b in &t.inputs {
                let Some(buf) = p.buffers.get(b as usize) else {
                    continue;
                };
                if !buf.kind.is_read_only() && !reads[i].contains(&b) {
                    reads[i].push(b);
                }
            }
            for &b in t.inputs.iter().chain(&t.outputs) {
                if (b as usize) < nb && !uses[i].contains(&b) {
                    uses[i].push(b);
                    users_n[b as usize] += 1;
                }
            }
        }
        for list in &mut by_counter {
            list.sort_unstable();
        }
        let mut pages_of: Vec<Vec<u32>> = vec![Vec::new(); nb];
        let mut members: Vec<Vec<u32>> = Vec::new();
        if let Some(pa) = &p.pages {
            members = vec![Vec::new(); pa.pages.len()];
            for &(b, pg) in &pa.buffer_to_page {
                let (Some(m), Some(po)) =
                    (members.get_mut(pg as usize), pages_of.get_mut(b as usize))
                else {
                    continue;
                };
                if !m.contains(&b) {
                    m.push(b);
                }
                if !po.contains(&pg) {
                    po.push(pg);
                }
            }
        }
        Model {
            p,
            n,
            by_counter,
            dead_waits,
            reads,
            writes,
            uses,
            writers_n,
            users_n,
            pages_of,
            members,
            writes_ro,
        }
    }
}

/// Which enabled task a run fires next.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pick {
    /// Lowest task id.
    Lowest,
    /// Highest task id.
    Highest,
    /// Enabled longest ago (breadth-first: independent branches advance in lockstep, so live
    /// ranges overlap as much as possible).
    Fifo,
    /// Enabled most recently (depth-first).
    Lifo,
    /// Uniformly random, seeded.
    Random,
}

#[derive(Debug, Clone, Copy)]
struct Strategy {
    pick: Pick,
    seed: u64,
    /// A task fired only when nothing else is enabled.
    delay: Option<u32>,
}

impl Strategy {
    fn plain(pick: Pick) -> Self {
        Strategy {
            pick,
            seed: 0,
            delay: None,
        }
    }
}

/// Mutable state of one run.
struct Run<'m, 'a> {
    m: &'m Model<'a>,
    value: Vec<i64>,
    cursor: Vec<usize>,
    unmet: Vec<u32>,
    fired: Vec<bool>,
    /// Fired writer tasks per buffer.
    wfired: Vec<u32>,
    /// Fired user tasks per buffer.
    ufired: Vec<u32>,
    /// Enabled, unfired tasks.
    ready: Vec<u32>,
    /// Enabled, unfired writers of each buffer.
    ready_writers: Vec<Vec<u32>>,
    /// When each task became enabled (a sequence number).
    stamp: Vec<u64>,
    clock: u64,
    found: BTreeSet<Finding>,
}

impl<'m, 'a> Run<'m, 'a> {
    fn new(m: &'m Model<'a>) -> Self {
        let p = m.p;
        let nb = p.buffers.len();
        let mut value: Vec<i64> = p.counters.iter().map(|c| c.init).collect();
        value.resize(m.by_counter.len(), 0);
        let mut unmet = m.dead_waits.clone();
        let mut cursor = vec![0usize; m.by_counter.len()];
        for (c, list) in m.by_counter.iter().enumerate() {
            let v = value[c];
            let k = list.partition_point(|&(thr, _)| thr <= v);
            cursor[c] = k;
            for &(_, t) in &list[k..] {
                unmet[t as usize] += 1;
            }
        }
        Run {
            m,
            value,
            cursor,
            unmet,
            fired: vec![false; m.n],
            wfired: vec![0; nb],
            ufired: vec![0; nb],
            ready: Vec::new(),
            ready_writers: vec![Vec::new(); nb],
            stamp: vec![0; m.n],
            clock: 0,
            found: BTreeSet::new(),
        }
    }

    fn note(&mut self, hazard: Hazard, task: Option<u32>, other: Option<u32>, buffer: Option<u32>) {
        if self.found.len() < 64 {
            self.found.insert(Finding {
                hazard,
                task,
                other,
                buffer,
            });
        }
    }

    /// Would firing `t` now touch a paged buffer inside another sharer's live interval?
    fn check_pages(&mut self, t: u32) {
        let m = self.m;
        let ti = t as usize;
        for &x in &m.uses[ti] {
            for &pg in &m.pages_of[x as usize] {
                for &c in &m.members[pg as usize] {
                    if c == x {
                        continue;
                    }
                    let t_uses_c = m.uses[ti].contains(&c);
                    let ci = c as usize;
                    let live = self.ufired[ci] > 0 && self.ufired[ci] < m.users_n[ci];
                    if t_uses_c || live {
                        self.note(Hazard::PageClobber, Some(t), None, Some(x.min(c)));
                    }
                }
            }
        }
    }

    /// `t` just became enabled.
    fn enable(&mut self, t: u32) {
        let m = self.m;
        let ti = t as usize;
        for &b in &m.reads[ti] {
            let bi = b as usize;
            let own = u32::from(m.writes[ti].iter().any(|&(x, _)| x == b));
            let others = m.writers_n[bi] - own;
            let is_kv =
                m.p.buffers
                    .get(bi)
                    .is_some_and(|x| x.kind == BufferKind::KV_CACHE);
            if others == 0 {
                if !is_kv {
                    self.note(Hazard::UninitRead, Some(t), None, Some(b));
                }
            } else if self.wfired[bi] < others {
                self.note(Hazard::UnorderedRead, Some(t), None, Some(b));
            }
        }
        for &(b, r) in &m.writes[ti] {
            let bi = b as usize;
            let mut clash = None;
            for &u in &self.ready_writers[bi] {
                let ru = m.writes[u as usize]
                    .iter()
                    .find(|&&(x, _)| x == b)
                    .map_or(Region::Whole, |&(_, r)| r);
                if overlap(r, ru) {
                    clash = Some(u);
                    break;
                }
            }
            if let Some(u) = clash {
                self.note(Hazard::ConcurrentWrite, Some(t), Some(u), Some(b));
            }
            self.ready_writers[bi].push(t);
        }
        self.check_pages(t);
        self.clock += 1;
        self.stamp[ti] = self.clock;
        self.ready.push(t);
    }

    fn fire(&mut self, t: u32, newly: &mut Vec<u32>) {
        let m = self.m;
        let ti = t as usize;
        self.check_pages(t);
        if let Some(b) = m.writes_ro[ti] {
            self.note(Hazard::WriteReadonly, Some(t), None, Some(b));
        }
        self.fired[ti] = true;
        for &(b, _) in &m.writes[ti] {
            let bi = b as usize;
            self.wfired[bi] += 1;
            if let Some(k) = self.ready_writers[bi].iter().position(|&u| u == t) {
                self.ready_writers[bi].swap_remove(k);
            }
        }
        for &b in &m.uses[ti] {
            self.ufired[b as usize] += 1;
        }
        // A paged buffer that is live now: every enabled task touching a page sharer could
        // fire inside its interval.
        for &c in &m.uses[ti] {
            let ci = c as usize;
            if m.pages_of[ci].is_empty() || self.ufired[ci] >= m.users_n[ci] {
                continue;
            }
            let mut hit = None;
            'ready: for &u in &self.ready {
                for &x in &m.uses[u as usize] {
                    if x != c
                        && m.pages_of[x as usize]
                            .iter()
                            .any(|pg| m.pages_of[ci].contains(pg))
                    {
                        hit = Some((u, x));
                        break 'ready;
                    }
                }
            }
            if let Some((u, x)) = hit {
                self.note(Hazard::PageClobber, Some(u), Some(t), Some(x.min(c)));
            }
        }
        let c = m.p.tasks[ti].out_counter as usize;
        if c < self.value.len() {
            self.value[c] += 1;
            let v = self.value[c];
            let list = &m.by_counter[c];
            while self.cursor[c] < list.len() && list[self.cursor[c]].0 <= v {
                let u = list[self.cursor[c]].1 as usize;
                self.unmet[u] -= 1;
                if self.unmet[u] == 0 && !self.fired[u] {
                    newly.push(u as u32);
                }
                self.cursor[c] += 1;
            }
        }
    }

    fn pick(&self, s: Strategy, rng: &mut Rng) -> Option<usize> {
        let n = self.ready.len();
        if n == 0 {
            return None;
        }
        // The delayed task is eligible only when it is the sole enabled one.
        let delayed = |t: u32| n > 1 && Some(t) == s.delay;
        if s.pick == Pick::Random {
            let eligible =
                n - usize::from(s.delay.is_some_and(|d| n > 1 && self.ready.contains(&d)));
            let mut k = rng.index(eligible);
            for (i, &t) in self.ready.iter().enumerate() {
                if delayed(t) {
                    continue;
                }
                if k == 0 {
                    return Some(i);
                }
                k -= 1;
            }
            return None;
        }
        let key = |t: u32| -> u64 {
            match s.pick {
                Pick::Lowest => u64::from(t),
                Pick::Highest => u64::MAX - u64::from(t),
                Pick::Fifo => self.stamp[t as usize],
                Pick::Lifo | Pick::Random => u64::MAX - self.stamp[t as usize],
            }
        };
        let mut best: Option<(usize, u64)> = None;
        for (i, &t) in self.ready.iter().enumerate() {
            if delayed(t) {
                continue;
            }
            let k = key(t);
            if best.is_none_or(|(_, b)| k < b) {
                best = Some((i, k));
            }
        }
        best.map(|(i, _)| i)
    }

    /// One maximal run of the free model.
    fn go(&mut self, s: Strategy, check_end: bool) {
        let mut rng = Rng::new(s.seed);
        let mut newly = Vec::new();
        let initial: Vec<u32> = (0..self.m.n as u32)
            .filter(|&t| self.unmet[t as usize] == 0)
            .collect();
        for t in initial {
            self.enable(t);
        }
        while let Some(i) = self.pick(s, &mut rng) {
            let t = self.ready.swap_remove(i);
            newly.clear();
            self.fire(t, &mut newly);
            for &u in &newly {
                self.enable(u);
            }
        }
        if check_end {
            let mut unfired = 0;
            for t in 0..self.m.n {
                if !self.fired[t] {
                    unfired += 1;
                    if unfired <= 4 {
                        self.note(Hazard::Deadlock, Some(t as u32), None, None);
                    }
                }
            }
            let p = self.m.p;
            for (b, buf) in p.buffers.iter().enumerate() {
                if buf.kind == BufferKind::IO_OUTPUT && self.m.writers_n[b] == 0 {
                    self.note(Hazard::OutputUnwritten, None, None, Some(b as u32));
                }
            }
        }
    }
}

/// On-chip buffers used from two SMs (placement is static, so one pass decides it).
fn onchip(p: &Program, found: &mut BTreeSet<Finding>) {
    let mut seen: Vec<Option<(i32, u32)>> = vec![None; p.buffers.len()];
    for t in &p.tasks {
        let Some(s) = t.sm else { continue };
        for &b in t.inputs.iter().chain(&t.outputs) {
            let Some(buf) = p.buffers.get(b as usize) else {
                continue;
            };
            if !matches!(buf.space, MemSpace::SMEM | MemSpace::REGISTER) {
                continue;
            }
            match seen[b as usize] {
                None => seen[b as usize] = Some((s, t.id)),
                Some((s0, t0)) if s0 != s => {
                    found.insert(Finding {
                        hazard: Hazard::OnchipCrossSm,
                        task: Some(t.id),
                        other: Some(t0),
                        buffer: Some(b),
                    });
                }
                _ => {}
            }
        }
    }
}

/// The SM model: each SM runs its tasks one by one in task-list order. Returns the tasks that
/// never fire.
fn sm_model(m: &Model<'_>) -> Vec<u32> {
    sm_model_run(m).0
}

/// Runs the SM model; returns the tasks that never fire and, for each task, what blocks it when
/// stuck: the head of its SM queue, or an unfired producer of a wait that does not hold.
fn sm_model_run(m: &Model<'_>) -> (Vec<u32>, Vec<Option<u32>>) {
    let p = m.p;
    let num_sms = p.target.as_ref().map(|t| t.num_sms);
    // Queue index per task: None = free, Some(usize::MAX) = never runs.
    let mut queues: Vec<(i32, Vec<u32>)> = Vec::new();
    let mut qof: Vec<Option<usize>> = vec![None; m.n];
    for (i, t) in p.tasks.iter().enumerate() {
        let Some(s) = t.sm else { continue };
        let valid = s >= 0 && num_sms.is_none_or(|n| (s as i64) < n);
        if !valid {
            qof[i] = Some(usize::MAX);
            continue;
        }
        let q = match queues.iter().position(|(x, _)| *x == s) {
            Some(q) => q,
            None => {
                queues.push((s, Vec::new()));
                queues.len() - 1
            }
        };
        queues[q].1.push(i as u32);
        qof[i] = Some(q);
    }
    let mut head = vec![0usize; queues.len()];
    let mut run = Run::new(m);
    let mut enabled = vec![false; m.n];
    let mut work: Vec<u32> = Vec::new();
    let fireable = |t: u32, enabled: &[bool], head: &[usize]| -> bool {
        let ti = t as usize;
        if !enabled[ti] {
            return false;
        }
        match qof[ti] {
            None => true,
            Some(usize::MAX) => false,
            Some(q) => queues[q].1.get(head[q]) == Some(&t),
        }
    };
    for t in 0..m.n as u32 {
        if run.unmet[t as usize] == 0 {
            enabled[t as usize] = true;
            if fireable(t, &enabled, &head) {
                work.push(t);
            }
        }
    }
    let mut newly = Vec::new();
    while let Some(t) = work.pop() {
        if run.fired[t as usize] {
            continue;
        }
        newly.clear();
        run.fire(t, &mut newly);
        for &u in &newly {
            enabled[u as usize] = true;
            if fireable(u, &enabled, &head) {
                work.push(u);
            }
        }
        if let Some(q) = qof[t as usize].filter(|&q| q != usize::MAX) {
            head[q] += 1;
            if let Some(&nx) = queues[q].1.get(head[q])
                && fireable(nx, &enabled, &head)
            {
                work.push(nx);
            }
        }
    }
    let stuck: Vec<u32> = (0..m.n as u32)
        .filter(|&t| !run.fired[t as usize])
        .collect();
    let mut blocker = vec![None; m.n];
    for &t in &stuck {
        let ti = t as usize;
        if let Some(q) = qof[ti].filter(|&q| q != usize::MAX)
            && let Some(&h) = queues[q].1.get(head[q])
            && h != t
        {
            blocker[ti] = Some(h);
            continue;
        }
        let task = &p.tasks[ti];
        'waits: for w in &task.waits {
            let c = w.counter as usize;
            if run.value.get(c).is_some_and(|&v| v >= w.threshold) {
                continue;
            }
            for (u, other) in p.tasks.iter().enumerate() {
                if other.out_counter as usize == c && !run.fired[u] {
                    blocker[ti] = Some(u as u32);
                    break 'waits;
                }
            }
        }
    }
    (stuck, blocker)
}

/// A witness of an SM-queue deadlock: a cycle `[a, b, …, a]` where each task is blocked by the
/// next (the head of its SM queue, or an unfired producer it waits on) once the SM model is
/// stuck. `None` if the SM model fires every task (or the stuck tasks form no such cycle).
pub fn sm_deadlock_witness(p: &Program) -> Option<Vec<TaskId>> {
    let m = Model::new(p);
    let (stuck, blocker) = sm_model_run(&m);
    let start = *stuck.first()?;
    let mut path = vec![start];
    let mut cur = start;
    loop {
        let next = blocker[cur as usize]?;
        if let Some(i) = path.iter().position(|&x| x == next) {
            let mut cyc = path[i..].to_vec();
            cyc.push(next);
            return Some(cyc);
        }
        path.push(next);
        cur = next;
    }
}

/// Explores `p` and reports every hazard seen.
pub fn explore(p: &Program, cfg: &Config) -> Report {
    let m = Model::new(p);
    let mut found: BTreeSet<Finding> = BTreeSet::new();
    let mut runs = 0usize;
    onchip(p, &mut found);
    // Free model, deterministic strategies first (the first one also checks deadlock/outputs).
    let mut strategies: Vec<Strategy> = [Pick::Lowest, Pick::Highest, Pick::Fifo, Pick::Lifo]
        .into_iter()
        .map(Strategy::plain)
        .collect();
    let mut rng = Rng::new(cfg.seed);
    for _ in 0..cfg.random_runs {
        strategies.push(Strategy {
            pick: Pick::Random,
            seed: rng.next_u64(),
            delay: None,
        });
    }
    let mut delayed: Vec<u32> = (0..m.n as u32).collect();
    if m.n > cfg.delay_all_up_to {
        rng.shuffle(&mut delayed);
        delayed.truncate(cfg.sampled_delays);
    }
    for &d in &delayed {
        strategies.push(Strategy {
            pick: if d % 2 == 0 { Pick::Lowest } else { Pick::Fifo },
            seed: 0,
            delay: Some(d),
        });
    }
    let mut free_unfired = 0usize;
    for (i, &s) in strategies.iter().enumerate() {
        if cfg.stop_at_first && !found.is_empty() {
            break;
        }
        let mut run = Run::new(&m);
        run.go(s, i == 0);
        if i == 0 {
            free_unfired = run.fired.iter().filter(|&&f| !f).count();
        }
        runs += 1;
        found.append(&mut run.found);
    }
    // SM model: only meaningful if the free model completes.
    let keep_going = !cfg.stop_at_first || found.is_empty();
    if keep_going && free_unfired == 0 && p.tasks.iter().any(|t| t.sm.is_some()) {
        runs += 1;
        for t in sm_model(&m).into_iter().take(4) {
            found.insert(Finding {
                hazard: Hazard::SmQueueDeadlock,
                task: Some(t),
                other: None,
                buffer: None,
            });
        }
    }
    let mut findings: Vec<Finding> = found.into_iter().collect();
    findings.truncate(64);
    Report { findings, runs }
}
