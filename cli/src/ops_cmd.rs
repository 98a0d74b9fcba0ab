//! `amk ops list [--json]`: what the registry holds. `amk ops compile --arch sm_XY`: its
//! megakernel compiled ahead of time into the cubin cache.

use crate::output::{errln, outln};
use amk_backend_cuda::assemble::megakernel_source;
use amk_core::ir::{DType, Program};
use amk_core::{Origin, Registry};
use serde_json::{Value, json};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Subcommands of `amk ops`.
#[derive(clap::Subcommand)]
pub enum OpsCommand {
    /// One row per registered opcode: code, name, arity, required params, implementations,
    /// origin.
    List {
        /// Machine-readable output (a JSON array).
        #[arg(long)]
        json: bool,
    },
    /// Compile the megakernel of every registered op (plugins included) for GPU
    /// architectures into the cubin cache, with no GPU: a later run on such a GPU loads it
    /// instead of compiling (minutes for the full megakernel). Needs NVRTC (libnvrtc.so).
    Compile {
        /// Target architecture, as the backend names it (`sm_90a` on Hopper, `sm_80`,
        /// `sm_89`, `sm_120`, ...); repeatable.
        #[arg(long = "arch", value_name = "sm_XY", required = true, value_parser = parse_arch)]
        archs: Vec<String>,
        /// The kernels to compile, by what runs them: `f32`, `f16`, `bf16` (a Llama model's
        /// decode programs in that dtype: a program's kernel holds only its ops and its
        /// dtype's weight-streaming loop) or `any` (the kernel of every op, which programs
        /// with a FUSED task run); repeatable. Default: all four.
        #[arg(long = "dtype", value_name = "any|f32|f16|bf16", value_parser = parse_kind)]
        dtypes: Vec<Kind>,
        /// Cache directory (default: `$AMK_CUDA_CACHE`, else `$XDG_CACHE_HOME/amk/cubin`,
        /// else `~/.cache/amk/cubin`).
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<std::path::PathBuf>,
        /// Only the decode programs of these preset shapes (`llama-3.2-1b`, `smollm2-135m`,
        /// ...); repeatable. Default: every preset.
        #[arg(long = "shape", value_name = "NAME", value_parser = parse_shape)]
        shapes: Vec<String>,
        /// Instead of the presets' programs, the ones an engine loads for this model (a GGUF
        /// file or an HF directory) with its default prompt chunk and short-context bound, for
        /// a GPU of 132 SMs (H100, H200), as `amk generate` and `amk bench --model` do: its
        /// decode loop, its short-context loop and its prompt programs, lowered from the file
        /// (a model's programs need not be a preset's: another shape, its architecture's
        /// features), in each `--dtype` (default: bf16 and f32) under each `--config`
        /// (default: the tuned schedule). The lowering casts the file's weights as the engine
        /// does: host memory for the whole model in each dtype, one at a time.
        #[arg(long, value_name = "PATH", conflicts_with = "shapes")]
        model: Option<std::path::PathBuf>,
        /// With `--model`: the KV-cache length the programs are lowered for (as `amk generate
        /// --max-seq` takes; default: the lowering's).
        #[arg(long, value_name = "N", requires = "model")]
        max_seq: Option<u64>,
        /// Only the decode programs of this schedule (`tuned`, `default` or a ScheduleConfig
        /// JSON file, as `amk bench --config` takes) instead of the tuned and the reference
        /// one; repeatable.
        #[arg(long = "config", value_name = "cfg.json")]
        configs: Vec<std::path::PathBuf>,
        /// Also each kernel with its trace points, the one `amk bench --trace` loads.
        #[arg(long)]
        traced: bool,
        /// Only the programs of this regime: `decode` (a token a pass) or `prefill` (a prompt
        /// chunk a pass); repeatable. Default: both.
        #[arg(long = "regime", value_name = "decode|prefill", value_parser = ["decode", "prefill"])]
        regimes: Vec<String>,
        /// Print the kernels the selection names (`ARCH (WHAT)`, one a line) and compile
        /// nothing; works on a build without the cuda feature.
        #[arg(long)]
        list: bool,
        /// Machine-readable output (one JSON object per kernel, in an array).
        #[arg(long)]
        json: bool,
    },
}

/// A preset shape's name (an unknown one: the presets' own error, which lists them).
fn parse_shape(s: &str) -> Result<String, String> {
    amk_model_llama::presets::preset(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// `sm_` then digits, optionally `a` (architecture-specific features).
fn parse_arch(s: &str) -> Result<String, String> {
    let digits = s
        .strip_prefix("sm_")
        .map(|r| r.strip_suffix('a').unwrap_or(r));
    match digits {
        Some(d) if !d.is_empty() && d.len() <= 3 && d.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(s.to_string())
        }
        _ => Err(format!(
            "'{s}' is not an architecture name like sm_80 or sm_90a"
        )),
    }
}

/// What `--dtype` names: the kernel of every op (`any`), or a model dtype's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Every op and every loop: the kernel of programs with a FUSED task.
    Any,
    /// The decode programs of a Llama model in this dtype.
    Model(DType),
}

fn parse_kind(s: &str) -> Result<Kind, String> {
    if s.eq_ignore_ascii_case("any") {
        return Ok(Kind::Any);
    }
    crate::model_cmd::parse_dtype(s)
        .map(Kind::Model)
        .map_err(|_| format!("'{s}' is not one of any, f32, f16, bf16"))
}

/// Chunk sizes whose prefill programs stand for every prompt's kernel: a short chunk's tasks
/// and a long chunk's (whose widest grids ask their kernel for another row block). A kernel
/// holds its program's ops, dtypes, row lengths and task defines, none of which depend on the
/// number of layers, so they are lowered for two (the whole 8B at 2,048 rows would take
/// gigabytes and a minute; with one, a program without logits would have no MLP: it computes
/// the last layer's K and V alone).
const PREFILL_ROWS: [u64; 2] = [16, 2048];

/// Whether `--regime` (`regimes`, empty: every one) takes programs of regime `r`.
fn wants_regime(regimes: &[String], r: &str) -> bool {
    regimes.is_empty() || regimes.iter().any(|x| x == r)
}

/// The decode programs that `amk generate`, `amk bench` and `amk run` lower a Llama model to
/// in `dtype`, one per kernel they can need: the tuned and the reference schedule (or the
/// named `schedules` instead, when there are any), each with and without the argmax, at every
/// preset shape. A kernel depends on the program's ops and dtypes, and on its rows' lengths
/// through the fused loop's pass (`loops::fused_vecs`), so the presets stand for the Llama
/// shapes (`compile` keeps one program per distinct kernel). `shapes` empty: every preset.
fn llama_programs(
    dtype: DType,
    shapes: &[String],
    schedules: &[(String, amk_core::ScheduleConfig)],
    regimes: &[String],
) -> Result<Vec<(String, Program)>, String> {
    let wants = |r: &str| wants_regime(regimes, r);
    use amk_model_llama::lower::prefill::{PrefillLogits, PrefillOptions, lower_prefill};
    use amk_model_llama::lower::{LowerOptions, lower, short_context_schedule, tuned_schedule};
    use amk_model_llama::{Model, presets};
    let target = amk_core::GpuTarget::by_name("h100").ok_or("no h100 target")?;
    let builtin;
    let schedules = if schedules.is_empty() {
        // The tuned schedule, the short-context one the engine runs beside it, the reference.
        let tuned = tuned_schedule();
        let short = short_context_schedule(&tuned).ok_or("the tuned schedule has no short one")?;
        builtin = [
            ("tuned".to_string(), tuned),
            ("tuned short-context".to_string(), short),
            ("default".to_string(), amk_core::ScheduleConfig::default()),
        ];
        &builtin[..]
    } else {
        schedules
    };
    let mut out = Vec::new();
    for shape in presets::preset_names() {
        if !shapes.is_empty() && !shapes.iter().any(|s| s == shape) {
            continue;
        }
        let cfg = presets::preset(shape).map_err(|e| e.to_string())?;
        let two_layers = Model::shape_only(
            amk_model_llama::config::ModelConfig {
                n_layers: 2,
                ..cfg.clone()
            },
            shape,
        );
        let model = Model::shape_only(cfg, shape);
        for (sname, schedule) in schedules.iter().filter(|_| wants("decode")) {
            // The tails `amk run`/`amk lower` (argmax), `amk bench` (logits) and the engine
            // (a decode loop) lower.
            for (argmax, decode_loop) in [(true, false), (false, false), (false, true)] {
                let opts = LowerOptions {
                    dtype,
                    max_seq: Some(64),
                    argmax,
                    decode_loop: decode_loop.then(amk_model_llama::lower::DecodeLoop::default),
                };
                let p = lower(&model, schedule, &target, &opts)
                    .map_err(|e| e.to_string())?
                    .program;
                let what = match (argmax, decode_loop) {
                    (true, _) => ", argmax",
                    (_, true) => ", decode loop",
                    _ => "",
                };
                let dt = dtype.name().to_ascii_lowercase();
                out.push((format!("{dt} {sname}{what}, {shape}"), p));
            }
        }
        // The prefill programs (`amk bench --prefill`, the engine's prompts and scoring): no
        // logits, the last row's and every row's; a short chunk's and a long one's (a long
        // chunk's wide grids take LINEAR_TILE's widest row block, which its kernel compiles
        // in). Programs of one source share a kernel, listed once.
        let logit_kinds = [
            PrefillLogits::None,
            PrefillLogits::Last,
            PrefillLogits::Every,
        ];
        for (rows, logits) in PREFILL_ROWS
            .iter()
            .flat_map(|&r| logit_kinds.map(|l| (r, l)))
            .filter(|_| wants("prefill"))
        {
            let opts = PrefillOptions {
                dtype,
                max_seq: rows.max(64),
                rows,
                logits,
            };
            // Models the prefill lowering refuses (heads wider than 128) have none.
            if let Ok(l) = lower_prefill(&two_layers, &target, &opts) {
                let dt = dtype.name().to_ascii_lowercase();
                out.push((
                    format!("{dt} prefill of {rows} rows ({logits:?} logits), {shape}"),
                    l.program,
                ));
            }
        }
    }
    Ok(out)
}

/// One kernel to compile: architecture, what it is for, the program (`None`: every op), and
/// whether with trace points.
type Job<'a> = (&'a String, String, Option<Program>, bool);

/// Which decode programs' kernels `compile` builds (besides `--dtype`): `ops compile`'s
/// `--shape`, `--config` and `--traced`.
struct Selection<'a> {
    shapes: &'a [String],
    /// `--model` and `--max-seq`: a model file's programs instead of the presets'.
    model: Option<(&'a std::path::Path, Option<u64>)>,
    configs: &'a [std::path::PathBuf],
    traced: bool,
    /// `decode` and/or `prefill` (empty: both).
    regimes: &'a [String],
    /// Print the kernels instead of compiling them.
    list: bool,
}

/// `--list`: the kernels a compile would build, one `ARCH (WHAT)` line each (or a JSON array
/// of `{"arch", "for"}`), compiling nothing.
fn list_jobs(jobs: &[Job<'_>], json: bool) -> ExitCode {
    if json {
        let rows: Vec<Value> = jobs
            .iter()
            .map(|(arch, what, _, _)| json!({"arch": arch, "for": what}))
            .collect();
        outln!(
            "{}",
            serde_json::to_string(&Value::Array(rows)).unwrap_or_default()
        );
    } else {
        for (arch, what, _, _) in jobs {
            outln!("{arch} ({what})");
        }
    }
    ExitCode::SUCCESS
}

/// Compiles the kernels `archs` x `kinds` need (each distinct source once), as many at once as
/// this machine has cores (NVRTC compiles on one thread); exit 1 if any failed, after the rest
/// finished. With `json`, every kernel that compiled is printed either way.
fn compile(
    reg: &Registry,
    archs: &[String],
    kinds: &[Kind],
    dir: Option<&std::path::Path>,
    sel: &Selection<'_>,
    json: bool,
) -> ExitCode {
    let programs = match selected_programs(kinds, sel) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // The environment's knobs (AMK_CUDA_DEFINES above all: variants of the device code).
    let opts = match amk_backend_cuda::CudaOptions::from_env() {
        Ok(o) => o,
        Err(e) => {
            errln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let programs = distinct_kernels(reg, &opts, programs);
    let jobs = compile_jobs(archs, &programs, sel.traced);
    if sel.list {
        return list_jobs(&jobs, json);
    }
    if let Err(code) = can_compile() {
        return code;
    }
    if !json {
        crate::status::status!(
            "compiling {} megakernel(s) (NVRTC; up to minutes each for a cold cache) ...",
            jobs.len()
        );
    }
    let results = run_jobs(reg, &opts, dir, &jobs);
    report_jobs(&jobs, results, json)
}

/// The programs whose kernels `sel` and `kinds` name (`any`: every op's kernel, no program);
/// a bad `--config` is exit code 2, a lowering that fails 1.
fn selected_programs(
    kinds: &[Kind],
    sel: &Selection<'_>,
) -> Result<Vec<(String, Option<Program>)>, ExitCode> {
    let Selection {
        shapes,
        model,
        configs,
        regimes,
        ..
    } = *sel;
    let mut schedules = Vec::new();
    for c in configs {
        match crate::model_cmd::schedule_config(Some(c), true) {
            Ok((cfg, name)) => schedules.push((name, cfg)),
            Err(e) => {
                errln!("error: --config {e}");
                return Err(ExitCode::from(2));
            }
        }
    }
    if let Some((path, max_seq)) = model {
        return file_programs(path, max_seq, kinds, &schedules, regimes);
    }
    let kinds: Vec<Kind> = if kinds.is_empty() {
        vec![
            Kind::Any,
            Kind::Model(DType::F32),
            Kind::Model(DType::F16),
            Kind::Model(DType::BF16),
        ]
    } else {
        kinds.to_vec()
    };
    let mut programs: Vec<(String, Option<Program>)> = Vec::new();
    for k in kinds {
        match k {
            Kind::Any => programs.push(("any".into(), None)),
            Kind::Model(dt) => match llama_programs(dt, shapes, &schedules, regimes) {
                Ok(ps) => programs.extend(ps.into_iter().map(|(n, p)| (n, Some(p)))),
                Err(e) => {
                    errln!("error: lowering the {} programs: {e}", dt.name());
                    return Err(ExitCode::from(1));
                }
            },
        }
    }
    Ok(programs)
}

/// `--model`: the programs an engine loads for the model at `path` in each of `kinds` (`any`
/// refused: a model's programs have a dtype; none: bf16 and f32) under each of `schedules`
/// (none: the tuned one), as `amk generate` and `amk bench --model` lower them; a model that
/// cannot be imported is exit code 2, a lowering that fails 1.
fn file_programs(
    path: &std::path::Path,
    max_seq: Option<u64>,
    kinds: &[Kind],
    schedules: &[(String, amk_core::ScheduleConfig)],
    regimes: &[String],
) -> Result<Vec<(String, Option<Program>)>, ExitCode> {
    let dtypes = model_dtypes(kinds)?;
    let model = crate::model_cmd::import_model(path).map_err(|e| {
        errln!("error: {e}");
        ExitCode::from(2)
    })?;
    let tuned = [(
        "tuned".to_string(),
        amk_model_llama::lower::tuned_schedule(),
    )];
    let schedules = if schedules.is_empty() {
        &tuned[..]
    } else {
        schedules
    };
    let target = amk_core::GpuTarget::by_name("h100").ok_or_else(|| {
        errln!("error: no h100 target");
        ExitCode::from(1)
    })?;
    let at = amk_engine::Placement {
        gpu: true,
        scoring: false,
    };
    let mut out = Vec::new();
    for dt in dtypes {
        for (sname, schedule) in schedules {
            let opts = amk_engine::EngineOptions {
                max_seq,
                ..amk_engine::EngineOptions::defaults(schedule.clone(), target.clone(), dt, at)
            };
            let dn = dt.name().to_ascii_lowercase();
            let plan = amk_engine::engine_programs(&model, &opts).map_err(|e| {
                errln!("error: lowering {} in {dn}: {e}", path.display());
                ExitCode::from(1)
            })?;
            for why in &plan.refused {
                errln!("note: {dn} {sname}: the engine would run without {why}");
            }
            for (role, p) in plan.programs {
                let prompt = matches!(role, amk_engine::ProgramRole::Prompt { .. });
                if wants_regime(regimes, if prompt { "prefill" } else { "decode" }) {
                    out.push((format!("{dn} {sname} {role}, {}", path.display()), Some(p)));
                }
            }
        }
    }
    if out.is_empty() {
        errln!(
            "error: {}: no program of the engine's matches the selection (--regime, --dtype)",
            path.display()
        );
        return Err(ExitCode::from(2));
    }
    Ok(out)
}

/// `--dtype` with `--model`: the dtypes asked (none: bf16 and f32, the dtypes `amk generate`
/// and `amk bench --model` and its gate run); `any` names no model program (exit code 2).
fn model_dtypes(kinds: &[Kind]) -> Result<Vec<DType>, ExitCode> {
    let mut dtypes = Vec::new();
    for k in kinds {
        match k {
            Kind::Any => {
                errln!(
                    "error: --dtype any names no model program: with --model, give f32, f16 or bf16"
                );
                return Err(ExitCode::from(2));
            }
            Kind::Model(dt) => dtypes.push(*dt),
        }
    }
    if dtypes.is_empty() {
        dtypes = vec![DType::BF16, DType::F32];
    }
    Ok(dtypes)
}

/// One program per distinct kernel source: programs with the same ops and dtypes share one.
fn distinct_kernels(
    reg: &Registry,
    opts: &amk_backend_cuda::CudaOptions,
    mut programs: Vec<(String, Option<Program>)>,
) -> Vec<(String, Option<Program>)> {
    let mut seen: Vec<String> = Vec::new();
    programs.retain(|(_, p)| {
        let src = megakernel_source(reg, opts.knobs(p.as_ref(), reg))
            .map(|m| m.source)
            .unwrap_or_default();
        let new = !seen.contains(&src);
        seen.push(src);
        new
    });
    programs
}

/// Every (architecture, program, traced or not) to compile.
fn compile_jobs<'a>(
    archs: &'a [String],
    programs: &[(String, Option<Program>)],
    traced: bool,
) -> Vec<Job<'a>> {
    let traces: &[bool] = if traced { &[false, true] } else { &[false] };
    archs
        .iter()
        .flat_map(|a| programs.iter().map(move |(n, p)| (a, n, p)))
        .flat_map(|(a, n, p)| {
            traces.iter().map(move |&t| {
                let name = if t { format!("{n}, traced") } else { n.clone() };
                (a, name, p.clone(), t)
            })
        })
        .collect()
}

/// Whether this build and machine can compile at all (the cuda feature, NVRTC); exit code 2
/// with the reason when not.
fn can_compile() -> Result<(), ExitCode> {
    if !cfg!(feature = "cuda") {
        errln!(
            "error: ops compile needs the CUDA backend, and this amk was built without the cuda \
             feature: rebuild with `cargo build --release -p amk --features cuda` (--list shows \
             the kernels it would compile)"
        );
        return Err(ExitCode::from(2));
    }
    if let Some(missing) = nvrtc_missing() {
        // One message for the machine, not one per kernel: nothing can compile here.
        errln!("error: ops compile: {missing}");
        return Err(ExitCode::from(2));
    }
    Ok(())
}

/// One compile result: the job's index, the cubin (path, bytes, already cached) or the error,
/// and the seconds it took.
type JobResult = (
    usize,
    Result<(std::path::PathBuf, usize, bool), amk_backend_cuda::CudaError>,
    f64,
);

/// Compiles every job, as many at once as the machine has threads; the results in job order.
fn run_jobs(
    reg: &Registry,
    opts: &amk_backend_cuda::CudaOptions,
    dir: Option<&std::path::Path>,
    jobs: &[Job<'_>],
) -> Vec<JobResult> {
    let width = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..width.min(jobs.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((arch, _, p, trace)) = jobs.get(i) else {
                        break;
                    };
                    let t0 = std::time::Instant::now();
                    let r = amk_backend_cuda::precompile(opts, reg, arch, dir, p.as_ref(), *trace);
                    let secs = t0.elapsed().as_secs_f64();
                    if let Ok(mut v) = results.lock() {
                        v.push((i, r, secs));
                    }
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_default();
    results.sort_by_key(|r| r.0);
    results
}

/// Each job's outcome (a line each, or one JSON array); exit code 1 when one failed.
fn report_jobs(jobs: &[Job<'_>], results: Vec<JobResult>, json: bool) -> ExitCode {
    let mut out = Vec::new();
    let mut status = ExitCode::SUCCESS;
    for (i, r, secs) in results {
        let (arch, what, _, _) = &jobs[i];
        match r {
            Ok((path, bytes, cached)) => {
                if json {
                    out.push(
                        json!({"arch": arch, "for": what, "path": path, "bytes": bytes,
                                    "cached": cached, "seconds": secs}),
                    );
                } else {
                    let how = if cached { "already cached" } else { "compiled" };
                    outln!(
                        "{arch} ({what}): {how}, {bytes} bytes, {secs:.1} s: {}",
                        path.display()
                    );
                }
            }
            Err(e) => {
                errln!("error: {arch} ({what}): {e}");
                status = ExitCode::from(1);
            }
        }
    }
    if json {
        let doc = serde_json::to_string(&Value::Array(out)).unwrap_or_default();
        outln!("{doc}");
    }
    status
}

fn origin_text(o: &Origin) -> String {
    match o {
        Origin::Builtin => "built-in".to_string(),
        Origin::Plugin(p) => format!("plugin {}", p.display()),
    }
}

/// `"built-in"` or `"plugin"` (JSON; the library path is in `"plugin"`).
fn origin_kind(o: &Origin) -> &'static str {
    match o {
        Origin::Builtin => "built-in",
        Origin::Plugin(_) => "plugin",
    }
}

fn plugin_path(o: &Origin) -> Value {
    match o {
        Origin::Builtin => Value::Null,
        Origin::Plugin(p) => Value::String(p.display().to_string()),
    }
}

fn rows(reg: &Registry) -> Vec<Value> {
    reg.iter()
        .map(|(spec, origin)| {
            let params: Vec<Value> = spec
                .required_params()
                .map(|p| json!({"name": p.name, "type": p.ty.name()}))
                .collect();
            json!({
                "code": spec.code.0,
                "name": spec.name,
                "inputs": {"min": spec.min_inputs, "max": spec.max_inputs},
                "outputs": spec.n_outputs,
                "required_params": params,
                "cpu": reg.reference(spec.code).is_some(),
                "cuda": reg.cuda(spec.code).is_some(),
                "origin": origin_kind(origin),
                "plugin": plugin_path(origin),
            })
        })
        .collect()
}

/// Runs `amk ops ...`.
pub fn run(cmd: &OpsCommand) -> ExitCode {
    let reg = match crate::registry::registry() {
        Ok(r) => r,
        Err(e) => {
            errln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match cmd {
        OpsCommand::Compile {
            archs,
            dtypes,
            cache_dir,
            shapes,
            model,
            max_seq,
            configs,
            traced,
            regimes,
            list,
            json,
        } => compile(
            &reg,
            archs,
            dtypes,
            cache_dir.as_deref(),
            &Selection {
                shapes,
                model: model.as_deref().map(|m| (m, *max_seq)),
                configs,
                traced: *traced,
                regimes,
                list: *list,
            },
            *json,
        ),
        OpsCommand::List { json } => {
            if *json {
                let doc = Value::Array(rows(&reg));
                outln!("{}", serde_json::to_string(&doc).unwrap_or_default());
            } else {
                outln!(
                    "{:>4}  {:<18} {:<6} {:<4} {:<4} {:<4} {:<9} required params",
                    "code",
                    "name",
                    "inputs",
                    "outs",
                    "cpu",
                    "cuda",
                    "origin"
                );
                for (spec, origin) in reg.iter() {
                    let params: Vec<String> = spec
                        .required_params()
                        .map(|p| format!("{}:{}", p.name, p.ty.name()))
                        .collect();
                    let yes = |b: bool| if b { "yes" } else { "no" };
                    outln!(
                        "{:>4}  {:<18} {:<6} {:<4} {:<4} {:<4} {:<9} {}",
                        spec.code.0,
                        spec.name,
                        spec.arity_text(),
                        spec.n_outputs.map_or("var".to_string(), |n| n.to_string()),
                        yes(reg.reference(spec.code).is_some()),
                        yes(reg.cuda(spec.code).is_some()),
                        origin_text(origin),
                        params.join(" ")
                    );
                }
            }
            ExitCode::SUCCESS
        }
    }
}

/// Why no kernel can compile on this machine (no NVRTC library), if that is so.
fn nvrtc_missing() -> Option<amk_backend_cuda::CudaError> {
    #[cfg(feature = "cuda")]
    if !amk_backend_cuda::nvrtc::nvrtc_present() {
        return Some(amk_backend_cuda::CudaError::NvrtcMissing);
    }
    None
}
