//! `amk-conformance`: the validator soundness suite's building blocks.
//!
//! - `r#gen` (`src/gen/`): seeded generators of valid programs (several families, plus a
//!   Llama-like decode lowering and the benchmark presets, re-exported here);
//! - [`mutate`]: single-defect mutants, one per validator error kind;
//! - [`oracle`]: an independent dynamic oracle (a counter-machine simulator exploring
//!   adversarial interleavings) that says whether a program is actually unsafe.
//!
//! `tests/soundness.rs` ties them together: valid programs must be accepted, mutants rejected
//! with their intended kind, and nothing the oracle finds unsafe may be accepted.

// `gen` is a reserved word in edition 2024, hence the raw identifier for `src/gen/`.
pub mod conformance;
pub mod r#gen;
pub mod mutate;
pub mod oracle;

pub use r#gen::{
    LlamaConfig, PRESET_3K_TASKS, PRESET_20K_TASKS, llama_like, llama_like_with, preset_3k,
    preset_20k,
};
