//! The HuggingFace importer: a checkpoint directory (`config.json` plus `model.safetensors`,
//! or shards listed by `model.safetensors.index.json`) to a [`Model`].
//!
//! Every safetensors file is memory-mapped and its header validated before any tensor is
//! copied ([`crate::safetensors`]); tensors keep their stored dtype (F32/F16/BF16; the lowering
//! converts) and their HF names. Before the tensor set is checked ([`Model::new`]) the names are
//! scanned for features this crate cannot run (mixture of experts, MLP or `o_proj` biases,
//! multi-head latent attention, q/k norms, q/k/v biases the config does not announce); those
//! reasons are combined with the ones `config.json` gives and with the tensor-set check, so a
//! refusal lists every reason at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path};

use amk_core::json::{self, Value};
use amk_core::{Importer, WeightStore};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::model::{Model, ModelFormat};
use crate::safetensors::SafetensorsFile;

/// The configuration file of a HF checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// The single-file weights of a HF checkpoint directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The shard index of a sharded HF checkpoint directory.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Imports HuggingFace checkpoint directories (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct HfImporter;

impl Importer for HfImporter {
    type Model = Model;
    type Error = ModelError;

    fn name(&self) -> &'static str {
        "hf"
    }

    /// A directory holding `config.json` and either `model.safetensors` or
    /// `model.safetensors.index.json` (names only; nothing is read).
    fn probe(&self, path: &Path) -> bool {
        path.is_dir()
            && path.join(CONFIG_FILE).is_file()
            && (path.join(WEIGHTS_FILE).is_file() || path.join(INDEX_FILE).is_file())
    }

    fn import(&self, path: &Path) -> Result<Model, ModelError> {
        import_hf(path)
    }
}

/// Imports the HF checkpoint directory `dir` (see the module docs).
///
/// # Errors
/// [`ModelError::Io`] for unreadable files, the config errors of
/// [`ModelConfig::from_hf_json`], [`ModelError::Safetensors`] for a malformed weights file or
/// shard index, and one [`ModelError::Unsupported`] listing every reason the model cannot be
/// run (from `config.json`, from the tensor names, and from the tensor-set check).
pub fn import_hf(dir: &Path) -> Result<Model, ModelError> {
    let config_path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
        path: config_path.clone(),
        source,
    })?;
    let config = match ModelConfig::from_hf_json(&text) {
        Ok(c) => Ok(c),
        Err(ModelError::Unsupported { reasons }) => Err(reasons),
        Err(e) => return Err(e),
    };

    let checkpoint = match Checkpoint::open(dir) {
        Ok(c) => c,
        Err(e) => {
            return Err(match config {
                // The config already refuses the model; say so, and why the weights could not
                // be examined for more reasons.
                Err(mut reasons) => {
                    reasons.push(format!("(the weights could not be examined: {e})"));
                    ModelError::Unsupported { reasons }
                }
                Ok(_) => e,
            });
        }
    };

    let scan = scan_features(checkpoint.names(), config.as_ref().ok());
    let config = match config {
        Ok(c) => c,
        Err(mut reasons) => {
            reasons.extend(scan.reasons);
            return Err(ModelError::Unsupported { reasons });
        }
    };

    let mut weights = WeightStore::new();
    for (file, entry) in checkpoint.tensors() {
        if scan.explained.contains(entry.name.as_str()) {
            continue; // already a reason; copying it would only add "unexpected tensor" noise
        }
        weights.insert(entry.name.clone(), file.tensor(entry)?);
    }

    // The tokenizer travels beside the weights when the checkpoint has one (the tiny test
    // checkpoints do not; `amk generate` then says a tokenizer is needed).
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = if tok_path.is_file() {
        Some(crate::tokenizer::Tokenizer::from_file(&tok_path)?)
    } else {
        None
    };
    let source = dir.display().to_string();
    match Model::new(config, weights, tokenizer, source, ModelFormat::Hf) {
        Ok(m) if scan.reasons.is_empty() => Ok(m),
        Ok(_) => Err(ModelError::Unsupported {
            reasons: scan.reasons,
        }),
        Err(ModelError::Unsupported { reasons }) => {
            let mut all = scan.reasons;
            all.extend(reasons);
            Err(ModelError::Unsupported { reasons: all })
        }
        Err(e) => Err(e),
    }
}

/// The opened weights of a checkpoint: every file, and which file holds each tensor.
struct Checkpoint {
    files: Vec<SafetensorsFile>,
    /// Tensor name → (index into `files`, index into that file's entries), sorted by name.
    by_name: BTreeMap<String, (usize, usize)>,
}

impl Checkpoint {
    /// Opens `dir/model.safetensors` if present, else the shards `dir/model.safetensors.index.json`
    /// lists, checking the index against the shards' contents.
    fn open(dir: &Path) -> Result<Checkpoint, ModelError> {
        let single = dir.join(WEIGHTS_FILE);
        if single.is_file() {
            let file = SafetensorsFile::open(&single)?;
            let by_name = file
                .entries()
                .iter()
                .enumerate()
                .map(|(i, e)| (e.name.clone(), (0, i)))
                .collect();
            return Ok(Checkpoint {
                files: vec![file],
                by_name,
            });
        }
        let index = dir.join(INDEX_FILE);
        if !index.is_file() {
            return Err(ModelError::Io {
                path: single,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no {WEIGHTS_FILE} and no {INDEX_FILE} in the directory"),
                ),
            });
        }
        Self::open_sharded(dir, &index)
    }

    fn open_sharded(dir: &Path, index: &Path) -> Result<Checkpoint, ModelError> {
        let weight_map = read_index(index)?;
        let index_err = |path: &Path, message: String| ModelError::Safetensors {
            path: path.to_path_buf(),
            message,
        };

        // Shards, in name order, each opened once; their headers' declared lengths first, which
        // together may not exceed the one-file limit (each shard under it, many of them over
        // it, would cost minutes and gigabytes before any other check).
        let shard_names: BTreeSet<&str> = weight_map.values().map(String::as_str).collect();
        let mut total = 0u64;
        for shard in &shard_names {
            let path = dir.join(shard);
            if let Some(n) = crate::safetensors::declared_header_len(&path) {
                total = total.saturating_add(n);
                if total > crate::safetensors::MAX_HEADER_BYTES {
                    return Err(index_err(
                        &path,
                        format!(
                            "the shards' headers declare {total} bytes so far, beyond the {}-byte \
                             budget of one checkpoint's headers; not a safetensors checkpoint?",
                            crate::safetensors::MAX_HEADER_BYTES
                        ),
                    ));
                }
            }
        }
        let mut files = Vec::with_capacity(shard_names.len());
        for shard in shard_names {
            let path = dir.join(shard);
            if !path.is_file() {
                let listed: Vec<&str> = weight_map
                    .iter()
                    .filter(|(_, s)| s.as_str() == shard)
                    .map(|(t, _)| t.as_str())
                    .collect();
                return Err(index_err(
                    &path,
                    format!(
                        "shard listed in {INDEX_FILE} (for {} tensor(s), e.g. '{}') does not exist",
                        listed.len(),
                        listed.first().copied().unwrap_or_default()
                    ),
                ));
            }
            files.push(SafetensorsFile::open(&path)?);
        }

        // Every tensor in exactly one shard, and that shard the one the index names.
        let mut by_name: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (f, file) in files.iter().enumerate() {
            for (i, e) in file.entries().iter().enumerate() {
                if let Some(&(g, _)) = by_name.get(&e.name) {
                    return Err(index_err(
                        file.path(),
                        format!(
                            "tensor '{}' is stored in two shards: {} and {}",
                            e.name,
                            file_name(files[g].path()),
                            file_name(file.path())
                        ),
                    ));
                }
                by_name.insert(e.name.clone(), (f, i));
            }
        }
        for (name, &(f, _)) in &by_name {
            let here = file_name(files[f].path());
            match weight_map.get(name) {
                None => {
                    return Err(index_err(
                        files[f].path(),
                        format!("tensor '{name}' is in this shard but not in {INDEX_FILE}"),
                    ));
                }
                Some(listed) if *listed != here => {
                    return Err(index_err(
                        files[f].path(),
                        format!(
                            "tensor '{name}' is in this shard but {INDEX_FILE} puts it in {listed}"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        for (name, shard) in &weight_map {
            if !by_name.contains_key(name) {
                let path = dir.join(shard);
                return Err(index_err(
                    &path,
                    format!(
                        "{INDEX_FILE} lists tensor '{name}' in this shard, but it is not there"
                    ),
                ));
            }
        }
        Ok(Checkpoint { files, by_name })
    }

    /// Every tensor name, sorted.
    fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// Every tensor with the file holding it, in name order.
    fn tensors(
        &self,
    ) -> impl Iterator<Item = (&SafetensorsFile, &crate::safetensors::TensorEntry)> {
        self.by_name.values().filter_map(|&(f, i)| {
            let file = self.files.get(f)?;
            Some((file, file.entries().get(i)?))
        })
    }
}

/// The last component of `p`, as text.
fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Reads the `weight_map` of a shard index: tensor name → shard file name (a plain file name in
/// the checkpoint directory; anything with a directory part is refused).
fn read_index(index: &Path) -> Result<BTreeMap<String, String>, ModelError> {
    let err = |message: String| ModelError::Safetensors {
        path: index.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(index).map_err(|source| ModelError::Io {
        path: index.to_path_buf(),
        source,
    })?;
    let doc = json::parse(&text).map_err(|e| err(format!("not valid JSON: {e}")))?;
    let root = doc
        .as_object()
        .ok_or_else(|| err(format!("expected a JSON object, found {}", doc.type_name())))?;
    let wm = root
        .get("weight_map")
        .ok_or_else(|| err("missing 'weight_map'".into()))?
        .as_object()
        .ok_or_else(|| err("'weight_map' is not an object".into()))?;
    if wm.is_empty() {
        return Err(err("'weight_map' is empty".into()));
    }
    let mut out = BTreeMap::new();
    for (tensor, shard) in wm.iter() {
        let Value::Str(shard) = shard else {
            return Err(err(format!(
                "weight_map['{tensor}'] is {}, expected a shard file name",
                shard.type_name()
            )));
        };
        let mut comps = Path::new(shard).components();
        let plain = matches!(
            (comps.next(), comps.next()),
            (Some(Component::Normal(_)), None)
        );
        if !plain {
            return Err(err(format!(
                "weight_map['{tensor}'] = '{shard}' is not a file name in the checkpoint directory"
            )));
        }
        out.insert(tensor.to_string(), shard.clone());
    }
    Ok(out)
}

/// What the name scan found: readable reasons, and the tensors they explain.
struct FeatureScan<'a> {
    reasons: Vec<String>,
    explained: BTreeSet<&'a str>,
}

/// A feature recognisable from tensor names that this crate cannot run.
struct Feature {
    what: &'static str,
    matches: fn(&str) -> bool,
}

fn is_moe(n: &str) -> bool {
    n.contains(".experts.")
        || n.contains("block_sparse_moe")
        || n.contains("shared_expert")
        || n.ends_with(".mlp.gate.weight")
        || n.contains(".mlp.router.")
}

fn is_mlp_bias(n: &str) -> bool {
    n.contains(".mlp.")
        && ["gate_proj.bias", "up_proj.bias", "down_proj.bias"]
            .iter()
            .any(|s| n.ends_with(s))
}

fn is_o_proj_bias(n: &str) -> bool {
    n.ends_with(".self_attn.o_proj.bias")
}

fn is_mla(n: &str) -> bool {
    [
        "q_a_proj",
        "q_b_proj",
        "kv_a_proj",
        "kv_b_proj",
        "q_a_layernorm",
        "kv_a_layernorm",
    ]
    .iter()
    .any(|p| n.contains(&format!(".{p}")))
}

fn is_qk_norm(n: &str) -> bool {
    n.ends_with(".self_attn.q_norm.weight") || n.ends_with(".self_attn.k_norm.weight")
}

fn is_qkv_bias(n: &str) -> bool {
    ["q_proj.bias", "k_proj.bias", "v_proj.bias"]
        .iter()
        .any(|s| n.ends_with(&format!(".self_attn.{s}")))
}

const FEATURES: [Feature; 5] = [
    Feature {
        what: "mixture of experts (expert / router tensors)",
        matches: is_moe,
    },
    Feature {
        what: "biases on the MLP projections",
        matches: is_mlp_bias,
    },
    Feature {
        what: "o_proj bias (attention output projection bias; not supported)",
        matches: is_o_proj_bias,
    },
    Feature {
        what: "multi-head latent attention (low-rank q/kv projections)",
        matches: is_mla,
    },
    Feature {
        what: "per-head q/k RMSNorm (q_norm/k_norm) in a model whose config is not Qwen3's",
        matches: is_qk_norm,
    },
];

/// Scans tensor names for unsupported features. q/k/v biases are a reason only when `config`
/// is known and does not enable `attention_bias` (they are Qwen2's, and supported); per-head
/// q/k norms only when it does not say `qk_norm` (they are Qwen3's).
fn scan_features<'a>(
    names: impl Iterator<Item = &'a str>,
    config: Option<&ModelConfig>,
) -> FeatureScan<'a> {
    let mut hits: Vec<Vec<&'a str>> = vec![Vec::new(); FEATURES.len() + 1];
    let unannounced_bias = config.is_some_and(|c| !c.attention_bias);
    let announced_qk_norm = config.is_some_and(|c| c.qk_norm);
    for n in names {
        if announced_qk_norm && is_qk_norm(n) {
            continue;
        }
        if let Some(k) = FEATURES.iter().position(|f| (f.matches)(n)) {
            hits[k].push(n);
        } else if unannounced_bias && is_qkv_bias(n) {
            hits[FEATURES.len()].push(n);
        }
    }
    let mut reasons = Vec::new();
    let mut explained = BTreeSet::new();
    for (k, found) in hits.into_iter().enumerate() {
        let Some(first) = found.first() else { continue };
        let what = FEATURES.get(k).map_or(
            "q/k/v projection biases, but config.json does not enable attention_bias \
             (set attention_bias: true, or use a Qwen2 config)",
            |f| f.what,
        );
        reasons.push(format!("{what}: {} tensor(s), e.g. '{first}'", found.len()));
        explained.extend(found);
    }
    FeatureScan { reasons, explained }
}
