//! Device library `logits`: one block's passes over a run of one logits row (the first-largest
//! valid logit with the count of valid ids, the sum of exp(l - max)): NEXT_TOKEN and LOGIT_STATS
//! reduce logits with them.
//!
//! Not an opcode: CUDA source that several op crates' device functions call, registered with
//! the registry ([`amk_core::DeviceLibrary`]) so that a backend learns of it as it learns of
//! the ops. An op crate that calls it depends on this crate, so linking the op links it.

/// The library's CUDA source (`amk_logits.cuh`).
pub const CUDA: &str = include_str!("amk_logits.cuh");

amk_core::inventory::submit! {
    amk_core::DeviceLibrary {
        name: "logits",
        file: "ops/oplib-logits/src/amk_logits.cuh",
        order: 30,
        cuda: CUDA,
    }
}
