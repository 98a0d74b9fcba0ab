//! The GGUF importer: a llama.cpp GGUF file (`general.architecture` `llama` or `qwen2`) →
//! [`Model`].
//!
//! Tensors are dequantised to F32 on load (the lowering casts to the program dtype) and renamed
//! to HF names; a `llama` file's Q/K rows (and biases) are un-permuted from llama.cpp's
//! adjacent-pair RoPE layout back to HF's rotate-half layout (a `qwen2` file keeps HF's), so the
//! rest of amk sees one convention.

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::model::{EMBED, FINAL_NORM, LM_HEAD, Model, ModelFormat, ROPE_FREQS, layer_tensor};
use crate::permute::unpermute_qk;
use crate::tokenizer::Tokenizer;
use amk_core::{Importer, WeightStore};
use std::io::Read;
use std::path::Path;

/// Imports GGUF files.
#[derive(Debug, Clone, Copy, Default)]
pub struct GgufImporter;

/// What a GGUF tensor name means in HF terms, and whether its rows need un-permuting (with
/// how many heads).
enum Mapped {
    /// Renamed only.
    Plain(String),
    /// Q or K rows (or bias) to un-permute over this many heads.
    Rotary(String, usize),
}

/// `permuted`: the file's Q/K rows are in llama.cpp's adjacent-pair RoPE layout (architecture
/// `llama`; `qwen2` files keep HF's rotate-half layout).
fn map_name(name: &str, cfg: &ModelConfig, permuted: bool) -> Option<Mapped> {
    use Mapped::*;
    let rotary = |hf: String, heads: usize| {
        if permuted {
            Rotary(hf, heads)
        } else {
            Plain(hf)
        }
    };
    match name {
        "token_embd.weight" => return Some(Plain(EMBED.to_string())),
        "output_norm.weight" => return Some(Plain(FINAL_NORM.to_string())),
        "output.weight" => return Some(Plain(LM_HEAD.to_string())),
        ROPE_FREQS => return Some(Plain(ROPE_FREQS.to_string())),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (l, what) = rest.split_once('.')?;
    let l: usize = l.parse().ok()?;
    let hf = |w: &str| layer_tensor(l, w);
    Some(match what {
        "attn_norm.weight" => Plain(hf("input_layernorm.weight")),
        "attn_q.weight" => rotary(hf("self_attn.q_proj.weight"), cfg.n_heads),
        "attn_k.weight" => rotary(hf("self_attn.k_proj.weight"), cfg.n_kv_heads),
        "attn_v.weight" => Plain(hf("self_attn.v_proj.weight")),
        "attn_q.bias" => rotary(hf("self_attn.q_proj.bias"), cfg.n_heads),
        "attn_k.bias" => rotary(hf("self_attn.k_proj.bias"), cfg.n_kv_heads),
        "attn_v.bias" => Plain(hf("self_attn.v_proj.bias")),
        "attn_q_norm.weight" => Plain(hf("self_attn.q_norm.weight")),
        "attn_k_norm.weight" => Plain(hf("self_attn.k_norm.weight")),
        "attn_output.weight" => Plain(hf("self_attn.o_proj.weight")),
        "attn_output.bias" => Plain(hf("self_attn.o_proj.bias")),
        "ffn_norm.weight" => Plain(hf("post_attention_layernorm.weight")),
        "ffn_gate.weight" => Plain(hf("mlp.gate_proj.weight")),
        "ffn_up.weight" => Plain(hf("mlp.up_proj.weight")),
        "ffn_down.weight" => Plain(hf("mlp.down_proj.weight")),
        _ => return None,
    })
}

/// Imports an already-parsed GGUF file (`source` is used in messages and metadata).
pub fn import_gguf_file(g: &GgufFile, source: &str) -> Result<Model, ModelError> {
    let config = ModelConfig::from_gguf(g)?;
    let permuted = g.get_str("general.architecture")? == "llama";
    let mut weights = WeightStore::new();
    let mut unknown = Vec::new();
    for info in g.tensor_infos() {
        match map_name(&info.name, &config, permuted) {
            None => unknown.push(format!(
                "unexpected tensor '{}' (not part of a Llama decoder this importer supports)",
                info.name
            )),
            Some(Mapped::Plain(hf)) => weights.insert(hf, g.tensor(&info.name)?),
            Some(Mapped::Rotary(hf, heads)) => {
                let t = g.tensor(&info.name)?;
                let t = unpermute_qk(&t, heads)
                    .map_err(|e| ModelError::Shape(format!("tensor '{}': {e}", info.name)))?;
                weights.insert(hf, t);
            }
        }
    }
    if !unknown.is_empty() {
        return Err(ModelError::Unsupported { reasons: unknown });
    }
    let tokenizer = Some(Tokenizer::from_gguf(g)?);
    Model::new(config, weights, tokenizer, source, ModelFormat::Gguf)
}

/// Reads and imports the GGUF file at `path`.
pub fn import_gguf(path: &Path) -> Result<Model, ModelError> {
    let g = GgufFile::read(path)?;
    import_gguf_file(&g, &path.display().to_string())
}

impl Importer for GgufImporter {
    type Model = Model;
    type Error = ModelError;
    fn name(&self) -> &'static str {
        "gguf"
    }
    fn probe(&self, path: &Path) -> bool {
        let mut magic = [0u8; 4];
        std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
            && &magic == b"GGUF"
    }
    fn import(&self, path: &Path) -> Result<Model, ModelError> {
        import_gguf(path)
    }
}
