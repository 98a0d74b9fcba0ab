//! Lowering a model to its prefill program: a chunk of `rows` prompt tokens at consecutive
//! positions in one pass, every projection a grid of LINEAR_TILE tasks (many rows each: matrix
//! arithmetic instead of a weight stream per token), the attention ATTENTION_CAUSAL tasks over
//! (KV head × row block), the chunk's K and V rows appended to the same KV caches the decode
//! program reads (same names, dtype and shape), and logits for the last prompt row or every
//! row (then with every row's negative log-likelihood of its target token too).
//!
//! The graph: EMBED of the chunk's ids; per layer RMSNORM of the rows with the input norm (row
//! tiles of [`NORM_ROWS`]), LINEAR_TILE q/k/v of the normalised rows (adding Qwen2's biases,
//! turning q and k at the rows' positions — or, with Qwen3's per-head norms, RMSNORM and ROPE
//! tasks after them), KV_APPEND k/v at the chunk's first position, ATTENTION_CAUSAL,
//! LINEAR_TILE o_proj + residual, RMSNORM with the post-attention norm, LINEAR_TILE gate/up +
//! SwiGLU, LINEAR_TILE down_proj + residual; then the final norm and the LM head as
//! LINEAR_TILEs over the last row (gathered by an EMBED of the row index `last`, the norm in
//! the tile) or every row, and for every row TOKEN_NLL row tiles over those logits.
//!
//! The norms are tasks of their own rather than LINEAR_TILE's fused norm: the fused norm
//! redoes a row block's normalisation (f64 products, RMSNORM's arithmetic) in every column
//! tile, which on a 1B model cost a K step of a normalising tile 1.67 µs against 0.70 µs without
//! (docs/perf-notes.md, round 34).
//!
//! Interface ([`IDS`], [`POS`], [`LAST`], `logits`, [`TARGETS`], [`NLL`]): the host sets the
//! chunk's token ids and positions (a chunk shorter than `rows` is padded: any valid id, the
//! positions continuing past the prompt — their K/V rows land past the prompt, where decoding
//! overwrites each row before it reads it — so `first position + rows` must fit the cache).

use super::weights::{LayerWeights, Weights};
use super::{Lowered, int, params, rope_factors, sm};
use crate::error::ModelError;
use crate::model::{EMBED, FINAL_NORM, LM_HEAD, Model, ROPE_FREQS};
use amk_core::json::{Map, Value};
use amk_core::{
    BufferId, BufferKind, CounterId, DType, GpuTarget, Opcode, Program, SmAssignment, WeightStore,
    decode,
};
use op_linear_tile::Epilogue;

/// The chunk's token ids: `[rows]` I32, an IO input.
pub const IDS: &str = "prefill.ids";
/// The chunk's positions: `[rows]` I32, an IO input, consecutive (KV_APPEND writes the rows
/// from element 0's position on).
pub const POS: &str = "prefill.pos";
/// Column slices a chunk's K or V append is split into (tasks of whole 8-element units of a
/// row; fewer when the row is narrower).
pub const APPEND_SLICES: u64 = 16;

/// With [`PrefillLogits::Last`], the row whose logits the program computes: `[1]` I32.
pub const LAST: &str = "prefill.last";
/// With [`PrefillLogits::Last`], NEXT_TOKEN's limits (element
/// [`op_logit_stats::VOCAB_LIMIT_AT`] the vocabulary limit, `≤ 0` none): `[decode::LIMITS_LEN]`
/// I32, an IO input.
pub const LIMITS: &str = "prefill.limits";
/// With [`PrefillLogits::Last`], the logits row's LOGIT_STATS summaries (`[4, slots]` I32, an IO
/// output): what choosing a greedy first token and its log-probability needs, a few KB back
/// instead of the row and a pass over it on the host.
pub const STATS: &str = "prefill.stats";
/// Slots of [`STATS`] (about; `StatsLayout::about`): the decode tail's.
pub const STATS_SLOTS: u64 = super::TUNED_STATS_SLOTS as u64;
/// With [`PrefillLogits::Every`], the token each row predicts (the next one's id; any valid id
/// on padding rows): `[rows]` I32, an IO input.
pub const TARGETS: &str = "prefill.targets";
/// With [`PrefillLogits::Every`], each row's negative log-likelihood of its target,
/// `-log softmax(logits)[target]`: `[rows]` F32, an IO output (TOKEN_NLL tasks over the
/// logits; a scorer reads these instead of the logits).
pub const NLL: &str = "prefill.nll";

/// Rows an RMSNORM task of a prefill program normalises: one a warp of an 8-warp block.
pub const NORM_ROWS: u64 = 8;

/// Which rows get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillLogits {
    /// None: the program writes the chunk's K/V rows and nothing else — no final norm, no LM
    /// head, and its last layer only its K and V projections (the rest of that layer feeds
    /// nothing but the logits). The engine's prompt programs: the decode loop computes the
    /// first new token's logits itself.
    None,
    /// One row, chosen by the [`LAST`] input: `logits` is `[1, vocab]` (generation).
    Last,
    /// Every row: `logits` is `[rows, vocab]`, and each row's negative log-likelihood of the
    /// target the [`TARGETS`] input gives it is in [`NLL`] (teacher-forced scoring, perplexity).
    Every,
}

/// How to lower a prefill program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillOptions {
    /// Activation, cache and weight dtype (F32, F16 or BF16).
    pub dtype: DType,
    /// KV-cache length: the decode program's, whose caches this program shares.
    pub max_seq: u64,
    /// Tokens a pass takes.
    pub rows: u64,
    /// Which rows get logits.
    pub logits: PrefillLogits,
}

/// A value some tasks produced: its buffer and what a consumer waits for.
#[derive(Clone, Copy)]
struct Val {
    buf: BufferId,
    wait: (CounterId, i64),
}

/// The RoPE of the Q/K projections' epilogue: the divisors' input (Llama 3) and the params that
/// go with it.
struct RopeArgs {
    head_dim: u64,
    factors: Option<BufferId>,
    params: Map,
}

/// One LINEAR_TILE grid: `x` times `w` (`n` rows of `k`), optionally normalised with `norm`
/// and biased, then the epilogue (with its operand, and RoPE's args), into `out`.
struct Linear<'a> {
    x: Val,
    w: BufferId,
    k: u64,
    n: u64,
    norm: Option<BufferId>,
    /// A bias of `w`'s rows (Qwen2's q/k/v).
    bias: Option<BufferId>,
    epilogue: Epilogue,
    /// The epilogue's operand: the residual, the up weight or the positions.
    operand: Option<Val>,
    /// With [`Epilogue::Rope`].
    rope: Option<&'a RopeArgs>,
    out: BufferId,
    label: &'a str,
    /// The device tiles of 64 rows of the phase this grid runs in (its own, or with the grids
    /// that run beside it): what decides the rows a task takes ([`Builder::task_rows`]).
    phase_tiles: Option<u64>,
}

impl<'a> Linear<'a> {
    /// `x · w^T` (`n` rows of `k`) into `out`, nothing else.
    fn plain(x: Val, (w, k, n): (BufferId, u64, u64), out: BufferId, label: &'a str) -> Self {
        Linear {
            x,
            w,
            k,
            n,
            norm: None,
            bias: None,
            epilogue: Epilogue::None,
            operand: None,
            rope: None,
            out,
            label,
            phase_tiles: None,
        }
    }

    /// With the epilogue `e` over `operand`.
    fn then(self, e: Epilogue, operand: Val) -> Self {
        Linear {
            epilogue: e,
            operand: Some(operand),
            ..self
        }
    }
}

/// The sizes the prefill graph is built from.
#[derive(Clone, Copy)]
struct Dims {
    h: u64,
    nh: u64,
    nkv: u64,
    hd: u64,
    inter: u64,
    vocab: u64,
    rows: u64,
    max_seq: u64,
}

impl Dims {
    fn of(mc: &crate::config::ModelConfig, opts: &PrefillOptions) -> Dims {
        Dims {
            h: mc.hidden as u64,
            nh: mc.n_heads as u64,
            nkv: mc.n_kv_heads as u64,
            hd: mc.head_dim as u64,
            inter: mc.intermediate as u64,
            vocab: mc.vocab as u64,
            rows: opts.rows,
            max_seq: opts.max_seq,
        }
    }
}

/// Tiles of one op over a buffer's rows or columns ([`Builder::tiles`]), on one counter.
struct Tiles<'a> {
    op: Opcode,
    ins: &'a [BufferId],
    out: BufferId,
    wait: (CounterId, i64),
    split: Split,
    /// The op's params beside the tile's.
    base: Map,
    label: &'a str,
    /// Bytes and FLOPs a tile spends a row or column of its split (its estimates).
    unit_bytes: i64,
    unit_flops: i64,
}

/// How [`Tiles`] divide their output.
#[derive(Clone, Copy)]
enum Split {
    /// `rows` rows, `per` a tile, each tile every one of `cols` columns: params `m_off`,
    /// `M_tile`, `n_off` = 0, `N_tile` = `cols`.
    Rows { rows: u64, per: u64, cols: u64 },
    /// `cols` columns, `per` a tile: params `N_tile`, `n_off`.
    Columns { cols: u64, per: u64 },
}

/// One task of [`Builder::single`]: `op` over `ins` into `out` after `waits`, with `params`.
struct OneTask<'a> {
    op: Opcode,
    ins: &'a [BufferId],
    out: BufferId,
    waits: &'a [(CounterId, i64)],
    params: Map,
    label: String,
    /// Bytes it moves (its estimate).
    bytes: i64,
}

/// The LM head: the final norm's weight and the head's.
#[derive(Clone, Copy)]
struct Head {
    norm: BufferId,
    weight: BufferId,
}

/// A layer's K and V caches.
#[derive(Clone, Copy)]
struct LayerCaches {
    k: BufferId,
    v: BufferId,
}

/// Heads of a Q, K or V projection: how many, and the tag that names their buffers and tasks.
#[derive(Clone, Copy)]
struct Heads<'a> {
    n: u64,
    tag: &'a str,
}

/// A layer's K and V projections of its normalised rows.
struct KvRows {
    k: Val,
    v: Val,
}

/// One Q, K or V projection of a layer ([`Layer::projection`]).
struct Projection<'a> {
    weight: BufferId,
    bias: Option<BufferId>,
    heads: Heads<'a>,
    /// Turned by RoPE in the tiles' epilogue.
    rope: bool,
    /// The 64-row device tiles of the phase it runs in.
    phase_tiles: u64,
}

struct Builder {
    p: Program,
    dtype: DType,
    dbytes: i64,
    eps: Value,
    /// The target's SMs: a phase of more 64-row tiles than this runs in wide tiles.
    num_sms: u64,
    /// The target's compute capability (LINEAR_TILE's widest row block runs on some).
    sm_arch: i64,
}

impl Builder {
    fn act(&mut self, name: String, shape: &[u64]) -> BufferId {
        self.p
            .new_buffer(name, BufferKind::ACTIVATION, self.dtype, shape)
    }

    /// A task with its own counter.
    fn single(&mut self, t: OneTask<'_>) -> Val {
        let c = self.p.new_counter(format!("{} ready", t.label));
        let id = (self.p).push_task(t.op, t.ins, &[t.out], c, t.waits, t.params, t.label);
        if let Some(task) = self.p.tasks.get_mut(id as usize) {
            task.est_bytes = t.bytes;
        }
        Val {
            buf: t.out,
            wait: (c, 1),
        }
    }

    /// Columns a tile takes: the device tile's (128, or 64 with SwiGLU; whole heads with
    /// RoPE). A narrower task would still run the whole device tile, its other columns zero.
    fn tile_cols(lin: &Linear<'_>) -> u64 {
        Self::cols_of(lin.epilogue, lin.rope.map(|r| r.head_dim))
    }

    /// [`Builder::tile_cols`] of a grid with epilogue `e`, turning heads of `rope_hd`.
    fn cols_of(e: Epilogue, rope_hd: Option<u64>) -> u64 {
        let cols = e.device_cols();
        match rope_hd {
            Some(hd) => (cols / hd.max(1)).max(1) * hd.max(1),
            None => cols,
        }
    }

    /// The device tiles of 64 rows that `lin`'s grid over `rows` rows takes.
    fn grid_tiles(lin: &Linear<'_>, rows: u64) -> u64 {
        rows.div_ceil(op_linear_tile::DEVICE_ROWS) * lin.n.div_ceil(Self::tile_cols(lin))
    }

    /// Rows a LINEAR_TILE task takes in a phase of `tiles` 64-row device tiles: the device's
    /// wide row block when the phase has more of them than the target has SMs and the program
    /// runs on the tensor cores (16-bit). A wide tile reads each weight tile once for twice the
    /// rows, so a phase of more than one wave of narrow tiles runs in fewer, cheaper-per-row
    /// tasks; a phase of one wave or less keeps the narrow tiles, which spread it over more SMs.
    /// Where the device runs the widest block (`runs_widest_rows`: sm_90, 16-bit, no norm), a
    /// grid whose phase holds four waves of narrow tiles or more takes it: the phase still
    /// fills every SM, and each weight tile feeds 256 rows.
    fn task_rows(&self, tiles: u64, norm: bool) -> u64 {
        let widest = op_linear_tile::runs_widest_rows(self.sm_arch, self.dtype, norm);
        if widest && tiles >= 4 * self.num_sms {
            op_linear_tile::WIDEST_ROWS
        } else if self.dtype != DType::F32 && tiles > self.num_sms {
            op_linear_tile::WIDE_ROWS
        } else {
            op_linear_tile::DEVICE_ROWS
        }
    }

    /// A LINEAR_TILE task's params, but its tile.
    fn linear_params(&self, lin: &Linear<'_>) -> Map {
        let mut pr = params(&[("K", int(lin.k))]);
        if lin.norm.is_some() {
            pr.insert("norm", int(1));
            pr.insert("eps", self.eps.clone());
        }
        if lin.bias.is_some() {
            pr.insert("flags", Value::Int(op_linear_tile::FLAG_BIAS));
        }
        if lin.epilogue != Epilogue::None {
            pr.insert("epilogue", Value::Int(lin.epilogue.code()));
        }
        for (key, v) in lin.rope.map(|r| r.params.iter()).into_iter().flatten() {
            pr.insert(key, v.clone());
        }
        pr
    }

    /// The LM head over one row `x` (`[1, hidden]`, normalised in every tile): RMSNORM_GEMV
    /// tiles of the head's `vocab` rows, about one an SM (whole warps' rows, as the decode program's
    /// `gemv.sm_multiple = 1`), into `out`, on one counter. A weight stream at the memory's
    /// bandwidth, where LINEAR_TILE tiles would run 64-row tensor-core tiles holding one row
    /// (the 1B's 49,152-row head took ≈ 0.13 ms so; docs/perf-notes.md round 41).
    fn head_row(&mut self, x: Val, head: Head, out: BufferId, d: Dims) -> Val {
        let (k, n) = (d.h, d.vocab);
        let mut base = params(&[("K", int(k))]);
        base.insert("eps", self.eps.clone());
        self.tiles(Tiles {
            op: Opcode::RMSNORM_GEMV,
            ins: &[x.buf, head.norm, head.weight],
            out,
            wait: x.wait,
            split: Split::Columns {
                cols: n,
                per: super::sm_tile_width(n, self.num_sms),
            },
            base,
            label: "lm_head",
            unit_bytes: k as i64 * self.dbytes,
            unit_flops: 2 * k as i64,
        })
    }

    /// RMSNORM of `x`'s rows (`rows` × `h`) with weight `w` into a buffer of their own: row
    /// tiles of [`NORM_ROWS`] (a warp a row on the GPU), on one counter.
    fn norm_rows(&mut self, x: Val, w: BufferId, (rows, h): (u64, u64), label: &str) -> Val {
        let out = self.act(label.to_string(), &[rows, h]);
        self.tiles(Tiles {
            op: Opcode::RMSNORM,
            ins: &[x.buf, w],
            out,
            wait: x.wait,
            split: Split::Rows {
                rows,
                per: NORM_ROWS,
                cols: h,
            },
            base: params(&[("eps", self.eps.clone()), ("hidden", int(h))]),
            label,
            unit_bytes: 2 * h as i64 * self.dbytes,
            unit_flops: 0,
        })
    }

    /// Tasks of `t.op` over the tiles of `t.split`, each writing its rows or columns of
    /// `t.out` (its split's params after `t.base`), on one counter.
    fn tiles(&mut self, t: Tiles<'_>) -> Val {
        let (n, per) = match t.split {
            Split::Rows { rows, per, .. } => (rows, per),
            Split::Columns { cols, per } => (cols, per),
        };
        let c = self.p.new_counter(format!("{} ready", t.label));
        let mut tiles = 0;
        for start in (0..n).step_by(per.max(1) as usize) {
            let len = per.min(n - start);
            let mut pr = t.base.clone();
            let keys = match t.split {
                Split::Rows { cols, .. } => {
                    vec![
                        ("m_off", start),
                        ("M_tile", len),
                        ("n_off", 0),
                        ("N_tile", cols),
                    ]
                }
                Split::Columns { .. } => vec![("N_tile", len), ("n_off", start)],
            };
            for (key, v) in keys {
                pr.insert(key, int(v));
            }
            let name = format!("{}[{tiles}]", t.label);
            let id = (self.p).push_task(t.op, t.ins, &[t.out], c, &[t.wait], pr, name);
            if let Some(task) = self.p.tasks.get_mut(id as usize) {
                task.est_bytes = len as i64 * t.unit_bytes;
                task.est_flops = len as i64 * t.unit_flops;
            }
            tiles += 1;
        }
        Val {
            buf: t.out,
            wait: (c, tiles),
        }
    }

    /// The LINEAR_TILE grid of `lin` over `rows` rows, on one counter.
    fn linear(&mut self, lin: &Linear<'_>, rows: u64) -> Val {
        let cols = Self::tile_cols(lin);
        let c = self.p.new_counter(format!("{} ready", lin.label));
        let mut ins = vec![lin.x.buf, lin.w];
        ins.extend(lin.norm);
        ins.extend(lin.bias);
        let mut waits = vec![lin.x.wait];
        if let Some(e) = lin.operand {
            ins.push(e.buf);
            if !waits.contains(&e.wait) {
                waits.push(e.wait);
            }
        }
        ins.extend(lin.rope.and_then(|r| r.factors));
        let base = self.linear_params(lin);
        let weights = if lin.epilogue == Epilogue::SwiGlu {
            2
        } else {
            1
        };
        let mut tiles = 0;
        let phase = lin.phase_tiles.unwrap_or(Self::grid_tiles(lin, rows));
        let dr = self.task_rows(phase, lin.norm.is_some());
        // Columns outer, rows inner: the blocks that run together share their weight rows, so
        // a wave reads each weight tile from memory once and the others find it in L2 (rows
        // outer made every wave of a wide projection re-read weights that had left L2).
        for n0 in (0..lin.n).step_by(cols as usize) {
            for m0 in (0..rows).step_by(dr as usize) {
                let (mt, nt) = (dr.min(rows - m0), cols.min(lin.n - n0));
                let mut pr = base.clone();
                for (key, v) in [("m_off", m0), ("M_tile", mt), ("n_off", n0), ("N_tile", nt)] {
                    pr.insert(key, int(v));
                }
                let label = format!("{}[{tiles}]", lin.label);
                let t =
                    self.p
                        .push_task(Opcode::LINEAR_TILE, &ins, &[lin.out], c, &waits, pr, label);
                if let Some(task) = self.p.tasks.get_mut(t as usize) {
                    task.est_bytes = weights * nt as i64 * lin.k as i64 * self.dbytes;
                    task.est_flops = 2 * weights * (mt * nt * lin.k) as i64;
                }
                tiles += 1;
            }
        }
        Val {
            buf: lin.out,
            wait: (c, tiles),
        }
    }
}

/// What every layer reads besides its weights.
struct Layer<'a> {
    l: usize,
    d: Dims,
    pos: BufferId,
    rope: &'a RopeArgs,
    theta: Value,
    scale: Value,
}

impl Layer<'_> {
    /// Q, K or V of the normalised rows `x` as `[rows, heads, head_dim]`, RoPE'd at each row's
    /// position when `rope`.
    fn projection(&self, b: &mut Builder, x: Val, pj: &Projection<'_>) -> Val {
        let (d, l) = (self.d, self.l);
        let (w, bias, rope, phase_tiles) = (pj.weight, pj.bias, pj.rope, pj.phase_tiles);
        let (heads, tag) = (pj.heads.n, pj.heads.tag);
        let out = b.act(format!("L{l}.{tag}"), &[d.rows, heads, d.hd]);
        let label = format!("L{l}.{tag}");
        let mut lin = Linear::plain(x, (w, d.h, heads * d.hd), out, &label);
        lin.bias = bias;
        lin.phase_tiles = Some(phase_tiles);
        if rope {
            // The positions are an IO input: nothing to wait for beyond x.
            lin = lin.then(
                Epilogue::Rope,
                Val {
                    buf: self.pos,
                    wait: x.wait,
                },
            );
            lin.rope = Some(self.rope);
        }
        b.linear(&lin, d.rows)
    }

    /// Qwen3's per-head RMSNORM of `x` with `nw`, then ROPE: tasks of their own (the norm comes
    /// between the projection and the RoPE).
    fn norm_rope(&self, b: &mut Builder, x: Val, nw: BufferId, h: Heads<'_>) -> Val {
        let (d, l, heads, tag) = (self.d, self.l, h.n, h.tag);
        let bytes = (d.rows * heads * d.hd) as i64 * b.dbytes;
        let normed = b.act(format!("L{l}.{tag}n"), &[d.rows, heads, d.hd]);
        let pr = params(&[("eps", b.eps.clone()), ("hidden", int(d.hd))]);
        let x = b.single(OneTask {
            op: Opcode::RMSNORM,
            ins: &[x.buf, nw],
            out: normed,
            waits: &[x.wait],
            params: pr,
            label: format!("L{l}.{tag}_norm"),
            bytes,
        });
        let out = b.act(format!("L{l}.{tag}r"), &[d.rows, heads, d.hd]);
        let mut ins = vec![x.buf, self.pos];
        ins.extend(self.rope.factors);
        let pr = params(&[("head_dim", int(d.hd)), ("theta", self.theta.clone())]);
        b.single(OneTask {
            op: Opcode::ROPE,
            ins: &ins,
            out,
            waits: &[x.wait],
            params: pr,
            label: format!("L{l}.rope_{tag}"),
            bytes,
        })
    }

    /// The 64-row device tiles of a projection to `heads` heads (turned by RoPE when `rope`).
    fn proj_tiles(&self, heads: u64, rope: bool) -> u64 {
        let d = self.d;
        let (e, hd) = match rope {
            true => (Epilogue::Rope, Some(d.hd)),
            false => (Epilogue::None, None),
        };
        d.rows.div_ceil(op_linear_tile::DEVICE_ROWS)
            * (heads * d.hd).div_ceil(Builder::cols_of(e, hd))
    }

    /// The chunk's K or V rows appended to `cache` at its first position: KV_APPEND tasks of
    /// about [`APPEND_SLICES`] column slices of every row (whole 8-element units), on one
    /// counter. One task took the whole chunk on one SM (22 µs of every 1B layer at 512 rows,
    /// 31 µs of SmolLM2's at 2,048) while the attention waited for it.
    fn append(&self, b: &mut Builder, new: Val, cache: BufferId, tag: &str) -> Val {
        let d = self.d;
        let width = d.nkv * d.hd;
        let cols = width
            .div_ceil(APPEND_SLICES)
            .next_multiple_of(8)
            .min(width)
            .max(1);
        let label = format!("L{}.kv_append_{tag}", self.l);
        b.tiles(Tiles {
            op: Opcode::KV_APPEND,
            ins: &[new.buf, cache, self.pos],
            out: cache,
            wait: new.wait,
            split: Split::Columns {
                cols: width,
                per: cols,
            },
            base: Map::new(),
            label: &label,
            unit_bytes: d.rows as i64 * b.dbytes,
            unit_flops: 0,
        })
    }

    /// The attention: tasks of one KV head's query heads over a block of rows, sized so a
    /// task's (row, head) pairs are one device group. A block's cost grows with the cache rows
    /// its last row attends to (from the chunk's start, the block's end): when a layer has more
    /// blocks than the target has SMs, they are listed latest first with that cost as their
    /// estimate, so the SM assignment, greedy in list order, places them as LPT would instead
    /// of two equal-looking tasks an SM of which one attends 32 times the rows of the other (a
    /// 1B chunk of 512 rows lost ≈ 75 µs a layer to that spread). With fewer blocks than SMs
    /// the small estimates made the next phase's tiles queue behind the attention on its SMs
    /// (SmolLM2's 512-row chunk 5.83 → 6.42 ms), so those keep the whole cache's estimate
    /// (docs/perf-notes.md round 37).
    fn attention(
        &self,
        b: &mut Builder,
        q: Val,
        caches: LayerCaches,
        waits: &[(CounterId, i64)],
    ) -> Val {
        let (d, l) = (self.d, self.l);
        let attn = b.act(format!("L{l}.attn"), &[d.rows, d.nh * d.hd]);
        let rep = d.nh / d.nkv.max(1);
        let block = (op_attention_causal::DEVICE_PAIRS / rep.max(1)).max(1);
        let ca = b.p.new_counter(format!("L{l}.attention ready"));
        let mut n_att = 0;
        let starts: Vec<u64> = (0..d.rows).step_by(block as usize).collect();
        // More blocks than SMs: latest first, each with its own cost (see above). Fewer: every
        // block has an SM of its own, and the constant estimate keeps the tasks that follow
        // off the attention's SMs.
        let many = d.nkv * starts.len() as u64 > b.num_sms;
        let blocks: Vec<(u64, u64)> = match many {
            true => (starts.iter().rev())
                .flat_map(|&m0| (0..d.nkv).map(move |g| (g, m0)))
                .collect(),
            false => (0..d.nkv)
                .flat_map(|g| starts.iter().map(move |&m0| (g, m0)))
                .collect(),
        };
        for (g, m0) in blocks {
            let pr = params(&[
                ("head_dim", int(d.hd)),
                ("n_heads", int(d.nh)),
                ("n_kv_heads", int(d.nkv)),
                ("scale", self.scale.clone()),
                ("m_off", int(m0)),
                ("M_tile", int(block.min(d.rows - m0))),
                ("n_off", int(g * rep * d.hd)),
                ("N_tile", int(rep * d.hd)),
            ]);
            let label = format!("L{l}.attention[{n_att}]");
            let ins = [q.buf, caches.k, caches.v, self.pos];
            let t = b.p.push_task(
                Opcode::ATTENTION_CAUSAL,
                &ins,
                &[attn],
                ca,
                waits,
                pr,
                label,
            );
            let attended = match many {
                true => 2 * (m0 + block.min(d.rows - m0)),
                false => d.max_seq,
            };
            if let Some(task) = b.p.tasks.get_mut(t as usize) {
                task.est_bytes = (attended * d.hd) as i64 * b.dbytes;
            }
            n_att += 1;
        }
        Val {
            buf: attn,
            wait: (ca, n_att),
        }
    }

    /// The layer's K and V caches (the decode program's names, dtype and shape).
    fn caches(&self, b: &mut Builder) -> LayerCaches {
        let (d, l) = (self.d, self.l);
        let mut cache = |what: &str| {
            let name = format!("L{l}.{what}");
            b.p.new_buffer(
                name,
                BufferKind::KV_CACHE,
                b.dtype,
                &[d.max_seq, d.nkv, d.hd],
            )
        };
        LayerCaches {
            k: cache("kcache"),
            v: cache("vcache"),
        }
    }

    /// The layer's K and V rows appended to its caches, and nothing else: the last layer of a
    /// program without logits, where nothing reads the rest of the layer.
    fn kv_only(&self, b: &mut Builder, w: &LayerWeights, resid: Val) {
        let (d, l) = (self.d, self.l);
        let caches = self.caches(b);
        let x = b.norm_rows(resid, w.in_norm, (d.rows, d.h), &format!("L{l}.in_norm"));
        let rope = w.qk_norms.is_none();
        let tiles = self.proj_tiles(d.nkv, rope) + self.proj_tiles(d.nkv, false);
        let kv = self.kv_projections(b, w, x, rope, tiles);
        let k = match w.qk_norms {
            Some(n) => self.norm_rope(b, kv.k, n.k, Heads { n: d.nkv, tag: "k" }),
            None => kv.k,
        };
        self.append(b, k, caches.k, "k");
        self.append(b, kv.v, caches.v, "v");
    }

    /// The K and V projections of the normalised rows `x` (a phase of `phase_tiles` 64-row
    /// tiles), K turned by RoPE in its tiles when `rope`.
    fn kv_projections(
        &self,
        b: &mut Builder,
        w: &LayerWeights,
        x: Val,
        rope: bool,
        phase_tiles: u64,
    ) -> KvRows {
        let nkv = self.d.nkv;
        let biases = w.biases.as_ref();
        let k = Projection {
            weight: w.k,
            bias: biases.map(|t| t.k),
            heads: Heads { n: nkv, tag: "k" },
            rope,
            phase_tiles,
        };
        let v = Projection {
            weight: w.v,
            bias: biases.and_then(|t| t.v),
            heads: Heads { n: nkv, tag: "v" },
            rope: false,
            phase_tiles,
        };
        KvRows {
            k: self.projection(b, x, &k),
            v: self.projection(b, x, &v),
        }
    }

    /// The layer's attention half: the residual stream after it.
    fn attention_block(&self, b: &mut Builder, w: &LayerWeights, resid: Val) -> Val {
        let (d, l) = (self.d, self.l);
        let caches = self.caches(b);
        // Q and K are turned by the projection's RoPE epilogue, or — with Qwen3's per-head
        // norms, which come between the projection and the RoPE — by tasks after it.
        let fused = w.qk_norms.is_none();
        let x = b.norm_rows(resid, w.in_norm, (d.rows, d.h), &format!("L{l}.in_norm"));
        // Q, K and V run side by side: one phase.
        let tiles = self.proj_tiles(d.nh, fused)
            + self.proj_tiles(d.nkv, fused)
            + self.proj_tiles(d.nkv, false);
        let q = Projection {
            weight: w.q,
            bias: w.biases.as_ref().map(|t| t.q),
            heads: Heads { n: d.nh, tag: "q" },
            rope: fused,
            phase_tiles: tiles,
        };
        let q = self.projection(b, x, &q);
        let KvRows { k, v } = self.kv_projections(b, w, x, fused, tiles);
        let (q, k) = match w.qk_norms {
            Some(n) => (
                self.norm_rope(b, q, n.q, Heads { n: d.nh, tag: "q" }),
                self.norm_rope(b, k, n.k, Heads { n: d.nkv, tag: "k" }),
            ),
            None => (q, k),
        };
        let k_app = self.append(b, k, caches.k, "k");
        let v_app = self.append(b, v, caches.v, "v");
        let attn = self.attention(b, q, caches, &[q.wait, k_app.wait, v_app.wait]);
        let hm = b.act(format!("L{l}.h_mid"), &[d.rows, d.h]);
        let label = format!("L{l}.o_add");
        let lin = Linear::plain(attn, (w.o, d.nh * d.hd, d.h), hm, &label)
            .then(Epilogue::Residual, resid);
        b.linear(&lin, d.rows)
    }

    /// The layer's MLP half: the residual stream after it.
    fn mlp_block(&self, b: &mut Builder, w: &LayerWeights, hm: Val) -> Val {
        let (d, l) = (self.d, self.l);
        let act = b.act(format!("L{l}.act"), &[d.rows, d.inter]);
        let label = format!("L{l}.gate_up");
        let hn = b.norm_rows(hm, w.post_norm, (d.rows, d.h), &format!("L{l}.post_norm"));
        // The up weight is a weight: nothing to wait for beyond the normalised rows.
        let up = Val {
            buf: w.up,
            wait: hn.wait,
        };
        let lin = Linear::plain(hn, (w.gate, d.h, d.inter), act, &label).then(Epilogue::SwiGlu, up);
        let act = b.linear(&lin, d.rows);
        let out = b.act(format!("L{l}.h_out"), &[d.rows, d.h]);
        let label = format!("L{l}.down_add");
        let lin =
            Linear::plain(act, (w.down, d.inter, d.h), out, &label).then(Epilogue::Residual, hm);
        b.linear(&lin, d.rows)
    }
}

fn check(model: &Model, opts: &PrefillOptions) -> Result<(), ModelError> {
    let mc = &model.config;
    super::check_dtype(opts.dtype)?;
    if mc.hidden as u64 > op_linear_tile::MAX_NORM_K {
        return Err(ModelError::Lower(format!(
            "the prefill projections normalise rows of at most {} elements, the model's are {}",
            op_linear_tile::MAX_NORM_K,
            mc.hidden
        )));
    }
    if mc.head_dim as u64 > op_attention_causal::MAX_HEAD_DIM {
        return Err(ModelError::Lower(format!(
            "the prefill attention takes heads up to {} wide, the model's are {}",
            op_attention_causal::MAX_HEAD_DIM,
            mc.head_dim
        )));
    }
    if opts.rows == 0 || opts.rows > opts.max_seq {
        return Err(ModelError::Lower(format!(
            "a prefill chunk of {} rows must be between 1 and the cache's {} rows",
            opts.rows, opts.max_seq
        )));
    }
    Ok(())
}

/// Lowers `model` to its prefill program for `target` (see the module documentation).
pub fn lower_prefill(
    model: &Model,
    target: &GpuTarget,
    opts: &PrefillOptions,
) -> Result<Lowered, ModelError> {
    lower_prefill_sharing(model, target, opts, WeightStore::new())
}

/// The program's description in its meta.
fn describe(p: &mut Program, model: &Model, target: &GpuTarget, opts: &PrefillOptions) {
    let meta = &mut p.meta;
    meta.insert("model", Value::from(model.source.clone()));
    meta.insert("gpu", Value::from(target.name.clone()));
    meta.insert("regime", Value::from("prefill"));
    meta.insert("max_seq", int(opts.max_seq));
    meta.insert("rows", int(opts.rows));
    meta.insert("dtype", Value::from(opts.dtype.name().to_string()));
    meta.insert("n_layers", int(model.config.n_layers as u64));
    p.target = Some(target.clone());
}

/// The RoPE's divisors (a weight, when the model scales its frequencies) and params.
fn rope_args(b: &mut Builder, w: &mut Weights<'_>, model: &Model) -> Result<RopeArgs, ModelError> {
    let hd = model.config.head_dim as u64;
    let mut params = params(&[
        ("head_dim", int(hd)),
        ("theta", Value::Float(model.config.rope_theta)),
    ]);
    let factors = match rope_factors(model)? {
        Some(f) => {
            let half = f.numel() as u64;
            w.store.insert(ROPE_FREQS, f);
            params.insert("rope_factors", int(1));
            Some(b.p.new_weight(ROPE_FREQS, DType::F32, &[half], ROPE_FREQS))
        }
        None => None,
    };
    Ok(RopeArgs {
        head_dim: hd,
        factors,
        params,
    })
}

/// The final norm and the LM head over the last row (gathered by an EMBED of the row index
/// `last`; RMSNORM_GEMV tiles, [`Builder::head_row`]) or every row (LINEAR_TILE tiles), into
/// `logits`.
fn lm_head(b: &mut Builder, head: Head, resid: Val, d: Dims, logits: PrefillLogits) {
    let (x, logit_rows) = match logits {
        PrefillLogits::None => return,
        PrefillLogits::Every => (resid, d.rows),
        PrefillLogits::Last => {
            let last = b.p.new_buffer(LAST, BufferKind::IO_INPUT, DType::I32, &[1]);
            let row = b.act("h_last".into(), &[1, d.h]);
            let pr = params(&[("hidden", int(d.h))]);
            let bytes = d.h as i64 * b.dbytes;
            let row = b.single(OneTask {
                op: Opcode::EMBED,
                ins: &[last, resid.buf],
                out: row,
                waits: &[resid.wait],
                params: pr,
                label: "last_row".into(),
                bytes,
            });
            (row, 1)
        }
    };
    let out = b.p.new_buffer(
        decode::LOGITS,
        BufferKind::IO_OUTPUT,
        b.dtype,
        &[logit_rows, d.vocab],
    );
    let logits_val = match logits {
        PrefillLogits::Last => b.head_row(x, head, out, d),
        _ => {
            let mut lin = Linear::plain(x, (head.weight, d.h, d.vocab), out, "lm_head");
            lin.norm = Some(head.norm);
            b.linear(&lin, logit_rows)
        }
    };
    match logits {
        PrefillLogits::Every => token_nll(b, logits_val, d),
        _ => logit_stats(b, logits_val, d.vocab),
    }
}

/// The last row's [`STATS`]: LOGIT_STATS tasks over slots of the row (the decode tail's
/// layout), after the whole LM head, under the [`LIMITS`]' vocabulary limit.
fn logit_stats(b: &mut Builder, logits: Val, vocab: u64) {
    let layout = super::StatsLayout::about(STATS_SLOTS, vocab);
    let limits = (b.p).new_buffer(
        LIMITS,
        BufferKind::IO_INPUT,
        DType::I32,
        &[decode::LIMITS_LEN],
    );
    let out = (b.p).new_buffer(
        STATS,
        BufferKind::IO_OUTPUT,
        DType::I32,
        &[op_logit_stats::ROWS, layout.slots],
    );
    let ctr = b.p.new_counter("logit stats ready");
    for g in 0..layout.slots {
        let pr = layout.slot_params(g);
        let label = format!("logit_stats[{g}]");
        let t = (b.p).push_task(
            Opcode::LOGIT_STATS,
            &[logits.buf, limits],
            &[out],
            ctr,
            &[logits.wait],
            pr,
            label,
        );
        if let Some(task) = b.p.tasks.get_mut(t as usize) {
            task.est_bytes = layout.cols as i64 * b.dbytes;
        }
    }
}

/// Every row's negative log-likelihood of its [`TARGETS`] id, into [`NLL`]: TOKEN_NLL row
/// tiles over the logits, one a target SM (a row is a pass over the vocabulary; 512 rows of a
/// 49,152-token vocabulary read 50 MB), after the whole LM head.
fn token_nll(b: &mut Builder, logits: Val, d: Dims) {
    let targets = (b.p).new_buffer(TARGETS, BufferKind::IO_INPUT, DType::I32, &[d.rows]);
    let out = (b.p).new_buffer(NLL, BufferKind::IO_OUTPUT, DType::F32, &[d.rows]);
    b.tiles(Tiles {
        op: Opcode::TOKEN_NLL,
        ins: &[logits.buf, targets],
        out,
        wait: logits.wait,
        split: Split::Rows {
            rows: d.rows,
            per: d.rows.div_ceil(b.num_sms).max(1),
            cols: 1,
        },
        base: Map::new(),
        label: "nll",
        unit_bytes: d.vocab as i64 * b.dbytes,
        unit_flops: 0,
    });
}

/// [`lower_prefill`] starting from `weights` (a decode lowering's, of the same dtype): tensors
/// already there are not cast again.
pub fn lower_prefill_sharing(
    model: &Model,
    target: &GpuTarget,
    opts: &PrefillOptions,
    weights: WeightStore,
) -> Result<Lowered, ModelError> {
    check(model, opts)?;
    let mc = &model.config;
    let d = Dims::of(mc, opts);
    let mut b = Builder {
        p: Program::new(),
        dtype: opts.dtype,
        dbytes: (opts.dtype.bits() / 8) as i64,
        eps: Value::Float(mc.rms_eps),
        num_sms: target.num_sms.max(1) as u64,
        sm_arch: target.sm_arch,
    };
    let mut w = Weights::new(model, opts.dtype, weights);
    let rope = rope_args(&mut b, &mut w, model)?;
    describe(&mut b.p, model, target, opts);
    let input = |b: &mut Builder, name: &str| {
        b.p.new_buffer(name, BufferKind::IO_INPUT, DType::I32, &[d.rows])
    };
    let (ids, pos) = (input(&mut b, IDS), input(&mut b, POS));
    let table = w.buffer(&mut b.p, EMBED)?;
    let h0 = b.act("h0".into(), &[d.rows, d.h]);
    let pr = params(&[("hidden", int(d.h))]);
    let bytes = (d.rows * d.h) as i64 * b.dbytes;
    let mut resid = b.single(OneTask {
        op: Opcode::EMBED,
        ins: &[ids, table],
        out: h0,
        waits: &[],
        params: pr,
        label: "embed".into(),
        bytes,
    });
    let layer = |l| Layer {
        l,
        d,
        pos,
        rope: &rope,
        theta: Value::Float(mc.rope_theta),
        scale: Value::Float(1.0 / (d.hd as f64).sqrt()),
    };
    for l in 0..mc.n_layers {
        let lw = LayerWeights::load(&mut b.p, &mut w, l)?;
        if opts.logits == PrefillLogits::None && l + 1 == mc.n_layers {
            layer(l).kv_only(&mut b, &lw, resid);
            break;
        }
        let hm = layer(l).attention_block(&mut b, &lw, resid);
        resid = layer(l).mlp_block(&mut b, &lw, hm);
    }
    if opts.logits != PrefillLogits::None {
        let norm = w.buffer(&mut b.p, FINAL_NORM)?;
        let weight = match mc.tie_word_embeddings {
            true => table,
            false => w.buffer(&mut b.p, LM_HEAD)?,
        };
        lm_head(&mut b, Head { norm, weight }, resid, d, opts.logits);
    }
    let Builder { mut p, .. } = b;
    let num_sms = target.num_sms.max(0) as u32;
    sm::assign_sms(&mut p, &SmAssignment::LoadBalance, num_sms)?;
    sm::seat_next_token_early(&mut p, num_sms);
    Ok(Lowered {
        program: p,
        weights: w.store,
        max_seq: d.max_seq,
        page_stats: None,
    })
}
