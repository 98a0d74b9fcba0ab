//! `amk bench`: correctness-gated decode latency on the GPU.
//!
//! Per point (model × position): lower the decode step twice, in f32 and in the benchmarked
//! half precision, with the same weights (a checkpoint, or synthetic weights generated on the
//! device for a named shape) and the same KV-cache prefix (synthetic, generated on the device);
//! run the f32 program once for the reference logits, then the half-precision one with its
//! output poisoned first. Only when its logits pass the gate (finite, argmax equal to the
//! reference's, max |error| / max |reference| within the tolerance) is it timed: CUDA events
//! around each launch, `--warmup` launches, then `--iters` timed ones (median, p10, p90), and
//! the gate is checked again on the last timed launch's output. Bytes are every weight byte
//! plus the KV rows attention reads; the floor divides them by this device's read bandwidth,
//! measured in the same run by a streaming kernel.

use crate::model_cmd::{
    ModelCmdError, finish, import_model, parse_dtype, registry, schedule_config, target_named,
};
use crate::output::{errln, outln};
use amk_backend_cuda::{CudaBackend, CudaOptions, CudaSession};
use amk_core::synth::{Init, SyntheticWeights};
use amk_core::{BufferKind, DType, Registry, Tensor, ValidatedProgram};
use amk_model_llama::lower::{LowerOptions, Lowered, lower};
use amk_model_llama::presets;
use amk_model_llama::{Model, ModelError};
use std::path::PathBuf;
use std::process::ExitCode;

/// The tolerance of half-precision logits against f32 (max |error| / max |reference|), as the
/// numerics conventions judge bf16.
pub const HALF_TOLERANCE: f64 = 2e-2;

/// Spread of the synthetic KV-cache prefix (keys and values uniform in ±0.5); its seed is the
/// run's seed xor "kvcache".
const KV_INIT: Init = Init {
    center: 0.0,
    scale: 0.5,
};

/// Arguments of `amk bench`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("subject").required(true).args(["model", "shape"])))]
pub struct BenchArgs {
    /// A checkpoint to benchmark (HF directory or GGUF file).
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// A named model shape with synthetic weights generated on the device: llama-3.2-1b,
    /// llama-3.2-3b, llama-3.1-8b, mistral-7b, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b,
    /// qwen3-0.6b, qwen3-1.7b, qwen3-8b, smollm2-135m or tinyllama-1.1b.
    #[arg(long, value_name = "NAME")]
    pub shape: Option<String>,
    /// Benchmarked precision: bf16 or f16 (the reference is always f32).
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Decode positions, comma-separated (the KV cache holds a synthetic prefix before each).
    #[arg(long, value_delimiter = ',', default_value = "0,511")]
    pub pos: Vec<u64>,
    /// Timed launches per point.
    #[arg(long, default_value_t = 200)]
    pub iters: usize,
    /// Untimed launches before timing.
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// KV-cache length (default: max(1024, largest position + 1)).
    #[arg(long, value_name = "N")]
    pub max_seq: Option<u64>,
    /// ScheduleConfig JSON (tiling, fusion_grouping, sm_assignment, ...), or `default` (the
    /// reference tiling) or `tuned`. Default: the tuned schedule (every projection and the
    /// attention split over all SMs, the fused decode opcodes: five phases per layer).
    #[arg(long, value_name = "cfg.json|default|tuned")]
    pub config: Option<PathBuf>,
    /// GPU target the schedule is laid out for; its SM count is replaced by the device's.
    #[arg(long, default_value = "h100")]
    pub target: String,
    /// Lay the decode programs out for N SMs (1 to the device's count) instead of all of
    /// them: what a launch that leaves SMs idle would cost (a grid of whole thread-block
    /// clusters of 4 covers 120 of an H200's 132).
    #[arg(long, value_name = "N", conflicts_with_all = ["prompt_tokens", "prefill"])]
    pub sms: Option<usize>,
    /// Seed of the synthetic weights and KV prefix (0 by default, as every --seed of amk).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also print a per-op trace of one step per point (stderr); in end-to-end mode, trace
    /// one more generation at each depth after the timed ones (its last decode pass) and write
    /// it with --trace-out.
    #[arg(long)]
    pub trace: bool,
    /// With --trace, also append every traced task to FILE as CSV (model, pos, task, label,
    /// op, block; reached/ready/prologue/returned/done/dispatched/waiting in us from the step's
    /// first task, the prologue empty for ops that record none; then probe0..probe7, the
    /// points an op stamps inside itself, empty where none). End-to-end mode: `model` is the
    /// file and the decode program that ran (`decode`, `short-context`), `pos` the depth.
    #[arg(long, value_name = "FILE", requires = "trace")]
    pub trace_out: Option<PathBuf>,
    /// Gate tolerance: max |error| / max |f32 logit| (the numerics conventions judge bf16 by
    /// 2e-2; a checkpoint whose logits bf16 itself moves further needs a looser bound, which
    /// the report then states).
    #[arg(long, default_value_t = HALF_TOLERANCE)]
    pub tolerance: f64,
    /// End-to-end mode (with --model): time to first token for a prompt of this many tokens
    /// of real text (comma-separated lengths, each timed in turn), then the decode rate at each
    /// --depth, through the engine (what `amk generate` runs), wall clock next to device time.
    #[arg(long, value_name = "P", value_delimiter = ',', requires = "model")]
    pub prompt_tokens: Vec<usize>,
    /// End-to-end mode: tokens generated per decode measurement.
    #[arg(long = "gen", value_name = "N", default_value_t = 128)]
    pub gen_tokens: usize,
    /// End-to-end mode: context lengths (tokens already in the KV cache) at which the decode
    /// rate is measured, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,512,2048")]
    pub depth: Vec<u64>,
    /// End-to-end mode: runs per figure (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// End-to-end mode: positions below N run the short-context decode program (0: none;
    /// default as `amk generate --short-context`).
    #[arg(long, value_name = "N", requires = "prompt_tokens")]
    pub short_context: Option<u64>,
    /// Prefill mode: time the prefill program over one chunk of this many prompt tokens
    /// (comma-separated sizes), its first position each `--pos`, gated like the decode points;
    /// reports prompt tokens per second of kernel time.
    #[arg(
        long,
        value_name = "ROWS",
        value_delimiter = ',',
        conflicts_with = "prompt_tokens"
    )]
    pub prefill: Vec<u64>,
    /// Machine-readable output on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Shown after `amk bench --help`.
pub const AFTER_HELP: &str = "\
Needs a build with `--features cuda` and an NVIDIA GPU.

Exit status:
  0  every point passed its correctness gate and was timed
  1  a lowered program was rejected by the validator (a bug: please report it)
  2  bad invocation or input (unknown shape, unreadable model, no usable GPU, ...)
  3  the GPU failed, or a point's output failed its correctness gate (no time is reported
     for such a point)

With --json, stdout holds one JSON object: {\"tool\": \"amk\", \"device\", \"read_bandwidth_gbs\",
\"points\": [{\"model\", \"source\", \"dtype\", \"pos\", \"iters\", \"median_ms\", \"p10_ms\", \"p90_ms\",
\"weight_bytes\", \"kv_bytes\", \"bytes\", \"gbs\", \"floor_ms\", \"pct_of_floor\", \"tasks\", \"blocks\",
\"gate\": {\"passed\", \"max_rel_err\", \"tolerance\", \"argmax\", \"argmax_ref\"}}]}; the time fields
are null for a point whose gate failed.";

/// The correctness verdict of one output against its reference.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// max |got − want| / max |want| (infinite when `got` has a non-finite value).
    pub max_rel_err: f64,
    /// argmax of `got`.
    pub argmax: usize,
    /// argmax of `want`.
    pub argmax_ref: usize,
    /// The tolerance applied.
    pub tolerance: f64,
}

impl Gate {
    /// Compares `got` with `want` (same length).
    pub fn check(got: &[f32], want: &[f32], tolerance: f64) -> Gate {
        let scale = want.iter().fold(0f64, |s, &w| s.max((w as f64).abs()));
        let err = if got.len() != want.len() || got.iter().any(|x| !x.is_finite()) {
            f64::INFINITY
        } else {
            got.iter()
                .zip(want)
                .fold(0f64, |s, (&g, &w)| s.max((g as f64 - w as f64).abs()))
        };
        Gate {
            max_rel_err: if scale > 0.0 { err / scale } else { err },
            argmax: argmax(got),
            argmax_ref: argmax(want),
            tolerance,
        }
    }

    /// Argmax equal and error within tolerance.
    pub fn passed(&self) -> bool {
        self.argmax == self.argmax_ref && self.max_rel_err <= self.tolerance
    }

    pub fn why(&self) -> String {
        format!(
            "max relative error {:.3e} (tolerance {:.0e}), argmax {} vs reference {}",
            self.max_rel_err, self.tolerance, self.argmax, self.argmax_ref
        )
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "passed": self.passed(),
            "max_rel_err": if self.max_rel_err.is_finite() { Some(self.max_rel_err) } else { None },
            "tolerance": self.tolerance,
            "argmax": self.argmax,
            "argmax_ref": self.argmax_ref,
        })
    }
}

/// Index of the largest value (the first on ties; NaN never wins).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() {
            best = i;
        }
    }
    best
}

/// Median, p10 and p90 of `samples` (nearest rank).
pub fn summarize(samples: &[f64]) -> (f64, f64, f64) {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let q = |q: f64| {
        if s.is_empty() {
            f64::NAN
        } else {
            s[((s.len() - 1) as f64 * q).round() as usize]
        }
    };
    (q(0.5), q(0.1), q(0.9))
}

/// One benchmarked point.
struct Point {
    pos: u64,
    gate: Gate,
    /// (median, p10, p90) ms, when the gate passed.
    times: Option<(f64, f64, f64)>,
    weight_bytes: u64,
    kv_bytes: u64,
    tasks: usize,
    blocks: u32,
}

/// What is benchmarked: the model and where its weights come from.
pub(crate) struct Subject {
    pub(crate) name: String,
    pub(crate) source: String,
    pub(crate) model: Model,
    pub(crate) synth: Option<SyntheticWeights>,
}

pub(crate) fn subject(a: &BenchArgs) -> Result<Subject, ModelCmdError> {
    match (&a.shape, &a.model) {
        (Some(shape), _) => {
            let cfg = presets::preset(shape).map_err(|e| ModelCmdError::Usage(e.to_string()))?;
            let synth = presets::synthetic_weights(&cfg, a.seed);
            Ok(Subject {
                name: shape.clone(),
                source: "random shape".into(),
                model: Model::shape_only(cfg, format!("{shape} (synthetic weights)")),
                synth: Some(synth),
            })
        }
        (None, Some(path)) => {
            let model = import_model(path)?;
            Ok(Subject {
                name: path.file_name().map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into(),
                ),
                source: path.display().to_string(),
                model,
                synth: None,
            })
        }
        (None, None) => Err(ModelCmdError::Usage(
            "give --shape NAME or --model PATH".into(),
        )),
    }
}

/// `amk bench`.
pub fn run(a: &BenchArgs) -> ExitCode {
    if !a.prefill.is_empty() {
        return finish(a.json, crate::prefill_bench::bench_prefill(a, &a.prefill));
    }
    if !a.prompt_tokens.is_empty() {
        return finish(a.json, crate::e2e_bench::bench_e2e(a, &a.prompt_tokens));
    }
    finish(a.json, bench(a))
}

fn bench(a: &BenchArgs) -> Result<(), ModelCmdError> {
    let dtype = parse_dtype(&a.dtype)?;
    if dtype == DType::F32 {
        return Err(ModelCmdError::Usage(
            "--dtype f32: the benchmark's reference is f32; benchmark bf16 or f16".into(),
        ));
    }
    if !(a.tolerance > 0.0 && a.tolerance.is_finite()) {
        return Err(ModelCmdError::Usage(format!(
            "--tolerance {}: must be a positive number",
            a.tolerance
        )));
    }
    if a.iters == 0 {
        return Err(ModelCmdError::Usage("--iters must be at least 1".into()));
    }
    if a.pos.is_empty() {
        return Err(ModelCmdError::Usage(
            "--pos needs at least one position".into(),
        ));
    }
    let (cfg, schedule) = schedule_config(a.config.as_deref(), true)?;
    let mut target = target_named(&a.target)?;
    let reg = registry()?;
    let subject = subject(a)?;
    let max_pos = a.pos.iter().copied().max().unwrap_or(0);
    // A checkpoint is gated on a real prefix: the first `pos` tokens of a real text are fed
    // before the gated step (random KV rows are far from anything the model produces, and
    // move half-precision logits further than real text does).
    let prefix = match &subject.synth {
        Some(_) => None,
        None => {
            let tok = subject.model.tokenizer.as_ref().ok_or_else(|| {
                ModelCmdError::Usage(format!(
                    "{}: the model carries no tokenizer to encode the gate's text prefix",
                    subject.source
                ))
            })?;
            Some(crate::e2e_bench::text_ids(tok, max_pos as usize + 1)?)
        }
    };
    let prefix = prefix.as_deref();
    let max_seq = a.max_seq.unwrap_or(1024.max(max_pos + 1));
    let gpu = open_gpu()?;
    target.num_sms = schedule_sms(a.sms, gpu.info().sms)? as i64;
    crate::status::status!("measuring the read bandwidth (2 GiB, 20 passes)...");
    let bw = gpu.read_bandwidth(2 << 30, 20)?;
    let mut points = Vec::new();
    for &pos in &a.pos {
        let lower_at = |dt: DType| -> Result<(ValidatedProgram, Lowered), ModelCmdError> {
            let opts = LowerOptions {
                dtype: dt,
                max_seq: Some(max_seq),
                argmax: false,
                decode_loop: None,
            };
            let mut lowered = lower(&subject.model, &cfg, &target, &opts)?;
            let program = std::mem::take(&mut lowered.program);
            let v = amk_core::validate_owned(program, &reg)
                .map_err(|r| ModelError::Invalid(r.report()))?;
            Ok((v, lowered))
        };
        crate::status::status!("{} pos {pos}: f32 reference...", subject.name);
        let want = {
            let (v, lowered) = lower_at(DType::F32)?;
            let mut s = open(&gpu, &v, &lowered, subject.synth.as_ref(), &reg, a.seed)?;
            feed_prefix(&mut s, &v, prefix, pos)?;
            step(&mut s, &v, pos, prefix)?
        };
        crate::status::status!(
            "{} pos {pos}: {} run and gate...",
            subject.name,
            dtype.name()
        );
        let (v, lowered) = lower_at(dtype)?;
        let mut s = open(&gpu, &v, &lowered, subject.synth.as_ref(), &reg, a.seed)?;
        feed_prefix(&mut s, &v, prefix, pos)?;
        let got = step(&mut s, &v, pos, prefix)?;
        let mut gate = Gate::check(&got, &want, a.tolerance);
        let p = v.program();
        let weight_bytes = p.total_weight_bytes();
        let kv_bytes: u64 = p
            .buffers
            .iter()
            .filter(|b| b.kind == BufferKind::KV_CACHE)
            .map(|b| b.nbytes() / b.shape.first().copied().unwrap_or(1).max(1) * (pos + 1))
            .sum();
        let mut times = None;
        if gate.passed() {
            crate::status::status!(
                "{} pos {pos}: gate passed ({}); timing {} launches after {} warm-ups...",
                subject.name,
                gate.why(),
                a.iters,
                a.warmup
            );
            let inputs = inputs(&v, pos, prefix);
            match time_gated(&mut s, &inputs, &want, a)? {
                Ok(t) => times = Some(t),
                Err(again) => gate = again,
            }
            if a.trace {
                s.enable_trace(&reg)?;
                s.run(&inputs)?;
                errln!("{} pos {pos} trace:\n{}", subject.name, s.trace_summary()?);
                if let Some(path) = &a.trace_out {
                    write_trace(path, &subject.name, pos, s.program(), &s.trace()?)?;
                }
            }
        }
        if times.is_none() {
            errln!("{} pos {pos}: GATE FAILED: {}", subject.name, gate.why());
        }
        points.push(Point {
            pos,
            gate,
            times,
            weight_bytes,
            kv_bytes,
            tasks: p.tasks.len(),
            blocks: s.grid(),
        });
    }
    report(a, &subject, &gpu, bw, dtype, &schedule, &points);
    match points.iter().find(|p| p.times.is_none()) {
        Some(p) => Err(ModelCmdError::Gate(format!(
            "{} pos {}: {}",
            subject.name,
            p.pos,
            p.gate.why()
        ))),
        None => Ok(()),
    }
}

/// A report's table cell: the number with `digits` decimals, or "—" for none (a failed gate).
pub(crate) fn cell(v: &serde_json::Value, digits: usize) -> String {
    v.as_f64()
        .map_or("—".to_string(), |x| format!("{x:.digits$}"))
}

/// `--warmup` then `--iters` timed launches of `s` on `inputs` (kernel time, from device
/// events): their (median, p10, p90) ms when the last launch's logits still pass the gate
/// against `want`, otherwise that gate.
pub(crate) fn time_gated(
    s: &mut CudaSession,
    inputs: &[(&'static str, Tensor)],
    want: &[f32],
    a: &BenchArgs,
) -> Result<Result<(f64, f64, f64), Gate>, ModelCmdError> {
    for _ in 0..a.warmup {
        s.run(inputs)?;
    }
    let mut ms = Vec::with_capacity(a.iters);
    let mut last = None;
    for _ in 0..a.iters {
        last = Some(s.run(inputs)?);
        ms.push(s.last_kernel_ms().map_or(f64::NAN, f64::from));
    }
    let again = Gate::check(&logits(last)?, want, a.tolerance);
    Ok(match again.passed() {
        true => Ok(summarize(&ms)),
        false => Err(again),
    })
}

/// Feeds `prefix[..pos]` (a real text) one step each, so that the KV cache holds what the
/// model itself wrote for it; nothing without a prefix (synthetic weights: `open` filled the
/// caches).
fn feed_prefix(
    s: &mut CudaSession,
    v: &ValidatedProgram,
    prefix: Option<&[u32]>,
    pos: u64,
) -> Result<(), ModelCmdError> {
    if prefix.is_some() {
        for p in 0..pos {
            s.run(&inputs(v, p, prefix))?;
        }
    }
    Ok(())
}

/// Loads a session with the subject's weights; synthetic weights get a synthetic KV prefix.
pub(crate) fn open(
    gpu: &CudaBackend,
    v: &ValidatedProgram,
    lowered: &Lowered,
    synth: Option<&SyntheticWeights>,
    reg: &Registry,
    seed: u64,
) -> Result<CudaSession, ModelCmdError> {
    let mut s = match synth {
        Some(w) => gpu.load_session_synthetic(v, w, reg)?,
        None => gpu.load_session(v, &lowered.weights, reg)?,
    };
    if synth.is_some() {
        let caches: Vec<usize> = (0..v.program().buffers.len())
            .filter(|&b| v.program().buffers[b].kind == BufferKind::KV_CACHE)
            .collect();
        for b in caches {
            s.fill_synthetic(b, seed ^ 0x006b_7663_6163_6865, KV_INIT)?;
        }
    }
    Ok(s)
}

/// The decode step's inputs at `pos`: the prefix's token there, or a fixed,
/// position-dependent one.
fn inputs(v: &ValidatedProgram, pos: u64, prefix: Option<&[u32]>) -> Vec<(&'static str, Tensor)> {
    let vocab = v
        .program()
        .buffers
        .iter()
        .find(|b| b.name == "logits")
        .and_then(|b| b.shape.last().copied())
        .unwrap_or(1)
        .max(1);
    let token = match prefix.and_then(|t| t.get(pos as usize)) {
        Some(&t) => u64::from(t),
        None => (pos * 7919 + 1234) % vocab,
    };
    let scalar = |x: u64| Tensor::from_i64(DType::I32, &[1], &[x as i64]);
    let mut out = Vec::new();
    for (name, x) in [("token_id", token), ("pos", pos), ("reshape_id0", 0)] {
        if let Ok(t) = scalar(x) {
            out.push((name, t));
        }
    }
    out
}

/// One step with poisoned outputs; the logits as f32.
fn step(
    s: &mut CudaSession,
    v: &ValidatedProgram,
    pos: u64,
    prefix: Option<&[u32]>,
) -> Result<Vec<f32>, ModelCmdError> {
    s.poison_outputs()?;
    let out = s.run(&inputs(v, pos, prefix))?;
    logits(Some(out))
}

/// The `logits` output of a step as f32.
/// The GPU `amk bench` runs on, announced on stderr (`backend: cuda (DEVICE)`); without one,
/// the command's `backend` error.
pub(crate) fn open_gpu() -> Result<CudaBackend, ModelCmdError> {
    let gpu = CudaOptions::from_env()
        .and_then(CudaBackend::new)
        .map_err(|source| ModelCmdError::NeedsCuda {
            command: "amk bench",
            source,
        })?;
    crate::status::status!("backend: cuda ({})", gpu.info());
    Ok(gpu)
}

/// Appends one traced step to `path` as CSV (a header first when the file is new): the
/// scheduler's points, then the op's probes (`amk_probe`), empty where not stamped. A
/// prefill point's `pos` is its chunk's first position.
pub(crate) fn write_trace(
    path: &std::path::Path,
    model: &str,
    pos: u64,
    p: &amk_core::ir::Program,
    tr: &[amk_core::TaskTrace],
) -> Result<(), ModelCmdError> {
    use std::io::Write;
    let t0 = tr.iter().map(|t| t.reached).min().unwrap_or(0);
    let us = |t: u64| t.saturating_sub(t0) as f64 / 1e3;
    let new = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut out = String::new();
    if new {
        out.push_str(
            "model,pos,task,label,op,block,reached_us,ready_us,prologue_us,returned_us,done_us,dispatched_us,waiting_us,probe0_us,probe1_us,probe2_us,probe3_us,probe4_us,probe5_us,probe6_us,probe7_us\n",
        );
    }
    // A point recorded only on some paths (0: not recorded) is left empty.
    let opt = |v: u64| {
        if v == 0 {
            String::new()
        } else {
            format!("{:.3}", us(v))
        }
    };
    for t in tr {
        let Some(task) = p.tasks.get(t.task) else {
            continue;
        };
        let probes: Vec<String> = t.probes.iter().map(|&p| opt(p)).collect();
        out.push_str(&format!(
            "{model},{pos},{},{},{},{},{:.3},{:.3},{},{:.3},{:.3},{},{},{}\n",
            t.task,
            task.label.replace(',', ";"),
            task.op,
            t.block,
            us(t.reached),
            us(t.ready),
            opt(t.prologue),
            us(t.returned),
            us(t.done),
            opt(t.dispatched),
            opt(t.waiting),
            probes.join(",")
        ));
    }
    f.write_all(out.as_bytes())?;
    Ok(())
}

pub(crate) fn logits(out: Option<amk_core::Outputs>) -> Result<Vec<f32>, ModelCmdError> {
    out.as_ref()
        .and_then(|o| o.get("logits"))
        .map(|t| t.to_f32_vec())
        .ok_or_else(|| ModelCmdError::Usage("the program has no `logits` output".into()))
}

/// The SMs the decode programs are laid out for: `--sms` when it is within the device's count,
/// else all of them.
fn schedule_sms(asked: Option<usize>, device: usize) -> Result<usize, ModelCmdError> {
    match asked {
        None => Ok(device),
        Some(n) if (1..=device).contains(&n) => Ok(n),
        Some(n) => Err(ModelCmdError::Usage(format!(
            "--sms {n}: the device has {device} SMs; give 1 to {device}"
        ))),
    }
}

fn report(
    a: &BenchArgs,
    subject: &Subject,
    gpu: &CudaBackend,
    bw: f64,
    dtype: DType,
    schedule: &str,
    points: &[Point],
) {
    let rows: Vec<serde_json::Value> = points
        .iter()
        .map(|p| {
            let bytes = p.weight_bytes + p.kv_bytes;
            let floor_ms = bytes as f64 / bw * 1e3;
            let (med, p10, p90) = match p.times {
                Some((m, l, h)) => (Some(m), Some(l), Some(h)),
                None => (None, None, None),
            };
            serde_json::json!({
                "model": subject.name,
                "source": subject.source,
                "dtype": dtype.name(),
                "pos": p.pos,
                "iters": a.iters,
                "median_ms": med,
                "p10_ms": p10,
                "p90_ms": p90,
                "weight_bytes": p.weight_bytes,
                "kv_bytes": p.kv_bytes,
                "bytes": bytes,
                "gbs": med.map(|m| bytes as f64 / (m * 1e-3) / 1e9),
                "floor_ms": floor_ms,
                "pct_of_floor": med.map(|m| 100.0 * floor_ms / m),
                "tasks": p.tasks,
                "blocks": p.blocks,
                "schedule": schedule,
                "gate": p.gate.json(),
            })
        })
        .collect();
    if a.json {
        let v = serde_json::json!({
            "tool": "amk",
            "device": gpu.info().to_string(),
            "read_bandwidth_gbs": bw / 1e9,
            "points": rows,
        });
        outln!("{v}");
        return;
    }
    outln!(
        "device: {}; read bandwidth {:.0} GB/s (streaming kernel, 2 GiB, median of 20); schedule {schedule}",
        gpu.info(),
        bw / 1e9
    );
    outln!(
        "| model | dtype | pos | median ms | p10 | p90 | MB read | GB/s | floor ms | % of floor | tasks | blocks | gate (rel err, argmax) |"
    );
    outln!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (p, r) in points.iter().zip(&rows) {
        let f = |k: &str| cell(&r[k], 3);
        let pct = r["pct_of_floor"]
            .as_f64()
            .map_or("—".to_string(), |x| format!("{x:.1} %"));
        let gbs = cell(&r["gbs"], 0);
        outln!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {} | {:.3} | {} | {} | {} | {} ({:.1e}, {}) |",
            subject.name,
            dtype.name(),
            p.pos,
            f("median_ms"),
            f("p10_ms"),
            f("p90_ms"),
            (p.weight_bytes + p.kv_bytes) as f64 / 1e6,
            gbs,
            r["floor_ms"].as_f64().unwrap_or(f64::NAN),
            pct,
            p.tasks,
            p.blocks,
            if p.times.is_some() {
                "passed"
            } else {
                "FAILED"
            },
            p.gate.max_rel_err,
            if p.gate.argmax == p.gate.argmax_ref {
                "equal"
            } else {
                "differs"
            },
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests

    use super::*;

    #[test]
    fn gate_needs_equal_argmax_and_small_error() {
        let want = [1.0f32, 4.0, -2.0, 3.9];
        assert!(Gate::check(&[1.0, 4.0, -2.0, 3.9], &want, 2e-2).passed());
        // 1 % of the largest |value| off: inside 2e-2.
        let g = Gate::check(&[1.04, 4.0, -2.0, 3.9], &want, 2e-2);
        assert!(g.passed() && (g.max_rel_err - 0.01).abs() < 1e-6, "{g:?}");
        // Too far.
        assert!(!Gate::check(&[1.2, 4.0, -2.0, 3.9], &want, 2e-2).passed());
        // Small error but the argmax moved.
        let g = Gate::check(&[1.0, 3.95, -2.0, 3.96], &want, 2e-2);
        assert!(!g.passed() && g.argmax == 3 && g.argmax_ref == 1, "{g:?}");
        // A NaN (an output the kernel never wrote stays poisoned) always fails.
        let g = Gate::check(&[f32::NAN, 4.0, -2.0, 3.9], &want, 2e-2);
        assert!(!g.passed() && g.max_rel_err.is_infinite());
        assert!(!Gate::check(&[1.0, 4.0], &want, 2e-2).passed());
    }

    #[test]
    fn sms_within_the_device_or_refused() {
        assert_eq!(schedule_sms(None, 132).unwrap(), 132);
        assert_eq!(schedule_sms(Some(120), 132).unwrap(), 120);
        assert_eq!(schedule_sms(Some(132), 132).unwrap(), 132);
        for bad in [0, 133] {
            let e = schedule_sms(Some(bad), 132).unwrap_err().to_string();
            assert!(e.contains("1 to 132"), "{e}");
        }
    }

    #[test]
    fn summaries_use_nearest_rank() {
        let s: Vec<f64> = (1..=11).rev().map(f64::from).collect();
        assert_eq!(summarize(&s), (6.0, 2.0, 10.0));
        assert_eq!(argmax(&[0.0, 2.0, 2.0, 1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
    }
}
