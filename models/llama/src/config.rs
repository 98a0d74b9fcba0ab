//! The model hyper-parameters of a Llama-family decoder, read from a HuggingFace
//! `config.json` ([`ModelConfig::from_hf_json`]) or from GGUF metadata
//! ([`ModelConfig::from_gguf`]).
//!
//! Anything this crate cannot run (MoE, MLA, sliding-window attention, partial rotary, logit
//! soft-capping, unknown RoPE scaling, inconsistent head counts, …) is refused with one
//! [`ModelError::Unsupported`] that lists every reason found.

use amk_core::json::{self, Map, Value};

use crate::error::ModelError;
use crate::gguf::{GgufFile, GgufValue};

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Llama 3.1-style frequency-dependent scaling (`rope_type: "llama3"`).
    Llama3 {
        /// Overall scale factor.
        factor: f64,
        /// Low-frequency factor.
        low_freq_factor: f64,
        /// High-frequency factor.
        high_freq_factor: f64,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
    /// Per-pair frequency divisors stored in the checkpoint (GGUF's `rope_freqs.weight`, which
    /// llama.cpp writes for Llama 3's scaling), `head_dim / 2` of them.
    Factors,
}

impl RopeScaling {
    /// What each rotary pair's frequency is divided by, pair `i` of `head_dim / 2` having the
    /// base frequency `theta^(-2i / head_dim)`: `None` for plain RoPE. Llama 3's scaling
    /// (transformers' `_compute_llama3_parameters`, the same factors llama.cpp stores as GGUF's
    /// `rope_freqs.weight`): pairs whose wavelength `2π / freq` is shorter than
    /// `original / high_freq_factor` keep their frequency (1), those longer than `original /
    /// low_freq_factor` are divided by `factor`, and the ones between by
    /// `1 / ((1 - s) / factor + s)` with `s = (original / wavelength - low) / (high - low)`;
    /// worked in f64, rounded to f32 at the end.
    /// [`RopeScaling::Factors`]' divisors are the checkpoint's, not the config's: `None` too.
    pub fn pair_divisors(&self, head_dim: usize, theta: f64) -> Option<Vec<f32>> {
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings,
        } = *self
        else {
            return None;
        };
        let original = original_max_position_embeddings as f64;
        let (long, short) = (original / low, original / high);
        let divisor = |i: usize| {
            let freq = theta.powf(-((2 * i) as f64) / head_dim as f64);
            let wavelength = 2.0 * std::f64::consts::PI / freq;
            if wavelength < short {
                1.0
            } else if wavelength > long {
                factor
            } else {
                let s = (original / wavelength - low) / (high - low);
                1.0 / ((1.0 - s) / factor + s)
            }
        };
        Some((0..head_dim / 2).map(|i| divisor(i) as f32).collect())
    }
}

/// Hyper-parameters of a Llama-family decoder (Llama, Mistral without sliding window, Qwen2).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Model (residual stream) width.
    pub hidden: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (`n_heads` without GQA, 1 for MQA).
    pub n_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// MLP inner width.
    pub intermediate: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Number of decoder layers.
    pub n_layers: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// Longest supported context.
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the token-embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether the q/k/v projections carry biases (Qwen2-style; o_proj never does here).
    pub attention_bias: bool,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Whether q and k are RMS-normalised per head (over `head_dim`, one weight per projection)
    /// before RoPE (Qwen3).
    pub qk_norm: bool,
}

const ACCEPTED_ARCHITECTURES: [&str; 4] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
];
const ACCEPTED_MODEL_TYPES: [&str; 4] = ["llama", "mistral", "qwen2", "qwen3"];
/// GGUF `general.architecture` values the importer reads: llama.cpp writes Llama and Mistral
/// as `llama` (Q/K rows permuted for its RoPE), Qwen2 and Qwen2.5 as `qwen2` and Qwen3 as
/// `qwen3` (neither permuted).
pub const GGUF_ARCHITECTURES: [&str; 3] = ["llama", "qwen2", "qwen3"];

fn type_err(key: &str, expected: &str, v: &Value) -> ModelError {
    ModelError::ConfigKeyType {
        key: key.to_string(),
        expected: expected.to_string(),
        found: v.type_name().to_string(),
    }
}

/// `map[key]`, treating `null` as absent.
fn present<'a>(map: &'a Map, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !matches!(v, Value::Null))
}

fn opt_usize(map: &Map, key: &str, name: &str) -> Result<Option<usize>, ModelError> {
    match present(map, key) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .and_then(|i| usize::try_from(i).ok())
            .map(Some)
            .ok_or_else(|| type_err(name, "a non-negative integer", v)),
    }
}

fn req_usize(map: &Map, key: &str, name: &str) -> Result<usize, ModelError> {
    opt_usize(map, key, name)?.ok_or_else(|| ModelError::MissingConfigKey(name.to_string()))
}

fn opt_f64(map: &Map, key: &str, name: &str) -> Result<Option<f64>, ModelError> {
    match present(map, key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| type_err(name, "a number", v)),
    }
}

fn req_f64(map: &Map, key: &str, name: &str) -> Result<f64, ModelError> {
    opt_f64(map, key, name)?.ok_or_else(|| ModelError::MissingConfigKey(name.to_string()))
}

fn opt_bool(map: &Map, key: &str) -> Result<Option<bool>, ModelError> {
    match present(map, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(type_err(key, "a boolean", v)),
    }
}

fn opt_str<'a>(map: &'a Map, key: &str, name: &str) -> Result<Option<&'a str>, ModelError> {
    match present(map, key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| type_err(name, "a string", v)),
    }
}

/// Checks shared by both sources; pushes reasons for inconsistent head geometry.
/// Largest value any single dimension may take: keeps every product of two dims (and the
/// element counts of every tensor) far inside `u64`/`usize`, and the values inside the ABI's
/// int32 params.
pub const MAX_DIM: usize = 1 << 24;
/// Most decoder layers accepted.
pub const MAX_LAYERS: usize = 4096;

fn check_ranges(r: &ModelConfig, reasons: &mut Vec<String>) {
    for (name, v) in [
        ("hidden size", r.hidden),
        ("attention heads", r.n_heads),
        ("head_dim", r.head_dim),
        ("intermediate size", r.intermediate),
        ("vocabulary size", r.vocab),
        ("max_position_embeddings", r.max_position_embeddings),
    ] {
        if v > MAX_DIM {
            reasons.push(format!("{name} {v} is larger than {MAX_DIM}"));
        }
    }
    if r.n_heads.saturating_mul(r.head_dim) > MAX_DIM {
        reasons.push(format!(
            "attention width heads × head_dim = {} is larger than {MAX_DIM}",
            r.n_heads.saturating_mul(r.head_dim)
        ));
    }
    for (name, v) in [
        ("intermediate size", r.intermediate),
        ("vocabulary size", r.vocab),
        ("max_position_embeddings", r.max_position_embeddings),
        ("number of layers", r.n_layers),
    ] {
        if v == 0 {
            reasons.push(format!("{name} is 0"));
        }
    }
    if r.n_layers > MAX_LAYERS {
        reasons.push(format!("{} layers is more than {MAX_LAYERS}", r.n_layers));
    }
    if !(r.rms_eps.is_finite() && r.rms_eps > 0.0 && r.rms_eps < 1.0) {
        reasons.push(format!("rms_norm_eps {} must be in (0, 1)", r.rms_eps));
    }
    if !(r.rope_theta.is_finite() && r.rope_theta > 1.0 && r.rope_theta <= f32::MAX as f64) {
        reasons.push(format!(
            "rope_theta {} must be a finite number above 1",
            r.rope_theta
        ));
    }
}

/// Adds the range reasons of `c` to `reasons`; the config if none, else every reason.
fn finish(c: ModelConfig, mut reasons: Vec<String>) -> Result<ModelConfig, ModelError> {
    check_ranges(&c, &mut reasons);
    if reasons.is_empty() {
        Ok(c)
    } else {
        Err(ModelError::Unsupported { reasons })
    }
}

fn check_geometry(
    hidden: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: Option<usize>,
    reasons: &mut Vec<String>,
) -> usize {
    if hidden == 0 {
        reasons.push("hidden size is 0".into());
    }
    if n_heads == 0 {
        reasons.push("number of attention heads is 0".into());
    }
    if n_kv_heads == 0 {
        reasons.push("number of key/value heads is 0".into());
    } else if !n_heads.is_multiple_of(n_kv_heads) {
        reasons.push(format!(
            "attention heads ({n_heads}) not divisible by key/value heads ({n_kv_heads})"
        ));
    }
    let head_dim = match head_dim {
        Some(d) => d,
        None if n_heads == 0 => 0,
        None => {
            if !hidden.is_multiple_of(n_heads) {
                reasons.push(format!(
                    "hidden size ({hidden}) not divisible by attention heads ({n_heads}) and no explicit head_dim"
                ));
            }
            hidden / n_heads
        }
    };
    if head_dim == 0 {
        if n_heads != 0 {
            reasons.push("head_dim is 0".into());
        }
    } else if head_dim % 2 != 0 {
        reasons.push(format!(
            "odd head_dim ({head_dim}) cannot be rotated by RoPE"
        ));
    }
    head_dim
}

/// Reads `rope_scaling` (or `rope_parameters`): the scaling, plus a `rope_theta` found inside.
fn parse_rope_scaling(
    root: &Map,
    reasons: &mut Vec<String>,
) -> Result<(RopeScaling, Option<f64>), ModelError> {
    let (key, v) = match (
        present(root, "rope_scaling"),
        present(root, "rope_parameters"),
    ) {
        (Some(v), _) => ("rope_scaling", v),
        (None, Some(v)) => ("rope_parameters", v),
        (None, None) => return Ok((RopeScaling::None, None)),
    };
    let m = v
        .as_object()
        .ok_or_else(|| type_err(key, "an object or null", v))?;
    let name = |k: &str| format!("{key}.{k}");
    let theta = opt_f64(m, "rope_theta", &name("rope_theta"))?;
    let ty = match opt_str(m, "rope_type", &name("rope_type"))? {
        Some(t) => Some(t),
        None => opt_str(m, "type", &name("type"))?,
    };
    let scaling = match ty.unwrap_or("default") {
        "default" => RopeScaling::None,
        "llama3" => RopeScaling::Llama3 {
            factor: req_f64(m, "factor", &name("factor"))?,
            low_freq_factor: req_f64(m, "low_freq_factor", &name("low_freq_factor"))?,
            high_freq_factor: req_f64(m, "high_freq_factor", &name("high_freq_factor"))?,
            original_max_position_embeddings: req_usize(
                m,
                "original_max_position_embeddings",
                &name("original_max_position_embeddings"),
            )?,
        },
        other => {
            reasons.push(format!("{key} type '{other}' (supported: default, llama3)"));
            RopeScaling::None
        }
    };
    Ok((scaling, theta))
}

/// A float metadata value as `f64`. An `f32` value is widened through its shortest decimal
/// form, so `1e-5` stored as `f32` reads back as `1e-5` (the value the converter was given)
/// rather than `9.99999974737875e-6`.
fn gguf_f64(g: &GgufFile, key: &str) -> Result<f64, ModelError> {
    match g.get(key) {
        Some(GgufValue::F32(x)) => Ok(x.to_string().parse::<f64>().unwrap_or(f64::from(*x))),
        Some(GgufValue::F64(x)) => Ok(*x),
        _ => g.get_f32(key).map(f64::from),
    }
}

impl ModelConfig {
    /// Parses a HuggingFace `config.json`.
    ///
    /// Defaults: `num_key_value_heads` = heads, `head_dim` = hidden / heads,
    /// `rms_norm_eps` = 1e-6, `rope_theta` = 10000 (or `rope_scaling.rope_theta`),
    /// `max_position_embeddings` = 4096, `tie_word_embeddings` = false, `attention_bias` =
    /// false (true for Qwen2, whose q/k/v projections always carry biases); `qk_norm` for
    /// Qwen3 (its per-head q/k RMSNorm).
    ///
    /// # Errors
    /// [`ModelError::ConfigJson`] for invalid JSON, [`ModelError::MissingConfigKey`] /
    /// [`ModelError::ConfigKeyType`] for missing or mistyped keys, and one
    /// [`ModelError::Unsupported`] listing every unsupported feature.
    pub fn from_hf_json(text: &str) -> Result<ModelConfig, ModelError> {
        let doc = json::parse(text).map_err(|e| ModelError::ConfigJson(e.to_string()))?;
        let root = doc.as_object().ok_or_else(|| {
            ModelError::ConfigJson(format!("expected an object, found {}", doc.type_name()))
        })?;
        let mut reasons = Vec::new();

        // Family.
        let mut is_qwen2 = false;
        let mut is_qwen3 = false;
        if let Some(v) = present(root, "architectures") {
            let arr = v
                .as_array()
                .ok_or_else(|| type_err("architectures", "an array of strings", v))?;
            for a in arr {
                let a = a
                    .as_str()
                    .ok_or_else(|| type_err("architectures", "an array of strings", a))?;
                if !ACCEPTED_ARCHITECTURES.contains(&a) {
                    reasons.push(format!(
                        "architecture '{a}' (supported: {})",
                        ACCEPTED_ARCHITECTURES.join(", ")
                    ));
                }
                is_qwen2 |= a == "Qwen2ForCausalLM";
                is_qwen3 |= a == "Qwen3ForCausalLM";
            }
        }
        if let Some(t) = opt_str(root, "model_type", "model_type")? {
            if !ACCEPTED_MODEL_TYPES.contains(&t) {
                reasons.push(format!(
                    "model_type '{t}' (supported: {})",
                    ACCEPTED_MODEL_TYPES.join(", ")
                ));
            }
            is_qwen2 |= t == "qwen2";
            is_qwen3 |= t == "qwen3";
        }

        // Unsupported features.
        if opt_bool(root, "mlp_bias")? == Some(true) {
            reasons.push("mlp_bias (biases on the MLP projections)".into());
        }
        if let Some(act) = opt_str(root, "hidden_act", "hidden_act")?
            && act != "silu"
            && act != "swish"
        {
            reasons.push(format!("hidden_act '{act}' (supported: silu, swish)"));
        }
        for key in ["num_local_experts", "num_experts"] {
            if let Some(n) = opt_usize(root, key, key)?
                && n > 0
            {
                reasons.push(format!("mixture of experts ({key} = {n})"));
            }
        }
        if present(root, "kv_lora_rank").is_some() {
            reasons.push("multi-head latent attention (kv_lora_rank is set)".into());
        }
        if let Some(w) = present(root, "sliding_window")
            && opt_bool(root, "use_sliding_window")? != Some(false)
        {
            reasons.push(format!(
                "sliding-window attention (sliding_window = {})",
                w.render_compact()
            ));
        }
        if let Some(f) = opt_f64(root, "partial_rotary_factor", "partial_rotary_factor")?
            && f < 1.0
        {
            reasons.push(format!(
                "partial rotary embeddings (partial_rotary_factor = {f})"
            ));
        }
        for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
            if let Some(v) = present(root, key) {
                reasons.push(format!(
                    "logit soft-capping ({key} = {})",
                    v.render_compact()
                ));
            }
        }

        // Geometry.
        let hidden = req_usize(root, "hidden_size", "hidden_size")?;
        let n_heads = req_usize(root, "num_attention_heads", "num_attention_heads")?;
        let n_kv_heads =
            opt_usize(root, "num_key_value_heads", "num_key_value_heads")?.unwrap_or(n_heads);
        let explicit_head_dim = opt_usize(root, "head_dim", "head_dim")?;
        let intermediate = req_usize(root, "intermediate_size", "intermediate_size")?;
        let vocab = req_usize(root, "vocab_size", "vocab_size")?;
        let n_layers = req_usize(root, "num_hidden_layers", "num_hidden_layers")?;
        let head_dim = check_geometry(hidden, n_heads, n_kv_heads, explicit_head_dim, &mut reasons);

        let rms_eps = opt_f64(root, "rms_norm_eps", "rms_norm_eps")?.unwrap_or(1e-6);
        let (rope_scaling, inner_theta) = parse_rope_scaling(root, &mut reasons)?;
        let rope_theta = opt_f64(root, "rope_theta", "rope_theta")?
            .or(inner_theta)
            .unwrap_or(10000.0);
        let max_position_embeddings =
            opt_usize(root, "max_position_embeddings", "max_position_embeddings")?.unwrap_or(4096);
        let tie_word_embeddings = opt_bool(root, "tie_word_embeddings")?.unwrap_or(false);
        let attention_bias = opt_bool(root, "attention_bias")?.unwrap_or(is_qwen2);
        finish(
            ModelConfig {
                hidden,
                n_heads,
                n_kv_heads,
                head_dim,
                intermediate,
                vocab,
                n_layers,
                rms_eps,
                rope_theta,
                max_position_embeddings,
                tie_word_embeddings,
                attention_bias,
                rope_scaling,
                qk_norm: is_qwen3,
            },
            reasons,
        )
    }

    /// Reads the configuration of a GGUF file whose `general.architecture` is one of
    /// [`GGUF_ARCHITECTURES`] (`ARCH` below: every key is the architecture's).
    ///
    /// `head_dim` is `ARCH.attention.key_length` when present, else hidden / heads;
    /// `vocab` is `ARCH.vocab_size` or the length of `tokenizer.ggml.tokens`;
    /// `tie_word_embeddings` is the absence of an `output.weight` tensor; `attention_bias` is
    /// the presence of any `blk.*.attn_q.bias` tensor. RoPE scaling is
    /// [`RopeScaling::Factors`] when the file has a `rope_freqs.weight` tensor (Llama 3's
    /// per-pair divisors), else [`RopeScaling::None`]; an `ARCH.rope.scaling.type` other than
    /// `none` is refused.
    ///
    /// # Errors
    /// [`ModelError::MissingKey`] / [`ModelError::KeyType`] for missing or mistyped keys, and
    /// one [`ModelError::Unsupported`] listing every unsupported feature.
    pub fn from_gguf(g: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch = g.get_str("general.architecture")?;
        if !GGUF_ARCHITECTURES.contains(&arch) {
            return Err(ModelError::Unsupported {
                reasons: vec![format!(
                    "GGUF architecture '{arch}' (supported: {})",
                    GGUF_ARCHITECTURES.join(", ")
                )],
            });
        }
        // Every hyper-parameter key is the architecture's (`llama.block_count`,
        // `qwen2.block_count`, ...).
        let key = |k: &str| format!("{arch}.{k}");
        let us = |k: &str| g.get_u64(&key(k)).map(|v| v as usize);
        let opt_us = |k: &str| {
            if g.contains_key(&key(k)) {
                us(k).map(Some)
            } else {
                Ok(None)
            }
        };
        let mut reasons = Vec::new();
        let n_layers = us("block_count")?;
        let hidden = us("embedding_length")?;
        let intermediate = us("feed_forward_length")?;
        let n_heads = us("attention.head_count")?;
        let n_kv_heads = opt_us("attention.head_count_kv")?.unwrap_or(n_heads);
        let explicit_head_dim = opt_us("attention.key_length")?;
        if let (Some(k), Some(v)) = (explicit_head_dim, opt_us("attention.value_length")?)
            && k != v
        {
            reasons.push(format!("key_length ({k}) differs from value_length ({v})"));
        }
        let rms_eps = gguf_f64(g, &key("attention.layer_norm_rms_epsilon"))?;
        let rope_theta = if g.contains_key(&key("rope.freq_base")) {
            gguf_f64(g, &key("rope.freq_base"))?
        } else {
            10000.0
        };
        let max_position_embeddings = us("context_length")?;
        let head_dim = check_geometry(hidden, n_heads, n_kv_heads, explicit_head_dim, &mut reasons);
        if let Some(rot) = opt_us("rope.dimension_count")?
            && rot != head_dim
        {
            reasons.push(format!(
                "partial rotary (llama.rope.dimension_count = {rot}, head_dim = {head_dim})"
            ));
        }
        if g.contains_key(&key("rope.scaling.type")) {
            let t = g.get_str(&key("rope.scaling.type"))?;
            if t != "none" {
                reasons.push(format!("GGUF rope scaling type '{t}'"));
            }
        }
        let rope_scaling = if g
            .tensor_infos()
            .iter()
            .any(|t| t.name == crate::model::ROPE_FREQS)
        {
            RopeScaling::Factors
        } else {
            RopeScaling::None
        };
        if let Some(n) = opt_us("expert_count")?
            && n > 0
        {
            reasons.push(format!("mixture of experts (llama.expert_count = {n})"));
        }
        let vocab = match opt_us("vocab_size")? {
            Some(v) => v,
            None if g.contains_key("tokenizer.ggml.tokens") => {
                g.get_array_len("tokenizer.ggml.tokens")?.1
            }
            None => return Err(ModelError::MissingKey(key("vocab_size"))),
        };
        let names = g.tensor_infos();
        let tie_word_embeddings = !names.iter().any(|t| t.name == "output.weight");
        let attention_bias = names
            .iter()
            .any(|t| t.name.starts_with("blk.") && t.name.ends_with(".attn_q.bias"));
        finish(
            ModelConfig {
                hidden,
                n_heads,
                n_kv_heads,
                head_dim,
                intermediate,
                vocab,
                n_layers,
                rms_eps,
                rope_theta,
                max_position_embeddings,
                tie_word_embeddings,
                attention_bias,
                rope_scaling,
                qk_norm: arch == "qwen3",
            },
            reasons,
        )
    }
}
