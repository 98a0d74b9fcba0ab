//! Lowering: a [`Model`] → the single-token decode [`Program`] (docs/models.md, "The reference
//! lowering"), with every [`ScheduleConfig`] knob taking effect (docs/models.md, "Lowering").
//!
//! The graph per token: EMBED; per layer RMSNORM, q/k/v GEMV tiles (with q/k/v biases when the
//! model has them), reshape bridges, ROPE q/k (positions from the `pos` input), KV_APPEND k/v
//! into the layer's caches (in place), ATTENTION_TILE (or split-KV shards + ATTENTION_COMBINE),
//! o tiles, residual ADD, RMSNORM, gate/up tiles, SILU_MUL, down tiles, residual ADD; then the
//! final RMSNORM, the LM-head tiles into the `logits` output and (optionally) SAMPLE_ARGMAX into
//! `next_token`. Tasks are emitted in a topological order, which the SM assignment relies on.
//!
//! Knobs: `tiling.gemv.{N_tile, base_width, sm_multiple}` and
//! `tiling.attention.{n_partitions, own_sms}` shape the graph and where it runs;
//! `fusion_grouping` fuses op groups into FUSED tasks ([`FUSIBLE`]); `sm_assignment` writes
//! `Task.sm` ([`sm`]); `page_allocation` shares activation memory ([`pages`]).
//! `pipelining_depth`, `threads_per_block` and `smem_bytes_per_block` are kernel-build knobs:
//! recorded in the program's config for the backend.
//!
//! Positions live in device memory: every task that depends on the position (ROPE,
//! KV_APPEND, the attention, QKV_ROPE_APPEND) reads it from the `pos` buffer, and the
//! attention's params are a static window of the cache that the position clips. Moving to the
//! next token changes no param: the host sets `pos` (an IO input), or, in a program lowered
//! with [`DecodeLoop`], the program's tail advances it itself (a STATE buffer) and the program
//! runs many passes in one launch ([`amk_core::StepLoop`]; the interface is
//! [`amk_core::decode`]).

mod layer;
pub mod pages;
pub mod prefill;
pub mod sm;
mod weights;

use layer::{LayerCtx, Layout, StepDims, StepIo};
use weights::{LayerWeights, Weights};

use crate::config::RopeScaling;
use crate::error::ModelError;
use crate::model::{EMBED, FINAL_NORM, LM_HEAD, Model, ROPE_FREQS};
use amk_core::json::{Map, Value};
use amk_core::{
    BufferId, BufferKind, CounterId, DType, GpuTarget, Opcode, Program, ScheduleConfig, TaskId,
    Tensor, WeightStore, decode,
};
use std::sync::Arc;

/// Default KV-cache length (capped by the model's `max_position_embeddings`).
pub const DEFAULT_MAX_SEQ: u64 = 4096;
/// At most this many GEMV tiles per projection (wider tiles beyond it), as in the reference.
pub const MAX_TILES: u64 = 64;
/// Default GEMV tile width when `tiling.gemv.N_tile` is not set.
pub const DEFAULT_BASE_WIDTH: u64 = 32;
/// Largest KV cache (all layers, K and V) a lowering may ask for; beyond it `--max-seq` is
/// almost certainly a mistake that would exhaust memory at load time.
pub const MAX_KV_BYTES: u64 = 16 << 30;
/// Most split-KV shards per layer.
pub const MAX_PARTITIONS: u64 = 8;

/// Op groups `fusion_grouping` may name:
/// * `["embed", "rope"]` turns each reshape bridge + ROPE pair (q and k of every layer) into one
///   FUSED task, saving two tasks and two counters per layer-projection;
/// * `["gemv", "add"]` folds each residual ADD into the projection before it (o_proj,
///   down_proj): the GEMV tiles take the residual stream as their bias input, so
///   `h + W·x` is one phase instead of two (one rounding instead of two in f16/bf16);
/// * `["rmsnorm", "gemv"]` folds every RMSNORM into the projections that read it: each tile
///   normalises the row itself (RMSNORM_GEMV, or the norm input of the fused ops below);
/// * `["gemv", "silu_mul"]` makes the gate/up projections and SILU_MUL one set of
///   GATE_UP_SILU tiles;
/// * `["gemv", "rope", "kv_append"]` makes the Q/K/V projections, the reshapes, ROPE and
///   KV_APPEND one set of QKV_ROPE_APPEND tiles (models without attention biases);
/// * `["attention", "gemv"]` makes each layer's attention and its output projection one set of
///   ATTENTION_GEMV tiles: every tile computes the attention itself (a few KB of q and cache
///   rows at the first positions), so the attention's phase and its two hand-offs go. It needs
///   `attention.n_partitions` 1; SMs `attention.own_sms` reserves then idle.
///
/// The fused ops round every intermediate as the unfused program stores it, so on the CPU VM a
/// fused program's logits equal the unfused one's.
pub const FUSIBLE: &[&[&str]] = &[
    &["embed", "rope"],
    &["gemv", "add"],
    &["rmsnorm", "gemv"],
    &["gemv", "silu_mul"],
    &["gemv", "rope", "kv_append"],
    &["attention", "gemv"],
];

/// Whether `cfg.fusion_grouping` names `group`.
fn fuses(cfg: &ScheduleConfig, group: &[&str]) -> bool {
    cfg.fusion_grouping
        .iter()
        .any(|g| g.len() == group.len() && g.iter().zip(group).all(|(a, b)| a == b))
}

/// Options that are not part of the search space.
#[derive(Debug, Clone, PartialEq)]
pub struct LowerOptions {
    /// Activation, cache and weight dtype (F32, F16 or BF16).
    pub dtype: DType,
    /// KV-cache length; `None` = [`DEFAULT_MAX_SEQ`] capped by `max_position_embeddings`.
    pub max_seq: Option<u64>,
    /// Append SAMPLE_ARGMAX → `next_token` (I32) after the logits (ignored with
    /// `decode_loop`, whose tail chooses the next token itself).
    pub argmax: bool,
    /// Lower the program as the body of a decode loop on the device.
    pub decode_loop: Option<DecodeLoop>,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            dtype: DType::F32,
            max_seq: None,
            argmax: true,
            decode_loop: None,
        }
    }
}

/// A decode program that runs many passes in one launch: the position and the token are
/// STATE buffers, and a NEXT_TOKEN tail picks the next token (the prompt's next one, or a
/// sampled one streamed through the host-mapped `emitted` rows), advances the position and
/// decides whether the loop halts; the program carries a [`amk_core::StepLoop`] gated on it.
/// Buffer names and input layouts: [`amk_core::decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLoop {
    /// Stop-token slots (the `stop` input's length, at least 1).
    pub stop_slots: u64,
}

impl Default for DecodeLoop {
    fn default() -> Self {
        DecodeLoop { stop_slots: 8 }
    }
}

/// Rows of shard `i` of `n` over `kv_len` rows: `(start, len)`; trailing shards may be empty
/// (start clamped to `kv_len`, len 0).
pub fn shard_range(kv_len: u64, i: u64, n: u64) -> (u64, u64) {
    let size = kv_len.div_ceil(n.max(1)).max(1);
    let start = (i * size).min(kv_len);
    (start, size.min(kv_len - start))
}

/// Rows a split's size is a multiple of unless `tiling.attention.split_chunk` says otherwise:
/// at position 0 one split a KV head works; from `n_splits × 64` rows on, every split.
pub const DEFAULT_SPLIT_CHUNK: u64 = 64;

/// A layer's split-KV attention (`tiling.attention.split_kv`): its geometry and the cache
/// length it runs over.
#[derive(Debug, Clone, Copy)]
pub struct SplitPlan {
    /// Heads, splits per KV head and the split granularity.
    pub geometry: op_attention_split::SplitGeometry,
    /// KV-cache length.
    pub max_seq: u64,
    /// Query heads an ATTENTION_MERGE task merges (`attention.merge_heads`), or `None`: the
    /// output projection's COMBINE_GEMV tiles merge the partials themselves.
    pub merge_heads: Option<u64>,
}

/// The split-KV plan of `cfg` for model `mc` with a cache of `max_seq` rows on `target`, if it
/// asks for one: `split_kv = n` allows up to `n` splits a KV head, and the lowering takes as
/// many as fill the grid once (`num_sms / n_kv_heads`, at least 1, at most `n` and
/// [`op_attention_split::MAX_SPLITS`]); `split_chunk` sets the granularity; `merge_heads = m`
/// merges the partials in ATTENTION_MERGE tasks of `m` query heads (at most all of them)
/// before plain GEMV tiles project the row, instead of in every COMBINE_GEMV tile.
pub fn split_plan(
    cfg: &ScheduleConfig,
    target: &GpuTarget,
    mc: &crate::config::ModelConfig,
    max_seq: u64,
) -> Result<Option<SplitPlan>, ModelError> {
    let nkv = mc.n_kv_heads as u64;
    let Some(cap) = cfg.tile("attention", "split_kv") else {
        return Ok(None);
    };
    let max = op_attention_split::MAX_SPLITS as u64;
    if cap as u64 > max {
        return Err(ModelError::Lower(format!(
            "tiling attention.split_kv = {cap}: at most {max} splits a KV head"
        )));
    }
    let fill = (target.num_sms.max(1) as u64 / nkv.max(1)).max(1);
    let chunk = cfg
        .tile("attention", "split_chunk")
        .map_or(DEFAULT_SPLIT_CHUNK, |c| c.max(1) as u64);
    let nh = mc.n_heads as u64;
    let merge_heads = cfg
        .tile("attention", "merge_heads")
        .map(|m| (m.max(1) as u64).min(nh.max(1)));
    Ok(Some(SplitPlan {
        geometry: op_attention_split::SplitGeometry {
            hd: mc.head_dim as u64,
            nh: mc.n_heads as u64,
            nkv,
            n_splits: (cap as u64).min(fill),
            chunk,
        },
        max_seq,
        merge_heads,
    }))
}

/// A lowered model: the program, its weights (named by buffer `source`, cast to the program
/// dtype), and how positions move.
#[derive(Debug, Clone)]
pub struct Lowered {
    /// The decode program (not yet validated).
    pub program: Program,
    /// Weights to bind (WeightStore::bind) — shared with the model where no cast was needed.
    pub weights: WeightStore,
    /// KV-cache length: positions run `0..max_seq`.
    pub max_seq: u64,
    /// Page statistics, when pages were allocated.
    pub page_stats: Option<pages::PageStats>,
}

/// GEMV tile width for an `n`-wide projection under `cfg` on `num_sms` SMs.
///
/// * `gemv.sm_multiple = m` (m ≥ 1): about `m × num_sms` tiles, each a multiple of
///   [`SM_TILE_ROWS`] rows (so every warp of a block gets whole rows) and at least that many.
///   Every phase then streams on every SM — the reference's rule below leaves half the chip
///   idle in the 1B down-projection and puts a 1B LM head on 64 SMs with 8 MB each.
/// * otherwise the reference's rule: `N_tile` clamped to `[1, n]`, else `max(16, base_width)`;
///   widened so no projection exceeds [`MAX_TILES`] tiles.
pub fn gemv_tile_width(cfg: &ScheduleConfig, n: u64, num_sms: u64) -> u64 {
    if let Some(m) = cfg.tile("gemv", "sm_multiple").filter(|&m| m >= 1) {
        return sm_tile_width(n, (m as u64).saturating_mul(num_sms.max(1)));
    }
    let w = match cfg.tile("gemv", "N_tile") {
        Some(t) => (t.max(1) as u64).min(n).max(1),
        None => {
            let base = cfg
                .tile("gemv", "base_width")
                .map_or(DEFAULT_BASE_WIDTH, |b| b.max(1) as u64);
            base.max(16).min(n).max(1)
        }
    };
    if n.div_ceil(w) > MAX_TILES {
        n.div_ceil(MAX_TILES)
    } else {
        w
    }
}

/// The width of about `tiles` GEMV tiles over `n` rows: a multiple of [`SM_TILE_ROWS`] (every
/// warp of a block gets whole rows), at least that, at most `n`.
pub fn sm_tile_width(n: u64, tiles: u64) -> u64 {
    let w = n.div_ceil(tiles.max(1)).next_multiple_of(SM_TILE_ROWS);
    w.max(SM_TILE_ROWS).min(n).max(1)
}

/// How many of `num_sms` SMs each of several projections that read the same input (Q, K, V;
/// gate, up) spans under `gemv.sm_multiple`: shares in proportion to their rows (largest
/// remainders, at least 1 each). The load-balancing SM assignment then puts the projections
/// of one phase on disjoint SMs, so that no SM streams two tiles of a phase one after the
/// other while another has none: every task pays a fixed cost (its wait, descriptor loads and
/// signal, about 5 µs on the H100 — docs/perf-notes.md), and a phase lasts as long as its
/// slowest SM.
pub fn sm_shares(num_sms: u64, rows: &[u64]) -> Vec<u64> {
    let total: u64 = rows.iter().sum();
    let sms = num_sms.max(rows.len() as u64);
    if total == 0 {
        return vec![sms; rows.len()];
    }
    let mut share: Vec<u64> = rows.iter().map(|&r| (sms * r / total).max(1)).collect();
    // Raising a zero share to 1 may overshoot: take the excess from the largest shares.
    while share.iter().sum::<u64>() > sms {
        let (i, _) = share
            .iter()
            .enumerate()
            .max_by_key(|&(i, s)| (*s, std::cmp::Reverse(i)))
            .unwrap_or((0, &0));
        share[i] -= 1;
    }
    // Largest remainder first; ties to the earlier projection.
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse((sms * rows[i]) % total));
    let mut left = sms - share.iter().sum::<u64>();
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        share[i] += 1;
        left -= 1;
    }
    share
}

/// The schedule the CUDA megakernel runs fastest with (docs/perf-notes.md has the
/// measurements): every projection split over all SMs (`gemv.sm_multiple` 1), the attention
/// split over them too (`attention.split_kv`, [`TUNED_SPLIT_KV`]; its time then stays nearly
/// flat with the position) with its partials merged once by merge tasks
/// (`attention.merge_heads`, [`TUNED_MERGE_HEADS`]), the decode loop's tail merging summaries
/// of the logits (`next_token.stats_slots`, [`TUNED_STATS_SLOTS`]), every fusion of
/// [`FUSIBLE`] but the reshape+ROPE one (which the Q/K/V fusion subsumes) and the
/// load-balancing SM assignment.
/// The default [`ScheduleConfig`] keeps the reference's tiling.
pub fn tuned_schedule() -> ScheduleConfig {
    let group = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    ScheduleConfig {
        tiling: vec![
            (
                "gemv".into(),
                vec![
                    ("sm_multiple".into(), 1),
                    ("alternate_max_kb".into(), ALTERNATE_MAX_KB),
                ],
            ),
            (
                "attention".into(),
                vec![
                    ("split_kv".into(), TUNED_SPLIT_KV),
                    ("split_chunk".into(), DEFAULT_SPLIT_CHUNK as i64),
                    ("merge_heads".into(), TUNED_MERGE_HEADS),
                    ("own_sms_alternating".into(), 1),
                ],
            ),
            (
                "next_token".into(),
                vec![("stats_slots".into(), TUNED_STATS_SLOTS)],
            ),
        ],
        fusion_grouping: vec![
            group(&["gemv", "add"]),
            group(&["rmsnorm", "gemv"]),
            group(&["gemv", "silu_mul"]),
            group(&["gemv", "rope", "kv_append"]),
        ],
        ..ScheduleConfig::default()
    }
}

/// The schedule of the short-context decode program that goes with `cfg`: `cfg` with one
/// split a KV head (`attention.split_kv` 1: each KV head's attention one task, which writes
/// its heads' normalised rows, and the output projection plain GEMV tiles); `None` when `cfg`
/// does not split the attention over several splits a KV head. Why: the split layout's merge
/// in every output projection tile costs a layer ~7 µs at every position, more than one task
/// a KV head takes to walk a short cache (docs/perf-notes.md round 36). The tuned schedule's
/// `attention.own_sms_alternating` then gives a small model's KV-head tasks an SM each of their
/// own (SmolLM2 2–3 % faster at the first positions, round 58).
pub fn short_context_schedule(cfg: &ScheduleConfig) -> Option<ScheduleConfig> {
    if cfg.tile("attention", "split_kv")? <= 1 {
        return None;
    }
    let mut short = cfg.clone();
    for (group, keys) in &mut short.tiling {
        if group == "attention" {
            for (key, value) in keys.iter_mut() {
                if key == "split_kv" {
                    *value = 1;
                }
            }
        }
    }
    Some(short)
}

/// The tuned schedule's `attention.split_kv`: up to 16 splits a KV head, so that a Llama with
/// 8 KV heads spreads its attention over 128 SMs at long context (docs/perf-notes.md round 26).
pub const TUNED_SPLIT_KV: i64 = 16;

/// The tuned schedule's `attention.merge_heads`: the split attention's partials merged by
/// ATTENTION_MERGE tasks of 4 query heads (a KV head's on the Llama 3 shapes) before plain GEMV
/// tiles project the row, instead of in each of the ~130 output-projection tiles: the 1B 7–8 %
/// faster at every position, the 8B 5–7 %, SmolLM2 1–7 % (docs/perf-notes.md round 39).
pub const TUNED_MERGE_HEADS: i64 = 4;

/// The tuned schedule's `next_token.stats_slots`: the decode loop's tail merges 128 LOGIT_STATS
/// summaries of the logits (one a task, on as many SMs) instead of reading the whole row on one
/// SM: the tail 28 → 15 µs a pass, decode +0.8 to +1.3 % end to end on the SmolLM2 and 1B
/// shapes (docs/perf-notes.md round 40).
pub const TUNED_STATS_SLOTS: i64 = 128;

/// How the decode loop's tail summarises the logits: `slots` LOGIT_STATS slots of `cols`
/// logits each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsLayout {
    /// Slots (tasks), covering the row exactly.
    pub slots: u64,
    /// Logits a slot: a multiple of 8, so every slot of a 16-bit or f32 row starts 16-byte
    /// aligned (the device's vector loads).
    pub cols: u64,
}

/// The tail's summary layout for a row of `vocab` logits under `cfg`
/// (`next_token.stats_slots = n`: about `n` slots; absent or below 1: none, and NEXT_TOKEN reads
/// the row itself).
pub fn stats_layout(cfg: &ScheduleConfig, vocab: u64) -> Option<StatsLayout> {
    let n = cfg.tile("next_token", "stats_slots").filter(|&n| n >= 1)? as u64;
    Some(StatsLayout::about(n, vocab))
}

impl StatsLayout {
    /// The params of slot `g`'s LOGIT_STATS task.
    pub(crate) fn slot_params(&self, g: u64) -> Map {
        params(&[
            ("cols", int(self.cols)),
            ("N_tile", int(1)),
            ("n_off", int(g)),
        ])
    }

    /// About `n` (≥ 1) slots over a row of `vocab` logits.
    pub fn about(n: u64, vocab: u64) -> StatsLayout {
        let cols = vocab.div_ceil(n.max(1)).next_multiple_of(8).max(8);
        StatsLayout {
            slots: vocab.div_ceil(cols).max(1),
            cols,
        }
    }
}

/// The tuned schedule's `gemv.alternate_max_kb`: SmolLM2-135M's largest layer projection
/// (gate/up, 3.4 MiB in bf16) alternates and gained 0.07 ms a token on the H100; TinyLlama's
/// (44 MiB) lost 0.25 ms alternating and the Llama-3.2-1B's (64 MiB) 0.19 ms
/// (docs/perf-notes.md round 21). No shape between 3.4 and 44 MiB was measured; 8 MiB keeps
/// SmolLM2 in f32 (6.8 MiB) too.
pub const ALTERNATE_MAX_KB: i64 = 8192;

/// Whether a layer's projections alternate between halves of the SMs (`gemv.alternate_max_kb
/// = k`, with `gemv.sm_multiple`): every projection of a layer (Q/K/V together, the output,
/// gate/up together, down) holds at most `k` KiB of weights at `dbytes` a weight.
///
/// Why: a small model's phase is fixed cost, not bytes (docs/perf-notes.md round 18 §7). When
/// a phase's tiles run on SMs that ran the phase before, each waits for its SM to finish,
/// signal and set it up, and the last of them ends the phase late (round 20 §7). Tiled for
/// half the SMs, each phase runs on SMs that idled through the phase before, so its tiles
/// have their weights in registers before their counters complete (`AMK_ROW_PRE`). A large
/// model's phase is its bytes, which half the SMs stream more slowly.
pub fn alternates(cfg: &ScheduleConfig, mc: &crate::config::ModelConfig, dbytes: u64) -> bool {
    let Some(kb) = cfg.tile("gemv", "alternate_max_kb").filter(|&k| k >= 1) else {
        return false;
    };
    if cfg.tile("gemv", "sm_multiple").is_none_or(|m| m < 1) {
        return false;
    }
    let (h, hd) = (mc.hidden as u64, mc.head_dim as u64);
    let q = mc.n_heads as u64 * hd;
    let kv = mc.n_kv_heads as u64 * hd;
    let inter = mc.intermediate as u64;
    let largest = [(q + 2 * kv) * h, q * h, 2 * inter * h, inter * h]
        .into_iter()
        .max()
        .unwrap_or(0);
    largest.saturating_mul(dbytes) <= (kb as u64) << 10
}

/// Row granularity of `gemv.sm_multiple` tiles: the CUDA backend's warps per block.
pub const SM_TILE_ROWS: u64 = 8;

const TILING_KEYS: &[(&str, &[&str])] = &[
    (
        "gemv",
        &["N_tile", "base_width", "sm_multiple", "alternate_max_kb"],
    ),
    (
        "attention",
        &[
            "n_partitions",
            "kv_block",
            "own_sms",
            "own_sms_alternating",
            "split_kv",
            "split_chunk",
            "merge_heads",
        ],
    ),
    ("next_token", &["stats_slots"]),
];

fn check_config(cfg: &ScheduleConfig, target: &GpuTarget) -> Result<(), ModelError> {
    let mut bad = cfg.kernel_knob_errors(Some(target));
    for (group, kvs) in &cfg.tiling {
        match TILING_KEYS.iter().find(|(g, _)| g == group) {
            None => bad.push(format!(
                "unknown tiling group '{group}' (known: {})",
                TILING_KEYS
                    .iter()
                    .map(|(g, _)| *g)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some((_, keys)) => {
                for (k, v) in kvs {
                    if !keys.contains(&k.as_str()) {
                        bad.push(format!(
                            "unknown tiling key '{group}.{k}' (known: {})",
                            keys.join(", ")
                        ));
                    } else if *v < 1 {
                        bad.push(format!("tiling '{group}.{k}' = {v} must be at least 1"));
                    }
                }
            }
        }
    }
    for g in &cfg.fusion_grouping {
        if !FUSIBLE
            .iter()
            .any(|f| f.len() == g.len() && f.iter().zip(g).all(|(a, b)| a == b))
        {
            bad.push(format!(
                "fusion group {g:?} is not supported (supported: {})",
                FUSIBLE
                    .iter()
                    .map(|f| format!("{f:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(ModelError::Lower(bad.join("; ")))
    }
}

fn int(v: u64) -> Value {
    Value::Int(v as i64)
}

fn params(kv: &[(&str, Value)]) -> Map {
    let mut m = Map::new();
    for (k, v) in kv {
        m.insert(*k, v.clone());
    }
    m
}

struct Builder<'a> {
    p: Program,
    cfg: &'a ScheduleConfig,
    num_sms: u64,
    dtype: DType,
    dbytes: i64,
    /// The model's RMS-norm epsilon (the fused tiles normalise with it).
    eps: Value,
}

/// A value some task produced: its buffer and what a consumer waits for.
#[derive(Clone, Copy)]
struct Val {
    buf: BufferId,
    wait: (CounterId, i64),
}

/// The row a projection multiplies: a value, or a value the tiles RMS-normalise themselves
/// with the norm weight `norm` (`["rmsnorm", "gemv"]`).
#[derive(Clone, Copy)]
struct Row {
    x: Val,
    norm: Option<BufferId>,
}

impl From<Val> for Row {
    fn from(x: Val) -> Row {
        Row { x, norm: None }
    }
}

/// The attention side of an output projection whose tiles make their row themselves
/// ([`Builder::attention_out`]): the op, its label stem, the inputs before `W`, their waits,
/// the params and the row's length `k`.
struct OutHead<'a> {
    op: Opcode,
    stem: &'a str,
    ins: &'a [BufferId],
    waits: &'a [(CounterId, i64)],
    params: &'a Map,
    k: u64,
}

/// A projection's input row `x` (`k` elements) and its weight `w`.
#[derive(Clone, Copy)]
struct ProjIn {
    x: Val,
    w: BufferId,
    k: u64,
}

/// The residual stream (`[1, h]`) a projection adds its output to.
#[derive(Clone, Copy)]
struct Residual {
    stream: Val,
    h: u64,
}

/// What a layer's attention reads: the query row, the caches, the position, and the waits
/// for them.
#[derive(Clone, Copy)]
struct AttnIn<'a> {
    q: BufferId,
    k_cache: BufferId,
    v_cache: BufferId,
    pos: BufferId,
    waits: &'a [(CounterId, i64)],
}

/// Where a layer's attention goes: layer `l`'s output projection `wo`, the residual stream it
/// adds to, in the projection's tiles when `fuse` (`["gemv", "add"]`).
#[derive(Clone, Copy)]
struct AttnOut {
    wo: BufferId,
    resid: Residual,
    fuse: bool,
    l: usize,
}

/// The ATTENTION_MERGE tasks' params: the split attention's `shape`, its geometry, and the
/// query heads a task merges.
struct MergeShape<'a> {
    shape: &'a Map,
    geometry: op_attention_split::SplitGeometry,
    heads: u64,
}

/// The column tiles of a projection-like op ([`Builder::tiles`]): `units` output units in tiles
/// of `width` (the last one ragged), each unit streaming `rows` weight rows of `k` (the tasks'
/// cost).
#[derive(Clone, Copy)]
struct TileShape {
    k: u64,
    units: u64,
    width: u64,
    rows: u64,
}

/// What a decode loop's tail reads and writes besides its own buffers.
struct LoopTail {
    logits: Val,
    pos: BufferId,
    token: BufferId,
    max_seq: u64,
    vocab: u64,
}

impl Builder<'_> {
    /// The decode loop's tail (NEXT_TOKEN after the logits) and its interface buffers
    /// ([`amk_core::decode`]); returns the step loop it gates.
    fn next_token(&mut self, t: &LoopTail, dl: DecodeLoop) -> amk_core::StepLoop {
        let input = |b: &mut Builder<'_>, name: &str, dtype: DType, len: u64| {
            b.p.new_buffer(name, BufferKind::IO_INPUT, dtype, &[len])
        };
        let prompt = input(self, decode::PROMPT, DType::I32, t.max_seq);
        let stop = input(self, decode::STOP, DType::I32, dl.stop_slots.max(1));
        let limits = input(self, decode::LIMITS, DType::I32, decode::LIMITS_LEN);
        let sampling = input(self, decode::SAMPLING, DType::F32, decode::SAMPLING_LEN);
        let halt = self
            .p
            .new_buffer(decode::HALT, BufferKind::STATE, DType::I32, &[1]);
        let emitted = self.p.new_buffer(
            decode::EMITTED,
            BufferKind::STATE,
            DType::I32,
            &[t.max_seq, 2],
        );
        self.p.buffers[emitted as usize].space = amk_core::MemSpace::HOST;
        let mut ins = vec![t.logits.buf, t.pos, prompt, stop, limits, sampling];
        let mut wait = t.logits.wait;
        if let Some(stats) = self.logit_stats(t, limits) {
            ins.push(stats.buf);
            wait = stats.wait;
        }
        let gate = self.p.new_counter("next token");
        let task = self.p.push_task(
            Opcode::NEXT_TOKEN,
            &ins,
            &[t.pos, t.token, halt, emitted],
            gate,
            &[wait],
            Map::new(),
            "next_token",
        );
        if let Some(task) = self.p.tasks.get_mut(task as usize) {
            task.est_bytes = t.vocab as i64 * self.dbytes;
            task.est_flops = 4 * t.vocab as i64;
        }
        amk_core::StepLoop { gate, halt }
    }

    /// The logits summarised by slot for the tail (`next_token.stats_slots`, [`stats_layout`]):
    /// a LOGIT_STATS task a slot, each waiting for the whole row; `None` without the key.
    fn logit_stats(&mut self, t: &LoopTail, limits: BufferId) -> Option<Val> {
        let layout = stats_layout(self.cfg, t.vocab)?;
        let out = self.p.new_buffer(
            "logit_stats",
            BufferKind::ACTIVATION,
            DType::I32,
            &[op_logit_stats::ROWS, layout.slots],
        );
        let ctr = self.p.new_counter("logit stats ready");
        let cols = layout.cols as i64;
        for g in 0..layout.slots {
            let pr = layout.slot_params(g);
            self.task(
                Opcode::LOGIT_STATS,
                &[t.logits.buf, limits],
                out,
                ctr,
                &[t.logits.wait],
                pr,
                format!("logit_stats[{g}]"),
                (cols * self.dbytes, 4 * cols),
            );
        }
        Some(Val {
            buf: out,
            wait: (ctr, layout.slots as i64),
        })
    }

    fn act(&mut self, name: String, shape: &[u64]) -> BufferId {
        self.p
            .new_buffer(name, BufferKind::ACTIVATION, self.dtype, shape)
    }

    #[allow(clippy::too_many_arguments)] // reason: one task's full description
    fn task(
        &mut self,
        op: Opcode,
        ins: &[BufferId],
        out: BufferId,
        ctr: CounterId,
        waits: &[(CounterId, i64)],
        pr: Map,
        label: String,
        cost: (i64, i64),
    ) -> TaskId {
        let t = self.p.push_task(op, ins, &[out], ctr, waits, pr, label);
        if let Some(task) = self.p.tasks.get_mut(t as usize) {
            task.est_bytes = cost.0;
            task.est_flops = cost.1;
        }
        t
    }

    /// One task with its own counter; returns its value.
    #[allow(clippy::too_many_arguments)] // reason: one task's full description
    fn single(
        &mut self,
        op: Opcode,
        ins: &[BufferId],
        out: BufferId,
        waits: &[(CounterId, i64)],
        pr: Map,
        label: String,
        cost: (i64, i64),
    ) -> (Val, TaskId) {
        let c = self.p.new_counter(format!("{label} ready"));
        let t = self.task(op, ins, out, c, waits, pr, label, cost);
        (
            Val {
                buf: out,
                wait: (c, 1),
            },
            t,
        )
    }

    /// `resid + x @ w^T` (`x` of `k` columns, `resid` the `[1, h]` residual stream) into a new
    /// activation `out`. Fused (`["gemv", "add"]`): the tiles take the residual as their bias
    /// input (labels `{tag}_add[i]`). Otherwise tiles into the activation `tag`, then an ADD
    /// labelled `add_label`.
    fn proj_residual(
        &mut self,
        fuse: bool,
        input: ProjIn,
        residual: Residual,
        tag: &str,
        out: &str,
        add_label: &str,
    ) -> Val {
        let ProjIn { x, w, k } = input;
        let Residual { stream: resid, h } = residual;
        if fuse {
            let o = self.act(out.into(), &[1, h]);
            let bias = Some((resid.buf, Some(resid.wait)));
            return self.proj(
                x.into(),
                w,
                bias,
                o,
                k,
                h,
                &format!("{tag}_add"),
                self.num_sms,
            );
        }
        let y = self.act(tag.into(), &[1, h]);
        let y = self.proj(x.into(), w, None, y, k, h, tag, self.num_sms);
        self.residual_add(resid, y, h, out, add_label)
    }

    /// The unfused residual: an ADD task `resid + y` (both `[1, h]`) into a new activation
    /// `out`, labelled `label`.
    fn residual_add(&mut self, resid: Val, y: Val, h: u64, out: &str, label: &str) -> Val {
        let o = self.act(out.into(), &[1, h]);
        let cost = (2 * h as i64 * self.dbytes, h as i64);
        self.single(
            Opcode::ADD,
            &[resid.buf, y.buf],
            o,
            &[resid.wait, y.wait],
            Map::new(),
            label.into(),
            cost,
        )
        .0
    }

    /// Layer `l`'s attention and output projection as ATTENTION_GEMV tiles (`["attention",
    /// "gemv"]`): each tile attends over `(q, k_cache, v_cache)` (ready at `waits`) with the
    /// attention params `att`, then multiplies by its rows of `wo`. Fused with the residual
    /// (`["gemv", "add"]`) the tiles take `resid` as their bias (labels `L{l}.attn_o_add[i]`);
    /// otherwise they write the activation `L{l}.o` and an ADD follows. Every tile reads the
    /// position `pos` (its last input), which clips the attention window `att` to the rows
    /// written so far. Returns the residual stream after the attention.
    fn attention_proj(&mut self, ins: &AttnIn<'_>, att: Map, out: AttnOut) -> Val {
        let k = self.p.buffers[ins.q as usize].numel();
        let head = OutHead {
            op: Opcode::ATTENTION_GEMV,
            stem: "attn",
            ins: &[ins.q, ins.k_cache, ins.v_cache],
            waits: ins.waits,
            params: &att,
            k,
        };
        self.attention_out(&head, ins.pos, out)
    }

    /// Layer `l`'s attention as ATTENTION_SPLIT tasks (`tiling.attention.split_kv`): one per
    /// (KV head, split), every one reading the position `pos`, all writing one partials buffer
    /// and signalling one counter; then the output projection as COMBINE_GEMV tiles, which
    /// merge the partials themselves. Fused with the residual (`["gemv", "add"]`) the tiles
    /// take `resid` as their bias (labels `L{l}.combine_o_add[i]`); otherwise they write
    /// `L{l}.o` and an ADD follows. With one split a KV head the tasks write the normalised
    /// attention row `L{l}.attn` instead ([`op_attention_split::FLAG_NORMALIZED`]: nothing to
    /// merge) and the output projection is GEMV tiles over it. Returns the residual stream
    /// after the attention.
    fn split_attention(
        &mut self,
        ins: &AttnIn<'_>,
        plan: SplitPlan,
        scale: Value,
        out: AttnOut,
    ) -> Val {
        let AttnIn {
            q,
            k_cache: kc,
            v_cache: vc,
            pos,
            waits,
        } = *ins;
        let l = out.l;
        let g = plan.geometry;
        let normalized = g.n_splits == 1;
        let (dest, tile) = if normalized {
            let row = self.act(format!("L{l}.attn"), &[1, g.nh * g.hd]);
            (row, g.normalized_tile())
        } else {
            let partials = self.p.new_buffer(
                format!("L{l}.partials"),
                BufferKind::ACTIVATION,
                DType::F32,
                &[g.nkv, g.n_splits, g.rep(), g.hd + 2],
            );
            (partials, g.tile())
        };
        let shape = params(&[
            ("head_dim", int(g.hd)),
            ("n_heads", int(g.nh)),
            ("n_kv_heads", int(g.nkv)),
            ("n_splits", int(g.n_splits)),
            ("chunk", int(g.chunk)),
        ]);
        let ctr = self.p.new_counter(format!("L{l}.attention ready"));
        // Every split's share of the longest context: what the SM assignment balances.
        let rows = plan.max_seq.div_ceil(g.n_splits);
        let cost = (
            2 * (rows * g.hd) as i64 * self.dbytes,
            4 * (g.rep() * g.hd * rows) as i64,
        );
        for task in 0..g.nkv * g.n_splits {
            let mut pr = shape.clone();
            pr.insert("scale", scale.clone());
            pr.insert("N_tile", int(tile));
            pr.insert("n_off", int(task * tile));
            if normalized {
                pr.insert("flags", int(op_attention_split::FLAG_NORMALIZED as u64));
            }
            let (kv_head, split) = (task / g.n_splits, task % g.n_splits);
            self.task(
                Opcode::ATTENTION_SPLIT,
                &[q, kc, vc, pos],
                dest,
                ctr,
                waits,
                pr,
                format!("L{l}.attn_split[{kv_head}.{split}]"),
                cost,
            );
        }
        if normalized {
            let attn = Val {
                buf: dest,
                wait: (ctr, g.nkv as i64),
            };
            return self.output_projection(attn, g.nh * g.hd, out);
        }
        let partials = dest;
        let all_splits = (ctr, (g.nkv * g.n_splits) as i64);
        if let Some(heads) = plan.merge_heads {
            let merge = MergeShape {
                shape: &shape,
                geometry: g,
                heads,
            };
            let attn = self.merge_tasks(partials, pos, all_splits, &merge, l);
            return self.output_projection(attn, g.nh * g.hd, out);
        }
        // Every tile waits for every split.
        let head = OutHead {
            op: Opcode::COMBINE_GEMV,
            stem: "combine",
            ins: &[partials],
            waits: &[all_splits],
            params: &shape,
            k: g.nh * g.hd,
        };
        self.attention_out(&head, pos, out)
    }

    /// Layer `out.l`'s output projection of its finished attention row `attn` (`k` elements) by
    /// `out.wo`, with the residual (labels `L{l}.o…`, into `L{l}.h_mid`):
    /// [`Self::proj_residual`].
    fn output_projection(&mut self, attn: Val, k: u64, out: AttnOut) -> Val {
        let l = out.l;
        self.proj_residual(
            out.fuse,
            ProjIn {
                x: attn,
                w: out.wo,
                k,
            },
            out.resid,
            &format!("L{l}.o"),
            &format!("L{l}.h_mid"),
            &format!("L{l}.add_attn"),
        )
    }

    /// Layer `l`'s attention row `L{l}.attn` merged from the split partials by ATTENTION_MERGE
    /// tasks of `heads` query heads each (labels `L{l}.attn_merge[i]`), each waiting for every
    /// split (`splits`); returns the row with the wait for every merge.
    fn merge_tasks(
        &mut self,
        partials: BufferId,
        pos: BufferId,
        splits: (CounterId, i64),
        merge: &MergeShape<'_>,
        l: usize,
    ) -> Val {
        let (shape, g, heads) = (merge.shape, merge.geometry, merge.heads);
        let row = self.act(format!("L{l}.attn"), &[1, g.nh * g.hd]);
        let ctr = self.p.new_counter(format!("L{l}.attention merged"));
        let tasks = g.nh.div_ceil(heads);
        let splits_n = g.n_splits as i64;
        for i in 0..tasks {
            let h0 = i * heads;
            let n = heads.min(g.nh - h0);
            let mut pr = shape.clone();
            pr.insert("N_tile", int(n * g.hd));
            pr.insert("n_off", int(h0 * g.hd));
            // Bytes: every split's [acc | m | l] of its heads; flops: a multiply-add each.
            let cost = (
                splits_n * (n * (g.hd + 2)) as i64 * 4,
                2 * splits_n * (n * g.hd) as i64,
            );
            self.task(
                Opcode::ATTENTION_MERGE,
                &[partials, pos],
                row,
                ctr,
                &[splits],
                pr,
                format!("L{l}.attn_merge[{i}]"),
                cost,
            );
        }
        Val {
            buf: row,
            wait: (ctr, tasks as i64),
        }
    }

    /// Layer `l`'s output projection as `head.op` tiles that make their attention row from
    /// `head.ins` themselves: inputs `head.ins`, `wo`, the residual `resid` when fused with it
    /// (`["gemv", "add"]`: labels `L{l}.{stem}_o_add[i]`, into `L{l}.h_mid`), the position
    /// last; unfused they write `L{l}.o` (labels `L{l}.{stem}_o[i]`) and an ADD follows.
    /// Returns the residual stream after the attention.
    fn attention_out(&mut self, head: &OutHead<'_>, pos: BufferId, out: AttnOut) -> Val {
        let AttnOut {
            wo,
            resid: Residual { stream: resid, h },
            fuse: fuse_resid,
            l,
        } = out;
        let width = gemv_tile_width(self.cfg, h, self.num_sms);
        let mut waits = head.waits.to_vec();
        let mut ins = head.ins.to_vec();
        ins.push(wo);
        let stem = head.stem;
        let (out, label) = if fuse_resid {
            ins.push(resid.buf);
            waits.push(resid.wait);
            (
                self.act(format!("L{l}.h_mid"), &[1, h]),
                format!("L{l}.{stem}_o_add"),
            )
        } else {
            (
                self.act(format!("L{l}.o"), &[1, h]),
                format!("L{l}.{stem}_o"),
            )
        };
        ins.push(pos);
        let val = self.tiles(
            head.op,
            &ins,
            &[out],
            &waits,
            head.params,
            false,
            TileShape {
                k: head.k,
                units: h,
                width,
                rows: 1,
            },
            &label,
        );
        if fuse_resid {
            return val;
        }
        self.residual_add(
            resid,
            val,
            h,
            &format!("L{l}.h_mid"),
            &format!("L{l}.add_attn"),
        )
    }

    /// GEMV tiles of `x[1, k] @ w[n, k]^T (+ bias) -> out[1, n]` over `sms` SMs (all of them,
    /// or a share: [`sm_shares`]), one counter. The bias may be another task's output (a
    /// residual stream, with the wait on its counter), then waited for as well. A row with a
    /// norm weight makes them RMSNORM_GEMV tiles (`[x, norm, w (, bias)]` and `eps`).
    #[allow(clippy::too_many_arguments)] // reason: one projection's full description
    fn proj(
        &mut self,
        x: Row,
        w: BufferId,
        bias: Option<(BufferId, Option<(CounterId, i64)>)>,
        out: BufferId,
        k: u64,
        n: u64,
        label: &str,
        sms: u64,
    ) -> Val {
        let mut waits = vec![x.x.wait];
        waits.extend(bias.and_then(|(_, wait)| wait));
        let bias = bias.map(|(b, _)| b);
        let width = gemv_tile_width(self.cfg, n, sms);
        let mut ins = vec![x.x.buf];
        ins.extend(x.norm);
        ins.push(w);
        ins.extend(bias);
        let op = if x.norm.is_some() {
            Opcode::RMSNORM_GEMV
        } else {
            Opcode::GEMV_TILE
        };
        let shape = TileShape {
            k,
            units: n,
            width,
            rows: 1,
        };
        self.tiles(
            op,
            &ins,
            &[out],
            &waits,
            &Map::new(),
            x.norm.is_some(),
            shape,
            label,
        )
    }

    /// An RMS norm of `x` (`[1, h]`) with weight `nw`: its own RMSNORM task (output
    /// `{prefix}.{name}`, label `{prefix}.{label}`; no prefix: bare names), or — fused — the row
    /// the consuming tiles normalise themselves.
    #[allow(clippy::too_many_arguments)] // reason: one norm's full description
    fn norm_row(
        &mut self,
        fuse: bool,
        x: Val,
        nw: BufferId,
        h: u64,
        prefix: &str,
        name: &str,
        label: &str,
    ) -> Row {
        if fuse {
            return Row { x, norm: Some(nw) };
        }
        let named = |s: &str| {
            if prefix.is_empty() {
                s.to_string()
            } else {
                format!("{prefix}.{s}")
            }
        };
        let y = self.act(named(name), &[1, h]);
        let pr = params(&[("eps", self.eps.clone()), ("hidden", int(h))]);
        let cost = (h as i64 * self.dbytes, 4 * h as i64);
        self.single(
            Opcode::RMSNORM,
            &[x.buf, nw],
            y,
            &[x.wait],
            pr,
            named(label),
            cost,
        )
        .0
        .into()
    }

    /// Tiles of a fused op over `units` output units (`width` each, the last one ragged), all
    /// over `[x] + operands (+ norm)` with params `base` plus the tile's `K`/`N_tile`/`n_off`
    /// (and `eps` with a norm), one counter; each unit streams `rows` weight rows of `k`.
    /// Returns the value (the first output).
    #[allow(clippy::too_many_arguments)] // reason: one fused op's full description
    fn fused_tiles(
        &mut self,
        op: Opcode,
        x: Row,
        operands: &[BufferId],
        outs: &[BufferId],
        shape: TileShape,
        base: &Map,
        label: &str,
    ) -> Val {
        self.fused_tiles_then(op, x, operands, &[], outs, shape, base, label)
    }

    /// [`Self::fused_tiles`] with `tail` inputs after the norm weight (QKV_ROPE_APPEND's RoPE
    /// frequency factors).
    #[allow(clippy::too_many_arguments)] // reason: fused_tiles' description plus the tail
    fn fused_tiles_then(
        &mut self,
        op: Opcode,
        x: Row,
        operands: &[BufferId],
        tail: &[BufferId],
        outs: &[BufferId],
        shape: TileShape,
        base: &Map,
        label: &str,
    ) -> Val {
        let mut ins = vec![x.x.buf];
        ins.extend_from_slice(operands);
        ins.extend(x.norm);
        ins.extend_from_slice(tail);
        let norm = x.norm.is_some();
        self.tiles(op, &ins, outs, &[x.x.wait], base, norm, shape, label)
    }

    /// The column tiles of one projection-like op, one counter: params `base`, then the
    /// tile's `K`/`N_tile`/`n_off`, then `eps` when `norm`; the tiles cover `shape`. Returns
    /// the value (the first output).
    #[allow(clippy::too_many_arguments)] // reason: one tiled op's full description
    fn tiles(
        &mut self,
        op: Opcode,
        ins: &[BufferId],
        outs: &[BufferId],
        waits: &[(CounterId, i64)],
        base: &Map,
        norm: bool,
        shape: TileShape,
        label: &str,
    ) -> Val {
        let TileShape {
            k,
            units,
            width,
            rows,
        } = shape;
        let c = self.p.new_counter(format!("{label} ready"));
        let (mut n_tasks, mut off) = (0i64, 0u64);
        while off < units {
            let nt = width.min(units - off);
            let mut pr = base.clone();
            for (key, v) in [("K", k), ("N_tile", nt), ("n_off", off)] {
                pr.insert(key, int(v));
            }
            if norm {
                pr.insert("eps", self.eps.clone());
            }
            let t = self
                .p
                .push_task(op, ins, outs, c, waits, pr, format!("{label}[{n_tasks}]"));
            if let Some(task) = self.p.tasks.get_mut(t as usize) {
                task.est_bytes = (rows * k * nt) as i64 * self.dbytes;
                task.est_flops = 2 * (rows * k * nt) as i64;
            }
            n_tasks += 1;
            off += nt;
        }
        Val {
            buf: outs[0],
            wait: (c, n_tasks),
        }
    }
}

/// Casts `t` (named `name`) to `dtype`, sharing it when it already has that dtype. A value
/// beyond F16's range is an error rather than a silent infinity.
fn cast(name: &str, t: &Arc<Tensor>, dtype: DType) -> Result<Arc<Tensor>, ModelError> {
    if t.dtype() == dtype {
        return Ok(Arc::clone(t));
    }
    let values = t.to_f32_vec();
    if dtype == DType::F16
        && let Some(x) = values.iter().find(|x| x.abs() > 65504.0)
    {
        return Err(ModelError::Lower(format!(
            "weight '{name}' holds {x}, beyond F16's range (use --dtype bf16 or f32)"
        )));
    }
    Tensor::from_f32(dtype, t.shape(), &values)
        .map(Arc::new)
        .map_err(|e| ModelError::Lower(format!("casting weight '{name}' to {dtype}: {e}")))
}

/// The dtypes a program may be lowered in (weights, activations and caches): the float ones.
fn check_dtype(dtype: DType) -> Result<(), ModelError> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        _ => Err(ModelError::Lower(format!(
            "dtype {dtype} is not supported for lowering (F32, F16, BF16)"
        ))),
    }
}

/// Lowers `model` to its single-token decode program for `target` under `cfg`.
pub fn lower(
    model: &Model,
    cfg: &ScheduleConfig,
    target: &GpuTarget,
    opts: &LowerOptions,
) -> Result<Lowered, ModelError> {
    lower_sharing(model, cfg, target, opts, WeightStore::new())
}

/// [`lower`] starting from `weights` (another lowering's of the same model and dtype): tensors
/// already there are not cast again, so a second decode program of the same model (another
/// schedule) costs no second copy of its weights.
pub fn lower_sharing(
    model: &Model,
    cfg: &ScheduleConfig,
    target: &GpuTarget,
    opts: &LowerOptions,
    weights: WeightStore,
) -> Result<Lowered, ModelError> {
    check_config(cfg, target)?;
    let mc = &model.config;
    let d = StepDims::check(mc, opts.dtype, opts.max_seq)?;
    let layout = Layout::of(cfg, target, mc, &d)?;
    let mut b = Builder {
        p: Program::new(),
        cfg,
        num_sms: layout.layer_sms,
        dtype: opts.dtype,
        dbytes: d.dbytes,
        eps: Value::Float(mc.rms_eps),
    };
    let mut w = Weights::new(model, opts.dtype, weights);
    // Llama 3's RoPE frequency scaling: per-pair divisors, an f32 weight that ROPE takes as its
    // third input and the Q/K/V tiles as their last (`rope_factors` = 1).
    let rope_factors = match rope_factors(model)? {
        Some(f) => {
            let half = f.numel() as u64;
            w.store.insert(ROPE_FREQS, f);
            Some(b.p.new_weight(ROPE_FREQS, DType::F32, &[half], ROPE_FREQS))
        }
        None => None,
    };
    describe_decode(&mut b.p, model, cfg, target, opts, d.max_seq);
    let (token, io) = step_buffers(&mut b.p, opts);
    let table = w.buffer(&mut b.p, EMBED)?;
    let h0 = b.act("h0".into(), &[1, d.h]);
    let (mut resid, _) = b.single(
        Opcode::EMBED,
        &[token, table],
        h0,
        &[],
        params(&[("hidden", int(d.h))]),
        "embed".into(),
        (d.h as i64 * d.dbytes, 0),
    );
    let ctx = LayerCtx {
        d: &d,
        layout: &layout,
        io,
        rope_factors,
        qk_norm_units: qkv_tile_max_units(mc),
        theta: Value::Float(mc.rope_theta),
        scale: Value::Float(1.0 / (d.hd as f64).sqrt()),
    };
    for l in 0..mc.n_layers {
        let lw = LayerWeights::load(&mut b.p, &mut w, l)?;
        resid = b.layer(&ctx, &lw, l, resid);
    }
    let fnorm = w.buffer(&mut b.p, FINAL_NORM)?;
    let hf = b.norm_row(layout.fuse_norm, resid, fnorm, d.h, "", "hf", "final_norm");
    let head = if mc.tie_word_embeddings {
        table
    } else {
        w.buffer(&mut b.p, LM_HEAD)?
    };
    let tail = Tail {
        head,
        token,
        pos: io.pos,
    };
    b.logits_and_tail(&d, &layout, hf, &tail, opts);
    let Builder { mut p, .. } = b;
    let page_stats = place(&mut p, cfg, target, &layout)?;
    Ok(Lowered {
        program: p,
        weights: w.store,
        max_seq: d.max_seq,
        page_stats,
    })
}

/// The program's description (`meta`), target and schedule.
fn describe_decode(
    p: &mut Program,
    model: &Model,
    cfg: &ScheduleConfig,
    target: &GpuTarget,
    opts: &LowerOptions,
    max_seq: u64,
) {
    let meta = &mut p.meta;
    meta.insert("model", Value::from(model.source.clone()));
    meta.insert("gpu", Value::from(target.name.clone()));
    meta.insert("regime", Value::from("decode"));
    meta.insert("max_seq", int(max_seq));
    meta.insert("dtype", Value::from(opts.dtype.name().to_string()));
    meta.insert("n_layers", int(model.config.n_layers as u64));
    p.target = Some(target.clone());
    p.config = Some(cfg.clone());
}

/// The step's token, position and reshape-id buffers: in a decode loop the program carries
/// its position and token from pass to pass (STATE), otherwise they are inputs.
fn step_buffers(p: &mut Program, opts: &LowerOptions) -> (BufferId, StepIo) {
    let carried = if opts.decode_loop.is_some() {
        BufferKind::STATE
    } else {
        BufferKind::IO_INPUT
    };
    let token = p.new_buffer(decode::TOKEN, carried, DType::I32, &[1]);
    let pos = p.new_buffer(decode::POS, carried, DType::I32, &[1]);
    let rid = p.new_buffer(decode::RESHAPE_ID, BufferKind::IO_INPUT, DType::I32, &[1]);
    (token, StepIo { pos, rid })
}

/// What the program's tail reads: the LM head's weight, the step's token and position.
struct Tail {
    head: BufferId,
    token: BufferId,
    pos: BufferId,
}

impl Builder<'_> {
    /// The logits of the normalised row `hf` (the LM head over every SM but the attention's,
    /// alternating or not), then the decode loop's tail or an argmax when asked for.
    fn logits_and_tail(
        &mut self,
        d: &StepDims,
        layout: &Layout,
        hf: Row,
        t: &Tail,
        opts: &LowerOptions,
    ) {
        let logits = self.p.new_buffer(
            decode::LOGITS,
            BufferKind::IO_OUTPUT,
            opts.dtype,
            &[1, d.vocab],
        );
        let sms = layout.grid - layout.own.sms;
        let logits = self.proj(hf, t.head, None, logits, d.h, d.vocab, "lm_head", sms);
        if let Some(dl) = opts.decode_loop {
            let loop_tail = LoopTail {
                logits,
                pos: t.pos,
                token: t.token,
                max_seq: d.max_seq,
                vocab: d.vocab,
            };
            self.p.step_loop = Some(self.next_token(&loop_tail, dl));
        } else if opts.argmax {
            let next = (self.p).new_buffer("next_token", BufferKind::IO_OUTPUT, DType::I32, &[1]);
            self.single(
                Opcode::SAMPLE_ARGMAX,
                &[logits.buf],
                next,
                &[logits.wait],
                Map::new(),
                "argmax".into(),
                (d.vocab as i64 * d.dbytes, d.vocab as i64),
            );
        }
    }
}

/// Places the program: its tasks on SMs (the attention's own SMs kept for it) and its
/// activations on pages, as `cfg` asks.
fn place(
    p: &mut Program,
    cfg: &ScheduleConfig,
    target: &GpuTarget,
    layout: &Layout,
) -> Result<Option<pages::PageStats>, ModelError> {
    let reserve = sm::Reserve {
        ops: layout.own.ops(),
        sms: layout.own.sms as u32,
        alternate: layout.alternate,
    };
    let num_sms = target.num_sms.max(0) as u32;
    sm::assign_sms_reserving(p, &cfg.sm_assignment, num_sms, &reserve)?;
    if matches!(cfg.sm_assignment, amk_core::SmAssignment::LoadBalance) {
        sm::seat_next_token_early(p, num_sms.saturating_sub(reserve.sms));
    }
    Ok(match cfg.page_allocation {
        amk_core::PageStrategy::None => None,
        s => Some(pages::allocate_pages(p, s)?),
    })
}

/// The most Q/K/V units a QKV_ROPE_APPEND tile of `mc` may hold: with Qwen3's per-head norms,
/// whole heads whose f32 sums fit beside the row (`hidden` f32) in the op's shared memory
/// (None when not one head does); without them, no limit.
fn qkv_tile_max_units(mc: &crate::config::ModelConfig) -> Option<u64> {
    if !mc.qk_norm {
        return Some(u64::MAX);
    }
    let hd = mc.head_dim as u64;
    let floats = u64::from(op_qkv_rope_append::SHARED_BYTES) / 4;
    let heads = floats.checked_sub(mc.hidden as u64)? / hd.max(1);
    (heads > 0).then_some(heads * hd)
}

/// The model's per-pair RoPE frequency divisors as an f32 tensor of `head_dim / 2`, if it scales
/// its frequencies: computed from the config (Llama 3's `rope_type: "llama3"`) or the
/// checkpoint's own (GGUF's `rope_freqs.weight`). Every divisor must be positive and finite.
fn rope_factors(model: &Model) -> Result<Option<Tensor>, ModelError> {
    rope_divisors(&model.config, model.weights.get(ROPE_FREQS).map(|t| &**t))
}

/// The per-pair RoPE frequency divisors of a model with `mc` as an f32 tensor of
/// `head_dim / 2` (see [`rope_factors`]); `checkpoint`: the checkpoint's `rope_freqs.weight`,
/// which [`RopeScaling::Factors`] needs. Also what synthetic weights bind as they are
/// (`presets::synthetic_weights`), so the two cannot derive different values.
pub fn rope_divisors(
    mc: &crate::config::ModelConfig,
    checkpoint: Option<&Tensor>,
) -> Result<Option<Tensor>, ModelError> {
    let half = mc.head_dim / 2;
    let values = match &mc.rope_scaling {
        RopeScaling::None => return Ok(None),
        RopeScaling::Llama3 { .. } => mc
            .rope_scaling
            .pair_divisors(mc.head_dim, mc.rope_theta)
            .unwrap_or_default(),
        RopeScaling::Factors => checkpoint
            .ok_or_else(|| ModelError::MissingTensor(ROPE_FREQS.into()))?
            .to_f32_vec(),
    };
    if values.len() != half {
        return Err(ModelError::Shape(format!(
            "{ROPE_FREQS} holds {} values; head_dim / 2 = {half}",
            values.len()
        )));
    }
    if let Some((i, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v > 0.0))
    {
        return Err(ModelError::Lower(format!(
            "RoPE frequency divisor {i} = {v} must be positive and finite"
        )));
    }
    Tensor::from_f32(DType::F32, &[half as u64], &values)
        .map(Some)
        .map_err(|e| ModelError::Lower(format!("the RoPE frequency divisors: {e}")))
}

/// The FUSED recipe of a reshape bridge + ROPE: inputs `[reshape_id0, x, pos]`.
fn fused_reshape_rope(
    shape: &[u64],
    dim: u64,
    rope_params: &Map,
    dtype: DType,
    with_factors: bool,
) -> Map {
    let shape_v = Value::Array(shape.iter().map(|&d| int(d)).collect());
    let dt = Value::from(match dtype {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        _ => "float32",
    });
    let arg = |k: &str, j: i64| {
        let mut m = Map::new();
        m.insert(k, Value::Int(j));
        Value::Object(m)
    };
    let mut s0 = Map::new();
    s0.insert("op", Value::Int(Opcode::EMBED.0 as i64));
    s0.insert("args", Value::Array(vec![arg("in", 0), arg("in", 1)]));
    s0.insert("out", Value::Int(0));
    s0.insert("params", Value::Object(params(&[("hidden", int(dim))])));
    s0.insert("out_shape", shape_v);
    s0.insert("out_dtype", dt);
    let mut s1 = Map::new();
    s1.insert("op", Value::Int(Opcode::ROPE.0 as i64));
    let mut rope_args = vec![arg("s", 0), arg("in", 2)];
    if with_factors {
        rope_args.push(arg("in", 3));
    }
    s1.insert("args", Value::Array(rope_args));
    s1.insert("out", Value::from("final"));
    s1.insert("params", Value::Object(rope_params.clone()));
    let mut recipe = Map::new();
    recipe.insert(
        "steps",
        Value::Array(vec![Value::Object(s0), Value::Object(s1)]),
    );
    params(&[("recipe", Value::Object(recipe))])
}
