//! amk on the CPU VM against HuggingFace transformers (fp32, eager): the outputs were produced
//! by `tests/reference/hf_reference.py` and `tests/reference/tiny_models.py` and committed;
//! these tests only read them (no torch here).
//!
//! - SmolLM2-135M-Instruct (the default model's GGUF, fetched and cached on first use, or
//!   `$AMK_TEST_GGUF`): prompt token ids, 40 greedy tokens per prompt (a divergence is allowed
//!   only where HF's top-2 logit gap is below [`NEAR_TIE`]), and teacher-forced perplexity to
//!   1e-5 relative.
//! - Six tiny random-init HF checkpoints (GQA tied, MQA untied with rope_theta 5e5 and an
//!   explicit head_dim, Qwen2 with q/k/v biases, Qwen3 with q/k norms, Mistral, Llama 3 RoPE
//!   scaling), each from its HF directory and from the GGUF llama.cpp's converter wrote from
//!   it (`tests/reference/tiny_gguf.py`): every logit of a 12-token sequence within 1e-5 of HF
//!   (relative to the largest logit), and the greedy token at every position.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_backend_cpu::CpuBackend;
use amk_core::{DType, GpuTarget, Registry, ScheduleConfig};
use amk_engine::{Engine, EngineOptions, Request, argmax, lower_and_load};
use amk_model_llama::Model;
use amk_model_llama::hf::import_hf;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A greedy divergence is accepted only where HF's top-1/top-2 logit gap is below this.
const NEAR_TIE: f64 = 1e-3;

fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("reference")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn registry() -> Registry {
    amk_ops::registry().unwrap()
}

fn engine(model: &Model, max_seq: u64) -> Engine {
    engine_with(model, max_seq, &ScheduleConfig::default())
}

fn engine_with(model: &Model, max_seq: u64, cfg: &ScheduleConfig) -> Engine {
    let opts = EngineOptions {
        schedule: cfg.clone(),
        target: GpuTarget::by_name("h100").unwrap(),
        dtype: DType::F32,
        max_seq: Some(max_seq),
        stop_slots: 1,
        prefill_rows: None,
        short_context: None,
    };
    lower_and_load(model, &opts, &CpuBackend::default(), &registry()).unwrap()
}

/// `n` greedy tokens after `prompt`, in one request (one loop of passes).
fn generate_greedy(e: &mut Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let req = Request::greedy(prompt, n, &[]);
    e.generate(&req, &mut |_| true).unwrap().ids()
}

/// The logits of every pass over `ids` (teacher-forced), the last id fed too.
fn all_logits(e: &mut Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut fed = ids.to_vec();
    fed.push(0); // forced_logits feeds every id but the last
    let mut out = Vec::new();
    e.forced_logits(&fed, &mut |_, l| out.push(l.to_vec()))
        .unwrap();
    out
}

fn smollm2_path() -> PathBuf {
    if let Some(p) = std::env::var_os("AMK_TEST_GGUF") {
        return PathBuf::from(p);
    }
    amk_model_fetch::default_model_path(&amk_model_fetch::FetchOptions::smollm2())
        .unwrap_or_else(|e| panic!("fetching the default model: {e}"))
}

#[test]
fn smollm2_greedy_tokens_and_perplexity_match_transformers() {
    let refdoc = read_json(&reference_dir().join("smollm2_hf.json"));
    let model = amk_model_llama::gguf_import::import_gguf(&smollm2_path()).unwrap();
    let tok = model.tokenizer.clone().unwrap();
    let mut e = engine(&model, 512);
    let n_new = refdoc["new_tokens"].as_u64().unwrap() as usize;
    let mut report = Vec::new();
    for p in refdoc["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_ids"]);
        assert_eq!(
            tok.encode(p["text"].as_str().unwrap()).unwrap(),
            prompt,
            "{name}: prompt ids"
        );
        let want = ids(&p["generated_ids"]);
        let gaps: Vec<f64> = p["top2_gap"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        let got = generate_greedy(&mut e, &prompt, n_new);
        assert_eq!(got.len(), want.len(), "{name}");
        match got.iter().zip(&want).position(|(a, b)| a != b) {
            None => report.push(format!("{name}: {} tokens identical", want.len())),
            Some(i) => {
                assert!(
                    gaps[i] < NEAR_TIE,
                    "{name}: token {i} differs ({} vs HF {}) where HF's top-2 gap is {} (not a near-tie)\n got {got:?}\nwant {want:?}",
                    got[i],
                    want[i],
                    gaps[i]
                );
                report.push(format!(
                    "{name}: identical up to token {i}, a near-tie (gap {})",
                    gaps[i]
                ));
            }
        }
    }
    let ppl = &refdoc["perplexity"];
    let text = std::fs::read_to_string(reference_dir().join("ppl_text.txt")).unwrap();
    let text_ids = tok.encode(&text).unwrap();
    assert_eq!(text_ids.len() as u64, ppl["tokens"].as_u64().unwrap());
    let (n, nll) = e.perplexity(&text_ids).unwrap();
    let want_nll = ppl["nll"].as_f64().unwrap();
    assert_eq!(n as u64, ppl["predictions"].as_u64().unwrap());
    let rel = (nll - want_nll).abs() / want_nll.abs();
    let rel_ppl = (nll.exp() - ppl["perplexity"].as_f64().unwrap()).abs() / nll.exp();
    println!(
        "{}\nperplexity: nll {nll} vs HF {want_nll} (rel {rel:.2e}), ppl rel {rel_ppl:.2e}",
        report.join("\n")
    );
    assert!(
        rel < 1e-5 && rel_ppl < 1e-5,
        "nll {nll} vs HF {want_nll}: relative error {rel:e}"
    );
}

/// The two files a tiny reference checkpoint comes as: its HF directory, and the GGUF that
/// llama.cpp's own converter wrote from it (`tests/reference/tiny_gguf.py`).
#[derive(Debug, Clone, Copy)]
enum Format {
    Hf,
    Gguf,
}

fn tiny(name: &str) {
    for format in [Format::Hf, Format::Gguf] {
        tiny_with(name, format, &ScheduleConfig::default());
    }
}

/// [`tiny`] with the tuned schedule too, in both file formats.
fn tiny_both_schedules(name: &str) {
    tiny(name);
    for format in [Format::Hf, Format::Gguf] {
        tiny_with(name, format, &amk_model_llama::lower::tuned_schedule());
    }
}

/// The tiny checkpoint `name` from `format`, against transformers' logits under schedule
/// `cfg` (the tuned one runs the fused Q/K/V tiles' RoPE instead of ROPE tasks).
fn tiny_with(name: &str, format: Format, cfg: &ScheduleConfig) {
    let dir = reference_dir().join(name);
    let refdoc = read_json(&dir.join("hf_logits.json"));
    let model = match format {
        Format::Hf => import_hf(&dir).unwrap(),
        Format::Gguf => {
            let file = reference_dir().join("gguf").join(format!("{name}.gguf"));
            amk_model_llama::gguf_import::import_gguf(&file).unwrap()
        }
    };
    let name = format!("{name} ({format:?})");
    let input = ids(&refdoc["input_ids"]);
    let greedy = ids(&refdoc["greedy_next"]);
    let mut e = engine_with(&model, 32, cfg);
    let logits = all_logits(&mut e, &input);
    let want: Vec<Vec<f64>> = (refdoc["logits"].as_array().unwrap().iter())
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    let worst = amk_core::testkit::check_rows(&logits, &want, Some(&greedy), 1e-5)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    println!(
        "{name}: {} positions, worst relative logit error {worst:.2e}",
        input.len()
    );
}

/// The tuned schedule (the fused decode opcodes, tiles over all SMs: what the CUDA backend
/// runs) gives the same f32 logits on the CPU VM as the reference schedule, bit for bit — the
/// fused ops round every intermediate as the unfused program stores it, and an f32 residual add
/// rounds the same inside a tile — so the HF match above holds for it too.
#[test]
fn smollm2_tuned_schedule_logits_equal_the_reference_schedule() {
    let refdoc = read_json(&reference_dir().join("smollm2_hf.json"));
    let model = amk_model_llama::gguf_import::import_gguf(&smollm2_path()).unwrap();
    let mut plain = engine(&model, 64);
    let mut fused = engine_with(&model, 64, &amk_model_llama::lower::tuned_schedule());
    let p = &refdoc["prompts"].as_array().unwrap()[0];
    let mut tokens = ids(&p["prompt_ids"]);
    tokens.extend(generate_greedy(&mut plain, &tokens.clone(), 24));
    tokens.truncate(24);
    let (a, b) = (
        all_logits(&mut plain, &tokens),
        all_logits(&mut fused, &tokens),
    );
    assert_eq!(a.len(), 24);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let same = x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "position {i}: the tuned schedule's logits differ");
    }
}

#[test]
fn tiny_gqa_tied_matches_transformers_logits() {
    tiny("tiny-gqa");
}

#[test]
fn tiny_mqa_untied_rope_5e5_matches_transformers_logits() {
    tiny("tiny-mqa");
}

#[test]
fn tiny_qwen2_qkv_bias_matches_transformers_logits() {
    tiny("tiny-qwen2");
}

/// Mistral (no sliding window): MQA with an explicit head_dim, rope_theta 1e6, untied.
#[test]
fn tiny_mistral_matches_transformers_logits() {
    tiny_both_schedules("tiny-mistral");
}

/// Qwen3: per-head q/k RMSNorm before RoPE, heads × head_dim ≠ hidden, tied embeddings; under
/// the tuned schedule too (its fused Q/K/V tiles, of whole heads, normalise them).
#[test]
fn tiny_qwen3_qk_norm_matches_transformers_logits() {
    tiny_both_schedules("tiny-qwen3");
}

/// Llama 3's RoPE frequency scaling (`rope_parameters.rope_type = "llama3"`), through ROPE
/// tasks (the reference schedule) and through the fused Q/K/V tiles (the tuned one).
#[test]
fn tiny_llama3_rope_scaling_matches_transformers_logits() {
    tiny_both_schedules("tiny-llama3");
}

/// Diagnostic (`--ignored`): how far bf16 rounding alone (the CPU VM's bf16 program against its
/// f32 program, same checkpoint) moves SmolLM2's logits at the first positions of a reference
/// prompt: max |bf16 − f32| / max |f32| per position, the scale a device's bf16 gate must allow.
#[test]
#[ignore = "diagnostic: prints bf16 rounding error by position"]
fn smollm2_bf16_rounding_error_by_position() {
    let refdoc = read_json(&reference_dir().join("smollm2_hf.json"));
    let model = amk_model_llama::gguf_import::import_gguf(&smollm2_path()).unwrap();
    let load = |dtype: DType| {
        let opts = EngineOptions {
            schedule: ScheduleConfig::default(),
            target: GpuTarget::by_name("h100").unwrap(),
            dtype,
            max_seq: Some(64),
            stop_slots: 1,
            prefill_rows: None,
            short_context: None,
        };
        lower_and_load(&model, &opts, &CpuBackend::default(), &registry()).unwrap()
    };
    let prompt = ids(&refdoc["prompts"].as_array().unwrap()[0]["prompt_ids"]);
    let (f32s, bf16s) = (
        all_logits(&mut load(DType::F32), &prompt),
        all_logits(&mut load(DType::BF16), &prompt),
    );
    for (pos, (want, got)) in f32s.iter().zip(&bf16s).enumerate() {
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = got
            .iter()
            .zip(want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        println!(
            "pos {pos}: bf16 {:.3e} of max |f32 logit|, argmax {} vs {}",
            err / scale,
            argmax(got),
            argmax(want)
        );
    }
}
