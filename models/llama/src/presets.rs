//! Named model shapes for benchmarks: the published configurations of a few Llama-family
//! checkpoints, usable without downloading them ([`Model::shape_only`] + synthetic weights).
//!
//! Llama 3.x checkpoints ship llama3 RoPE frequency scaling, which the ROPE op does not model
//! yet; the presets leave it out (Llama 3.2 3B, like the 1B and 8B). The Qwen2.5 presets carry
//! the q/k/v biases their architecture has (`model_type: qwen2`); Mistral 7B is v0.3's shape. It changes no byte streamed and no task, only the rotation
//! frequencies, so timings are unaffected.

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::model::{EMBED, LM_HEAD, Model, ModelFormat, tensor_names};
use amk_core::synth::{Init, SyntheticWeights};

/// Every preset name with its HF `config.json`.
const PRESETS: &[(&str, &str)] = &[
    (
        "llama-3.2-1b",
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
            "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 64, "num_hidden_layers": 16, "vocab_size": 128256, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "max_position_embeddings": 131072,
            "tie_word_embeddings": true, "hidden_act": "silu"}"#,
    ),
    (
        "llama-3.1-8b",
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "num_hidden_layers": 32, "vocab_size": 128256, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "max_position_embeddings": 131072,
            "tie_word_embeddings": false, "hidden_act": "silu"}"#,
    ),
    (
        "llama-3.2-3b",
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072,
            "intermediate_size": 8192, "num_attention_heads": 24, "num_key_value_heads": 8,
            "head_dim": 128, "num_hidden_layers": 28, "vocab_size": 128256, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "max_position_embeddings": 131072,
            "tie_word_embeddings": true, "hidden_act": "silu"}"#,
    ),
    (
        "mistral-7b",
        r#"{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "num_hidden_layers": 32, "vocab_size": 32768, "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0, "max_position_embeddings": 32768, "sliding_window": null,
            "tie_word_embeddings": false, "hidden_act": "silu"}"#,
    ),
    (
        "qwen2.5-0.5b",
        r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
            "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
            "num_hidden_layers": 24, "vocab_size": 151936, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "max_position_embeddings": 32768,
            "use_sliding_window": false, "tie_word_embeddings": true, "hidden_act": "silu"}"#,
    ),
    (
        "qwen2.5-1.5b",
        r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
            "intermediate_size": 8960, "num_attention_heads": 12, "num_key_value_heads": 2,
            "num_hidden_layers": 28, "vocab_size": 151936, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "max_position_embeddings": 32768,
            "use_sliding_window": false, "tie_word_embeddings": true, "hidden_act": "silu"}"#,
    ),
    (
        "qwen2.5-7b",
        r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
            "num_hidden_layers": 28, "vocab_size": 152064, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "max_position_embeddings": 32768,
            "use_sliding_window": false, "tie_word_embeddings": false, "hidden_act": "silu"}"#,
    ),
    (
        "smollm2-135m",
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
            "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
            "head_dim": 64, "num_hidden_layers": 30, "vocab_size": 49152, "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0, "max_position_embeddings": 8192,
            "tie_word_embeddings": true, "hidden_act": "silu"}"#,
    ),
    (
        "tinyllama-1.1b",
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
            "intermediate_size": 5632, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 64, "num_hidden_layers": 22, "vocab_size": 32000, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "max_position_embeddings": 2048,
            "tie_word_embeddings": false, "hidden_act": "silu"}"#,
    ),
];

/// The preset names, in a stable order.
pub fn preset_names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|(n, _)| *n)
}

/// The configuration of preset `name`; an unknown name lists the known ones.
pub fn preset(name: &str) -> Result<ModelConfig, ModelError> {
    let (_, json) =
        PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| ModelError::UnknownShape {
                name: name.to_string(),
                known: preset_names().collect::<Vec<_>>().join(", "),
            })?;
    ModelConfig::from_hf_json(json)
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
    SyntheticWeights {
        seed,
        inits,
        same_values,
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
        assert_eq!(preset_names().count(), want.len());
        let err = preset("llama-9").unwrap_err().to_string();
        assert!(
            err.contains("llama-3.2-1b") && err.contains("llama-9"),
            "{err}"
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
