//! Llama-family model support for amk.
//!
//! Today: the GGUF reader ([`gguf`]: metadata, tensor infos, alignment, dequantisation of
//! F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K tensors to `F32` on load), a small GGUF writer for
//! tests ([`gguf::write`]), and the inverse of llama.cpp's convert-time Q/K row permutation
//! ([`permute`]). The importer and the lowering come later.

pub mod chat;
pub mod config;
pub mod error;
pub mod gguf;
pub mod gguf_import;
pub mod hf;
pub mod lower;
pub mod model;
pub mod permute;
pub mod presets;
pub mod safetensors;
pub mod tokenizer;

pub use error::ModelError;
pub use gguf::{GgmlType, GgufFile, GgufValue, TensorInfo, ValueType};
pub use model::{Model, ModelFormat};
pub use permute::{permute_qk, unpermute_qk};
pub use tokenizer::Tokenizer;
