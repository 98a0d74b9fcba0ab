//! HF importer tests: checkpoints written into temporary directories (single-file F32, BF16
//! and F16, sharded with an index, tied and untied heads, GQA and MQA, Qwen2 q/k/v biases)
//! must import bit-for-bit with their config; malformed files, inconsistent shard indexes and
//! unsupported features must be refused with a typed error naming the file or tensor (all
//! reasons at once). Also imports the transformers-made checkpoints under
//! `tests/reference/tiny-*` when they exist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use amk_core::sim::SplitMix;
use amk_core::{DType, Importer, Tensor, WeightStore};
use amk_model_llama::config::ModelConfig;
use amk_model_llama::hf::{HfImporter, import_hf};
use amk_model_llama::model::tensor_names;
use amk_model_llama::safetensors::SafetensorsFile;
use amk_model_llama::{ModelError, ModelFormat};

// ---------------------------------------------------------------------------------------------
// Fixtures.

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("amk-hf-import-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn join(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small config.json.
#[derive(Clone)]
struct Cfg {
    arch: &'static str,
    model_type: &'static str,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    inter: usize,
    vocab: usize,
    layers: usize,
    tie: bool,
    attention_bias: Option<bool>,
    extra: &'static str,
}

impl Cfg {
    fn llama() -> Cfg {
        Cfg {
            arch: "LlamaForCausalLM",
            model_type: "llama",
            hidden: 16,
            heads: 4,
            kv_heads: 2,
            inter: 24,
            vocab: 40,
            layers: 2,
            tie: false,
            attention_bias: None,
            extra: "",
        }
    }
    fn qwen2() -> Cfg {
        Cfg {
            arch: "Qwen2ForCausalLM",
            model_type: "qwen2",
            tie: true,
            extra: r#""use_sliding_window": false, "sliding_window": 32, "max_window_layers": 2,"#,
            ..Cfg::llama()
        }
    }
    fn json(&self) -> String {
        let bias = self
            .attention_bias
            .map_or(String::new(), |b| format!("\"attention_bias\": {b},"));
        format!(
            r#"{{
  "architectures": ["{}"],
  "model_type": "{}",
  "hidden_act": "silu",
  "hidden_size": {},
  "num_attention_heads": {},
  "num_key_value_heads": {},
  "intermediate_size": {},
  "vocab_size": {},
  "num_hidden_layers": {},
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "max_position_embeddings": 128,
  {bias}
  {}
  "tie_word_embeddings": {},
  "torch_dtype": "float32"
}}"#,
            self.arch,
            self.model_type,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.inter,
            self.vocab,
            self.layers,
            self.extra,
            self.tie
        )
    }
    fn config(&self) -> ModelConfig {
        ModelConfig::from_hf_json(&self.json()).unwrap()
    }
}

/// Random non-zero weights for every tensor `cfg` expects, in `dtype`.
fn weights(cfg: &ModelConfig, dtype: DType, seed: u64) -> WeightStore {
    let mut rng = SplitMix(seed);
    let mut s = WeightStore::new();
    for (name, shape) in tensor_names(cfg) {
        let mut t = Tensor::random(dtype, &shape, &mut rng, -1.0, 1.0);
        // Make every element non-zero so a zero-filled read cannot pass.
        let vals: Vec<f32> = t
            .to_f32_vec()
            .into_iter()
            .map(|v| if v == 0.0 { 0.5 } else { v })
            .collect();
        t = Tensor::from_f32(dtype, &shape, &vals).unwrap();
        s.insert(name, t);
    }
    s
}

/// Writes `config.json` and a single `model.safetensors`.
fn write_single(dir: &Path, cfg: &Cfg, w: &WeightStore) {
    std::fs::write(dir.join("config.json"), cfg.json()).unwrap();
    w.save_safetensors(&dir.join("model.safetensors")).unwrap();
}

/// Writes `config.json`, `n` shards (tensors dealt round-robin) and the index.
fn write_sharded(dir: &Path, cfg: &Cfg, w: &WeightStore, n: usize) -> Vec<String> {
    std::fs::write(dir.join("config.json"), cfg.json()).unwrap();
    let files: Vec<String> = (1..=n)
        .map(|i| format!("model-{i:05}-of-{n:05}.safetensors"))
        .collect();
    let mut shards = vec![WeightStore::new(); n];
    let mut map = Vec::new();
    for (k, name) in w.names().enumerate() {
        shards[k % n].insert_shared(name, w.get(name).unwrap().clone());
        map.push(format!("    \"{name}\": \"{}\"", files[k % n]));
    }
    for (s, f) in shards.iter().zip(&files) {
        s.save_safetensors(&dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        format!(
            "{{\n  \"metadata\": {{\"total_size\": 0}},\n  \"weight_map\": {{\n{}\n  }}\n}}\n",
            map.join(",\n")
        ),
    )
    .unwrap();
    files
}

/// Our own safetensors serialiser (independent of `WeightStore`'s), with an optional
/// `__metadata__` entry first, as the reference writer puts it.
fn st_bytes(tensors: &[(&str, &Tensor)], metadata: bool) -> Vec<u8> {
    let mut entries = Vec::new();
    if metadata {
        entries.push(r#""__metadata__":{"format":"pt"}"#.to_string());
    }
    let mut data = Vec::new();
    for (name, t) in tensors {
        let b = t.to_le_bytes();
        let dt = match t.dtype() {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            other => panic!("{other}"),
        };
        entries.push(format!(
            r#""{name}":{{"dtype":"{dt}","shape":{:?},"data_offsets":[{},{}]}}"#,
            t.shape(),
            data.len(),
            data.len() + b.len()
        ));
        data.extend_from_slice(&b);
    }
    raw_st(&format!("{{{}}}", entries.join(",")), &data)
}

/// A safetensors file from a header text and data bytes (no checks).
fn raw_st(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Every tensor of `w` is in `got` with the same dtype, shape and bytes.
fn assert_same(w: &WeightStore, got: &WeightStore) {
    for n in w.names() {
        let a = w.get(n).unwrap();
        let b = got
            .get(n)
            .unwrap_or_else(|| panic!("tensor '{n}' missing after import"));
        assert_eq!(a.dtype(), b.dtype(), "{n}");
        assert_eq!(a.shape(), b.shape(), "{n}");
        assert_eq!(a.to_le_bytes(), b.to_le_bytes(), "{n}");
    }
    assert_eq!(w.len(), got.len());
}

fn unsupported(r: Result<amk_model_llama::Model, ModelError>) -> Vec<String> {
    match r {
        Err(ModelError::Unsupported { reasons }) => reasons,
        Err(e) => panic!("expected Unsupported, got {e}"),
        Ok(_) => panic!("expected Unsupported, imported"),
    }
}

/// Expects a `Safetensors` error on `file` whose message contains every one of `needles`.
fn safetensors_err(r: Result<amk_model_llama::Model, ModelError>, file: &Path, needles: &[&str]) {
    match r {
        Err(ModelError::Safetensors { path, message }) => {
            assert_eq!(path, file, "{message}");
            for n in needles {
                assert!(message.contains(n), "'{n}' not in: {message}");
            }
        }
        Err(e) => panic!("expected Safetensors error, got {e:?}"),
        Ok(_) => panic!("expected Safetensors error, imported"),
    }
}

fn any_contains(reasons: &[String], needle: &str) -> bool {
    reasons.iter().any(|r| r.contains(needle))
}

// ---------------------------------------------------------------------------------------------
// Successful imports.

#[test]
fn single_file_each_dtype_imports_bit_for_bit() {
    for (k, dtype) in [DType::F32, DType::BF16, DType::F16]
        .into_iter()
        .enumerate()
    {
        let dir = TempDir::new(&format!("single-{dtype}"));
        let cfg = Cfg::llama();
        let w = weights(&cfg.config(), dtype, 10 + k as u64);
        write_single(dir.path(), &cfg, &w);
        let m = import_hf(dir.path()).unwrap();
        assert_same(&w, &m.weights);
        assert_eq!(m.format, ModelFormat::Hf);
        assert_eq!(m.source, dir.path().display().to_string());
        assert!(m.tokenizer.is_none());
        let c = &m.config;
        assert_eq!(
            (
                c.hidden,
                c.n_heads,
                c.n_kv_heads,
                c.head_dim,
                c.intermediate,
                c.vocab,
                c.n_layers
            ),
            (16, 4, 2, 4, 24, 40, 2)
        );
        assert_eq!(c.rms_eps, 1e-5);
        assert_eq!(c.rope_theta, 500000.0);
        assert_eq!(c.max_position_embeddings, 128);
        assert!(!c.tie_word_embeddings && !c.attention_bias);
        assert_eq!(*c, cfg.config());
    }
}

#[test]
fn metadata_entry_is_ignored_and_own_writer_round_trips() {
    let dir = TempDir::new("metadata");
    let cfg = Cfg::llama();
    let w = weights(&cfg.config(), DType::BF16, 3);
    std::fs::write(dir.join("config.json"), cfg.json()).unwrap();
    let list: Vec<(&str, &Tensor)> = w.names().map(|n| (n, &**w.get(n).unwrap())).collect();
    std::fs::write(dir.join("model.safetensors"), st_bytes(&list, true)).unwrap();
    let m = import_hf(dir.path()).unwrap();
    assert_same(&w, &m.weights);
}

#[test]
fn sharded_checkpoints_import_bit_for_bit() {
    for n in [2, 3] {
        let dir = TempDir::new(&format!("sharded-{n}"));
        let cfg = Cfg::llama();
        let w = weights(&cfg.config(), DType::BF16, 20 + n as u64);
        let files = write_sharded(dir.path(), &cfg, &w, n);
        assert_eq!(files.len(), n);
        assert!(!dir.join("model.safetensors").exists());
        let m = import_hf(dir.path()).unwrap();
        assert_same(&w, &m.weights);
        assert_eq!(m.config, cfg.config());
    }
}

#[test]
fn tied_and_untied_heads() {
    // Untied: lm_head is required and kept.
    let dir = TempDir::new("untied");
    let cfg = Cfg::llama();
    let w = weights(&cfg.config(), DType::F32, 30);
    assert!(w.get("lm_head.weight").is_some());
    write_single(dir.path(), &cfg, &w);
    let m = import_hf(dir.path()).unwrap();
    assert!(!m.config.tie_word_embeddings);
    assert_same(&w, &m.weights);

    // Tied: no lm_head in the checkpoint.
    let dir = TempDir::new("tied");
    let cfg = Cfg {
        tie: true,
        ..Cfg::llama()
    };
    let w = weights(&cfg.config(), DType::F32, 31);
    assert!(w.get("lm_head.weight").is_none());
    write_single(dir.path(), &cfg, &w);
    let m = import_hf(dir.path()).unwrap();
    assert!(m.config.tie_word_embeddings);
    assert_same(&w, &m.weights);

    // Tied, but the checkpoint also stores a copy of the embedding as lm_head: accepted, the
    // copy dropped.
    let dir = TempDir::new("tied-copy");
    let mut w2 = w.clone();
    w2.insert_shared(
        "lm_head.weight",
        w.get("model.embed_tokens.weight").unwrap().clone(),
    );
    write_single(dir.path(), &cfg, &w2);
    let m = import_hf(dir.path()).unwrap();
    assert_same(&w, &m.weights);

    // Tied, but with a different lm_head: refused.
    let dir = TempDir::new("tied-different");
    let mut rng = SplitMix(99);
    let mut w3 = w.clone();
    w3.insert(
        "lm_head.weight",
        Tensor::random(DType::F32, &[40, 16], &mut rng, -1.0, 1.0),
    );
    write_single(dir.path(), &cfg, &w3);
    let reasons = unsupported(import_hf(dir.path()));
    assert!(any_contains(&reasons, "lm_head"), "{reasons:?}");
}

#[test]
fn gqa_and_mqa() {
    for (kv, tag) in [(2, "gqa"), (1, "mqa"), (4, "mha")] {
        let dir = TempDir::new(tag);
        let cfg = Cfg {
            heads: 4,
            kv_heads: kv,
            ..Cfg::llama()
        };
        let w = weights(&cfg.config(), DType::BF16, 40 + kv as u64);
        assert_eq!(
            w.get("model.layers.0.self_attn.k_proj.weight")
                .unwrap()
                .shape(),
            &[kv as u64 * 4, 16]
        );
        write_single(dir.path(), &cfg, &w);
        let m = import_hf(dir.path()).unwrap();
        assert_eq!(m.config.n_kv_heads, kv);
        assert_eq!(m.config.n_heads, 4);
        assert_same(&w, &m.weights);
    }
}

#[test]
fn qwen2_qkv_biases_import() {
    let dir = TempDir::new("qwen2");
    let cfg = Cfg::qwen2();
    let c = cfg.config();
    assert!(c.attention_bias, "qwen2 implies q/k/v biases");
    let w = weights(&c, DType::BF16, 50);
    let b = w.get("model.layers.1.self_attn.k_proj.bias").unwrap();
    assert_eq!(b.shape(), &[8]);
    write_sharded(dir.path(), &cfg, &w, 2);
    let m = import_hf(dir.path()).unwrap();
    assert!(m.config.attention_bias);
    assert_same(&w, &m.weights);

    // A Llama config that enables attention_bias explicitly also accepts them.
    let dir = TempDir::new("llama-bias");
    let cfg = Cfg {
        attention_bias: Some(true),
        ..Cfg::llama()
    };
    let w = weights(&cfg.config(), DType::F16, 51);
    write_single(dir.path(), &cfg, &w);
    let m = import_hf(dir.path()).unwrap();
    assert_same(&w, &m.weights);
}

#[test]
fn qkv_biases_the_config_does_not_announce_are_refused() {
    let dir = TempDir::new("unannounced-bias");
    let cfg = Cfg::llama();
    let biased = Cfg {
        attention_bias: Some(true),
        ..Cfg::llama()
    };
    let w = weights(&biased.config(), DType::F32, 60);
    write_single(dir.path(), &cfg, &w);
    let reasons = unsupported(import_hf(dir.path()));
    assert!(
        any_contains(&reasons, "q/k/v projection biases")
            && any_contains(&reasons, "attention_bias"),
        "{reasons:?}"
    );
    assert!(
        any_contains(
            &reasons,
            "6 tensor(s), e.g. 'model.layers.0.self_attn.k_proj.bias'"
        ),
        "{reasons:?}"
    );
    // One reason for all six bias tensors, not six "unexpected tensor" lines.
    assert_eq!(reasons.len(), 1, "{reasons:?}");

    // And a Qwen2 config (biases expected) whose checkpoint lacks them: missing tensors.
    let dir = TempDir::new("qwen2-no-bias");
    let cfg = Cfg::qwen2();
    let unbiased = Cfg {
        attention_bias: Some(false),
        ..Cfg::qwen2()
    };
    write_single(
        dir.path(),
        &cfg,
        &weights(&unbiased.config(), DType::F32, 61),
    );
    let reasons = unsupported(import_hf(dir.path()));
    assert!(
        any_contains(
            &reasons,
            "missing tensor 'model.layers.0.self_attn.v_proj.bias'"
        ),
        "{reasons:?}"
    );
}

#[test]
fn rotary_inv_freq_is_dropped() {
    let dir = TempDir::new("inv-freq");
    let cfg = Cfg::llama();
    let w = weights(&cfg.config(), DType::F32, 70);
    let mut w2 = w.clone();
    w2.insert(
        "model.layers.0.self_attn.rotary_emb.inv_freq",
        Tensor::from_f32(DType::F32, &[2], &[1.0, 0.01]).unwrap(),
    );
    write_single(dir.path(), &cfg, &w2);
    let m = import_hf(dir.path()).unwrap();
    assert_same(&w, &m.weights);
}

#[test]
fn importer_trait_and_probe() {
    let imp = HfImporter;
    assert_eq!(imp.name(), "hf");
    let dir = TempDir::new("probe");
    assert!(!imp.probe(dir.path()), "empty directory");
    let cfg = Cfg::llama();
    std::fs::write(dir.join("config.json"), cfg.json()).unwrap();
    assert!(!imp.probe(dir.path()), "config only");
    let w = weights(&cfg.config(), DType::F32, 80);
    w.save_safetensors(&dir.join("model.safetensors")).unwrap();
    assert!(imp.probe(dir.path()));
    assert!(!imp.probe(&dir.join("model.safetensors")), "a file");
    assert!(!imp.probe(&dir.join("nope")), "nothing there");
    let m = imp.import(dir.path()).unwrap();
    assert_same(&w, &m.weights);

    let dir = TempDir::new("probe-sharded");
    write_sharded(dir.path(), &cfg, &w, 2);
    assert!(imp.probe(dir.path()));
    assert_same(&w, &imp.import(dir.path()).unwrap().weights);
}

#[test]
fn reader_exposes_entries_without_copying() {
    let dir = TempDir::new("reader");
    let mut rng = SplitMix(5);
    let a = Tensor::random(DType::BF16, &[3, 5], &mut rng, -1.0, 1.0);
    let b = Tensor::random(DType::F16, &[], &mut rng, -1.0, 1.0);
    let c = Tensor::zeros(DType::F32, &[0, 4]);
    let p = dir.join("x.safetensors");
    std::fs::write(&p, st_bytes(&[("a", &a), ("b", &b), ("c", &c)], true)).unwrap();
    let f = SafetensorsFile::open(&p).unwrap();
    let names: Vec<&str> = f.entries().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(f.path(), p);
    for (n, t) in [("a", &a), ("b", &b), ("c", &c)] {
        let e = f.entry(n).unwrap();
        assert_eq!(e.dtype, t.dtype());
        assert_eq!(&f.tensor(e).unwrap(), t);
    }
}

// ---------------------------------------------------------------------------------------------
// Malformed files.

/// A valid single-file checkpoint; returns the safetensors bytes.
fn valid_dir(dir: &Path, seed: u64) -> Vec<u8> {
    let cfg = Cfg::llama();
    let w = weights(&cfg.config(), DType::F32, seed);
    std::fs::write(dir.join("config.json"), cfg.json()).unwrap();
    w.to_safetensors_bytes()
}

#[test]
fn truncated_files_are_refused_at_every_cut() {
    let dir = TempDir::new("truncated");
    let bytes = valid_dir(dir.path(), 90);
    let st = dir.join("model.safetensors");
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let cuts = [
        0,
        1,
        7,
        8,
        9,
        header_end / 2,
        header_end - 1,
        header_end,
        header_end + 1,
        header_end + 100,
        (header_end + bytes.len()) / 2,
        bytes.len() - 1,
    ];
    for cut in cuts {
        std::fs::write(&st, &bytes[..cut]).unwrap();
        let r = import_hf(dir.path());
        let msg = match &r {
            Err(e @ ModelError::Safetensors { path, .. }) => {
                assert_eq!(path, &st);
                e.to_string()
            }
            other => panic!("cut {cut}: expected Safetensors error, got {other:?}"),
        };
        assert!(msg.contains("model.safetensors"), "cut {cut}: {msg}");
        if cut < 8 {
            assert!(msg.contains("shorter than the 8-byte header"), "{msg}");
        } else if cut < header_end {
            assert!(msg.contains("runs past the end of the file"), "{msg}");
        } else {
            // Inside the data: the tensor whose bytes are cut is named.
            assert!(msg.contains("tensor '"), "cut {cut}: {msg}");
            assert!(msg.contains("truncated"), "cut {cut}: {msg}");
        }
    }
    // And the intact file imports.
    std::fs::write(&st, &bytes).unwrap();
    import_hf(dir.path()).unwrap();
}

#[test]
fn header_length_beyond_the_file() {
    let dir = TempDir::new("header-len");
    let mut bytes = valid_dir(dir.path(), 91);
    let st = dir.join("model.safetensors");
    for n in [bytes.len() as u64, u64::MAX, u64::MAX - 7] {
        bytes[..8].copy_from_slice(&n.to_le_bytes());
        std::fs::write(&st, &bytes).unwrap();
        safetensors_err(
            import_hf(dir.path()),
            &st,
            &[&format!("header length {n}"), "runs past the end"],
        );
    }
}

#[test]
fn invalid_header_json() {
    let dir = TempDir::new("bad-json");
    valid_dir(dir.path(), 92);
    let st = dir.join("model.safetensors");
    for (header, needle) in [
        (
            r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]"#,
            "not valid JSON",
        ),
        (r#"{"a": 1, "a": 2}"#, "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (r#"{"a": [1]}"#, "tensor 'a': entry is an array"),
        (
            r#"{"a": {"shape": [1], "data_offsets": [0, 4]}}"#,
            "tensor 'a': missing dtype",
        ),
        (
            r#"{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}"#,
            "tensor 'a': shape",
        ),
        (
            r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}"#,
            "tensor 'a': data_offsets",
        ),
        (
            r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}"#,
            "tensor 'a'",
        ),
    ] {
        std::fs::write(&st, raw_st(header, &[1, 2, 3, 4])).unwrap();
        safetensors_err(import_hf(dir.path()), &st, &[needle]);
    }
    let mut bad = raw_st("{\"a\": 1}", &[]);
    bad[9] = 0xFF;
    std::fs::write(&st, bad).unwrap();
    safetensors_err(import_hf(dir.path()), &st, &["not UTF-8"]);
}

#[test]
fn overlapping_out_of_range_and_holey_offsets() {
    let dir = TempDir::new("offsets");
    valid_dir(dir.path(), 93);
    let st = dir.join("model.safetensors");
    let e = |name: &str, b: usize, e: usize| {
        format!(r#""{name}": {{"dtype": "F32", "shape": [4], "data_offsets": [{b}, {e}]}}"#)
    };
    let cases: Vec<(String, usize, Vec<&str>)> = vec![
        (format!("{{{}, {}}}", e("x", 0, 16), e("y", 8, 24)), 24, vec!["tensor 'y'", "overlap", "'x'"]),
        (format!("{{{}, {}}}", e("x", 0, 16), e("y", 0, 16)), 16, vec!["overlap"]),
        (format!("{{{}}}", e("x", 0, 16)), 8, vec!["tensor 'x'", "run past the end"]),
        (format!("{{{}}}", e("x", 100, 116)), 16, vec!["tensor 'x'", "run past the end"]),
        (format!("{{{}}}", e("x", 0, 12)), 12, vec!["tensor 'x'", "12 bytes", "needs 16"]),
        (format!("{{{}}}", e("x", 0, 20)), 20, vec!["tensor 'x'", "20 bytes", "needs 16"]),
        (format!("{{{}, {}}}", e("x", 0, 16), e("y", 20, 36)), 36, vec!["tensor 'y'", "hole"]),
        (format!("{{{}}}", e("x", 0, 16)), 20, vec!["data section is 20 bytes", "only 16"]),
        (
            r#"{"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}}"#.to_string(),
            16,
            vec!["tensor 'x'", "needs more than 2^64"],
        ),
    ];
    for (header, data_len, needles) in cases {
        let data: Vec<u8> = (0..data_len).map(|i| i as u8 + 1).collect();
        std::fs::write(&st, raw_st(&header, &data)).unwrap();
        safetensors_err(import_hf(dir.path()), &st, &needles);
    }
}

#[test]
fn unknown_dtypes_are_named() {
    let dir = TempDir::new("dtype");
    valid_dir(dir.path(), 94);
    let st = dir.join("model.safetensors");
    for dt in ["F64", "I32", "F8_E4M3", "Q4_K", "f32"] {
        let header = format!(
            r#"{{"__metadata__": {{"format": "pt"}}, "model.embed_tokens.weight": {{"dtype": "{dt}", "shape": [2], "data_offsets": [0, 8]}}}}"#
        );
        std::fs::write(&st, raw_st(&header, &[7; 8])).unwrap();
        safetensors_err(
            import_hf(dir.path()),
            &st,
            &[
                "tensor 'model.embed_tokens.weight'",
                &format!("dtype {dt}"),
                "F32, F16, BF16",
            ],
        );
    }
}

#[test]
fn missing_tensor_and_wrong_shape() {
    let dir = TempDir::new("missing");
    let cfg = Cfg::llama();
    let mut w = weights(&cfg.config(), DType::BF16, 95);
    w.remove("model.layers.1.mlp.up_proj.weight");
    let mut rng = SplitMix(1);
    w.insert(
        "model.layers.0.self_attn.k_proj.weight",
        Tensor::random(DType::BF16, &[16, 16], &mut rng, -1.0, 1.0),
    );
    write_single(dir.path(), &cfg, &w);
    let reasons = unsupported(import_hf(dir.path()));
    assert!(
        any_contains(
            &reasons,
            "missing tensor 'model.layers.1.mlp.up_proj.weight'"
        ),
        "{reasons:?}"
    );
    assert!(
        any_contains(
            &reasons,
            "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 16], expected [8, 16]"
        ),
        "{reasons:?}"
    );
    assert_eq!(reasons.len(), 2, "{reasons:?}");
}

#[test]
fn no_weights_at_all() {
    let dir = TempDir::new("no-weights");
    std::fs::write(dir.join("config.json"), Cfg::llama().json()).unwrap();
    match import_hf(dir.path()) {
        Err(ModelError::Io { path, .. }) => assert_eq!(path, dir.join("model.safetensors")),
        other => panic!("{other:?}"),
    }
    let dir = TempDir::new("no-config");
    match import_hf(dir.path()) {
        Err(ModelError::Io { path, .. }) => assert_eq!(path, dir.join("config.json")),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Shard index problems.

#[test]
fn shard_listed_but_missing() {
    let dir = TempDir::new("shard-missing");
    let cfg = Cfg::llama();
    let files = write_sharded(
        dir.path(),
        &cfg,
        &weights(&cfg.config(), DType::F32, 100),
        3,
    );
    std::fs::remove_file(dir.join(&files[1])).unwrap();
    safetensors_err(
        import_hf(dir.path()),
        &dir.join(&files[1]),
        &["does not exist"],
    );
}

/// Shards whose headers each stay under the one-file limit but together declare more are
/// refused from their first 8 bytes (each would otherwise be parsed: minutes, gigabytes).
#[test]
fn shards_whose_headers_together_exceed_the_budget_are_refused_at_once() {
    let dir = TempDir::new("shard-budget");
    let cfg = Cfg::llama();
    let files = write_sharded(
        dir.path(),
        &cfg,
        &weights(&cfg.config(), DType::F32, 102),
        3,
    );
    // Each shard declares a 60 MB header (sparse files: nothing is written).
    for f in &files {
        let path = dir.join(f);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(60_000_016).unwrap();
        use std::io::Write;
        (&file).write_all(&60_000_000u64.to_le_bytes()).unwrap();
    }
    let t0 = std::time::Instant::now();
    safetensors_err(import_hf(dir.path()), &dir.join(&files[1]), &["budget"]);
    assert!(t0.elapsed().as_secs() < 10);
}

#[test]
fn tensor_in_two_shards() {
    let dir = TempDir::new("two-shards");
    let cfg = Cfg::llama();
    let w = weights(&cfg.config(), DType::F32, 101);
    let files = write_sharded(dir.path(), &cfg, &w, 2);
    // Add shard 0's first tensor to shard 1 as well.
    let s0 = WeightStore::load_safetensors(&dir.join(&files[0])).unwrap();
    let mut s1 = WeightStore::load_safetensors(&dir.join(&files[1])).unwrap();
    let dup = s0.names().next().unwrap().to_string();
    s1.insert_shared(dup.clone(), s0.get(&dup).unwrap().clone());
    s1.save_safetensors(&dir.join(&files[1])).unwrap();
    safetensors_err(
        import_hf(dir.path()),
        &dir.join(&files[1]),
        &[
            &format!("tensor '{dup}'"),
            "two shards",
            &files[0],
            &files[1],
        ],
    );
}

#[test]
fn tensor_in_index_but_not_in_its_shard() {
    let dir = TempDir::new("absent-from-shard");
    let cfg = Cfg::llama();
    let w = weights(&cfg.config(), DType::F32, 102);
    let files = write_sharded(dir.path(), &cfg, &w, 2);
    let mut s1 = WeightStore::load_safetensors(&dir.join(&files[1])).unwrap();
    let gone = s1.names().next().unwrap().to_string();
    s1.remove(&gone);
    s1.save_safetensors(&dir.join(&files[1])).unwrap();
    safetensors_err(
        import_hf(dir.path()),
        &dir.join(&files[1]),
        &[&format!("tensor '{gone}'"), "not there"],
    );
}

#[test]
fn tensor_in_a_shard_the_index_does_not_name() {
    let dir = TempDir::new("unindexed");
    let cfg = Cfg::llama();
    let w = weights(&cfg.config(), DType::F32, 103);
    let files = write_sharded(dir.path(), &cfg, &w, 2);
    // Move a tensor from shard 0 to shard 1 without updating the index.
    let mut s0 = WeightStore::load_safetensors(&dir.join(&files[0])).unwrap();
    let mut s1 = WeightStore::load_safetensors(&dir.join(&files[1])).unwrap();
    let moved = s0.names().next().unwrap().to_string();
    s1.insert_shared(moved.clone(), s0.remove(&moved).unwrap());
    s0.save_safetensors(&dir.join(&files[0])).unwrap();
    s1.save_safetensors(&dir.join(&files[1])).unwrap();
    safetensors_err(
        import_hf(dir.path()),
        &dir.join(&files[1]),
        &[
            &format!("tensor '{moved}'"),
            &format!("puts it in {}", files[0]),
        ],
    );
    // A tensor in a shard that the index does not mention at all.
    let dir = TempDir::new("unindexed-extra");
    let files = write_sharded(dir.path(), &cfg, &w, 2);
    let mut s1 = WeightStore::load_safetensors(&dir.join(&files[1])).unwrap();
    s1.insert(
        "stray.weight",
        Tensor::from_f32(DType::F32, &[1], &[1.0]).unwrap(),
    );
    s1.save_safetensors(&dir.join(&files[1])).unwrap();
    safetensors_err(
        import_hf(dir.path()),
        &dir.join(&files[1]),
        &[
            "tensor 'stray.weight'",
            "not in model.safetensors.index.json",
        ],
    );
}

#[test]
fn malformed_index() {
    let dir = TempDir::new("bad-index");
    let cfg = Cfg::llama();
    write_sharded(
        dir.path(),
        &cfg,
        &weights(&cfg.config(), DType::F32, 104),
        2,
    );
    let idx = dir.join("model.safetensors.index.json");
    for (text, needle) in [
        ("{\"weight_map\": {", "not valid JSON"),
        ("{\"metadata\": {}}", "missing 'weight_map'"),
        ("{\"weight_map\": []}", "not an object"),
        ("{\"weight_map\": {}}", "empty"),
        ("{\"weight_map\": {\"a\": 3}}", "weight_map['a']"),
        (
            "{\"weight_map\": {\"a\": \"../model.safetensors\"}}",
            "not a file name",
        ),
        (
            "{\"weight_map\": {\"a\": \"/etc/passwd\"}}",
            "not a file name",
        ),
        (
            "{\"weight_map\": {\"a\": \"sub/x.safetensors\"}}",
            "not a file name",
        ),
    ] {
        std::fs::write(&idx, text).unwrap();
        safetensors_err(import_hf(dir.path()), &idx, &[needle]);
    }
}

#[test]
fn a_malformed_shard_is_named() {
    let dir = TempDir::new("bad-shard");
    let cfg = Cfg::llama();
    let files = write_sharded(
        dir.path(),
        &cfg,
        &weights(&cfg.config(), DType::F32, 105),
        3,
    );
    let p = dir.join(&files[2]);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
    safetensors_err(import_hf(dir.path()), &p, &["truncated"]);
}

// ---------------------------------------------------------------------------------------------
// Unsupported features: every reason at once.

#[test]
fn unexplained_tensors_are_refused_with_every_reason() {
    let dir = TempDir::new("features");
    let cfg = Cfg::llama();
    let mut w = weights(&cfg.config(), DType::F32, 110);
    let t = |shape: &[u64]| {
        let n = shape.iter().product::<u64>() as usize;
        Tensor::from_f32(DType::F32, shape, &vec![0.25; n]).unwrap()
    };
    w.insert("model.layers.0.self_attn.o_proj.bias", t(&[16]));
    w.insert("model.layers.1.self_attn.o_proj.bias", t(&[16]));
    w.insert("model.layers.0.mlp.up_proj.bias", t(&[24]));
    w.insert("model.layers.1.mlp.down_proj.bias", t(&[16]));
    w.insert("model.layers.0.mlp.experts.0.w1.weight", t(&[24, 16]));
    w.insert("model.layers.1.block_sparse_moe.gate.weight", t(&[4, 16]));
    w.insert(
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        t(&[8, 16]),
    );
    w.insert("model.layers.0.self_attn.q_norm.weight", t(&[4]));
    w.insert("model.layers.0.mystery.weight", t(&[3]));
    write_sharded(dir.path(), &cfg, &w, 2);
    let reasons = unsupported(import_hf(dir.path()));
    let want = [
        "mixture of experts",
        "2 tensor(s), e.g. 'model.layers.0.mlp.experts.0.w1.weight'",
        "biases on the MLP projections: 2 tensor(s)",
        "o_proj bias",
        "model.layers.0.self_attn.o_proj.bias",
        "multi-head latent attention",
        "q_norm/k_norm",
        "unexpected tensor 'model.layers.0.mystery.weight'",
    ];
    for n in want {
        assert!(any_contains(&reasons, n), "'{n}' not in {reasons:#?}");
    }
    // Five features plus the one unexplained tensor; explained tensors are not repeated.
    assert_eq!(reasons.len(), 6, "{reasons:#?}");
}

#[test]
fn each_feature_alone_is_refused() {
    let cfg = Cfg::llama();
    let base = weights(&cfg.config(), DType::BF16, 111);
    for (name, shape, needle) in [
        (
            "model.layers.1.self_attn.o_proj.bias",
            vec![16u64],
            "o_proj bias",
        ),
        ("model.layers.0.mlp.gate_proj.bias", vec![24], "MLP"),
        (
            "model.layers.0.mlp.experts.3.down_proj.weight",
            vec![16, 24],
            "mixture of experts",
        ),
        (
            "model.layers.0.self_attn.q_a_proj.weight",
            vec![8, 16],
            "latent attention",
        ),
    ] {
        let dir = TempDir::new(&format!("feature-{needle}").replace(' ', "-"));
        let mut w = base.clone();
        let mut rng = SplitMix(2);
        w.insert(
            name,
            Tensor::random(DType::BF16, &shape, &mut rng, -1.0, 1.0),
        );
        write_single(dir.path(), &cfg, &w);
        let reasons = unsupported(import_hf(dir.path()));
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(
            reasons[0].contains(needle) && reasons[0].contains(name),
            "{reasons:?}"
        );
    }
}

#[test]
fn unsupported_architecture_config_lists_config_and_tensor_reasons() {
    let dir = TempDir::new("mixtral");
    let cfg = Cfg {
        arch: "MixtralForCausalLM",
        model_type: "mixtral",
        extra: r#""num_local_experts": 4, "num_experts_per_tok": 2,"#,
        ..Cfg::llama()
    };
    let mut w = weights(&Cfg::llama().config(), DType::BF16, 120);
    let mut rng = SplitMix(3);
    for l in 0..2 {
        for what in ["gate_proj", "up_proj", "down_proj"] {
            w.remove(&format!("model.layers.{l}.mlp.{what}.weight"));
        }
        for e in 0..4 {
            for k in ["w1", "w2", "w3"] {
                w.insert(
                    format!("model.layers.{l}.block_sparse_moe.experts.{e}.{k}.weight"),
                    Tensor::random(DType::BF16, &[4, 4], &mut rng, -1.0, 1.0),
                );
            }
        }
        w.insert(
            format!("model.layers.{l}.block_sparse_moe.gate.weight"),
            Tensor::random(DType::BF16, &[4, 16], &mut rng, -1.0, 1.0),
        );
    }
    write_single(dir.path(), &cfg, &w);
    let reasons = unsupported(import_hf(dir.path()));
    for n in [
        "architecture 'MixtralForCausalLM'",
        "model_type 'mixtral'",
        "num_local_experts = 4",
        "(expert / router tensors): 26 tensor(s)",
    ] {
        assert!(any_contains(&reasons, n), "'{n}' not in {reasons:#?}");
    }

    // The same config without any weights: still refused for the config's reasons.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let reasons = unsupported(import_hf(dir.path()));
    assert!(
        any_contains(&reasons, "architecture 'MixtralForCausalLM'"),
        "{reasons:?}"
    );
    assert!(
        any_contains(&reasons, "weights could not be examined"),
        "{reasons:?}"
    );

    // Not a config at all.
    std::fs::write(dir.join("config.json"), "{\"hidden_size\": ").unwrap();
    assert!(matches!(
        import_hf(dir.path()),
        Err(ModelError::ConfigJson(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Checkpoints written by transformers (generated separately; skipped when absent).

#[test]
fn reference_tiny_checkpoints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference");
    let mut seen = 0;
    for name in ["tiny-gqa", "tiny-mqa", "tiny-qwen2"] {
        let dir = root.join(name);
        if !dir.is_dir() {
            println!(
                "NOTE: {} absent; skipping that reference import",
                dir.display()
            );
            continue;
        }
        seen += 1;
        assert!(HfImporter.probe(&dir), "{name}");
        let m = import_hf(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        assert_eq!(
            m.config,
            ModelConfig::from_hf_json(&text).unwrap(),
            "{name}"
        );
        let doc = amk_core::json::parse(&text).unwrap();
        let root = doc.as_object().unwrap();
        let int = |k: &str| root.get(k).and_then(|v| v.as_i64()).map(|v| v as usize);
        assert_eq!(Some(m.config.hidden), int("hidden_size"), "{name}");
        assert_eq!(Some(m.config.n_layers), int("num_hidden_layers"), "{name}");
        assert_eq!(Some(m.config.vocab), int("vocab_size"), "{name}");
        assert_eq!(Some(m.config.n_heads), int("num_attention_heads"), "{name}");
        match name {
            "tiny-gqa" => assert!(
                m.config.n_kv_heads > 1 && m.config.n_kv_heads < m.config.n_heads,
                "{name}: {:?}",
                m.config
            ),
            "tiny-mqa" => assert_eq!(m.config.n_kv_heads, 1, "{name}"),
            _ => {
                assert!(m.config.attention_bias, "{name}");
                assert!(
                    m.weights
                        .get("model.layers.0.self_attn.q_proj.bias")
                        .is_some(),
                    "{name}"
                );
            }
        }
        assert_eq!(m.weights.len(), tensor_names(&m.config).len(), "{name}");
        // Bit-for-bit against core's independent (read-the-whole-file) safetensors reader.
        let st = dir.join("model.safetensors");
        if st.is_file() {
            let whole = WeightStore::load_safetensors(&st).unwrap();
            for n in m.weights.names() {
                let (a, b) = (m.weights.get(n).unwrap(), whole.get(n).unwrap());
                assert_eq!(a.dtype(), b.dtype(), "{name}: {n}");
                assert_eq!(a.shape(), b.shape(), "{name}: {n}");
                assert_eq!(a.to_le_bytes(), b.to_le_bytes(), "{name}: {n}");
            }
        }
        println!("imported {name}: {} parameters", m.n_params());
    }
    if seen == 0 {
        println!("NOTE: no tests/reference/tiny-* checkpoints present; reference import skipped");
    }
}

/// Weights holding NaN or infinity are refused at load, each tensor named with its first such
/// element and their count (they used to run and yield token 0 over and over).
#[test]
fn non_finite_weights_are_refused_at_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/tiny-gqa");
    let m = import_hf(&dir).unwrap();
    let mut weights = WeightStore::new();
    for name in m.weights.names() {
        let mut t = (**m.weights.get(name).unwrap()).clone();
        if name == "model.layers.1.mlp.up_proj.weight" {
            t.set_f32(7, f32::NAN);
            t.set_f32(9, f32::INFINITY);
        }
        weights.insert(name, t);
    }
    let e = amk_model_llama::Model::new(m.config.clone(), weights, None, "nan", ModelFormat::Hf)
        .unwrap_err();
    let ModelError::NonFinite { tensors } = &e else {
        panic!("{e}");
    };
    assert_eq!(tensors.len(), 1, "{e}");
    assert!(
        tensors[0].contains("up_proj")
            && tensors[0].contains("element 7")
            && tensors[0].contains("2 such"),
        "{e}"
    );
}
