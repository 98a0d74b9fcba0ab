//! The fuzz targets: each takes arbitrary bytes, drives one reader of hostile input the way
//! the CLI does, and must return — never panic, abort, hang or allocate without bound. An
//! error is a fine outcome; only a crash, a time-out or a memory blow-up is a finding.
//!
//! libFuzzer runs them through `tests/fuzz-targets/fuzz` (nightly, `cargo fuzz`); the smoke
//! test in `tests/smoke.rs` runs them on stable over the seed corpus and its mutants, in CI.
//! `docs/fuzzing.md` has both commands and the long runs' numbers.

use amk_core::Registry;
use std::sync::OnceLock;

pub mod mutate;

/// One target: a name (the cargo-fuzz binary's) and the function.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The target's name.
    pub name: &'static str,
    /// Feeds it one input.
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: [Target; 6] = [
    Target {
        name: "program",
        run: program,
    },
    Target {
        name: "gguf",
        run: gguf,
    },
    Target {
        name: "safetensors",
        run: safetensors,
    },
    Target {
        name: "hf_config",
        run: hf_config,
    },
    Target {
        name: "tokenizer",
        run: tokenizer,
    },
    Target {
        name: "plugin",
        run: plugin,
    },
];

/// The built-in registry, built once per process.
fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| amk_ops::registry().unwrap_or_else(|_| Registry::empty()))
}

/// A program file (JSON, or gzip JSON) through the loader, then the validator.
pub fn program(data: &[u8]) {
    if let Ok(p) = amk_core::codec::from_json_bytes(data, registry()) {
        let _ = amk_core::validate(&p, registry());
    }
}

/// A GGUF file: the container, then what `amk generate` reads from it — the model's
/// configuration, its weights and its tokenizer.
pub fn gguf(data: &[u8]) {
    let Ok(g) = amk_model_llama::GgufFile::parse(data.to_vec()) else {
        return;
    };
    let _ = amk_model_llama::config::ModelConfig::from_gguf(&g);
    let _ = amk_model_llama::gguf_import::import_gguf_file(&g, "fuzz");
    if let Ok(t) = amk_model_llama::tokenizer::Tokenizer::from_gguf(&g) {
        let _ = t.encode("Hello, world! 123");
    }
}

/// A safetensors file through both readers: the model importer's header check and the
/// weight store `amk run --weights` builds.
pub fn safetensors(data: &[u8]) {
    let _ = amk_model_llama::safetensors::parse_header(data);
    let _ = amk_core::WeightStore::from_safetensors_bytes(data);
}

/// An HF `config.json` (as text, invalid UTF-8 replaced).
pub fn hf_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = amk_model_llama::config::ModelConfig::from_hf_json(&text);
}

/// A tokenizer directory's files: `tokenizer.json`, then after a NUL byte (when there is one)
/// the `tokenizer_config.json` beside it; a tokenizer that loads encodes and decodes a line.
pub fn tokenizer(data: &[u8]) {
    let (json, config) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(String::from_utf8_lossy(&data[i + 1..]))),
        None => (data, None),
    };
    let Ok(t) = amk_model_llama::tokenizer::Tokenizer::from_json_parts(
        json,
        config.as_deref(),
        None,
        "fuzz",
    ) else {
        return;
    };
    if let Ok(ids) = t.encode("Hello, world! 123") {
        let _ = t.decode(&ids);
    }
}

/// A plugin descriptor built from the bytes (versions, sizes, names, codes, arities, params;
/// the pointers always valid, as a loaded library's would be) through the host's checks and
/// registration, into a fresh registry.
pub fn plugin(data: &[u8]) {
    let d = plugin_parts::Descriptor::from_bytes(data);
    let mut reg = Registry::empty();
    let desc = d.raw();
    #[allow(unsafe_code)]
    // SAFETY: `desc` and every pointer in it point into `d` (or are null with a zero length),
    // which outlives `reg`, the only thing the registration can keep them in.
    let _ = unsafe {
        amk_plugin_abi::register_descriptor(&mut reg, std::path::Path::new("fuzz.so"), &desc, None)
    };
}

mod plugin_parts;

/// The seed corpus of target `name`: files of the repository (test fixtures and reference
/// checkpoints, and the inputs that once crashed it), read from the source tree, and built
/// inputs where no file fits (the plugin descriptor's bytes). Unknown names have none.
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let files: &[&str] = match name {
        "program" => &[
            "tests/fixtures/toy_decode_2l.json",
            "tests/fixtures/reference_layout.json",
            "docs/examples/toy-llama-2l.json",
        ],
        "gguf" => &[
            "tests/reference/spm_tiny.gguf",
            "tests/reference/gguf/tiny-qwen3.gguf",
            "tests/reference/gguf/tiny-llama3.gguf",
        ],
        "safetensors" => &["tests/reference/tiny-mqa/model.safetensors"],
        "hf_config" => &[
            "tests/reference/tiny-gqa/config.json",
            "tests/reference/tiny-qwen2/config.json",
            "tests/reference/tiny-qwen3/config.json",
            "tests/reference/tiny-llama3/config.json",
        ],
        _ => &[],
    };
    let mut out: Vec<Vec<u8>> = files
        .iter()
        .filter_map(|f| std::fs::read(root.join(f)).ok())
        .collect();
    // Small hand-written seeds (`seeds/<name>/`: a fuzzer runs faster on small inputs), and
    // inputs that once crashed a target (`regressions/<name>/`), kept so that every run tries
    // them again.
    for kind in ["seeds", "regressions"] {
        let dir = root.join("tests/fuzz-targets").join(kind).join(name);
        if let Ok(dir) = std::fs::read_dir(dir) {
            let mut paths: Vec<_> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            out.extend(paths.iter().filter_map(|p| std::fs::read(p).ok()));
        }
    }
    match name {
        "tokenizer" => {
            let dir = root.join("tests/reference/llama3_bpe");
            if let (Ok(json), Ok(config)) = (
                std::fs::read(dir.join("tokenizer.json")),
                std::fs::read(dir.join("tokenizer_config.json")),
            ) {
                out.push(json.clone());
                out.push([json, vec![0], config].concat());
            }
        }
        "plugin" => {
            // All fields at their expected values, one op with one param; then the same with
            // every byte 1 and every byte 0xff.
            let mut good = vec![1u8; 3];
            good.extend([0u8, 5, b'p', b'l', b'u', b'g', b'1', 0]);
            good.extend([1u8, 9]);
            good.extend(b"demo.twice");
            out.extend([good, vec![1; 96], vec![0xff; 96]]);
        }
        _ => {}
    }
    out
}
