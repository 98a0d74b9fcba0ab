//! The motif builder: a program under construction to which motifs (chains, joins, tiles,
//! attention) append tasks in topological order.

use super::params::{gelu_scale_recipe, int, params};
use super::rng::Rng;
use amk_core::json::{Map, Value};
use amk_core::{BufferId, BufferKind, CounterId, DType, Opcode, Program, TaskId};

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

    pub(super) fn numel(&self, b: BufferId) -> u64 {
        self.p.buffers.get(b as usize).map_or(1, |x| x.numel())
    }

    pub(super) fn last_dim(&self, b: BufferId) -> u64 {
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
