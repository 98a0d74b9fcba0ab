//! SM assignment (`lower::sm`) and page allocation (`lower::pages`) tests. The programs are
//! built by hand with the core API: decode-shaped programs (tiled GEMV groups sharing one
//! counter, split-KV fan-in joins, chains of layer-like blocks) and seeded random DAGs. Every
//! result is checked against the validator and against properties computed here
//! independently: per-SM queues are linear extensions, and a brute-force happens-before
//! relation (DFS over the dependency edges) shows that buffers sharing a page never overlap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::{Map, Value};
use amk_core::sim::SplitMix;
use amk_core::{
    BufferId, BufferKind, CounterId, DType, GpuTarget, MemSpace, Opcode, PageStrategy, Program,
    Registry, ScheduleConfig, SmAssignment, TaskId, Tensor, WeightStore,
};
use amk_model_llama::ModelError;
use amk_model_llama::config::{ModelConfig, RopeScaling};
use amk_model_llama::lower::pages::{PAGE_ALIGN, PageStats, allocate_pages};
use amk_model_llama::lower::sm::{
    Reserve, assign_sms, assign_sms_reserving, estimated_makespan, sm_loads,
};
use amk_model_llama::lower::{LowerOptions, lower};
use amk_model_llama::model::{Model, ModelFormat, tensor_names};
use std::time::Instant;

// ---- program builders ------------------------------------------------------------------------

fn registry() -> Registry {
    amk_ops::registry().unwrap()
}

fn prm(kv: &[(&str, Value)]) -> Map {
    let mut m = Map::new();
    for (k, v) in kv {
        m.insert(*k, v.clone());
    }
    m
}

fn int(v: u64) -> Value {
    Value::Int(v as i64)
}

/// Shape of a hand-built decode program.
#[derive(Debug, Clone)]
struct Shape {
    layers: usize,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    inter: u64,
    vocab: u64,
    /// GEMV tile width (at most 64 tiles per projection, as in the reference).
    n_tile: u64,
    /// Split-KV shards per layer (1 = one attention task).
    shards: u64,
    /// Decode position (the KV length is `pos + 1`).
    pos: u64,
    dtype: DType,
}

impl Shape {
    fn toy() -> Shape {
        Shape {
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            inter: 128,
            vocab: 256,
            n_tile: 16,
            shards: 1,
            pos: 5,
            dtype: DType::F32,
        }
    }
    /// SmolLM2-135M: 30 layers, H 576, 9/3 heads × 64, I 1536, V 49152; at N_tile 128 the
    /// reference lowering has 1716 tasks.
    fn smollm2() -> Shape {
        Shape {
            layers: 30,
            hidden: 576,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            inter: 1536,
            vocab: 49152,
            n_tile: 128,
            shards: 1,
            pos: 100,
            dtype: DType::BF16,
        }
    }
    /// Llama-3-70B's shape at N_tile 256: about 20,000 tasks.
    fn llama70b() -> Shape {
        Shape {
            layers: 80,
            hidden: 8192,
            heads: 64,
            kv_heads: 8,
            head_dim: 128,
            inter: 28672,
            vocab: 128256,
            n_tile: 256,
            shards: 1,
            pos: 100,
            dtype: DType::BF16,
        }
    }
}

struct Builder {
    p: Program,
    dtype: DType,
    dbytes: i64,
    n_tile: u64,
}

impl Builder {
    fn act(&mut self, name: String, shape: &[u64]) -> BufferId {
        self.p
            .new_buffer(name, BufferKind::ACTIVATION, self.dtype, shape)
    }
    fn weight(&mut self, name: String, shape: &[u64]) -> BufferId {
        self.p.new_weight(name.clone(), self.dtype, shape, name)
    }
    #[allow(clippy::too_many_arguments)]
    fn task(
        &mut self,
        op: Opcode,
        ins: &[BufferId],
        outs: &[BufferId],
        ctr: CounterId,
        waits: &[(CounterId, i64)],
        params: Map,
        label: String,
        bytes: i64,
        flops: i64,
    ) -> TaskId {
        let t = self.p.push_task(op, ins, outs, ctr, waits, params, label);
        self.p.tasks[t as usize].est_bytes = bytes;
        self.p.tasks[t as usize].est_flops = flops;
        t
    }
    /// One counter-sharing group of GEMV tiles `out[1, n] = x[1, k] @ w[n, k]^T`; returns the
    /// wait a consumer needs (all tiles).
    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &mut self,
        x: BufferId,
        xw: &[(CounterId, i64)],
        w: BufferId,
        out: BufferId,
        k: u64,
        n: u64,
        label: &str,
    ) -> (CounterId, i64) {
        let c = self.p.new_counter(format!("{label} done"));
        let mut width = self.n_tile.min(n).max(1);
        if n.div_ceil(width) > 64 {
            width = n.div_ceil(64);
        }
        let (mut off, mut i) = (0u64, 0i64);
        while off < n {
            let nt = width.min(n - off);
            self.task(
                Opcode::GEMV_TILE,
                &[x, w],
                &[out],
                c,
                xw,
                prm(&[("K", int(k)), ("N_tile", int(nt)), ("n_off", int(off))]),
                format!("{label}[{i}]"),
                (k * nt) as i64 * self.dbytes,
                (2 * k * nt) as i64,
            );
            off += nt;
            i += 1;
        }
        (c, i)
    }
    #[allow(clippy::too_many_arguments)]
    fn single(
        &mut self,
        op: Opcode,
        ins: &[BufferId],
        out: BufferId,
        waits: &[(CounterId, i64)],
        params: Map,
        label: String,
        bytes: i64,
    ) -> (CounterId, i64) {
        let c = self.p.new_counter(format!("{label} done"));
        self.task(op, ins, &[out], c, waits, params, label, bytes, 0);
        (c, 1)
    }
}

/// A single-token decode program shaped like the reference lowering (docs/models.md, "The
/// reference lowering"), tasks in a topological order.
fn decode(s: &Shape) -> Program {
    let dbytes = (s.dtype.bits() / 8).max(1) as i64;
    let mut b = Builder {
        p: Program::new(),
        dtype: s.dtype,
        dbytes,
        n_tile: s.n_tile,
    };
    let (h, hd, nh, nkv) = (s.hidden, s.head_dim, s.heads, s.kv_heads);
    let (q_dim, kv_dim) = (nh * hd, nkv * hd);
    let kv_len = s.pos + 1;
    let max_seq = kv_len.max(256);
    let token =
        b.p.new_buffer("token_id", BufferKind::IO_INPUT, DType::I32, &[1]);
    let posb =
        b.p.new_buffer("pos", BufferKind::IO_INPUT, DType::I32, &[1]);
    let rid =
        b.p.new_buffer("reshape_id0", BufferKind::IO_INPUT, DType::I32, &[1]);
    let table = b.weight("embed.weight".into(), &[s.vocab, h]);
    let h0 = b.act("h0".into(), &[1, h]);
    let mut resid_w = b.single(
        Opcode::EMBED,
        &[token, table],
        h0,
        &[],
        prm(&[("hidden", int(h))]),
        "embed".into(),
        h as i64 * dbytes,
    );
    let mut resid = h0;
    let eps = Value::Float(1e-6);
    let theta = Value::Float(10000.0);
    for l in 0..s.layers {
        let w = |n: &str| format!("layers.{l}.{n}");
        let in_norm = b.weight(w("input_norm"), &[h]);
        let wq = b.weight(w("q"), &[q_dim, h]);
        let wk = b.weight(w("k"), &[kv_dim, h]);
        let wv = b.weight(w("v"), &[kv_dim, h]);
        let wo = b.weight(w("o"), &[h, q_dim]);
        let post_norm = b.weight(w("post_norm"), &[h]);
        let wg = b.weight(w("gate"), &[s.inter, h]);
        let wu = b.weight(w("up"), &[s.inter, h]);
        let wd = b.weight(w("down"), &[h, s.inter]);
        let an = b.act(format!("L{l}.an"), &[1, h]);
        let an_w = b.single(
            Opcode::RMSNORM,
            &[resid, in_norm],
            an,
            &[resid_w],
            prm(&[("eps", eps.clone()), ("hidden", int(h))]),
            format!("L{l}.norm1"),
            h as i64 * dbytes,
        );
        let q = b.act(format!("L{l}.q"), &[1, q_dim]);
        let k = b.act(format!("L{l}.k"), &[1, kv_dim]);
        let v = b.act(format!("L{l}.v"), &[1, kv_dim]);
        let q_w = b.gemv(an, &[an_w], wq, q, h, q_dim, &format!("L{l}.q"));
        let k_w = b.gemv(an, &[an_w], wk, k, h, kv_dim, &format!("L{l}.k"));
        let v_w = b.gemv(an, &[an_w], wv, v, h, kv_dim, &format!("L{l}.v"));
        let qh = b.act(format!("L{l}.qh"), &[nh, hd]);
        let qh_w = b.single(
            Opcode::EMBED,
            &[rid, q],
            qh,
            &[q_w],
            prm(&[("hidden", int(q_dim))]),
            format!("L{l}.reshape_q"),
            0,
        );
        let qr = b.act(format!("L{l}.qr"), &[nh, hd]);
        let qr_w = b.single(
            Opcode::ROPE,
            &[qh, posb],
            qr,
            &[qh_w],
            prm(&[("head_dim", int(hd)), ("theta", theta.clone())]),
            format!("L{l}.rope_q"),
            0,
        );
        let kh = b.act(format!("L{l}.kh"), &[1, nkv, hd]);
        let kh_w = b.single(
            Opcode::EMBED,
            &[rid, k],
            kh,
            &[k_w],
            prm(&[("hidden", int(kv_dim))]),
            format!("L{l}.reshape_k"),
            0,
        );
        let kr = b.act(format!("L{l}.kr"), &[1, nkv, hd]);
        let kr_w = b.single(
            Opcode::ROPE,
            &[kh, posb],
            kr,
            &[kh_w],
            prm(&[("head_dim", int(hd)), ("theta", theta.clone())]),
            format!("L{l}.rope_k"),
            0,
        );
        let kc = b.p.new_buffer(
            format!("L{l}.kcache"),
            BufferKind::KV_CACHE,
            s.dtype,
            &[max_seq, nkv, hd],
        );
        let vc = b.p.new_buffer(
            format!("L{l}.vcache"),
            BufferKind::KV_CACHE,
            s.dtype,
            &[max_seq, nkv, hd],
        );
        let kk_w = b.single(
            Opcode::KV_APPEND,
            &[kr, kc],
            kc,
            &[kr_w],
            prm(&[("pos", int(s.pos))]),
            format!("L{l}.append_k"),
            kv_dim as i64 * dbytes,
        );
        let vv_w = b.single(
            Opcode::KV_APPEND,
            &[v, vc],
            vc,
            &[v_w],
            prm(&[("pos", int(s.pos))]),
            format!("L{l}.append_v"),
            kv_dim as i64 * dbytes,
        );
        let attn = b.act(format!("L{l}.attn"), &[1, q_dim]);
        let att_waits = [qr_w, kk_w, vv_w];
        let scale = Value::Float(1.0 / (hd as f64).sqrt());
        let att_bytes = 2 * (kv_len * kv_dim) as i64 * dbytes;
        let attn_w = if s.shards <= 1 {
            b.single(
                Opcode::ATTENTION_TILE,
                &[qr, kc, vc],
                attn,
                &att_waits,
                prm(&[
                    ("head_dim", int(hd)),
                    ("kv_start", int(0)),
                    ("kv_len", int(kv_len)),
                    ("scale", scale.clone()),
                    ("n_heads", int(nh)),
                    ("n_kv_heads", int(nkv)),
                ]),
                format!("L{l}.attention"),
                att_bytes,
            )
        } else {
            // Split-KV: shards with their own counters, joined by one combine.
            let size = kv_len.div_ceil(s.shards);
            let (mut parts, mut waits) = (Vec::new(), Vec::new());
            let mut i = 0;
            while i * size < kv_len {
                let len = size.min(kv_len - i * size);
                let part = b.act(format!("L{l}.part{i}"), &[nh, hd + 2]);
                let w = b.single(
                    Opcode::ATTENTION_TILE,
                    &[qr, kc, vc],
                    part,
                    &att_waits,
                    prm(&[
                        ("head_dim", int(hd)),
                        ("kv_start", int(i * size)),
                        ("kv_len", int(len)),
                        ("scale", scale.clone()),
                        ("n_heads", int(nh)),
                        ("n_kv_heads", int(nkv)),
                        ("flags", int(2)),
                    ]),
                    format!("L{l}.shard{i}"),
                    att_bytes / s.shards as i64,
                );
                parts.push(part);
                waits.push(w);
                i += 1;
            }
            b.single(
                Opcode::ATTENTION_COMBINE,
                &parts,
                attn,
                &waits,
                prm(&[
                    ("head_dim", int(hd)),
                    ("n_heads", int(nh)),
                    ("n_kv_heads", int(nkv)),
                ]),
                format!("L{l}.combine"),
                0,
            )
        };
        let o = b.act(format!("L{l}.o"), &[1, h]);
        let o_w = b.gemv(attn, &[attn_w], wo, o, q_dim, h, &format!("L{l}.o"));
        let hm = b.act(format!("L{l}.h_mid"), &[1, h]);
        let hm_w = b.single(
            Opcode::ADD,
            &[resid, o],
            hm,
            &[resid_w, o_w],
            Map::new(),
            format!("L{l}.add1"),
            0,
        );
        let mn = b.act(format!("L{l}.mn"), &[1, h]);
        let mn_w = b.single(
            Opcode::RMSNORM,
            &[hm, post_norm],
            mn,
            &[hm_w],
            prm(&[("eps", eps.clone()), ("hidden", int(h))]),
            format!("L{l}.norm2"),
            h as i64 * dbytes,
        );
        let gate = b.act(format!("L{l}.gate"), &[1, s.inter]);
        let up = b.act(format!("L{l}.up"), &[1, s.inter]);
        let g_w = b.gemv(mn, &[mn_w], wg, gate, h, s.inter, &format!("L{l}.gate"));
        let u_w = b.gemv(mn, &[mn_w], wu, up, h, s.inter, &format!("L{l}.up"));
        let act = b.act(format!("L{l}.act"), &[1, s.inter]);
        let act_w = b.single(
            Opcode::SILU_MUL,
            &[gate, up],
            act,
            &[g_w, u_w],
            Map::new(),
            format!("L{l}.swiglu"),
            0,
        );
        let down = b.act(format!("L{l}.down"), &[1, h]);
        let d_w = b.gemv(act, &[act_w], wd, down, s.inter, h, &format!("L{l}.down"));
        let ho = b.act(format!("L{l}.h_out"), &[1, h]);
        resid_w = b.single(
            Opcode::ADD,
            &[hm, down],
            ho,
            &[hm_w, d_w],
            Map::new(),
            format!("L{l}.add2"),
            0,
        );
        resid = ho;
    }
    let fnorm = b.weight("final_norm".into(), &[h]);
    let hf = b.act("hf".into(), &[1, h]);
    let hf_w = b.single(
        Opcode::RMSNORM,
        &[resid, fnorm],
        hf,
        &[resid_w],
        prm(&[("eps", eps), ("hidden", int(h))]),
        "final_norm".into(),
        h as i64 * dbytes,
    );
    let lm = b.weight("lm_head".into(), &[s.vocab, h]);
    let logits =
        b.p.new_buffer("logits", BufferKind::IO_OUTPUT, s.dtype, &[1, s.vocab]);
    b.gemv(hf, &[hf_w], lm, logits, h, s.vocab, "lm_head");
    b.p
}

/// A seeded random DAG of ADD/COPY tasks over `[1, 64]` F32 activations. Each buffer has one
/// writer. Some tasks form fan-in groups that share a counter, and their consumers wait for
/// the whole group. Readers wait on their inputs' counters, some dead ends are never read,
/// and tasks are in a topological order.
fn random_dag(seed: u64, n: usize) -> Program {
    let mut rng = SplitMix(seed ^ 0x5EED);
    let mut p = Program::new();
    let src = p.new_buffer("src", BufferKind::IO_INPUT, DType::F32, &[1, 64]);
    // (buffer, its counter, that counter's producer count)
    let mut made: Vec<(BufferId, CounterId, i64)> = Vec::new();
    let mut i = 0;
    while i < n {
        let group = if rng.next().is_multiple_of(6) {
            2 + (rng.next() % 3) as usize
        } else {
            1
        };
        let c = p.new_counter(format!("c{i}"));
        // Inputs come from earlier groups only (a task never waits on its own counter).
        let earlier = made.len();
        for _ in 0..group.min(n - i) {
            // Inputs: mostly recent buffers (local structure), sometimes far ones.
            let pick = |rng: &mut SplitMix, made: &[(BufferId, CounterId, i64)]| {
                if made.is_empty() || rng.next().is_multiple_of(8) {
                    None
                } else {
                    let span = if rng.next().is_multiple_of(4) {
                        made.len()
                    } else {
                        made.len().min(12)
                    };
                    Some(made[made.len() - 1 - (rng.next() as usize % span)])
                }
            };
            let a = pick(&mut rng, &made[..earlier]);
            let bsel = if rng.next().is_multiple_of(2) {
                pick(&mut rng, &made[..earlier])
            } else {
                None
            };
            let out = p.new_buffer(
                format!("b{i}"),
                BufferKind::ACTIVATION,
                DType::F32,
                &[1, 64],
            );
            let mut waits: Vec<(CounterId, i64)> = Vec::new();
            for x in [a, bsel].into_iter().flatten() {
                if !waits.iter().any(|w| w.0 == x.1) {
                    waits.push((x.1, x.2));
                }
            }
            let ina = a.map_or(src, |x| x.0);
            let t = match bsel {
                Some(y) => p.push_task(
                    Opcode::ADD,
                    &[ina, y.0],
                    &[out],
                    c,
                    &waits,
                    Map::new(),
                    format!("t{i}"),
                ),
                None => p.push_task(
                    Opcode::COPY,
                    &[ina],
                    &[out],
                    c,
                    &waits,
                    Map::new(),
                    format!("t{i}"),
                ),
            };
            p.tasks[t as usize].est_bytes = 256 + (rng.next() % 4096) as i64;
            made.push((out, c, 0));
            i += 1;
        }
        // Fix up the group's producer count now that it is known.
        let produced = p.tasks.iter().filter(|t| t.out_counter == c).count() as i64;
        for m in made.iter_mut().filter(|m| m.1 == c) {
            m.2 = produced;
        }
    }
    p
}

// ---- independent checks ----------------------------------------------------------------------

/// `hb[u][v]`: u is a strict ancestor of v (DFS over the dependency edges).
fn brute_hb(p: &Program) -> Vec<Vec<bool>> {
    let n = p.tasks.len();
    let mut succ = vec![Vec::new(); n];
    for (a, b) in p.dependency_edges() {
        succ[a as usize].push(b as usize);
    }
    (0..n)
        .map(|u| {
            let mut seen = vec![false; n];
            let mut stack = succ[u].clone();
            while let Some(v) = stack.pop() {
                if !seen[v] {
                    seen[v] = true;
                    stack.extend(succ[v].iter().copied());
                }
            }
            seen
        })
        .collect()
}

fn users(p: &Program, b: BufferId) -> Vec<TaskId> {
    p.tasks
        .iter()
        .filter(|t| t.inputs.contains(&b) || t.outputs.contains(&b))
        .map(|t| t.id)
        .collect()
}

fn writers(p: &Program, b: BufferId) -> Vec<TaskId> {
    p.tasks
        .iter()
        .filter(|t| t.outputs.contains(&b))
        .map(|t| t.id)
        .collect()
}

fn validate_ok(p: &Program, what: &str) {
    let r = amk_core::validate(p, &registry());
    assert!(r.ok(), "{what}: {:#?}", r.errors);
}

/// Each SM queue (task-list order) is a linear extension: for every dependency edge between
/// two tasks on the same SM, the producer comes first.
fn assert_queues_linear(p: &Program, num_sms: u32) {
    let mut pos_in_queue = vec![0usize; p.tasks.len()];
    let mut next = vec![0usize; num_sms as usize];
    for t in &p.tasks {
        let s = t.sm.expect("every task has an SM");
        assert!(s >= 0 && (s as u32) < num_sms, "task {} on SM {s}", t.id);
        pos_in_queue[t.id as usize] = next[s as usize];
        next[s as usize] += 1;
    }
    for (a, b) in p.dependency_edges() {
        let (ta, tb) = (&p.tasks[a as usize], &p.tasks[b as usize]);
        if ta.sm == tb.sm {
            assert!(
                pos_in_queue[a as usize] < pos_in_queue[b as usize],
                "SM {:?}: {a} must precede {b}",
                ta.sm
            );
        }
    }
}

/// The page table is well formed and no two buffers on one page are live at once.
fn assert_pages_sound(p: &Program) {
    let Some(pa) = &p.pages else { return };
    let hb = brute_hb(p);
    let mut seen = vec![false; p.buffers.len()];
    let mut members: Vec<Vec<BufferId>> = vec![Vec::new(); pa.pages.len()];
    for (i, pg) in pa.pages.iter().enumerate() {
        assert_eq!(pg.id as usize, i);
        assert_eq!(pg.nbytes % PAGE_ALIGN, 0);
    }
    for &(b, pg) in &pa.buffer_to_page {
        let buf = &p.buffers[b as usize];
        assert_eq!(buf.kind, BufferKind::ACTIVATION, "{} paged", buf.name);
        assert!(!seen[b as usize], "buffer {b} bound twice");
        seen[b as usize] = true;
        assert!(pa.pages[pg as usize].nbytes >= buf.nbytes());
        members[pg as usize].push(b);
    }
    let before = |a: BufferId, b: BufferId| {
        let ua = users(p, a);
        writers(p, b)
            .iter()
            .all(|&w| ua.iter().all(|&u| hb[u as usize][w as usize]))
    };
    for m in &members {
        for (i, &a) in m.iter().enumerate() {
            for &b in &m[i + 1..] {
                assert!(
                    before(a, b) || before(b, a),
                    "buffers {a} ('{}') and {b} ('{}') share a page but are live together",
                    p.buffers[a as usize].name,
                    p.buffers[b as usize].name
                );
            }
        }
    }
}

fn h100() -> GpuTarget {
    GpuTarget::by_name("h100").unwrap()
}

fn with_target(mut p: Program) -> Program {
    p.target = Some(h100());
    p
}

fn lower_err(r: Result<(), ModelError>) -> String {
    match r {
        Err(ModelError::Lower(m)) => m,
        other => panic!("expected a lowering error, got {other:?}"),
    }
}

// ---- SM assignment ---------------------------------------------------------------------------

#[test]
fn round_robin_is_list_position_mod_sms_and_validates() {
    for s in [
        Shape::toy(),
        Shape {
            shards: 4,
            ..Shape::toy()
        },
    ] {
        for num_sms in [1u32, 3, 7, 132] {
            let mut p = with_target(decode(&s));
            assign_sms(&mut p, &SmAssignment::RoundRobin, num_sms).unwrap();
            for (i, t) in p.tasks.iter().enumerate() {
                assert_eq!(t.sm, Some((i % num_sms as usize) as i32));
            }
            assert_queues_linear(&p, num_sms);
            validate_ok(&p, &format!("round robin on {num_sms} SMs"));
        }
    }
}

#[test]
fn load_balance_validates_and_balances_bytes() {
    let shapes = [
        Shape::toy(),
        Shape {
            shards: 3,
            ..Shape::toy()
        },
        Shape {
            layers: 30,
            ..Shape::toy()
        },
        Shape::smollm2(),
    ];
    for s in shapes {
        for num_sms in [1u32, 4, 13, 132] {
            let mut p = with_target(decode(&s));
            assign_sms(&mut p, &SmAssignment::LoadBalance, num_sms).unwrap();
            assert_queues_linear(&p, num_sms);
            validate_ok(
                &p,
                &format!("load balance, {} layers, {num_sms} SMs", s.layers),
            );
            let loads = sm_loads(&p, num_sms);
            assert_eq!(
                loads.iter().map(|l| l.tasks).sum::<u64>(),
                p.tasks.len() as u64
            );
            let total: u64 = loads.iter().map(|l| l.bytes).sum();
            let largest = p.tasks.iter().map(|t| t.est_bytes as u64).max().unwrap();
            let max = loads.iter().map(|l| l.bytes).max().unwrap();
            let ideal = total.div_ceil(u64::from(num_sms)).max(largest);
            // List scheduling keeps every SM within one largest task of the mean; allow a
            // factor 2 on the larger of the two for the phases' structure.
            assert!(
                max <= 2 * ideal,
                "{} layers, {num_sms} SMs: max load {max} vs ideal {ideal}",
                s.layers
            );
        }
    }
}

#[test]
fn load_balance_spreads_each_projection_and_beats_round_robin_in_the_model() {
    let s = Shape::smollm2();
    let num_sms = 132u32;
    let mut lb = with_target(decode(&s));
    assign_sms(&mut lb, &SmAssignment::LoadBalance, num_sms).unwrap();
    // Every tile group (a counter with several producers) with at most num_sms tiles is on
    // distinct SMs.
    let idx = lb.counter_index();
    for c in 0..lb.counters.len() as u32 {
        let prods = idx.producers(c);
        if prods.len() < 2 || prods.len() > num_sms as usize {
            continue;
        }
        let mut sms: Vec<i32> = prods
            .iter()
            .map(|&t| lb.tasks[t as usize].sm.unwrap())
            .collect();
        sms.sort_unstable();
        sms.dedup();
        assert_eq!(sms.len(), prods.len(), "counter {c}: tiles share an SM");
    }
    let mut rr = with_target(decode(&s));
    assign_sms(&mut rr, &SmAssignment::RoundRobin, num_sms).unwrap();
    let (m_lb, m_rr) = (
        estimated_makespan(&lb).unwrap(),
        estimated_makespan(&rr).unwrap(),
    );
    eprintln!("SmolLM2 shape, 132 SMs: modelled makespan load_balance {m_lb}, round_robin {m_rr}");
    assert!(m_lb <= m_rr, "load balance {m_lb} > round robin {m_rr}");

    // On a small GPU (more tiles than SMs), the model still favours load balancing.
    for n in [8u32, 40] {
        let mut lb = decode(&s);
        let mut rr = decode(&s);
        assign_sms(&mut lb, &SmAssignment::LoadBalance, n).unwrap();
        assign_sms(&mut rr, &SmAssignment::RoundRobin, n).unwrap();
        let (a, b) = (
            estimated_makespan(&lb).unwrap(),
            estimated_makespan(&rr).unwrap(),
        );
        eprintln!("{n} SMs: load_balance {a}, round_robin {b}");
        assert!(a <= b);
    }
}

/// A decode layer's single attention task becomes ready while every SM is idle; opcode
/// affinity then keeps all layers' attention on one SM (its instruction cache stays warm).
#[test]
fn load_balance_keeps_every_layers_attention_on_one_sm() {
    let mut lb = with_target(decode(&Shape::smollm2()));
    assign_sms(&mut lb, &SmAssignment::LoadBalance, 132).unwrap();
    let att: Vec<i32> = lb
        .tasks
        .iter()
        .filter(|t| t.op == Opcode::ATTENTION_TILE)
        .map(|t| t.sm.unwrap())
        .collect();
    assert!(att.len() > 1, "one attention task per layer");
    assert!(att.iter().all(|&s| s == att[0]), "attention SMs {att:?}");
}

/// SMs reserved for attention run every attention task (split-KV shards and combines too)
/// and nothing else, under round robin and load balancing; the queues stay linear extensions
/// and the program validates. Reserving the whole grid is refused.
#[test]
fn reserved_sms_run_only_their_ops() {
    let reserve = |sms: u32| Reserve {
        ops: vec![Opcode::ATTENTION_TILE, Opcode::ATTENTION_COMBINE],
        sms,
        alternate: false,
    };
    for s in [
        Shape::smollm2(),
        Shape {
            shards: 4,
            ..Shape::toy()
        },
    ] {
        for (num_sms, own) in [(132u32, 1u32), (132, 3), (7, 2), (2, 1)] {
            for st in [SmAssignment::RoundRobin, SmAssignment::LoadBalance] {
                let mut p = with_target(decode(&s));
                assign_sms_reserving(&mut p, &st, num_sms, &reserve(own)).unwrap();
                let what = format!("{} layers, {num_sms} SMs, {own} reserved, {st:?}", s.layers);
                let mut used = vec![false; num_sms as usize];
                for t in &p.tasks {
                    let sm = t.sm.unwrap() as u32;
                    used[sm as usize] = true;
                    let att = t.op == Opcode::ATTENTION_TILE || t.op == Opcode::ATTENTION_COMBINE;
                    assert_eq!(sm >= num_sms - own, att, "{what}: task {} on SM {sm}", t.id);
                }
                // Several attention tasks per layer spread over the reserved SMs.
                if s.shards > 1 {
                    assert!(
                        used[(num_sms - own) as usize..].iter().all(|&u| u),
                        "{what}"
                    );
                }
                assert_queues_linear(&p, num_sms);
                validate_ok(&p, &what);
            }
        }
    }
    // Nothing reserved: exactly assign_sms.
    let mut a = with_target(decode(&Shape::smollm2()));
    let mut b = a.clone();
    assign_sms(&mut a, &SmAssignment::LoadBalance, 132).unwrap();
    assign_sms_reserving(&mut b, &SmAssignment::LoadBalance, 132, &reserve(0)).unwrap();
    assert_eq!(a, b);
    let mut p = with_target(decode(&Shape::toy()));
    let msg = lower_err(assign_sms_reserving(
        &mut p,
        &SmAssignment::LoadBalance,
        4,
        &reserve(4),
    ));
    assert!(msg.contains("leaves none"), "{msg}");
    // An on-chip buffer between an attention task and its producer: they must share an SM,
    // which the reservation forbids, so it is refused (an explicit map is taken as given).
    let mut p = with_target(decode(&Shape::toy()));
    for b in &mut p.buffers {
        if b.name == "L0.qr" {
            b.space = MemSpace::SMEM;
        }
    }
    for st in [SmAssignment::RoundRobin, SmAssignment::LoadBalance] {
        let msg = lower_err(assign_sms_reserving(&mut p.clone(), &st, 8, &reserve(1)));
        assert!(msg.contains("share an on-chip buffer"), "{msg}");
    }
}

#[test]
fn load_balance_without_waits_is_plain_lpt() {
    // Independent tasks, bytes 10, 9, ..., 1 on 3 SMs: the greedy must match LPT by hand.
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 64]);
    let costs = [10i64, 9, 8, 7, 6, 5, 4, 3, 2, 1];
    for (i, &c) in costs.iter().enumerate() {
        let o = p.new_buffer(
            format!("o{i}"),
            BufferKind::ACTIVATION,
            DType::F32,
            &[1, 64],
        );
        let ctr = p.new_counter("");
        let t = p.push_task(Opcode::COPY, &[x], &[o], ctr, &[], Map::new(), "");
        // Large enough that the fixed overhead does not change the order.
        p.tasks[t as usize].est_bytes = c * 1_000_000;
    }
    assign_sms(&mut p, &SmAssignment::LoadBalance, 3).unwrap();
    let mut load = [0i64; 3];
    let mut want = Vec::new();
    for &c in &costs {
        let s = (0..3).min_by_key(|&s| (load[s], s)).unwrap();
        load[s] += c * 1_000_000;
        want.push(Some(s as i32));
    }
    let got: Vec<Option<i32>> = p.tasks.iter().map(|t| t.sm).collect();
    assert_eq!(got, want);
    validate_ok(&p, "independent tasks");
}

#[test]
fn explicit_map_is_applied_and_checked() {
    let s = Shape::toy();
    let mut p = with_target(decode(&s));
    let n = p.tasks.len() as u32;
    // A valid map: every task, SM = (n - 1 - i) % 5, listed in reverse.
    let map: Vec<(u32, u32)> = (0..n).rev().map(|i| (i, (n - 1 - i) % 5)).collect();
    assign_sms(&mut p, &SmAssignment::Explicit(map), 5).unwrap();
    for t in &p.tasks {
        assert_eq!(t.sm, Some(((n - 1 - t.id) % 5) as i32));
    }
    validate_ok(&p, "explicit");

    // Broken maps: p is left unchanged and the message lists every kind of problem.
    let fresh = with_target(decode(&s));
    let mut q = fresh.clone();
    let mut bad: Vec<(u32, u32)> = (0..n).filter(|&i| i % 3 != 0).map(|i| (i, 0)).collect();
    bad.push((1, 0)); // duplicate
    bad.push((2, 9)); // duplicate and out of range
    bad.push((n + 4, 0)); // unknown task
    let msg = lower_err(assign_sms(&mut q, &SmAssignment::Explicit(bad), 5));
    assert_eq!(q, fresh, "a failed assignment must not touch the program");
    let unmapped = n.div_ceil(3);
    assert!(
        msg.contains(&format!("{unmapped} task(s) unmapped: 0, 3, 6")),
        "{msg}"
    );
    assert!(msg.contains("more"), "{msg}"); // more than 10 unmapped
    assert!(msg.contains("2 extra entr"), "{msg}");
    assert!(
        msg.contains("out of range") && msg.contains("task 2 → SM 9"),
        "{msg}"
    );
    assert!(msg.contains(&format!("{}", n + 4)), "{msg}");

    let mut q = fresh.clone();
    let all: Vec<(u32, u32)> = (0..n).map(|i| (i, 7)).collect();
    let msg = lower_err(assign_sms(&mut q, &SmAssignment::Explicit(all), 5));
    assert!(msg.contains(&format!("{n} SM(s) out of range")), "{msg}");
}

#[test]
fn bad_grids_and_unsorted_lists_are_refused() {
    let mut p = with_target(decode(&Shape::toy()));
    for st in [
        SmAssignment::RoundRobin,
        SmAssignment::LoadBalance,
        SmAssignment::Explicit(vec![]),
    ] {
        assert!(lower_err(assign_sms(&mut p, &st, 0)).contains("num_sms is 0"));
        // More SMs than the target has.
        assert!(lower_err(assign_sms(&mut p, &st, 133)).contains("132 SMs"));
    }
    let mut q = decode(&Shape::toy());
    assert!(
        lower_err(assign_sms(&mut q, &SmAssignment::RoundRobin, u32::MAX)).contains("SM field")
    );
    // A consumer listed before its producer.
    let mut r = decode(&Shape::toy());
    r.tasks.swap(1, 2); // the first q tile now comes before the norm it waits on
    let r0 = r.clone();
    let msg = lower_err(assign_sms(&mut r, &SmAssignment::LoadBalance, 4));
    assert!(msg.contains("topological"), "{msg}");
    assert_eq!(r, r0);
}

#[test]
fn on_chip_buffers_keep_their_users_on_one_sm() {
    for st in [SmAssignment::RoundRobin, SmAssignment::LoadBalance] {
        let mut p = with_target(decode(&Shape::toy()));
        // Move the rope outputs on chip: their writer and readers must share an SM.
        let names = ["L0.qh", "L1.kr", "L0.act"];
        for b in &mut p.buffers {
            if names.contains(&b.name.as_str()) {
                b.space = MemSpace::SMEM;
            }
        }
        assign_sms(&mut p, &st, 17).unwrap();
        if st == SmAssignment::RoundRobin {
            // A task that starts a group (or has none) keeps its list position's SM.
            let firsts: Vec<usize> = (0..p.tasks.len())
                .filter(|&i| {
                    let mine: Vec<u32> = p.tasks[i]
                        .inputs
                        .iter()
                        .chain(&p.tasks[i].outputs)
                        .copied()
                        .collect();
                    !p.tasks[..i].iter().any(|t| {
                        t.inputs.iter().chain(&t.outputs).any(|b| {
                            mine.contains(b) && p.buffers[*b as usize].space == MemSpace::SMEM
                        })
                    })
                })
                .collect();
            assert!(firsts.len() > p.tasks.len() / 2);
            for i in firsts {
                assert_eq!(p.tasks[i].sm, Some((i % 17) as i32), "task {i}");
            }
        }
        for b in p.buffers.iter().filter(|b| b.space == MemSpace::SMEM) {
            let us = users(&p, b.id);
            assert!(us.len() >= 2);
            let s0 = p.tasks[us[0] as usize].sm;
            assert!(
                us.iter().all(|&u| p.tasks[u as usize].sm == s0),
                "{}",
                b.name
            );
        }
        validate_ok(&p, "on-chip co-location");
    }
}

#[test]
fn assignment_is_deterministic() {
    let s = Shape {
        shards: 2,
        ..Shape::smollm2()
    };
    for st in [SmAssignment::RoundRobin, SmAssignment::LoadBalance] {
        let mut a = decode(&s);
        let mut b = decode(&s);
        assign_sms(&mut a, &st, 132).unwrap();
        assign_sms(&mut b, &st, 132).unwrap();
        assert_eq!(a, b);
        // Re-assigning an assigned program gives the same result.
        let c0 = a.clone();
        assign_sms(&mut a, &st, 132).unwrap();
        assert_eq!(a, c0);
    }
}

#[test]
fn random_dags_assign_and_validate() {
    for seed in 0..12 {
        let p0 = random_dag(seed, 150 + 20 * seed as usize);
        validate_ok(&p0, "random dag");
        for (st, n) in [
            (SmAssignment::RoundRobin, 5u32),
            (SmAssignment::LoadBalance, 3),
            (SmAssignment::LoadBalance, 64),
        ] {
            let mut p = p0.clone();
            assign_sms(&mut p, &st, n).unwrap();
            assert_queues_linear(&p, n);
            validate_ok(&p, &format!("random dag {seed}, {st:?}"));
        }
    }
}

// ---- pages -----------------------------------------------------------------------------------

fn stats_of(p: &mut Program, st: PageStrategy) -> PageStats {
    allocate_pages(p, st).unwrap()
}

#[test]
fn none_and_linear_pages() {
    let mut p = decode(&Shape {
        shards: 3,
        ..Shape::toy()
    });
    let n_act = p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::ACTIVATION)
        .count();
    let s = stats_of(&mut p, PageStrategy::Linear);
    let pa = p.pages.clone().unwrap();
    assert_eq!(s.pages, n_act);
    assert_eq!(s.paged_buffers, n_act);
    assert_eq!(s.bytes_with_sharing, s.bytes_without_sharing);
    // One page per activation, in buffer order, sized to the buffer (rounded to PAGE_ALIGN).
    let acts: Vec<_> = p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::ACTIVATION)
        .collect();
    for (i, (&(b, pg), buf)) in pa.buffer_to_page.iter().zip(&acts).enumerate() {
        assert_eq!((b, pg as usize), (buf.id, i));
        assert_eq!(
            pa.pages[i].nbytes,
            buf.nbytes().div_ceil(PAGE_ALIGN) * PAGE_ALIGN
        );
    }
    assert_pages_sound(&p);
    validate_ok(&p, "linear pages");

    let s = stats_of(&mut p, PageStrategy::None);
    assert!(p.pages.is_none());
    assert_eq!(s.pages, 0);
    assert_eq!(s.bytes_with_sharing, s.bytes_without_sharing);
    validate_ok(&p, "no pages");
}

#[test]
fn graph_colour_shares_pages_soundly_on_decode_programs() {
    let shapes = [
        Shape::toy(),
        Shape {
            shards: 4,
            ..Shape::toy()
        },
        Shape {
            layers: 30,
            ..Shape::toy()
        },
        Shape {
            layers: 6,
            shards: 3,
            n_tile: 8,
            ..Shape::toy()
        },
    ];
    for s in shapes {
        let mut p = decode(&s);
        let lin = stats_of(&mut p.clone(), PageStrategy::Linear);
        let st = stats_of(&mut p, PageStrategy::GraphColor);
        eprintln!("{} layers, {} shards: {st:?}", s.layers, s.shards);
        assert_pages_sound(&p);
        validate_ok(&p, "graph colour");
        assert_eq!(st.bytes_without_sharing, lin.bytes_with_sharing);
        assert!(st.bytes_with_sharing < lin.bytes_with_sharing);
        let lb = st.lower_bound_bytes.unwrap();
        assert!(st.bytes_with_sharing >= lb);
        // On these chains of layers the greedy reaches the bound (or is very close).
        assert!(
            st.bytes_with_sharing as f64 <= 1.25 * lb as f64,
            "{} vs bound {lb}",
            st.bytes_with_sharing
        );
        // Memory does not grow with depth: pages are reused layer after layer.
        assert!(st.pages <= 12, "{} pages", st.pages);
        // Also valid together with every SM strategy.
        for sa in [SmAssignment::RoundRobin, SmAssignment::LoadBalance] {
            let mut q = with_target(p.clone());
            assign_sms(&mut q, &sa, 132).unwrap();
            validate_ok(&q, "graph colour + SMs");
        }
    }
}

/// The colouring's greedy rule, run here with the brute-force relation and no windows:
/// buffers by first writer (Kahn order), each on the free page needing no growth with the
/// fewest bytes, else the largest free page, else a new one. Returns the total page bytes.
fn exact_greedy_bytes(p: &Program) -> u64 {
    let hb = brute_hb(p);
    let order = amk_core::graph::topological_order(p).unwrap();
    let mut pos = vec![0usize; p.tasks.len()];
    for (i, &t) in order.iter().enumerate() {
        pos[t as usize] = i;
    }
    let mut bufs: Vec<(usize, BufferId)> = p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::ACTIVATION && !b.space.is_on_chip())
        .filter_map(|b| {
            let ws = writers(p, b.id);
            ws.iter().map(|&w| pos[w as usize]).min().map(|s| (s, b.id))
        })
        .collect();
    bufs.sort_unstable();
    let size = |b: BufferId| p.buffers[b as usize].nbytes().div_ceil(PAGE_ALIGN) * PAGE_ALIGN;
    let sep = |a: BufferId, b: BufferId| {
        let ua = users(p, a);
        writers(p, b)
            .iter()
            .all(|&w| ua.iter().all(|&u| hb[u as usize][w as usize]))
    };
    let mut pages: Vec<(u64, BufferId)> = Vec::new();
    for (_, b) in bufs {
        let need = size(b);
        let best = pages
            .iter()
            .enumerate()
            .filter(|(_, (_, last))| sep(*last, b))
            .min_by_key(|(i, (bytes, _))| {
                if *bytes >= need {
                    (false, *bytes, *i)
                } else {
                    (true, u64::MAX - *bytes, *i)
                }
            })
            .map(|(i, _)| i);
        match best {
            Some(i) => pages[i] = (pages[i].0.max(need), b),
            None => pages.push((need, b)),
        }
    }
    pages.iter().map(|pg| pg.0).sum()
}

#[test]
fn graph_colour_equals_the_unwindowed_greedy_on_decode_programs() {
    let shapes = [
        Shape::toy(),
        Shape {
            shards: 8,
            pos: 40,
            ..Shape::toy()
        },
        Shape {
            layers: 12,
            shards: 3,
            n_tile: 4,
            ..Shape::toy()
        },
        Shape {
            layers: 4,
            ..Shape::smollm2()
        },
    ];
    for s in shapes {
        let mut p = decode(&s);
        let want = exact_greedy_bytes(&p);
        let st = stats_of(&mut p, PageStrategy::GraphColor);
        assert_eq!(st.bytes_with_sharing, want, "{s:?}");
    }
}

#[test]
fn graph_colour_on_random_dags_matches_brute_force() {
    for seed in 0..16 {
        let mut p = random_dag(seed, 120 + 25 * seed as usize);
        let st = stats_of(&mut p, PageStrategy::GraphColor);
        assert_pages_sound(&p);
        validate_ok(&p, &format!("random dag {seed} pages"));
        assert!(st.bytes_with_sharing >= st.lower_bound_bytes.unwrap());
        assert!(st.bytes_with_sharing <= st.bytes_without_sharing);
        assert!(
            st.pages < st.paged_buffers,
            "seed {seed}: no sharing at all"
        );
    }
}

#[test]
fn buffers_live_together_never_share() {
    // Two parallel branches off one root, joined at the end: branch buffers are live at the
    // same time and must not share; the chain inside each branch may.
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 64]);
    let root = p.new_buffer("root", BufferKind::ACTIVATION, DType::F32, &[1, 64]);
    let c_root = p.new_counter("");
    p.push_task(Opcode::COPY, &[x], &[root], c_root, &[], Map::new(), "root");
    let mut tails = Vec::new();
    for br in 0..2 {
        let mut prev = (root, c_root);
        for i in 0..4 {
            let o = p.new_buffer(
                format!("b{br}.{i}"),
                BufferKind::ACTIVATION,
                DType::F32,
                &[1, 64],
            );
            let c = p.new_counter("");
            p.push_task(
                Opcode::COPY,
                &[prev.0],
                &[o],
                c,
                &[(prev.1, 1)],
                Map::new(),
                "",
            );
            prev = (o, c);
        }
        tails.push(prev);
    }
    let out = p.new_buffer("out", BufferKind::IO_OUTPUT, DType::F32, &[1, 64]);
    let c = p.new_counter("");
    p.push_task(
        Opcode::ADD,
        &[tails[0].0, tails[1].0],
        &[out],
        c,
        &[(tails[0].1, 1), (tails[1].1, 1)],
        Map::new(),
        "join",
    );
    let st = stats_of(&mut p, PageStrategy::GraphColor);
    assert_pages_sound(&p);
    validate_ok(&p, "branches");
    let pa = p.pages.as_ref().unwrap();
    let page = |name: &str| {
        let b = p.buffers.iter().find(|b| b.name == name).unwrap().id;
        pa.buffer_to_page.iter().find(|e| e.0 == b).unwrap().1
    };
    for i in 0..4 {
        for j in 0..4 {
            assert_ne!(page(&format!("b0.{i}")), page(&format!("b1.{j}")));
        }
    }
    // Each branch alternates two pages; the root overlaps with both branches' first buffers.
    assert_eq!(page("b0.0"), page("b0.2"));
    assert_eq!(page("b1.1"), page("b1.3"));
    assert_eq!(st.pages, 5, "{st:?}");
    // The interval bound sees at most three spans overlapping in one topological order; it
    // cannot tell that the branches never meet (5 pages are optimal here: the root's readers
    // include both branches' first tasks, so nothing later in either branch can reuse it).
    assert_eq!(st.lower_bound_bytes, Some(3 * 256));
}

#[test]
fn writer_less_and_on_chip_buffers() {
    let mut p = decode(&Shape::toy());
    let unused = p.new_buffer("unused", BufferKind::ACTIVATION, DType::F32, &[3, 5]);
    let smem = p.buffers.iter().position(|b| b.name == "L0.qh").unwrap();
    p.buffers[smem].space = MemSpace::SMEM;
    for st in [PageStrategy::Linear, PageStrategy::GraphColor] {
        let mut q = p.clone();
        allocate_pages(&mut q, st).unwrap();
        let pa = q.pages.as_ref().unwrap();
        assert!(
            pa.buffer_to_page.iter().all(|e| e.0 != smem as u32),
            "on-chip paged"
        );
        // The unused buffer has a page of its own.
        let pg = pa.buffer_to_page.iter().find(|e| e.0 == unused).unwrap().1;
        assert_eq!(pa.buffer_to_page.iter().filter(|e| e.1 == pg).count(), 1);
        assert_pages_sound(&q);
        // The on-chip buffer's users must share an SM for the program to validate.
        assign_sms(&mut q, &SmAssignment::LoadBalance, 8).unwrap();
        validate_ok(&q, "unused + on-chip");
    }
}

#[test]
fn pages_are_deterministic_and_replace_old_tables() {
    let s = Shape {
        shards: 2,
        layers: 5,
        ..Shape::toy()
    };
    let mut a = decode(&s);
    let mut b = decode(&s);
    let sa = stats_of(&mut a, PageStrategy::GraphColor);
    let sb = stats_of(&mut b, PageStrategy::GraphColor);
    assert_eq!((sa, &a), (sb, &b));
    // Running again over an already paged program gives the same table.
    let before = a.clone();
    stats_of(&mut a, PageStrategy::GraphColor);
    assert_eq!(a, before);
    // Linear replaces a graph-coloured table.
    stats_of(&mut a, PageStrategy::Linear);
    assert_eq!(a.pages.as_ref().unwrap().pages.len(), sa.paged_buffers);
}

#[test]
fn graph_colour_refuses_cycles_and_odd_ids() {
    let mut p = random_dag(3, 40);
    // Close a cycle: the first task waits on the last task's counter.
    let c = p.tasks.last().unwrap().out_counter;
    p.tasks[0].waits.push(amk_core::Wait {
        counter: c,
        threshold: 1,
    });
    let p0 = p.clone();
    assert!(matches!(
        allocate_pages(&mut p, PageStrategy::GraphColor),
        Err(ModelError::Lower(m)) if m.contains("acyclic")
    ));
    assert_eq!(p, p0);
    // Linear and None need no order.
    let st = allocate_pages(&mut p, PageStrategy::Linear).unwrap();
    assert_eq!(st.lower_bound_bytes, None);
    let mut q = random_dag(3, 40);
    q.tasks[5].id = 99;
    assert!(allocate_pages(&mut q, PageStrategy::Linear).is_err());
}

// ---- programs from the real lowering ----------------------------------------------------------

fn model_config(layers: usize, hidden: usize, heads: usize, kv: usize, hd: usize) -> ModelConfig {
    ModelConfig {
        hidden,
        n_heads: heads,
        n_kv_heads: kv,
        head_dim: hd,
        intermediate: hidden * 2,
        vocab: 256,
        n_layers: layers,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
        attention_bias: false,
        rope_scaling: RopeScaling::None,
        qk_norm: false,
    }
}

/// A model of the right shapes with zero weights (lowered, never run).
fn shaped_model(c: ModelConfig) -> Model {
    let mut w = WeightStore::new();
    for (name, shape) in tensor_names(&c) {
        w.insert(name, Tensor::zeros(DType::F32, &shape));
    }
    Model::new(c, w, None, "shaped", ModelFormat::Hf).unwrap()
}

fn schedule(sm: SmAssignment, pages: PageStrategy, n_tile: i64, parts: i64) -> ScheduleConfig {
    ScheduleConfig {
        tiling: vec![
            ("gemv".into(), vec![("N_tile".into(), n_tile)]),
            ("attention".into(), vec![("n_partitions".into(), parts)]),
        ],
        sm_assignment: sm,
        page_allocation: pages,
        ..ScheduleConfig::default()
    }
}

#[test]
fn lowered_toy_models_validate_under_every_strategy() {
    let reg = registry();
    for (layers, parts) in [(2, 1), (3, 4)] {
        let model = shaped_model(model_config(layers, 64, 4, 2, 16));
        let target = h100();
        let opts = LowerOptions {
            max_seq: Some(32),
            ..LowerOptions::default()
        };
        for sm in [SmAssignment::RoundRobin, SmAssignment::LoadBalance] {
            for pg in [
                PageStrategy::None,
                PageStrategy::Linear,
                PageStrategy::GraphColor,
            ] {
                let what = format!("{layers} layers, {parts} partitions, {sm:?}, {pg:?}");
                let l =
                    lower(&model, &schedule(sm.clone(), pg, 16, parts), &target, &opts).unwrap();
                let p = &l.program;
                let r = amk_core::validate(p, &reg);
                assert!(r.ok(), "{what}: {}", r.report());
                assert_queues_linear(p, target.num_sms as u32);
                assert_pages_sound(p);
                assert_eq!(p.pages.is_some(), pg != PageStrategy::None, "{what}");
                // The lowering's assignment is the one this module computes.
                let mut q = p.clone();
                assign_sms(&mut q, &sm, target.num_sms as u32).unwrap();
                assert_eq!(&q, p, "{what}");
                if pg == PageStrategy::GraphColor {
                    let st = l.page_stats.unwrap();
                    assert!(st.bytes_with_sharing < st.bytes_without_sharing, "{what}");
                    assert!(st.bytes_with_sharing >= st.lower_bound_bytes.unwrap());
                }
            }
        }
        // An explicit map (the reverse of round robin) goes through the lowering too.
        let base = lower(
            &model,
            &schedule(SmAssignment::RoundRobin, PageStrategy::None, 16, parts),
            &target,
            &opts,
        )
        .unwrap()
        .program;
        let n = base.tasks.len() as u32;
        let map: Vec<(u32, u32)> = (0..n).map(|i| (i, (n - 1 - i) % 7)).collect();
        let l = lower(
            &model,
            &schedule(
                SmAssignment::Explicit(map),
                PageStrategy::GraphColor,
                16,
                parts,
            ),
            &target,
            &opts,
        )
        .unwrap();
        assert!(
            l.program
                .tasks
                .iter()
                .all(|t| t.sm == Some(((n - 1 - t.id) % 7) as i32))
        );
        let r = amk_core::validate(&l.program, &reg);
        assert!(r.ok(), "explicit: {}", r.report());
    }
}

// ---- timing ----------------------------------------------------------------------------------

fn time<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t0 = Instant::now();
    let r = f();
    (r, t0.elapsed().as_secs_f64() * 1e3)
}

/// Prints timings on the SmolLM2-shaped decode program (about 1,700 tasks). Run with
/// `--release --nocapture` for numbers worth quoting.
#[test]
fn timing_smollm2_shape() {
    let s = Shape::smollm2();
    let p0 = with_target(decode(&s));
    let mut p = p0.clone();
    let (st, ms_pages) = time(|| allocate_pages(&mut p, PageStrategy::GraphColor).unwrap());
    let (_, ms_lb) = time(|| assign_sms(&mut p, &SmAssignment::LoadBalance, 132).unwrap());
    let (r, ms_val) = time(|| amk_core::validate(&p, &registry()));
    assert!(r.ok(), "{:#?}", r.errors);
    eprintln!(
        "SmolLM2 shape: {} tasks, {} buffers; graph_color {ms_pages:.2} ms ({st:?}), load_balance {ms_lb:.2} ms, validate {ms_val:.2} ms",
        p.tasks.len(),
        p.buffers.len()
    );
}

/// The ≈20,000-task program (Llama-3-70B shape). Ignored by default (slow in debug builds);
/// run with `cargo test --release --test schedule -- --ignored --nocapture`.
#[test]
#[ignore]
fn timing_20k_tasks() {
    let p0 = with_target(decode(&Shape::llama70b()));
    let mut p = p0.clone();
    let (st, ms_pages) = time(|| allocate_pages(&mut p, PageStrategy::GraphColor).unwrap());
    let (_, ms_lb) = time(|| assign_sms(&mut p, &SmAssignment::LoadBalance, 132).unwrap());
    let (r, ms_val) = time(|| amk_core::validate(&p, &registry()));
    assert!(r.ok(), "{:#?}", r.errors);
    eprintln!(
        "Llama-70B shape: {} tasks, {} buffers; graph_color {ms_pages:.2} ms ({st:?}), load_balance {ms_lb:.2} ms, validate {ms_val:.2} ms",
        p.tasks.len(),
        p.buffers.len()
    );
    // A 20k-task random DAG (one buffer per task, wide and irregular).
    let mut q = random_dag(7, 20_000);
    let (st, ms) = time(|| allocate_pages(&mut q, PageStrategy::GraphColor).unwrap());
    let (r, ms_val) = time(|| amk_core::validate(&q, &registry()));
    assert!(r.ok(), "{:#?}", r.errors);
    eprintln!("random DAG 20k: graph_color {ms:.2} ms ({st:?}), validate {ms_val:.2} ms");

    // The real lowering of the SmolLM2-135M shape at N_tile 128 (1716 tasks, zero weights).
    let mut c = model_config(30, 576, 9, 3, 64);
    c.intermediate = 1536;
    c.vocab = 49152;
    c.max_position_embeddings = 256;
    let model = shaped_model(c);
    let sc = schedule(SmAssignment::RoundRobin, PageStrategy::None, 128, 1);
    let p0 = lower(&model, &sc, &h100(), &LowerOptions::default())
        .unwrap()
        .program;
    let best = |f: &dyn Fn() -> f64| (0..5).map(|_| f()).fold(f64::INFINITY, f64::min);
    let ms_pages = best(&|| {
        let mut p = p0.clone();
        time(|| allocate_pages(&mut p, PageStrategy::GraphColor).unwrap()).1
    });
    let ms_lb = best(&|| {
        let mut p = p0.clone();
        time(|| assign_sms(&mut p, &SmAssignment::LoadBalance, 132).unwrap()).1
    });
    let mut p = p0.clone();
    let st = allocate_pages(&mut p, PageStrategy::GraphColor).unwrap();
    assign_sms(&mut p, &SmAssignment::LoadBalance, 132).unwrap();
    assert!(amk_core::validate(&p, &registry()).ok());
    eprintln!(
        "lowered SmolLM2-135M: {} tasks, {} buffers; graph_color best of 5 {ms_pages:.2} ms ({st:?}), load_balance best of 5 {ms_lb:.2} ms",
        p.tasks.len(),
        p.buffers.len()
    );
}
