//! Tokenizer tests: a tiny byte-level BPE written as a GGUF (and as a `tokenizer.json`) in the
//! test, always run; and the comparison with HuggingFace transformers on the real SmolLM2
//! GGUF (`tests/reference/tokenizer_cases.json`), run when `AMK_TEST_GGUF` names the file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/messages.rs"]
mod messages;
use amk_model_llama::gguf::write::GgufWriter;
use amk_model_llama::{GgufFile, GgufValue, ModelError, Tokenizer, ValueType};

/// GPT-2's byte → character map (the alphabet of byte-level vocabularies).
fn byte_chars() -> Vec<char> {
    amk_model_llama::tokenizer::byte_level_alphabet().to_vec()
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

/// `pre = qwen2` splits every digit on its own where `llama3` keeps runs of up to three, so a
/// merge inside a number applies under `llama3` only.
#[test]
fn tiny_gguf_qwen2_splits_digits_where_llama3_groups_three() {
    let mut t = tiny();
    t.merges.push("1 2".into());
    t.tokens.push("12".into());
    t.types.push(1);
    let ids = |pre: &str| {
        let tok = Tokenizer::from_gguf(&parse(&tiny_writer(&t, pre))).unwrap();
        tok.encode("12345").unwrap()
    };
    let of = |pieces: &[&str]| pieces.iter().map(|p| id_of(&t, p)).collect::<Vec<_>>();
    assert_eq!(ids("llama3"), of(&["12", "3", "4", "5"]));
    assert_eq!(ids("qwen2"), of(&["1", "2", "3", "4", "5"]));
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
    for model in ["bert", "t5", "rwkv"] {
        let mut w = GgufWriter::new(3);
        w.kv("tokenizer.ggml.model", GgufValue::String(model.into()))
            .kv("tokenizer.ggml.tokens", strings(&t.tokens))
            .kv("tokenizer.ggml.merges", strings(&t.merges));
        let err = Tokenizer::from_gguf(&parse(&w)).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ModelError::Tokenizer(_))
                && msg.contains(model)
                && msg.contains("gpt2, llama"),
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

// ---------------------------------------------------------------------------------------------
// tokenizer.json + tokenizer_config.json

/// A scratch directory under the target dir, unique per test.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("amk-tok-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes the tiny tokenizer as a `tokenizer.json` (serialised by the `tokenizers` crate).
fn write_tiny_json(dir: &std::path::Path) -> std::path::PathBuf {
    let (_, tok) = tiny_tokenizer();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tok.inner().to_string(true).unwrap()).unwrap();
    path
}

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#[test]
fn from_file_without_config() {
    let dir = scratch("noconfig");
    let path = write_tiny_json(&dir);
    let (t, gguf_tok) = tiny_tokenizer();
    let tok = Tokenizer::from_file(&path).unwrap();
    for text in ["hello world", "<|im_start|>hello<|im_end|> 😀 12"] {
        assert_eq!(tok.encode(text).unwrap(), gguf_tok.encode(text).unwrap());
    }
    assert_eq!(tok.bos_id(), None);
    assert_eq!(tok.eos_id(), None);
    assert_eq!(tok.adds_bos(), None);
    assert_eq!(tok.stop_ids(), vec![id_of(&t, "<|im_end|>"), 0]);
    assert!(tok.apply_chat_template(&[("user", "hi")], true).is_err());
}

#[test]
fn from_file_reads_tokenizer_config() {
    let dir = scratch("config");
    let path = write_tiny_json(&dir);
    let (t, _) = tiny_tokenizer();
    // transformers' save_pretrained writes `model_max_length` as 1e30 in full: a number no
    // 64-bit integer holds, in a field amk does not use, is no error.
    let config = format!(
        "{{\"bos_token\": {{\"content\": \"<|im_start|>\", \"lstrip\": false}}, \
         \"eos_token\": \"<|im_end|>\", \"add_bos_token\": true, \"chat_template\": {}, \
         \"model_max_length\": 1000000000000000019884624838656}}",
        json_string(CHATML)
    );
    std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
    let tok = Tokenizer::from_file(&path).unwrap();
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.adds_bos(), Some(true));
    assert_eq!(tok.encode("hello").unwrap(), vec![1, id_of(&t, "hello")]);
    assert_eq!(
        tok.apply_chat_template(&[("user", "hi")], true).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(tok.stop_ids(), vec![2, 0]);
}

#[test]
fn from_file_errors() {
    // Missing file.
    let dir = scratch("errors");
    assert!(matches!(
        Tokenizer::from_file(dir.join("nope.json")).unwrap_err(),
        ModelError::Io { .. }
    ));
    // Not a tokenizer.json.
    std::fs::write(dir.join("bad.json"), "{\"model\": 3}").unwrap();
    assert!(matches!(
        Tokenizer::from_file(dir.join("bad.json")).unwrap_err(),
        ModelError::Tokenizer(_)
    ));
    let path = write_tiny_json(&dir);
    // Malformed config, wrong types, unknown BOS token.
    for config in [
        "{not json",
        "[]",
        "{\"add_bos_token\": \"yes\"}",
        "{\"bos_token\": 7}",
        "{\"bos_token\": \"<nope>\"}",
        "{\"add_bos_token\": true}",
    ] {
        std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
        let err = Tokenizer::from_file(&path).unwrap_err();
        assert!(matches!(err, ModelError::Tokenizer(_)), "{config}: {err}");
    }
}

/// A JSON string literal (enough for the templates used here).
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------------------------
// Chat templates

fn with_template(template: &str) -> Tokenizer {
    let t = tiny();
    let mut w = tiny_writer(&t, "gpt2");
    w.kv(
        "tokenizer.chat_template",
        GgufValue::String(template.into()),
    );
    Tokenizer::from_gguf(&parse(&w)).unwrap()
}

#[test]
fn chatml_template_renders_messages() {
    let tok = with_template(CHATML);
    let msgs = [
        ("system", "Be brief."),
        ("user", "hi"),
        ("assistant", "hello"),
    ];
    let expect = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n\
                  <|im_start|>assistant\nhello<|im_end|>\n";
    assert_eq!(tok.apply_chat_template(&msgs, false).unwrap(), expect);
    assert_eq!(
        tok.apply_chat_template(&msgs, true).unwrap(),
        format!("{expect}<|im_start|>assistant\n")
    );
    assert_eq!(tok.apply_chat_template(&[], false).unwrap(), "");
}

#[test]
fn chatml_template_with_default_system_message() {
    // SmolLM2's template (escaped \n as a Jinja escape here; the real file has raw newlines).
    let template = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are Tiny, it\\'s small<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let tok = with_template(template);
    assert_eq!(
        tok.apply_chat_template(&[("user", "hi")], true).unwrap(),
        "<|im_start|>system\nYou are Tiny, it's small<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(
        tok.apply_chat_template(&[("system", "S"), ("user", "hi")], false)
            .unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    );
    // No messages: the loop never runs, so no default system message either.
    assert_eq!(
        tok.apply_chat_template(&[], true).unwrap(),
        "<|im_start|>assistant\n"
    );
}

/// Any template renders (it is Jinja, not a recognised shape): a Llama-3-style one, one that
/// tests for tools; one that does not parse or that raises is a typed error carrying the
/// template's own message.
#[test]
fn any_template_renders_and_bad_ones_are_typed_errors() {
    let llama3 = "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}{% endfor %}";
    assert_eq!(
        with_template(llama3)
            .apply_chat_template(&[("user", "hi")], true)
            .unwrap(),
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    );
    let with_tools = format!("{{% if tools %}}...{{% endif %}}{CHATML}");
    assert!(
        with_template(&with_tools)
            .apply_chat_template(&[("user", "hi")], false)
            .unwrap()
            .starts_with("<|im_start|>")
    );
    let raises = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('Conversations must start with a system message') }}{% endif %}";
    for (template, needle) in [
        ("{% for m in messages %}", "does not parse"),
        (raises, "Conversations must start with a system message"),
    ] {
        let err = with_template(template)
            .apply_chat_template(&[("user", "hi")], true)
            .unwrap_err();
        assert!(
            matches!(&err, ModelError::Tokenizer(m) if m.contains(needle)),
            "{err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Reference comparison with HuggingFace transformers (needs the real GGUF)

use amk_core::json::Value;
#[path = "support/reference_json.rs"]
mod reference_json;
use reference_json::{field, ids};

fn text(v: &Value) -> &str {
    v.as_str().unwrap()
}

#[test]
fn matches_transformers_reference_on_smollm2() {
    let Ok(gguf_path) = std::env::var("AMK_TEST_GGUF") else {
        // Straight to stderr, not `println!`: the test harness hides a passing test's prints.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: set AMK_TEST_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf to compare the \
             tokenizer with tests/reference/tokenizer_cases.json"
        );
        return;
    };
    let cases_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/tokenizer_cases.json");
    let reference = amk_core::json::parse(&std::fs::read_to_string(&cases_path).unwrap()).unwrap();
    let gguf = GgufFile::read(&gguf_path).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    // The same vocabulary with other pre-tokenizers, checked against transformers' own GGUF
    // conversion: "gpt2" (plain byte-level, what transformers uses for "smollm") and "llama-bpe".
    let with_pre = |pre: &str| {
        let mut w = GgufWriter::new(3);
        for (k, v) in gguf.metadata() {
            if k.starts_with("tokenizer.") && k != "tokenizer.ggml.pre" {
                w.kv(k.clone(), v.clone());
            }
        }
        w.kv("tokenizer.ggml.pre", GgufValue::String(pre.into()));
        Tokenizer::from_gguf(&parse(&w)).unwrap()
    };
    let tok_gpt2 = with_pre("gpt2");
    let tok_llama_bpe = with_pre("llama-bpe");

    let mut failures: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };
    let ref_bos = field(&reference, "bos_token_id").as_i64().map(|x| x as u32);
    let ref_eos = field(&reference, "eos_token_id").as_i64().map(|x| x as u32);
    let ref_adds_bos = matches!(field(&reference, "adds_bos"), Value::Bool(true));
    check(
        tok.bos_id() == ref_bos,
        format!("bos_id {:?} != {ref_bos:?}", tok.bos_id()),
    );
    check(
        tok.eos_id() == ref_eos,
        format!("eos_id {:?} != {ref_eos:?}", tok.eos_id()),
    );
    check(
        tok.adds_bos() == Some(ref_adds_bos),
        format!("adds_bos {:?} != {ref_adds_bos}", tok.adds_bos()),
    );
    let ref_vocab = field(&reference, "vocab_size").as_i64().unwrap() as usize;
    check(
        tok.vocab_size() == ref_vocab,
        format!("vocab_size {} != {ref_vocab}", tok.vocab_size()),
    );
    check(
        tok.chat_template() == field(&reference, "chat_template").as_str(),
        "chat_template differs".into(),
    );
    check(
        tok.stop_ids() == vec![2, 0],
        format!("stop_ids {:?}", tok.stop_ids()),
    );

    let cases = field(&reference, "cases").as_array().unwrap();
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let mut deviations = Vec::new();
    for case in cases {
        let name = text(field(case, "name"));
        let input = text(field(case, "text"));
        let hf_ids = ids(field(case, "input_ids"));
        let smollm_ids = ids(field(case, "input_ids_smollm_pre"));
        let same = matches!(field(case, "match_transformers_gguf"), Value::Bool(true));
        let ours = tok.encode(input).unwrap();
        // Ours follows the model's own pre-tokenizer; where transformers' GGUF loader (which
        // ignores tokenizer.ggml.pre = "smollm") differs, the case is flagged in the file.
        check(
            ours == smollm_ids,
            format!("{name}: encode {input:?} = {ours:?}, expected {smollm_ids:?}"),
        );
        if same {
            check(
                ours == hf_ids,
                format!("{name}: encode {input:?} = {ours:?}, transformers {hf_ids:?}"),
            );
        } else {
            deviations.push(name.to_string());
        }
        let gpt2 = tok_gpt2.encode(input).unwrap();
        check(
            gpt2 == hf_ids,
            format!("{name}: gpt2 pre: encode {input:?} = {gpt2:?}, transformers {hf_ids:?}"),
        );
        let llama_bpe_ids = ids(field(case, "input_ids_llama_bpe"));
        let llama_bpe = tok_llama_bpe.encode(input).unwrap();
        check(
            llama_bpe == llama_bpe_ids,
            format!(
                "{name}: llama-bpe pre: encode {input:?} = {llama_bpe:?}, transformers \
                 {llama_bpe_ids:?}"
            ),
        );
        for (which, list, decoded) in [
            ("input_ids", &hf_ids, field(case, "decoded")),
            (
                "input_ids_smollm_pre",
                &smollm_ids,
                field(case, "decoded_smollm_pre"),
            ),
        ] {
            let expect = text(decoded);
            let got = tok.decode(list).unwrap();
            check(
                got == expect,
                format!("{name}: decode({which}) = {got:?}, transformers {expect:?}"),
            );
            let mut stream = tok.decode_stream();
            let mut pieces = String::new();
            for &id in list.iter() {
                if let Some(p) = stream.step(id).unwrap() {
                    pieces.push_str(&p);
                }
            }
            if let Some(p) = stream.finish().unwrap() {
                pieces.push_str(&p);
            }
            check(
                pieces == expect,
                format!("{name}: decode_stream({which}) = {pieces:?}, transformers {expect:?}"),
            );
        }
    }

    for chat in field(&reference, "chats").as_array().unwrap() {
        let name = text(field(chat, "name"));
        let messages = messages::message_pairs(field(chat, "messages"));
        let add = matches!(field(chat, "add_generation_prompt"), Value::Bool(true));
        let expect = text(field(chat, "rendered"));
        let got = tok.apply_chat_template(&messages, add).unwrap();
        check(
            got == expect,
            format!("chat {name}: {got:?}, transformers {expect:?}"),
        );
    }
    println!(
        "{} cases compared; ids differ from transformers' GGUF loader (smollm digit split) in: {}",
        cases.len(),
        deviations.join(", ")
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn chatml_template_without_generation_prompt_never_adds_one() {
    let template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
    let tok = with_template(template);
    assert_eq!(
        tok.apply_chat_template(&[("user", "hi")], true).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n"
    );
    // A filter binds before `+`: the content is trimmed, the rest kept.
    let trims = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n'}}{% endfor %}";
    assert_eq!(
        with_template(trims)
            .apply_chat_template(&[("user", "  hi \n")], true)
            .unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n"
    );
}

#[test]
fn from_file_bos_from_post_processor_unless_config_says() {
    let dir = scratch("postproc");
    let path = write_tiny_json(&dir);
    let (t, _) = tiny_tokenizer();
    // A Llama-3-style tokenizer.json whose post-processor prepends BOS.
    let json = std::fs::read_to_string(&path).unwrap();
    let processor = r#""post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}"#;
    assert!(json.contains("\"post_processor\": null"));
    std::fs::write(&path, json.replace("\"post_processor\": null", processor)).unwrap();
    let hello = id_of(&t, "hello");
    let tok = Tokenizer::from_file(&path).unwrap();
    assert_eq!(tok.adds_bos(), None);
    assert_eq!(tok.encode("hello").unwrap(), vec![1, hello]);
    // A config that says add_bos_token = false wins over the post-processor.
    std::fs::write(
        dir.join("tokenizer_config.json"),
        "{\"bos_token\": \"<|im_start|>\", \"add_bos_token\": false}",
    )
    .unwrap();
    let tok = Tokenizer::from_file(&path).unwrap();
    assert_eq!(tok.adds_bos(), Some(false));
    assert_eq!(tok.encode("hello").unwrap(), vec![hello]);
}

/// A token's bytes are what its text stands for, even where the token alone is part of a
/// character: the tokens' bytes of an encoding concatenate to the text's UTF-8.
#[test]
fn token_bytes_concatenate_to_the_texts_bytes() {
    let (_, tok) = tiny_tokenizer();
    for text in ["hello world", "café 東京 ✓", "a\nb\tc"] {
        let ids = tok.encode(text).unwrap();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tok.token_bytes(id).unwrap())
            .collect();
        assert_eq!(bytes, text.as_bytes(), "{text:?} as {ids:?}");
    }
    // A byte of a three-byte character decodes alone to U+FFFD; its bytes are its own.
    let ids = tok.encode("東").unwrap();
    assert_eq!(ids.len(), 3);
    assert_eq!(tok.decode(&ids[..1]).unwrap(), "\u{FFFD}");
    assert_eq!(tok.token_bytes(ids[0]).unwrap(), "東".as_bytes()[..1]);
    // Special tokens are their text; ids past the vocabulary have none.
    assert_eq!(tok.token_bytes(2).unwrap(), b"<|im_end|>");
    assert_eq!(tok.token_bytes(1_000_000), None);
}
