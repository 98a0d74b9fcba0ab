//! The backend conformance suite: one generic set of cases run against any
//! [`amk_core::Backend`].
//!
//! Every case builds a small valid program, random non-zero weights (keyed by each buffer's
//! `source`) and inputs, runs it for two or three forward passes on the backend under test and
//! checks the IO outputs of every pass:
//! - against an **f64 formula** written here, independent of the ops' references: one case per
//!   opcode (all 25), hand-built DAGs (chains, fan-in joins, tiled GEMV/GEMM groups, split-KV
//!   attention + ATTENTION_COMBINE, in-place KV_APPEND across steps) and toy Llama decode
//!   programs ([`crate::llama_like_with`]);
//! - against the **CPU backend in list order** (the oracle) for the generator families of
//!   the generator module (`src/gen.rs`) and the Llama variants with split-KV, SM assignment, pages or bf16.
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

use crate::r#gen::{self, Family, LlamaConfig};
use amk_backend_cpu::CpuBackend;
use amk_core::json::Value;
use amk_core::sim::SplitMix;
use amk_core::testkit::{dtype_eps, random_nonzero};
use amk_core::{
    Backend, BufferId, BufferKind, CounterId, DType, Opcode, Outputs, Program, Registry, Session,
    Tensor, WeightStore, validate_owned,
};
use std::fmt;

// ---- outcome types -----------------------------------------------------------------------------

/// Why a case failed: a human message naming the case, the step and the output.
#[derive(Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Debug for Failure {
    // Printed raw, so a failing `#[test]` shows the message as written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

fn fail(msg: impl Into<String>) -> Failure {
    Failure(msg.into())
}

/// The result of one case.
pub type CaseResult = Result<(), Failure>;

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

/// The outcome of [`run_all`].
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Backend name.
    pub backend: String,
    /// Cases that passed.
    pub passed: Vec<&'static str>,
    /// Cases that failed, with why.
    pub failed: Vec<(&'static str, Failure)>,
}

impl Report {
    /// Whether every case passed.
    pub fn ok(&self) -> bool {
        self.failed.is_empty()
    }
    /// One line per failure after a count line.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "conformance on '{}': {} passed, {} failed",
            self.backend,
            self.passed.len(),
            self.failed.len()
        );
        for (name, why) in &self.failed {
            s.push_str(&format!("\n  {name}: {why}"));
        }
        s
    }
    /// `Ok` when every case passed, else the summary as a [`Failure`].
    pub fn into_result(self) -> CaseResult {
        if self.ok() {
            Ok(())
        } else {
            Err(fail(self.summary()))
        }
    }
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
            op_allreduce_shard op_kv_append op_sample_argmax op_attention_combine op_fused
            op_rmsnorm_gemv op_gate_up_silu op_qkv_rope_append op_qkv_rope_append_factors op_qkv_rope_append_qk_norm op_attention_gemv
            op_attention_pos_bf16 op_next_token
            op_linear_tile op_linear_tile_bf16 op_linear_tile_rope op_attention_causal op_attention_causal_bf16
            dag_chain dag_fan_in dag_tiled_groups dag_split_kv dag_kv_append_steps
            dag_position_decode dag_split_kv_decode dag_split_kv_normalized
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
        name: "op_next_token",
        about: "NEXT_TOKEN: forcing, greedy, sampling with top-k / top-p / a vocab limit, halts",
        run: op_next_token,
    },
    Case {
        name: "op_linear_tile",
        about: "LINEAR_TILE in f32: 2 x 2 tiles over 70 rows, plain, norm + residual, norm + SwiGLU",
        run: op_linear_tile,
    },
    Case {
        name: "op_linear_tile_bf16",
        about: "LINEAR_TILE in bf16 (the tensor-core path): 70 x 96 x 136 and 9 x 40 x 20 (K tail)",
        run: op_linear_tile_bf16,
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
        about: "ATTENTION_CAUSAL in bf16 (the tensor-core path): 40 rows of head_dim 64 with 3 heads a KV head, 50 rows of head_dim 128 with 4 (two pair groups), keys in two blocks",
        run: op_attention_causal_bf16,
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

// ---- weights, inputs, running ------------------------------------------------------------------

/// Named IO input tensors of one step.
pub type Inputs = Vec<(String, Tensor)>;

/// Exclusive upper bound of random integer IO inputs that feed ROPE positions.
const POSITION_BOUND: i64 = 32;

/// Random values for every WEIGHT/CONST buffer of `p`, keyed by its `source` (floats in
/// `±0.5`, never 0; int8 in `[-7, 7]`; unsigned and int4 in `[1, 15]`; I4 buffers get a packed
/// U8 tensor, as the safetensors binding rule wants).
pub fn random_weights(p: &Program, seed: u64) -> WeightStore {
    let mut rng = SplitMix(seed ^ 0x5EED_3E16_A7A5_0001);
    let mut w = WeightStore::new();
    for b in &p.buffers {
        if !matches!(b.kind, BufferKind::WEIGHT | BufferKind::CONST) {
            continue;
        }
        let Some(src) = &b.source else { continue };
        if w.get(src).is_some() {
            continue;
        }
        let (lo, hi) = match b.dtype {
            DType::I8 => (-7.0, 7.0),
            DType::U8 | DType::I4 => (1.0, 15.0),
            DType::I32 => (0.0, 3.0),
            DType::BOOL => (1.0, 1.0),
            _ => (-0.5, 0.5),
        };
        let t = random_nonzero(b.dtype, &b.shape, &mut rng, lo, hi);
        let t = if b.dtype == DType::I4 {
            let mut packed = b.shape.clone();
            if let Some(k) = packed.last_mut() {
                *k = k.div_ceil(2);
            }
            match Tensor::from_le_bytes(DType::U8, &packed, &t.to_le_bytes()) {
                Ok(u) => u,
                Err(_) => continue,
            }
        } else {
            t
        };
        w.insert(src.clone(), t);
    }
    w
}

/// Exclusive upper bound of valid values of the integer IO input `b`: the fewest rows of any
/// EMBED table it indexes, 32 when it only feeds ROPE positions, 4 otherwise.
pub fn int_input_bound(p: &Program, b: BufferId) -> i64 {
    let mut bound: Option<i64> = None;
    for t in &p.tasks {
        for (i, &inp) in t.inputs.iter().enumerate() {
            if inp != b {
                continue;
            }
            let lim = if t.op == Opcode::EMBED && i == 0 {
                t.inputs
                    .get(1)
                    .and_then(|&tb| p.buffers.get(tb as usize))
                    .map(|tb| tb.shape.first().copied().unwrap_or(1) as i64)
            } else if t.op == Opcode::ROPE && i == 1 {
                Some(POSITION_BOUND)
            } else if t.op == Opcode::QKV_ROPE_APPEND && i == 4 {
                // The cache rows (output 1): the position indexes them.
                t.outputs
                    .get(1)
                    .and_then(|&cb| p.buffers.get(cb as usize))
                    .map(|cb| cb.shape.first().copied().unwrap_or(1) as i64)
            } else if is_position_input(p, t, i) {
                // The rows of the cache (input 1) the position indexes, less KV_APPEND's
                // rows after the first; an attention's window clips any larger one.
                let cache = t.inputs.get(1).and_then(|&cb| p.buffers.get(cb as usize));
                let new = t.inputs.first().and_then(|&nb| p.buffers.get(nb as usize));
                cache.map(|cb| {
                    let s = &cb.shape;
                    let max_seq = if s.len() == 4 {
                        s[1]
                    } else {
                        s.first().copied().unwrap_or(1)
                    };
                    let rows = match (t.op, new) {
                        (Opcode::KV_APPEND, Some(nb)) if s.len() != 4 => {
                            nb.numel() / (cb.numel() / max_seq.max(1)).max(1)
                        }
                        _ => 1,
                    };
                    (max_seq + 1).saturating_sub(rows.max(1)) as i64
                })
            } else {
                None
            };
            if let Some(l) = lim {
                bound = Some(bound.map_or(l, |x| x.min(l)));
            }
        }
    }
    bound.unwrap_or(4).max(1)
}

/// Whether input `i` of `t` is the position of a KV_APPEND, ATTENTION_TILE or ATTENTION_GEMV
/// (the integer input after their operands).
fn is_position_input(p: &Program, t: &amk_core::Task, i: usize) -> bool {
    let integer = |k: usize| {
        t.inputs
            .get(k)
            .and_then(|&b| p.buffers.get(b as usize))
            .is_some_and(|b| b.dtype.is_integer())
    };
    match t.op {
        Opcode::KV_APPEND => i == 2,
        Opcode::ATTENTION_TILE => i == 3,
        // After W and the bias; a lone fifth input is the position when it holds integers.
        Opcode::ATTENTION_GEMV => match t.inputs.len() {
            5 => i == 4 && integer(4),
            6 => i == 5,
            _ => false,
        },
        _ => false,
    }
}

/// Random valid values for every IO_INPUT buffer of `p`: floats in `±1` (never 0), integers
/// in `[0, int_input_bound)`.
pub fn random_inputs(p: &Program, rng: &mut SplitMix) -> Inputs {
    let mut out = Vec::new();
    for b in &p.buffers {
        if b.kind != BufferKind::IO_INPUT {
            continue;
        }
        let t = if b.dtype.is_integer() {
            let hi = int_input_bound(p, b.id);
            Tensor::random(b.dtype, &b.shape, rng, 0.0, (hi - 1) as f64)
        } else {
            random_nonzero(b.dtype, &b.shape, rng, -1.0, 1.0)
        };
        out.push((b.name.clone(), t));
    }
    out
}

fn set_input(inputs: &mut Inputs, name: &str, t: Tensor) {
    match inputs.iter_mut().find(|(n, _)| n == name) {
        Some(slot) => slot.1 = t,
        None => inputs.push((name.to_string(), t)),
    }
}

fn input<'a>(inputs: &'a Inputs, name: &str) -> Result<&'a Tensor, Failure> {
    inputs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .ok_or_else(|| fail(format!("suite bug: no input '{name}'")))
}

/// Every element as f64.
fn vals(t: &Tensor) -> Vec<f64> {
    (0..t.numel())
        .map(|i| {
            if t.dtype().is_integer() {
                t.get_i64(i) as f64
            } else {
                t.get_f32(i) as f64
            }
        })
        .collect()
}

fn in_vals(inputs: &Inputs, name: &str) -> Result<Vec<f64>, Failure> {
    input(inputs, name).map(vals)
}

fn weight_vals(w: &WeightStore, name: &str) -> Result<Vec<f64>, Failure> {
    w.get(name)
        .map(|t| vals(t))
        .ok_or_else(|| fail(format!("suite bug: no weight '{name}'")))
}

/// Validates `p` (a rejection is a bug of the suite) and loads it on `backend`.
fn load(
    backend: &dyn Backend,
    reg: &Registry,
    p: &Program,
    w: &WeightStore,
) -> Result<Box<dyn Session>, Failure> {
    let vp = validate_owned(p.clone(), reg).map_err(|r| {
        fail(format!(
            "suite bug: the program is rejected: {}",
            r.report()
        ))
    })?;
    backend
        .load(&vp, w, reg)
        .map_err(|e| fail(format!("{} backend: load failed: {e}", backend.name())))
}

fn step(
    s: &mut dyn Session,
    backend: &dyn Backend,
    inputs: &Inputs,
    k: usize,
) -> Result<Outputs, Failure> {
    let refs: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    s.step(&refs)
        .map_err(|e| fail(format!("{} backend: step {k} failed: {e}", backend.name())))
}

/// Runs `steps` (one input set per forward pass) in one session of `backend`.
fn run_steps(
    backend: &dyn Backend,
    reg: &Registry,
    p: &Program,
    w: &WeightStore,
    steps: &[Inputs],
) -> Result<Vec<Outputs>, Failure> {
    let mut s = load(backend, reg, p, w)?;
    steps
        .iter()
        .enumerate()
        .map(|(k, ins)| step(s.as_mut(), backend, ins, k))
        .collect()
}

/// Tolerance of a comparison: `atol + (rtol + eps(dtype))·|want|`.
#[derive(Debug, Clone, Copy)]
pub struct Tol {
    /// Relative part.
    pub rtol: f64,
    /// Absolute part.
    pub atol: f64,
}

/// f32 results against an f64 formula (small sizes: a few roundings per element).
const F32_TOL: Tol = Tol {
    rtol: 1e-4,
    atol: 1e-5,
};
/// End-to-end f32 programs (errors pass through norms and several layers).
const MODEL_TOL: Tol = Tol {
    rtol: 1e-3,
    atol: 1e-4,
};
/// Every f32 output against the oracle: max |error| / max |oracle value| (the backend must
/// agree with the CPU VM to 1e-5 relative, whatever its summation order).
const ORACLE_F32_REL: f64 = 1e-5;
/// bf16 programs against the oracle (every intermediate rounds to 8 bits).
const BF16_TOL: Tol = Tol {
    rtol: 3e-2,
    atol: 3e-2,
};

/// Checks `got` against `want`; integer dtypes must match exactly.
fn close(what: &str, got: &Tensor, want: &[f64], tol: Tol) -> CaseResult {
    if got.numel() != want.len() {
        return Err(fail(format!(
            "{what}: {} elements (shape {:?}), expected {}",
            got.numel(),
            got.shape(),
            want.len()
        )));
    }
    let g = vals(got);
    let eps = dtype_eps(got.dtype());
    let mut bad = Vec::new();
    for (i, (&g, &w)) in g.iter().zip(want).enumerate() {
        let ok = if got.dtype().is_integer() {
            g == w
        } else if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            !g.is_nan() && (g - w).abs() <= tol.atol + (tol.rtol + eps) * w.abs()
        };
        if !ok {
            bad.push(format!("[{i}] got {g}, want {w}"));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        let n = bad.len();
        bad.truncate(6);
        Err(fail(format!(
            "{what} ({}, {:?}): {n} of {} element(s) off (rtol {}, atol {}): {}",
            got.dtype(),
            got.shape(),
            want.len(),
            tol.rtol,
            tol.atol,
            bad.join("; ")
        )))
    }
}

fn output<'a>(o: &'a Outputs, name: &str, k: usize) -> Result<&'a Tensor, Failure> {
    o.get(name).ok_or_else(|| {
        let have: Vec<&str> = o.tensors.iter().map(|(n, _)| n.as_str()).collect();
        fail(format!(
            "step {k}: no output '{name}' (outputs: {})",
            have.join(", ")
        ))
    })
}

/// Same outputs (names, order, dtypes, shapes) and values within `tol`.
fn same_outputs(k: usize, got: &Outputs, want: &Outputs, tol: Tol) -> CaseResult {
    let names = |o: &Outputs| -> Vec<String> { o.tensors.iter().map(|(n, _)| n.clone()).collect() };
    if names(got) != names(want) {
        return Err(fail(format!(
            "step {k}: outputs {:?}, the oracle's {:?}",
            names(got),
            names(want)
        )));
    }
    for ((name, g), (_, w)) in got.tensors.iter().zip(&want.tensors) {
        if g.dtype() != w.dtype() || g.shape() != w.shape() {
            return Err(fail(format!(
                "step {k}: output '{name}' is {} {:?}, the oracle's {} {:?}",
                g.dtype(),
                g.shape(),
                w.dtype(),
                w.shape()
            )));
        }
        let want = vals(w);
        close(
            &format!("step {k}: output '{name}' vs the oracle"),
            g,
            &want,
            tol,
        )?;
        if g.dtype() == DType::F32 {
            close_rel(
                &format!("step {k}: output '{name}' vs the oracle"),
                g,
                &want,
            )?;
        }
    }
    Ok(())
}

/// `max |got − want| / max |want| ≤ ORACLE_F32_REL` (NaN and infinities must match exactly,
/// which [`close`] has checked).
fn close_rel(what: &str, got: &Tensor, want: &[f64]) -> CaseResult {
    let g = vals(got);
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f64, |m, w| m.max(w.abs()));
    let (mut worst, mut at) = (0.0f64, 0usize);
    for (i, (&g, &w)) in g.iter().zip(want).enumerate() {
        if w.is_finite() && (g - w).abs() > worst {
            (worst, at) = ((g - w).abs(), i);
        }
    }
    if worst <= ORACLE_F32_REL * scale {
        Ok(())
    } else {
        Err(fail(format!(
            "{what}: max error {worst:e} at [{at}] (got {}, want {}) is {:e} of max |value| \
             {scale:e}; the limit is {ORACLE_F32_REL:e}",
            g[at],
            want[at],
            worst / scale
        )))
    }
}

/// Runs `steps` on the backend under test and on the oracle and compares every step.
/// Returns the backend's outputs.
fn against_oracle(
    c: &Ctx<'_>,
    p: &Program,
    w: &WeightStore,
    steps: &[Inputs],
    tol: Tol,
) -> Result<Vec<Outputs>, Failure> {
    let want =
        run_steps(&c.oracle, &c.registry, p, w, steps).map_err(|e| fail(format!("oracle: {e}")))?;
    let got = run_steps(c.backend, &c.registry, p, w, steps)?;
    for (k, (g, o)) in got.iter().zip(&want).enumerate() {
        same_outputs(k, g, o, tol)?;
    }
    Ok(got)
}

// ---- tiny program builder ----------------------------------------------------------------------

/// A tiny program under construction with its weights and its random source.
struct Tiny {
    p: Program,
    w: WeightStore,
    rng: SplitMix,
}

fn pv(kv: &[(&str, Value)]) -> amk_core::json::Map {
    r#gen::params(kv)
}

fn int(v: i64) -> Value {
    Value::Int(v)
}

fn real(v: f64) -> Value {
    Value::Float(v)
}

impl Tiny {
    fn new(seed: u64) -> Self {
        Tiny {
            p: Program::new(),
            w: WeightStore::new(),
            rng: SplitMix(seed ^ 0xC0F0_2A4C_E5E7_0000),
        }
    }
    fn input(&mut self, name: &str, dtype: DType, shape: &[u64]) -> BufferId {
        self.p.new_buffer(name, BufferKind::IO_INPUT, dtype, shape)
    }
    fn output(&mut self, name: &str, dtype: DType, shape: &[u64]) -> BufferId {
        self.p.new_buffer(name, BufferKind::IO_OUTPUT, dtype, shape)
    }
    fn act(&mut self, name: &str, shape: &[u64]) -> BufferId {
        self.p
            .new_buffer(name, BufferKind::ACTIVATION, DType::F32, shape)
    }
    fn kv(&mut self, name: &str, shape: &[u64]) -> BufferId {
        self.p
            .new_buffer(name, BufferKind::KV_CACHE, DType::F32, shape)
    }
    /// A WEIGHT buffer with random non-zero values in `[lo, hi)`; returns the id and the values.
    fn weight(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        lo: f64,
        hi: f64,
    ) -> (BufferId, Vec<f64>) {
        let t = random_nonzero(dtype, shape, &mut self.rng, lo, hi);
        let v = vals(&t);
        self.w.insert(name, t);
        (self.p.new_weight(name, dtype, shape, name), v)
    }
    fn counter(&mut self) -> CounterId {
        let n = self.p.counters.len();
        self.p.new_counter(format!("c{n}"))
    }
    /// A task with its own new counter; returns the counter.
    fn task(
        &mut self,
        op: Opcode,
        ins: &[BufferId],
        outs: &[BufferId],
        waits: &[(CounterId, i64)],
        params: &[(&str, Value)],
    ) -> CounterId {
        let c = self.counter();
        self.task_on(c, op, ins, outs, waits, params);
        c
    }
    /// A task signalling the (possibly shared) counter `c`.
    fn task_on(
        &mut self,
        c: CounterId,
        op: Opcode,
        ins: &[BufferId],
        outs: &[BufferId],
        waits: &[(CounterId, i64)],
        params: &[(&str, Value)],
    ) {
        let label = format!("{op}#{}", self.p.tasks.len());
        self.p.push_task(op, ins, outs, c, waits, pv(params), label);
    }
}

/// Runs `nsteps` forward passes of `t` with fresh random inputs (`make` may adjust them) and
/// checks every pass's outputs against `formula(inputs)`: `(output name, values)` pairs.
fn check_formula(
    c: &Ctx<'_>,
    t: Tiny,
    nsteps: usize,
    tol: Tol,
    mut make: impl FnMut(&mut Inputs, &mut SplitMix),
    formula: impl Fn(&Inputs) -> Result<Vec<(&'static str, Vec<f64>)>, Failure>,
) -> CaseResult {
    let Tiny { p, w, mut rng } = t;
    let steps: Vec<Inputs> = (0..nsteps)
        .map(|_| {
            let mut ins = random_inputs(&p, &mut rng);
            make(&mut ins, &mut rng);
            ins
        })
        .collect();
    let got = run_steps(c.backend, &c.registry, &p, &w, &steps)?;
    for (k, (o, ins)) in got.iter().zip(&steps).enumerate() {
        for (name, want) in formula(ins)? {
            close(
                &format!("step {k}: output '{name}'"),
                output(o, name, k)?,
                &want,
                tol,
            )?;
        }
    }
    Ok(())
}

fn no_change(_: &mut Inputs, _: &mut SplitMix) {}

// ---- f64 formulas ------------------------------------------------------------------------------

fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// `eps` as the device carries it (an f32).
fn eps32(eps: f64) -> f64 {
    eps as f32 as f64
}

fn rmsnorm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let h = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(h) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps32(eps)).sqrt();
        out.extend(row.iter().zip(w).map(|(v, wj)| v * inv * wj));
    }
    out
}

fn layernorm(x: &[f64], w: &[f64], b: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let h = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(h) {
        let mean = row.iter().sum::<f64>() / h as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
        let r = 1.0 / (var + eps32(eps)).sqrt();
        for (j, v) in row.iter().enumerate() {
            out.push((v - mean) * r * w[j] + b.map_or(0.0, |b| b[j]));
        }
    }
    out
}

/// `x[M, K] @ w[N, K]^T (+ bias[N]) -> [M, N]`.
fn linear(x: &[f64], w: &[f64], k: usize, bias: Option<&[f64]>) -> Vec<f64> {
    let n = w.len() / k;
    let mut out = Vec::new();
    for row in x.chunks(k) {
        for j in 0..n {
            let dot: f64 = row
                .iter()
                .zip(&w[j * k..(j + 1) * k])
                .map(|(a, b)| a * b)
                .sum();
            out.push(dot + bias.map_or(0.0, |b| b[j]));
        }
    }
    out
}

/// Softmax of every run of `n` consecutive elements.
fn softmax_rows(x: &[f64], n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        out.extend(row.iter().map(|v| (v - m).exp() / s));
    }
    out
}

/// Rotate-half RoPE of `rows` rows (one position each) of whole heads of `hd`.
fn rope(x: &[f64], pos: &[f64], hd: usize, theta: f64) -> Vec<f64> {
    rope_scaled(x, pos, hd, theta, &[])
}

/// [`rope`] with frequency `i` divided by `factors[i]` (none: all 1).
fn rope_scaled(x: &[f64], pos: &[f64], hd: usize, theta: f64, factors: &[f64]) -> Vec<f64> {
    let mut out = x.to_vec();
    let rows = pos.len();
    let row_len = x.len() / rows.max(1);
    let half = hd / 2;
    for (r, &p) in pos.iter().enumerate() {
        for head in 0..row_len / hd {
            let base = r * row_len + head * hd;
            for i in 0..half {
                let f = factors.get(i).copied().unwrap_or(1.0);
                let ang = p * theta.powf(-(i as f64) / half as f64) / f;
                let (c, s) = (ang.cos(), ang.sin());
                let (x1, x2) = (x[base + i], x[base + i + half]);
                out[base + i] = x1 * c - x2 * s;
                out[base + i + half] = x2 * c + x1 * s;
            }
        }
    }
    out
}

/// Geometry of a decode attention over a `[max_seq, nkv, hd]` cache.
#[derive(Clone, Copy)]
struct Attn {
    nh: usize,
    nkv: usize,
    hd: usize,
    scale: f64,
}

/// The attention params of an ATTENTION_TILE or ATTENTION_GEMV task of geometry `a` over cache
/// rows `[start, start + len)`.
fn attention_params(a: Attn, start: usize, len: usize) -> Vec<(&'static str, Value)> {
    vec![
        ("head_dim", int(a.hd as i64)),
        ("kv_start", int(start as i64)),
        ("kv_len", int(len as i64)),
        ("scale", real(a.scale)),
        ("n_heads", int(a.nh as i64)),
        ("n_kv_heads", int(a.nkv as i64)),
    ]
}

/// Un-normalised `(acc, m, l)` of every head over cache rows `[start, start + len)`.
fn attention_partial(
    a: Attn,
    q: &[f64],
    kc: &[f64],
    vc: &[f64],
    start: usize,
    len: usize,
) -> Vec<(Vec<f64>, f64, f64)> {
    let rep = a.nh / a.nkv;
    let row = a.nkv * a.hd;
    (0..a.nh)
        .map(|h| {
            let qh = &q[h * a.hd..(h + 1) * a.hd];
            let at = |j: usize| (start + j) * row + (h / rep) * a.hd;
            let s: Vec<f64> = (0..len)
                .map(|j| {
                    qh.iter()
                        .zip(&kc[at(j)..at(j) + a.hd])
                        .map(|(x, y)| x * y)
                        .sum::<f64>()
                        * a.scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut acc = vec![0.0; a.hd];
            let mut l = 0.0;
            for (j, &sj) in s.iter().enumerate() {
                let e = (sj - m).exp();
                l += e;
                for (d, v) in vc[at(j)..at(j) + a.hd].iter().enumerate() {
                    acc[d] += e * v;
                }
            }
            (acc, m, l)
        })
        .collect()
}

/// Normalised attention output `[nh, hd]`.
fn attention(a: Attn, q: &[f64], kc: &[f64], vc: &[f64], start: usize, len: usize) -> Vec<f64> {
    attention_partial(a, q, kc, vc, start, len)
        .into_iter()
        .flat_map(|(acc, _, l)| acc.into_iter().map(move |x| x / l))
        .collect()
}

/// `[acc | m | l]` per head, as a partial-write shard lays it out.
fn partial_layout(parts: &[(Vec<f64>, f64, f64)]) -> Vec<f64> {
    parts
        .iter()
        .flat_map(|(acc, m, l)| acc.iter().copied().chain([*m, *l]))
        .collect()
}

/// ATTENTION_COMBINE of `[heads, hd + 2]` partials.
fn combine(parts: &[Vec<f64>], hd: usize) -> Vec<f64> {
    let stride = hd + 2;
    let heads = parts.first().map_or(0, |p| p.len() / stride);
    let mut out = Vec::with_capacity(heads * hd);
    for h in 0..heads {
        let b = h * stride;
        let m = parts
            .iter()
            .map(|p| p[b + hd])
            .fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = parts
            .iter()
            .map(|p| {
                if p[b + hd + 1] > 0.0 {
                    (p[b + hd] - m).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let l: f64 = parts.iter().zip(&w).map(|(p, w)| p[b + hd + 1] * w).sum();
        for d in 0..hd {
            let acc: f64 = parts.iter().zip(&w).map(|(p, w)| p[b + d] * w).sum();
            out.push(acc / l.max(1e-20));
        }
    }
    out
}

fn argmax_rows(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .map(|row| {
            let mut best = 0;
            for (j, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = j;
                }
            }
            best as f64
        })
        .collect()
}

// ---- one case per opcode -----------------------------------------------------------------------

fn op_nop(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(1);
    let x = t.input("x", DType::F32, &[2, 3]);
    let y = t.output("y", DType::F32, &[2, 3]);
    let n1 = t.task(Opcode::NOP, &[], &[], &[], &[]);
    let n2 = t.task(Opcode::NOP, &[], &[], &[(n1, 1)], &[]);
    t.task(Opcode::COPY, &[x], &[y], &[(n2, 1)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![("y", in_vals(ins, "x")?)])
    })
}

fn op_copy(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(2);
    let x = t.input("x", DType::F32, &[2, 6]);
    let ids = t.input("ids", DType::I32, &[4]);
    let y = t.output("y", DType::F32, &[3, 4]);
    let yb = t.output("y_bf16", DType::BF16, &[12]);
    let yi = t.output("y_ids", DType::I32, &[2, 2]);
    t.task(Opcode::COPY, &[x], &[y], &[], &[]);
    t.task(Opcode::COPY, &[x], &[yb], &[], &[]);
    t.task(Opcode::COPY, &[ids], &[yi], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        Ok(vec![
            ("y", xv.clone()),
            ("y_bf16", xv),
            ("y_ids", in_vals(ins, "ids")?),
        ])
    })
}

fn op_embed(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(3);
    let ids = t.input("ids", DType::I32, &[3]);
    let (table, tv) = t.weight("table", DType::F32, &[7, 5], -1.0, 1.0);
    let y = t.output("y", DType::F32, &[3, 5]);
    t.task(
        Opcode::EMBED,
        &[ids, table],
        &[y],
        &[],
        &[("hidden", int(5))],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let want = in_vals(ins, "ids")?
            .iter()
            .flat_map(|&id| tv[id as usize * 5..id as usize * 5 + 5].to_vec())
            .collect();
        Ok(vec![("y", want)])
    })
}

fn op_rmsnorm(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(4);
    let x = t.input("x", DType::F32, &[2, 8]);
    let (w, wv) = t.weight("w", DType::F32, &[8], 0.5, 1.5);
    let y = t.output("y", DType::F32, &[2, 8]);
    t.task(
        Opcode::RMSNORM,
        &[x, w],
        &[y],
        &[],
        &[("eps", real(1e-5)), ("hidden", int(8))],
    );
    // Row tiles: tasks writing disjoint rows of one output (short rows; rows of 1,536, whose
    // two-row tile takes the GPU's wide warp rows and whose one-row tile the block's row).
    let mut tiled = Vec::new();
    for (name, rows, h, cuts) in [("y_rows", 5, 8, [0, 3, 5]), ("y_wide", 3, 1536, [0, 2, 3])] {
        let xr = t.input(&format!("x{name}"), DType::F32, &[rows, h]);
        let (wr, wrv) = t.weight(&format!("w{name}"), DType::F32, &[h], 0.5, 1.5);
        let yr = t.output(name, DType::F32, &[rows, h]);
        let c = t.counter();
        for m in cuts.windows(2) {
            let pr = [
                ("eps", real(1e-5)),
                ("hidden", int(h as i64)),
                ("m_off", int(m[0])),
                ("M_tile", int(m[1] - m[0])),
                ("n_off", int(0)),
                ("N_tile", int(h as i64)),
            ];
            t.task_on(c, Opcode::RMSNORM, &[xr, wr], &[yr], &[], &pr);
        }
        tiled.push((name, format!("x{name}"), wrv));
    }
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let mut want = vec![("y", rmsnorm(&in_vals(ins, "x")?, &wv, 1e-5))];
        for (name, x, wrv) in &tiled {
            want.push((*name, rmsnorm(&in_vals(ins, x)?, wrv, 1e-5)));
        }
        Ok(want)
    })
}

fn op_layernorm(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(5);
    let x = t.input("x", DType::F32, &[3, 8]);
    let (w, wv) = t.weight("w", DType::F32, &[8], 0.5, 1.5);
    let (b, bv) = t.weight("b", DType::F32, &[8], -0.5, 0.5);
    let y = t.output("y", DType::F32, &[3, 8]);
    let y2 = t.output("y_nobias", DType::F32, &[3, 8]);
    let pr = [("eps", real(1e-5)), ("hidden", int(8))];
    t.task(Opcode::LAYERNORM, &[x, w, b], &[y], &[], &pr);
    t.task(Opcode::LAYERNORM, &[x, w], &[y2], &[], &pr);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        Ok(vec![
            ("y", layernorm(&xv, &wv, Some(&bv), 1e-5)),
            ("y_nobias", layernorm(&xv, &wv, None, 1e-5)),
        ])
    })
}

fn op_gemv_tile(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(6);
    let x = t.input("x", DType::F32, &[1, 12]);
    let (w, wv) = t.weight("w", DType::F32, &[10, 12], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", DType::F32, &[10], -0.5, 0.5);
    let (qw, qv) = t.weight("qw", DType::I8, &[6, 12], -7.0, 7.0);
    let (sc, sv) = t.weight("scales", DType::F16, &[6, 3], 0.01, 0.1);
    let y = t.output("y", DType::F32, &[1, 10]);
    let yq = t.output("y_int8", DType::F32, &[1, 6]);
    t.task(
        Opcode::GEMV_TILE,
        &[x, w, bias],
        &[y],
        &[],
        &[("K", int(12)), ("N_tile", int(10)), ("n_off", int(0))],
    );
    t.task(
        Opcode::GEMV_TILE,
        &[x, qw, sc],
        &[yq],
        &[],
        &[
            ("K", int(12)),
            ("N_tile", int(6)),
            ("n_off", int(0)),
            ("qdtype", int(6)),
            ("group", int(4)),
        ],
    );
    // The int8 weight as real numbers: q[n, k] * scales[n, k / 4].
    let deq: Vec<f64> = (0..6 * 12)
        .map(|i| qv[i] * sv[(i / 12) * 3 + (i % 12) / 4])
        .collect();
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        Ok(vec![
            ("y", linear(&xv, &wv, 12, Some(&bv))),
            ("y_int8", linear(&xv, &deq, 12, None)),
        ])
    })
}

fn op_gemm_tile(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(7);
    let x = t.input("x", DType::F32, &[3, 8]);
    let (w, wv) = t.weight("w", DType::F32, &[5, 8], -0.5, 0.5);
    let y = t.output("y", DType::F32, &[3, 5]);
    t.task(
        Opcode::GEMM_TILE,
        &[x, w],
        &[y],
        &[],
        &[
            ("K", int(8)),
            ("N_tile", int(5)),
            ("n_off", int(0)),
            ("M_tile", int(3)),
        ],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![("y", linear(&in_vals(ins, "x")?, &wv, 8, None))])
    })
}

fn op_attention_tile(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(8);
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 4,
        scale: 0.5,
    };
    let q = t.input("q", DType::F32, &[4, 4]);
    let (kc, kv) = t.weight("kcache", DType::F32, &[6, 2, 4], -1.0, 1.0);
    let (vc, vv) = t.weight("vcache", DType::F32, &[6, 2, 4], -1.0, 1.0);
    let y = t.output("y", DType::F32, &[4, 4]);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc],
        &[y],
        &[],
        &[
            ("head_dim", int(4)),
            ("kv_start", int(1)),
            ("kv_len", int(4)),
            ("scale", real(0.5)),
            ("n_heads", int(4)),
            ("n_kv_heads", int(2)),
        ],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![(
            "y",
            attention(a, &in_vals(ins, "q")?, &kv, &vv, 1, 4),
        )])
    })
}

/// One ATTENTION_TILE of an [`attention_paths`] case: output name, q / cache dtype, geometry,
/// cache rows `[start, start + len)`, and whether it writes a partial `[acc | m | l]` shard.
struct PathCase {
    out: &'static str,
    dt: DType,
    a: Attn,
    start: usize,
    len: usize,
    partial: bool,
}

/// Independent ATTENTION_TILE tasks over `[48, nkv, hd]` caches, each against the formula.
/// The geometries are those at which the CUDA kernel changes path (ops/attention-tile: the
/// tiny path up to 16 rows with head_dim / 8 a power of two, the fast path's one-row batches
/// up to 32 rows, its four-row batches beyond, the generic path), so every path is checked on
/// every backend.
fn attention_paths(c: &Ctx<'_>, seed: u64, cases: &[PathCase], tol: Tol) -> CaseResult {
    const MAX_SEQ: u64 = 48;
    let mut t = Tiny::new(seed);
    let mut caches = Vec::new();
    for (i, p) in cases.iter().enumerate() {
        let (nh, nkv, hd) = (p.a.nh as u64, p.a.nkv as u64, p.a.hd as u64);
        let q = t.input(&format!("q{i}"), p.dt, &[nh, hd]);
        let shape = [MAX_SEQ, nkv, hd];
        let (kc, kv) = t.weight(&format!("kcache{i}"), p.dt, &shape, -1.0, 1.0);
        let (vc, vv) = t.weight(&format!("vcache{i}"), p.dt, &shape, -1.0, 1.0);
        let (odt, width) = if p.partial {
            (DType::F32, hd + 2)
        } else {
            (p.dt, hd)
        };
        let y = t.output(p.out, odt, &[nh, width]);
        let mut params = attention_params(p.a, p.start, p.len);
        if p.partial {
            params.push(("flags", int(2)));
        }
        t.task(Opcode::ATTENTION_TILE, &[q, kc, vc], &[y], &[], &params);
        caches.push((kv, vv));
    }
    check_formula(c, t, 2, tol, no_change, |ins| {
        cases
            .iter()
            .zip(&caches)
            .enumerate()
            .map(|(i, (p, (kv, vv)))| {
                let q = in_vals(ins, &format!("q{i}"))?;
                let y = if p.partial {
                    partial_layout(&attention_partial(p.a, &q, kv, vv, p.start, p.len))
                } else {
                    attention(p.a, &q, kv, vv, p.start, p.len)
                };
                Ok((p.out, y))
            })
            .collect()
    })
}

fn op_attention_tile_paths_bf16(c: &Ctx<'_>) -> CaseResult {
    let gqa = |hd: usize| Attn {
        nh: 8,
        nkv: 2,
        hd,
        scale: 1.0 / (hd as f64).sqrt(),
    };
    let case = |out, a, start, len| PathCase {
        out,
        dt: DType::BF16,
        a,
        start,
        len,
        partial: false,
    };
    // six heads of 64: the second warp of the tiny path runs two heads and two idle groups
    let six = Attn {
        nh: 6,
        nkv: 3,
        hd: 64,
        scale: 0.125,
    };
    let one_to_one = Attn {
        nh: 4,
        nkv: 4,
        hd: 128,
        scale: 1.0 / 128f64.sqrt(),
    };
    let hd96 = Attn {
        nh: 6,
        nkv: 3,
        hd: 96,
        scale: 1.0 / 96f64.sqrt(),
    };
    let cases = [
        case("one_row", gqa(64), 0, 1),
        case("tiny_bound", gqa(64), 3, 32),
        case("first_fast", gqa(64), 0, 33),
        case("four_row_batches", gqa(64), 2, 40),
        case("idle_groups", six, 5, 2),
        case("head_dim_128", one_to_one, 1, 5),
        // head_dim 96 (12 lanes, not a power of two): the fast path's one-row batches
        case("head_dim_96", hd96, 0, 3),
        case("head_dim_96_short_bound", hd96, 16, 32),
        case("head_dim_4", gqa(4), 7, 4),
    ];
    // bf16 outputs: the formula's value rounded to bf16 (the tolerance adds bf16's epsilon)
    let tol = Tol {
        rtol: 1e-3,
        atol: 1e-3,
    };
    attention_paths(c, 41, &cases, tol)
}

fn op_attention_tile_paths_f32(c: &Ctx<'_>) -> CaseResult {
    let a = |nh, nkv, hd: usize| Attn {
        nh,
        nkv,
        hd,
        scale: 1.0 / (hd as f64).sqrt(),
    };
    let case = |out, a, start, len, partial| PathCase {
        out,
        dt: DType::F32,
        a,
        start,
        len,
        partial,
    };
    let cases = [
        case("tiny", a(8, 2, 64), 4, 9, false),
        case("tiny_bound", a(8, 2, 64), 1, 32, false),
        case("one_row_batches", a(6, 3, 96), 1, 20, false),
        case("long", a(8, 2, 64), 0, 33, false),
        case("tiny_shard", a(4, 1, 32), 2, 6, true),
        case("tiny_shard_bound", a(4, 1, 32), 3, 32, true),
        case("fast_shard", a(4, 1, 32), 3, 37, true),
        case("empty_shard", a(4, 1, 32), 5, 0, true),
        // a trailing split-KV shard: empty, starting at max_seq (nothing may be read)
        case("empty_shard_at_end", a(4, 1, 32), 48, 0, true),
        // head_dim 8, 16 and 256: one, two and thirty-two lanes per head on the tiny path
        case("head_dim_8", a(8, 8, 8), 0, 3, false),
        case("head_dim_16", a(4, 2, 16), 6, 2, false),
        case("head_dim_256", a(2, 1, 256), 1, 4, false),
    ];
    attention_paths(c, 42, &cases, F32_TOL)
}

fn op_rope(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(9);
    let x = t.input("x", DType::F32, &[3, 8]);
    let pos = t.input("pos", DType::I32, &[1]);
    let xb = t.input("xb", DType::F32, &[2, 3, 4]);
    let posb = t.input("posb", DType::I32, &[2]);
    let y = t.output("y", DType::F32, &[3, 8]);
    let yb = t.output("yb", DType::F32, &[2, 3, 4]);
    // Llama 3's frequency factors: a third input of head_dim / 2 divisors.
    let (fac, facv) = t.weight("factors", DType::F32, &[4], 1.0, 8.0);
    let ys = t.output("ys", DType::F32, &[3, 8]);
    t.task(
        Opcode::ROPE,
        &[x, pos, fac],
        &[ys],
        &[],
        &[("head_dim", int(8)), ("theta", real(10000.0))],
    );
    t.task(
        Opcode::ROPE,
        &[x, pos],
        &[y],
        &[],
        &[("head_dim", int(8)), ("theta", real(10000.0))],
    );
    t.task(
        Opcode::ROPE,
        &[xb, posb],
        &[yb],
        &[],
        &[("head_dim", int(4)), ("theta", real(500.0))],
    );
    let tol = Tol {
        rtol: 1e-4,
        atol: 1e-4,
    };
    check_formula(c, t, 2, tol, no_change, |ins| {
        Ok(vec![
            (
                "y",
                rope(&in_vals(ins, "x")?, &in_vals(ins, "pos")?, 8, 10000.0),
            ),
            (
                "ys",
                rope_scaled(
                    &in_vals(ins, "x")?,
                    &in_vals(ins, "pos")?,
                    8,
                    10000.0,
                    &facv,
                ),
            ),
            (
                "yb",
                rope(&in_vals(ins, "xb")?, &in_vals(ins, "posb")?, 4, 500.0),
            ),
        ])
    })
}

fn op_silu_mul(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(10);
    let g = t.input("gate", DType::F32, &[1, 10]);
    let u = t.input("up", DType::F32, &[1, 10]);
    let y = t.output("y", DType::F32, &[1, 10]);
    t.task(Opcode::SILU_MUL, &[g, u], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let (g, u) = (in_vals(ins, "gate")?, in_vals(ins, "up")?);
        Ok(vec![(
            "y",
            g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect(),
        )])
    })
}

fn op_gelu(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(11);
    let x = t.input("x", DType::F32, &[2, 7]);
    let y = t.output("y", DType::F32, &[2, 7]);
    t.task(Opcode::GELU, &[x], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![(
            "y",
            in_vals(ins, "x")?.into_iter().map(gelu).collect(),
        )])
    })
}

fn op_add(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(12);
    let a = t.input("a", DType::F32, &[3, 5]);
    let b = t.input("b", DType::F32, &[15]);
    let y = t.output("y", DType::F32, &[3, 5]);
    t.task(Opcode::ADD, &[a, b], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let (a, b) = (in_vals(ins, "a")?, in_vals(ins, "b")?);
        Ok(vec![("y", a.iter().zip(&b).map(|(a, b)| a + b).collect())])
    })
}

fn op_mul(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(13);
    let a = t.input("a", DType::F32, &[2, 6]);
    let b = t.input("b", DType::F32, &[2, 6]);
    let y = t.output("y", DType::F32, &[2, 6]);
    let ys = t.output("y_scaled", DType::F32, &[2, 6]);
    t.task(Opcode::MUL, &[a, b], &[y], &[], &[]);
    t.task(Opcode::MUL, &[a], &[ys], &[], &[("scale", real(-1.75))]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let (a, b) = (in_vals(ins, "a")?, in_vals(ins, "b")?);
        Ok(vec![
            ("y", a.iter().zip(&b).map(|(a, b)| a * b).collect()),
            ("y_scaled", a.iter().map(|a| a * -1.75).collect()),
        ])
    })
}

fn op_dequant(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(14);
    let (q, qv) = t.weight("q", DType::I8, &[4, 8], -7.0, 7.0);
    let (s, sv) = t.weight("scales", DType::F32, &[8], 0.01, 0.5);
    let x = t.input("x", DType::F32, &[4, 8]);
    let d = t.act("wdq", &[4, 8]);
    let y = t.output("y", DType::F32, &[4, 8]);
    let cd = t.task(
        Opcode::DEQUANT,
        &[q, s],
        &[d],
        &[],
        &[("qdtype", int(6)), ("group", int(4))],
    );
    // Multiply by an input so each step's output differs.
    t.task(Opcode::MUL, &[d, x], &[y], &[(cd, 1)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        Ok(vec![(
            "y",
            (0..32).map(|i| qv[i] * sv[i / 4] * xv[i]).collect(),
        )])
    })
}

fn op_softmax(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(15);
    let x = t.input("x", DType::F32, &[3, 6]);
    let y = t.output("y", DType::F32, &[3, 6]);
    let y0 = t.output("y_dim0", DType::F32, &[3, 6]);
    t.task(Opcode::SOFTMAX, &[x], &[y], &[], &[("dim", int(-1))]);
    t.task(Opcode::SOFTMAX, &[x], &[y0], &[], &[("dim", int(0))]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        // Along dim 0: transpose, softmax rows of 3, transpose back.
        let tr: Vec<f64> = (0..18).map(|i| xv[(i % 3) * 6 + i / 3]).collect();
        let s0 = softmax_rows(&tr, 3);
        let back: Vec<f64> = (0..18).map(|i| s0[(i % 6) * 3 + i / 6]).collect();
        Ok(vec![("y", softmax_rows(&xv, 6)), ("y_dim0", back)])
    })
}

fn op_allreduce_shard(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(16);
    let a = t.input("a", DType::F32, &[2, 4]);
    let b = t.input("b", DType::F32, &[2, 4]);
    let d = t.input("d", DType::F32, &[8]);
    let y = t.output("y", DType::F32, &[2, 4]);
    t.task(Opcode::ALLREDUCE_SHARD, &[a, b, d], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let (a, b, d) = (in_vals(ins, "a")?, in_vals(ins, "b")?, in_vals(ins, "d")?);
        Ok(vec![("y", (0..8).map(|i| a[i] + b[i] + d[i]).collect())])
    })
}

fn op_kv_append(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(17);
    let new = t.input("k_new", DType::F32, &[1, 2, 4]);
    let cache = t.kv("kcache", &[5, 2, 4]);
    let y = t.output("cache_out", DType::F32, &[5, 2, 4]);
    let ca = t.task(
        Opcode::KV_APPEND,
        &[new, cache],
        &[cache],
        &[],
        &[("pos", int(3))],
    );
    t.task(Opcode::COPY, &[cache], &[y], &[(ca, 1)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let nv = in_vals(ins, "k_new")?;
        let mut want = vec![0.0; 40];
        want[24..32].copy_from_slice(&nv);
        Ok(vec![("cache_out", want)])
    })
}

fn op_sample_argmax(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(18);
    let x = t.input("logits", DType::F32, &[3, 9]);
    let y = t.output("token", DType::I32, &[3]);
    t.task(Opcode::SAMPLE_ARGMAX, &[x], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![("token", argmax_rows(&in_vals(ins, "logits")?, 9))])
    })
}

fn op_attention_combine(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(19);
    let (heads, hd) = (3usize, 4usize);
    let shape = [heads as u64, hd as u64 + 2];
    let parts: Vec<BufferId> = (0..3)
        .map(|i| t.input(&format!("part{i}"), DType::F32, &shape))
        .collect();
    let y = t.output("y", DType::F32, &[heads as u64, hd as u64]);
    t.task(
        Opcode::ATTENTION_COMBINE,
        &parts,
        &[y],
        &[],
        &[
            ("head_dim", int(hd as i64)),
            ("n_heads", int(heads as i64)),
            ("n_kv_heads", int(1)),
        ],
    );
    // Valid partials: l > 0 with its running max m; head 1 of part 2 is an empty shard.
    let make = |ins: &mut Inputs, rng: &mut SplitMix| {
        for p in 0..3 {
            let mut v = vals(&random_nonzero(DType::F32, &shape, rng, -1.0, 1.0));
            for h in 0..heads {
                let b = h * (hd + 2);
                if p == 2 && h == 1 {
                    v[b..b + hd].iter_mut().for_each(|x| *x = 0.0);
                    v[b + hd] = f64::NEG_INFINITY;
                    v[b + hd + 1] = 0.0;
                } else {
                    v[b + hd] *= 2.0;
                    v[b + hd + 1] = 0.5 + v[b + hd + 1].abs() * 2.0;
                }
            }
            let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            if let Ok(t) = Tensor::from_f32(DType::F32, &shape, &f) {
                set_input(ins, &format!("part{p}"), t);
            }
        }
    };
    check_formula(c, t, 2, F32_TOL, make, |ins| {
        let ps = (0..3)
            .map(|p| in_vals(ins, &format!("part{p}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(vec![("y", combine(&ps, hd))])
    })
}

fn op_fused(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(20);
    let x = t.input("x", DType::F32, &[2, 5]);
    let y = t.output("y", DType::F32, &[2, 5]);
    t.task(
        Opcode::FUSED,
        &[x],
        &[y],
        &[],
        &[("recipe", r#gen::gelu_scale_recipe())],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![(
            "y",
            in_vals(ins, "x")?
                .into_iter()
                .map(|v| gelu(v) * 0.5)
                .collect(),
        )])
    })
}

// ---- hand-built DAGs ---------------------------------------------------------------------------

fn op_rmsnorm_gemv(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(41);
    let x = t.input("x", DType::F32, &[1, 24]);
    let (nw, nwv) = t.weight("norm", DType::F32, &[24], 0.5, 1.5);
    let (w, wv) = t.weight("w", DType::F32, &[10, 24], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", DType::F32, &[10], -0.5, 0.5);
    let x13 = t.input("x13", DType::F32, &[1, 13]);
    let (nw13, nw13v) = t.weight("norm13", DType::F32, &[13], 0.5, 1.5);
    let (w13, w13v) = t.weight("w13", DType::F32, &[5, 13], -0.5, 0.5);
    let y = t.output("y", DType::F32, &[1, 10]);
    let y13 = t.output("y13", DType::F32, &[1, 5]);
    let ct = t.counter();
    for (off, nt) in [(0, 6), (6, 4)] {
        t.task_on(
            ct,
            Opcode::RMSNORM_GEMV,
            &[x, nw, w, bias],
            &[y],
            &[],
            &[
                ("eps", real(1e-5)),
                ("K", int(24)),
                ("N_tile", int(nt)),
                ("n_off", int(off)),
            ],
        );
    }
    t.task(
        Opcode::RMSNORM_GEMV,
        &[x13, nw13, w13],
        &[y13],
        &[],
        &[
            ("eps", real(1e-6)),
            ("K", int(13)),
            ("N_tile", int(5)),
            ("n_off", int(0)),
        ],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xn = rmsnorm(&in_vals(ins, "x")?, &nwv, 1e-5);
        let xn13 = rmsnorm(&in_vals(ins, "x13")?, &nw13v, 1e-6);
        Ok(vec![
            ("y", linear(&xn, &wv, 24, Some(&bv))),
            ("y13", linear(&xn13, &w13v, 13, None)),
        ])
    })
}

/// ATTENTION_GEMV on the three attention paths of the CUDA kernel: bf16 GQA over 5 rows (tiny
/// path; the row rounded to bf16 before the products, as the op specifies), f32 over 40 rows
/// (fast path) and f32 with head_dim 12 (generic path), each with its tiles of a projection.
fn op_attention_gemv(c: &Ctx<'_>) -> CaseResult {
    const MAX_SEQ: u64 = 48;
    struct Part {
        a: Attn,
        dt: DType,
        wdt: DType,
        start: u64,
        len: u64,
        n: u64,
        tiles: &'static [(u64, u64)],
        bias: bool,
        out: &'static str,
    }
    let a = |nh, nkv, hd: usize| Attn {
        nh,
        nkv,
        hd,
        scale: 1.0 / (hd as f64).sqrt(),
    };
    let parts = [
        Part {
            a: a(8, 2, 64),
            dt: DType::BF16,
            wdt: DType::BF16,
            start: 2,
            len: 5,
            n: 24,
            tiles: &[(0, 16), (16, 8)],
            bias: true,
            out: "y_tiny",
        },
        Part {
            a: a(4, 1, 32),
            dt: DType::F32,
            wdt: DType::F32,
            start: 0,
            len: 40,
            n: 10,
            tiles: &[(0, 10)],
            bias: false,
            out: "y_fast",
        },
        Part {
            a: a(3, 3, 12),
            dt: DType::F32,
            wdt: DType::F16,
            start: 1,
            len: 6,
            n: 7,
            tiles: &[(0, 3), (3, 4)],
            bias: true,
            out: "y_generic",
        },
    ];
    let mut t = Tiny::new(43);
    let mut vals = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let (nh, nkv, hd) = (p.a.nh as u64, p.a.nkv as u64, p.a.hd as u64);
        let k = nh * hd;
        let q = t.input(&format!("q{i}"), p.dt, &[nh, hd]);
        let shape = [MAX_SEQ, nkv, hd];
        let (kc, kv) = t.weight(&format!("kcache{i}"), p.dt, &shape, -1.0, 1.0);
        let (vc, vv) = t.weight(&format!("vcache{i}"), p.dt, &shape, -1.0, 1.0);
        let (w, wv) = t.weight(&format!("w{i}"), p.wdt, &[p.n, k], -0.5, 0.5);
        let mut ins = vec![q, kc, vc, w];
        let bv = if p.bias {
            let (b, bv) = t.weight(&format!("bias{i}"), p.dt, &[p.n], -0.5, 0.5);
            ins.push(b);
            Some(bv)
        } else {
            None
        };
        let y = t.output(p.out, DType::F32, &[1, p.n]);
        let ct = t.counter();
        for &(off, nt) in p.tiles {
            let mut params = attention_params(p.a, p.start as usize, p.len as usize);
            params.extend([
                ("K", int(k as i64)),
                ("N_tile", int(nt as i64)),
                ("n_off", int(off as i64)),
            ]);
            t.task_on(ct, Opcode::ATTENTION_GEMV, &ins, &[y], &[], &params);
        }
        vals.push((kv, vv, wv, bv));
    }
    let tol = Tol {
        rtol: 1e-3,
        atol: 1e-4,
    };
    check_formula(c, t, 2, tol, no_change, |ins| {
        parts
            .iter()
            .zip(&vals)
            .enumerate()
            .map(|(i, (p, (kv, vv, wv, bv)))| {
                let q = in_vals(ins, &format!("q{i}"))?;
                let (start, len) = (p.start as usize, p.len as usize);
                // the attention row as the op keeps it: rounded to q's dtype
                let row: Vec<f64> = attention(p.a, &q, kv, vv, start, len)
                    .into_iter()
                    .map(|v| amk_core::round_to(p.dt, v as f32) as f64)
                    .collect();
                Ok((p.out, linear(&row, wv, p.a.nh * p.a.hd, bv.as_deref())))
            })
            .collect()
    })
}

/// A step's position as the IO input `pos` (I32 `[1]`), from `positions` in turn.
fn position_steps(positions: &[usize]) -> impl FnMut(&mut Inputs, &mut SplitMix) + '_ {
    let mut step = 0usize;
    move |ins: &mut Inputs, _: &mut SplitMix| {
        let p = positions[step % positions.len()];
        step += 1;
        set_input(
            ins,
            "pos",
            Tensor::from_i64(DType::I32, &[1], &[p as i64])
                .unwrap_or_else(|_| Tensor::zeros(DType::I32, &[1])),
        );
    }
}

/// Rows of the window `[start, start + len)` at or before position `p`.
fn rows_upto(start: usize, len: usize, p: usize) -> usize {
    (start..start + len).filter(|&j| j <= p).count()
}

/// bf16 attention with the position in device memory, on the CUDA kernel's paths: caches of 48
/// rows (weights, so every step sees the same rows) at positions 3, 40 and 20 (the tiny path,
/// its plan made before the wait; the fast path's four-row batches; the tiny path again). An
/// ATTENTION_TILE and ATTENTION_GEMV tiles over the whole cache read the position input (final
/// before the wait); their twins over rows `[2, 30)` (which the window clips at 40) read a copy
/// of it that a task writes (read after the wait), the GEMV twin with a bias. Every row-loop
/// task is a one-pass bf16 row, so the CUDA kernel takes its pre path (AMK_ROW_PRE) where the
/// position allows it.
fn op_attention_pos_bf16(c: &Ctx<'_>) -> CaseResult {
    const MAX_SEQ: usize = 48;
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 16,
        scale: 0.25,
    };
    let k = a.nh * a.hd;
    let (late_start, late_len) = (2usize, 28usize);
    let mut t = Tiny::new(44);
    let q = t.input("q", DType::BF16, &[4, 16]);
    let pos = t.input("pos", DType::I32, &[1]);
    let pos_dev =
        t.p.new_buffer("pos_dev", BufferKind::ACTIVATION, DType::I32, &[1]);
    let shape = [MAX_SEQ as u64, 2, 16];
    let (kc, kv) = t.weight("kcache", DType::BF16, &shape, -1.0, 1.0);
    let (vc, vv) = t.weight("vcache", DType::BF16, &shape, -1.0, 1.0);
    let (w, wv) = t.weight("w", DType::BF16, &[8, k as u64], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", DType::BF16, &[8], -0.5, 0.5);
    let cp = t.task(Opcode::COPY, &[pos], &[pos_dev], &[], &[]);
    let attn = t.output("attn", DType::F32, &[4, 16]);
    let whole = attention_params(a, 0, MAX_SEQ);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc, pos],
        &[attn],
        &[],
        &whole,
    );
    let attn_late = t.output("attn_late", DType::F32, &[4, 16]);
    let window = attention_params(a, late_start, late_len);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc, pos_dev],
        &[attn_late],
        &[(cp, 1)],
        &window,
    );
    let tile = |params: &[(&'static str, Value)], off: i64, nt: i64| with_tile(params, k, off, nt);
    let y = t.output("y", DType::F32, &[1, 8]);
    let cy = t.counter();
    for (off, nt) in [(0, 4), (4, 4)] {
        let p = tile(&whole, off, nt);
        t.task_on(
            cy,
            Opcode::ATTENTION_GEMV,
            &[q, kc, vc, w, pos],
            &[y],
            &[],
            &p,
        );
    }
    let y_late = t.output("y_late", DType::F32, &[1, 8]);
    t.task(
        Opcode::ATTENTION_GEMV,
        &[q, kc, vc, w, bias, pos_dev],
        &[y_late],
        &[(cp, 1)],
        &tile(&window, 0, 8),
    );
    // bf16 rows: the attention row rounds to bf16 before the products, so one element may
    // round the other way than the formula's; a wrong window moves the outputs far more.
    let tol = Tol {
        rtol: 5e-3,
        atol: 5e-3,
    };
    let positions = [3usize, 40, 20];
    check_formula(c, t, 3, tol, position_steps(&positions), |ins| {
        let p = in_vals(ins, "pos")?[0] as usize;
        let qv = in_vals(ins, "q")?;
        let full = attention(a, &qv, &kv, &vv, 0, p + 1);
        let late = attention(
            a,
            &qv,
            &kv,
            &vv,
            late_start,
            rows_upto(late_start, late_len, p),
        );
        let bf16 = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .map(|&x| amk_core::round_to(DType::BF16, x as f32) as f64)
                .collect()
        };
        Ok(vec![
            ("y", linear(&bf16(&full), &wv, k, None)),
            ("y_late", linear(&bf16(&late), &wv, k, Some(&bv))),
            ("attn", full),
            ("attn_late", late),
        ])
    })
}

fn op_gate_up_silu(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(42);
    let x = t.input("x", DType::F32, &[1, 16]);
    let (nw, nwv) = t.weight("norm", DType::F32, &[16], 0.5, 1.5);
    let (wg, wgv) = t.weight("wg", DType::F32, &[12, 16], -0.5, 0.5);
    let (wu, wuv) = t.weight("wu", DType::F32, &[12, 16], -0.5, 0.5);
    let x10 = t.input("x10", DType::F32, &[1, 10]);
    let (wg10, wg10v) = t.weight("wg10", DType::F32, &[3, 10], -0.5, 0.5);
    let (wu10, wu10v) = t.weight("wu10", DType::F32, &[3, 10], -0.5, 0.5);
    let y = t.output("y", DType::F32, &[1, 12]);
    let yp = t.output("y_plain", DType::F32, &[1, 12]);
    let y10 = t.output("y10", DType::F32, &[1, 3]);
    let ct = t.counter();
    for (off, nt) in [(0, 8), (8, 4)] {
        let tile = [("K", int(16)), ("N_tile", int(nt)), ("n_off", int(off))];
        let mut normed = tile.to_vec();
        normed.push(("eps", real(1e-5)));
        t.task_on(
            ct,
            Opcode::GATE_UP_SILU,
            &[x, wg, wu, nw],
            &[y],
            &[],
            &normed,
        );
    }
    let tile = [("K", int(16)), ("N_tile", int(12)), ("n_off", int(0))];
    t.task(Opcode::GATE_UP_SILU, &[x, wg, wu], &[yp], &[], &tile);
    let tile10 = [("K", int(10)), ("N_tile", int(3)), ("n_off", int(0))];
    t.task(
        Opcode::GATE_UP_SILU,
        &[x10, wg10, wu10],
        &[y10],
        &[],
        &tile10,
    );
    let swiglu = |x: &[f64], wg: &[f64], wu: &[f64], k: usize| -> Vec<f64> {
        let (g, u) = (linear(x, wg, k, None), linear(x, wu, k, None));
        g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect()
    };
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        let xn = rmsnorm(&xv, &nwv, 1e-5);
        Ok(vec![
            ("y", swiglu(&xn, &wgv, &wuv, 16)),
            ("y_plain", swiglu(&xv, &wgv, &wuv, 16)),
            ("y10", swiglu(&in_vals(ins, "x10")?, &wg10v, &wu10v, 10)),
        ])
    })
}

fn op_qkv_rope_append(c: &Ctx<'_>) -> CaseResult {
    qkv_rope_append_case(c, QkvParts::default())
}

fn op_qkv_rope_append_factors(c: &Ctx<'_>) -> CaseResult {
    let parts = QkvParts {
        factors: true,
        ..QkvParts::default()
    };
    qkv_rope_append_case(c, parts)
}

fn op_qkv_rope_append_qk_norm(c: &Ctx<'_>) -> CaseResult {
    let parts = QkvParts {
        qk_norm: true,
        ..QkvParts::default()
    };
    qkv_rope_append_case(c, parts)
}

/// The optional parts of a [`qkv_rope_append_case`].
#[derive(Debug, Clone, Copy, Default)]
struct QkvParts {
    /// Llama 3's frequency divisors as the last input (`rope_factors` = 1).
    factors: bool,
    /// Qwen3's per-head q/k norm weights (`qk_norm` = 1), in tiles of whole heads.
    qk_norm: bool,
}

/// RMSNORM of every head of `v` (rows of `w.len()` elements) with weight `w`, when given.
fn head_rmsnorm(v: Vec<f64>, w: Option<&[f64]>) -> Vec<f64> {
    w.map_or(v.clone(), |w| rmsnorm(&v, w, 1e-5))
}

/// QKV_ROPE_APPEND tiles over three steps, with the optional `parts`.
fn qkv_rope_append_case(c: &Ctx<'_>, parts: QkvParts) -> CaseResult {
    let with_factors = parts.factors;
    let (nh, nkv, hd, k, seq) = (2usize, 1usize, 8usize, 16usize, 4usize);
    let theta = 10000.0;
    let mut t = Tiny::new(43);
    let x = t.input("x", DType::F32, &[1, k as u64]);
    let pos = t.input("pos", DType::I32, &[1]);
    let (nw, nwv) = t.weight("norm", DType::F32, &[k as u64], 0.5, 1.5);
    let (wq, wqv) = t.weight("wq", DType::F32, &[(nh * hd) as u64, k as u64], -0.5, 0.5);
    let (wk, wkv) = t.weight("wk", DType::F32, &[(nkv * hd) as u64, k as u64], -0.5, 0.5);
    let (wv, wvv) = t.weight("wv", DType::F32, &[(nkv * hd) as u64, k as u64], -0.5, 0.5);
    let q = t.output("q", DType::F32, &[nh as u64, hd as u64]);
    let kc = t.kv("kcache", &[seq as u64, nkv as u64, hd as u64]);
    let vc = t.kv("vcache", &[seq as u64, nkv as u64, hd as u64]);
    let k_out = t.output("k_all", DType::F32, &[seq as u64, nkv as u64, hd as u64]);
    let v_out = t.output("v_all", DType::F32, &[seq as u64, nkv as u64, hd as u64]);
    let (fac, facv) = t.weight("factors", DType::F32, &[hd as u64 / 2], 1.0, 8.0);
    let facv = if with_factors { facv } else { Vec::new() };
    let (qn, qnv) = t.weight("q_norm", DType::F32, &[hd as u64], 0.5, 1.5);
    let (kn, knv) = t.weight("k_norm", DType::F32, &[hd as u64], 0.5, 1.5);
    let (qnv, knv) = (parts.qk_norm.then_some(qnv), parts.qk_norm.then_some(knv));
    let ct = t.counter();
    // Two tiles: units [0, 20) (Q heads and half of K) and [20, 32); with the per-head norms,
    // whole heads: [0, 16) (the Q heads) and [16, 32) (K and V).
    let tiles = if parts.qk_norm {
        [(0, 16), (16, 16)]
    } else {
        [(0, 20), (20, 12)]
    };
    for (off, nt) in tiles {
        let mut ins = vec![x, wq, wk, wv, pos, nw];
        let mut params = vec![
            ("K", int(k as i64)),
            ("N_tile", int(nt)),
            ("n_off", int(off)),
            ("head_dim", int(hd as i64)),
            ("n_heads", int(nh as i64)),
            ("n_kv_heads", int(nkv as i64)),
            ("theta", real(theta)),
            ("eps", real(1e-5)),
        ];
        if parts.qk_norm {
            ins.extend([qn, kn]);
            params.push(("qk_norm", int(1)));
        }
        if with_factors {
            ins.push(fac);
            params.push(("rope_factors", int(1)));
        }
        t.task_on(
            ct,
            Opcode::QKV_ROPE_APPEND,
            &ins,
            &[q, kc, vc],
            &[],
            &params,
        );
    }
    t.task(Opcode::COPY, &[kc], &[k_out], &[(ct, 2)], &[]);
    t.task(Opcode::COPY, &[vc], &[v_out], &[(ct, 2)], &[]);
    // Three steps at positions 1, 3, 1: the caches keep the rows of earlier steps, and the
    // row written twice holds the last step's values.
    let positions = [1usize, 3, 1];
    let steps = std::cell::Cell::new(0usize);
    let set_pos = |ins: &mut Inputs, _: &mut SplitMix| {
        let p = positions[steps.get() % positions.len()];
        steps.set(steps.get() + 1);
        set_input(
            ins,
            "pos",
            Tensor::from_f32(DType::I32, &[1], &[p as f32])
                .unwrap_or_else(|_| Tensor::zeros(DType::I32, &[1])),
        );
    };
    let row = nkv * hd;
    let k_all = std::cell::RefCell::new(vec![0.0; seq * row]);
    let v_all = std::cell::RefCell::new(vec![0.0; seq * row]);
    check_formula(c, t, 3, F32_TOL, set_pos, |ins| {
        let xn = rmsnorm(&in_vals(ins, "x")?, &nwv, 1e-5);
        let p = in_vals(ins, "pos")?[0] as usize;
        let pv = [p as f64];
        let (mut ka, mut va) = (k_all.borrow_mut(), v_all.borrow_mut());
        ka[p * row..(p + 1) * row].copy_from_slice(&rope_scaled(
            &head_rmsnorm(linear(&xn, &wkv, k, None), knv.as_deref()),
            &pv,
            hd,
            theta,
            &facv,
        ));
        va[p * row..(p + 1) * row].copy_from_slice(&linear(&xn, &wvv, k, None));
        Ok(vec![
            (
                "q",
                rope_scaled(
                    &head_rmsnorm(linear(&xn, &wqv, k, None), qnv.as_deref()),
                    &pv,
                    hd,
                    theta,
                    &facv,
                ),
            ),
            ("k_all", ka.clone()),
            ("v_all", va.clone()),
        ])
    })
}

/// The settings of one iteration of [`op_next_token`].
#[derive(Clone, Copy)]
struct NtStep {
    p: i64,
    prompt_len: i64,
    end: i64,
    top_k: i64,
    seed: u64,
    limit: i64,
    temperature: f32,
    top_p: f32,
    /// The stop ids hold the greedy token (and, when forcing, the prompt token fed).
    stop_hit: bool,
}

const NT_ROWS: u64 = 16;
/// What `emitted` holds before every step: rows NEXT_TOKEN must not touch keep it.
const NT_UNTOUCHED: i64 = -7;
const NT_PROMPT: [i64; 8] = [3, 17, 42, 5, 9, 1, 2, 0];
const NT_BASE: NtStep = NtStep {
    p: 4,
    prompt_len: 4,
    end: 100,
    top_k: 0,
    seed: 0x5EED_0000_0000_0001,
    limit: 0,
    temperature: 0.0,
    top_p: 1.0,
    stop_hit: false,
};
/// Forcing (a stop id that does not halt), greedy, plain sampling, top-k + top-p, top-p with a
/// vocabulary limit, greedy onto a stop id, sampling into the last row of `emitted` at the end,
/// another seed.
const NT_STEPS: [NtStep; 8] = [
    NtStep {
        p: 1,
        temperature: 1.0,
        stop_hit: true,
        ..NT_BASE
    },
    NT_BASE,
    NtStep {
        p: 5,
        temperature: 1.0,
        ..NT_BASE
    },
    NtStep {
        p: 6,
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        ..NT_BASE
    },
    NtStep {
        p: 7,
        temperature: 1.3,
        top_p: 0.5,
        limit: -2, // V / 2, set per case
        ..NT_BASE
    },
    NtStep {
        p: 8,
        stop_hit: true,
        ..NT_BASE
    },
    NtStep {
        p: 14,
        end: 16,
        temperature: 1.0,
        top_k: 5,
        ..NT_BASE
    },
    NtStep {
        p: 10,
        temperature: 0.7,
        top_p: 0.95,
        seed: 0xFEED_FACE_CAFE_BEEF,
        ..NT_BASE
    },
];

/// NEXT_TOKEN, the tail of an on-device decode iteration, over the steps of [`NT_STEPS`] in one
/// session (the position and `emitted` are activations set from IO inputs by COPYs, advanced
/// and written by NEXT_TOKEN, copied out), f32 logits `[1, 300]` and bf16 logits `[2000]`.
/// Against the oracle: tokens, halts and positions exactly, `emitted` exactly except the
/// log-probability words (to 1e-5). Against the formula: the prompt token while forcing (no
/// row emitted, no halt on a stop id), the greedy token and its f64 log-probability, ids below
/// the vocabulary limit, the halts, and no row but q written.
fn op_next_token(c: &Ctx<'_>) -> CaseResult {
    next_token_case(c, 26, DType::F32, &[1, 300])
        .map_err(|e| fail(format!("f32 logits [1, 300]: {e}")))?;
    next_token_case(c, 27, DType::BF16, &[2000])
        .map_err(|e| fail(format!("bf16 logits [2000]: {e}")))
}

fn next_token_case(c: &Ctx<'_>, seed: u64, dtype: DType, shape: &[u64]) -> CaseResult {
    let v = shape.iter().product::<u64>() as usize;
    let mut t = Tiny::new(seed);
    let logits = t.input("logits", dtype, shape);
    let pos_in = t.input("pos_in", DType::I32, &[1]);
    let prompt = t.input("prompt", DType::I32, &[NT_PROMPT.len() as u64]);
    let stop = t.input("stop", DType::I32, &[3]);
    let limits = t.input("limits", DType::I32, &[6]);
    let sampling = t.input("sampling", DType::F32, &[2]);
    let em_in = t.input("emitted_in", DType::I32, &[NT_ROWS, 2]);
    let pos =
        t.p.new_buffer("pos", BufferKind::ACTIVATION, DType::I32, &[1]);
    let em =
        t.p.new_buffer("em", BufferKind::ACTIVATION, DType::I32, &[NT_ROWS, 2]);
    let token = t.output("token", DType::I32, &[1]);
    let halt = t.output("halt", DType::I32, &[1]);
    let pos_out = t.output("pos_out", DType::I32, &[1]);
    let emitted = t.output("emitted", DType::I32, &[NT_ROWS, 2]);
    let cp = t.task(Opcode::COPY, &[pos_in], &[pos], &[], &[]);
    let ce = t.task(Opcode::COPY, &[em_in], &[em], &[], &[]);
    let cn = t.task(
        Opcode::NEXT_TOKEN,
        &[logits, pos, prompt, stop, limits, sampling],
        &[pos, token, halt, em],
        &[(cp, 1), (ce, 1)],
        &[],
    );
    t.task(Opcode::COPY, &[pos], &[pos_out], &[(cn, 1)], &[]);
    t.task(Opcode::COPY, &[em], &[emitted], &[(cn, 1)], &[]);
    let Tiny { p, w, mut rng } = t;

    let i32s = |vals: &[i64]| {
        Tensor::from_i64(DType::I32, &[vals.len() as u64], vals)
            .map_err(|e| fail(format!("suite bug: {e}")))
    };
    let mut steps: Vec<Inputs> = Vec::new();
    for s in &NT_STEPS {
        let x = random_nonzero(dtype, shape, &mut rng, -6.0, 6.0);
        let greedy = argmax_rows(&vals(&x), v)[0] as i64;
        let q = (s.p + 1) as usize;
        let stop_ids = match (s.stop_hit, s.p + 1 < s.prompt_len) {
            (true, true) => [-1, NT_PROMPT[q], -3],
            (true, false) => [-1, greedy, -3],
            (false, _) => [-1, -1, -1],
        };
        let limit = if s.limit < 0 { (v / 2) as i64 } else { s.limit };
        let lim = [
            s.prompt_len,
            s.end,
            s.top_k,
            s.seed as u32 as i32 as i64,
            (s.seed >> 32) as u32 as i32 as i64,
            limit,
        ];
        let em0 = Tensor::from_i64(
            DType::I32,
            &[NT_ROWS, 2],
            &[NT_UNTOUCHED; 2 * NT_ROWS as usize],
        )
        .map_err(|e| fail(format!("suite bug: {e}")))?;
        let smp = Tensor::from_f32(DType::F32, &[2], &[s.temperature, s.top_p])
            .map_err(|e| fail(format!("suite bug: {e}")))?;
        steps.push(vec![
            ("logits".to_string(), x),
            ("pos_in".to_string(), i32s(&[s.p])?),
            ("prompt".to_string(), i32s(&NT_PROMPT)?),
            ("stop".to_string(), i32s(&stop_ids)?),
            ("limits".to_string(), i32s(&lim)?),
            ("sampling".to_string(), smp),
            ("emitted_in".to_string(), em0),
        ]);
    }
    let want = run_steps(&c.oracle, &c.registry, &p, &w, &steps)
        .map_err(|e| fail(format!("oracle: {e}")))?;
    let got = run_steps(c.backend, &c.registry, &p, &w, &steps)?;

    for (k, ((s, ins), (g, o))) in NT_STEPS
        .iter()
        .zip(&steps)
        .zip(got.iter().zip(&want))
        .enumerate()
    {
        let get = |out: &Outputs, name: &str| output(out, name, k).map(vals);
        let (g_tok, g_halt, g_pos, g_em) = (
            get(g, "token")?[0],
            get(g, "halt")?[0],
            get(g, "pos_out")?[0],
            get(g, "emitted")?,
        );
        let (o_tok, o_halt, o_pos, o_em) = (
            get(o, "token")?[0],
            get(o, "halt")?[0],
            get(o, "pos_out")?[0],
            get(o, "emitted")?,
        );
        let q = s.p + 1;
        let forcing = q < s.prompt_len;
        let lp_word = if forcing {
            usize::MAX
        } else {
            2 * q as usize + 1
        };
        let as_f32 = |word: f64| f32::from_bits(word as i64 as i32 as u32);
        // The backend against the oracle.
        if (g_tok, g_halt, g_pos) != (o_tok, o_halt, o_pos) {
            return Err(fail(format!(
                "step {k}: (token, halt, pos) = ({g_tok}, {g_halt}, {g_pos}), the oracle's \
                 ({o_tok}, {o_halt}, {o_pos})"
            )));
        }
        for (i, (&ge, &oe)) in g_em.iter().zip(&o_em).enumerate() {
            let same = if i == lp_word {
                let (gl, ol) = (as_f32(ge) as f64, as_f32(oe) as f64);
                (gl.is_nan() && ol.is_nan()) || (gl - ol).abs() <= 1e-5 * ol.abs().max(1.0)
            } else {
                ge == oe
            };
            if !same {
                return Err(fail(format!(
                    "step {k}: emitted element {i} is {ge}, the oracle's {oe} (q = {q})"
                )));
            }
        }
        // Both against the formula.
        let x = in_vals(ins, "logits")?;
        let stop_ids = in_vals(ins, "stop")?;
        let limit = in_vals(ins, "limits")?[5] as usize;
        let vp = if limit > 0 { limit.min(v) } else { v };
        let mut why = Vec::new();
        if g_pos != q as f64 {
            why.push(format!("pos {g_pos}, want {q}"));
        }
        for (i, &e) in g_em.iter().enumerate() {
            let row_q = !forcing && i / 2 == q as usize;
            if !row_q && e != NT_UNTOUCHED as f64 {
                why.push(format!("emitted element {i} = {e} was written"));
            }
        }
        let want_halt =
            (!forcing && stop_ids.iter().any(|&id| id >= 0.0 && id == g_tok)) || q + 1 >= s.end;
        if g_halt != f64::from(u8::from(want_halt)) {
            why.push(format!("halt {g_halt}, want {want_halt}"));
        }
        if forcing {
            if g_tok != NT_PROMPT[q as usize] as f64 {
                why.push(format!(
                    "forced token {g_tok}, want {}",
                    NT_PROMPT[q as usize]
                ));
            }
        } else {
            if !(0.0..vp as f64).contains(&g_tok) {
                why.push(format!("token {g_tok} outside [0, {vp})"));
            }
            if g_em[2 * q as usize] != g_tok {
                why.push(format!(
                    "emitted token {}, want {g_tok}",
                    g_em[2 * q as usize]
                ));
            }
            // The log-probability at temperature 1 over [0, vp).
            let m = x[..vp].iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + x[..vp].iter().map(|l| (l - m).exp()).sum::<f64>().ln();
            let lp = x[g_tok as usize] - lse;
            let got_lp = as_f32(g_em[2 * q as usize + 1]) as f64;
            if (got_lp - lp).abs() > 1e-5 * lp.abs().max(1.0) {
                why.push(format!("log-probability {got_lp}, want {lp}"));
            }
            if s.temperature == 0.0 {
                let greedy = argmax_rows(&x[..vp], vp)[0];
                if g_tok != greedy {
                    why.push(format!("greedy token {g_tok}, want {greedy}"));
                }
            }
        }
        if !why.is_empty() {
            return Err(fail(format!("step {k} (q = {q}): {}", why.join("; "))));
        }
    }
    Ok(())
}

/// Tiles `[x, w(, extra..)] -> out` of widths `widths` (summing to N) on one new counter.
fn gemv_tiles(
    t: &mut Tiny,
    ins: &[BufferId],
    out: BufferId,
    k: i64,
    widths: &[i64],
    waits: &[(CounterId, i64)],
    extra: &[(&str, Value)],
) -> (CounterId, i64) {
    let c = t.counter();
    let mut off = 0;
    for &w in widths {
        let mut pr = vec![("K", int(k)), ("N_tile", int(w)), ("n_off", int(off))];
        pr.extend(extra.iter().cloned());
        t.task_on(c, Opcode::GEMV_TILE, ins, &[out], waits, &pr);
        off += w;
    }
    (c, widths.len() as i64)
}

fn dag_chain(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(21);
    let (h, i) = (16u64, 24u64);
    let x = t.input("x", DType::F32, &[1, h]);
    let (nw, nwv) = t.weight("norm", DType::F32, &[h], 0.5, 1.5);
    let (wg, wgv) = t.weight("gate", DType::F32, &[i, h], -0.5, 0.5);
    let (wu, wuv) = t.weight("up", DType::F32, &[i, h], -0.5, 0.5);
    let (wd, wdv) = t.weight("down", DType::F32, &[h, i], -0.5, 0.5);
    let (bd, bdv) = t.weight("down_bias", DType::F32, &[h], -0.5, 0.5);
    let xn = t.act("xn", &[1, h]);
    let g = t.act("g", &[1, i]);
    let u = t.act("u", &[1, i]);
    let a = t.act("a", &[1, i]);
    let d = t.act("d", &[1, h]);
    let y = t.output("y", DType::F32, &[1, h]);
    let probs = t.output("probs", DType::F32, &[1, h]);
    let cn = t.task(
        Opcode::RMSNORM,
        &[x, nw],
        &[xn],
        &[],
        &[("eps", real(1e-6)), ("hidden", int(h as i64))],
    );
    let wg_ = gemv_tiles(&mut t, &[xn, wg], g, h as i64, &[8, 8, 8], &[(cn, 1)], &[]);
    let wu_ = gemv_tiles(&mut t, &[xn, wu], u, h as i64, &[5, 19], &[(cn, 1)], &[]);
    let ca = t.task(Opcode::SILU_MUL, &[g, u], &[a], &[wg_, wu_], &[]);
    let wd_ = gemv_tiles(
        &mut t,
        &[a, wd, bd],
        d,
        i as i64,
        &[3, 6, 7],
        &[(ca, 1)],
        &[],
    );
    let cy = t.task(Opcode::ADD, &[x, d], &[y], &[wd_], &[]);
    t.task(Opcode::SOFTMAX, &[y], &[probs], &[(cy, 1)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        let xn = rmsnorm(&xv, &nwv, 1e-6);
        let g = linear(&xn, &wgv, h as usize, None);
        let u = linear(&xn, &wuv, h as usize, None);
        let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        let d = linear(&a, &wdv, i as usize, Some(&bdv));
        let y: Vec<f64> = xv.iter().zip(&d).map(|(x, d)| x + d).collect();
        Ok(vec![("probs", softmax_rows(&y, h as usize)), ("y", y)])
    })
}

fn dag_fan_in(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(22);
    let x = t.input("x", DType::F32, &[2, 4]);
    let parts: Vec<BufferId> = (0..4).map(|k| t.act(&format!("p{k}"), &[2, 4])).collect();
    let y = t.output("sum", DType::F32, &[2, 4]);
    let y2 = t.output("pair", DType::F32, &[2, 4]);
    let cp = t.counter();
    t.task_on(cp, Opcode::COPY, &[x], &[parts[0]], &[], &[]);
    t.task_on(
        cp,
        Opcode::MUL,
        &[x],
        &[parts[1]],
        &[],
        &[("scale", real(2.5))],
    );
    t.task_on(cp, Opcode::GELU, &[x], &[parts[2]], &[], &[]);
    t.task_on(
        cp,
        Opcode::FUSED,
        &[x],
        &[parts[3]],
        &[],
        &[("recipe", r#gen::gelu_scale_recipe())],
    );
    let barrier = t.task(Opcode::NOP, &[], &[], &[(cp, 4)], &[]);
    t.task(Opcode::ALLREDUCE_SHARD, &parts, &[y], &[(barrier, 1)], &[]);
    t.task(Opcode::ADD, &[parts[1], parts[3]], &[y2], &[(cp, 4)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        let p: Vec<[f64; 4]> = xv
            .iter()
            .map(|&v| [v, v * 2.5, gelu(v), gelu(v) * 0.5])
            .collect();
        Ok(vec![
            ("sum", p.iter().map(|q| q.iter().sum()).collect()),
            ("pair", p.iter().map(|q| q[1] + q[3]).collect()),
        ])
    })
}

fn dag_tiled_groups(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(23);
    let (k, n) = (16u64, 20u64);
    let x = t.input("x", DType::F32, &[1, k]);
    let (qw, qv) = t.weight("qw", DType::I8, &[n, k], -7.0, 7.0);
    let (sc, sv) = t.weight("scales", DType::F32, &[n, 2], 0.01, 0.1);
    let y = t.output("y", DType::F32, &[1, n]);
    gemv_tiles(
        &mut t,
        &[x, qw, sc],
        y,
        k as i64,
        &[1, 7, 4, 5, 3],
        &[],
        &[("qdtype", int(6)), ("group", int(8))],
    );
    // GEMM over a DEQUANT-produced weight: 2 row tiles x 3 column tiles.
    let (m, n2) = (3u64, 9u64);
    let xm = t.input("xm", DType::F32, &[m, k]);
    let (q2, q2v) = t.weight("q2", DType::I8, &[n2, k], -7.0, 7.0);
    let (s2, s2v) = t.weight("s2", DType::F32, &[n2 * k / 4], 0.01, 0.1);
    let w2 = t.act("w2", &[n2, k]);
    let ym = t.output("ym", DType::F32, &[m, n2]);
    let cd = t.task(
        Opcode::DEQUANT,
        &[q2, s2],
        &[w2],
        &[],
        &[("qdtype", int(6)), ("group", int(4))],
    );
    let cm = t.counter();
    for (r0, rl) in [(0i64, 2i64), (2, 1)] {
        for (c0, cl) in [(0i64, 4i64), (4, 2), (6, 3)] {
            t.task_on(
                cm,
                Opcode::GEMM_TILE,
                &[xm, w2],
                &[ym],
                &[(cd, 1)],
                &[
                    ("K", int(k as i64)),
                    ("N_tile", int(cl)),
                    ("n_off", int(c0)),
                    ("M_tile", int(rl)),
                    ("m_off", int(r0)),
                ],
            );
        }
    }
    let ku = k as usize;
    let deq: Vec<f64> = (0..(n as usize) * ku)
        .map(|i| qv[i] * sv[(i / ku) * 2 + (i % ku) / 8])
        .collect();
    let deq2: Vec<f64> = (0..(n2 as usize) * ku)
        .map(|i| q2v[i] * s2v[i / 4])
        .collect();
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![
            ("y", linear(&in_vals(ins, "x")?, &deq, ku, None)),
            ("ym", linear(&in_vals(ins, "xm")?, &deq2, ku, None)),
        ])
    })
}

fn dag_split_kv(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(24);
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 8,
        scale: 0.25,
    };
    let (max_seq, len) = (10u64, 7u64);
    let row = [2u64, 8];
    let q = t.input("q", DType::F32, &[4, 8]);
    let kn = t.input("k_rows", DType::F32, &[len, row[0], row[1]]);
    let vn = t.input("v_rows", DType::F32, &[len, row[0], row[1]]);
    let kc = t.kv("kcache", &[max_seq, row[0], row[1]]);
    let vc = t.kv("vcache", &[max_seq, row[0], row[1]]);
    let start = 1i64;
    let ck = t.task(
        Opcode::KV_APPEND,
        &[kn, kc],
        &[kc],
        &[],
        &[("pos", int(start))],
    );
    let cv = t.task(
        Opcode::KV_APPEND,
        &[vn, vc],
        &[vc],
        &[],
        &[("pos", int(start))],
    );
    let attn_params = |s: i64, l: i64, partial: bool| {
        let mut p = vec![
            ("head_dim", int(8)),
            ("kv_start", int(s)),
            ("kv_len", int(l)),
            ("scale", real(0.25)),
            ("n_heads", int(4)),
            ("n_kv_heads", int(2)),
        ];
        if partial {
            p.push(("flags", int(2)));
        }
        p
    };
    let shards = [(1i64, 3i64), (4, 0), (4, 2), (6, 2)];
    let mut parts = Vec::new();
    let mut waits = Vec::new();
    for (i, &(s, l)) in shards.iter().enumerate() {
        let part = t.act(&format!("partial{i}"), &[4, 10]);
        let cs = t.task(
            Opcode::ATTENTION_TILE,
            &[q, kc, vc],
            &[part],
            &[(ck, 1), (cv, 1)],
            &attn_params(s, l, true),
        );
        parts.push(part);
        waits.push((cs, 1));
    }
    let y = t.output("combined", DType::F32, &[1, 32]);
    let yf = t.output("full", DType::F32, &[4, 8]);
    let p0 = t.output("partial0_out", DType::F32, &[4, 10]);
    t.task(
        Opcode::ATTENTION_COMBINE,
        &parts,
        &[y],
        &waits,
        &[
            ("head_dim", int(8)),
            ("n_heads", int(4)),
            ("n_kv_heads", int(2)),
        ],
    );
    t.task(Opcode::COPY, &[parts[0]], &[p0], &[waits[0]], &[]);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc],
        &[yf],
        &[(ck, 1), (cv, 1)],
        &attn_params(start, len as i64, false),
    );
    let ms = max_seq as usize;
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let rowlen = 16;
        let mut kcv = vec![0.0; ms * rowlen];
        let mut vcv = vec![0.0; ms * rowlen];
        let s = start as usize;
        let l = len as usize;
        kcv[s * rowlen..(s + l) * rowlen].copy_from_slice(&in_vals(ins, "k_rows")?);
        vcv[s * rowlen..(s + l) * rowlen].copy_from_slice(&in_vals(ins, "v_rows")?);
        let qv = in_vals(ins, "q")?;
        let full = attention(a, &qv, &kcv, &vcv, s, l);
        let p0 = partial_layout(&attention_partial(a, &qv, &kcv, &vcv, 1, 3));
        Ok(vec![
            ("combined", full.clone()),
            ("full", full),
            ("partial0_out", p0),
        ])
    })
}

fn dag_kv_append_steps(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(25);
    let a = Attn {
        nh: 2,
        nkv: 1,
        hd: 4,
        scale: 0.5,
    };
    let q = t.input("q", DType::F32, &[2, 4]);
    let kn = t.input("k_rows", DType::F32, &[2, 1, 4]);
    let vn = t.input("v_row", DType::F32, &[4]);
    let kc = t.kv("kcache", &[6, 1, 4]);
    let vc = t.kv("vcache", &[6, 1, 4]);
    // Two key rows at 2..4, one value row at 3; rows 0, 1 and 4 of the window stay zero.
    // (One KV_APPEND per cache: the validator refuses two, even ordered ones, because the
    // earlier append reads the cache the later one writes.)
    let ck = t.task(Opcode::KV_APPEND, &[kn, kc], &[kc], &[], &[("pos", int(2))]);
    let cv = t.task(Opcode::KV_APPEND, &[vn, vc], &[vc], &[], &[("pos", int(3))]);
    let y = t.output("attn", DType::F32, &[2, 4]);
    let kout = t.output("kcache_out", DType::F32, &[24]);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc],
        &[y],
        &[(ck, 1), (cv, 1)],
        &[
            ("head_dim", int(4)),
            ("kv_start", int(0)),
            ("kv_len", int(5)),
            ("scale", real(0.5)),
            ("n_heads", int(2)),
            ("n_kv_heads", int(1)),
        ],
    );
    t.task(Opcode::COPY, &[kc], &[kout], &[(ck, 1)], &[]);
    let Tiny { p, w, mut rng } = t;
    let s0 = random_inputs(&p, &mut rng);
    let s1 = random_inputs(&p, &mut rng);
    // Step 2 sets nothing: every input keeps its step-1 value.
    let steps = vec![s0.clone(), s1.clone(), Vec::new()];
    let got = run_steps(c.backend, &c.registry, &p, &w, &steps)?;
    for (k, (o, ins)) in got.iter().zip([&s0, &s1, &s1]).enumerate() {
        let mut kcv = vec![0.0; 24];
        let mut vcv = vec![0.0; 24];
        kcv[8..16].copy_from_slice(&in_vals(ins, "k_rows")?);
        vcv[12..16].copy_from_slice(&in_vals(ins, "v_row")?);
        let want = attention(a, &in_vals(ins, "q")?, &kcv, &vcv, 0, 5);
        close(
            &format!("step {k}: output 'attn'"),
            output(o, "attn", k)?,
            &want,
            F32_TOL,
        )?;
        close(
            &format!("step {k}: output 'kcache_out'"),
            output(o, "kcache_out", k)?,
            &kcv,
            F32_TOL,
        )?;
    }
    Ok(())
}

/// `params` and a column tile's: `K` = `k`, `N_tile` = `nt`, `n_off` = `off`.
fn with_tile(
    params: &[(&'static str, Value)],
    k: usize,
    off: i64,
    nt: i64,
) -> Vec<(&'static str, Value)> {
    let mut p = params.to_vec();
    p.extend([
        ("K", int(k as i64)),
        ("N_tile", int(nt)),
        ("n_off", int(off)),
    ]);
    p
}

/// What the position-in-device-memory decode cases share: the operands of one decode step
/// over an 8-row cache of 2 KV heads × 8 (`q [4, 8]`, the step's K/V rows, the position as an
/// input and as `pos_dev`, a copy a task of the launch writes), a weight `[6, 32]` and a bias,
/// and the tasks that append the rows (K at `pos`, V at `pos_dev`, after the copy).
struct DecodeStep {
    q: BufferId,
    pos: BufferId,
    pos_dev: BufferId,
    kc: BufferId,
    vc: BufferId,
    w: BufferId,
    bias: BufferId,
    /// The values of `w` and `bias`.
    wv: Vec<f64>,
    bv: Vec<f64>,
    /// The copy's counter, and what a reader of the caches waits for.
    copied: CounterId,
    appended: [(CounterId, i64); 3],
}

/// Rows of the decode cases' caches.
const DECODE_ROWS: usize = 8;

fn decode_step(t: &mut Tiny) -> DecodeStep {
    let q = t.input("q", DType::F32, &[4, 8]);
    let kn = t.input("k_row", DType::F32, &[1, 2, 8]);
    let vn = t.input("v_row", DType::F32, &[1, 16]);
    let pos = t.input("pos", DType::I32, &[1]);
    let pos_dev =
        t.p.new_buffer("pos_dev", BufferKind::ACTIVATION, DType::I32, &[1]);
    let kc = t.kv("kcache", &[DECODE_ROWS as u64, 2, 8]);
    let vc = t.kv("vcache", &[DECODE_ROWS as u64, 2, 8]);
    let (w, wv) = t.weight("w", DType::F32, &[6, 32], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", DType::F32, &[6], -0.5, 0.5);
    let cp = t.task(Opcode::COPY, &[pos], &[pos_dev], &[], &[]);
    let ck = t.task(Opcode::KV_APPEND, &[kn, kc, pos], &[kc], &[], &[]);
    let cv = t.task(
        Opcode::KV_APPEND,
        &[vn, vc, pos_dev],
        &[vc],
        &[(cp, 1)],
        &[],
    );
    DecodeStep {
        q,
        pos,
        pos_dev,
        kc,
        vc,
        w,
        bias,
        wv,
        bv,
        copied: cp,
        appended: [(ck, 1), (cv, 1), (cp, 1)],
    }
}

/// The formula's side of a decode step: writes the step's K/V rows (`k_row`, `v_row` of `ins`)
/// at row `pos` of the mirrored caches `kc`, `vc` (rows of `row` elements); returns `pos`.
fn mirror_append(
    ins: &Inputs,
    kc: &mut [f64],
    vc: &mut [f64],
    row: usize,
) -> Result<usize, Failure> {
    let p = in_vals(ins, "pos")?[0] as usize;
    kc[p * row..(p + 1) * row].copy_from_slice(&in_vals(ins, "k_row")?);
    vc[p * row..(p + 1) * row].copy_from_slice(&in_vals(ins, "v_row")?);
    Ok(p)
}

/// Three decode steps at positions 1, 4 and 7 over caches of 8 rows with the position in
/// device memory: KV_APPEND k reads the position input, KV_APPEND v a copy of it that a task
/// writes (which the CUDA kernel reads after the wait, the input before it); an ATTENTION_TILE
/// over the whole cache and one over rows `[0, 6)` (the window clips the last step); split-KV
/// shards `[0, 3)`, `[3, 6)`, `[6, 8)` that the position leaves empty in the early steps, and
/// their combine; ATTENTION_GEMV tiles without a bias (the input) and with one (the copy). The
/// caches keep earlier steps' rows; rows no step writes stay zero.
fn dag_position_decode(c: &Ctx<'_>) -> CaseResult {
    const MAX_SEQ: usize = DECODE_ROWS;
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 8,
        scale: 0.35,
    };
    let (row, k) = (a.nkv * a.hd, a.nh * a.hd);
    let mut t = Tiny::new(26);
    let DecodeStep {
        q,
        pos,
        pos_dev,
        kc,
        vc,
        w,
        bias,
        wv,
        bv,
        appended: kv_waits,
        ..
    } = decode_step(&mut t);
    let ck = kv_waits[0].0;
    let attn = t.output("attn", DType::F32, &[4, 8]);
    let whole = attention_params(a, 0, MAX_SEQ);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc, pos],
        &[attn],
        &kv_waits,
        &whole,
    );
    let attn6 = t.output("attn_window6", DType::F32, &[4, 8]);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc, pos_dev],
        &[attn6],
        &kv_waits,
        &attention_params(a, 0, 6),
    );
    let shards = [(0usize, 3usize), (3, 3), (6, 2)];
    let mut parts = Vec::new();
    let mut waits = Vec::new();
    for (i, &(s0, l)) in shards.iter().enumerate() {
        let part = t.act(&format!("partial{i}"), &[4, 10]);
        let mut params = attention_params(a, s0, l);
        params.push(("flags", int(2)));
        let src = if i == 2 { pos_dev } else { pos };
        let cs = t.task(
            Opcode::ATTENTION_TILE,
            &[q, kc, vc, src],
            &[part],
            &kv_waits,
            &params,
        );
        parts.push(part);
        waits.push((cs, 1));
    }
    let comb = t.output("combined", DType::F32, &[1, 32]);
    t.task(
        Opcode::ATTENTION_COMBINE,
        &parts,
        &[comb],
        &waits,
        &[
            ("head_dim", int(8)),
            ("n_heads", int(4)),
            ("n_kv_heads", int(2)),
        ],
    );
    let shard1 = t.output("shard1", DType::F32, &[4, 10]);
    t.task(Opcode::COPY, &[parts[1]], &[shard1], &[waits[1]], &[]);
    let tile = |off: i64, nt: i64| with_tile(&whole, k, off, nt);
    let proj = t.output("proj", DType::F32, &[1, 6]);
    let cg = t.counter();
    for (off, nt) in [(0, 4), (4, 2)] {
        t.task_on(
            cg,
            Opcode::ATTENTION_GEMV,
            &[q, kc, vc, w, pos],
            &[proj],
            &kv_waits,
            &tile(off, nt),
        );
    }
    let proj_b = t.output("proj_bias", DType::F32, &[1, 6]);
    t.task(
        Opcode::ATTENTION_GEMV,
        &[q, kc, vc, w, bias, pos_dev],
        &[proj_b],
        &kv_waits,
        &tile(0, 6),
    );
    let k_all = t.output("k_all", DType::F32, &[MAX_SEQ as u64, 2, 8]);
    t.task(Opcode::COPY, &[kc], &[k_all], &[(ck, 1)], &[]);
    let kcs = std::cell::RefCell::new(vec![0.0; MAX_SEQ * row]);
    let vcs = std::cell::RefCell::new(vec![0.0; MAX_SEQ * row]);
    let positions = [1usize, 4, 7];
    check_formula(c, t, 3, F32_TOL, position_steps(&positions), |ins| {
        let (mut kcv, mut vcv) = (kcs.borrow_mut(), vcs.borrow_mut());
        let p = mirror_append(ins, &mut kcv, &mut vcv, row)?;
        let qv = in_vals(ins, "q")?;
        let full = attention(a, &qv, &kcv, &vcv, 0, p + 1);
        let s1 = attention_partial(a, &qv, &kcv, &vcv, 3, rows_upto(3, 3, p));
        Ok(vec![
            ("attn", full.clone()),
            (
                "attn_window6",
                attention(a, &qv, &kcv, &vcv, 0, rows_upto(0, 6, p)),
            ),
            ("combined", full.clone()),
            ("shard1", partial_layout(&s1)),
            ("proj", linear(&full, &wv, k, None)),
            ("proj_bias", linear(&full, &wv, k, Some(&bv))),
            ("k_all", kcv.clone()),
        ])
    })
}

/// A decode step of the split-KV attention (2 KV heads × 3 splits of whole 2-row chunks over
/// an 8-row cache) at positions 1, 4 and 7 (one, three and two active splits): the splits of
/// KV head 0 read the position input (final before the launch), those of KV head 1 a copy a
/// task of the launch writes (read after their wait); COMBINE_GEMV tiles with and without a
/// bias, reading either. Checked against the f64 attention over rows `0..=p` times W.
fn dag_split_kv_decode(c: &Ctx<'_>) -> CaseResult {
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 8,
        scale: 0.35,
    };
    let (k, n_splits) = (a.nh * a.hd, 3usize);
    let tile = (a.nh / a.nkv) * (a.hd + 2);
    let mut t = Tiny::new(27);
    let DecodeStep {
        q,
        pos,
        pos_dev,
        kc,
        vc,
        w,
        bias,
        wv,
        bv,
        copied: cp,
        appended: waits,
    } = decode_step(&mut t);
    let parts = t.act("partials", &[2, n_splits as u64, 2, 10]);
    let shape = [
        ("head_dim", int(a.hd as i64)),
        ("n_heads", int(a.nh as i64)),
        ("n_kv_heads", int(a.nkv as i64)),
        ("n_splits", int(n_splits as i64)),
        ("chunk", int(2)),
    ];
    let cs = t.counter();
    for i in 0..a.nkv * n_splits {
        let mut pr = shape.to_vec();
        pr.extend([
            ("scale", Value::Float(a.scale)),
            ("N_tile", int(tile as i64)),
            ("n_off", int((i * tile) as i64)),
        ]);
        let src = if i < n_splits { pos } else { pos_dev };
        t.task_on(
            cs,
            Opcode::ATTENTION_SPLIT,
            &[q, kc, vc, src],
            &[parts],
            &waits,
            &pr,
        );
    }
    let all = (cs, (a.nkv * n_splits) as i64);
    let gemv = |off: i64, nt: i64| with_tile(&shape, k, off, nt);
    let proj = t.output("proj", DType::F32, &[1, 6]);
    let cg = t.counter();
    for (off, nt, src) in [(0, 4, pos), (4, 2, pos_dev)] {
        t.task_on(
            cg,
            Opcode::COMBINE_GEMV,
            &[parts, w, src],
            &[proj],
            &[all],
            &gemv(off, nt),
        );
    }
    let proj_b = t.output("proj_bias", DType::F32, &[1, 6]);
    t.task(
        Opcode::COMBINE_GEMV,
        &[parts, w, bias, pos_dev],
        &[proj_b],
        &[all, (cp, 1)],
        &gemv(0, 6),
    );
    check_full_attention(c, t, a, &[1, 4, 7], |full| {
        vec![
            ("proj", linear(&full, &wv, k, None)),
            ("proj_bias", linear(&full, &wv, k, Some(&bv))),
        ]
    })
}

/// `check_formula` over decode steps at `positions`, with caches of [`DECODE_ROWS`] rows
/// mirrored from each step's appended K/V rows: `outputs` makes the expected values from the
/// whole attention over rows `0..=p`.
fn check_full_attention(
    c: &Ctx<'_>,
    t: Tiny,
    a: Attn,
    positions: &[usize],
    outputs: impl Fn(Vec<f64>) -> Vec<(&'static str, Vec<f64>)>,
) -> CaseResult {
    let row = a.nkv * a.hd;
    let kcs = std::cell::RefCell::new(vec![0.0; DECODE_ROWS * row]);
    let vcs = std::cell::RefCell::new(vec![0.0; DECODE_ROWS * row]);
    let steps = positions.len();
    check_formula(c, t, steps, F32_TOL, position_steps(positions), |ins| {
        let (mut kcv, mut vcv) = (kcs.borrow_mut(), vcs.borrow_mut());
        let p = mirror_append(ins, &mut kcv, &mut vcv, row)?;
        Ok(outputs(attention(
            a,
            &in_vals(ins, "q")?,
            &kcv,
            &vcv,
            0,
            p + 1,
        )))
    })
}

/// One split a KV head, normalised: each KV head's task writes its query heads' rows of the
/// attention (the position read as an input one head, as a buffer a task writes the other),
/// and GEMV tiles project the row.
fn dag_split_kv_normalized(c: &Ctx<'_>) -> CaseResult {
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 8,
        scale: 0.35,
    };
    let k = a.nh * a.hd;
    let tile = (a.nh / a.nkv) * a.hd;
    let mut t = Tiny::new(29);
    let DecodeStep {
        q,
        pos,
        pos_dev,
        kc,
        vc,
        w,
        wv,
        appended: waits,
        ..
    } = decode_step(&mut t);
    let attn = t.output("attn", DType::F32, &[1, k as u64]);
    let cs = t.counter();
    for kv_head in 0..a.nkv {
        let pr = [
            ("head_dim", int(a.hd as i64)),
            ("n_heads", int(a.nh as i64)),
            ("n_kv_heads", int(a.nkv as i64)),
            ("n_splits", int(1)),
            ("chunk", int(2)),
            ("scale", Value::Float(a.scale)),
            ("N_tile", int(tile as i64)),
            ("n_off", int((kv_head * tile) as i64)),
            ("flags", int(1)), // op_attention_split::FLAG_NORMALIZED
        ];
        let src = if kv_head == 0 { pos } else { pos_dev };
        t.task_on(
            cs,
            Opcode::ATTENTION_SPLIT,
            &[q, kc, vc, src],
            &[attn],
            &waits,
            &pr,
        );
    }
    let proj = t.output("proj", DType::F32, &[1, 6]);
    let cg = t.counter();
    for (off, nt) in [(0, 4), (4, 2)] {
        t.task_on(
            cg,
            Opcode::GEMV_TILE,
            &[attn, w],
            &[proj],
            &[(cs, a.nkv as i64)],
            &[
                ("K", int(k as i64)),
                ("N_tile", int(nt)),
                ("n_off", int(off)),
            ],
        );
    }
    check_full_attention(c, t, a, &[0, 4, 7], |full| {
        vec![("proj", linear(&full, &wv, k, None)), ("attn", full)]
    })
}

// ---- generator families against the oracle ----------------------------------------------------

/// Seeds per family (each a program of about 3–100 tasks).
const FAMILY_SEEDS: u64 = 6;

fn family(c: &Ctx<'_>, f: Family) -> CaseResult {
    for seed in 0..FAMILY_SEEDS {
        let p = r#gen::generate(f, seed);
        let w = random_weights(&p, seed);
        let mut rng = SplitMix(r#gen::seed_of(&[f as u64, seed, 0xF00D]));
        let steps = [random_inputs(&p, &mut rng), random_inputs(&p, &mut rng)];
        against_oracle(c, &p, &w, &steps, MODEL_TOL).map_err(|e| {
            fail(format!(
                "{} seed {seed} ({} tasks): {e}",
                f.name(),
                p.tasks.len()
            ))
        })?;
    }
    Ok(())
}

fn family_chain(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::Chain)
}
fn family_fan_in(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::FanIn)
}
fn family_tiled(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::Tiled)
}
fn family_kv_attention(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::KvAttention)
}
fn family_split_kv(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::SplitKv)
}
fn family_sm_assigned(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::SmAssigned)
}
fn family_paged(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::Paged)
}
fn family_mixture(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::Mixture)
}

// ---- toy Llama programs ------------------------------------------------------------------------

/// A toy decode configuration: 2 layers, H 16, 4 query heads over 2 KV heads of 4, I 24,
/// vocabulary 32, tiles of 8, 8 cache rows.
fn toy_llama(pos: u64) -> LlamaConfig {
    let mut cfg = LlamaConfig::new(2, 16, 4, 2, 4, 24, 32, 8);
    cfg.max_seq = 8;
    cfg.pos = pos;
    cfg
}

/// Inputs of a [`crate::llama_like_with`] program: `token_id` as given, `pos` = the
/// configuration's position, `reshape_id0` = 0.
pub fn llama_inputs(cfg: &LlamaConfig, token: i64) -> Inputs {
    let i32_of = |v: i64| Tensor::from_i64(DType::I32, &[1], &[v]);
    let mut out = Vec::new();
    for (name, v) in [
        ("token_id", token),
        ("pos", cfg.pos as i64),
        ("reshape_id0", 0),
    ] {
        if let Ok(t) = i32_of(v) {
            out.push((name.to_string(), t));
        }
    }
    out
}

/// The logits of one decode step of [`crate::llama_like_with`] in f64: cache rows before
/// `cfg.pos` are zero (fresh caches), row `pos` holds this step's keys and values.
fn llama_f64(cfg: &LlamaConfig, w: &WeightStore, token: usize) -> Result<Vec<f64>, Failure> {
    let (h, hd, nh, nkv) = (
        cfg.hidden as usize,
        cfg.head_dim as usize,
        cfg.heads as usize,
        cfg.kv_heads as usize,
    );
    let (pos, inter) = (cfg.pos as usize, cfg.inter as usize);
    let eps = 1e-6;
    let theta = 10000.0;
    let emb = weight_vals(w, "embed.weight")?;
    let mut x = emb[token * h..(token + 1) * h].to_vec();
    let a = Attn {
        nh,
        nkv,
        hd,
        scale: 1.0 / (hd as f64).sqrt(),
    };
    let row = nkv * hd;
    for l in 0..cfg.layers {
        let wv = |s: &str| weight_vals(w, &format!("layers.{l}.{s}"));
        let an = rmsnorm(&x, &wv("input_norm")?, eps);
        let q = linear(&an, &wv("attn.q_proj.weight")?, h, None);
        let k = linear(&an, &wv("attn.k_proj.weight")?, h, None);
        let v = linear(&an, &wv("attn.v_proj.weight")?, h, None);
        let p = [pos as f64];
        let q = rope(&q, &p, hd, theta);
        let k = rope(&k, &p, hd, theta);
        let mut kc = vec![0.0; (pos + 1) * row];
        let mut vc = vec![0.0; (pos + 1) * row];
        kc[pos * row..].copy_from_slice(&k);
        vc[pos * row..].copy_from_slice(&v);
        let att = attention(a, &q, &kc, &vc, 0, pos + 1);
        let o = linear(&att, &wv("attn.o_proj.weight")?, nh * hd, None);
        let hm: Vec<f64> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
        let mn = rmsnorm(&hm, &wv("post_norm")?, eps);
        let g = linear(&mn, &wv("mlp.gate_proj.weight")?, h, None);
        let u = linear(&mn, &wv("mlp.up_proj.weight")?, h, None);
        let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        let down = linear(&act, &wv("mlp.down_proj.weight")?, inter, None);
        x = hm.iter().zip(&down).map(|(a, b)| a + b).collect();
    }
    let hf = rmsnorm(&x, &weight_vals(w, "final_norm")?, eps);
    Ok(linear(&hf, &weight_vals(w, "lm_head.weight")?, h, None))
}

/// Two steps (two tokens) of `cfg` on the backend, against the oracle and, when `f64_check`,
/// against [`llama_f64`].
fn llama_case(c: &Ctx<'_>, cfg: &LlamaConfig, f64_check: bool, tol: Tol) -> CaseResult {
    let p = r#gen::llama_like_with(cfg);
    let w = random_weights(&p, cfg.pos ^ 0x11A3A);
    let tokens = [5i64, cfg.vocab as i64 - 2];
    let steps: Vec<Inputs> = tokens.iter().map(|&t| llama_inputs(cfg, t)).collect();
    let got = against_oracle(c, &p, &w, &steps, tol)?;
    if f64_check {
        for (k, (o, &tok)) in got.iter().zip(&tokens).enumerate() {
            let want = llama_f64(cfg, &w, tok as usize)?;
            close(
                &format!("step {k} (token {tok}): logits vs f64"),
                output(o, "logits", k)?,
                &want,
                tol,
            )?;
        }
    }
    Ok(())
}

fn llama_pos0(c: &Ctx<'_>) -> CaseResult {
    llama_case(c, &toy_llama(0), true, MODEL_TOL)
}

fn llama_pos3(c: &Ctx<'_>) -> CaseResult {
    llama_case(c, &toy_llama(3), true, MODEL_TOL)
}

fn llama_split_kv(c: &Ctx<'_>) -> CaseResult {
    let mut cfg = toy_llama(5);
    cfg.split_kv = 3;
    llama_case(c, &cfg, true, MODEL_TOL)
}

fn llama_sm_pages(c: &Ctx<'_>) -> CaseResult {
    let mut cfg = toy_llama(2);
    cfg.sm_round_robin = true;
    cfg.pages = true;
    cfg.split_kv = 2;
    llama_case(c, &cfg, true, MODEL_TOL)
}

fn llama_bf16(c: &Ctx<'_>) -> CaseResult {
    let mut cfg = toy_llama(1);
    cfg.dtype = DType::BF16;
    llama_case(c, &cfg, false, BF16_TOL)
}

fn llama_wide(c: &Ctx<'_>) -> CaseResult {
    let mut cfg = LlamaConfig::new(3, 32, 8, 2, 8, 64, 64, 16);
    cfg.max_seq = 16;
    cfg.pos = 9;
    cfg.split_kv = 4;
    llama_case(c, &cfg, true, MODEL_TOL)
}

/// The f64 formula of a LINEAR_TILE over every row: `x` (RMS-normalised with `norm` = (weight,
/// eps)), times `w` (plus the bias), then the epilogue (`extra`: the residual or the up weight's values). The
/// values the op stores in `dt` at its stated rounding points (the normalised row, a product
/// before the epilogue) are rounded to `dt` here too: in bf16 they move a SwiGLU product by more
/// than the suite's tolerance.
fn linear_tile_formula(
    x: &[f64],
    (w, bias): (&[f64], Option<&[f64]>),
    k: usize,
    norm: Option<(&[f64], f64)>,
    (epi, dt): (op_linear_tile::Epilogue, DType),
    extra: &[f64],
) -> Vec<f64> {
    use op_linear_tile::Epilogue;
    let round = |v: Vec<f64>| -> Vec<f64> {
        v.into_iter()
            .map(|x| amk_core::round_to(dt, x as f32) as f64)
            .collect()
    };
    let xn = match norm {
        Some((nw, eps)) => round(rmsnorm(x, nw, eps)),
        None => x.to_vec(),
    };
    let s = linear(&xn, w, k, bias);
    if epi != Epilogue::None {
        let s = round(s);
        return match epi {
            Epilogue::Residual => s.iter().zip(extra).map(|(a, b)| a + b).collect(),
            _ => {
                let u = round(linear(&xn, extra, k, None));
                s.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect()
            }
        };
    }
    s
}

/// One LINEAR_TILE variant of [`linear_tile_case`].
struct LinearVariant {
    name: &'static str,
    norm: bool,
    bias: bool,
    epi: op_linear_tile::Epilogue,
}

/// LINEAR_TILE over `m` rows, `k` inputs and `n` columns in `dt`, as two row tiles × two column
/// tiles on one counter, for each variant: plain, RMS-normalised with the residual,
/// RMS-normalised with SwiGLU, and RMS-normalised with a bias and the residual.
fn linear_tile_case(c: &Ctx<'_>, dt: DType, m: u64, k: u64, n: u64, tol: Tol) -> CaseResult {
    use op_linear_tile::Epilogue;
    let mut t = Tiny::new(61 + k);
    let x = t.input("x", dt, &[m, k]);
    let resid = t.input("r", dt, &[m, n]);
    let (nw, nwv) = t.weight("norm", dt, &[k], 0.5, 1.5);
    let (w, wv) = t.weight("w", dt, &[n, k], -0.5, 0.5);
    let (u, uv) = t.weight("u", dt, &[n, k], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", dt, &[n], -0.5, 0.5);
    let variants = [
        LinearVariant {
            name: "y",
            norm: false,
            bias: false,
            epi: Epilogue::None,
        },
        LinearVariant {
            name: "y_norm_resid",
            norm: true,
            bias: false,
            epi: Epilogue::Residual,
        },
        LinearVariant {
            name: "y_norm_swiglu",
            norm: true,
            bias: false,
            epi: Epilogue::SwiGlu,
        },
        LinearVariant {
            name: "y_norm_bias_resid",
            norm: true,
            bias: true,
            epi: Epilogue::Residual,
        },
    ];
    let (m_split, n_split) = (m as i64 / 2 + 3, n as i64 / 2 + 5);
    for v in &variants {
        let y = t.output(v.name, dt, &[m, n]);
        let ct = t.counter();
        let mut ins = vec![x, w];
        if v.norm {
            ins.push(nw);
        }
        if v.bias {
            ins.push(bias);
        }
        match v.epi {
            // RoPE: `linear_tile_rope_case`.
            Epilogue::None | Epilogue::Rope => {}
            Epilogue::Residual => ins.push(resid),
            Epilogue::SwiGlu => ins.push(u),
        }
        for (mo, mt) in [(0, m_split), (m_split, m as i64 - m_split)] {
            for (no, nt) in [(0, n_split), (n_split, n as i64 - n_split)] {
                let mut p = vec![
                    ("K", int(k as i64)),
                    ("m_off", int(mo)),
                    ("M_tile", int(mt)),
                    ("n_off", int(no)),
                    ("N_tile", int(nt)),
                    ("epilogue", int(v.epi.code())),
                ];
                if v.norm {
                    p.push(("norm", int(1)));
                    p.push(("eps", real(1e-5)));
                }
                if v.bias {
                    p.push(("flags", int(op_linear_tile::FLAG_BIAS)));
                }
                t.task_on(ct, Opcode::LINEAR_TILE, &ins, &[y], &[], &p);
            }
        }
    }
    check_formula(c, t, 2, tol, no_change, |ins| {
        let (xv, rv) = (in_vals(ins, "x")?, in_vals(ins, "r")?);
        let k = k as usize;
        Ok(variants
            .iter()
            .map(|v| {
                let norm = v.norm.then_some((&nwv[..], 1e-5));
                let extra = if v.epi == Epilogue::SwiGlu { &uv } else { &rv };
                let bias = v.bias.then_some(&bv[..]);
                (
                    v.name,
                    linear_tile_formula(&xv, (&wv, bias), k, norm, (v.epi, dt), extra),
                )
            })
            .collect())
    })
}

fn op_linear_tile(c: &Ctx<'_>) -> CaseResult {
    linear_tile_case(c, DType::F32, 70, 40, 136, F32_TOL)
}

fn op_linear_tile_bf16(c: &Ctx<'_>) -> CaseResult {
    linear_tile_case(c, DType::BF16, 70, 96, 136, BF16_TOL)?;
    linear_tile_case(c, DType::BF16, 9, 40, 20, BF16_TOL)?;
    // Tasks of 153 and 147 rows: a wide (128-row) device tile, then a narrow one of the rest.
    linear_tile_case(c, DType::BF16, 300, 96, 136, BF16_TOL)
}

/// ATTENTION_CAUSAL over `rows` query rows at consecutive positions from a random start, in
/// three tiles (the first half of the rows whole; the second half by KV head), against the f64
/// attention of each row over the cache rows up to its position.
fn attention_causal_case(c: &Ctx<'_>, dt: DType, a: Attn, rows: u64, tol: Tol) -> CaseResult {
    const MAX_SEQ: u64 = 80;
    let width = (a.nh * a.hd) as i64;
    let mut t = Tiny::new(71 + rows);
    let q = t.input("q", dt, &[rows, width as u64]);
    let pos = t.input("pos", DType::I32, &[rows]);
    let shape = [MAX_SEQ, a.nkv as u64, a.hd as u64];
    let (kc, kv) = t.weight("kcache", dt, &shape, -1.0, 1.0);
    let (vc, vv) = t.weight("vcache", dt, &shape, -1.0, 1.0);
    let y = t.output("y", dt, &[rows, width as u64]);
    let ct = t.counter();
    let half = rows as i64 / 2;
    let group = (a.nh / a.nkv * a.hd) as i64;
    let mut tiles = vec![(0, half, 0, width)];
    for g in 0..a.nkv as i64 {
        tiles.push((half, rows as i64 - half, g * group, group));
    }
    for (mo, mt, no, nt) in tiles {
        let p = [
            ("head_dim", int(a.hd as i64)),
            ("n_heads", int(a.nh as i64)),
            ("n_kv_heads", int(a.nkv as i64)),
            ("scale", real(a.scale)),
            ("m_off", int(mo)),
            ("M_tile", int(mt)),
            ("n_off", int(no)),
            ("N_tile", int(nt)),
        ];
        t.task_on(
            ct,
            Opcode::ATTENTION_CAUSAL,
            &[q, kc, vc, pos],
            &[y],
            &[],
            &p,
        );
    }
    let make = |ins: &mut Inputs, rng: &mut SplitMix| {
        let start = (rng.next() % (MAX_SEQ - rows + 1)) as i64;
        let p: Vec<i64> = (start..start + rows as i64).collect();
        if let Ok(pt) = Tensor::from_i64(DType::I32, &[rows], &p) {
            set_input(ins, "pos", pt);
        }
    };
    check_formula(c, t, 2, tol, make, |ins| {
        let (qv, pv) = (in_vals(ins, "q")?, in_vals(ins, "pos")?);
        let w = width as usize;
        let mut want = Vec::with_capacity(qv.len());
        for (r, p) in pv.iter().enumerate() {
            let row = &qv[r * w..(r + 1) * w];
            want.extend(attention(a, row, &kv, &vv, 0, *p as usize + 1));
        }
        Ok(vec![("y", want)])
    })
}

fn op_attention_causal(c: &Ctx<'_>) -> CaseResult {
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 16,
        scale: 0.25,
    };
    attention_causal_case(c, DType::F32, a, 6, F32_TOL)
}

fn op_attention_causal_bf16(c: &Ctx<'_>) -> CaseResult {
    let a = Attn {
        nh: 6,
        nkv: 2,
        hd: 64,
        scale: 0.125,
    };
    attention_causal_case(c, DType::BF16, a, 40, BF16_TOL)?;
    let wide = Attn {
        nh: 4,
        nkv: 1,
        hd: 128,
        scale: 0.088,
    };
    attention_causal_case(c, DType::BF16, wide, 50, BF16_TOL)
}

/// LINEAR_TILE's RoPE epilogue: `m` rows at positions from a random start, heads of `hd`
/// (two heads a tile, so a device tile holds whole heads), with and without frequency
/// divisors, against the f64 RoPE of the f64 product (rounded to `dt` before the rotation, as
/// the op stores it).
fn linear_tile_rope_case(c: &Ctx<'_>, dt: DType, m: u64, k: u64, hd: u64, tol: Tol) -> CaseResult {
    let heads = 4u64;
    let n = heads * hd;
    let mut t = Tiny::new(91 + k);
    let x = t.input("x", dt, &[m, k]);
    let pos = t.input("pos", DType::I32, &[m]);
    let (w, wv) = t.weight("w", dt, &[n, k], -0.5, 0.5);
    let (fac, facv) = t.weight("fac", DType::F32, &[hd / 2], 1.0, 8.0);
    let mut outs = Vec::new();
    for (name, factors) in [("y_rope", false), ("y_rope_scaled", true)] {
        let y = t.output(name, dt, &[m, heads, hd]);
        let ct = t.counter();
        let half_rows = m as i64 / 2 + 1;
        for (mo, mt) in [(0, half_rows), (half_rows, m as i64 - half_rows)] {
            for no in [0, 2 * hd as i64] {
                let mut p = vec![
                    ("K", int(k as i64)),
                    ("m_off", int(mo)),
                    ("M_tile", int(mt)),
                    ("n_off", int(no)),
                    ("N_tile", int(2 * hd as i64)),
                    ("epilogue", int(op_linear_tile::Epilogue::Rope.code())),
                    ("head_dim", int(hd as i64)),
                    ("theta", real(10000.0)),
                ];
                let mut ins = vec![x, w, pos];
                if factors {
                    p.push(("rope_factors", int(1)));
                    ins.push(fac);
                }
                t.task_on(ct, Opcode::LINEAR_TILE, &ins, &[y], &[], &p);
            }
        }
        outs.push((name, factors));
    }
    // Small positions: ROPE's angles are f32 products (spec), which at thousands move a value
    // by more than F32_TOL from the f64 formula's.
    let make = |ins: &mut Inputs, rng: &mut SplitMix| {
        let start = (rng.next() % 40) as i64;
        let p: Vec<i64> = (start..start + m as i64).collect();
        if let Ok(pt) = Tensor::from_i64(DType::I32, &[m], &p) {
            set_input(ins, "pos", pt);
        }
    };
    check_formula(c, t, 2, tol, make, |ins| {
        let (xv, pv) = (in_vals(ins, "x")?, in_vals(ins, "pos")?);
        let s: Vec<f64> = linear(&xv, &wv, k as usize, None)
            .into_iter()
            .map(|v| amk_core::round_to(dt, v as f32) as f64)
            .collect();
        Ok(outs
            .iter()
            .map(|&(name, factors)| {
                let f: &[f64] = if factors { &facv } else { &[] };
                (name, rope_scaled(&s, &pv, hd as usize, 10000.0, f))
            })
            .collect())
    })
}

fn op_linear_tile_rope(c: &Ctx<'_>) -> CaseResult {
    linear_tile_rope_case(c, DType::F32, 9, 24, 16, F32_TOL)?;
    linear_tile_rope_case(c, DType::BF16, 70, 96, 64, BF16_TOL)?;
    // Tasks of 151 and 149 rows: a wide device tile, then a narrow one.
    linear_tile_rope_case(c, DType::BF16, 300, 96, 64, BF16_TOL)
}
