//! The conformance generator's Llama programs ([`llama_like_with`]) against the real lowering
//! (`amk_model_llama::lower`) of the same shape under the reference schedule (GEMV tiles of
//! `N_tile` rows, nothing fused, one attention task a layer): the same tasks, in the same
//! order, with the same ops and labels, each waiting on the tasks of the same labels. The
//! generator keeps its own code (its split-KV shards follow the reference's per-position
//! shard dropping, which the soundness suite's programs and counts are built on), so this is
//! what keeps the two from drifting apart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_conformance::{LlamaConfig, llama_like_with};
use amk_core::{Opcode, Program, ScheduleConfig};
use amk_model_llama::Model;
use amk_model_llama::config::{ModelConfig, RopeScaling};
use amk_model_llama::lower::{LowerOptions, lower};
use std::collections::BTreeSet;

/// The real lowering of `c`'s shape (untied head, no biases, plain RoPE) at `c.n_tile`.
fn lowered(c: &LlamaConfig) -> Program {
    let mc = ModelConfig {
        hidden: c.hidden as usize,
        n_heads: c.heads as usize,
        n_kv_heads: c.kv_heads as usize,
        head_dim: c.head_dim as usize,
        intermediate: c.inter as usize,
        vocab: c.vocab as usize,
        n_layers: c.layers,
        rms_eps: 1e-6,
        rope_theta: 10000.0,
        max_position_embeddings: c.max_seq as usize,
        tie_word_embeddings: false,
        attention_bias: false,
        rope_scaling: RopeScaling::None,
        qk_norm: false,
    };
    let mut tiling = vec![("gemv".into(), vec![("N_tile".into(), c.n_tile as i64)])];
    if c.split_kv > 1 {
        tiling.push((
            "attention".into(),
            vec![("n_partitions".into(), c.split_kv as i64)],
        ));
    }
    let schedule = ScheduleConfig {
        tiling,
        ..ScheduleConfig::default()
    };
    let opts = LowerOptions {
        dtype: c.dtype,
        max_seq: Some(c.max_seq),
        argmax: false,
        decode_loop: None,
    };
    let target = amk_core::GpuTarget::by_name("h100").unwrap();
    lower(
        &Model::shape_only(mc, "generator shape"),
        &schedule,
        &target,
        &opts,
    )
    .unwrap()
    .program
}

/// A task as the comparison sees it.
#[derive(Debug, PartialEq)]
struct TaskShape {
    op: String,
    label: String,
    /// The labels of the tasks that signal the counters it waits on.
    producers: BTreeSet<String>,
    /// Its params, for the ops whose params do not depend on how positions are passed (the
    /// GEMV tiles' rows, the norms' width and epsilon); empty for the others.
    params: String,
}

/// Each task of `p` ([`TaskShape`]).
fn shape(p: &Program) -> Vec<TaskShape> {
    p.tasks
        .iter()
        .map(|t| {
            let producers = t
                .waits
                .iter()
                .flat_map(|w| p.tasks.iter().filter(move |u| u.out_counter == w.counter))
                .map(|u| u.label.clone())
                .collect();
            let fixed = matches!(t.op, Opcode::GEMV_TILE | Opcode::RMSNORM);
            TaskShape {
                op: t.op.to_string(),
                label: t.label.clone(),
                producers,
                params: if fixed {
                    format!("{:?}", t.params)
                } else {
                    String::new()
                },
            }
        })
        .collect()
}

#[test]
fn llama_like_is_the_real_lowering_under_the_reference_schedule() {
    for (layers, h, nh, nkv, hd, inter, vocab, nt) in [
        (2, 64, 4, 2, 16, 128, 256, 32),
        (2, 64, 4, 2, 16, 128, 256, 128),
        (3, 32, 8, 2, 8, 64, 64, 16),
        (1, 48, 6, 3, 8, 96, 80, 24),
    ] {
        let c = LlamaConfig::new(layers, h, nh, nkv, hd, inter, vocab, nt);
        same_tasks(&c);
    }
}

/// Split-KV: the lowering's shards cover the whole cache (a static window each, which the
/// position clips), the generator's the rows up to the position, so the two agree at the
/// cache's last position, where both cover every row.
#[test]
fn split_kv_shards_agree_at_the_last_position() {
    for shards in [2, 3, 4] {
        let mut c = LlamaConfig::new(2, 64, 4, 2, 16, 128, 256, 32);
        c.max_seq = 64;
        c.pos = 63;
        c.split_kv = shards;
        same_tasks(&c);
    }
}

/// The generator's and the lowering's programs of `c`, task by task ([`shape`]).
fn same_tasks(c: &LlamaConfig) {
    let (g, l) = (shape(&llama_like_with(c)), shape(&lowered(c)));
    assert_eq!(g.len(), l.len(), "{c:?}: task counts");
    for (i, (a, b)) in g.iter().zip(&l).enumerate() {
        assert_eq!(a, b, "{c:?}: task {i}");
    }
}
