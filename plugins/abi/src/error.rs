//! Why a plugin was refused.

use std::path::PathBuf;

/// Why loading a plugin failed. Nothing is registered when loading fails.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The path names no file.
    #[error("plugin {path}: no such file")]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The dynamic loader refused the file (not a shared library, wrong architecture, missing
    /// dependencies).
    #[error("plugin {path}: cannot load it as a shared library: {reason}")]
    Load {
        /// The path given.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library exports no entry symbol of this ABI version.
    #[error("plugin {path}: no entry symbol '{symbol}' (not an amk plugin)")]
    MissingEntry {
        /// The path given.
        path: PathBuf,
        /// The symbol looked up.
        symbol: String,
    },
    /// The descriptor was built for another ABI version.
    #[error("plugin {path}: built for ABI version {found}, this amk speaks version {expected}")]
    AbiVersion {
        /// The path given.
        path: PathBuf,
        /// The version in the descriptor (or of the entry symbol found).
        found: u32,
        /// Ours.
        expected: u32,
    },
    /// A struct's size differs from ours (the plugin was built against another layout).
    #[error("plugin {path}: {what} is {found} bytes, this amk expects {expected}")]
    StructSize {
        /// The path given.
        path: PathBuf,
        /// Which struct.
        what: &'static str,
        /// Size the plugin declared.
        found: u32,
        /// Ours.
        expected: u32,
    },
    /// A null pointer, an absurd count or length, a bad name or param type.
    #[error("plugin {path}: malformed descriptor: {why}")]
    Malformed {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A string of the descriptor is not UTF-8.
    #[error("plugin {path}: {what} is not valid UTF-8")]
    NonUtf8 {
        /// The path given.
        path: PathBuf,
        /// Which string.
        what: String,
    },
    /// An op requests a code reserved for built-in opcodes.
    #[error("plugin {path}: op '{op}' requests code {code}; plugin codes must be ≥ {min}")]
    CodeTooLow {
        /// The path given.
        path: PathBuf,
        /// The op.
        op: String,
        /// Its code.
        code: u32,
        /// The first plugin code.
        min: u32,
    },
    /// The registry refused an op (duplicate name or code, bad arity or param type).
    #[error("plugin {path}: {source}")]
    Registry {
        /// The path given.
        path: PathBuf,
        /// The registry's reason.
        source: amk_core::IrError,
    },
}
