//! The prefill program (`amk_model_llama::lower::prefill`) on the CPU VM against HuggingFace
//! transformers: the six tiny checkpoints' committed fp32 logits (Qwen2's q/k/v biases
//! included) (`tests/reference/tiny_models.py`)
//! at every position of a 12-token sequence fed as two chunks of 8 rows — the second padded —
//! through one session, so the second chunk's attention reads the first chunk's K/V rows from
//! the cache. Every logit within 1e-5 of HF (relative to the largest), the greedy token equal.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_backend_cpu::CpuBackend;
use amk_core::{DType, GpuTarget, Registry, Session, Tensor, validate_owned};
use amk_model_llama::Model;
use amk_model_llama::hf::import_hf;
use amk_model_llama::lower::prefill::{
    IDS, LAST, LIMITS, NLL, POS, PrefillLogits, PrefillOptions, TARGETS, lower_prefill,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

const ROWS: usize = 8;
const MAX_SEQ: u64 = 32;

fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("reference")
}

fn registry() -> Registry {
    amk_ops::registry().unwrap()
}

fn refdoc(name: &str) -> Value {
    let path = reference_dir().join(name).join("hf_logits.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn session(model: &Model, logits: PrefillLogits) -> Box<dyn Session> {
    let opts = PrefillOptions {
        dtype: DType::F32,
        max_seq: MAX_SEQ,
        rows: ROWS as u64,
        logits,
    };
    let lowered = lower_prefill(model, &GpuTarget::by_name("h100").unwrap(), &opts).unwrap();
    let reg = registry();
    let program = validate_owned(lowered.program, &reg)
        .unwrap_or_else(|r| panic!("the prefill program is invalid:\n{}", r.report()));
    amk_core::Backend::load(&CpuBackend::default(), &program, &lowered.weights, &reg).unwrap()
}

/// Feeds `ids` in chunks of [`ROWS`] (the last padded with id 0 at the positions after it) and
/// returns every row's logits, in order; an every-row program's NLLs of the next ids (the last
/// row's target, which the text does not have, is 0) must be those of its logits.
fn chunked_logits(s: &mut dyn Session, ids: &[i64]) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    let padded = |from: usize| {
        let mut v: Vec<i64> = ids.iter().skip(from).take(ROWS).copied().collect();
        v.resize(ROWS, 0);
        Tensor::from_i64(DType::I32, &[ROWS as u64], &v).unwrap()
    };
    for (c, chunk) in ids.chunks(ROWS).enumerate() {
        let p0 = (c * ROWS) as i64;
        let pos: Vec<i64> = (p0..p0 + ROWS as i64).collect();
        let inputs = [
            (IDS, padded(c * ROWS)),
            (
                POS,
                Tensor::from_i64(DType::I32, &[ROWS as u64], &pos).unwrap(),
            ),
            (TARGETS, padded(c * ROWS + 1)),
        ];
        let o = s.step(&inputs).unwrap();
        let logits = o.get("logits").unwrap().to_f32_vec();
        let vocab = logits.len() / ROWS;
        if let Some(nll) = o.get(NLL) {
            let targets = padded(c * ROWS + 1);
            for (r, row) in logits.chunks(vocab).enumerate() {
                let want = nll_of(row, targets.get_i64(r) as usize);
                let got = nll.get_f32(r) as f64;
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "row {r}: NLL {got} vs {want}"
                );
            }
        }
        out.extend(logits.chunks(vocab).take(chunk.len()).map(<[f32]>::to_vec));
    }
    out
}

/// `ln Σ exp(row) - row[t]`, unshifted, in f64 (the tiny models' logits are small).
fn nll_of(row: &[f32], t: usize) -> f64 {
    let s: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
    s.ln() - row[t] as f64
}

/// The reference's rows of logits.
fn rows(doc: &Value) -> Vec<Vec<f64>> {
    let row = |r: &Value| {
        r.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    doc["logits"].as_array().unwrap().iter().map(row).collect()
}

fn check(name: &str, label: &str, model: &Model) {
    let doc = refdoc(name);
    let name = label;
    let input = ints(&doc["input_ids"]);
    let greedy: Vec<u32> = ints(&doc["greedy_next"])
        .iter()
        .map(|&t| t as u32)
        .collect();
    let mut s = session(model, PrefillLogits::Every);
    let got = chunked_logits(&mut *s, &input);
    let worst = amk_core::testkit::check_rows(&got, &rows(&doc), Some(&greedy), 1e-5)
        .unwrap_or_else(|e| panic!("{name} through prefill: {e}"));
    println!(
        "{name}: {} positions through prefill, worst {worst:.2e}",
        got.len()
    );
}

#[test]
fn tiny_checkpoints_through_prefill_match_transformers() {
    for name in [
        "tiny-gqa",
        "tiny-mqa",
        "tiny-qwen2",
        "tiny-mistral",
        "tiny-qwen3",
        "tiny-llama3",
    ] {
        check(name, name, &import_hf(&reference_dir().join(name)).unwrap());
        let gguf = reference_dir().join("gguf").join(format!("{name}.gguf"));
        check(
            name,
            &format!("{name} (GGUF)"),
            &amk_model_llama::gguf_import::import_gguf(&gguf).unwrap(),
        );
    }
}

/// With `PrefillLogits::Last` the program computes the row `LAST` names: the same values as
/// that row of the every-row program.
#[test]
fn the_last_row_mode_gives_the_chosen_row() {
    let model = import_hf(&reference_dir().join("tiny-gqa")).unwrap();
    let input = ints(&refdoc("tiny-gqa")["input_ids"]);
    let every = chunked_logits(&mut *session(&model, PrefillLogits::Every), &input[..ROWS]);
    let mut s = session(&model, PrefillLogits::Last);
    let pos: Vec<i64> = (0..ROWS as i64).collect();
    for row in [0usize, 5, ROWS - 1] {
        let inputs = [
            (
                IDS,
                Tensor::from_i64(DType::I32, &[ROWS as u64], &input[..ROWS]).unwrap(),
            ),
            (
                POS,
                Tensor::from_i64(DType::I32, &[ROWS as u64], &pos).unwrap(),
            ),
            (
                LAST,
                Tensor::from_i64(DType::I32, &[1], &[row as i64]).unwrap(),
            ),
            (
                LIMITS,
                Tensor::from_i64(DType::I32, &[amk_core::decode::LIMITS_LEN], &[0; 6]).unwrap(),
            ),
        ];
        let got = s.step(&inputs).unwrap().get("logits").unwrap().to_f32_vec();
        assert_eq!(got, every[row], "row {row}");
    }
}

/// The CPU VM runs a prefill program's LINEAR_TILE tiles on worker threads, bit for bit as on
/// one.
#[test]
fn threads_give_the_same_prefill_logits() {
    use amk_backend_cpu::{CpuOptions, FiringMode};
    let model = import_hf(&reference_dir().join("tiny-gqa")).unwrap();
    let input = ints(&refdoc("tiny-gqa")["input_ids"]);
    let opts = PrefillOptions {
        dtype: DType::F32,
        max_seq: MAX_SEQ,
        rows: ROWS as u64,
        logits: PrefillLogits::Every,
    };
    let lowered = lower_prefill(&model, &GpuTarget::by_name("h100").unwrap(), &opts).unwrap();
    let reg = registry();
    let program = validate_owned(lowered.program, &reg).unwrap();
    let run = |threads| {
        let backend = CpuBackend::new(CpuOptions {
            mode: FiringMode::ListOrder,
            threads,
        });
        let mut s = backend
            .load_session(&program, &lowered.weights, &reg)
            .unwrap();
        let logits = chunked_logits(&mut s, &input);
        (logits, s.parallel_batches())
    };
    let (one, none) = run(1);
    let (two, batches) = run(2);
    assert_eq!(none, 0);
    assert!(batches > 0, "no tile batch ran on two threads");
    assert_eq!(one, two);
}

/// The LM head's tiles over the last row: RMSNORM_GEMV tiles of `vocab.div_ceil(132)` rows
/// rounded up to whole warps' 8, about one an SM of the H100's 132.
fn head_row_tiles(vocab: u64) -> u64 {
    vocab.div_ceil(vocab.div_ceil(132).next_multiple_of(8))
}

/// The KV_APPEND tasks of a chunk's K or V append: column slices of a row of `width` in whole
/// 8-element units, about `APPEND_SLICES` of them (SmolLM2's rows of 192: 12 slices of 16).
fn append_slices(width: u64) -> u64 {
    let n = amk_model_llama::lower::prefill::APPEND_SLICES;
    width.div_ceil(width.div_ceil(n).next_multiple_of(8).min(width))
}

/// SmolLM2-135M's bf16 prefill program of 512 rows for an H100, with `logits`.
fn smollm2_chunk(
    logits: PrefillLogits,
) -> (amk_model_llama::config::ModelConfig, amk_core::Program) {
    let cfg = amk_model_llama::presets::preset("smollm2-135m").unwrap();
    let model = Model::shape_only(cfg.clone(), "smollm2-135m");
    let opts = PrefillOptions {
        dtype: DType::BF16,
        max_seq: 4096,
        rows: 512,
        logits,
    };
    let p = lower_prefill(&model, &GpuTarget::by_name("h100").unwrap(), &opts)
        .unwrap()
        .program;
    (cfg, p)
}

/// The prefill program's tasks, counted from the tiling rules (LINEAR_TILE: 64-row blocks ×
/// 128 columns, 64 with SwiGLU, and 128-row blocks in a phase of more 64-row tiles than the
/// target's 132 SMs; ATTENTION_CAUSAL: KV heads × blocks of 64 / (heads a KV head) rows;
/// RMSNORM: two norms a layer in tiles of `NORM_ROWS` rows): SmolLM2-135M's 512-row chunk was
/// the 13,016 tasks `amk bench --prefill 512` reported on an H200 with the norms in the
/// projections (docs/perf-notes.md round 33), 13,016 + 30 × 2 × 64 with them as tasks of their
/// own, and its gate/up phase (8 × 24 = 192 narrow tiles) now takes 96 wide ones; the last
/// row's LM head takes RMSNORM_GEMV tiles (`head_row_tiles`), and each K or V append 12
/// column slices (`append_slices`) instead of one task.
#[test]
fn smollm2_prefill_has_the_tasks_of_its_tiling() {
    let (cfg, p) = smollm2_chunk(PrefillLogits::Last);
    let tiles = |n: u64, cols: u64| 512u64.div_ceil(64) * n.div_ceil(cols);
    let wide = |n: u64, cols: u64| 512u64.div_ceil(128) * n.div_ceil(cols);
    let (h, hd, nh, nkv) = (
        cfg.hidden as u64,
        cfg.head_dim as u64,
        cfg.n_heads as u64,
        cfg.n_kv_heads as u64,
    );
    let rows_a_task = 64 / (nh / nkv);
    let per_layer = tiles(nh * hd, 128)
        + 2 * tiles(nkv * hd, 128)
        + 2 * append_slices(nkv * hd)
        + nkv * 512u64.div_ceil(rows_a_task)
        + tiles(h, 128)
        + wide(cfg.intermediate as u64, 64)
        + tiles(h, 128)
        + 2 * 512u64.div_ceil(amk_model_llama::lower::prefill::NORM_ROWS);
    let head = head_row_tiles(cfg.vocab as u64);
    let want = per_layer * cfg.n_layers as u64 + 2 + head;
    // The last row's LOGIT_STATS summaries: slots of the decode tail's layout.
    let stats = amk_model_llama::lower::StatsLayout::about(
        amk_model_llama::lower::prefill::STATS_SLOTS,
        cfg.vocab as u64,
    )
    .slots;
    assert_eq!(p.tasks.len() as u64, want + stats);
    // The head's 384 LINEAR_TILE tiles of 128 columns became 131 RMSNORM_GEMV tiles.
    assert_eq!(
        want,
        13_016 + 30 * 2 * 64 - 30 * 96 - 384 + 131 + 30 * 2 * 11
    );
}

/// Which phases take wide (128-row) LINEAR_TILE tasks: those of more 64-row device tiles than
/// the target's SMs, in 16-bit programs; f32 programs (the device's generic path, 64 rows at a
/// time) always narrow. On sm_90, a grid without a norm whose phase holds four waves of
/// narrow tiles or more takes the widest (256-row) tasks. On the 1B at 512 rows with 132 SMs:
/// Q/K/V together 8 × (16 + 4 + 4) = 192 tiles — wide; gate/up 8 × 128 = 1,024 ≥ 4 × 132 and
/// normalised before — widest; the output and down projections 8 × 16 = 128 — narrow.
#[test]
fn phases_of_more_tiles_than_sms_take_wide_tasks() {
    let cfg = amk_model_llama::presets::preset("llama-3.2-1b").unwrap();
    let model = Model::shape_only(cfg.clone(), "llama-3.2-1b");
    let rows_of = |dtype, sms: i64, sm_arch: i64| {
        let opts = PrefillOptions {
            dtype,
            max_seq: 1024,
            rows: 512,
            logits: PrefillLogits::None,
        };
        let mut target = GpuTarget::by_name("h100").unwrap();
        target.num_sms = sms;
        target.sm_arch = sm_arch;
        let p = lower_prefill(&model, &target, &opts).unwrap().program;
        let mut by_kind =
            std::collections::BTreeMap::<String, std::collections::BTreeSet<i64>>::new();
        for t in p.tasks.iter().filter(|t| t.label.starts_with("L0.")) {
            if let Some(mt) = t.params.get("M_tile").and_then(|v| v.as_i64())
                && t.op == amk_core::Opcode::LINEAR_TILE
            {
                let kind = t.label.trim_start_matches("L0.").split('[').next().unwrap();
                by_kind.entry(kind.to_string()).or_default().insert(mt);
            }
        }
        by_kind
    };
    let one = |v: i64| std::collections::BTreeSet::from([v]);
    let bf16 = rows_of(DType::BF16, 132, 90);
    for (kind, rows) in [
        ("q", 128),
        ("k", 128),
        ("v", 128),
        ("gate_up", 256),
        ("o_add", 64),
        ("down_add", 64),
    ] {
        assert_eq!(bf16[kind], one(rows), "{kind}");
    }
    // Elsewhere than sm_90 (no wgmma), gate/up keeps the wide tasks.
    assert_eq!(rows_of(DType::BF16, 132, 89)["gate_up"], one(128));
    // With 256 SMs the Q/K/V phase fits one wave of narrow tiles; gate/up still holds four.
    let big = rows_of(DType::BF16, 256, 90);
    assert_eq!(big["q"], one(64));
    assert_eq!(big["gate_up"], one(256));
    // With 300, gate/up is fewer than four waves of narrow tiles: wide.
    assert_eq!(rows_of(DType::BF16, 300, 90)["gate_up"], one(128));
    let f32 = rows_of(DType::F32, 132, 90);
    assert!(f32.values().all(|r| *r == one(64)), "{f32:?}");
}

/// A prompt program without logits (the engine's): no `prefill.last` input, no logits, no
/// final norm or LM head, and its last layer only the K/V rows' tasks (its norm, K and V
/// projections and appends) — every other task of that layer fed only the logits.
#[test]
fn a_prompt_program_without_logits_keeps_only_what_writes_the_caches() {
    use amk_model_llama::lower::prefill::{LAST, NORM_ROWS};
    let cfg = amk_model_llama::presets::preset("smollm2-135m").unwrap();
    let model = Model::shape_only(cfg.clone(), "smollm2-135m");
    let lowered = |logits| {
        let opts = PrefillOptions {
            dtype: DType::BF16,
            max_seq: 4096,
            rows: 512,
            logits,
        };
        lower_prefill(&model, &GpuTarget::by_name("h100").unwrap(), &opts)
            .unwrap()
            .program
    };
    let (none, last) = (lowered(PrefillLogits::None), lowered(PrefillLogits::Last));
    let named = |p: &amk_core::Program, n: &str| p.buffers.iter().any(|b| b.name == n);
    assert!(named(&last, LAST) && named(&last, amk_core::decode::LOGITS));
    assert!(!named(&none, LAST) && !named(&none, amk_core::decode::LOGITS));
    let top = format!("L{}.", cfg.n_layers - 1);
    let kinds: std::collections::BTreeSet<String> = none
        .tasks
        .iter()
        .filter(|t| t.label.starts_with(&top))
        .map(|t| t.label.split('[').next().unwrap().to_string())
        .collect();
    let want = ["in_norm", "k", "kv_append_k", "kv_append_v", "v"].map(|k| format!("{top}{k}"));
    assert_eq!(kinds, want.into_iter().collect());
    // The tasks the last layer keeps: its norm tiles, the K and V tiles, two appends.
    let kv_tiles =
        2 * 512u64.div_ceil(64) * (cfg.n_kv_heads as u64 * cfg.head_dim as u64).div_ceil(128);
    let kept = 512u64.div_ceil(NORM_ROWS)
        + kv_tiles
        + 2 * append_slices(cfg.n_kv_heads as u64 * cfg.head_dim as u64);
    let stats = amk_model_llama::lower::StatsLayout::about(
        amk_model_llama::lower::prefill::STATS_SLOTS,
        cfg.vocab as u64,
    )
    .slots;
    let per_layer = (last.tasks.len() as u64 - 2 - head_row_tiles(cfg.vocab as u64) - stats)
        / cfg.n_layers as u64;
    assert_eq!(
        none.tasks.len() as u64,
        1 + per_layer * (cfg.n_layers as u64 - 1) + kept
    );
    assert!(!none.tasks.iter().any(|t| t.label.starts_with("lm_head")));
}

/// The attention's blocks: with more of them in a layer than the target has SMs (the 1B at 512
/// rows: 8 KV heads × 32 blocks of 16 rows), latest first, each estimated by the cache rows it
/// attends (K and V, from the chunk's start to the block's end); with fewer (SmolLM2 at 512: 3
/// × 25), KV head by KV head from the first row, each at the whole cache's estimate.
#[test]
fn attention_blocks_are_ordered_for_the_sm_assignment() {
    let blocks = |preset: &str| {
        let cfg = amk_model_llama::presets::preset(preset).unwrap();
        let model = Model::shape_only(cfg.clone(), preset);
        let opts = PrefillOptions {
            dtype: DType::BF16,
            max_seq: 1024,
            rows: 512,
            logits: PrefillLogits::None,
        };
        let p = lower_prefill(&model, &GpuTarget::by_name("h100").unwrap(), &opts)
            .unwrap()
            .program;
        let of = |t: &amk_core::Task, k: &str| t.params.get(k).and_then(|v| v.as_i64()).unwrap();
        let got: Vec<(i64, i64, i64)> = p
            .tasks
            .iter()
            .filter(|t| t.label.starts_with("L0.attention"))
            .map(|t| (of(t, "n_off"), of(t, "m_off"), t.est_bytes))
            .collect();
        (got, cfg.head_dim as i64)
    };
    let (big, hd) = blocks("llama-3.2-1b");
    assert_eq!(big.len(), 256);
    assert_eq!(big[0], (0, 496, 2 * 512 * hd * 2));
    assert_eq!(big[7], (7 * 4 * hd, 496, 2 * 512 * hd * 2));
    assert_eq!(big[255], (7 * 4 * hd, 0, 2 * 16 * hd * 2));
    assert!(big.windows(2).all(|w| w[0].1 >= w[1].1), "latest first");
    let (small, hd) = blocks("smollm2-135m");
    assert_eq!(small.len(), 75);
    assert_eq!(small[0], (0, 0, 1024 * hd * 2));
    assert_eq!(small[1].1, 21);
    assert!(small.iter().all(|b| b.2 == 1024 * hd * 2));
}

/// An every-row program scores its rows itself: TOKEN_NLL row tiles, as many as the target has
/// SMs (SmolLM2's 512 rows on an H100's 132: 128 tiles of 4 rows) after the whole LM head,
/// covering every row once, from the targets input into the F32 NLL output.
#[test]
fn the_every_row_program_scores_its_rows_a_tile_an_sm() {
    let (_, p) = smollm2_chunk(PrefillLogits::Every);
    let buf = |name: &str| p.buffers.iter().position(|b| b.name == name).unwrap() as u32;
    let (targets, nll, logits) = (buf(TARGETS), buf(NLL), buf("logits"));
    assert_eq!(p.buffers[nll as usize].dtype, DType::F32);
    assert_eq!(p.buffers[targets as usize].dtype, DType::I32);
    let tiles: Vec<_> = p
        .tasks
        .iter()
        .filter(|t| t.op == amk_core::Opcode::TOKEN_NLL)
        .collect();
    assert_eq!(tiles.len(), 128);
    let mut next = 0;
    for t in &tiles {
        assert_eq!(
            (t.inputs.as_slice(), t.outputs.as_slice()),
            (&[logits, targets][..], &[nll][..])
        );
        assert_eq!(t.param_i64("m_off"), Some(next));
        next += t.param_i64("M_tile").unwrap();
        let head = p.tasks.iter().filter(|h| h.outputs == [logits]).count() as i64;
        assert_eq!(
            t.waits.iter().map(|w| w.threshold).collect::<Vec<_>>(),
            [head]
        );
    }
    assert_eq!(next, 512);
}
