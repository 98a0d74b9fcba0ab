//! The backend conformance suite: one generic set of cases run against any
//! [`amk_core::Backend`].
//!
//! Every case builds a small valid program, random non-zero weights (keyed by each buffer's
//! `source`) and inputs, runs it for two or three forward passes on the backend under test and
//! checks the IO outputs of every pass:
//! - against an **f64 formula** written here, independent of the ops' references: one case per
//!   opcode, hand-built DAGs (chains, fan-in joins, tiled GEMV/GEMM groups, split-KV
//!   attention + ATTENTION_COMBINE, in-place KV_APPEND across steps) and toy Llama decode
//!   programs ([`crate::llama_like_with`]);
//! - against the **CPU backend in list order** (the oracle) for the generator families of
//!   the generator module (`src/gen/`) and the Llama variants with split-KV, SM assignment, pages or bf16.
//!
//! Contract assumed of every backend (besides the `Backend`/`Session` traits): KV caches start
//! zeroed at load and persist across steps; IO inputs set in one step persist to later steps.
//!
//! Instantiating the suite for a backend is one line in an integration test:
//!
//! ```ignore
//! amk_conformance::conformance_tests!(amk_backend_cpu::CpuBackend::default());
//! ```
//!
//! which expands to one `#[test]` per case (named after it) plus a test that every case is
//! instantiated. [`run_all`] runs every case into a [`Report`] instead (for a CLI or a bench).
//!
//! This module holds the public API and the case table; the cases and their helpers live in
//! one file per concern: `outcome` (failures, reports), `run` (random weights and inputs,
//! load and step), `compare` (tolerances, comparisons), `tiny` (the program builder),
//! `formulas` (the f64 formulas), then the cases: `ops` (one per opcode), `fused` (the fused
//! decode ops), `next_token`, `dags` (hand-built DAGs), `decode` (the position in device
//! memory), `prefill` (the prefill ops), `families` (the generator families) and `llama` (toy
//! Llama programs).

mod compare;
mod dags;
mod decode;
mod families;
mod formulas;
mod fused;
mod llama;
mod logit_stats;
mod next_token;
mod ops;
mod outcome;
mod prefill;
mod run;
mod tiny;

pub use compare::Tol;
pub use llama::llama_inputs;
pub use outcome::{CaseResult, Failure, Report};
pub use run::{Inputs, int_input_bound, random_inputs, random_weights};

use amk_backend_cpu::CpuBackend;
use amk_core::{Backend, Registry};
use dags::{dag_chain, dag_fan_in, dag_kv_append_steps, dag_split_kv, dag_tiled_groups};
use decode::{
    dag_position_decode, dag_split_kv_decode, dag_split_kv_merged, dag_split_kv_normalized,
    op_attention_pos_bf16, op_attention_split_hd64, op_attention_split_hd64_long,
    op_attention_split_long, op_attention_split_short,
};
use families::{
    family_chain, family_fan_in, family_kv_attention, family_mixture, family_paged,
    family_sm_assigned, family_split_kv, family_tiled,
};
use fused::{
    op_attention_gemv, op_gate_up_silu, op_qkv_rope_append, op_qkv_rope_append_factors,
    op_qkv_rope_append_qk_norm, op_rmsnorm_gemv,
};
use llama::{llama_bf16, llama_pos0, llama_pos3, llama_sm_pages, llama_split_kv, llama_wide};
use logit_stats::op_logit_stats;
use next_token::{op_next_token, op_next_token_stats};
use ops::{
    op_add, op_allreduce_shard, op_attention_combine, op_attention_tile,
    op_attention_tile_paths_bf16, op_attention_tile_paths_f32, op_copy, op_dequant, op_embed,
    op_fused, op_gelu, op_gemm_tile, op_gemv_tile, op_kv_append, op_layernorm, op_mul, op_nop,
    op_rmsnorm, op_rope, op_sample_argmax, op_silu_mul, op_softmax, op_token_nll,
};
use outcome::fail;
use prefill::{
    op_attention_causal, op_attention_causal_bf16, op_kv_append_slices, op_linear_tile,
    op_linear_tile_bf16, op_linear_tile_f16, op_linear_tile_rope,
};

/// What a case needs: the backend under test, the registry and the oracle.
pub struct Ctx<'a> {
    /// The backend under test.
    pub backend: &'a dyn Backend,
    /// The built-in ops.
    pub registry: Registry,
    /// The CPU backend in list order, one thread.
    pub oracle: CpuBackend,
}

/// One named case of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// Name (also the generated test's name).
    pub name: &'static str,
    /// What it checks.
    pub about: &'static str,
    /// The check.
    pub run: fn(&Ctx<'_>) -> CaseResult,
}

fn ctx(backend: &dyn Backend) -> Result<Ctx<'_>, Failure> {
    let registry = amk_ops::registry().map_err(|e| fail(format!("registry: {e}")))?;
    Ok(Ctx {
        backend,
        registry,
        oracle: CpuBackend::default(),
    })
}

/// Runs the case named `name` against `backend`.
pub fn run_case(name: &str, backend: &dyn Backend) -> CaseResult {
    let case = CASES
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| fail(format!("no conformance case named '{name}'")))?;
    let c = ctx(backend)?;
    (case.run)(&c).map_err(|e| {
        fail(format!(
            "[{} backend] {name} ({}): {e}",
            backend.name(),
            case.about
        ))
    })
}

/// Runs every case against `backend`, recording each outcome in `report`.
pub fn run_all(backend: &dyn Backend, report: &mut Report) {
    report.backend = backend.name().to_string();
    for case in CASES {
        match run_case(case.name, backend) {
            Ok(()) => report.passed.push(case.name),
            Err(e) => report.failed.push((case.name, e)),
        }
    }
}

/// Names of every case, in suite order.
pub fn case_names() -> Vec<&'static str> {
    CASES.iter().map(|c| c.name).collect()
}

/// Checks that `instantiated` (what [`conformance_tests!`](crate::conformance_tests) expanded)
/// is exactly the suite.
pub fn check_instantiated(instantiated: &[&str]) -> CaseResult {
    let all = case_names();
    if all.as_slice() == instantiated {
        Ok(())
    } else {
        Err(fail(format!(
            "conformance_tests! instantiates {instantiated:?} but the suite is {all:?}"
        )))
    }
}

/// Instantiates the conformance suite for a backend: one `#[test]` per case, each building
/// the backend with the given expression. Use it inside a module per backend configuration:
///
/// ```ignore
/// mod list_order {
///     amk_conformance::conformance_tests!(amk_backend_cpu::CpuBackend::default());
/// }
/// ```
///
/// `maybe:` takes an `Option` of a backend instead: `None` (no device here; the expression
/// has already said why on stderr) makes each case pass without running, so a GPU suite
/// compiles and skips visibly on machines without the device.
#[macro_export]
macro_rules! conformance_tests {
    (@all $mode:ident ($backend:expr)) => {
        $crate::conformance_tests!(@cases $mode ($backend)
            op_nop op_copy op_embed op_rmsnorm op_layernorm op_gemv_tile op_gemm_tile
            op_attention_tile op_attention_tile_paths_bf16 op_attention_tile_paths_f32 op_rope op_silu_mul op_gelu op_add op_mul op_dequant op_softmax
            op_allreduce_shard op_kv_append op_sample_argmax op_token_nll op_attention_combine op_fused
            op_rmsnorm_gemv op_gate_up_silu op_qkv_rope_append op_qkv_rope_append_factors op_qkv_rope_append_qk_norm op_attention_gemv
            op_attention_pos_bf16 op_attention_split_hd64 op_attention_split_hd64_long op_attention_split_long op_attention_split_short op_next_token op_next_token_stats op_logit_stats
            op_linear_tile op_linear_tile_bf16 op_linear_tile_f16 op_linear_tile_rope op_attention_causal op_attention_causal_bf16
            op_kv_append_slices
            dag_chain dag_fan_in dag_tiled_groups dag_split_kv dag_kv_append_steps
            dag_position_decode dag_split_kv_decode dag_split_kv_normalized dag_split_kv_merged
            family_chain family_fan_in family_tiled family_kv_attention family_split_kv
            family_sm_assigned family_paged family_mixture
            llama_pos0 llama_pos3 llama_split_kv llama_sm_pages llama_bf16 llama_wide);
    };
    (@cases $mode:ident ($backend:expr) $($case:ident)*) => {
        $(
            #[test]
            fn $case() -> ::std::result::Result<(), $crate::conformance::Failure> {
                let Some(backend) = $crate::conformance_tests!(@backend $mode ($backend)) else {
                    return Ok(());
                };
                $crate::conformance::run_case(stringify!($case), &backend)
            }
        )*
        #[test]
        fn every_case_is_instantiated() -> ::std::result::Result<(), $crate::conformance::Failure> {
            $crate::conformance::check_instantiated(&[$(stringify!($case)),*])
        }
    };
    (@backend maybe ($backend:expr)) => { $backend };
    (@backend always ($backend:expr)) => { Some($backend) };
    (maybe: $backend:expr) => {
        $crate::conformance_tests!(@all maybe ($backend));
    };
    ($backend:expr) => {
        $crate::conformance_tests!(@all always ($backend));
    };
}

/// Every case, in order.
pub const CASES: &[Case] = &[
    Case {
        name: "op_nop",
        about: "NOP barriers order a COPY",
        run: op_nop,
    },
    Case {
        name: "op_copy",
        about: "COPY: views, f32->bf16 cast, exact integers",
        run: op_copy,
    },
    Case {
        name: "op_embed",
        about: "EMBED row gather",
        run: op_embed,
    },
    Case {
        name: "op_rmsnorm",
        about: "RMSNORM over rows, and row tiles of one output",
        run: op_rmsnorm,
    },
    Case {
        name: "op_layernorm",
        about: "LAYERNORM with and without bias",
        run: op_layernorm,
    },
    Case {
        name: "op_gemv_tile",
        about: "GEMV_TILE: f32 with bias, int8 with grouped f16 scales",
        run: op_gemv_tile,
    },
    Case {
        name: "op_gemm_tile",
        about: "GEMM_TILE over every row",
        run: op_gemm_tile,
    },
    Case {
        name: "op_attention_tile",
        about: "ATTENTION_TILE: GQA over a KV window",
        run: op_attention_tile,
    },
    Case {
        name: "op_attention_tile_paths_bf16",
        about: "ATTENTION_TILE, bf16: the kv lengths and head sizes that pick each CUDA path",
        run: op_attention_tile_paths_bf16,
    },
    Case {
        name: "op_attention_tile_paths_f32",
        about: "ATTENTION_TILE, f32: each CUDA path, partial shards, empty ones, head_dim 8 to 256",
        run: op_attention_tile_paths_f32,
    },
    Case {
        name: "op_rope",
        about: "ROPE rotate-half, rank 2 and rank 3",
        run: op_rope,
    },
    Case {
        name: "op_silu_mul",
        about: "SILU_MUL",
        run: op_silu_mul,
    },
    Case {
        name: "op_gelu",
        about: "GELU (erf)",
        run: op_gelu,
    },
    Case {
        name: "op_add",
        about: "ADD",
        run: op_add,
    },
    Case {
        name: "op_mul",
        about: "MUL: two inputs and scale",
        run: op_mul,
    },
    Case {
        name: "op_dequant",
        about: "DEQUANT int8 with group scales",
        run: op_dequant,
    },
    Case {
        name: "op_softmax",
        about: "SOFTMAX along the last and the first dim",
        run: op_softmax,
    },
    Case {
        name: "op_allreduce_shard",
        about: "ALLREDUCE_SHARD of three shards",
        run: op_allreduce_shard,
    },
    Case {
        name: "op_kv_append",
        about: "KV_APPEND in place into a zeroed cache",
        run: op_kv_append,
    },
    Case {
        name: "op_sample_argmax",
        about: "SAMPLE_ARGMAX per row",
        run: op_sample_argmax,
    },
    Case {
        name: "op_token_nll",
        about: "TOKEN_NLL per row: whole, two row tiles of one output, the element path",
        run: op_token_nll,
    },
    Case {
        name: "op_attention_combine",
        about: "ATTENTION_COMBINE of partials, one of them empty",
        run: op_attention_combine,
    },
    Case {
        name: "op_fused",
        about: "FUSED gelu(x)*0.5 recipe",
        run: op_fused,
    },
    Case {
        name: "op_rmsnorm_gemv",
        about: "RMSNORM_GEMV: tiles with bias (vector path), odd K (generic path)",
        run: op_rmsnorm_gemv,
    },
    Case {
        name: "op_gate_up_silu",
        about: "GATE_UP_SILU: with the norm (vector path), without, odd K",
        run: op_gate_up_silu,
    },
    Case {
        name: "op_qkv_rope_append",
        about: "QKV_ROPE_APPEND: GQA heads, RoPE, cache rows at three positions, two tiles",
        run: op_qkv_rope_append,
    },
    Case {
        name: "op_qkv_rope_append_factors",
        about: "QKV_ROPE_APPEND with Llama 3's RoPE frequency divisors as its last input",
        run: op_qkv_rope_append_factors,
    },
    Case {
        name: "op_qkv_rope_append_qk_norm",
        about: "QKV_ROPE_APPEND with Qwen3's per-head q/k RMS norms in tiles of whole heads",
        run: op_qkv_rope_append_qk_norm,
    },
    Case {
        name: "op_attention_gemv",
        about: "ATTENTION_GEMV: the tiny, fast and generic attention paths, each times a weight tile",
        run: op_attention_gemv,
    },
    Case {
        name: "op_attention_pos_bf16",
        about: "bf16 ATTENTION_TILE and ATTENTION_GEMV (bias or not) with a position input that clips the window, read before the wait (an input) and after it (a buffer a task writes)",
        run: op_attention_pos_bf16,
    },
    Case {
        name: "op_attention_split_hd64",
        about: "ATTENTION_SPLIT at head_dim 64 with bf16 caches: splits of 10 to 64 rows writing normalised rows and partials",
        run: op_attention_split_hd64,
    },
    Case {
        name: "op_attention_split_hd64_long",
        about: "ATTENTION_SPLIT at head_dim 64 over bf16 and f16 caches of up to 1,100 rows (SmolLM2's and the 1B's groupings): normalised rows and partials",
        run: op_attention_split_hd64_long,
    },
    Case {
        name: "op_attention_split_long",
        about: "ATTENTION_SPLIT over splits of up to 512 rows: head_dim 128 with 6 query heads a KV head over f16 caches, head_dim 64 with 3 over f32 caches; normalised rows and partials",
        run: op_attention_split_long,
    },
    Case {
        name: "op_attention_split_short",
        about: "ATTENTION_SPLIT at a decode's first positions (1 to 128 rows): head_dim 128 over f16, head_dim 32 and 64 over bf16 (SmolLM2's and the 1B's groupings); normalised rows and partials",
        run: op_attention_split_short,
    },
    Case {
        name: "op_next_token",
        about: "NEXT_TOKEN: forcing, greedy, sampling with top-k / top-p / a vocab limit, halts",
        run: op_next_token,
    },
    Case {
        name: "op_next_token_stats",
        about: "NEXT_TOKEN after LOGIT_STATS tasks: the same steps with the logits summarised by slot (f32, bf16, f16; slots a task 1 and 2, a short last slot)",
        run: op_next_token_stats,
    },
    Case {
        name: "op_logit_stats",
        about: "LOGIT_STATS alone: f32, bf16 and f16 rows with NaNs, tied maxima and vocabulary limits, slots of 5 to 1,032 logits, 1 to 3 a task",
        run: op_logit_stats,
    },
    Case {
        name: "op_linear_tile",
        about: "LINEAR_TILE in f32: 2 x 2 tiles over 70 rows, plain, norm + residual, norm + SwiGLU",
        run: op_linear_tile,
    },
    Case {
        name: "op_linear_tile_bf16",
        about: "LINEAR_TILE in bf16 (the tensor-core path): 70 x 96 x 136, 9 x 40 x 20 (K tail), 300 x 96 x 136 and 600 x 320 x 136 (wide and 256-row tiles)",
        run: op_linear_tile_bf16,
    },
    Case {
        name: "op_linear_tile_f16",
        about: "LINEAR_TILE in f16 (the tensor-core path): 70 x 96 x 136 and 600 x 320 x 136 (256-row tiles on sm_90a)",
        run: op_linear_tile_f16,
    },
    Case {
        name: "op_linear_tile_rope",
        about: "LINEAR_TILE's RoPE epilogue: f32 and bf16 (tensor cores), with and without divisors",
        run: op_linear_tile_rope,
    },
    Case {
        name: "op_attention_causal",
        about: "ATTENTION_CAUSAL in f32: 6 rows at consecutive positions, GQA, three tiles",
        run: op_attention_causal,
    },
    Case {
        name: "op_attention_causal_bf16",
        about: "ATTENTION_CAUSAL in bf16 (the tensor-core path): 40 and 70 rows of head_dim 64 with 3 heads a KV head (keys in up to two and six blocks), 50 rows of head_dim 128 with 4 (two pair groups)",
        run: op_attention_causal_bf16,
    },
    Case {
        name: "op_kv_append_slices",
        about: "KV_APPEND split into column slices on one counter: bf16 (300 rows, 16-wide slices), f32 uneven slices, rows of 15 element by element",
        run: op_kv_append_slices,
    },
    Case {
        name: "dag_chain",
        about: "norm -> tiled gate/up -> SILU_MUL -> tiled down with bias -> residual ADD",
        run: dag_chain,
    },
    Case {
        name: "dag_fan_in",
        about: "four producers on one counter, a NOP barrier and direct full waits",
        run: dag_fan_in,
    },
    Case {
        name: "dag_tiled_groups",
        about: "ragged int8 GEMV tiles; GEMM row x column tiles over a DEQUANT weight",
        run: dag_tiled_groups,
    },
    Case {
        name: "dag_split_kv",
        about: "KV_APPEND of several rows, split-KV shards (one empty) + combine = attention",
        run: dag_split_kv,
    },
    Case {
        name: "dag_kv_append_steps",
        about: "in-place KV_APPENDs across three steps, the last one reusing its inputs",
        run: dag_kv_append_steps,
    },
    Case {
        name: "dag_position_decode",
        about: "three decode steps with the position in device memory: KV_APPEND, ATTENTION_TILE, split-KV shards (empty ones) + combine and ATTENTION_GEMV read it",
        run: dag_position_decode,
    },
    Case {
        name: "dag_split_kv_decode",
        about: "three decode steps of a split-KV attention: ATTENTION_SPLIT tasks (inactive ones too) read the position as an input and as a buffer a task writes, COMBINE_GEMV tiles (bias or not) merge their partials",
        run: dag_split_kv_decode,
    },
    Case {
        name: "dag_split_kv_normalized",
        about: "three decode steps of one split a KV head writing normalised rows (ATTENTION_SPLIT flags bit 0) into the attention row, then GEMV tiles over it",
        run: dag_split_kv_normalized,
    },
    Case {
        name: "dag_split_kv_merged",
        about: "three decode steps of a split-KV attention merged by ATTENTION_MERGE tasks (whole heads, the position as an input and as a buffer a task writes) into the attention row, then GEMV tiles over it",
        run: dag_split_kv_merged,
    },
    Case {
        name: "family_chain",
        about: "generated chains vs the oracle",
        run: family_chain,
    },
    Case {
        name: "family_fan_in",
        about: "generated fan-in joins vs the oracle",
        run: family_fan_in,
    },
    Case {
        name: "family_tiled",
        about: "generated tiled groups vs the oracle",
        run: family_tiled,
    },
    Case {
        name: "family_kv_attention",
        about: "generated KV_APPEND -> attention vs the oracle",
        run: family_kv_attention,
    },
    Case {
        name: "family_split_kv",
        about: "generated split-KV blocks vs the oracle",
        run: family_split_kv,
    },
    Case {
        name: "family_sm_assigned",
        about: "generated SM-assigned programs vs the oracle",
        run: family_sm_assigned,
    },
    Case {
        name: "family_paged",
        about: "generated paged programs vs the oracle",
        run: family_paged,
    },
    Case {
        name: "family_mixture",
        about: "generated mixtures vs the oracle",
        run: family_mixture,
    },
    Case {
        name: "llama_pos0",
        about: "toy Llama at position 0 vs f64 and the oracle",
        run: llama_pos0,
    },
    Case {
        name: "llama_pos3",
        about: "toy Llama (GQA) at position 3 vs f64 and the oracle",
        run: llama_pos3,
    },
    Case {
        name: "llama_split_kv",
        about: "toy Llama with split-KV attention vs f64 and the oracle",
        run: llama_split_kv,
    },
    Case {
        name: "llama_sm_pages",
        about: "toy Llama with round-robin SMs and shared pages vs f64 and the oracle",
        run: llama_sm_pages,
    },
    Case {
        name: "llama_bf16",
        about: "toy bf16 Llama vs the oracle",
        run: llama_bf16,
    },
    Case {
        name: "llama_wide",
        about: "3-layer Llama, H 32, 8 heads over 2 KV heads of 8, 4 KV shards, vs f64 and the oracle",
        run: llama_wide,
    },
];
