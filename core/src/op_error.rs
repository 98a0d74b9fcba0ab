//! `OpError`: why an op's CPU reference (or a tensor conversion it makes) refused a call.
//! Its own floor, below the tensors and the call contract that both return it.

/// Why an op's reference implementation refused a call. Never a panic: every shape, dtype,
/// parameter and index problem is one of these.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpError {
    /// Wrong number of inputs or outputs.
    #[error("expected {expected} {what}, got {got}")]
    Arity {
        /// `inputs` or `outputs`.
        what: &'static str,
        /// What the op takes (e.g. `2..3`).
        expected: String,
        /// What it got.
        got: usize,
    },
    /// A required param is missing.
    #[error("missing param '{0}'")]
    MissingParam(String),
    /// A param has the wrong type or an unusable value.
    #[error("param '{key}': {why}")]
    BadParam {
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// Operand shapes do not fit the op.
    #[error("shape: {0}")]
    Shape(String),
    /// Operand dtypes do not fit the op.
    #[error("dtype: {0}")]
    DType(String),
    /// An index read from a tensor (a token id, a position) is out of range.
    #[error("index {value} at element {at} is out of range [0, {limit})")]
    IndexOutOfRange {
        /// Element of the index tensor.
        at: usize,
        /// The index read.
        value: i64,
        /// Exclusive upper bound.
        limit: u64,
    },
    /// An input that is also an output was read as an ordinary input (the caller passes it
    /// as [`crate::cpu::Input::InPlace`] only for ops that declared the pair).
    #[error("input {0} is written in place; it cannot be read as a separate tensor")]
    InPlaceInput(usize),
    /// A FUSED recipe could not run.
    #[error("recipe: {0}")]
    Recipe(String),
    /// An op loaded from a plugin returned a non-zero status.
    #[error("plugin op returned status {status}: {message}")]
    Plugin {
        /// The status the plugin returned.
        status: i32,
        /// The message it wrote (empty if none).
        message: String,
    },
}
