//! The tokenizer: a typed wrapper over the `tokenizers` crate, built from a HuggingFace
//! `tokenizer.json` (plus `tokenizer_config.json`) or from a GGUF file's `tokenizer.ggml.*`
//! metadata.
//!
//! Why a wrapper: the model runner needs more than the crate gives in one place — whether the
//! model wants a BOS token prepended, which ids end a turn, a streaming decoder that never cuts
//! a UTF-8 character in two, and the chat prompt format — and every failure must be a
//! [`ModelError`], never a panic.
//!
//! The GGUF path reproduces what HuggingFace transformers builds from the same metadata
//! (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`): a byte-level BPE from the vocabulary
//! and merges, or a SentencePiece BPE from the pieces and their scores (`spm`), control tokens (type 3) added as special tokens and user-defined tokens (type 4)
//! as plain added tokens, so that both are recognised whole inside text. One deliberate
//! difference: for `tokenizer.ggml.pre = "smollm"` the model's own pre-tokenizer (digits
//! split one by one) is used, which transformers' GGUF loader drops (see `pre_tokenizer_for`).

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::ModelError;
use crate::gguf::{GgufFile, GgufValue};

mod spm;
pub use spm::merges_from_scores;

/// `tokenizer.ggml.model` values this module can build: byte-level BPE (`gpt2`) and
/// SentencePiece BPE (`llama`).
pub const SUPPORTED_GGUF_MODELS: &[&str] = &["gpt2", "llama"];

/// `tokenizer.ggml.pre` values this module can build, for a `gpt2` (byte-level BPE) model.
pub const SUPPORTED_GGUF_PRE: &[&str] = &[
    "default",
    "gpt2",
    "smollm",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "qwen2",
];

/// Token texts that end a turn or a document in common chat models; [`Tokenizer::stop_ids`]
/// returns the ids of those present in the vocabulary, after the EOS id.
const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "</s>",
];

/// GGUF `tokenizer.ggml.token_type` value of a control token (`<|im_start|>`, …).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF `tokenizer.ggml.token_type` value of a user-defined token (`<think>`, …).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Qwen2's pre-tokenizer split (its `tokenizer.json`; llama.cpp's `qwen2`): Llama 3's but
/// every digit its own piece.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer split used by Llama 3 (`llama-bpe` in llama.cpp), as HF transformers
/// rebuilds it for GGUF files.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn tok_err(context: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(format!("{context}: {e}"))
}

/// How the BOS token gets into [`Tokenizer::encode`]'s output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BosPolicy {
    /// The `tokenizer.json` post-processor decides (it may add BOS, EOS or nothing).
    PostProcessor,
    /// No post-processing; BOS is prepended when the flag is set (and a BOS id is known).
    Prepend(bool),
}

/// A text ↔ token-id codec for one model, with its special tokens and chat format.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    bos: BosPolicy,
    chat_template: Option<String>,
}

/// The inverse of [`byte_level_alphabet`]: the byte a character of a byte-level vocabulary
/// stands for.
fn byte_level_inverse() -> impl Fn(char) -> Option<u8> {
    static INVERSE: std::sync::OnceLock<std::collections::HashMap<char, u8>> =
        std::sync::OnceLock::new();
    let map = INVERSE.get_or_init(|| {
        (byte_level_alphabet().iter())
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect()
    });
    move |c| map.get(&c).copied()
}

/// GPT-2's byte → printable-character map (the alphabet byte-level BPE vocabularies are
/// written in). Index: byte value. Public so tools and tests can write byte-level
/// vocabularies in the same alphabet.
pub fn byte_level_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            u32::from(b)
        } else {
            let c = next;
            next += 1;
            c
        };
        // All codes are below 512, hence valid scalar values; the fallback is never taken.
        table[usize::from(b)] = char::from_u32(code).unwrap_or('\u{FFFD}');
    }
    table
}

/// Reads a string or `{ "content": ... }` token entry of `tokenizer_config.json`.
fn config_token(map: &amk_core::json::Map, key: &str) -> Result<Option<String>, ModelError> {
    use amk_core::json::Value;
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Str(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::Str(s)) => Ok(Some(s.clone())),
            _ => Err(ModelError::Tokenizer(format!(
                "tokenizer_config.json: '{key}' is an object without a string 'content'"
            ))),
        },
        Some(v) => Err(ModelError::Tokenizer(format!(
            "tokenizer_config.json: '{key}' must be a string or an object with 'content', found {}",
            v.type_name()
        ))),
    }
}

/// Settings read from a `tokenizer_config.json`.
#[derive(Debug, Default)]
struct HfConfig {
    bos_token: Option<String>,
    eos_token: Option<String>,
    add_bos_token: Option<bool>,
    chat_template: Option<String>,
}

/// The `tokenizer_config.json` text `text` (`source` names it in errors).
fn parse_hf_config(text: &str, source: &str) -> Result<HfConfig, ModelError> {
    use amk_core::json::Value;
    let value = amk_core::json::parse(text).map_err(|e| tok_err(source, e))?;
    let Some(map) = value.as_object() else {
        return Err(ModelError::Tokenizer(format!(
            "{source}: expected a JSON object, found {}",
            value.type_name()
        )));
    };
    let add_bos_token = match map.get("add_bos_token") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer_config.json: 'add_bos_token' must be a boolean, found {}",
                v.type_name()
            )));
        }
    };
    let chat_template = match map.get("chat_template") {
        None | Some(Value::Null) => None,
        Some(Value::Str(s)) => Some(s.clone()),
        // Newer configs hold a list of named templates; the one named "default" is used.
        Some(Value::Array(items)) => items.iter().find_map(|item| {
            let o = item.as_object()?;
            (o.get("name")?.as_str()? == "default")
                .then(|| o.get("template")?.as_str().map(str::to_string))
                .flatten()
        }),
        Some(v) => {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer_config.json: 'chat_template' must be a string or a list, found {}",
                v.type_name()
            )));
        }
    };
    Ok(HfConfig {
        bos_token: config_token(map, "bos_token")?,
        eos_token: config_token(map, "eos_token")?,
        add_bos_token,
        chat_template,
    })
}

/// An optional GGUF id key: absent → `None`; present but not a `u32` → error.
fn optional_u32(gguf: &GgufFile, key: &str) -> Result<Option<u32>, ModelError> {
    if gguf.contains_key(key) {
        gguf.get_u32(key).map(Some)
    } else {
        Ok(None)
    }
}

fn pre_tokenizer_for(pre: &str) -> Result<PreTokenizerWrapper, ModelError> {
    let byte_level = ByteLevel::new(false, true, true);
    Ok(match pre {
        "default" | "gpt2" => byte_level.into(),
        // SmolLM's tokenizer.json (and llama.cpp's "smollm"): every digit its own piece, then
        // GPT-2's byte-level split. transformers' GGUF loader does not know this name and uses
        // plain byte-level instead; the ids differ only where a whitespace run ends right
        // before a digit ("x  1": ours [x, "ĠĠ", 1] like the model's own tokenizer, its
        // [x, "Ġ", "Ġ", 1]). See tests/reference/tokenizer_cases.json.
        "smollm" => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
        "llama3" | "llama-v3" | "llama-bpe" | "qwen2" => {
            let regex = if pre == "qwen2" {
                QWEN2_SPLIT
            } else {
                LLAMA3_SPLIT
            };
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| tok_err("llama3 pre-tokenizer regex", e))?;
            Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into()
        }
        other => {
            return Err(ModelError::Tokenizer(format!(
                "unsupported GGUF pre-tokenizer 'tokenizer.ggml.pre' = '{other}' (supported: {})",
                SUPPORTED_GGUF_PRE.join(", ")
            )));
        }
    })
}

/// GGUF `tokenizer.ggml.merges` entries ("left right") as pairs.
fn parse_merges(raw: &[&str]) -> Result<Vec<(String, String)>, ModelError> {
    raw.iter()
        .enumerate()
        .map(|(i, m)| {
            let (a, b) = m.split_once(' ').ok_or_else(|| {
                ModelError::Tokenizer(format!(
                    "tokenizer.ggml.merges[{i}] = '{m}' is not two tokens separated by a space"
                ))
            })?;
            Ok((a.to_string(), b.to_string()))
        })
        .collect()
}

/// The tokenizer (model, pre-tokenizer, decoder) of a byte-level BPE GGUF vocabulary `tokens`
/// with its merges and its `tokenizer.ggml.pre` pre-tokenizer; the caller adds the special
/// tokens.
fn byte_level_model(gguf: &GgufFile, tokens: &[&str]) -> Result<tokenizers::Tokenizer, ModelError> {
    let pre = if gguf.contains_key("tokenizer.ggml.pre") {
        gguf.get_str("tokenizer.ggml.pre")?
    } else {
        "default"
    };
    let pre_tokenizer = pre_tokenizer_for(pre)?;
    let merges_raw = gguf.get_str_array("tokenizer.ggml.merges")?;
    // The vocabulary in the byte-level alphabet: a token written with other characters
    // (llama.cpp stores some added tokens as plain text) is respelled byte by byte.
    let alphabet = byte_level_alphabet();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, t) in (0u32..).zip(tokens) {
        let spelled = if in_alphabet(t) {
            (*t).to_string()
        } else {
            t.bytes().map(|b| alphabet[usize::from(b)]).collect()
        };
        vocab.insert(spelled, id);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, parse_merges(&merges_raw)?)
        .build()
        .map_err(|e| tok_err("building the BPE model from tokenizer.ggml.*", e))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(inner)
}

impl Tokenizer {
    /// Loads a HuggingFace `tokenizer.json`; if a `tokenizer_config.json` lies beside it, its
    /// `bos_token`, `eos_token`, `add_bos_token` and `chat_template` are used too (and a
    /// `chat_template.jinja` beside it supplies the template when the config has none).
    ///
    /// BOS: when the config states `add_bos_token`, that decides (BOS prepended by hand, the
    /// `tokenizer.json` post-processor not run); otherwise the post-processor decides, as in
    /// transformers.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer, ModelError> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(ModelError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            });
        }
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| ModelError::Io {
                path: p.to_path_buf(),
                source,
            })
        };
        let json = read(path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        // A file beside the tokenizer, as text, when there is one.
        let beside = |name: &str| -> Result<Option<String>, ModelError> {
            let p = dir.join(name);
            if !p.is_file() {
                return Ok(None);
            }
            Ok(Some(String::from_utf8_lossy(&read(&p)?).into_owned()))
        };
        let config = beside("tokenizer_config.json")?;
        let template = beside("chat_template.jinja")?;
        Tokenizer::from_json_parts(
            &json,
            config.as_deref(),
            template.as_deref(),
            &path.display().to_string(),
        )
    }

    /// [`Tokenizer::from_file`] from what it reads: the `tokenizer.json` bytes, the
    /// `tokenizer_config.json` text and the `chat_template.jinja` text when there are such
    /// files (`source` names the tokenizer in errors). Also what the fuzz targets drive.
    pub fn from_json_parts(
        tokenizer_json: &[u8],
        tokenizer_config: Option<&str>,
        chat_template_jinja: Option<&str>,
        source: &str,
    ) -> Result<Tokenizer, ModelError> {
        // The tokenizers crate panics on some malformed files (a decoder whose JSON breaks off:
        // an `expect` inside its deserializer, found by the fuzz target). Its JSON syntax is
        // checked first, which avoids that one; a panic of any other kind is caught too. A bad
        // file is an error here, never a crash.
        serde_json::from_slice::<serde_json::Value>(tokenizer_json)
            .map_err(|e| tok_err(source, e))?;
        let parsed = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(tokenizer_json))
            .map_err(|_| {
                ModelError::Tokenizer(format!(
                    "{source}: not a valid tokenizer.json (the tokenizers crate failed reading it)"
                ))
            })?;
        let inner = parsed.map_err(|e| tok_err(source, e))?;
        let config = match tokenizer_config {
            Some(text) => parse_hf_config(text, "tokenizer_config.json")?,
            None => HfConfig::default(),
        };
        let mut chat_template = config.chat_template;
        if chat_template.is_none() {
            chat_template = chat_template_jinja.map(str::to_string);
        }
        let lookup = |name: &Option<String>, what: &str| -> Result<Option<u32>, ModelError> {
            match name {
                None => Ok(None),
                Some(t) => inner.token_to_id(t).map(Some).ok_or_else(|| {
                    ModelError::Tokenizer(format!(
                        "tokenizer_config.json: {what} '{t}' is not in the vocabulary"
                    ))
                }),
            }
        };
        let bos_id = lookup(&config.bos_token, "bos_token")?;
        let eos_id = lookup(&config.eos_token, "eos_token")?;
        let bos = match config.add_bos_token {
            Some(flag) => BosPolicy::Prepend(flag),
            None => BosPolicy::PostProcessor,
        };
        if bos == BosPolicy::Prepend(true) && bos_id.is_none() {
            return Err(ModelError::Tokenizer(
                "tokenizer_config.json: add_bos_token is true but no bos_token is given".into(),
            ));
        }
        Ok(Tokenizer {
            inner,
            bos_id,
            eos_id,
            bos,
            chat_template,
        })
    }

    /// Builds the tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata.
    ///
    /// Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE) with the pre-tokenizers in
    /// [`SUPPORTED_GGUF_PRE`], and `"llama"` (SentencePiece BPE: the pieces, their scores and
    /// types); anything else is refused with [`ModelError::Tokenizer`].
    /// `tokenizer.ggml.add_bos_token` decides whether [`Tokenizer::encode`] prepends BOS
    /// (absent: no BOS for a byte-level vocabulary, BOS for a SentencePiece one, as
    /// transformers does).
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer, ModelError> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let token_types = if gguf.contains_key("tokenizer.ggml.token_type") {
            // The length first: the array is read only when it matches the vocabulary.
            let (_, n) = gguf.get_array_len("tokenizer.ggml.token_type")?;
            if n != tokens.len() {
                return Err(ModelError::Tokenizer(format!(
                    "tokenizer.ggml.token_type has {n} entries but tokenizer.ggml.tokens has {}",
                    tokens.len()
                )));
            }
            gguf.get_i64_array("tokenizer.ggml.token_type")?
        } else {
            Vec::new()
        };
        let n_tokens = u32::try_from(tokens.len()).map_err(|_| {
            ModelError::Tokenizer(format!("vocabulary too large: {} tokens", tokens.len()))
        })?;
        let alphabet = byte_level_alphabet();
        let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
        let (mut inner, byte_level) = match model {
            "gpt2" => (byte_level_model(gguf, &tokens)?, true),
            "llama" => (spm::sentencepiece_model(gguf, &tokens)?, false),
            _ => {
                return Err(ModelError::Tokenizer(format!(
                    "unsupported GGUF tokenizer 'tokenizer.ggml.model' = '{model}' (supported: {})",
                    SUPPORTED_GGUF_MODELS.join(", ")
                )));
            }
        };

        let bos_id = optional_u32(gguf, "tokenizer.ggml.bos_token_id")?;
        let eos_id = optional_u32(gguf, "tokenizer.ggml.eos_token_id")?;
        let unk_id = optional_u32(gguf, "tokenizer.ggml.unknown_token_id")?;
        let pad_id = optional_u32(gguf, "tokenizer.ggml.padding_token_id")?;
        for (key, id) in [
            ("bos_token_id", bos_id),
            ("eos_token_id", eos_id),
            ("unknown_token_id", unk_id),
            ("padding_token_id", pad_id),
        ] {
            if let Some(id) = id
                && id >= n_tokens
            {
                return Err(ModelError::Tokenizer(format!(
                    "tokenizer.ggml.{key} = {id} is outside the vocabulary of {n_tokens} tokens"
                )));
            }
        }

        // Special tokens: control tokens (in a byte-level vocabulary only those written in its
        // alphabet: others are llama.cpp mislabels and would grow the vocabulary), plus the
        // named BOS/EOS/UNK/PAD tokens, as transformers does. User-defined tokens become plain
        // added tokens.
        let mut special: Vec<AddedToken> = Vec::new();
        let mut user: Vec<AddedToken> = Vec::new();
        for ((id, t), ty) in (0u32..)
            .zip(&tokens)
            .zip(token_types.iter().map(Some).chain(std::iter::repeat(None)))
        {
            let named = [bos_id, eos_id, unk_id, pad_id].contains(&Some(id));
            let written_ok = !byte_level || in_alphabet(t);
            if (ty == Some(&TOKEN_TYPE_CONTROL) || named) && written_ok {
                special.push(AddedToken::from((*t).to_string(), true).normalized(false));
            } else if ty == Some(&TOKEN_TYPE_USER_DEFINED) && written_ok {
                user.push(AddedToken::from((*t).to_string(), false).normalized(false));
            }
        }
        inner.add_special_tokens(&special);
        inner.add_tokens(&user);

        // Absent: a SentencePiece vocabulary prepends BOS (llama.cpp and transformers both),
        // a byte-level one does not.
        let add_bos = if gguf.contains_key("tokenizer.ggml.add_bos_token") {
            gguf.get_bool("tokenizer.ggml.add_bos_token")?
        } else {
            !byte_level
        };
        if add_bos && bos_id.is_none() {
            return Err(ModelError::Tokenizer(
                "tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is absent"
                    .into(),
            ));
        }
        let chat_template = match gguf.get("tokenizer.chat_template") {
            None => None,
            Some(GgufValue::String(s)) => Some(s.clone()),
            Some(v) => {
                return Err(ModelError::KeyType {
                    key: "tokenizer.chat_template".into(),
                    expected: "string".into(),
                    found: v.type_description(),
                });
            }
        };
        Ok(Tokenizer {
            inner,
            bos_id,
            eos_id,
            bos: BosPolicy::Prepend(add_bos),
            chat_template,
        })
    }

    /// Encodes text to token ids exactly as HF transformers' `tokenizer(text)["input_ids"]`
    /// does for this model: special and added tokens are recognised inside the text, and BOS
    /// is prepended when the model asks for it ([`Tokenizer::adds_bos`]).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let post_process = self.bos == BosPolicy::PostProcessor;
        let encoding = self
            .inner
            .encode(text, post_process)
            .map_err(|e| tok_err("encode", e))?;
        let ids = encoding.get_ids();
        match (self.bos, self.bos_id) {
            (BosPolicy::Prepend(true), Some(bos)) => {
                let mut out = Vec::with_capacity(ids.len() + 1);
                out.push(bos);
                out.extend_from_slice(ids);
                Ok(out)
            }
            _ => Ok(ids.to_vec()),
        }
    }

    /// Whether [`Tokenizer::encode`] prepends the BOS token by itself (`None` when the
    /// `tokenizer.json` post-processor decides and the config does not say).
    pub fn adds_bos(&self) -> Option<bool> {
        match self.bos {
            BosPolicy::Prepend(flag) => Some(flag && self.bos_id.is_some()),
            BosPolicy::PostProcessor => None,
        }
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), ModelError> {
        for (i, &id) in ids.iter().enumerate() {
            if self.inner.id_to_token(id).is_none() {
                return Err(ModelError::Tokenizer(format!(
                    "decode: token id {id} at position {i} is not in the vocabulary ({} tokens)",
                    self.vocab_size()
                )));
            }
        }
        Ok(())
    }

    /// Decodes ids to text, special tokens kept (like HF `decode(ids)` with default
    /// arguments). An id outside the vocabulary is an error, not silently dropped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.check_ids(ids)?;
        self.inner
            .decode(ids, false)
            .map_err(|e| tok_err("decode", e))
    }

    /// A streaming decoder: feed ids one at a time, get each newly completed piece of text.
    pub fn decode_stream(&self) -> DecodeStream<'_> {
        DecodeStream {
            tokenizer: self,
            ids: Vec::new(),
            prefix: String::new(),
            pending: false,
        }
    }

    /// Number of token ids (base vocabulary plus added tokens).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The BOS (beginning-of-sequence) token id, if the model names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The EOS (end-of-sequence) token id, if the model names one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Ids at which generation should stop: EOS first, then the end-of-turn / end-of-text
    /// tokens present in the vocabulary (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, …),
    /// without duplicates.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self.eos_id.into_iter().collect();
        for t in END_OF_TURN_TOKENS {
            if let Some(id) = self.inner.token_to_id(t)
                && !out.contains(&id)
            {
                out.push(id);
            }
        }
        out
    }

    /// The id of a token text (as the vocabulary writes it), if present.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token text (as the vocabulary writes it) of an id, if present.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The bytes a token stands for, which its decoded text alone may not show (a byte-level
    /// token inside a multi-byte character decodes to U+FFFD): a byte-level vocabulary's
    /// characters mapped back to their bytes, a SentencePiece byte token (`<0x0A>`) as its
    /// byte, `▁` as a space; special and added tokens as their text. `None` outside the
    /// vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let token = self.inner.id_to_token(id)?;
        let byte_level = matches!(
            self.inner.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        );
        if byte_level {
            let inverse = byte_level_inverse();
            let bytes: Option<Vec<u8>> = token.chars().map(inverse).collect();
            return Some(bytes.unwrap_or_else(|| token.into_bytes()));
        }
        let hex = (token.strip_prefix("<0x"))
            .and_then(|r| r.strip_suffix('>'))
            .filter(|h| h.len() == 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        Some(match hex {
            Some(b) => vec![b],
            None => token.replace('\u{2581}', " ").into_bytes(),
        })
    }

    /// The model's chat template (Jinja source), if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The wrapped `tokenizers` tokenizer, for anything this wrapper does not expose.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Renders a conversation (`(role, content)` pairs) with the model's chat template, as
    /// transformers' `apply_chat_template` does ([`crate::chat`]): the template's own Jinja,
    /// with the model's BOS and EOS tokens; `add_generation_prompt` opens the assistant's turn
    /// where the template has one.
    pub fn apply_chat_template(
        &self,
        messages: &[(&str, &str)],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| ModelError::Tokenizer("the model has no chat template".to_string()))?;
        let token = |id: Option<u32>| id.and_then(|i| self.inner.id_to_token(i));
        let (bos, eos) = (token(self.bos_id), token(self.eos_id));
        crate::chat::render(
            template,
            &crate::chat::Conversation {
                messages,
                add_generation_prompt,
                bos_token: bos.as_deref(),
                eos_token: eos.as_deref(),
            },
        )
    }
}

/// Incremental decoding for streaming generation: [`DecodeStream::step`] takes one id and
/// returns the text it completes, holding back bytes of an unfinished UTF-8 character (a
/// byte-level token may end mid-character) until a later id completes it.
///
/// The pieces returned by `step`, followed by [`DecodeStream::finish`], concatenate to
/// [`Tokenizer::decode`] of all the ids.
#[derive(Debug)]
pub struct DecodeStream<'a> {
    tokenizer: &'a Tokenizer,
    /// Ids of the current window: those already emitted (whose text is `prefix`) followed by
    /// those not yet emitted.
    ids: Vec<u32>,
    /// Decoded text of the emitted part of the window.
    prefix: String,
    /// Whether the window holds ids whose text has not been returned yet.
    pending: bool,
}

impl DecodeStream<'_> {
    /// Adds one id; returns the newly completed text, or `None` while the text still ends in
    /// an unfinished character. An id outside the vocabulary is an error (the stream is left
    /// as it was).
    pub fn step(&mut self, id: u32) -> Result<Option<String>, ModelError> {
        self.tokenizer.check_ids(&[id])?;
        self.ids.push(id);
        self.pending = true;
        let text = self.tokenizer.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        self.emit(text).map(Some)
    }

    fn emit(&mut self, text: String) -> Result<String, ModelError> {
        let piece = text.strip_prefix(self.prefix.as_str()).ok_or_else(|| {
            ModelError::Tokenizer(format!(
                "decode stream: text {text:?} does not continue the emitted {:?}",
                self.prefix
            ))
        })?;
        let piece = piece.to_string();
        // Keep only the last id as context for the next piece (enough for byte-level
        // decoding, where the text of a complete-character boundary never changes).
        if let Some(&last) = self.ids.last() {
            self.ids.clear();
            self.ids.push(last);
            self.prefix = self.tokenizer.decode(&self.ids)?;
        }
        self.pending = false;
        Ok(piece)
    }

    /// Returns whatever is still held back (an unfinished character decodes to U+FFFD, as in
    /// [`Tokenizer::decode`]); `None` when nothing is pending.
    pub fn finish(&mut self) -> Result<Option<String>, ModelError> {
        if !self.pending {
            return Ok(None);
        }
        let text = self.tokenizer.decode(&self.ids)?;
        self.emit(text).map(Some)
    }
}
