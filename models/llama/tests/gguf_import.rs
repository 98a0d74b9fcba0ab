//! The tiny reference checkpoints written as llama.cpp lays a GGUF out, then imported: the
//! tiny-gqa Llama as architecture `llama` (Q/K rows permuted to llama.cpp's RoPE layout), the
//! tiny-qwen2 as `qwen2` (rows as HF has them; q/k/v biases), the tiny-qwen3 as `qwen3` (rows
//! as HF has them; per-head q/k norm weights). Each imports to the model its HF
//! directory imports to: the same configuration and every weight bit for bit, so the `llama`
//! rows are un-permuted and the `qwen2` ones left alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::{GpuTarget, ScheduleConfig};
use amk_model_llama::config::RopeScaling;
use amk_model_llama::gguf::write::GgufWriter;
use amk_model_llama::gguf_import::import_gguf_file;
use amk_model_llama::hf::import_hf;
use amk_model_llama::lower::{LowerOptions, lower};
use amk_model_llama::model::{EMBED, FINAL_NORM, LM_HEAD, ROPE_FREQS};
use amk_model_llama::permute::permute_qk;
use amk_model_llama::{GgufFile, GgufValue, Model};
use std::path::Path;

/// The GGUF name of an HF tensor name (llama.cpp's), and whether it is a Q/K tensor with the
/// heads it spans.
fn gguf_name(hf: &str, m: &Model) -> (String, Option<usize>) {
    match hf {
        EMBED => return ("token_embd.weight".into(), None),
        FINAL_NORM => return ("output_norm.weight".into(), None),
        LM_HEAD => return ("output.weight".into(), None),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").expect(hf);
    let (l, what) = rest.split_once('.').unwrap();
    let (name, heads) = match what {
        "input_layernorm.weight" => ("attn_norm.weight", None),
        "self_attn.q_proj.weight" => ("attn_q.weight", Some(m.config.n_heads)),
        "self_attn.k_proj.weight" => ("attn_k.weight", Some(m.config.n_kv_heads)),
        "self_attn.v_proj.weight" => ("attn_v.weight", None),
        "self_attn.q_proj.bias" => ("attn_q.bias", Some(m.config.n_heads)),
        "self_attn.k_proj.bias" => ("attn_k.bias", Some(m.config.n_kv_heads)),
        "self_attn.v_proj.bias" => ("attn_v.bias", None),
        "self_attn.q_norm.weight" => ("attn_q_norm.weight", None),
        "self_attn.k_norm.weight" => ("attn_k_norm.weight", None),
        "self_attn.o_proj.weight" => ("attn_output.weight", None),
        "post_attention_layernorm.weight" => ("ffn_norm.weight", None),
        "mlp.gate_proj.weight" => ("ffn_gate.weight", None),
        "mlp.up_proj.weight" => ("ffn_up.weight", None),
        "mlp.down_proj.weight" => ("ffn_down.weight", None),
        other => panic!("no GGUF name for {other}"),
    };
    (format!("blk.{l}.{name}"), heads)
}

/// `m` as a GGUF of architecture `arch` (F32 tensors, a byte-level tokenizer of the model's
/// vocabulary size, `pre` as llama.cpp names the architecture's).
fn to_gguf(m: &Model, arch: &str) -> GgufFile {
    to_gguf_with(m, arch, None)
}

/// [`to_gguf`], plus a `rope_freqs.weight` tensor of per-pair RoPE divisors when given (what
/// llama.cpp's converter writes for Llama 3's frequency scaling).
fn to_gguf_with(m: &Model, arch: &str, rope_freqs: Option<&[f32]>) -> GgufFile {
    let c = &m.config;
    let k = |key: &str| format!("{arch}.{key}");
    let u = |v: usize| GgufValue::U32(v as u32);
    let tokens: Vec<GgufValue> = (0..c.vocab)
        .map(|i| GgufValue::String(format!("t{i}")))
        .collect();
    let mut w = GgufWriter::new(3);
    w.kv("general.architecture", GgufValue::String(arch.into()))
        .kv(k("block_count"), u(c.n_layers))
        .kv(k("context_length"), u(c.max_position_embeddings))
        .kv(k("embedding_length"), u(c.hidden))
        .kv(k("feed_forward_length"), u(c.intermediate))
        .kv(k("attention.head_count"), u(c.n_heads))
        .kv(k("attention.head_count_kv"), u(c.n_kv_heads))
        .kv(k("attention.key_length"), u(c.head_dim))
        .kv(k("attention.value_length"), u(c.head_dim))
        .kv(k("rope.freq_base"), GgufValue::F32(c.rope_theta as f32))
        .kv(
            k("attention.layer_norm_rms_epsilon"),
            GgufValue::F32(c.rms_eps as f32),
        )
        .kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .kv(
            "tokenizer.ggml.pre",
            GgufValue::String(
                if arch.starts_with("qwen") {
                    "qwen2"
                } else {
                    "llama3"
                }
                .into(),
            ),
        )
        .kv(
            "tokenizer.ggml.tokens",
            GgufValue::Array(amk_model_llama::ValueType::String, tokens),
        )
        .kv(
            "tokenizer.ggml.merges",
            GgufValue::Array(amk_model_llama::ValueType::String, Vec::new()),
        );
    for name in m.weights.names() {
        let t = m.weights.get(name).unwrap();
        let (gname, heads) = gguf_name(name, m);
        let t = match heads {
            Some(h) if arch == "llama" => permute_qk(t, h).unwrap(),
            _ => (**t).clone(),
        };
        w.tensor_f32(gname, t.shape(), &t.to_f32_vec());
    }
    if let Some(f) = rope_freqs {
        w.tensor_f32(ROPE_FREQS.to_string(), &[f.len() as u64], f);
    }
    GgufFile::parse(w.to_bytes()).unwrap()
}

#[test]
fn reference_checkpoints_import_the_same_from_gguf() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference");
    for (name, arch) in [
        ("tiny-gqa", "llama"),
        ("tiny-mistral", "llama"),
        ("tiny-qwen2", "qwen2"),
        ("tiny-qwen3", "qwen3"),
    ] {
        let hf = import_hf(&root.join(name)).unwrap();
        let got = import_gguf_file(&to_gguf(&hf, arch), name).unwrap();
        assert_eq!(got.config, hf.config, "{name}");
        let names: Vec<&str> = hf.weights.names().collect();
        assert_eq!(got.weights.names().collect::<Vec<_>>(), names, "{name}");
        for n in names {
            let (a, b) = (hf.weights.get(n).unwrap(), got.weights.get(n).unwrap());
            assert_eq!(a.shape(), b.shape(), "{name} {n}");
            let same = a
                .to_f32_vec()
                .iter()
                .zip(b.to_f32_vec())
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{name} {n}: the weights differ");
        }
    }
}

/// Llama 3's frequency scaling as a GGUF carries it: llama.cpp's converter writes the per-pair
/// divisors as `rope_freqs.weight` (and no scaling keys). The import takes them as the model's
/// RoPE factors, and the lowered program's divisors are bit for bit the ones the HF directory's
/// `rope_parameters` give (whose logits `tests/tests/hf_reference.rs` checks against
/// transformers).
#[test]
fn a_llama3_gguf_carries_its_rope_divisors_as_rope_freqs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference");
    let hf = import_hf(&root.join("tiny-llama3")).unwrap();
    assert!(matches!(hf.config.rope_scaling, RopeScaling::Llama3 { .. }));
    let divisors = hf
        .config
        .rope_scaling
        .pair_divisors(hf.config.head_dim, hf.config.rope_theta)
        .unwrap();
    let got =
        import_gguf_file(&to_gguf_with(&hf, "llama", Some(&divisors)), "tiny-llama3").unwrap();
    assert_eq!(got.config.rope_scaling, RopeScaling::Factors);
    assert_eq!(
        got.config,
        amk_model_llama::config::ModelConfig {
            rope_scaling: RopeScaling::Factors,
            ..hf.config.clone()
        }
    );
    let target = GpuTarget::by_name("h100").unwrap();
    let opts = LowerOptions::default();
    let factors = |m: &Model| {
        let lowered = lower(m, &ScheduleConfig::default(), &target, &opts).unwrap();
        lowered.weights.get(ROPE_FREQS).unwrap().to_f32_vec()
    };
    let (a, b) = (factors(&hf), factors(&got));
    assert_eq!(a.len(), hf.config.head_dim / 2);
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    // The HF directory's scaling, as transformers computes it (inv_freq / scaled inv_freq of the
    // saved model: 1, 1.2940, 7.6674, then 8 for the pairs whose wavelength exceeds 64).
    for (i, want) in [1.0f32, 1.2940, 7.6674, 8.0, 8.0, 8.0, 8.0, 8.0]
        .iter()
        .enumerate()
    {
        assert!(
            (a[i] - want).abs() <= 1e-4 * want,
            "pair {i}: {} against {want}",
            a[i]
        );
    }
}

#[test]
fn a_rope_freqs_tensor_of_the_wrong_length_or_sign_is_refused() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference");
    let hf = import_hf(&root.join("tiny-llama3")).unwrap();
    let short = to_gguf_with(&hf, "llama", Some(&[1.0; 3]));
    let err = import_gguf_file(&short, "short").unwrap_err();
    assert!(err.to_string().contains(ROPE_FREQS), "{err}");
    let mut bad = vec![1.0f32; hf.config.head_dim / 2];
    bad[2] = -1.0;
    let m = import_gguf_file(&to_gguf_with(&hf, "llama", Some(&bad)), "negative").unwrap();
    let target = GpuTarget::by_name("h100").unwrap();
    let err = lower(
        &m,
        &ScheduleConfig::default(),
        &target,
        &LowerOptions::default(),
    )
    .map(|_| ())
    .unwrap_err();
    assert!(err.to_string().contains("divisor 2 = -1"), "{err}");
}
