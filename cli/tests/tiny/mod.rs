//! Test models shared by the CLI tests: the committed tiny checkpoints with a byte-level
//! tokenizer written beside them, and paths into `tests/reference`.
// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A fresh folder under the temporary directory, unique to this process and `name`.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("amk-model-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `tests/reference/NAME`: the committed tiny checkpoints and reference outputs.
pub fn reference(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/reference")
        .join(name)
}

/// GPT-2's byte → character map (the alphabet of byte-level vocabularies).
pub fn byte_chars() -> Vec<char> {
    amk_model_llama::tokenizer::byte_level_alphabet().to_vec()
}

/// A byte-level BPE tokenizer.json: the 256 byte tokens (ids 0..255), three merges and an
/// `<|end|>` special token at id 259 — all inside the tiny models' vocabularies.
pub fn write_tokenizer(dir: &Path) {
    let chars = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), i.into());
    }
    let (h, e, l, o, sp) = (
        chars[b'h' as usize],
        chars[b'e' as usize],
        chars[b'l' as usize],
        chars[b'o' as usize],
        chars[b' ' as usize],
    );
    vocab.insert(format!("{h}{e}"), 256.into());
    vocab.insert(format!("{l}{l}"), 257.into());
    vocab.insert(format!("{sp}{o}"), 258.into());
    // Plain filler tokens up to the largest tiny model's vocabulary, so every id a random
    // model can emit decodes.
    for i in 260..320 {
        vocab.insert(format!("<t{i}>"), i.into());
    }
    let tok = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": 259, "content": "<|end|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab,
                  "merges": [format!("{h} {e}"), format!("{l} {l}"), format!("{sp} {o}")]}
    });
    std::fs::write(
        dir.join("tokenizer.json"),
        serde_json::to_string(&tok).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"add_bos_token": false, "eos_token": "<|end|>"}"#,
    )
    .unwrap();
}

/// A copy of a committed tiny checkpoint, with a tokenizer.
pub fn tiny_with_tokenizer(name: &str, tag: &str) -> PathBuf {
    let d = scratch(tag);
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(reference(name).join(f), d.join(f)).unwrap();
    }
    write_tokenizer(&d);
    d
}
