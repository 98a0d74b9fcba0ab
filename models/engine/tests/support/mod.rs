//! What the engine's CPU tests share: the op registry and a tiny random Llama.

#![allow(dead_code, clippy::unwrap_used)]

use amk_core::Registry;
use amk_model_llama::Model;
use amk_model_llama::config::{ModelConfig, RopeScaling};

pub fn registry() -> Registry {
    amk_ops::registry().unwrap()
}

/// A two-layer GQA Llama (4 heads, 2 KV heads of 8) with 40 tokens and random weights.
pub fn tiny() -> Model {
    let c = ModelConfig {
        hidden: 32,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
        intermediate: 48,
        vocab: 40,
        n_layers: 2,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
        attention_bias: false,
        rope_scaling: RopeScaling::None,
        qk_norm: false,
    };
    Model::random(c, 7).unwrap()
}
