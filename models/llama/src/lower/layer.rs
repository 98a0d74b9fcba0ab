//! The decode program's shape and its layers: the sizes a lowering checks
//! ([`StepDims::check`]), what the schedule makes of the graph ([`Layout::of`]), and one
//! transformer layer as steps of the builder — the input norm, Q/K/V with RoPE and the cache
//! rows (fused or not), the attention (split over the SMs, fused into the output projection,
//! one task, or shards), the post-attention norm and the MLP.

use super::weights::LayerWeights;
use super::{
    Builder, DEFAULT_MAX_SEQ, MAX_KV_BYTES, MAX_PARTITIONS, SplitPlan, Val, alternates,
    fused_reshape_rope, fuses, gemv_tile_width, int, params, qkv_tile_max_units, shard_range,
    sm_shares, split_plan,
};
use crate::config::{ModelConfig, RopeScaling};
use crate::error::ModelError;
use amk_core::json::{Map, Value};
use amk_core::{BufferId, BufferKind, CounterId, DType, GpuTarget, Opcode, ScheduleConfig};

/// A decode program's sizes, checked against the model and the lowering's options.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepDims {
    pub(super) h: u64,
    pub(super) nh: u64,
    pub(super) nkv: u64,
    pub(super) hd: u64,
    pub(super) q_dim: u64,
    pub(super) kv_dim: u64,
    pub(super) inter: u64,
    pub(super) vocab: u64,
    /// KV-cache length.
    pub(super) max_seq: u64,
    /// Bytes of one element of the program's dtype.
    pub(super) dbytes: i64,
}

impl StepDims {
    /// The sizes of `mc` lowered in `dtype` with a cache of `max_seq` rows (the default:
    /// [`DEFAULT_MAX_SEQ`] or the model's context, whichever is smaller), refused when the
    /// dtype is not a float one, the cache is empty or longer than the model's context, or its
    /// bytes exceed [`MAX_KV_BYTES`].
    pub(super) fn check(
        mc: &ModelConfig,
        dtype: DType,
        max_seq: Option<u64>,
    ) -> Result<StepDims, ModelError> {
        super::check_dtype(dtype)?;
        let context = mc.max_position_embeddings as u64;
        let max_seq = max_seq.unwrap_or(DEFAULT_MAX_SEQ.min(context));
        if max_seq == 0 || max_seq > context {
            return Err(ModelError::Lower(format!(
                "KV length {max_seq} must be between 1 and the model's max_position_embeddings ({context})"
            )));
        }
        let (h, nh, nkv, hd) = (
            mc.hidden as u64,
            mc.n_heads as u64,
            mc.n_kv_heads as u64,
            mc.head_dim as u64,
        );
        let dbytes = (dtype.bits() / 8) as i64;
        let kv_bytes = 2 * mc.n_layers as u64 * max_seq * nkv * hd * dbytes as u64;
        if kv_bytes > MAX_KV_BYTES {
            return Err(ModelError::Lower(format!(
                "a KV cache of {max_seq} positions needs {:.1} GiB (limit {} GiB); lower --max-seq",
                kv_bytes as f64 / (1u64 << 30) as f64,
                MAX_KV_BYTES >> 30
            )));
        }
        Ok(StepDims {
            h,
            nh,
            nkv,
            hd,
            q_dim: nh * hd,
            kv_dim: nkv * hd,
            inter: mc.intermediate as u64,
            vocab: mc.vocab as u64,
            max_seq,
            dbytes,
        })
    }
}

/// What a schedule makes of the decode graph: which ops fuse, how the attention is laid out,
/// and how many SMs the layers' projections are tiled for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    /// KV shards of the attention (`attention.n_partitions`; 1: none).
    pub(super) parts: u64,
    pub(super) fuse_rope: bool,
    pub(super) fuse_resid: bool,
    pub(super) fuse_norm: bool,
    pub(super) fuse_mlp: bool,
    pub(super) fuse_qkv: bool,
    /// The attention computed in every output projection tile (`["attention", "gemv"]`).
    pub(super) fuse_attn: bool,
    /// The attention split over the SMs (`attention.split_kv`).
    pub(super) split: Option<SplitPlan>,
    /// SMs of the grid.
    pub(super) grid: u64,
    /// The grid's last SMs kept for attention tasks (`attention.own_sms`,
    /// `attention.own_sms_alternating`), at most all but one.
    pub(super) own: OwnSms,
    /// Consecutive phases on alternating halves of the SMs (`gemv.alternate_max_kb`).
    pub(super) alternate: bool,
    /// SMs a layer projection is tiled for.
    pub(super) layer_sms: u64,
}

/// The grid's last SMs kept for some attention tasks ([`own_sms`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct OwnSms {
    /// How many.
    pub(super) sms: u64,
    /// They hold the split attention's merge tasks, not the attention tasks.
    pub(super) merges: bool,
}

impl OwnSms {
    /// The opcodes whose tasks the placement puts on these SMs.
    pub(super) fn ops(&self) -> Vec<Opcode> {
        if self.merges {
            vec![Opcode::ATTENTION_MERGE]
        } else {
            vec![
                Opcode::ATTENTION_TILE,
                Opcode::ATTENTION_COMBINE,
                Opcode::ATTENTION_SPLIT,
            ]
        }
    }
}

/// SMs kept for attention tasks: `attention.own_sms = k` for the attention tasks; else, with
/// `attention.own_sms_alternating = 1` where the projections `alternate` between halves of the
/// SMs (a small model, which a few SMs less cost nothing), an SM each for the tasks that run once
/// a layer beside them — the attention's one task a KV head (one split), or the merge tasks of
/// a split attention: the only code on such an SM that is not a projection loop then stays in
/// its instruction cache from layer to layer (docs/perf-notes.md rounds 58 and 59).
fn own_sms(
    cfg: &ScheduleConfig,
    mc: &ModelConfig,
    split: Option<&SplitPlan>,
    alternate: bool,
) -> OwnSms {
    if let Some(k) = cfg.tile("attention", "own_sms") {
        return OwnSms {
            sms: k.max(0) as u64,
            merges: false,
        };
    }
    let asked = cfg
        .tile("attention", "own_sms_alternating")
        .is_some_and(|v| v > 0);
    match split {
        _ if !alternate || !asked => OwnSms::default(),
        Some(s) if s.geometry.n_splits == 1 => OwnSms {
            sms: mc.n_kv_heads as u64,
            merges: false,
        },
        Some(s) => s.merge_heads.map_or(OwnSms::default(), |m| OwnSms {
            sms: (mc.n_heads as u64).div_ceil(m.max(1)),
            merges: true,
        }),
        None => OwnSms::default(),
    }
}

impl Layout {
    /// The layout `cfg` asks for on `target` for model `mc` of sizes `d`, refused where its
    /// knobs exclude each other.
    pub(super) fn of(
        cfg: &ScheduleConfig,
        target: &GpuTarget,
        mc: &ModelConfig,
        d: &StepDims,
    ) -> Result<Layout, ModelError> {
        let parts = cfg
            .tile("attention", "n_partitions")
            .map_or(1, |p| p.max(1) as u64)
            .min(MAX_PARTITIONS)
            .min(target.num_sms.max(1) as u64);
        let fuse_norm = fuses(cfg, &["rmsnorm", "gemv"]);
        // QKV_ROPE_APPEND has no bias inputs: models with attention biases keep separate
        // tiles. Its instruction carries 8 inputs: the input norm, Qwen3's q/k norms and Llama
        // 3's RoPE factors together would be 9 (no published model has both).
        let fuse_qkv = fuses(cfg, &["gemv", "rope", "kv_append"])
            && !mc.attention_bias
            && !(mc.qk_norm && fuse_norm && !matches!(mc.rope_scaling, RopeScaling::None))
            && qkv_tile_max_units(mc).is_some();
        let fuse_attn = fuses(cfg, &["attention", "gemv"]);
        if fuse_attn && parts > 1 {
            return Err(ModelError::Lower(format!(
                "fusion group [\"attention\", \"gemv\"] computes the whole attention in every output \
                 projection tile: it needs tiling attention.n_partitions = 1, got {parts}"
            )));
        }
        let split = split_plan(cfg, target, mc, d.max_seq)?;
        if split.is_some() && (fuse_attn || parts > 1) {
            return Err(ModelError::Lower(
                "tiling attention.split_kv spreads the attention over every SM: it excludes \
                 attention.n_partitions > 1 and the fusion group [\"attention\", \"gemv\"]"
                    .into(),
            ));
        }
        // `attention.own_sms = k`: the attention tasks run on the grid's last k SMs and nothing
        // else does, so every projection is tiled over the others (at least one SM stays for
        // them). Fused into the output projection (`["attention", "gemv"]`), the attention
        // has no task of its own: the reserved SMs then idle.
        let grid = target.num_sms.max(1) as u64;
        // `gemv.alternate_max_kb`: a model whose every layer projection is small enough is
        // tiled for half the SMs, and the SM assignment puts consecutive phases on disjoint
        // SMs ([`alternates`]). The LM head keeps every SM.
        let alternate = alternates(cfg, mc, d.dbytes as u64);
        let mut own = own_sms(cfg, mc, split.as_ref(), alternate);
        own.sms = own.sms.min(grid - 1);
        // One split a KV head (the short-context program) is one task a KV head, which own SMs
        // can hold; more splits spread over every SM (their merge tasks may have SMs of their
        // own).
        let splits = split.as_ref().is_some_and(|s| s.geometry.n_splits > 1);
        if splits && own.sms > 0 && !own.merges {
            return Err(ModelError::Lower(
                "tiling attention.split_kv spreads the attention over every SM: it excludes \
                 attention.own_sms"
                    .into(),
            ));
        }
        let layer_sms = if alternate {
            ((grid - own.sms) / 2).max(1)
        } else {
            grid - own.sms
        };
        Ok(Layout {
            parts,
            fuse_rope: fuses(cfg, &["embed", "rope"]),
            fuse_resid: fuses(cfg, &["gemv", "add"]),
            fuse_norm,
            fuse_mlp: fuses(cfg, &["gemv", "silu_mul"]),
            fuse_qkv,
            fuse_attn,
            split,
            grid,
            own,
            alternate,
            layer_sms,
        })
    }
}

/// The step's buffers every layer reads: the position and the reshape bridge's row id.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepIo {
    pub(super) pos: BufferId,
    pub(super) rid: BufferId,
}

/// What every layer reads besides its weights.
pub(super) struct LayerCtx<'a> {
    pub(super) d: &'a StepDims,
    pub(super) layout: &'a Layout,
    pub(super) io: StepIo,
    /// Llama 3's RoPE divisors (an f32 weight), when the model scales its RoPE.
    pub(super) rope_factors: Option<BufferId>,
    /// Whether the model has Qwen3's per-head q/k norms and what its shared memory allows.
    pub(super) qk_norm_units: Option<u64>,
    pub(super) theta: Value,
    pub(super) scale: Value,
}

/// A layer's two caches.
#[derive(Debug, Clone, Copy)]
struct Caches {
    k: BufferId,
    v: BufferId,
}

/// The rotated query and what the attention waits for (the query's tiles and the cache rows').
struct Query {
    q: Val,
    waits: Vec<(CounterId, i64)>,
}

/// One RoPE of the unfused Q/K/V: a projection's output `x`, reshaped to `shape` (`dim`
/// elements), normalised per head first with `qk_norm` (Qwen3), labelled by `tag`.
struct RopeIn<'a> {
    x: Val,
    shape: &'a [u64],
    dim: u64,
    tag: &'a str,
    qk_norm: Option<BufferId>,
}

impl Builder<'_> {
    /// Layer `l` on the residual stream `resid`; returns the stream after it.
    pub(super) fn layer(
        &mut self,
        c: &LayerCtx<'_>,
        w: &LayerWeights,
        l: usize,
        resid: Val,
    ) -> Val {
        let (d, lay) = (c.d, c.layout);
        let an = self.norm_row(
            lay.fuse_norm,
            resid,
            w.in_norm,
            d.h,
            &format!("L{l}"),
            "an",
            "input_norm",
        );
        let cache = |b: &mut Builder<'_>, name: String| {
            b.p.new_buffer(
                name,
                BufferKind::KV_CACHE,
                b.dtype,
                &[d.max_seq, d.nkv, d.hd],
            )
        };
        let caches = Caches {
            k: cache(self, format!("L{l}.kcache")),
            v: cache(self, format!("L{l}.vcache")),
        };
        let query = if lay.fuse_qkv {
            self.qkv_fused(c, w, l, an, caches)
        } else {
            self.qkv_unfused(c, w, l, an, caches)
        };
        let hm = self.attention(c, w, l, &query, caches, resid);
        let mn = self.norm_row(
            lay.fuse_norm,
            hm,
            w.post_norm,
            d.h,
            &format!("L{l}"),
            "mn",
            "post_norm",
        );
        let act = self.mlp(c, w, l, mn);
        self.proj_residual(
            lay.fuse_resid,
            super::ProjIn {
                x: act,
                w: w.down,
                k: d.inter,
            },
            super::Residual { stream: hm, h: d.h },
            &format!("L{l}.down"),
            &format!("L{l}.h_out"),
            &format!("L{l}.add_mlp"),
        )
    }

    /// One set of QKV_ROPE_APPEND tiles: the projections, RoPE and the cache rows at once.
    fn qkv_fused(
        &mut self,
        c: &LayerCtx<'_>,
        w: &LayerWeights,
        l: usize,
        an: super::Row,
        caches: Caches,
    ) -> Query {
        let d = c.d;
        let qr = self.act(format!("L{l}.qr"), &[d.nh, d.hd]);
        let units = (d.nh + 2 * d.nkv) * d.hd;
        let mut width = 2 * gemv_tile_width(self.cfg, units / 2, self.num_sms);
        let mut base = params(&[
            ("head_dim", int(d.hd)),
            ("n_heads", int(d.nh)),
            ("n_kv_heads", int(d.nkv)),
            ("theta", c.theta.clone()),
        ]);
        if c.rope_factors.is_some() {
            base.insert("rope_factors", int(1));
        }
        // Qwen3's per-head norms: tiles of whole heads (as many as the shared memory holds).
        let mut tail: Vec<BufferId> = Vec::new();
        if let (Some(n), Some(max)) = (w.qk_norms, c.qk_norm_units) {
            width = width.div_ceil(d.hd).max(1).saturating_mul(d.hd).min(max);
            base.insert("qk_norm", int(1));
            base.insert("eps", self.eps.clone());
            tail.extend([n.q, n.k]);
        }
        tail.extend(c.rope_factors);
        // The position is the `pos` input (one element per step, no param patches).
        let val = self.fused_tiles_then(
            Opcode::QKV_ROPE_APPEND,
            an,
            &[w.q, w.k, w.v, c.io.pos],
            &tail,
            &[qr, caches.k, caches.v],
            super::TileShape {
                k: d.h,
                units,
                width,
                rows: 1,
            },
            &base,
            &format!("L{l}.qkv"),
        );
        Query {
            q: val,
            waits: vec![val.wait],
        }
    }

    /// Q, K and V as GEMV tiles, then each of Q and K reshaped and rotated (Qwen3: normalised
    /// per head between), and K and V appended to their caches.
    fn qkv_unfused(
        &mut self,
        c: &LayerCtx<'_>,
        w: &LayerWeights,
        l: usize,
        an: super::Row,
        caches: Caches,
    ) -> Query {
        let d = c.d;
        let q = self.act(format!("L{l}.q"), &[1, d.q_dim]);
        let k = self.act(format!("L{l}.k"), &[1, d.kv_dim]);
        let v = self.act(format!("L{l}.v"), &[1, d.kv_dim]);
        let s = sm_shares(self.num_sms, &[d.q_dim, d.kv_dim, d.kv_dim]);
        // Biases as the tiles' third input (weights: nothing to wait for).
        let bias = |f: fn(&super::weights::Triple) -> Option<BufferId>| {
            w.biases.as_ref().and_then(f).map(|b| (b, None))
        };
        let (bq, bk, bv) = (bias(|t| Some(t.q)), bias(|t| Some(t.k)), bias(|t| t.v));
        let q = self.proj(an, w.q, bq, q, d.h, d.q_dim, &format!("L{l}.q"), s[0]);
        let k = self.proj(an, w.k, bk, k, d.h, d.kv_dim, &format!("L{l}.k"), s[1]);
        let v = self.proj(an, w.v, bv, v, d.h, d.kv_dim, &format!("L{l}.v"), s[2]);
        let norms = w.qk_norms;
        let qr = self.rope(
            c,
            l,
            &RopeIn {
                x: q,
                shape: &[d.nh, d.hd],
                dim: d.q_dim,
                tag: "q",
                qk_norm: norms.map(|n| n.q),
            },
        );
        let kr = self.rope(
            c,
            l,
            &RopeIn {
                x: k,
                shape: &[1, d.nkv, d.hd],
                dim: d.kv_dim,
                tag: "k",
                qk_norm: norms.map(|n| n.k),
            },
        );
        let k_app = self.append(c, l, kr, caches.k, "k");
        let v_app = self.append(c, l, v, caches.v, "v");
        Query {
            q: qr,
            waits: vec![qr.wait, k_app.wait, v_app.wait],
        }
    }

    /// The reshape bridge `[1, n·hd] → [n, hd]` (EMBED of row 0) then ROPE — or both in one
    /// FUSED task; with a per-head norm weight, an RMSNORM of every head between them (never
    /// fused).
    fn rope(&mut self, c: &LayerCtx<'_>, l: usize, r: &RopeIn<'_>) -> Val {
        let (d, tag, dim, x) = (c.d, r.tag, r.dim, r.x);
        let out = self.act(format!("L{l}.{tag}r"), r.shape);
        let rope_params = params(&[("head_dim", int(d.hd)), ("theta", c.theta.clone())]);
        if c.layout.fuse_rope && r.qk_norm.is_none() {
            let recipe = fused_reshape_rope(
                r.shape,
                dim,
                &rope_params,
                self.dtype,
                c.rope_factors.is_some(),
            );
            let mut ins = vec![c.io.rid, x.buf, c.io.pos];
            ins.extend(c.rope_factors);
            return self
                .single(
                    Opcode::FUSED,
                    &ins,
                    out,
                    &[x.wait],
                    recipe,
                    format!("L{l}.reshape_rope_{tag}"),
                    (2 * dim as i64 * d.dbytes, 6 * dim as i64),
                )
                .0;
        }
        let mid = self.act(format!("L{l}.{tag}h"), r.shape);
        let (mid, _) = self.single(
            Opcode::EMBED,
            &[c.io.rid, x.buf],
            mid,
            &[x.wait],
            params(&[("hidden", int(dim))]),
            format!("L{l}.reshape_{tag}"),
            (dim as i64 * d.dbytes, 0),
        );
        let mid = match r.qk_norm {
            Some(nw) => {
                let normed = self.act(format!("L{l}.{tag}n"), r.shape);
                self.single(
                    Opcode::RMSNORM,
                    &[mid.buf, nw],
                    normed,
                    &[mid.wait],
                    params(&[("eps", self.eps.clone()), ("hidden", int(d.hd))]),
                    format!("L{l}.{tag}_norm"),
                    (dim as i64 * d.dbytes, 3 * dim as i64),
                )
                .0
            }
            None => mid,
        };
        let mut ins = vec![mid.buf, c.io.pos];
        ins.extend(c.rope_factors);
        self.single(
            Opcode::ROPE,
            &ins,
            out,
            &[mid.wait],
            rope_params,
            format!("L{l}.rope_{tag}"),
            (dim as i64 * d.dbytes, 6 * dim as i64),
        )
        .0
    }

    /// KV_APPEND of `new` into `cache`, in place (each cache is both input and output: the
    /// op's declared in-place pair); the row is the position input's.
    fn append(&mut self, c: &LayerCtx<'_>, l: usize, new: Val, cache: BufferId, tag: &str) -> Val {
        self.single(
            Opcode::KV_APPEND,
            &[new.buf, cache, c.io.pos],
            cache,
            &[new.wait],
            Map::new(),
            format!("L{l}.kv_append_{tag}"),
            (c.d.kv_dim as i64 * c.d.dbytes, 0),
        )
        .0
    }

    /// The attention and the output projection with the residual: split over the SMs,
    /// computed in every output projection tile, or as ATTENTION_TILE tasks (one, or KV shards
    /// and a combine) before the projection. Returns the residual stream after it.
    fn attention(
        &mut self,
        c: &LayerCtx<'_>,
        w: &LayerWeights,
        l: usize,
        query: &Query,
        caches: Caches,
        resid: Val,
    ) -> Val {
        let (d, lay) = (c.d, c.layout);
        let ins = super::AttnIn {
            q: query.q.buf,
            k_cache: caches.k,
            v_cache: caches.v,
            pos: c.io.pos,
            waits: &query.waits,
        };
        let out = super::AttnOut {
            wo: w.o,
            resid: super::Residual {
                stream: resid,
                h: d.h,
            },
            fuse: lay.fuse_resid,
            l,
        };
        // The attention's params are a static window of the cache (all of it, or a split-KV
        // shard's fixed slice); the position input clips it to the rows written so far.
        if let Some(plan) = lay.split {
            return self.split_attention(&ins, plan, c.scale.clone(), out);
        }
        if lay.fuse_attn {
            return self.attention_proj(&ins, attention_params(c, 0, d.max_seq, None), out);
        }
        let attn = self.tile_attention(c, l, query, caches);
        self.output_projection(attn, d.q_dim, out)
    }

    /// The attention row as one ATTENTION_TILE task, or as `parts` KV shards writing partials
    /// and an ATTENTION_COMBINE.
    fn tile_attention(&mut self, c: &LayerCtx<'_>, l: usize, query: &Query, caches: Caches) -> Val {
        let d = c.d;
        let attn = self.act(format!("L{l}.attn"), &[1, d.q_dim]);
        let ins = [query.q.buf, caches.k, caches.v, c.io.pos];
        let cost = (2 * d.kv_dim as i64 * d.dbytes, 4 * (d.nh * d.hd) as i64);
        let parts = c.layout.parts;
        if parts <= 1 {
            return self
                .single(
                    Opcode::ATTENTION_TILE,
                    &ins,
                    attn,
                    &query.waits,
                    attention_params(c, 0, d.max_seq, None),
                    format!("L{l}.attention"),
                    cost,
                )
                .0;
        }
        let mut partials = Vec::new();
        let mut waits = Vec::new();
        for i in 0..parts {
            let (start, len) = shard_range(d.max_seq, i, parts);
            let part = self.act(format!("L{l}.partial{i}"), &[d.nh, d.hd + 2]);
            let (val, _) = self.single(
                Opcode::ATTENTION_TILE,
                &ins,
                part,
                &query.waits,
                attention_params(c, start, len, Some(2)),
                format!("L{l}.attn_shard{i}"),
                cost,
            );
            partials.push(val.buf);
            waits.push(val.wait);
        }
        self.single(
            Opcode::ATTENTION_COMBINE,
            &partials,
            attn,
            &waits,
            params(&[
                ("head_dim", int(d.hd)),
                ("n_heads", int(d.nh)),
                ("n_kv_heads", int(d.nkv)),
            ]),
            format!("L{l}.combine"),
            (parts as i64 * (d.nh * (d.hd + 2)) as i64 * 4, 0),
        )
        .0
    }

    /// The MLP's activation `silu(gate) · up` of the normalised row `mn`: one set of
    /// GATE_UP_SILU tiles, or the two projections and a SILU_MUL.
    fn mlp(&mut self, c: &LayerCtx<'_>, w: &LayerWeights, l: usize, mn: super::Row) -> Val {
        let d = c.d;
        let act = self.act(format!("L{l}.act"), &[1, d.inter]);
        if c.layout.fuse_mlp {
            let width = gemv_tile_width(self.cfg, d.inter, self.num_sms);
            return self.fused_tiles(
                Opcode::GATE_UP_SILU,
                mn,
                &[w.gate, w.up],
                &[act],
                super::TileShape {
                    k: d.h,
                    units: d.inter,
                    width,
                    rows: 2,
                },
                &Map::new(),
                &format!("L{l}.gate_up"),
            );
        }
        let gate = self.act(format!("L{l}.gate"), &[1, d.inter]);
        let up = self.act(format!("L{l}.up"), &[1, d.inter]);
        let s = sm_shares(self.num_sms, &[d.inter, d.inter]);
        let gate = self.proj(
            mn,
            w.gate,
            None,
            gate,
            d.h,
            d.inter,
            &format!("L{l}.gate"),
            s[0],
        );
        let up = self.proj(mn, w.up, None, up, d.h, d.inter, &format!("L{l}.up"), s[1]);
        self.single(
            Opcode::SILU_MUL,
            &[gate.buf, up.buf],
            act,
            &[gate.wait, up.wait],
            Map::new(),
            format!("L{l}.swiglu"),
            (2 * d.inter as i64 * d.dbytes, 4 * d.inter as i64),
        )
        .0
    }
}

/// ATTENTION_TILE's params over cache rows `[start, start + len)` (`flags` 2: partials).
fn attention_params(c: &LayerCtx<'_>, start: u64, len: u64, flags: Option<i64>) -> Map {
    let d = c.d;
    let mut m = params(&[
        ("head_dim", int(d.hd)),
        ("kv_start", int(start)),
        ("kv_len", int(len)),
        ("scale", c.scale.clone()),
        ("n_heads", int(d.nh)),
        ("n_kv_heads", int(d.nkv)),
    ]);
    if let Some(f) = flags {
        m.insert("flags", Value::Int(f));
    }
    m
}
