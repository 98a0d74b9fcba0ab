//! The crate's one error type.

/// What can go wrong loading a decode program or generating with it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model could not be imported or lowered.
    #[error("{0}")]
    Model(#[from] amk_model_llama::ModelError),
    /// The lowered program was rejected by the validator (a bug in the lowering).
    #[error("the lowered program was rejected by the validator:\n{0}")]
    Invalid(String),
    /// The program lacks part of the decode loop's interface (`amk_core::decode`).
    #[error("not a decode-loop program: {0}")]
    Interface(String),
    /// The backend failed to load or run the program.
    #[error("backend: {0}")]
    Backend(#[from] amk_core::BackendError),
    /// The request cannot be served as asked (an empty prompt, a token id outside the
    /// vocabulary, too many stop tokens, sampling settings out of range).
    #[error("{0}")]
    Request(String),
    /// The prompt does not fit the KV cache.
    #[error(
        "the prompt's {prompt} tokens do not fit the KV cache of {max_seq} positions (raise --max-seq, up to the model's max_position_embeddings)"
    )]
    ContextFull {
        /// Prompt tokens.
        prompt: usize,
        /// KV-cache length.
        max_seq: u64,
    },
}
