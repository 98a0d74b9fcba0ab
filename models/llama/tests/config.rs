//! `ModelConfig` tests: HuggingFace `config.json` texts modelled on SmolLM2-135M,
//! Llama-3.2-1B and Qwen2, GQA/MQA, refusals that list every reason, missing and mistyped
//! keys, GGUF files built with `GgufWriter`, and optionally a real file named by
//! `$AMK_TEST_GGUF`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_model_llama::config::{ModelConfig, RopeScaling};
use amk_model_llama::gguf::write::GgufWriter;
use amk_model_llama::{GgufFile, GgufValue, ModelError, ValueType};
use rstest::rstest;

const SMOLLM2: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 0,
  "hidden_act": "silu",
  "hidden_size": 576,
  "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536,
  "is_llama_config": true,
  "max_position_embeddings": 8192,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 9,
  "num_hidden_layers": 30,
  "num_key_value_heads": 3,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_interleaved": false,
  "rope_scaling": null,
  "rope_theta": 100000,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 49152
}"#;

const LLAMA32_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "vocab_size": 128256
}"#;

const QWEN2: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "hidden_act": "silu",
  "hidden_size": 896,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 21,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

fn unsupported(text: &str) -> Vec<String> {
    match ModelConfig::from_hf_json(text) {
        Err(ModelError::Unsupported { reasons }) => reasons,
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn smollm2_exact_fields() {
    let c = ModelConfig::from_hf_json(SMOLLM2).unwrap();
    assert_eq!(
        c,
        ModelConfig {
            hidden: 576,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            intermediate: 1536,
            vocab: 49152,
            n_layers: 30,
            rms_eps: 1e-5,
            rope_theta: 100000.0,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            attention_bias: false,
            rope_scaling: RopeScaling::None,
            qk_norm: false,
        }
    );
}

#[test]
fn llama32_llama3_rope_and_tied() {
    let c = ModelConfig::from_hf_json(LLAMA32_1B).unwrap();
    assert_eq!(c.hidden, 2048);
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (32, 8, 64));
    assert_eq!((c.intermediate, c.vocab, c.n_layers), (8192, 128256, 16));
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(c.max_position_embeddings, 131072);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    );
}

/// Llama 3's per-pair frequency divisors, against the values issue 39 states (worked from
/// transformers' `_compute_llama3_parameters`, to f32 rounding): the 1B (head_dim 64, factor
/// 32, low 1, high 4, original 8192, theta 5e5) keeps pairs 0–14, divides 18–31 by 32 and pairs
/// 15, 16, 17 by 1.6513, 3.2923, 9.6667; the 8B (head_dim 128, factor 8) keeps 0–28 and divides
/// 35–63 by 8. Plain RoPE has none.
#[test]
fn llama3_pair_divisors_match_the_stated_values() {
    let c = ModelConfig::from_hf_json(LLAMA32_1B).unwrap();
    let d = c
        .rope_scaling
        .pair_divisors(c.head_dim, c.rope_theta)
        .unwrap();
    assert_eq!(d.len(), 32);
    assert!(d[..15].iter().all(|&x| x == 1.0), "{d:?}");
    assert!(d[18..].iter().all(|&x| x == 32.0), "{d:?}");
    for (i, want) in [(15, 1.6513f32), (16, 3.2923), (17, 9.6667)] {
        assert!(
            (d[i] - want).abs() < 5e-5 * want,
            "pair {i}: {} vs {want}",
            d[i]
        );
    }
    let eight_b = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let d = eight_b.pair_divisors(128, 500000.0).unwrap();
    assert_eq!(d.len(), 64);
    assert!(d[..29].iter().all(|&x| x == 1.0), "{d:?}");
    assert!(d[35..].iter().all(|&x| x == 8.0), "{d:?}");
    assert!(
        d[29..35]
            .windows(2)
            .all(|w| 1.0 < w[0] && w[0] < w[1] && w[1] < 8.0),
        "{d:?}"
    );
    assert_eq!(RopeScaling::None.pair_divisors(64, 1e4), None);
}

#[test]
fn qwen2_biases_and_disabled_sliding_window() {
    let c = ModelConfig::from_hf_json(QWEN2).unwrap();
    assert!(c.attention_bias, "Qwen2 always has q/k/v biases");
    assert_eq!(
        (c.hidden, c.n_heads, c.n_kv_heads, c.head_dim),
        (896, 14, 2, 64)
    );
    assert_eq!(c.rms_eps, 1e-6);
    assert_eq!(c.rope_theta, 1e6);
    // An explicit attention_bias wins.
    let text = QWEN2.replace(
        "\"hidden_act\"",
        "\"attention_bias\": false, \"hidden_act\"",
    );
    assert!(!ModelConfig::from_hf_json(&text).unwrap().attention_bias);
    let text = SMOLLM2.replace("\"attention_bias\": false", "\"attention_bias\": true");
    assert!(ModelConfig::from_hf_json(&text).unwrap().attention_bias);
}

fn minimal(extra: &str) -> String {
    format!(
        r#"{{"hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 512,
            "vocab_size": 1000, "num_hidden_layers": 2{extra}}}"#
    )
}

#[rstest]
#[case::mha("", 8, 32)]
#[case::gqa(r#", "num_key_value_heads": 2"#, 2, 32)]
#[case::mqa(r#", "num_key_value_heads": 1"#, 1, 32)]
#[case::explicit_head_dim(r#", "num_key_value_heads": 4, "head_dim": 64"#, 4, 64)]
fn head_layouts(#[case] extra: &str, #[case] kv: usize, #[case] head_dim: usize) {
    let c = ModelConfig::from_hf_json(&minimal(extra)).unwrap();
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (8, kv, head_dim));
}

#[test]
fn defaults() {
    let c = ModelConfig::from_hf_json(&minimal("")).unwrap();
    assert_eq!(c.rms_eps, 1e-6);
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(c.max_position_embeddings, 4096);
    assert!(!c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert_eq!(c.rope_scaling, RopeScaling::None);
}

#[rstest]
#[case::rope_type_default(r#", "rope_scaling": {"rope_type": "default"}"#, 10000.0)]
#[case::type_default(r#", "rope_scaling": {"type": "default"}"#, 10000.0)]
#[case::inner_theta(
    r#", "rope_scaling": {"rope_type": "default", "rope_theta": 5e5}"#,
    5e5
)]
#[case::top_level_wins(
    r#", "rope_theta": 1000.0, "rope_scaling": {"rope_type": "default", "rope_theta": 5e5}"#,
    1000.0
)]
fn rope_default_forms(#[case] extra: &str, #[case] theta: f64) {
    let c = ModelConfig::from_hf_json(&minimal(extra)).unwrap();
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert_eq!(c.rope_theta, theta);
}

#[test]
fn every_reason_is_listed() {
    let text = r#"{
      "architectures": ["GemmaForCausalLM"],
      "model_type": "gemma",
      "hidden_size": 100,
      "num_attention_heads": 7,
      "num_key_value_heads": 3,
      "intermediate_size": 512,
      "vocab_size": 1000,
      "num_hidden_layers": 2,
      "mlp_bias": true,
      "hidden_act": "gelu_pytorch_tanh",
      "num_local_experts": 8,
      "num_experts": 4,
      "kv_lora_rank": 512,
      "sliding_window": 4096,
      "partial_rotary_factor": 0.5,
      "final_logit_softcapping": 30.0,
      "attn_logit_softcapping": 50.0,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0}
    }"#;
    let reasons = unsupported(text);
    let all = reasons.join("\n");
    for needle in [
        "architecture 'GemmaForCausalLM'",
        "model_type 'gemma'",
        "mlp_bias",
        "hidden_act 'gelu_pytorch_tanh'",
        "num_local_experts = 8",
        "num_experts = 4",
        "kv_lora_rank",
        "sliding_window = 4096",
        "partial_rotary_factor = 0.5",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "'yarn'",
        "hidden size (100) not divisible by attention heads (7)",
        "attention heads (7) not divisible by key/value heads (3)",
    ] {
        assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
    }
    assert_eq!(reasons.len(), 14, "{all}");
    // The Display form lists them all too.
    let msg = ModelError::Unsupported { reasons }.to_string();
    assert!(msg.contains("mlp_bias") && msg.contains("'yarn'"), "{msg}");
}

#[rstest]
#[case::mistral_window(
    r#", "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096"#,
    "sliding-window"
)]
#[case::window_enabled(
    r#", "sliding_window": 4096, "use_sliding_window": true"#,
    "sliding-window"
)]
#[case::odd_head_dim(r#", "head_dim": 33"#, "odd head_dim (33)")]
#[case::moe(r#", "num_experts": 2"#, "mixture of experts")]
#[case::linear_rope(r#", "rope_scaling": {"type": "linear", "factor": 2.0}"#, "'linear'")]
fn single_refusals(#[case] extra: &str, #[case] needle: &str) {
    let reasons = unsupported(&minimal(extra));
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains(needle), "{reasons:?}");
}

#[rstest]
#[case::mistral_no_window(r#", "architectures": ["MistralForCausalLM"], "sliding_window": null"#)]
#[case::swish(r#", "hidden_act": "swish", "mlp_bias": false"#)]
#[case::zero_experts(r#", "num_local_experts": 0"#)]
#[case::full_rotary(r#", "partial_rotary_factor": 1.0"#)]
#[case::null_caps(r#", "final_logit_softcapping": null, "attn_logit_softcapping": null"#)]
#[case::null_mla(r#", "kv_lora_rank": null"#)]
fn accepted_variants(#[case] extra: &str) {
    ModelConfig::from_hf_json(&minimal(extra)).unwrap();
}

#[rstest]
#[case::hidden("hidden_size")]
#[case::heads("num_attention_heads")]
#[case::intermediate("intermediate_size")]
#[case::vocab("vocab_size")]
#[case::layers("num_hidden_layers")]
fn missing_required_key(#[case] key: &str) {
    let mut v = amk_core::json::parse(&minimal("")).unwrap();
    let amk_core::json::Value::Object(m) = &mut v else {
        panic!()
    };
    m.0.retain(|(k, _)| k != key);
    let text = amk_core::json::to_pretty(&v);
    match ModelConfig::from_hf_json(&text) {
        Err(ModelError::MissingConfigKey(k)) => assert_eq!(k, key),
        other => panic!("expected MissingConfigKey({key}), got {other:?}"),
    }
}

#[test]
fn missing_llama3_field_names_nested_key() {
    let text = minimal(
        r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}"#,
    );
    match ModelConfig::from_hf_json(&text) {
        Err(ModelError::MissingConfigKey(k)) => {
            assert_eq!(k, "rope_scaling.original_max_position_embeddings")
        }
        other => panic!("{other:?}"),
    }
}

#[rstest]
#[case::string_hidden(r#"{"hidden_size": "576"}"#, "hidden_size")]
#[case::negative_heads(
    r#"{"hidden_size": 576, "num_attention_heads": -9}"#,
    "num_attention_heads"
)]
#[case::bool_tie(&minimal(r#", "tie_word_embeddings": "yes""#), "tie_word_embeddings")]
fn mistyped_keys(#[case] text: &str, #[case] key: &str) {
    match ModelConfig::from_hf_json(text) {
        Err(ModelError::ConfigKeyType { key: k, .. }) => assert_eq!(k, key),
        other => panic!("{other:?}"),
    }
}

#[rstest]
#[case::not_json("{")]
#[case::not_object("[1, 2]")]
#[case::duplicate(r#"{"a": 1, "a": 2}"#)]
fn bad_json(#[case] text: &str) {
    assert!(matches!(
        ModelConfig::from_hf_json(text),
        Err(ModelError::ConfigJson(_))
    ));
}

// ---- GGUF ----

fn tokens(n: usize) -> GgufValue {
    GgufValue::Array(
        ValueType::String,
        (0..n).map(|i| GgufValue::String(format!("t{i}"))).collect(),
    )
}

/// A SmolLM2-135M-shaped metadata block with one layer's worth of tiny tensors.
fn gguf_writer(arch: &str, tied: bool, qkv_bias: bool) -> GgufWriter {
    // every hyper-parameter under the architecture's own name (`qwen2.block_count`, ...)
    let k = |key: &str| format!("{arch}.{key}");
    let mut w = GgufWriter::new(3);
    w.kv("general.architecture", GgufValue::String(arch.into()))
        .kv(k("block_count"), GgufValue::U32(30))
        .kv(k("context_length"), GgufValue::U32(8192))
        .kv(k("embedding_length"), GgufValue::U32(576))
        .kv(k("feed_forward_length"), GgufValue::U32(1536))
        .kv(k("attention.head_count"), GgufValue::U32(9))
        .kv(k("attention.head_count_kv"), GgufValue::U32(3))
        .kv(k("rope.freq_base"), GgufValue::F32(100000.0))
        .kv(k("attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-5))
        .kv(k("rope.dimension_count"), GgufValue::U32(64))
        .kv("tokenizer.ggml.tokens", tokens(100));
    w.tensor_f32("token_embd.weight", &[2, 2], &[0.0; 4]);
    if !tied {
        w.tensor_f32("output.weight", &[2, 2], &[0.0; 4]);
    }
    w.tensor_f32("blk.0.attn_q.weight", &[2, 2], &[0.0; 4]);
    if qkv_bias {
        w.tensor_f32("blk.0.attn_q.bias", &[2], &[0.0; 2]);
    }
    w
}

fn parse(w: &GgufWriter) -> GgufFile {
    GgufFile::parse(w.to_bytes()).unwrap()
}

#[rstest]
#[case::tied("llama", true, false)]
#[case::untied("llama", false, false)]
#[case::biased("llama", false, true)]
#[case::qwen2("qwen2", true, true)]
fn gguf_config(#[case] arch: &str, #[case] tied: bool, #[case] bias: bool) {
    let c = ModelConfig::from_gguf(&parse(&gguf_writer(arch, tied, bias))).unwrap();
    assert_eq!(
        c,
        ModelConfig {
            hidden: 576,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            intermediate: 1536,
            vocab: 100,
            n_layers: 30,
            rms_eps: 1e-5,
            rope_theta: 100000.0,
            max_position_embeddings: 8192,
            tie_word_embeddings: tied,
            attention_bias: bias,
            rope_scaling: RopeScaling::None,
            qk_norm: false,
        }
    );
}

#[test]
fn gguf_vocab_size_key_and_defaults() {
    let mut w = GgufWriter::new(3);
    w.kv("general.architecture", GgufValue::String("llama".into()))
        .kv("llama.block_count", GgufValue::U64(2))
        .kv("llama.context_length", GgufValue::U32(2048))
        .kv("llama.embedding_length", GgufValue::U32(256))
        .kv("llama.feed_forward_length", GgufValue::U32(512))
        .kv("llama.attention.head_count", GgufValue::U32(4))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(1e-6),
        )
        .kv("llama.vocab_size", GgufValue::U32(777));
    let c = ModelConfig::from_gguf(&parse(&w)).unwrap();
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (4, 4, 64));
    assert_eq!(c.vocab, 777);
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(c.rms_eps, 1e-6);
    assert!(c.tie_word_embeddings);
}

#[test]
fn gguf_wrong_architecture() {
    match ModelConfig::from_gguf(&parse(&gguf_writer("gemma2", true, false))) {
        Err(ModelError::Unsupported { reasons }) => {
            assert_eq!(reasons.len(), 1);
            assert!(reasons[0].contains("'gemma2'"), "{reasons:?}");
            assert!(reasons[0].contains("llama, qwen2"), "{reasons:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn gguf_partial_rotary() {
    let mut w = GgufWriter::new(3);
    w.kv("general.architecture", GgufValue::String("llama".into()))
        .kv("llama.block_count", GgufValue::U32(2))
        .kv("llama.context_length", GgufValue::U32(2048))
        .kv("llama.embedding_length", GgufValue::U32(256))
        .kv("llama.feed_forward_length", GgufValue::U32(512))
        .kv("llama.attention.head_count", GgufValue::U32(4))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(1e-6),
        )
        .kv("llama.rope.dimension_count", GgufValue::U32(32))
        .kv("tokenizer.ggml.tokens", tokens(10));
    match ModelConfig::from_gguf(&parse(&w)) {
        Err(ModelError::Unsupported { reasons }) => {
            assert!(reasons[0].contains("partial rotary"), "{reasons:?}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn gguf_missing_key() {
    let mut w = GgufWriter::new(3);
    w.kv("general.architecture", GgufValue::String("llama".into()))
        .kv("llama.block_count", GgufValue::U32(2));
    match ModelConfig::from_gguf(&parse(&w)) {
        Err(ModelError::MissingKey(k)) => assert_eq!(k, "llama.embedding_length"),
        other => panic!("{other:?}"),
    }
}

/// A real SmolLM2-135M file, when `$AMK_TEST_GGUF` names one.
#[test]
fn real_gguf_config() {
    let Ok(path) = std::env::var("AMK_TEST_GGUF") else {
        println!("note: AMK_TEST_GGUF is not set; skipping the real-file test");
        return;
    };
    let g = GgufFile::read(&path).unwrap();
    let c = ModelConfig::from_gguf(&g).unwrap();
    println!("{path}: {c:?}");
    assert_eq!(c.n_layers, 30);
    assert_eq!(c.hidden, 576);
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (9, 3, 64));
    assert_eq!(c.intermediate, 1536);
    assert_eq!(c.vocab, 49152);
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.rms_eps, 1e-5);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);
}
