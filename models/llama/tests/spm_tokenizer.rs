//! SentencePiece GGUF vocabularies (`tokenizer.ggml.model = "llama"`) against transformers:
//! `tests/reference/spm_tiny.gguf` (a SentencePiece BPE model trained for this test, written
//! as llama.cpp writes such vocabularies) and `spm_tokenizer_cases.json` (transformers'
//! `LlamaTokenizer` ids and decodings of 230 strings), both made by
//! `tests/reference/spm_tokenizer_reference.py`. Plus the merge recovery on a hand-made
//! vocabulary and the errors of malformed files; and a Llama-3-style byte-level BPE
//! `tokenizer.json` directory (`tests/reference/llama3_bpe/`, with transformers' default
//! `model_max_length` of about 1e30 in its config) against transformers on the same strings
//! (`llama3_bpe_cases.json`, `tests/reference/llama3_bpe_reference.py`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_model_llama::gguf::write::GgufWriter;
use amk_model_llama::tokenizer::merges_from_scores;
use amk_model_llama::{GgufFile, GgufValue, ModelError, Tokenizer, ValueType};
use std::path::PathBuf;

fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference")
}

#[path = "support/reference_json.rs"]
mod reference_json;
use reference_json::{field, ids};

fn tiny() -> GgufFile {
    GgufFile::read(reference_dir().join("spm_tiny.gguf")).unwrap()
}

#[test]
fn sentencepiece_gguf_matches_transformers_on_every_case() {
    let tok = Tokenizer::from_gguf(&tiny()).unwrap();
    assert_eq!(tok.adds_bos(), Some(true));
    matches_cases(&tok, "spm_tokenizer_cases.json");
}

#[test]
fn llama3_style_tokenizer_json_matches_transformers_on_every_case() {
    let tok = Tokenizer::from_file(reference_dir().join("llama3_bpe/tokenizer.json")).unwrap();
    matches_cases(&tok, "llama3_bpe_cases.json");
}

/// `tok` against the reference file `cases`: BOS/EOS ids, and every string's ids (BOS included)
/// and decoding.
fn matches_cases(tok: &Tokenizer, cases: &str) {
    let text = std::fs::read_to_string(reference_dir().join(cases)).unwrap();
    let reference = amk_core::json::parse(&text).unwrap();
    assert_eq!(
        tok.bos_id().map(i64::from),
        field(&reference, "bos_id").as_i64()
    );
    assert_eq!(
        tok.eos_id().map(i64::from),
        field(&reference, "eos_id").as_i64()
    );
    let cases = field(&reference, "cases").as_array().unwrap();
    assert!(cases.len() >= 200, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let input = field(case, "text").as_str().unwrap();
        let want = ids(field(case, "input_ids"));
        let got = tok.encode(input).unwrap();
        if got != want {
            failures.push(format!(
                "encode {input:?}: got {got:?}, transformers {want:?}"
            ));
            continue;
        }
        let decoded = tok.decode(&got).unwrap();
        let want_text = field(case, "decoded").as_str().unwrap();
        if decoded != want_text {
            failures.push(format!(
                "decode {input:?}: got {decoded:?}, transformers {want_text:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn merges_come_from_scores_best_first_then_longer_halves() {
    // "ab" (score -1) and "abc" (score -2) and "bc" (score -3): the splits of each piece into
    // two known pieces, by the piece's score; equal scores put the longer left half first.
    // The expected list is transformers' `generate_merges` on this vocabulary and these scores
    // (transformers 5.24, `tokenization_utils_base.generate_merges`).
    let tokens = ["a", "b", "c", "ab", "bc", "abc", "x", "xa"];
    let scores = [0.0, 0.0, 0.0, -1.0, -3.0, -2.0, 0.0, -1.0];
    let merges = merges_from_scores(&tokens, &scores);
    let pairs: Vec<(&str, &str)> = merges
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        vec![("a", "b"), ("x", "a"), ("ab", "c"), ("a", "bc"), ("b", "c"),]
    );
}

fn rewrite(edit: impl Fn(&str, &GgufValue) -> Option<GgufValue>) -> GgufFile {
    let gguf = tiny();
    let mut w = GgufWriter::new(3);
    for (k, v) in gguf.metadata() {
        if let Some(v) = edit(k, v) {
            w.kv(k.clone(), v);
        }
    }
    GgufFile::parse(w.to_bytes()).unwrap()
}

#[test]
fn a_sentencepiece_file_without_scores_or_with_short_scores_is_refused() {
    let no_scores = rewrite(|k, v| (k != "tokenizer.ggml.scores").then(|| v.clone()));
    let err = Tokenizer::from_gguf(&no_scores).unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.scores"), "{err}");

    let short = rewrite(|k, v| {
        Some(if k == "tokenizer.ggml.scores" {
            GgufValue::Array(ValueType::F32, vec![GgufValue::F32(0.0); 3])
        } else {
            v.clone()
        })
    });
    let err = Tokenizer::from_gguf(&short).unwrap_err();
    assert!(
        matches!(&err, ModelError::Tokenizer(m) if m.contains("tokenizer.ggml.scores has 3 entries")),
        "{err}"
    );
}

#[test]
fn a_sentencepiece_file_without_add_bos_prepends_bos_and_one_that_says_no_does_not() {
    let absent = rewrite(|k, v| (k != "tokenizer.ggml.add_bos_token").then(|| v.clone()));
    let tok = Tokenizer::from_gguf(&absent).unwrap();
    assert_eq!(tok.encode("Hello").unwrap().first(), tok.bos_id().as_ref());
    let off = rewrite(|k, v| {
        Some(if k == "tokenizer.ggml.add_bos_token" {
            GgufValue::Bool(false)
        } else {
            v.clone()
        })
    });
    let tok = Tokenizer::from_gguf(&off).unwrap();
    assert_ne!(tok.encode("Hello").unwrap().first(), tok.bos_id().as_ref());
}

/// A `tokenizer.json` whose JSON breaks off inside its decoder made the tokenizers crate panic
/// (an `expect` in its deserializer; found by the fuzz target): it is a typed error now, as is
/// any JSON syntax error, and a whole file still loads.
#[test]
fn a_broken_tokenizer_json_is_an_error_not_a_panic() {
    let json = std::fs::read(reference_dir().join("llama3_bpe/tokenizer.json")).unwrap();
    let at = json
        .windows(10)
        .position(|w| w == b"\"decoder\":")
        .expect("the file has a decoder");
    for cut in [at + 12, at + 20, at + 31] {
        let broken = [&json[..cut], b"}".as_slice()].concat();
        let r = Tokenizer::from_json_parts(&broken, None, None, "broken.json");
        assert!(
            matches!(r, Err(amk_model_llama::ModelError::Tokenizer(_))),
            "cut at {cut}"
        );
    }
    assert!(Tokenizer::from_json_parts(&json, None, None, "whole.json").is_ok());
}

/// Scores holding NaN (a hostile file's) made the merge order's comparison inconsistent, and
/// the sort panicked (found by the fuzz target); the order is total now.
#[test]
fn nan_scores_do_not_break_the_merge_order() {
    // Every one- and two-letter piece over six letters: 36 merges to order.
    let letters = ["a", "b", "c", "d", "e", "f"];
    let mut tokens: Vec<String> = letters.iter().map(|s| s.to_string()).collect();
    for x in letters {
        for y in letters {
            tokens.push(format!("{x}{y}"));
        }
    }
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let scores: Vec<f32> = (0..refs.len())
        .map(|i| {
            if i % 3 == 0 {
                f32::NAN
            } else {
                -((i * 7 % 11) as f32)
            }
        })
        .collect();
    assert_eq!(merges_from_scores(&refs, &scores).len(), 36);
}
