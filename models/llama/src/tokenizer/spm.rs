//! SentencePiece vocabularies in GGUF files (`tokenizer.ggml.model = "llama"`: Llama 2,
//! TinyLlama, Mistral and others), built as transformers builds them from the same metadata
//! (`LlamaTokenizer` with `gguf_file`): a BPE over the pieces as the file spells them (`▁` for a
//! space, `<0xXX>` for the byte pieces) with byte fallback, its merges taken from the file or,
//! as SentencePiece files have none, recovered from the pieces' scores; a `Metaspace`
//! pre-tokenizer that writes spaces as `▁` and prepends one to the text's first piece; a decoder
//! that undoes both.
//!
//! Why the merges can be recovered: a SentencePiece BPE model merges, at each step, the pair
//! whose result has the highest score, so every split of a piece into two pieces of the
//! vocabulary, ordered by the piece's score, is the merge list that reproduces it.

use std::collections::HashMap;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};

use super::tok_err;
use crate::error::ModelError;
use crate::gguf::GgufFile;

/// The character SentencePiece writes for a space.
const SPACE: char = '\u{2581}';

/// The merges a SentencePiece vocabulary implies, as transformers' `generate_merges` derives
/// them: for each distinct piece (in the file's order, with its last score), every split into
/// a left and a right piece that are both in the vocabulary, the splits of one piece ordered by
/// the ids of their halves; then all of them by descending (score, left length, right length),
/// ties kept in that order. Lengths count characters; a piece listed twice has its last id.
pub fn merges_from_scores(tokens: &[&str], scores: &[f32]) -> Vec<(String, String)> {
    let mut id: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        id.insert(t, i);
    }
    let mut score: HashMap<&str, f32> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (t, s) in tokens.iter().zip(scores) {
        if score.insert(t, *s).is_none() {
            order.push(t);
        }
    }
    struct Merge<'a> {
        left: &'a str,
        right: &'a str,
        score: f32,
    }
    let mut merges: Vec<Merge<'_>> = Vec::new();
    for piece in order {
        let first = merges.len();
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if id.contains_key(left) && id.contains_key(right) {
                merges.push(Merge {
                    left,
                    right,
                    score: score[piece],
                });
            }
        }
        merges[first..].sort_by_key(|m| (id[m.left], id[m.right]));
    }
    let chars = |s: &str| s.chars().count();
    // A total order whatever the scores (a NaN from a hostile file made the comparison
    // inconsistent, which the sort reports by panicking; found by the fuzz target): `total_cmp`
    // with -0.0 taken as 0.0 (`+ 0.0`), so finite scores order as Python's sort does.
    merges.sort_by(|a, b| {
        (b.score + 0.0)
            .total_cmp(&(a.score + 0.0))
            .then_with(|| chars(b.left).cmp(&chars(a.left)))
            .then_with(|| chars(b.right).cmp(&chars(a.right)))
    });
    merges
        .into_iter()
        .map(|m| (m.left.to_string(), m.right.to_string()))
        .collect()
}

/// The merges the file lists (`tokenizer.ggml.merges`, "left right" each), if it lists them.
fn file_merges(gguf: &GgufFile) -> Result<Option<Vec<(String, String)>>, ModelError> {
    if !gguf.contains_key("tokenizer.ggml.merges") {
        return Ok(None);
    }
    let raw = gguf.get_str_array("tokenizer.ggml.merges")?;
    super::parse_merges(&raw).map(Some)
}

/// The tokenizer (model, pre-tokenizer, decoder) of a SentencePiece GGUF vocabulary `tokens`;
/// the caller adds the special tokens. Needs `tokenizer.ggml.scores` when the file lists no
/// merges. `tokenizer.ggml.add_space_prefix` is not read: transformers always prepends the
/// space, and so does this.
pub(super) fn sentencepiece_model(
    gguf: &GgufFile,
    tokens: &[&str],
) -> Result<tokenizers::Tokenizer, ModelError> {
    let merges = match file_merges(gguf)? {
        Some(m) => m,
        None => {
            // The length first: the array is read only when it matches the vocabulary.
            let (_, n) = gguf.get_array_len("tokenizer.ggml.scores")?;
            if n != tokens.len() {
                return Err(ModelError::Tokenizer(format!(
                    "tokenizer.ggml.scores has {n} entries but tokenizer.ggml.tokens has {}",
                    tokens.len()
                )));
            }
            let scores = gguf.get_f32_array("tokenizer.ggml.scores")?;
            merges_from_scores(tokens, &scores)
        }
    };
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, t) in (0u32..).zip(tokens) {
        vocab.insert((*t).to_string(), id);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(|e| tok_err("building the SentencePiece BPE from tokenizer.ggml.*", e))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(Metaspace::new(SPACE, PrependScheme::First, false)));
    let replace = Replace::new(SPACE.to_string(), " ")
        .map_err(|e| tok_err("the SentencePiece decoder", e))?;
    inner.with_decoder(Some(DecoderSequence::new(vec![
        DecoderWrapper::Replace(replace),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
        DecoderWrapper::Strip(Strip::new(' ', 1, 0)),
    ])));
    Ok(inner)
}
