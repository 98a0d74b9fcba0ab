//! Device library `tile`: the weight-streaming linear tile: the vector loop that streams weight
//! rows against one row of activations (fp, int8/int4 weights), the fused tiles' row preparation
//! and epilogues. GEMV_TILE, GEMM_TILE, RMSNORM_GEMV, GATE_UP_SILU, QKV_ROPE_APPEND, COMBINE_GEMV
//! and ATTENTION_GEMV run it.
//!
//! Not an opcode: CUDA source that several op crates' device functions call, registered with
//! the registry ([`amk_core::DeviceLibrary`]) so that a backend learns of it as it learns of
//! the ops. An op crate that calls it depends on this crate, so linking the op links it.

/// The library's CUDA source (`amk_tile.cuh`).
pub const CUDA: &str = include_str!("amk_tile.cuh");

amk_core::inventory::submit! {
    amk_core::DeviceLibrary {
        name: "tile",
        file: "ops/oplib-tile/src/amk_tile.cuh",
        order: 10,
        cuda: CUDA,
    }
}
