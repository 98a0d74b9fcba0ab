//! `IrError`: everything that can go wrong reading, writing or registering (validation
//! findings are not errors: they are data in a `ValidationResult`).

use std::path::PathBuf;

/// Errors of `amk-core`.
#[derive(Debug, thiserror::Error)]
pub enum IrError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A path that is not a regular file (a directory, a device, a FIFO that would block).
    #[error("{path}: not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// A file, or its decompressed content, beyond the size the reader accepts.
    #[error(
        "{path}: {what} is over the {limit}-byte limit (the CLI's --max-program-mib raises it)"
    )]
    TooLarge {
        /// File.
        path: PathBuf,
        /// `the file` or `the decompressed program`.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// A `.gz` file is not valid gzip.
    #[error("{path}: not a valid gzip stream: {source}")]
    Gzip {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Not valid UTF-8 text.
    #[error("not UTF-8 text (byte {offset}): a program file must be UTF-8 JSON")]
    Encoding {
        /// First bad byte.
        offset: usize,
    },
    /// Not valid JSON (or refused JSON: duplicate keys, non-finite numbers).
    #[error("{0}")]
    Json(#[from] crate::json::ParseError),
    /// Valid JSON that is not a valid program; `path` is the JSON path of the problem.
    #[error("{path}: {message}")]
    Field {
        /// JSON path (`$.tasks[3].waits[0].threshold`).
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A major version this build does not read.
    #[error(
        "{path}: {what} major version mismatch: file has {found:?}, this build reads {supported}"
    )]
    Version {
        /// JSON path.
        path: String,
        /// `IR` or `ABI`.
        what: &'static str,
        /// Version found.
        found: String,
        /// Version supported.
        supported: &'static str,
    },
    /// An op registration was refused.
    #[error("registry: {0}")]
    Registry(String),
    /// A program could not be written (an op code with no name in the registry).
    #[error("cannot serialise: {0}")]
    Serialize(String),
}
