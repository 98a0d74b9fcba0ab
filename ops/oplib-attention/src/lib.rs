//! Device library `attention`: the decode attention over a window of cache rows (amk_att_setup,
//! amk_att_run) and its per-lane helpers: ATTENTION_TILE, ATTENTION_GEMV, ATTENTION_SPLIT,
//! ATTENTION_MERGE and COMBINE_GEMV use it.
//!
//! Not an opcode: CUDA source that several op crates' device functions call, registered with
//! the registry ([`amk_core::DeviceLibrary`]) so that a backend learns of it as it learns of
//! the ops. An op crate that calls it depends on this crate, so linking the op links it.

/// The library's CUDA source (`amk_attention.cuh`).
pub const CUDA: &str = include_str!("amk_attention.cuh");

amk_core::inventory::submit! {
    amk_core::DeviceLibrary {
        name: "attention",
        file: "ops/oplib-attention/src/amk_attention.cuh",
        order: 20,
        cuda: CUDA,
    }
}
