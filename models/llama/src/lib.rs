//! Llama-family model support for amk: the importers of HuggingFace directories ([`hf`],
//! safetensors in [`safetensors`]) and GGUF files ([`gguf`], [`gguf_import`]: metadata, tensor
//! infos, dequantisation of F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K tensors, the inverse of
//! llama.cpp's Q/K row permutation in [`permute`]), whichever a path is ([`importer_for`]);
//! the [`Model`] they yield, its tokenizer and chat template ([`tokenizer`], [`chat`]), and the
//! lowering to decode and prefill programs ([`lower`]).

pub mod chat;
pub mod config;
pub mod error;
pub mod gguf;
pub mod gguf_import;
pub mod hf;
mod import;
pub mod lower;
pub mod model;
pub mod permute;
pub mod presets;
pub mod safetensors;
pub mod tokenizer;

pub use error::ModelError;
pub use gguf::{GgmlType, GgufFile, GgufValue, ScalarArray, TensorInfo, ValueType};
pub use import::importer_for;
pub use model::{Model, ModelFormat};
pub use permute::{permute_qk, unpermute_qk};
pub use tokenizer::Tokenizer;
