//! The importer contract: turn a checkpoint on disk into a model a lowering can consume.
//!
//! The model type is the importer's own (an associated type), so `core` stays free of any
//! architecture's details; what every importer shares is the shape of the job: recognise a
//! path cheaply, then import it or refuse it with every reason at once.

use std::path::Path;

/// A model-file importer (HF directory, GGUF file, …).
pub trait Importer {
    /// What a successful import yields.
    type Model;
    /// What a failed import reports.
    type Error: std::error::Error;
    /// Short name (`hf`, `gguf`).
    fn name(&self) -> &'static str;
    /// Whether `path` looks like this importer's format (cheap: names and magic bytes only).
    fn probe(&self, path: &Path) -> bool;
    /// Reads and checks the model at `path`. Unsupported architectures are refused with every
    /// reason listed, never imported half-way.
    fn import(&self, path: &Path) -> Result<Self::Model, Self::Error>;
}
