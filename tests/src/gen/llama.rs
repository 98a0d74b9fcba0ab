//! A decode program shaped like the reference lowering (docs/models.md), and the benchmark
//! presets built from it. The real lowering (`amk_model_llama::lower`) gives the same tasks
//! under the reference schedule (`tests/tests/generator_vs_lowering.rs` holds them to it);
//! this one stays separate because its positions are params and its split-KV shards stop at
//! the position, which the soundness suite's programs and counts are built on.

use super::hb::Hb;
use super::params::{int, params};
use super::passes::colour_pages;
use super::rng::Rng;
use amk_core::json::{Map, Value};
use amk_core::{BufferId, BufferKind, CounterId, DType, GpuTarget, Opcode, Program, TaskId};

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
