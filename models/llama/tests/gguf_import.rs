//! The tiny reference checkpoints written as llama.cpp lays a GGUF out, then imported: the
//! tiny-gqa Llama as architecture `llama` (Q/K rows permuted to llama.cpp's RoPE layout), the
//! tiny-qwen2 as `qwen2` (rows as HF has them; q/k/v biases). Each imports to the model its HF
//! directory imports to: the same configuration and every weight bit for bit, so the `llama`
//! rows are un-permuted and the `qwen2` ones left alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_model_llama::gguf::write::GgufWriter;
use amk_model_llama::gguf_import::import_gguf_file;
use amk_model_llama::hf::import_hf;
use amk_model_llama::model::{EMBED, FINAL_NORM, LM_HEAD};
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
            GgufValue::String(if arch == "qwen2" { "qwen2" } else { "llama3" }.into()),
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
    GgufFile::parse(w.to_bytes()).unwrap()
}

#[test]
fn reference_checkpoints_import_the_same_from_gguf() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference");
    for (name, arch) in [("tiny-gqa", "llama"), ("tiny-qwen2", "qwen2")] {
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
