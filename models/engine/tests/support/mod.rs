//! What the engine's CPU tests share: the op registry and a tiny random Llama (its
//! configuration the lowering tests' toy one, `models/llama/tests/support/shared.rs`).

#![allow(dead_code, clippy::unwrap_used)]

#[path = "../../../llama/tests/support/shared.rs"]
mod shared;

use amk_model_llama::Model;
pub use shared::registry;

/// A two-layer GQA Llama (4 heads, 2 KV heads of 8) with 40 tokens and random weights.
pub fn tiny() -> Model {
    Model::random(shared::cfg(2, 32, 4, 2, 8, 48, 40), 7).unwrap()
}
