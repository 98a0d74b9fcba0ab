//! Helpers shared by the lowering's tests (`models/llama/tests/lower.rs`) and the engine's
//! end-to-end lowering tests (`models/engine/tests/lowering.rs`), which include this file by
//! path: a toy model configuration, schedules with each family of fusions, the target, the
//! registry.
// Each including test crate uses a subset.
#![allow(dead_code)]

use amk_core::{GpuTarget, PageStrategy, Registry, ScheduleConfig, SmAssignment};
use amk_model_llama::config::{ModelConfig, RopeScaling};
use amk_model_llama::lower::tuned_schedule;

/// A toy Llama configuration (tied embeddings, no biases, theta 10⁴, 64 positions).
pub fn cfg(
    layers: usize,
    hidden: usize,
    heads: usize,
    kv: usize,
    hd: usize,
    inter: usize,
    vocab: usize,
) -> ModelConfig {
    ModelConfig {
        hidden,
        n_heads: heads,
        n_kv_heads: kv,
        head_dim: hd,
        intermediate: inter,
        vocab,
        n_layers: layers,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
        attention_bias: false,
        rope_scaling: RopeScaling::None,
        qk_norm: false,
    }
}

/// A schedule with `tiling`, optionally the embed+rope and gemv+add fusions, `sm` and `pages`.
pub fn schedule(
    tiling: &[(&str, &[(&str, i64)])],
    fusion: bool,
    sm: SmAssignment,
    pages: PageStrategy,
) -> ScheduleConfig {
    ScheduleConfig {
        tiling: tiling
            .iter()
            .map(|(g, kv)| {
                (
                    g.to_string(),
                    kv.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                )
            })
            .collect(),
        fusion_grouping: if fusion {
            vec![
                vec!["embed".into(), "rope".into()],
                vec!["gemv".into(), "add".into()],
            ]
        } else {
            vec![]
        },
        sm_assignment: sm,
        page_allocation: pages,
        ..ScheduleConfig::default()
    }
}

/// `schedule` with every fusion of the tuned schedule (norms, Q/K/V + RoPE + append, gate/up +
/// SiLU, residual adds).
pub fn all_fused(
    tiling: &[(&str, &[(&str, i64)])],
    sm: SmAssignment,
    pages: PageStrategy,
) -> ScheduleConfig {
    ScheduleConfig {
        fusion_grouping: tuned_schedule().fusion_grouping,
        ..schedule(tiling, false, sm, pages)
    }
}

/// `all_fused` plus the attention inside the output projection (`["attention", "gemv"]`).
pub fn attention_fused(
    tiling: &[(&str, &[(&str, i64)])],
    sm: SmAssignment,
    pages: PageStrategy,
) -> ScheduleConfig {
    let mut sc = all_fused(tiling, sm, pages);
    let g = vec!["attention".to_string(), "gemv".to_string()];
    if !sc.fusion_grouping.contains(&g) {
        sc.fusion_grouping.push(g);
    }
    sc
}

/// Only the attention inside the output projection: its tiles write `o`, then an ADD.
pub fn attention_fused_alone() -> ScheduleConfig {
    ScheduleConfig {
        fusion_grouping: vec![vec!["attention".into(), "gemv".into()]],
        ..ScheduleConfig::default()
    }
}

pub fn h100() -> GpuTarget {
    GpuTarget::by_name("h100").unwrap()
}

pub fn registry() -> Registry {
    amk_ops::registry().unwrap()
}
