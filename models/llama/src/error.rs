//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong reading a model file or transforming its tensors.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The first four bytes (fewer if the file is shorter).
        found: Vec<u8>,
    },
    /// A GGUF version this reader does not know (only 2 and 3 are supported).
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// The file ends before a structure it announces.
    #[error("truncated GGUF: {what} at byte {offset} needs {need} bytes, but the file has {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where it starts.
        offset: u64,
        /// How many bytes it needs.
        need: u64,
        /// The file length.
        len: u64,
    },
    /// The file is malformed (absurd counts, bad value types, invalid UTF-8, misaligned or
    /// overlapping data, duplicate names, …).
    #[error("corrupt GGUF: {0}")]
    Corrupt(String),
    /// A tensor type this reader cannot dequantise.
    #[error("tensor '{tensor}': unsupported tensor type {type_name} (ggml type {code})")]
    UnsupportedTensorType {
        /// Tensor name.
        tensor: String,
        /// ggml type name (or "unknown").
        type_name: String,
        /// ggml type code.
        code: u32,
    },
    /// No tensor of that name.
    #[error("no tensor named '{0}'")]
    MissingTensor(String),
    /// No metadata key of that name.
    #[error("missing metadata key '{0}'")]
    MissingKey(String),
    /// A metadata value has a different type than asked for.
    #[error("metadata key '{key}': expected {expected}, found {found}")]
    KeyType {
        /// Key.
        key: String,
        /// What the caller asked for.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// Weights holding NaN or infinity: a corrupt or mis-converted checkpoint (the model would
    /// compute nothing meaningful, e.g. one token over and over).
    #[error("non-finite weights (NaN or infinity), a corrupt checkpoint: {}", tensors.join("; "))]
    NonFinite {
        /// One line per tensor: its name, the first such element and how many there are.
        tensors: Vec<String>,
    },
    /// A tensor has a shape the operation cannot accept.
    #[error("shape error: {0}")]
    Shape(String),
    /// A model configuration this crate cannot run, with every reason found (not just the first).
    #[error("unsupported model configuration: {}", reasons.join("; "))]
    Unsupported {
        /// Each unsupported feature or inconsistency, one per entry.
        reasons: Vec<String>,
    },
    /// A HuggingFace `config.json` that is not valid JSON (or not an object).
    #[error("config.json: {0}")]
    ConfigJson(String),
    /// A required key is missing from a HuggingFace `config.json`.
    #[error("config.json: missing required key '{0}'")]
    MissingConfigKey(String),
    /// A HuggingFace `config.json` key holds a value of the wrong type or range.
    #[error("config.json: key '{key}': expected {expected}, found {found}")]
    ConfigKeyType {
        /// Key (dotted for nested keys).
        key: String,
        /// What was expected.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// A safetensors file (or its shard index) is malformed: truncated, bad header, offsets
    /// out of range, unknown dtype, a tensor listed twice.
    #[error("{path}: not a valid safetensors checkpoint: {message}")]
    Safetensors {
        /// File.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The tokenizer could not be built or could not encode/decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A model shape name no preset has.
    #[error("unknown model shape '{name}' (known: {known})")]
    UnknownShape {
        /// The name asked for.
        name: String,
        /// The preset names, comma-separated.
        known: String,
    },
    /// The model cannot be lowered with the requested options (and why).
    #[error("lowering: {0}")]
    Lower(String),
    /// A lowered program failed validation (the validator's report).
    #[error("the lowered program was rejected by the validator:\n{0}")]
    Invalid(String),
    /// The backend failed to load or run the program.
    #[error("backend: {0}")]
    Backend(#[from] amk_core::BackendError),
    /// The sequence does not fit the KV cache.
    #[error(
        "the sequence needs more than the KV cache's {max_seq} positions (raise --max-seq, up to the model's max_position_embeddings)"
    )]
    ContextFull {
        /// KV-cache length.
        max_seq: u64,
    },
    /// Decoding was asked for something impossible (a token id outside the vocabulary, an
    /// empty prompt, bad sampling settings).
    #[error("decoding: {0}")]
    Run(String),
}
