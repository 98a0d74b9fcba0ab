//! The one error type of the crate.

use std::path::PathBuf;

/// Everything that can go wrong while locating, downloading, verifying or extracting a model.
///
/// Each message says what to do about it; the network-facing ones mention
/// `AMK_MODEL_CACHE` and the path where the file can be placed by hand.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No cache directory could be determined (no `AMK_MODEL_CACHE`, `XDG_CACHE_HOME` or `HOME`).
    #[error(
        "cannot determine a model cache directory: set AMK_MODEL_CACHE (or XDG_CACHE_HOME / HOME) to a writable directory"
    )]
    NoCacheDir,

    /// A filesystem operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done ("creating", "reading", ...).
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The server could not be reached or the transfer broke off.
    #[error(
        "downloading {url} failed: {message}\n  check the network (or HTTPS proxy / SSL_CERT_FILE) and retry; an interrupted download resumes from {}\n  offline: place the extracted file at {} yourself, or point AMK_MODEL_CACHE at a directory that already holds it",
        part.display(), target.display()
    )]
    Network {
        /// The URL being fetched.
        url: String,
        /// What the HTTP client reported.
        message: String,
        /// The partial download that a retry continues.
        part: PathBuf,
        /// Where the extracted model is expected.
        target: PathBuf,
    },

    /// The server answered with an unexpected HTTP status.
    #[error(
        "downloading {url} failed: HTTP status {status}\n  retry later, or place the extracted file at {} yourself (AMK_MODEL_CACHE selects the cache directory)",
        target.display()
    )]
    HttpStatus {
        /// The URL being fetched.
        url: String,
        /// The status code received.
        status: u16,
        /// Where the extracted model is expected.
        target: PathBuf,
    },

    /// The downloaded archive has the wrong size.
    #[error(
        "downloaded {url} has {actual} bytes, expected {expected}; the partial file was deleted, retry to download it again"
    )]
    SizeMismatch {
        /// The URL fetched.
        url: String,
        /// The pinned size.
        expected: u64,
        /// The size received.
        actual: u64,
    },

    /// The downloaded archive does not have the pinned sha256.
    #[error(
        "sha256 mismatch for {url}: expected {expected}, got {actual}; the download was deleted, retry (if it persists the upstream file changed or a proxy rewrote it)"
    )]
    ChecksumMismatch {
        /// The URL fetched.
        url: String,
        /// The pinned digest (lower-case hex).
        expected: String,
        /// The digest of what was received (lower-case hex).
        actual: String,
    },

    /// The archive does not contain the requested member.
    #[error("{} does not contain {member}; check FetchOptions::member against the archive listing", archive.display())]
    MemberNotFound {
        /// The archive searched.
        archive: PathBuf,
        /// The member path asked for.
        member: String,
    },

    /// The archive is not a zip this reader understands, or its data is corrupt.
    #[error("{} is not a readable zip archive: {reason}; delete it and retry", archive.display())]
    BadArchive {
        /// The archive read.
        archive: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl FetchError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
