//! `amk-engine`: the generation engine every front end goes through (`amk generate`,
//! `amk perplexity`, `amk bench`, later a server and Python bindings).
//!
//! An [`Engine`] owns one validated decode-loop program loaded on a backend — its session,
//! the KV cache in it — and serves requests: the prompt, the sampling settings and the stop
//! tokens go to the device once, then the whole request (prompt passes and generated tokens)
//! runs as one loop of passes in one launch, the program advancing its own position and
//! feeding back its own tokens; tokens stream to the host as they are produced. The engine
//! knows programs only through the decode-loop interface (`amk_core::decode`), so it is
//! architecture-neutral; [`lower_and_load`] is the one place that lowers a Llama-family model
//! for it.

mod engine;
mod error;
mod interface;
mod prefill;
mod sampling;
mod short;

pub use engine::{
    Alternative, DecodeProgram, Engine, Finish, Generation, MAX_TOP_LOGPROBS, ProgramTrace,
    PromptWatch, Request, Scores, Token, argmax, nll, nll_rows, top_alternatives,
};
pub use error::EngineError;
pub use interface::Interface;
pub use sampling::Sampling;

use amk_core::{Backend, DType, GpuTarget, Registry, ScheduleConfig};
use amk_model_llama::Model;
use amk_model_llama::lower::prefill::{PrefillLogits, PrefillOptions, lower_prefill_sharing};
use amk_model_llama::lower::{
    DecodeLoop, LowerOptions, lower, lower_sharing, short_context_schedule,
};

/// How to lower a model for an engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// The schedule (tiling, fusion, SM assignment, pages).
    pub schedule: ScheduleConfig,
    /// The GPU the schedule is laid out for.
    pub target: GpuTarget,
    /// Weight, activation and KV-cache dtype.
    pub dtype: DType,
    /// KV-cache length (`None`: the lowering's default).
    pub max_seq: Option<u64>,
    /// Stop-token slots of the program.
    pub stop_slots: u64,
    /// Prompt tokens a prefill pass takes (`None`: prompts go through the decode program a
    /// token a pass). A model the prefill lowering refuses (heads wider than 128) decodes
    /// its prompts token by token either way.
    pub prefill_rows: Option<u64>,
    /// Positions below this run a second decode program, the schedule's own with one split a
    /// KV head ([`short_context_schedule`]; `None` or 0: none, and none for a schedule that
    /// does not split the attention into several a KV head).
    pub short_context: Option<u64>,
}

/// Where an engine runs and what for: what its default options depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// On a GPU (else the CPU VM).
    pub gpu: bool,
    /// Scoring texts (perplexity: full chunks, every row's logits) rather than generating.
    pub scoring: bool,
}

impl EngineOptions {
    /// The options an engine of `dtype` gets by default where `at` says: the prompt chunk of
    /// [`default_prefill_rows`], the short-context bound of [`default_short_context`], the
    /// decode loop's stop slots and the lowering's cache length. Every front end starts here,
    /// so that `generate`, `bench`, `serve` and the Python bindings run the same programs.
    pub fn defaults(
        schedule: ScheduleConfig,
        target: GpuTarget,
        dtype: DType,
        at: Placement,
    ) -> Self {
        EngineOptions {
            schedule,
            target,
            dtype,
            max_seq: None,
            stop_slots: DecodeLoop::default().stop_slots,
            prefill_rows: Some(default_prefill_rows(at.gpu, dtype, at.scoring)).filter(|&r| r > 0),
            short_context: default_short_context(at.gpu),
        }
    }

    /// These options with what a user asked for: a prompt chunk and a short-context bound
    /// (`None`: the default stays; 0: none).
    pub fn with_asked(mut self, prefill_rows: Option<u64>, short_context: Option<u64>) -> Self {
        if let Some(r) = prefill_rows {
            self.prefill_rows = Some(r).filter(|&r| r > 0);
        }
        if let Some(s) = short_context {
            self.short_context = Some(s).filter(|&s| s > 0);
        }
        self
    }
}

/// Prompt tokens a prefill pass takes on a GPU by default (a chunk of 512 rows costs little
/// more than one of 128 there: docs/perf-notes.md round 33).
pub const GPU_PREFILL_ROWS: u64 = 512;
/// ... and on the CPU VM for a prompt: none (0), since a padded row costs what a real one
/// does there, and loading the two prefill programs costs a short prompt more than they save.
pub const CPU_PREFILL_ROWS: u64 = 0;
/// ... and on the CPU VM for a scored text, whose chunks are full: 64 rows (each weight row is
/// then read once a chunk instead of once a token; docs/perf-notes.md round 33).
pub const CPU_SCORE_ROWS: u64 = 64;

/// The smallest chunk for which the engine also loads a program of a quarter of its rows.
pub const MIN_CHUNK_FOR_SHORT: u64 = 256;

/// The prompt programs' rows for a chunk of `rows`: that, and a quarter of it when the chunk
/// is at least [`MIN_CHUNK_FOR_SHORT`], so that a short prompt (or a long one's rest) runs a
/// chunk near its size instead of a mostly padded one: the 1B's 128-row chunk takes 6.2 ms
/// on an H200 against 11.5 for 512 rows (docs/perf-notes.md round 34).
pub fn prefill_chunk_sizes(rows: u64) -> Vec<u64> {
    if rows >= MIN_CHUNK_FOR_SHORT {
        vec![rows / 4, rows]
    } else {
        vec![rows]
    }
}

/// The positions a GPU engine runs through its short-context program by default: on an
/// H200 in bf16, with ATTENTION_SPLIT's tensor-core path, the program with one split a KV head
/// is faster than the split one at 511 cached rows on SmolLM2-135M and Llama-3.2-1B and slower
/// at 767; interpolated, they cost the same at ≈ 660 (the 1B) and ≈ 700 rows (SmolLM2)
/// (docs/perf-notes.md round 55; 480 with the direct path, round 44).
pub const SHORT_CONTEXT_ROWS: u64 = 640;

/// The default bound of the short-context program ([`EngineOptions::short_context`]):
/// [`SHORT_CONTEXT_ROWS`] on a GPU; none on the CPU VM, where the two layouts cost the same
/// work and the second program only costs its loading.
pub fn default_short_context(gpu: bool) -> Option<u64> {
    gpu.then_some(SHORT_CONTEXT_ROWS)
}

/// The default prompt chunk (`amk generate --prefill-rows`): [`GPU_PREFILL_ROWS`] for a 16-bit program on a GPU; none for
/// f32 programs there, whose prefill tiles run exact f32 arithmetic on the CUDA cores (slower
/// than decoding token by token); on the CPU VM [`CPU_SCORE_ROWS`] when `scoring` a text and
/// [`CPU_PREFILL_ROWS`] for a prompt.
pub fn default_prefill_rows(gpu: bool, dtype: DType, scoring: bool) -> u64 {
    match (gpu, dtype) {
        (true, DType::F16 | DType::BF16) => GPU_PREFILL_ROWS,
        (true, _) => 0,
        (false, _) if scoring => CPU_SCORE_ROWS,
        (false, _) => CPU_PREFILL_ROWS,
    }
}

/// The lowering options of `opts`'s decode-loop programs.
fn decode_options(opts: &EngineOptions) -> LowerOptions {
    LowerOptions {
        dtype: opts.dtype,
        max_seq: opts.max_seq,
        argmax: false,
        decode_loop: Some(DecodeLoop {
            stop_slots: opts.stop_slots,
        }),
    }
}

/// The short-context program's bound and schedule under `opts`, given the decode program's
/// cache length (`None`: no bound asked, or a schedule with one split a KV head already).
fn short_plan(opts: &EngineOptions, max_seq: u64) -> Option<(u64, ScheduleConfig)> {
    let below = opts.short_context.filter(|&b| b > 0)?.min(max_seq);
    Some((below, short_context_schedule(&opts.schedule)?))
}

/// The prompt programs under `opts`: a chunk's and a short one's, each computing its last
/// real row's logits (a prompt's last chunk then gives the first token's, instead of a decode
/// pass at the prompt's last position), and one for scoring (every row's); none when no chunk
/// is asked or it exceeds the cache.
fn prompt_plan(opts: &EngineOptions, max_seq: u64) -> Vec<(u64, PrefillLogits)> {
    let Some(rows) = opts.prefill_rows.filter(|&r| r > 0 && r <= max_seq) else {
        return Vec::new();
    };
    let mut plan: Vec<(u64, PrefillLogits)> = prefill_chunk_sizes(rows)
        .into_iter()
        .map(|r| (r, PrefillLogits::Last))
        .collect();
    plan.push((rows, PrefillLogits::Every));
    plan
}

/// What a program of an engine is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramRole {
    /// The decode loop (every position).
    Decode,
    /// The short-context decode loop (the positions below its bound).
    ShortContext,
    /// A prompt chunk of `rows` rows, with these logits.
    Prompt {
        /// Rows a pass.
        rows: u64,
        /// Which rows' logits it computes.
        logits: PrefillLogits,
    },
}

impl std::fmt::Display for ProgramRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProgramRole::Decode => write!(f, "decode loop"),
            ProgramRole::ShortContext => write!(f, "short-context decode loop"),
            ProgramRole::Prompt { rows, logits } => {
                write!(f, "prompt of {rows} rows ({logits:?} logits)")
            }
        }
    }
}

/// Every program an engine of `opts` loads for `model`, lowered in load order (the decode
/// loop first; the others share its weights, so no cast is made twice and on a GPU the
/// uploads are shared), with what the lowering refused. The one plan [`lower_and_load`] loads
/// and [`engine_programs`] lists.
struct Lowerings {
    /// The decode loop.
    decode: amk_model_llama::lower::Lowered,
    /// The short-context loop and its bound, or why it could not be lowered (none asked:
    /// `None`).
    short: Option<(u64, Result<amk_model_llama::lower::Lowered, EngineError>)>,
    /// The prompt programs, or why one could not be lowered (then prompts go through the
    /// decode loop, all of them).
    prompts: Result<Vec<(ProgramRole, amk_model_llama::lower::Lowered)>, EngineError>,
}

fn lower_all(model: &Model, opts: &EngineOptions) -> Result<Lowerings, EngineError> {
    let decode = lower(model, &opts.schedule, &opts.target, &decode_options(opts))?;
    let (max_seq, weights) = (decode.max_seq, &decode.weights);
    let short = short_plan(opts, max_seq).map(|(below, schedule)| {
        let dopts = decode_options(opts);
        let l = lower_sharing(model, &schedule, &opts.target, &dopts, weights.clone());
        (below, l.map_err(EngineError::from))
    });
    let prompts = prompt_plan(opts, max_seq)
        .into_iter()
        .map(|(rows, logits)| {
            let popts = PrefillOptions {
                dtype: opts.dtype,
                max_seq,
                rows,
                logits,
            };
            let l = lower_prefill_sharing(model, &opts.target, &popts, weights.clone())?;
            Ok((ProgramRole::Prompt { rows, logits }, l))
        })
        .collect();
    Ok(Lowerings {
        decode,
        short,
        prompts,
    })
}

/// Lowers `model` as a decode loop under `opts` and loads it on `backend`.
pub fn lower_and_load(
    model: &Model,
    opts: &EngineOptions,
    backend: &dyn Backend,
    registry: &Registry,
) -> Result<Engine, EngineError> {
    let Lowerings {
        decode,
        short,
        prompts,
    } = lower_all(model, opts)?;
    let mut engine = Engine::new(decode.program, &decode.weights, backend, registry)?;
    if let Some((below, lowered)) = short {
        // A short-context program that cannot be lowered or loaded (too little device
        // memory) leaves every position to the decode program.
        let attached =
            lowered.and_then(|l| engine.attach_short(l.program, &l.weights, registry, below));
        if let Err(e) = attached {
            engine.short_refused = Some(e.to_string());
        }
    }
    // A model the prefill lowering refuses, or a program that cannot be loaded beside the
    // decode loop (too little device memory), leaves prompts to the decode loop.
    let attached = prompts.and_then(|ps| {
        (ps.into_iter())
            .try_for_each(|(_, p)| engine.attach_prefill(p.program, &p.weights, registry))
    });
    if let Err(e) = attached {
        engine.detach_prefill();
        engine.prefill_refused = Some(e.to_string());
    }
    Ok(engine)
}

/// The programs [`lower_and_load`] loads for `model` under `opts`, lowered as it lowers them
/// (the file's weights cast to `opts.dtype`) and loaded nowhere, with what the lowering
/// refused. Why: a kernel depends on its program's ops, loops and buffer shapes, so the
/// kernels a model file's engine runs are not always a preset shape's; `amk ops compile
/// --model` compiles these ahead of time.
pub fn engine_programs(model: &Model, opts: &EngineOptions) -> Result<EnginePlan, EngineError> {
    let Lowerings {
        decode,
        short,
        prompts,
    } = lower_all(model, opts)?;
    let mut plan = EnginePlan {
        programs: vec![(ProgramRole::Decode, decode.program)],
        refused: Vec::new(),
    };
    match short.map(|(_, l)| l) {
        Some(Ok(l)) => plan.programs.push((ProgramRole::ShortContext, l.program)),
        Some(Err(e)) => plan.refused.push(format!("the short-context program: {e}")),
        None => {}
    }
    match prompts {
        Ok(ps) => plan
            .programs
            .extend(ps.into_iter().map(|(r, l)| (r, l.program))),
        Err(e) => plan.refused.push(format!("the prompt programs: {e}")),
    }
    Ok(plan)
}

/// What [`engine_programs`] found: the programs an engine would load, and why any it would
/// try was refused.
pub struct EnginePlan {
    /// Each program with what it is for, in the order the engine loads them.
    pub programs: Vec<(ProgramRole, amk_core::Program)>,
    /// The lowering's refusals (the engine then runs without that program).
    pub refused: Vec<String>,
}
