//! Seeded generators of **valid** programs, built only through the core API
//! (`Program::new_buffer` / `new_weight` / `new_counter` / `push_task`) with real op shapes and
//! params, so every program passes each op's shape rule.
//!
//! Families ([`Family`]): linear chains, fan-in joins (several producers on one counter, the
//! consumer waits for all of them), tiled GEMV/GEMM groups (disjoint column — and row — tiles of
//! one buffer sharing one counter), KV_APPEND → ATTENTION_TILE, split-KV shards +
//! ATTENTION_COMBINE, SM-assigned programs (each SM queue, in task-list order, is a linear
//! extension of the DAG), paged programs (ACTIVATION buffers share a page only when their live
//! ranges are happens-before separated) and random mixtures of all of these.
//!
//! [`llama_like`] / [`llama_like_with`] build a decode program shaped like the reference
//! lowering (docs/models.md, "The reference lowering"), optionally with round-robin SM
//! assignment and graph-colour page sharing; [`preset_3k`] and [`preset_20k`] are the
//! benchmark sizes.
//!
//! Every generator emits tasks in a topological order (a consumer is pushed after all its
//! producers); SM assignment relies on it.
//!
//! One file per concern: `rng` (seeded randomness), `params` (param objects), `hb` (the
//! happens-before relation), `passes` (SM assignment, on-chip buffers, pages), `motif` (the
//! motif builder), `families` (the families) and `llama` (the Llama-like lowering, presets).

mod families;
mod hb;
mod llama;
mod motif;
mod params;
mod passes;
mod rng;

pub use families::{Family, generate};
pub use hb::{Hb, all_before, producers_of, users_of, writers_of};
pub use llama::{
    LlamaConfig, MAX_TILES, PRESET_3K_TASKS, PRESET_20K_TASKS, gemv_tile_width, gemv_tiles,
    llama_like, llama_like_segments, llama_like_with, preset_3k, preset_3k_config, preset_20k,
    preset_20k_config,
};
pub use motif::{Gen, Val, join_waits};
pub use params::{gelu_scale_recipe, params};
pub use passes::{SmStrategy, assign_sms, colour_pages, pin_onchip};
pub use rng::{Rng, seed_of};
