//! Named model shapes for benchmarks: the published configurations of a few Llama-family
//! checkpoints, usable without downloading them ([`Model::shape_only`] + synthetic weights).
//!
//! The Llama 3.x presets carry their checkpoints' llama3 RoPE frequency scaling; the synthetic
//! weights then bind the scaling's divisors as they are ([`SyntheticWeights::exact`]): random
//! values cannot stand for them. The Qwen2.5 presets carry
//! the q/k/v biases their architecture has (`model_type: qwen2`), the Qwen3 ones its per-head q/k
//! norms (`model_type: qwen3`; heads × head_dim ≠ hidden on the 0.6B and 1.7B); Mistral 7B is v0.3's shape. It changes no byte streamed and no task, only the rotation
//! frequencies, so timings are unaffected.

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::model::{EMBED, LM_HEAD, Model, ModelFormat, tensor_names};
use amk_core::synth::{Init, SyntheticWeights};

/// One published checkpoint's shape: the fields of its HF `config.json` that amk reads.
struct Shape {
    name: &'static str,
    /// `model_type` (`llama`, `mistral`, `qwen2`: Qwen2's q/k/v biases come with it).
    model_type: &'static str,
    hidden: u32,
    intermediate: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    layers: u32,
    vocab: u32,
    rms_eps: f64,
    rope_theta: f64,
    max_positions: u32,
    tied: bool,
    /// Llama 3's RoPE frequency scaling: `(factor, original_max_position_embeddings)`, with
    /// low/high frequency factors 1 and 4 (every Llama 3.x checkpoint's).
    llama3_rope: Option<(f64, u32)>,
}

/// Every preset, as published.
#[rustfmt::skip]
const PRESETS: &[Shape] = &[
    Shape { name: "llama-3.2-1b", model_type: "llama", hidden: 2048, intermediate: 8192, heads: 32, kv_heads: 8, head_dim: 64, layers: 16, vocab: 128256, rms_eps: 1e-5, rope_theta: 500000.0, max_positions: 131072, tied: true, llama3_rope: Some((32.0, 8192)) },
    Shape { name: "llama-3.2-3b", model_type: "llama", hidden: 3072, intermediate: 8192, heads: 24, kv_heads: 8, head_dim: 128, layers: 28, vocab: 128256, rms_eps: 1e-5, rope_theta: 500000.0, max_positions: 131072, tied: true, llama3_rope: Some((32.0, 8192)) },
    Shape { name: "llama-3.1-8b", model_type: "llama", hidden: 4096, intermediate: 14336, heads: 32, kv_heads: 8, head_dim: 128, layers: 32, vocab: 128256, rms_eps: 1e-5, rope_theta: 500000.0, max_positions: 131072, tied: false, llama3_rope: Some((8.0, 8192)) },
    Shape { name: "mistral-7b", model_type: "mistral", hidden: 4096, intermediate: 14336, heads: 32, kv_heads: 8, head_dim: 128, layers: 32, vocab: 32768, rms_eps: 1e-5, rope_theta: 1000000.0, max_positions: 32768, tied: false, llama3_rope: None },
    Shape { name: "qwen2.5-0.5b", model_type: "qwen2", hidden: 896, intermediate: 4864, heads: 14, kv_heads: 2, head_dim: 64, layers: 24, vocab: 151936, rms_eps: 1e-6, rope_theta: 1000000.0, max_positions: 32768, tied: true, llama3_rope: None },
    Shape { name: "qwen2.5-1.5b", model_type: "qwen2", hidden: 1536, intermediate: 8960, heads: 12, kv_heads: 2, head_dim: 128, layers: 28, vocab: 151936, rms_eps: 1e-6, rope_theta: 1000000.0, max_positions: 32768, tied: true, llama3_rope: None },
    Shape { name: "qwen2.5-7b", model_type: "qwen2", hidden: 3584, intermediate: 18944, heads: 28, kv_heads: 4, head_dim: 128, layers: 28, vocab: 152064, rms_eps: 1e-6, rope_theta: 1000000.0, max_positions: 32768, tied: false, llama3_rope: None },
    Shape { name: "qwen3-0.6b", model_type: "qwen3", hidden: 1024, intermediate: 3072, heads: 16, kv_heads: 8, head_dim: 128, layers: 28, vocab: 151936, rms_eps: 1e-6, rope_theta: 1000000.0, max_positions: 40960, tied: true, llama3_rope: None },
    Shape { name: "qwen3-1.7b", model_type: "qwen3", hidden: 2048, intermediate: 6144, heads: 16, kv_heads: 8, head_dim: 128, layers: 28, vocab: 151936, rms_eps: 1e-6, rope_theta: 1000000.0, max_positions: 40960, tied: true, llama3_rope: None },
    Shape { name: "qwen3-8b", model_type: "qwen3", hidden: 4096, intermediate: 12288, heads: 32, kv_heads: 8, head_dim: 128, layers: 36, vocab: 151936, rms_eps: 1e-6, rope_theta: 1000000.0, max_positions: 40960, tied: false, llama3_rope: None },
    Shape { name: "smollm2-135m", model_type: "llama", hidden: 576, intermediate: 1536, heads: 9, kv_heads: 3, head_dim: 64, layers: 30, vocab: 49152, rms_eps: 1e-5, rope_theta: 100000.0, max_positions: 8192, tied: true, llama3_rope: None },
    Shape { name: "tinyllama-1.1b", model_type: "llama", hidden: 2048, intermediate: 5632, heads: 32, kv_heads: 4, head_dim: 64, layers: 22, vocab: 32000, rms_eps: 1e-5, rope_theta: 10000.0, max_positions: 2048, tied: false, llama3_rope: None },
];

impl Shape {
    /// The shape as the HF `config.json` it comes from, so that a preset is read by the same
    /// parser (and checks) as a checkpoint.
    fn config_json(&self) -> String {
        let arch = match self.model_type {
            "mistral" => "MistralForCausalLM",
            "qwen2" => "Qwen2ForCausalLM",
            "qwen3" => "Qwen3ForCausalLM",
            _ => "LlamaForCausalLM",
        };
        format!(
            r#"{{"architectures": ["{arch}"], "model_type": "{}", "hidden_size": {},
            "intermediate_size": {}, "num_attention_heads": {}, "num_key_value_heads": {},
            "head_dim": {}, "num_hidden_layers": {}, "vocab_size": {}, "rms_norm_eps": {:e},
            "rope_theta": {:.1}, "max_position_embeddings": {}, "tie_word_embeddings": {},
            "hidden_act": "silu"{}}}"#,
            self.model_type,
            self.hidden,
            self.intermediate,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.layers,
            self.vocab,
            self.rms_eps,
            self.rope_theta,
            self.max_positions,
            self.tied,
            self.llama3_rope
                .map_or(String::new(), |(factor, original)| format!(
                    r#", "rope_scaling": {{"rope_type": "llama3", "factor": {factor:.1},
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": {original}}}"#
                ))
        )
    }
}

/// The preset names, in a stable order.
pub fn preset_names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|p| p.name)
}

/// The configuration of preset `name`; an unknown name lists the known ones.
pub fn preset(name: &str) -> Result<ModelConfig, ModelError> {
    let shape =
        PRESETS
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ModelError::UnknownShape {
                name: name.to_string(),
                known: preset_names().collect::<Vec<_>>().join(", "),
            })?;
    ModelConfig::from_hf_json(&shape.config_json())
}

/// The synthetic weights of a model with `cfg`: a standard random initialisation (uniform,
/// spread 0.02; norm weights 1 ± 0.1) with three choices that make random logits peaked like
/// a trained model's, so a half-precision run can be judged by the usual bf16 tolerance:
/// * the projections that write into the residual stream (`o_proj`, `down_proj`) are scaled
///   by 1/√(2·layers), the GPT-2 / Megatron residual initialisation, so depth does not drown
///   the token's embedding;
/// * the embedding spreads ± 0.2, so the token stays visible in the residual stream;
/// * an untied LM head starts equal to the embedding (it is still a separate tensor, streamed
///   separately).
///
/// Without them the logits of a random model are a flat spread (max ≈ 4σ) and bf16 rounding
/// alone moves them by 1.5–3.5 % of the largest logit (CPU VM, SmolLM2 and TinyLlama shapes,
/// positions 0 and 511), straddling the 2 % tolerance; with them 0.3–0.5 %
/// (docs/perf-notes.md).
pub fn synthetic_weights(cfg: &ModelConfig, seed: u64) -> SyntheticWeights {
    let resid_scale = 0.02 / (2.0 * cfg.n_layers.max(1) as f32).sqrt();
    let inits = tensor_names(cfg)
        .into_iter()
        .map(|(name, _)| {
            let init = if name.ends_with("norm.weight") {
                Init {
                    center: 1.0,
                    scale: 0.1,
                }
            } else if name == EMBED || name == LM_HEAD {
                Init {
                    center: 0.0,
                    scale: 0.2,
                }
            } else if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
                Init {
                    center: 0.0,
                    scale: resid_scale,
                }
            } else {
                Init {
                    center: 0.0,
                    scale: 0.02,
                }
            };
            (name, init)
        })
        .collect();
    let mut same_values = std::collections::BTreeMap::new();
    if !cfg.tie_word_embeddings {
        same_values.insert(LM_HEAD.to_string(), EMBED.to_string());
    }
    // Llama 3's RoPE divisors, the tensor the lowering derives from the config.
    let mut exact = amk_core::WeightStore::new();
    if let Ok(Some(t)) = crate::lower::rope_divisors(cfg, None) {
        exact.insert(crate::model::ROPE_FREQS, t);
    }
    SyntheticWeights {
        seed,
        inits,
        same_values,
        exact,
    }
}

impl Model {
    /// A model with `config` and random weights on the host (seeded): norm weights in
    /// [0.6, 1.4], biases in ±0.1, every matrix uniform in ±1.5/√K — logits with clear
    /// winners, so tests of decoding see real choices, never zeros.
    pub fn random(config: ModelConfig, seed: u64) -> Result<Model, ModelError> {
        use amk_core::{DType, Tensor};
        let mut rng = amk_core::sim::SplitMix(seed);
        let mut w = amk_core::WeightStore::new();
        for (name, shape) in tensor_names(&config) {
            let t = if name.ends_with("norm.weight") {
                Tensor::random(DType::F32, &shape, &mut rng, 0.6, 1.4)
            } else if name.ends_with(".bias") {
                Tensor::random(DType::F32, &shape, &mut rng, -0.1, 0.1)
            } else {
                let s = 1.5 / (*shape.last().unwrap_or(&1) as f64).sqrt();
                Tensor::random(DType::F32, &shape, &mut rng, -s, s)
            };
            w.insert(name, t);
        }
        Model::new(config, w, None, "random", ModelFormat::Hf)
    }

    /// A model with `config` and no weight data: lowering takes every tensor's shape from the
    /// configuration and the backend generates the values ([`synthetic_weights`]).
    pub fn shape_only(config: ModelConfig, source: impl Into<String>) -> Model {
        Model {
            config,
            weights: amk_core::WeightStore::new(),
            tokenizer: None,
            source: source.into(),
            format: ModelFormat::Synthetic,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests

    use super::*;

    #[test]
    fn every_preset_parses_with_its_published_size() {
        // Parameter counts of the published checkpoints (tied embeddings counted once).
        let want = [
            ("llama-3.2-1b", 1_235_814_400u64),
            ("llama-3.1-8b", 8_030_261_248),
            ("smollm2-135m", 134_515_008),
            ("tinyllama-1.1b", 1_100_048_384),
            ("llama-3.2-3b", 3_212_749_824),
            ("mistral-7b", 7_248_023_552),
            ("qwen2.5-0.5b", 494_032_768),
            ("qwen2.5-1.5b", 1_543_714_304),
            ("qwen2.5-7b", 7_615_616_512),
        ];
        for (name, params) in want {
            let cfg = preset(name).unwrap();
            let n: u64 = tensor_names(&cfg)
                .iter()
                .map(|(_, s)| s.iter().product::<u64>())
                .sum();
            assert_eq!(n, params, "{name}");
        }
        // Qwen3's model cards state sizes rounded: total and non-embedding parameters (0.6B /
        // 0.44B, 1.7B / 1.4B, 8.2B / 6.95B).
        let qwen3 = [
            ("qwen3-0.6b", "0.6", "0.44"),
            ("qwen3-1.7b", "1.7", "1.4"),
            ("qwen3-8b", "8.2", "6.95"),
        ];
        // `x` billions written with as many decimals as the published figure has.
        let as_published = |x: u64, published: &str| {
            let decimals = published.split_once('.').map_or(0, |(_, d)| d.len());
            format!("{:.*}", decimals, x as f64 / 1e9)
        };
        for (name, total, non_embedding) in qwen3 {
            let cfg = preset(name).unwrap();
            assert!(cfg.qk_norm, "{name}");
            let count = |embeddings: bool| -> u64 {
                tensor_names(&cfg)
                    .iter()
                    .filter(|(t, _)| embeddings || (t != EMBED && t != LM_HEAD))
                    .map(|(_, s)| s.iter().product::<u64>())
                    .sum()
            };
            assert_eq!(as_published(count(true), total), total, "{name}");
            assert_eq!(
                as_published(count(false), non_embedding),
                non_embedding,
                "{name}"
            );
        }
        assert_eq!(preset_names().count(), want.len() + qwen3.len());
        let err = preset("llama-9").unwrap_err().to_string();
        assert!(
            err.contains("llama-3.2-1b") && err.contains("llama-9"),
            "{err}"
        );
    }

    /// The Llama 3.x presets carry llama3 RoPE scaling, and their synthetic weights bind the
    /// divisors as given: the lowered program's every weight is either planned or bound.
    #[test]
    fn llama3_presets_bind_their_rope_divisors() {
        use crate::config::RopeScaling;
        let cfg = preset("llama-3.2-1b").unwrap();
        assert_eq!(
            cfg.rope_scaling,
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            }
        );
        assert!(matches!(
            preset("llama-3.1-8b").unwrap().rope_scaling,
            RopeScaling::Llama3 { factor: 8.0, .. }
        ));
        assert_eq!(
            preset("smollm2-135m").unwrap().rope_scaling,
            RopeScaling::None
        );
        let synth = synthetic_weights(&cfg, 3);
        let divisors = synth
            .exact
            .get(crate::model::ROPE_FREQS)
            .unwrap()
            .to_f32_vec();
        assert_eq!(divisors.len(), 32);
        assert_eq!(divisors[0], 1.0);
        assert_eq!(divisors[31], 32.0);
        let model = Model::shape_only(cfg, "preset");
        let target = amk_core::GpuTarget::by_name("h100").unwrap();
        let opts = crate::lower::LowerOptions {
            max_seq: Some(16),
            ..Default::default()
        };
        let lowered =
            crate::lower::lower(&model, &amk_core::ScheduleConfig::default(), &target, &opts)
                .unwrap();
        let bound = synth.exact_bindings(&lowered.program).unwrap();
        assert_eq!(bound.len(), 1);
        let planned = synth.plan(&lowered.program).unwrap().len();
        let weights = lowered
            .program
            .buffers
            .iter()
            .filter(|b| {
                matches!(
                    b.kind,
                    amk_core::BufferKind::WEIGHT | amk_core::BufferKind::CONST
                )
            })
            .count();
        assert_eq!(planned + bound.len(), weights);
        let store = synth.materialize(&lowered.program).unwrap();
        assert_eq!(
            store.get(crate::model::ROPE_FREQS).unwrap().to_f32_vec(),
            divisors
        );
    }

    #[test]
    fn synthetic_inits_cover_every_tensor() {
        let cfg = preset("smollm2-135m").unwrap();
        let s = synthetic_weights(&cfg, 5);
        assert_eq!(s.inits.len(), tensor_names(&cfg).len());
        assert_eq!(s.inits["model.norm.weight"].center, 1.0);
        assert_eq!(s.inits["model.embed_tokens.weight"].scale, 0.2);
        assert_eq!(
            s.inits["model.layers.3.mlp.down_proj.weight"].scale,
            0.02 / 60f32.sqrt()
        );
        assert!(s.same_values.is_empty(), "tied: no separate head");
        let untied = synthetic_weights(&preset("tinyllama-1.1b").unwrap(), 5);
        assert_eq!(untied.same_values[LM_HEAD], EMBED);
        assert_eq!(untied.inits[LM_HEAD], untied.inits[EMBED]);
    }
}
