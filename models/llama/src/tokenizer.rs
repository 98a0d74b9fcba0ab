//! The tokenizer: a thin, typed wrapper over the `tokenizers` crate.

/// A text ↔ token-id codec.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}
