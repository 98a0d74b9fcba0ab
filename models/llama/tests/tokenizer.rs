//! Tokenizer tests: a tiny byte-level BPE written as a GGUF (and as a `tokenizer.json`) in the
//! test, always run; and the comparison with HuggingFace transformers on the real SmolLM2
//! GGUF (`tests/reference/tokenizer_cases.json`), run when `AMK_TEST_GGUF` names the file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_model_llama::gguf::write::GgufWriter;
use amk_model_llama::{GgufFile, GgufValue, ModelError, Tokenizer, ValueType};

/// GPT-2's byte → character map (the alphabet of byte-level vocabularies).
fn byte_chars() -> Vec<char> {
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

fn strings(items: &[String]) -> GgufValue {
    GgufValue::Array(
        ValueType::String,
        items.iter().map(|s| GgufValue::String(s.clone())).collect(),
    )
}

/// The tiny vocabulary: 3 control tokens, 1 user-defined token, the 256 byte characters, then
/// the merge results.
struct Tiny {
    tokens: Vec<String>,
    types: Vec<i32>,
    merges: Vec<String>,
}

fn tiny() -> Tiny {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut types = vec![3, 3, 3, 4];
    for c in byte_chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    let merges: Vec<String> = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ h", "Ġh e",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    Tiny {
        tokens,
        types,
        merges,
    }
}

fn tiny_writer(t: &Tiny, pre: &str) -> GgufWriter {
    tiny_writer_bos(t, pre, 1)
}

fn tiny_writer_bos(t: &Tiny, pre: &str, bos: u32) -> GgufWriter {
    let mut w = GgufWriter::new(3);
    w.kv("general.architecture", GgufValue::String("llama".into()))
        .kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", GgufValue::String(pre.into()))
        .kv("tokenizer.ggml.tokens", strings(&t.tokens))
        .kv(
            "tokenizer.ggml.token_type",
            GgufValue::Array(
                ValueType::I32,
                t.types.iter().map(|&x| GgufValue::I32(x)).collect(),
            ),
        )
        .kv("tokenizer.ggml.merges", strings(&t.merges))
        .kv("tokenizer.ggml.bos_token_id", GgufValue::U32(bos))
        .kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2));
    w
}

fn parse(w: &GgufWriter) -> GgufFile {
    GgufFile::parse(w.to_bytes()).unwrap()
}

fn tiny_tokenizer() -> (Tiny, Tokenizer) {
    let t = tiny();
    let tok = Tokenizer::from_gguf(&parse(&tiny_writer(&t, "smollm"))).unwrap();
    (t, tok)
}

fn id_of(t: &Tiny, s: &str) -> u32 {
    t.tokens.iter().position(|x| x == s).unwrap() as u32
}

#[test]
fn tiny_gguf_encodes_with_merges_and_special_tokens() {
    let (t, tok) = tiny_tokenizer();
    assert_eq!(tok.vocab_size(), t.tokens.len());
    let ids = tok.encode("hello world").unwrap();
    assert_eq!(ids, vec![id_of(&t, "hello"), id_of(&t, "Ġworld")]);
    // Control and user-defined tokens are recognised whole inside text.
    let ids = tok.encode("<|im_start|>hello<|im_end|><think>").unwrap();
    assert_eq!(ids, vec![1, id_of(&t, "hello"), 2, 3]);
    // Without add_bos_token no BOS is prepended; empty text gives no ids.
    assert_eq!(tok.encode("").unwrap(), Vec::<u32>::new());
    assert_eq!(tok.adds_bos(), Some(false));
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.stop_ids(), vec![2, 0]);
    assert_eq!(tok.token_to_id("Ġworld"), Some(id_of(&t, "Ġworld")));
    assert_eq!(tok.id_to_token(1).as_deref(), Some("<|im_start|>"));
    assert_eq!(tok.id_to_token(100_000), None);
}

#[test]
fn tiny_gguf_smollm_splits_digits() {
    let (t, tok) = tiny_tokenizer();
    let ids = tok.encode("x 123").unwrap();
    let expect: Vec<u32> = ["x", "Ġ", "1", "2", "3"]
        .iter()
        .map(|s| id_of(&t, s))
        .collect();
    assert_eq!(ids, expect);
}

#[test]
fn tiny_gguf_round_trips_any_text() {
    let (_, tok) = tiny_tokenizer();
    for text in [
        "",
        "hello world",
        "  leading and trailing  ",
        "tabs\tand\nnewlines\r\n",
        "emoji 😀👍🏽 and CJK 日本語の文章 and é à ü ß",
        "<|im_start|>user\nhi<|im_end|>\n",
        "digits 12345 3.14",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text, "{text:?}");
    }
}

#[test]
fn tiny_gguf_add_bos_token() {
    let t = tiny();
    let mut w = tiny_writer(&t, "gpt2");
    w.kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
    let tok = Tokenizer::from_gguf(&parse(&w)).unwrap();
    assert_eq!(tok.adds_bos(), Some(true));
    assert_eq!(tok.encode("hello").unwrap(), vec![1, id_of(&t, "hello")]);
    assert_eq!(tok.encode("").unwrap(), vec![1]);
    // gpt2 pre-tokenizer keeps digits together (no merges here, so they stay one byte each
    // but the pre-tokenizer is plain byte-level).
    assert_eq!(
        tok.decode(&tok.encode("a 12").unwrap()).unwrap(),
        "<|im_start|>a 12"
    );
}

#[test]
fn decode_stream_never_splits_characters() {
    let (_, tok) = tiny_tokenizer();
    let text = "héllo 😀 日本語 👍🏽!\n<|im_end|>ü";
    let ids = tok.encode(text).unwrap();
    let mut stream = tok.decode_stream();
    let mut pieces = Vec::new();
    for &id in &ids {
        if let Some(p) = stream.step(id).unwrap() {
            assert!(!p.contains('\u{FFFD}'), "piece {p:?} splits a character");
            pieces.push(p);
        }
    }
    if let Some(p) = stream.finish().unwrap() {
        pieces.push(p);
    }
    // Multi-byte characters took several byte tokens, so some steps returned None.
    assert!(pieces.len() < ids.len());
    assert_eq!(pieces.concat(), tok.decode(&ids).unwrap());
    assert_eq!(pieces.concat(), text);
}

#[test]
fn decode_stream_finish_flushes_an_unfinished_character() {
    let (t, tok) = tiny_tokenizer();
    let chars = byte_chars();
    // The first two bytes of "😀" (F0 9F 98 80).
    let ids = [
        id_of(&t, "hello"),
        id_of(&t, &chars[0xF0].to_string()),
        id_of(&t, &chars[0x9F].to_string()),
    ];
    let mut stream = tok.decode_stream();
    assert_eq!(stream.step(ids[0]).unwrap().as_deref(), Some("hello"));
    assert_eq!(stream.step(ids[1]).unwrap(), None);
    assert_eq!(stream.step(ids[2]).unwrap(), None);
    let rest = stream.finish().unwrap().unwrap();
    assert_eq!(format!("hello{rest}"), tok.decode(&ids).unwrap());
    assert_eq!(stream.finish().unwrap(), None);
}

#[test]
fn decode_out_of_range_id_is_an_error() {
    let (t, tok) = tiny_tokenizer();
    let bad = t.tokens.len() as u32;
    let err = tok.decode(&[0, bad]).unwrap_err();
    assert!(matches!(err, ModelError::Tokenizer(ref m) if m.contains(&bad.to_string())));
    let mut stream = tok.decode_stream();
    assert!(stream.step(bad).is_err());
    assert!(stream.step(u32::MAX).is_err());
    assert_eq!(
        stream.step(id_of(&t, "hello")).unwrap().as_deref(),
        Some("hello")
    );
}

#[test]
fn missing_merges_key_is_an_error() {
    let t = tiny();
    let mut w = GgufWriter::new(3);
    w.kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .kv("tokenizer.ggml.tokens", strings(&t.tokens));
    let err = Tokenizer::from_gguf(&parse(&w)).unwrap_err();
    assert!(matches!(err, ModelError::MissingKey(ref k) if k == "tokenizer.ggml.merges"));
}

#[test]
fn unknown_model_type_is_refused() {
    let t = tiny();
    for model in ["llama", "bert", "t5"] {
        let mut w = GgufWriter::new(3);
        w.kv("tokenizer.ggml.model", GgufValue::String(model.into()))
            .kv("tokenizer.ggml.tokens", strings(&t.tokens))
            .kv("tokenizer.ggml.merges", strings(&t.merges));
        let err = Tokenizer::from_gguf(&parse(&w)).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ModelError::Tokenizer(_)) && msg.contains(model) && msg.contains("gpt2"),
            "{msg}"
        );
    }
}

#[test]
fn unknown_pre_tokenizer_is_refused_listing_supported_ones() {
    let t = tiny();
    let err = Tokenizer::from_gguf(&parse(&tiny_writer(&t, "mystery"))).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("mystery") && msg.contains("smollm") && msg.contains("gpt2"),
        "{msg}"
    );
}

#[test]
fn bad_metadata_is_an_error_not_a_panic() {
    let t = tiny();
    // A merge naming a token outside the vocabulary.
    let mut bad = tiny();
    bad.merges.push("q z".into());
    assert!(Tokenizer::from_gguf(&parse(&tiny_writer(&bad, "gpt2"))).is_err());
    // A merge that is not two tokens.
    let mut bad = tiny();
    bad.merges.push("hello".into());
    assert!(Tokenizer::from_gguf(&parse(&tiny_writer(&bad, "gpt2"))).is_err());
    // token_type of the wrong length.
    let mut bad = tiny();
    bad.types.pop();
    assert!(Tokenizer::from_gguf(&parse(&tiny_writer(&bad, "gpt2"))).is_err());
    // BOS id outside the vocabulary.
    let w = tiny_writer_bos(&t, "gpt2", 1_000_000);
    assert!(Tokenizer::from_gguf(&parse(&w)).is_err());
    // tokens of the wrong type.
    let mut w = GgufWriter::new(3);
    w.kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .kv("tokenizer.ggml.tokens", GgufValue::U32(7))
        .kv("tokenizer.ggml.merges", strings(&t.merges));
    assert!(matches!(
        Tokenizer::from_gguf(&parse(&w)).unwrap_err(),
        ModelError::KeyType { .. }
    ));
}
