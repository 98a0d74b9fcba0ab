//! Seeded generators of **valid** programs, built only through the core API
//! (`Program::new_buffer` / `new_weight` / `new_counter` / `push_task`) with real op shapes and
//! params, so every program passes each op's shape rule.
//!
//! Families ([`Family`]): linear chains, fan-in joins (several producers on one counter, the
//! consumer waits for all of them), tiled GEMV/GEMM groups (disjoint column — and row — tiles of
//! one buffer sharing one counter), KV_APPEND → ATTENTION_TILE, split-KV shards +
//! ATTENTION_COMBINE, SM-assigned programs (each SM queue, in task-list order, is a linear
//! extension of the DAG), paged programs (ACTIVATION buffers share a page only when their live
//! ranges are happens-before separated) and random mixtures of all of these.
//!
//! [`llama_like`] / [`llama_like_with`] build a decode program shaped like the reference
//! lowering (docs/models.md, "The reference lowering"), optionally with round-robin SM
//! assignment and graph-colour page sharing; [`preset_3k`] and [`preset_20k`] are the
//! benchmark sizes.
//!
//! Every generator emits tasks in a topological order (a consumer is pushed after all its
//! producers); SM assignment relies on it.

use amk_core::json::{Map, Value};
use amk_core::sim::SplitMix;
use amk_core::{
    BufferId, BufferKind, CounterId, DType, GpuTarget, MemSpace, Opcode, Page, Program, TaskId,
};

// ---- randomness ------------------------------------------------------------------------------

/// A small deterministic random source (SplitMix64 from `amk_core::sim`) with the helpers the
/// generators need. Equal seeds give equal programs on every platform.
pub struct Rng(SplitMix);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut r = Rng(SplitMix(seed ^ 0x0A3C_5EED_F00D_1234));
        r.next_u64();
        r
    }
    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next()
    }
    /// Uniform in `[0, n)` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
    /// Uniform index in `[0, n)` (0 when `n == 0`).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    /// Uniform in `[lo, hi]` (inclusive; `lo` when `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below(hi - lo + 1)
        }
    }
    /// True with probability `pct`/100.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    /// A random element.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> Option<&'a T> {
        if xs.is_empty() {
            None
        } else {
            xs.get(self.index(xs.len()))
        }
    }
    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.index(i + 1);
            xs.swap(i, j);
        }
    }
    /// An independent generator derived from this one.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

/// Mixes several numbers into one seed (order-sensitive).
pub fn seed_of(parts: &[u64]) -> u64 {
    let mut s = SplitMix(0x1234_5678_9ABC_DEF0);
    let mut acc = 0u64;
    for &p in parts {
        s.0 ^= p.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        acc = acc.rotate_left(17) ^ s.next();
    }
    acc
}

/// Builds a param object from `(key, value)` pairs.
pub fn params(kv: &[(&str, Value)]) -> Map {
    let mut m = Map::new();
    for (k, v) in kv {
        m.insert(*k, v.clone());
    }
    m
}

fn int(v: u64) -> Value {
    Value::Int(v as i64)
}

// ---- happens-before ----------------------------------------------------------------------------

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
    /// ancestor of every task of every later segment (true of [`llama_like`]'s layers: each
    /// layer ends with the residual ADD that every task of the layer feeds and every task of the
    /// next layer waits on, transitively). `None` if a segment has a cycle.
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

// ---- post-passes: SM assignment, on-chip buffers, pages ------------------------------------------

/// How [`assign_sms`] places tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmStrategy {
    /// Task `i` of the (topological) task list → SM `(i + offset) % num_sms`.
    RoundRobin,
    /// Uniformly random SMs.
    Random,
    /// Random SMs among the first few (queues hold many tasks each).
    Few(i32),
}

/// Sets `target` to the H100 record and gives every task an SM. The task list must be in a
/// topological order (all generators here emit one), so each SM's queue is a linear extension.
pub fn assign_sms(p: &mut Program, strategy: SmStrategy, rng: &mut Rng) {
    let target = GpuTarget::by_name("h100");
    let num_sms = target.as_ref().map_or(132, |t| t.num_sms.max(1)) as u64;
    p.target = target;
    p.meta.insert("gpu", Value::from("h100"));
    let offset = rng.below(num_sms);
    for (i, t) in p.tasks.iter_mut().enumerate() {
        let s = match strategy {
            SmStrategy::RoundRobin => (i as u64 + offset) % num_sms,
            SmStrategy::Random => rng.below(num_sms),
            SmStrategy::Few(k) => rng.below((k.max(1) as u64).min(num_sms)),
        };
        t.sm = Some(s as i32);
    }
}

/// Moves up to `max` ACTIVATION buffers (not paged) on chip (SMEM or REGISTER) and places all
/// their users on one SM. Requires every task to carry an SM already.
pub fn pin_onchip(p: &mut Program, max: usize, rng: &mut Rng) {
    let users = users_of(p);
    let paged: Vec<BufferId> = p
        .pages
        .as_ref()
        .map(|pa| pa.buffer_to_page.iter().map(|&(b, _)| b).collect())
        .unwrap_or_default();
    let mut pinned: Vec<Option<i32>> = vec![None; p.tasks.len()];
    let mut cands: Vec<BufferId> = p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::ACTIVATION && !paged.contains(&b.id))
        .map(|b| b.id)
        .filter(|&b| users[b as usize].len() >= 2)
        .collect();
    rng.shuffle(&mut cands);
    let mut done = 0;
    for b in cands {
        if done >= max {
            break;
        }
        let us = &users[b as usize];
        let Some(&first) = us.first() else { continue };
        let target_sm = pinned[first as usize]
            .or(p.tasks[first as usize].sm)
            .unwrap_or(0);
        if us
            .iter()
            .any(|&u| pinned[u as usize].is_some_and(|s| s != target_sm))
        {
            continue;
        }
        for &u in us {
            pinned[u as usize] = Some(target_sm);
            p.tasks[u as usize].sm = Some(target_sm);
        }
        p.buffers[b as usize].space = if rng.chance(70) {
            MemSpace::SMEM
        } else {
            MemSpace::REGISTER
        };
        done += 1;
    }
}

/// Graph-colour page sharing: walks the ACTIVATION buffers that have writers (a `share_pct`
/// percent subset of them) in order of their first writer and puts each on the first page whose
/// most recent member's uses all happen-before its writers (transitively, then, every earlier
/// member's); otherwise opens a new page. Pages are at least as large as each member.
pub fn colour_pages(p: &mut Program, hb: &Hb, share_pct: u64, rng: &mut Rng) {
    let writers = writers_of(p);
    let users = users_of(p);
    let mut bufs: Vec<(TaskId, BufferId)> = p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::ACTIVATION)
        .filter_map(|b| writers[b.id as usize].first().map(|&w| (w, b.id)))
        .collect();
    bufs.sort_unstable();
    let mut pa = p.pages.take().unwrap_or_default();
    // Per page: members in chain order.
    let mut members: Vec<Vec<BufferId>> = vec![Vec::new(); pa.pages.len()];
    for &(b, pg) in &pa.buffer_to_page {
        if let Some(m) = members.get_mut(pg as usize) {
            m.push(b);
        }
    }
    let space = if rng.chance(50) {
        MemSpace::GLOBAL_SCRATCH
    } else {
        MemSpace::HBM
    };
    for (_, b) in bufs {
        if !rng.chance(share_pct) {
            continue;
        }
        let need = p.buffers[b as usize].nbytes();
        let mut chosen = None;
        for (pg, m) in members.iter().enumerate() {
            let Some(&last) = m.last() else { continue };
            if all_before(hb, &users[last as usize], &writers[b as usize]) {
                chosen = Some(pg);
                break;
            }
        }
        let pg = match chosen {
            Some(pg) => pg,
            None => {
                let id = pa.pages.len();
                pa.pages.push(Page {
                    id: id as u32,
                    space,
                    nbytes: 0,
                    live_start: -1,
                    live_end: -1,
                });
                members.push(Vec::new());
                id
            }
        };
        members[pg].push(b);
        let page = &mut pa.pages[pg];
        page.nbytes = page.nbytes.max(need + rng.below(3) * 64);
        let (lo, hi) = users[b as usize]
            .iter()
            .fold((i64::MAX, -1i64), |(lo, hi), &u| {
                (lo.min(u as i64), hi.max(u as i64))
            });
        page.live_start = if page.live_start < 0 {
            lo
        } else {
            page.live_start.min(lo)
        };
        page.live_end = page.live_end.max(hi);
        pa.buffer_to_page.push((b, pg as u32));
    }
    p.pages = Some(pa);
}

// ---- the motif builder -------------------------------------------------------------------------

/// A value flowing between motifs: a buffer plus the waits a reader needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Val {
    /// The buffer.
    pub buf: BufferId,
    /// `(counter, threshold)` waits that make it readable (empty for inputs).
    pub ready: Vec<(CounterId, i64)>,
}

/// Union of the readiness waits of several values (one wait per counter).
pub fn join_waits(vals: &[&Val]) -> Vec<(CounterId, i64)> {
    let mut w: Vec<(CounterId, i64)> = Vec::new();
    for v in vals {
        for &(c, t) in &v.ready {
            if !w.iter().any(|&(c2, _)| c2 == c) {
                w.push((c, t));
            }
        }
    }
    w
}

/// A program under construction plus the random source that drives it. Motif methods append
/// tasks in topological order and return the value they produce.
pub struct Gen {
    /// The program.
    pub p: Program,
    /// Randomness.
    pub rng: Rng,
    dtype: DType,
    names: u32,
    reshape_ids: Option<BufferId>,
    positions: Option<BufferId>,
}

impl Gen {
    /// An empty program driven by `seed`.
    pub fn new(seed: u64) -> Self {
        let mut p = Program::new();
        p.meta.insert("generator", Value::from("amk-conformance"));
        p.meta.insert("seed", Value::Int((seed >> 1) as i64));
        Gen {
            p,
            rng: Rng::new(seed),
            dtype: DType::F32,
            names: 0,
            reshape_ids: None,
            positions: None,
        }
    }

    fn name(&mut self, base: &str) -> String {
        self.names += 1;
        format!("{base}{}", self.names)
    }

    /// A new ACTIVATION buffer.
    pub fn act(&mut self, base: &str, shape: &[u64]) -> BufferId {
        let n = self.name(base);
        self.p
            .new_buffer(n, BufferKind::ACTIVATION, self.dtype, shape)
    }

    /// A new WEIGHT buffer.
    pub fn weight(&mut self, base: &str, shape: &[u64], dtype: DType) -> BufferId {
        let n = self.name(base);
        self.p.new_weight(n.clone(), dtype, shape, n)
    }

    /// A new buffer of any kind.
    pub fn buffer(
        &mut self,
        base: &str,
        kind: BufferKind,
        dtype: DType,
        shape: &[u64],
    ) -> BufferId {
        let n = self.name(base);
        self.p.new_buffer(n, kind, dtype, shape)
    }

    /// A new counter.
    pub fn counter(&mut self, note: &str) -> CounterId {
        self.p.new_counter(note)
    }

    /// Appends a task.
    #[allow(clippy::too_many_arguments)] // reason: mirrors Program::push_task plus nothing else
    pub fn task(
        &mut self,
        op: Opcode,
        ins: &[BufferId],
        outs: &[BufferId],
        ctr: CounterId,
        waits: &[(CounterId, i64)],
        params: Map,
        label: &str,
    ) -> TaskId {
        self.p.push_task(op, ins, outs, ctr, waits, params, label)
    }

    fn shape(&self, b: BufferId) -> Vec<u64> {
        self.p
            .buffers
            .get(b as usize)
            .map_or_else(|| vec![1], |x| x.shape.clone())
    }

    fn numel(&self, b: BufferId) -> u64 {
        self.p.buffers.get(b as usize).map_or(1, |x| x.numel())
    }

    fn last_dim(&self, b: BufferId) -> u64 {
        self.p.buffers.get(b as usize).map_or(1, |x| x.last_dim())
    }

    fn reshape_ids(&mut self) -> BufferId {
        if let Some(b) = self.reshape_ids {
            return b;
        }
        let b = self
            .p
            .new_buffer("reshape_id0", BufferKind::IO_INPUT, DType::I32, &[1]);
        self.reshape_ids = Some(b);
        b
    }

    fn positions(&mut self) -> BufferId {
        if let Some(b) = self.positions {
            return b;
        }
        let b = self
            .p
            .new_buffer("pos", BufferKind::IO_INPUT, DType::I32, &[1]);
        self.positions = Some(b);
        b
    }

    /// A model input `[1, d]`.
    pub fn root(&mut self, d: u64) -> Val {
        let buf = self.buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, d]);
        Val {
            buf,
            ready: Vec::new(),
        }
    }

    /// A row gather `EMBED(ids[m], table[vocab, d]) -> [m, d]` (a root of an `m`-row stream).
    pub fn gather(&mut self, m: u64, d: u64) -> Val {
        let ids = self.buffer("ids", BufferKind::IO_INPUT, DType::I32, &[m]);
        let vocab = self.rng.range(4, 64);
        let table = self.weight("table", &[vocab, d], DType::F32);
        let out = self.act("emb", &[m, d]);
        let c = self.counter("embed");
        self.task(
            Opcode::EMBED,
            &[ids, table],
            &[out],
            c,
            &[],
            params(&[("hidden", int(d))]),
            "embed",
        );
        Val {
            buf: out,
            ready: vec![(c, 1)],
        }
    }

    /// One single-producer element-wise or row-wise op of `v` (GELU, COPY, MUL by a scale,
    /// SOFTMAX, RMSNORM, LAYERNORM or a FUSED recipe).
    pub fn unary(&mut self, v: &Val) -> Val {
        let shape = self.shape(v.buf);
        let last = self.last_dim(v.buf);
        let out = self.act("u", &shape);
        let c = self.counter("unary");
        let waits = v.ready.clone();
        match self.rng.below(7) {
            0 => {
                self.task(
                    Opcode::GELU,
                    &[v.buf],
                    &[out],
                    c,
                    &waits,
                    Map::new(),
                    "gelu",
                );
            }
            1 => {
                self.task(
                    Opcode::COPY,
                    &[v.buf],
                    &[out],
                    c,
                    &waits,
                    Map::new(),
                    "copy",
                );
            }
            2 => {
                let s = 0.25 * (1 + self.rng.below(7)) as f64;
                self.task(
                    Opcode::MUL,
                    &[v.buf],
                    &[out],
                    c,
                    &waits,
                    params(&[("scale", Value::Float(s))]),
                    "scale",
                );
            }
            3 => {
                let pr = if self.rng.chance(50) {
                    params(&[("dim", Value::Int(-1))])
                } else {
                    Map::new()
                };
                self.task(Opcode::SOFTMAX, &[v.buf], &[out], c, &waits, pr, "softmax");
            }
            4 => {
                let w = self.weight("norm_w", &[last], DType::F32);
                self.task(
                    Opcode::RMSNORM,
                    &[v.buf, w],
                    &[out],
                    c,
                    &waits,
                    params(&[("eps", Value::Float(1e-6)), ("hidden", int(last))]),
                    "rmsnorm",
                );
            }
            5 => {
                let w = self.weight("ln_w", &[last], DType::F32);
                let mut ins = vec![v.buf, w];
                if self.rng.chance(50) {
                    ins.push(self.weight("ln_b", &[last], DType::F32));
                }
                self.task(
                    Opcode::LAYERNORM,
                    &ins,
                    &[out],
                    c,
                    &waits,
                    params(&[("eps", Value::Float(1e-5)), ("hidden", int(last))]),
                    "layernorm",
                );
            }
            _ => {
                self.task(
                    Opcode::FUSED,
                    &[v.buf],
                    &[out],
                    c,
                    &waits,
                    params(&[("recipe", gelu_scale_recipe())]),
                    "fused",
                );
            }
        }
        Val {
            buf: out,
            ready: vec![(c, 1)],
        }
    }

    /// An element-wise binary op (ADD, MUL or SILU_MUL) of two equally sized values.
    pub fn binary(&mut self, a: &Val, b: &Val) -> Val {
        let shape = self.shape(a.buf);
        let out = self.act("b", &shape);
        let c = self.counter("binary");
        let waits = join_waits(&[a, b]);
        let op = match self.rng.below(3) {
            0 => Opcode::ADD,
            1 => Opcode::MUL,
            _ => Opcode::SILU_MUL,
        };
        self.task(op, &[a.buf, b.buf], &[out], c, &waits, Map::new(), "binary");
        Val {
            buf: out,
            ready: vec![(c, 1)],
        }
    }

    /// A fan-in join: `k` producers (2..=8) each write their own copy of `src` and signal one
    /// shared counter; an ALLREDUCE_SHARD waits for all `k` (directly, or through a NOP
    /// barrier that itself waits for all `k`).
    pub fn fan_in(&mut self, src: &Val, k: usize) -> Val {
        let k = k.clamp(2, 8);
        let shape = self.shape(src.buf);
        let c = self.counter("fan-in");
        let mut parts = Vec::new();
        for i in 0..k {
            let out = self.act("part", &shape);
            let op = match self.rng.below(3) {
                0 => Opcode::GELU,
                1 => Opcode::COPY,
                _ => Opcode::MUL,
            };
            let pr = if op == Opcode::MUL {
                params(&[("scale", Value::Float(0.5 + i as f64))])
            } else {
                Map::new()
            };
            let waits = src.ready.clone();
            self.task(op, &[src.buf], &[out], c, &waits, pr, "producer");
            parts.push(out);
        }
        let waits = if self.rng.chance(30) {
            let cb = self.counter("barrier");
            self.task(
                Opcode::NOP,
                &[],
                &[],
                cb,
                &[(c, k as i64)],
                Map::new(),
                "barrier",
            );
            vec![(cb, 1)]
        } else {
            vec![(c, k as i64)]
        };
        let out = self.act("join", &shape);
        let cj = self.counter("join");
        self.task(
            Opcode::ALLREDUCE_SHARD,
            &parts,
            &[out],
            cj,
            &waits,
            Map::new(),
            "join",
        );
        Val {
            buf: out,
            ready: vec![(cj, 1)],
        }
    }

    /// A tiled linear layer `x[M, K] @ W[n, K]^T -> [M, n]`: GEMV_TILE (M = 1) or GEMM_TILE
    /// (M > 1, rows split too) tasks writing disjoint tiles and sharing one counter. The weight
    /// is a WEIGHT, a quantised int8 weight with scales, or a DEQUANT-produced activation.
    pub fn tiled(&mut self, x: &Val, n: u64) -> Val {
        let k = self.last_dim(x.buf);
        let m = (self.numel(x.buf) / k.max(1)).max(1);
        let out = self.act("y", &[m, n]);
        let c = self.counter("tiles");
        let mut waits = x.ready.clone();
        let mode = self.rng.below(10);
        let mut w_ins: Vec<BufferId>;
        let mut extra: Vec<(&str, Value)> = Vec::new();
        if mode < 2 && m == 1 {
            // int8 weight-only quantisation with per-group fp16 scales.
            let group = if k.is_multiple_of(4) && self.rng.chance(50) {
                k / 4
            } else {
                k
            };
            let qw = self.weight("qw", &[n, k], DType::I8);
            let sc = self.weight("scales", &[n, k.div_ceil(group)], DType::F16);
            w_ins = vec![qw, sc];
            extra.push(("qdtype", Value::Int(6)));
            extra.push(("group", int(group)));
        } else if mode < 4 {
            // Weight dequantised on device by a DEQUANT task: the tiles read an activation.
            let group = if k.is_multiple_of(2) { 2 } else { 1 };
            let qw = self.weight("qw", &[n, k], DType::I8);
            let sc = self.weight("scales", &[n * k / group], DType::F32);
            let wd = self.act("wdq", &[n, k]);
            let cd = self.counter("dequant");
            self.task(
                Opcode::DEQUANT,
                &[qw, sc],
                &[wd],
                cd,
                &[],
                params(&[("qdtype", Value::Int(6)), ("group", int(group))]),
                "dequant",
            );
            waits.push((cd, 1));
            w_ins = vec![wd];
        } else {
            w_ins = vec![self.weight("w", &[n, k], DType::F32)];
            if m == 1 && self.rng.chance(25) {
                w_ins.push(self.weight("bias", &[n], DType::F32));
            }
        }
        let cols = self.partition(n, 4);
        let rows = if m > 1 {
            self.partition(m, 3)
        } else {
            vec![(0, 1)]
        };
        let explicit_m_off = rows.len() > 1 || self.rng.chance(50);
        let mut count = 0i64;
        for &(r0, rl) in &rows {
            for &(c0, cl) in &cols {
                let mut ins = vec![x.buf];
                ins.extend_from_slice(&w_ins);
                let mut pr = vec![("K", int(k)), ("N_tile", int(cl)), ("n_off", int(c0))];
                pr.extend(extra.iter().cloned());
                let op = if m > 1 {
                    pr.push(("M_tile", int(rl)));
                    if explicit_m_off {
                        pr.push(("m_off", int(r0)));
                    }
                    Opcode::GEMM_TILE
                } else {
                    Opcode::GEMV_TILE
                };
                self.task(op, &ins, &[out], c, &waits, params(&pr), "tile");
                count += 1;
            }
        }
        Val {
            buf: out,
            ready: vec![(c, count)],
        }
    }

    /// Splits `[0, n)` into 1..=`max` contiguous non-empty parts of random widths.
    fn partition(&mut self, n: u64, max: u64) -> Vec<(u64, u64)> {
        let parts = self.rng.range(1, max.min(n));
        let mut cuts: Vec<u64> = Vec::new();
        while (cuts.len() as u64) + 1 < parts {
            let c = self.rng.range(1, n - 1);
            if !cuts.contains(&c) {
                cuts.push(c);
            }
        }
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut start = 0;
        for c in cuts.into_iter().chain(std::iter::once(n)) {
            out.push((start, c - start));
            start = c;
        }
        out
    }

    /// A decode attention block on `x[1, d]`: q/k/v tiled projections, EMBED reshape bridges,
    /// ROPE, KV_APPEND of k and v into KV_CACHE buffers (in place), then one ATTENTION_TILE
    /// waiting on the appends — or, with `split`, several `flags = 2` shards writing
    /// `[n_heads, head_dim + 2]` partials and an ATTENTION_COMBINE — and an output projection
    /// back to `[1, d]`. Sometimes the caches are not appended to (they then hold only the
    /// previous steps' state, which needs no producer).
    pub fn attention(&mut self, x: &Val, split: bool) -> Val {
        let d = self.last_dim(x.buf);
        let hd = *self.rng.pick(&[4u64, 8, 16]).unwrap_or(&8);
        let n_kv = self.rng.range(1, 2);
        let n_heads = n_kv * self.rng.range(1, 2);
        let max_seq = self.rng.range(4, 12);
        let pos = self.rng.below(max_seq);
        let kv_len = pos + 1;
        let (q_dim, kv_dim) = (n_heads * hd, n_kv * hd);
        let append = !self.rng.chance(15);
        let q = self.tiled(x, q_dim);
        let ids = self.reshape_ids();
        let posb = self.positions();
        // q: reshape bridge [1, q_dim] -> [n_heads, hd], then ROPE.
        let qh = self.act("qh", &[n_heads, hd]);
        let cq = self.counter("qh");
        self.task(
            Opcode::EMBED,
            &[ids, q.buf],
            &[qh],
            cq,
            &q.ready,
            params(&[("hidden", int(q_dim))]),
            "reshape_q",
        );
        let qr = self.act("qr", &[n_heads, hd]);
        let cqr = self.counter("qr");
        self.task(
            Opcode::ROPE,
            &[qh, posb],
            &[qr],
            cqr,
            &[(cq, 1)],
            params(&[("head_dim", int(hd)), ("theta", Value::Float(10000.0))]),
            "rope_q",
        );
        let kc = self.buffer(
            "kcache",
            BufferKind::KV_CACHE,
            self.dtype,
            &[max_seq, n_kv, hd],
        );
        let vc = self.buffer(
            "vcache",
            BufferKind::KV_CACHE,
            self.dtype,
            &[max_seq, n_kv, hd],
        );
        let mut att_waits = vec![(cqr, 1)];
        if append {
            let k = self.tiled(x, kv_dim);
            let v = self.tiled(x, kv_dim);
            let kh = self.act("kh", &[1, n_kv, hd]);
            let ck = self.counter("kh");
            self.task(
                Opcode::EMBED,
                &[ids, k.buf],
                &[kh],
                ck,
                &k.ready,
                params(&[("hidden", int(kv_dim))]),
                "reshape_k",
            );
            let kr = self.act("kr", &[1, n_kv, hd]);
            let ckr = self.counter("kr");
            self.task(
                Opcode::ROPE,
                &[kh, posb],
                &[kr],
                ckr,
                &[(ck, 1)],
                params(&[("head_dim", int(hd)), ("theta", Value::Float(10000.0))]),
                "rope_k",
            );
            let cak = self.counter("kv_k");
            self.task(
                Opcode::KV_APPEND,
                &[kr, kc],
                &[kc],
                cak,
                &[(ckr, 1)],
                params(&[("pos", int(pos))]),
                "kv_append_k",
            );
            let cav = self.counter("kv_v");
            self.task(
                Opcode::KV_APPEND,
                &[v.buf, vc],
                &[vc],
                cav,
                &v.ready,
                params(&[("pos", int(pos))]),
                "kv_append_v",
            );
            att_waits.push((cak, 1));
            att_waits.push((cav, 1));
        }
        let scale = 1.0 / (hd as f64).sqrt();
        let attn = self.act("attn", &[1, q_dim]);
        let ca = self.counter("attn");
        let shards = if split {
            self.rng.range(2, kv_len.min(8))
        } else {
            1
        };
        if shards < 2 {
            self.task(
                Opcode::ATTENTION_TILE,
                &[qr, kc, vc],
                &[attn],
                ca,
                &att_waits,
                params(&[
                    ("head_dim", int(hd)),
                    ("kv_start", Value::Int(0)),
                    ("kv_len", int(kv_len)),
                    ("scale", Value::Float(scale)),
                    ("n_heads", int(n_heads)),
                    ("n_kv_heads", int(n_kv)),
                ]),
                "attention",
            );
        } else {
            let ranges = self.partition(kv_len, shards);
            let mut parts = Vec::new();
            let mut cw = Vec::new();
            for (i, &(s0, sl)) in ranges.iter().enumerate() {
                let part = self.act("partial", &[n_heads, hd + 2]);
                let cs = self.counter("shard");
                self.task(
                    Opcode::ATTENTION_TILE,
                    &[qr, kc, vc],
                    &[part],
                    cs,
                    &att_waits,
                    params(&[
                        ("head_dim", int(hd)),
                        ("kv_start", int(s0)),
                        ("kv_len", int(sl)),
                        ("scale", Value::Float(scale)),
                        ("n_heads", int(n_heads)),
                        ("n_kv_heads", int(n_kv)),
                        ("flags", Value::Int(2)),
                    ]),
                    &format!("attn_shard{i}"),
                );
                parts.push(part);
                cw.push((cs, 1));
            }
            if parts.len() == 1 {
                // A single range: still a partial, combined alone is not allowed (2..8 inputs),
                // so add an empty shard (kv_len 0 is valid for a partial).
                let part = self.act("partial", &[n_heads, hd + 2]);
                let cs = self.counter("shard");
                self.task(
                    Opcode::ATTENTION_TILE,
                    &[qr, kc, vc],
                    &[part],
                    cs,
                    &att_waits,
                    params(&[
                        ("head_dim", int(hd)),
                        ("kv_start", int(kv_len)),
                        ("kv_len", Value::Int(0)),
                        ("scale", Value::Float(scale)),
                        ("n_heads", int(n_heads)),
                        ("n_kv_heads", int(n_kv)),
                        ("flags", Value::Int(2)),
                    ]),
                    "attn_shard_empty",
                );
                parts.push(part);
                cw.push((cs, 1));
            }
            self.task(
                Opcode::ATTENTION_COMBINE,
                &parts,
                &[attn],
                ca,
                &cw,
                params(&[
                    ("head_dim", int(hd)),
                    ("n_heads", int(n_heads)),
                    ("n_kv_heads", int(n_kv)),
                ]),
                "combine",
            );
        }
        let a = Val {
            buf: attn,
            ready: vec![(ca, 1)],
        };
        self.tiled(&a, d)
    }

    /// Sinks `v` into a new IO_OUTPUT buffer (COPY, or SAMPLE_ARGMAX into I32 indices).
    pub fn finish(&mut self, v: &Val) {
        let shape = self.shape(v.buf);
        let c = self.counter("out");
        if self.rng.chance(20) {
            let rows = self.numel(v.buf) / self.last_dim(v.buf).max(1);
            let out = self.buffer("token", BufferKind::IO_OUTPUT, DType::I32, &[rows]);
            self.task(
                Opcode::SAMPLE_ARGMAX,
                &[v.buf],
                &[out],
                c,
                &v.ready,
                Map::new(),
                "argmax",
            );
        } else {
            let out = self.buffer("out", BufferKind::IO_OUTPUT, DType::F32, &shape);
            self.task(
                Opcode::COPY,
                &[v.buf],
                &[out],
                c,
                &v.ready,
                Map::new(),
                "out",
            );
        }
    }

    /// The finished program.
    pub fn into_program(self) -> Program {
        self.p
    }
}

/// A valid FUSED recipe: `gelu(in0) * 0.5`.
pub fn gelu_scale_recipe() -> Value {
    let step0 = params(&[
        ("op", Value::Int(Opcode::GELU.0 as i64)),
        (
            "args",
            Value::Array(vec![Value::Object(params(&[("in", Value::Int(0))]))]),
        ),
        ("out", Value::Int(0)),
    ]);
    let step1 = params(&[
        ("op", Value::Int(Opcode::MUL.0 as i64)),
        (
            "args",
            Value::Array(vec![Value::Object(params(&[("s", Value::Int(0))]))]),
        ),
        ("out", Value::from("final")),
        (
            "params",
            Value::Object(params(&[("scale", Value::Float(0.5))])),
        ),
    ]);
    Value::Object(params(&[(
        "steps",
        Value::Array(vec![Value::Object(step0), Value::Object(step1)]),
    )]))
}

// ---- families ----------------------------------------------------------------------------------

/// The program families of the soundness suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// A chain of unary/binary ops.
    Chain,
    /// Fan-in joins on shared counters.
    FanIn,
    /// Tiled GEMV/GEMM groups.
    Tiled,
    /// KV_APPEND → ATTENTION_TILE blocks.
    KvAttention,
    /// Split-KV shards + ATTENTION_COMBINE.
    SplitKv,
    /// A mixture with every task placed on an SM (and some on-chip buffers).
    SmAssigned,
    /// A mixture with graph-coloured scratch pages.
    Paged,
    /// Random mixtures of every motif, sometimes with SMs and pages.
    Mixture,
}

impl Family {
    /// Every family.
    pub const ALL: &'static [Family] = &[
        Family::Chain,
        Family::FanIn,
        Family::Tiled,
        Family::KvAttention,
        Family::SplitKv,
        Family::SmAssigned,
        Family::Paged,
        Family::Mixture,
    ];
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Family::Chain => "chain",
            Family::FanIn => "fan_in",
            Family::Tiled => "tiled",
            Family::KvAttention => "kv_attention",
            Family::SplitKv => "split_kv",
            Family::SmAssigned => "sm_assigned",
            Family::Paged => "paged",
            Family::Mixture => "mixture",
        }
    }
}

fn pick_same_numel(g: &mut Gen, pool: &[Val], like: &Val) -> Option<Val> {
    let n = g.numel(like.buf);
    let cands: Vec<&Val> = pool
        .iter()
        .filter(|v| v.buf != like.buf && g.numel(v.buf) == n)
        .collect();
    g.rng.pick(&cands).map(|v| (*v).clone())
}

/// Random motifs over a pool of values; returns the pool (the last value is the newest).
fn mixture_body(g: &mut Gen, steps: u64, allowed: &[u8]) -> Vec<Val> {
    let d = *g.rng.pick(&[8u64, 16, 32, 64]).unwrap_or(&16);
    let x = g.root(d);
    let mut pool = vec![x];
    for _ in 0..steps {
        let motif = *g.rng.pick(allowed).unwrap_or(&0);
        // Prefer recent values (chains), sometimes an older one (branches).
        let i = if g.rng.chance(70) {
            pool.len() - 1
        } else {
            g.rng.index(pool.len())
        };
        let src = pool[i].clone();
        let is_row = g.numel(src.buf) == g.last_dim(src.buf);
        let v = match motif {
            0 => g.unary(&src),
            1 => match pick_same_numel(g, &pool, &src) {
                Some(o) => g.binary(&src, &o),
                None => {
                    let u = g.unary(&src);
                    g.binary(&src, &u)
                }
            },
            2 => {
                let k = g.rng.range(2, 8) as usize;
                g.fan_in(&src, k)
            }
            3 => {
                let n = *g.rng.pick(&[4u64, 8, 16, 24, 32]).unwrap_or(&16);
                if !is_row && g.rng.chance(50) {
                    g.tiled(&src, n)
                } else if g.rng.chance(25) {
                    let m = g.rng.range(2, 4);
                    let dd = g.last_dim(src.buf);
                    let rows = g.gather(m, dd);
                    g.tiled(&rows, n)
                } else {
                    g.tiled(&src, n)
                }
            }
            4 if is_row => g.attention(&src, false),
            5 if is_row => g.attention(&src, true),
            _ => g.unary(&src),
        };
        pool.push(v);
    }
    pool
}

fn finish_pool(g: &mut Gen, pool: &[Val]) {
    if let Some(last) = pool.last() {
        let last = last.clone();
        g.finish(&last);
    }
    if pool.len() > 2 && g.rng.chance(30) {
        let i = g.rng.range(1, pool.len() as u64 - 2) as usize;
        let v = pool[i].clone();
        g.finish(&v);
    }
}

/// One valid program of `family` for `seed` (small: about 3–100 tasks, most under 60).
pub fn generate(family: Family, seed: u64) -> Program {
    let mut g = Gen::new(seed_of(&[family as u64, seed]));
    g.p.meta
        .insert("family", Value::from(family.name().to_string()));
    match family {
        Family::Chain => {
            let steps = g.rng.range(2, 12);
            let pool = mixture_body(&mut g, steps, &[0, 0, 0, 1]);
            finish_pool(&mut g, &pool);
        }
        Family::FanIn => {
            let steps = g.rng.range(1, 5);
            let pool = mixture_body(&mut g, steps, &[2, 2, 0, 1]);
            finish_pool(&mut g, &pool);
        }
        Family::Tiled => {
            let steps = g.rng.range(1, 5);
            let pool = mixture_body(&mut g, steps, &[3, 3, 0]);
            finish_pool(&mut g, &pool);
        }
        Family::KvAttention | Family::SplitKv => {
            let d = *g.rng.pick(&[8u64, 16, 32]).unwrap_or(&16);
            let x = g.root(d);
            let mut h = x;
            let blocks = g.rng.range(1, 2);
            for _ in 0..blocks {
                let n = g.unary(&h);
                let a = g.attention(&n, family == Family::SplitKv);
                h = g.binary(&h, &a);
            }
            g.finish(&h);
        }
        Family::SmAssigned => {
            let steps = g.rng.range(2, 6);
            let pool = mixture_body(&mut g, steps, &[0, 1, 2, 3, 4, 5]);
            finish_pool(&mut g, &pool);
            let strat = match g.rng.below(3) {
                0 => SmStrategy::RoundRobin,
                1 => SmStrategy::Random,
                _ => SmStrategy::Few(g.rng.range(1, 4) as i32),
            };
            let mut rng = g.rng.fork();
            assign_sms(&mut g.p, strat, &mut rng);
            let k = rng.range(0, 2) as usize;
            pin_onchip(&mut g.p, k, &mut rng);
        }
        Family::Paged => {
            let steps = g.rng.range(2, 6);
            let pool = mixture_body(&mut g, steps, &[0, 1, 2, 3, 4, 5]);
            finish_pool(&mut g, &pool);
            let mut rng = g.rng.fork();
            if let Some(hb) = Hb::full(&g.p) {
                let pct = rng.range(50, 100);
                colour_pages(&mut g.p, &hb, pct, &mut rng);
            }
        }
        Family::Mixture => {
            let steps = g.rng.range(2, 6);
            let pool = mixture_body(&mut g, steps, &[0, 1, 2, 3, 4, 5]);
            finish_pool(&mut g, &pool);
            let mut rng = g.rng.fork();
            if rng.chance(40)
                && let Some(hb) = Hb::full(&g.p)
            {
                colour_pages(&mut g.p, &hb, 80, &mut rng);
            }
            if rng.chance(40) {
                let strat = if rng.chance(50) {
                    SmStrategy::Few(3)
                } else {
                    SmStrategy::RoundRobin
                };
                assign_sms(&mut g.p, strat, &mut rng);
                pin_onchip(&mut g.p, 1, &mut rng);
            }
        }
    }
    g.into_program()
}

// ---- the Llama-like decode lowering ------------------------------------------------------------

/// Most tiles per projection (the reference's `_MAX_TILES`).
pub const MAX_TILES: u64 = 64;

/// GEMV tile width for an `n`-wide projection (docs/models.md, "The reference lowering"):
/// `min(n_tile, n)`, widened to `ceil(n / 64)` when that would need more than 64 tiles.
pub fn gemv_tile_width(n_tile: u64, n: u64) -> u64 {
    let w = n_tile.min(n).max(1);
    if n.div_ceil(w) > MAX_TILES {
        n.div_ceil(MAX_TILES)
    } else {
        w
    }
}

/// Number of GEMV tiles for an `n`-wide projection.
pub fn gemv_tiles(n_tile: u64, n: u64) -> u64 {
    n.div_ceil(gemv_tile_width(n_tile, n))
}

/// Shape and options of [`llama_like_with`].
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Decoder layers.
    pub layers: usize,
    /// Hidden size H.
    pub hidden: u64,
    /// Query heads.
    pub heads: u64,
    /// KV heads (GQA).
    pub kv_heads: u64,
    /// Head dim.
    pub head_dim: u64,
    /// MLP intermediate size I.
    pub inter: u64,
    /// Vocabulary.
    pub vocab: u64,
    /// GEMV tile width (the `tiling.gemv.N_tile` knob).
    pub n_tile: u64,
    /// KV-cache length.
    pub max_seq: u64,
    /// Decode position (`kv_len = pos + 1`).
    pub pos: u64,
    /// Activation and weight dtype.
    pub dtype: DType,
    /// Split-KV partitions (≤ 1 = none); shards get `sm = p % num_sms` when no SM assignment.
    pub split_kv: u64,
    /// Round-robin SM assignment over the (topological) task list, target H100.
    pub sm_round_robin: bool,
    /// Graph-colour page sharing of every ACTIVATION buffer.
    pub pages: bool,
}

impl LlamaConfig {
    /// A plain configuration (fp32, pos 0, 256-row caches, no split, no SMs, no pages).
    #[allow(clippy::too_many_arguments)] // reason: the model's shape really has eight numbers
    pub fn new(
        layers: usize,
        hidden: u64,
        heads: u64,
        kv_heads: u64,
        head_dim: u64,
        inter: u64,
        vocab: u64,
        n_tile: u64,
    ) -> Self {
        LlamaConfig {
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter,
            vocab,
            n_tile,
            max_seq: 256,
            pos: 0,
            dtype: DType::F32,
            split_kv: 1,
            sm_round_robin: false,
            pages: false,
        }
    }

    /// Effective split-KV shard count.
    pub fn shards(&self) -> u64 {
        let kv_len = self.pos + 1;
        self.split_kv.clamp(1, 8).min(kv_len)
    }

    /// Task count by the reference's formula (plus split-KV shards).
    pub fn task_count(&self) -> usize {
        let t = |n| gemv_tiles(self.n_tile, n);
        let q_dim = self.heads * self.head_dim;
        let kv_dim = self.kv_heads * self.head_dim;
        let shards = self.shards();
        let attn = if shards > 1 { shards + 1 } else { 1 };
        let per_layer =
            11 + attn + t(q_dim) + 2 * t(kv_dim) + 2 * t(self.hidden) + 2 * t(self.inter);
        (2 + t(self.vocab) + self.layers as u64 * per_layer) as usize
    }
}

/// A decode program shaped like the reference lowering (docs/models.md, "The reference
/// lowering"), plain (no SMs, no pages).
#[allow(clippy::too_many_arguments)] // reason: the signature the benchmark uses
pub fn llama_like(
    layers: usize,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    inter: u64,
    vocab: u64,
    n_tile: u64,
) -> Program {
    llama_like_with(&LlamaConfig::new(
        layers, hidden, heads, kv_heads, head_dim, inter, vocab, n_tile,
    ))
}

/// The ≈3,400-task preset: Llama-3.2-3B's shape (28 layers, H 3072, 24/8 heads × 128,
/// I 8192, V 128256) at `n_tile` 256, bf16, with round-robin SMs on an H100 and graph-colour
/// pages: exactly [`PRESET_3K_TASKS`] tasks.
pub fn preset_3k_config() -> LlamaConfig {
    let mut c = LlamaConfig::new(28, 3072, 24, 8, 128, 8192, 128256, 256);
    c.dtype = DType::BF16;
    c.sm_round_robin = true;
    c.pages = true;
    c
}

/// Task count of [`preset_3k`].
pub const PRESET_3K_TASKS: usize = 3426;

/// The ≈20,000-task preset: Llama-3-70B's shape (80 layers, H 8192, 64/8 heads × 128,
/// I 28672, V 128256) at `n_tile` 256, bf16, round-robin SMs on an H100, graph-colour pages:
/// exactly [`PRESET_20K_TASKS`] tasks.
pub fn preset_20k_config() -> LlamaConfig {
    let mut c = LlamaConfig::new(80, 8192, 64, 8, 128, 28672, 128256, 256);
    c.dtype = DType::BF16;
    c.sm_round_robin = true;
    c.pages = true;
    c
}

/// Task count of [`preset_20k`].
pub const PRESET_20K_TASKS: usize = 19586;

/// The ≈3,400-task benchmark program ([`preset_3k_config`]).
pub fn preset_3k() -> Program {
    llama_like_with(&preset_3k_config())
}

/// The ≈20,000-task benchmark program ([`preset_20k_config`]).
pub fn preset_20k() -> Program {
    llama_like_with(&preset_20k_config())
}

struct Lower {
    p: Program,
    seg: Vec<u32>,
    cur: u32,
    n_tile: u64,
    dbytes: i64,
    dtype: DType,
}

impl Lower {
    fn act(&mut self, name: String, shape: &[u64]) -> BufferId {
        self.p
            .new_buffer(name, BufferKind::ACTIVATION, self.dtype, shape)
    }
    fn weight(&mut self, name: String, shape: &[u64]) -> BufferId {
        self.p.new_weight(name.clone(), self.dtype, shape, name)
    }
    #[allow(clippy::too_many_arguments)] // reason: one task's full description
    fn task(
        &mut self,
        op: Opcode,
        ins: &[BufferId],
        outs: &[BufferId],
        ctr: CounterId,
        waits: &[(CounterId, i64)],
        pr: Map,
        label: String,
        cost: (i64, i64),
    ) -> TaskId {
        let t = self.p.push_task(op, ins, outs, ctr, waits, pr, label);
        if let Some(task) = self.p.tasks.get_mut(t as usize) {
            task.est_bytes = cost.0;
            task.est_flops = cost.1;
        }
        self.seg.push(self.cur);
        t
    }
    /// Tiles of `x[1, k] @ w[n, k]^T -> out[1, n]`, one counter; returns the consumer wait.
    #[allow(clippy::too_many_arguments)] // reason: one projection's full description
    fn proj(
        &mut self,
        x: BufferId,
        xw: &[(CounterId, i64)],
        w: BufferId,
        out: BufferId,
        k: u64,
        n: u64,
        label: &str,
    ) -> (CounterId, i64) {
        let c = self.p.new_counter(format!("{label} ready"));
        let width = gemv_tile_width(self.n_tile, n);
        let mut i = 0u64;
        let mut off = 0u64;
        while off < n {
            let nt = width.min(n - off);
            let bytes = k as i64 * self.dbytes * nt as i64;
            self.task(
                Opcode::GEMV_TILE,
                &[x, w],
                &[out],
                c,
                xw,
                params(&[("K", int(k)), ("N_tile", int(nt)), ("n_off", int(off))]),
                format!("{label}[{i}]"),
                (bytes, 2 * (k * nt) as i64),
            );
            off += nt;
            i += 1;
        }
        (c, i as i64)
    }
}

/// A decode program shaped like the reference lowering (docs/models.md, "The reference
/// lowering"): EMBED; per layer RMSNORM, q/k/v GEMV tiles, EMBED reshape bridges, ROPE q/k,
/// KV_APPEND k/v (in place), ATTENTION_TILE (or split-KV shards + ATTENTION_COMBINE), o tiles,
/// ADD, RMSNORM, gate/up tiles, SILU_MUL, down tiles, ADD; then the final RMSNORM and lm_head
/// tiles into the IO_OUTPUT logits.
/// Each task waits on the counters of the transient inputs it reads (tiles: the whole
/// projection). Tasks are emitted in a topological order.
pub fn llama_like_with(cfg: &LlamaConfig) -> Program {
    llama_like_segments(cfg).0
}

/// [`llama_like_with`] plus each task's segment for [`Hb::layered`]: 0 = the embedding,
/// `l + 1` = layer `l` (whose closing residual ADD starts segment `l + 2`), `layers + 1` = the
/// final norm and lm_head.
pub fn llama_like_segments(cfg: &LlamaConfig) -> (Program, Vec<u32>) {
    let h = cfg.hidden.max(1);
    let hd = cfg.head_dim.max(1);
    let nkv = cfg.kv_heads.max(1);
    let nh = cfg.heads.max(1);
    let q_dim = nh * hd;
    let kv_dim = nkv * hd;
    let inter = cfg.inter.max(1);
    let vocab = cfg.vocab.max(1);
    let max_seq = cfg.max_seq.max(cfg.pos + 1);
    let kv_len = cfg.pos + 1;
    let dbytes = (cfg.dtype.bits() / 8).max(1) as i64;
    let mut lw = Lower {
        p: Program::new(),
        seg: Vec::new(),
        cur: 0,
        n_tile: cfg.n_tile.max(1),
        dbytes,
        dtype: cfg.dtype,
    };
    lw.p.meta.insert("model", Value::from("llama_like"));
    lw.p.meta.insert("regime", Value::from("decode"));
    lw.p.meta.insert("pos", int(cfg.pos));
    lw.p.meta.insert("kv_len", int(kv_len));
    lw.p.meta
        .insert("dtype", Value::from(cfg.dtype.name().to_string()));
    lw.p.meta.insert("n_layers", int(cfg.layers as u64));
    let target = GpuTarget::by_name("h100");
    let num_sms = target.as_ref().map_or(132, |t| t.num_sms.max(1));
    if cfg.sm_round_robin || cfg.shards() > 1 {
        lw.p.target = target;
        lw.p.meta.insert("gpu", Value::from("h100"));
    }
    let token =
        lw.p.new_buffer("token_id", BufferKind::IO_INPUT, DType::I32, &[1]);
    let posb =
        lw.p.new_buffer("pos", BufferKind::IO_INPUT, DType::I32, &[1]);
    let rid =
        lw.p.new_buffer("reshape_id0", BufferKind::IO_INPUT, DType::I32, &[1]);
    let table = lw.weight("embed.weight".into(), &[vocab, h]);
    let h0 = lw.act("h0".into(), &[1, h]);
    let c_embed = lw.p.new_counter("h0 ready");
    lw.task(
        Opcode::EMBED,
        &[token, table],
        &[h0],
        c_embed,
        &[],
        params(&[("hidden", int(h))]),
        "embed".into(),
        (h as i64 * dbytes, 0),
    );
    let eps = || Value::Float(1e-6);
    let theta = || Value::Float(10000.0);
    let mut resid = h0;
    let mut resid_w = (c_embed, 1i64);
    for l in 0..cfg.layers {
        lw.cur = l as u32 + 1;
        let pfx = format!("layers.{l}");
        let in_norm = lw.weight(format!("{pfx}.input_norm"), &[h]);
        let wq = lw.weight(format!("{pfx}.attn.q_proj.weight"), &[q_dim, h]);
        let wk = lw.weight(format!("{pfx}.attn.k_proj.weight"), &[kv_dim, h]);
        let wv = lw.weight(format!("{pfx}.attn.v_proj.weight"), &[kv_dim, h]);
        let wo = lw.weight(format!("{pfx}.attn.o_proj.weight"), &[h, q_dim]);
        let post_norm = lw.weight(format!("{pfx}.post_norm"), &[h]);
        let wg = lw.weight(format!("{pfx}.mlp.gate_proj.weight"), &[inter, h]);
        let wu = lw.weight(format!("{pfx}.mlp.up_proj.weight"), &[inter, h]);
        let wd = lw.weight(format!("{pfx}.mlp.down_proj.weight"), &[h, inter]);
        let an = lw.act(format!("L{l}.an"), &[1, h]);
        let c_an = lw.p.new_counter(format!("L{l}.an ready"));
        lw.task(
            Opcode::RMSNORM,
            &[resid, in_norm],
            &[an],
            c_an,
            &[(resid_w.0, 1)],
            params(&[("eps", eps()), ("hidden", int(h))]),
            format!("L{l}.input_norm"),
            (h as i64 * dbytes, 4 * h as i64),
        );
        let q = lw.act(format!("L{l}.q"), &[1, q_dim]);
        let k = lw.act(format!("L{l}.k"), &[1, kv_dim]);
        let v = lw.act(format!("L{l}.v"), &[1, kv_dim]);
        let wq_ = lw.proj(an, &[(c_an, 1)], wq, q, h, q_dim, &format!("L{l}.q"));
        let wk_ = lw.proj(an, &[(c_an, 1)], wk, k, h, kv_dim, &format!("L{l}.k"));
        let wv_ = lw.proj(an, &[(c_an, 1)], wv, v, h, kv_dim, &format!("L{l}.v"));
        let qh = lw.act(format!("L{l}.qh"), &[nh, hd]);
        let c_qh = lw.p.new_counter(format!("L{l}.qh ready"));
        lw.task(
            Opcode::EMBED,
            &[rid, q],
            &[qh],
            c_qh,
            &[wq_],
            params(&[("hidden", int(q_dim))]),
            format!("L{l}.reshape_q"),
            (0, 0),
        );
        let qr = lw.act(format!("L{l}.qr"), &[nh, hd]);
        let c_qr = lw.p.new_counter(format!("L{l}.qr ready"));
        lw.task(
            Opcode::ROPE,
            &[qh, posb],
            &[qr],
            c_qr,
            &[(c_qh, 1)],
            params(&[("head_dim", int(hd)), ("theta", theta())]),
            format!("L{l}.rope_q"),
            (0, 0),
        );
        let kh = lw.act(format!("L{l}.kh"), &[1, nkv, hd]);
        let c_kh = lw.p.new_counter(format!("L{l}.kh ready"));
        lw.task(
            Opcode::EMBED,
            &[rid, k],
            &[kh],
            c_kh,
            &[wk_],
            params(&[("hidden", int(kv_dim))]),
            format!("L{l}.reshape_k"),
            (0, 0),
        );
        let kr = lw.act(format!("L{l}.kr"), &[1, nkv, hd]);
        let c_kr = lw.p.new_counter(format!("L{l}.kr ready"));
        lw.task(
            Opcode::ROPE,
            &[kh, posb],
            &[kr],
            c_kr,
            &[(c_kh, 1)],
            params(&[("head_dim", int(hd)), ("theta", theta())]),
            format!("L{l}.rope_k"),
            (0, 0),
        );
        let kc = lw.p.new_buffer(
            format!("L{l}.kcache"),
            BufferKind::KV_CACHE,
            cfg.dtype,
            &[max_seq, nkv, hd],
        );
        let vc = lw.p.new_buffer(
            format!("L{l}.vcache"),
            BufferKind::KV_CACHE,
            cfg.dtype,
            &[max_seq, nkv, hd],
        );
        let c_kk = lw.p.new_counter(format!("L{l}.kv_k ready"));
        lw.task(
            Opcode::KV_APPEND,
            &[kr, kc],
            &[kc],
            c_kk,
            &[(c_kr, 1)],
            params(&[("pos", int(cfg.pos))]),
            format!("L{l}.kv_append_k"),
            (kv_dim as i64 * dbytes, 0),
        );
        let c_kv = lw.p.new_counter(format!("L{l}.kv_v ready"));
        lw.task(
            Opcode::KV_APPEND,
            &[v, vc],
            &[vc],
            c_kv,
            &[wv_],
            params(&[("pos", int(cfg.pos))]),
            format!("L{l}.kv_append_v"),
            (kv_dim as i64 * dbytes, 0),
        );
        let attn = lw.act(format!("L{l}.attn"), &[1, q_dim]);
        let c_at = lw.p.new_counter(format!("L{l}.attn ready"));
        let att_waits = [(c_qr, 1), (c_kk, 1), (c_kv, 1)];
        let scale = Value::Float(1.0 / (hd as f64).sqrt());
        let att_cost = (
            2 * kv_len as i64 * kv_dim as i64 * dbytes,
            4 * (nh * hd * kv_len) as i64,
        );
        let shards = cfg.shards();
        if shards <= 1 {
            lw.task(
                Opcode::ATTENTION_TILE,
                &[qr, kc, vc],
                &[attn],
                c_at,
                &att_waits,
                params(&[
                    ("head_dim", int(hd)),
                    ("kv_start", Value::Int(0)),
                    ("kv_len", int(kv_len)),
                    ("scale", scale.clone()),
                    ("n_heads", int(nh)),
                    ("n_kv_heads", int(nkv)),
                ]),
                format!("L{l}.attention"),
                att_cost,
            );
        } else {
            let size = kv_len.div_ceil(shards);
            let mut parts = Vec::new();
            let mut waits = Vec::new();
            let mut sp = 0u64;
            while sp * size < kv_len {
                let s0 = sp * size;
                let sl = size.min(kv_len - s0);
                let part = lw.act(format!("L{l}.partial{sp}"), &[nh, hd + 2]);
                let cs = lw.p.new_counter(format!("L{l}.shard{sp} ready"));
                let t = lw.task(
                    Opcode::ATTENTION_TILE,
                    &[qr, kc, vc],
                    &[part],
                    cs,
                    &att_waits,
                    params(&[
                        ("head_dim", int(hd)),
                        ("kv_start", int(s0)),
                        ("kv_len", int(sl)),
                        ("scale", scale.clone()),
                        ("n_heads", int(nh)),
                        ("n_kv_heads", int(nkv)),
                        ("flags", Value::Int(2)),
                    ]),
                    format!("L{l}.attn_shard{sp}"),
                    att_cost,
                );
                if let Some(task) = lw.p.tasks.get_mut(t as usize) {
                    task.sm = Some((sp as i64 % num_sms) as i32);
                }
                parts.push(part);
                waits.push((cs, 1));
                sp += 1;
            }
            lw.task(
                Opcode::ATTENTION_COMBINE,
                &parts,
                &[attn],
                c_at,
                &waits,
                params(&[
                    ("head_dim", int(hd)),
                    ("n_heads", int(nh)),
                    ("n_kv_heads", int(nkv)),
                ]),
                format!("L{l}.combine"),
                (0, 0),
            );
        }
        let o = lw.act(format!("L{l}.o"), &[1, h]);
        let wo_ = lw.proj(attn, &[(c_at, 1)], wo, o, q_dim, h, &format!("L{l}.o"));
        let hm = lw.act(format!("L{l}.h_mid"), &[1, h]);
        let c_hm = lw.p.new_counter(format!("L{l}.h_mid ready"));
        lw.task(
            Opcode::ADD,
            &[resid, o],
            &[hm],
            c_hm,
            &[resid_w, wo_],
            Map::new(),
            format!("L{l}.add_attn"),
            (0, 0),
        );
        let mn = lw.act(format!("L{l}.mn"), &[1, h]);
        let c_mn = lw.p.new_counter(format!("L{l}.mn ready"));
        lw.task(
            Opcode::RMSNORM,
            &[hm, post_norm],
            &[mn],
            c_mn,
            &[(c_hm, 1)],
            params(&[("eps", eps()), ("hidden", int(h))]),
            format!("L{l}.post_norm"),
            (h as i64 * dbytes, 4 * h as i64),
        );
        let gate = lw.act(format!("L{l}.gate"), &[1, inter]);
        let up = lw.act(format!("L{l}.up"), &[1, inter]);
        let wg_ = lw.proj(mn, &[(c_mn, 1)], wg, gate, h, inter, &format!("L{l}.gate"));
        let wu_ = lw.proj(mn, &[(c_mn, 1)], wu, up, h, inter, &format!("L{l}.up"));
        let act = lw.act(format!("L{l}.act"), &[1, inter]);
        let c_act = lw.p.new_counter(format!("L{l}.act ready"));
        lw.task(
            Opcode::SILU_MUL,
            &[gate, up],
            &[act],
            c_act,
            &[wg_, wu_],
            Map::new(),
            format!("L{l}.swiglu"),
            (0, 0),
        );
        let down = lw.act(format!("L{l}.down"), &[1, h]);
        let wd_ = lw.proj(
            act,
            &[(c_act, 1)],
            wd,
            down,
            inter,
            h,
            &format!("L{l}.down"),
        );
        lw.cur = l as u32 + 2;
        let ho = lw.act(format!("L{l}.h_out"), &[1, h]);
        let c_ho = lw.p.new_counter(format!("L{l}.h_out ready"));
        lw.task(
            Opcode::ADD,
            &[hm, down],
            &[ho],
            c_ho,
            &[(c_hm, 1), wd_],
            Map::new(),
            format!("L{l}.add_mlp"),
            (0, 0),
        );
        resid = ho;
        resid_w = (c_ho, 1);
    }
    lw.cur = cfg.layers as u32 + 1;
    let fnorm = lw.weight("final_norm".into(), &[h]);
    let hf = lw.act("hf".into(), &[1, h]);
    let c_hf = lw.p.new_counter("hf ready");
    lw.task(
        Opcode::RMSNORM,
        &[resid, fnorm],
        &[hf],
        c_hf,
        &[resid_w],
        params(&[("eps", eps()), ("hidden", int(h))]),
        "final_norm".into(),
        (h as i64 * dbytes, 4 * h as i64),
    );
    let lm = lw.weight("lm_head.weight".into(), &[vocab, h]);
    let logits =
        lw.p.new_buffer("logits", BufferKind::IO_OUTPUT, cfg.dtype, &[1, vocab]);
    lw.proj(hf, &[(c_hf, 1)], lm, logits, h, vocab, "lm_head");
    if cfg.sm_round_robin {
        for (i, t) in lw.p.tasks.iter_mut().enumerate() {
            t.sm = Some((i as i64 % num_sms) as i32);
        }
    }
    if cfg.pages
        && let Some(hb) = Hb::layered(&lw.p, &lw.seg)
    {
        let mut rng = Rng::new(0x9A6E);
        colour_pages(&mut lw.p, &hb, 100, &mut rng);
    }
    (lw.p, lw.seg)
}
