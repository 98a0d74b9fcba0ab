//! The imported model: configuration, named weight tensors, tokenizer.
//!
//! Both importers (HF directory, GGUF file) produce the same thing: tensors named as in
//! HuggingFace's Llama checkpoints (`model.layers.{L}.self_attn.q_proj.weight`, …) in HF's
//! layout (`[out, in]`, Q/K rows in rotate-half order), so the lowering has one input format.
//! [`Model::new`] checks the tensor set against the configuration: every expected tensor present
//! with the right shape and a float dtype, and nothing unexplained left over.

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::tokenizer::Tokenizer;
use amk_core::{DType, WeightStore};

/// Which importer produced a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// A HuggingFace directory (`config.json` + safetensors).
    Hf,
    /// A GGUF file.
    Gguf,
}

/// A Llama-family model ready to lower.
#[derive(Debug, Clone)]
pub struct Model {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Weights by HF name ([`tensor_names`]), F32/F16/BF16.
    pub weights: WeightStore,
    /// The tokenizer, when the checkpoint carries one.
    pub tokenizer: Option<Tokenizer>,
    /// Where it came from (a path, for messages and program metadata).
    pub source: String,
    /// Which importer read it.
    pub format: ModelFormat,
}

/// The name of the token-embedding matrix.
pub const EMBED: &str = "model.embed_tokens.weight";
/// The name of the final norm weight.
pub const FINAL_NORM: &str = "model.norm.weight";
/// The name of an untied LM head.
pub const LM_HEAD: &str = "lm_head.weight";

/// The HF name of tensor `what` of layer `l` (`self_attn.q_proj.weight`, `mlp.up_proj.weight`,
/// `input_layernorm.weight`, …).
pub fn layer_tensor(l: usize, what: &str) -> String {
    format!("model.layers.{l}.{what}")
}

/// Every tensor a model with `cfg` must have, with its shape, in checkpoint order.
pub fn tensor_names(cfg: &ModelConfig) -> Vec<(String, Vec<u64>)> {
    let h = cfg.hidden as u64;
    let q = (cfg.n_heads * cfg.head_dim) as u64;
    let kv = (cfg.n_kv_heads * cfg.head_dim) as u64;
    let i = cfg.intermediate as u64;
    let v = cfg.vocab as u64;
    let mut out = vec![(EMBED.to_string(), vec![v, h])];
    for l in 0..cfg.n_layers {
        let mut push = |what: &str, shape: Vec<u64>| out.push((layer_tensor(l, what), shape));
        push("input_layernorm.weight", vec![h]);
        push("self_attn.q_proj.weight", vec![q, h]);
        push("self_attn.k_proj.weight", vec![kv, h]);
        push("self_attn.v_proj.weight", vec![kv, h]);
        if cfg.attention_bias {
            push("self_attn.q_proj.bias", vec![q]);
            push("self_attn.k_proj.bias", vec![kv]);
            push("self_attn.v_proj.bias", vec![kv]);
        }
        push("self_attn.o_proj.weight", vec![h, q]);
        push("post_attention_layernorm.weight", vec![h]);
        push("mlp.gate_proj.weight", vec![i, h]);
        push("mlp.up_proj.weight", vec![i, h]);
        push("mlp.down_proj.weight", vec![h, i]);
    }
    out.push((FINAL_NORM.to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push((LM_HEAD.to_string(), vec![v, h]));
    }
    out
}

/// Tensors a checkpoint may carry that the forward pass does not need (rotary caches some
/// exporters write).
fn ignorable(name: &str) -> bool {
    name.ends_with(".rotary_emb.inv_freq")
}

impl Model {
    /// Checks `weights` against `cfg` and builds the model. Every problem is reported at once:
    /// missing tensors, wrong shapes or dtypes, and tensors nothing explains (an `o_proj.bias`,
    /// an MLP bias, expert weights, … — a feature this crate would silently drop).
    pub fn new(
        config: ModelConfig,
        mut weights: WeightStore,
        tokenizer: Option<Tokenizer>,
        source: impl Into<String>,
        format: ModelFormat,
    ) -> Result<Model, ModelError> {
        let expected = tensor_names(&config);
        let mut reasons = Vec::new();
        for (name, shape) in &expected {
            match weights.get(name) {
                None => reasons.push(format!("missing tensor '{name}' (shape {shape:?})")),
                Some(t) => {
                    if t.shape() != shape.as_slice() {
                        reasons.push(format!(
                            "tensor '{name}' has shape {:?}, expected {shape:?}",
                            t.shape()
                        ));
                    }
                    if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
                        reasons.push(format!(
                            "tensor '{name}' has dtype {}, expected F32, F16 or BF16",
                            t.dtype()
                        ));
                    }
                }
            }
        }
        let mut extra: Vec<String> = weights
            .names()
            .filter(|n| !expected.iter().any(|(e, _)| e == n))
            .map(str::to_string)
            .collect();
        extra.retain(|n| !ignorable(n));
        if config.tie_word_embeddings && extra.iter().any(|n| n == LM_HEAD) {
            // Some tied checkpoints still store the head; it must equal the embedding.
            let same = match (weights.get(LM_HEAD), weights.get(EMBED)) {
                (Some(a), Some(b)) => a.shape() == b.shape() && a.to_f32_vec() == b.to_f32_vec(),
                _ => false,
            };
            if same {
                extra.retain(|n| n != LM_HEAD);
            } else {
                reasons.push(
                    "config ties the LM head to the embedding, but the checkpoint has a different 'lm_head.weight'"
                        .to_string(),
                );
                extra.retain(|n| n != LM_HEAD);
            }
        }
        for n in &extra {
            reasons.push(format!(
                "unexpected tensor '{n}' (a feature this importer does not support)"
            ));
        }
        if !reasons.is_empty() {
            return Err(ModelError::Unsupported { reasons });
        }
        let drop: Vec<String> = weights
            .names()
            .filter(|n| !expected.iter().any(|(e, _)| e == n))
            .map(str::to_string)
            .collect();
        for n in drop {
            weights.remove(&n);
        }
        Ok(Model {
            config,
            weights,
            tokenizer,
            source: source.into(),
            format,
        })
    }

    /// Total parameter count.
    pub fn n_params(&self) -> u64 {
        self.weights
            .names()
            .filter_map(|n| self.weights.get(n))
            .map(|t| t.shape().iter().product::<u64>())
            .sum()
    }
}
