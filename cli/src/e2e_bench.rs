//! `amk bench --model F --prompt-tokens P --gen N --depth D,...`: what a user gets, end to
//! end, through the engine (the same path as `amk generate`): time to first token for a
//! P-token prompt, prompt tokens per second, and the decode rate of N generated tokens after
//! D tokens of context, wall clock on the host (token arrival times) next to the device's
//! time per pass.
//!
//! Correctness gate first: the half-precision engine and an f32 engine of the same checkpoint
//! are fed the same real text, teacher-forced; the half-precision logits at its last position
//! must be within the tolerance of the f32 ones with the same argmax, or nothing is timed.
//! Prompts are real text (a built-in passage, repeated to length), tokenized by the model's
//! tokenizer; generation ignores end tokens so every run produces exactly N tokens.

use crate::bench_cmd::{BenchArgs, Gate, summarize};
use crate::model_cmd::{
    ModelCmdError, import_model, parse_dtype, registry, schedule_config, target_named,
};
use crate::output::outln;
use amk_backend_cuda::CudaBackend;
use amk_core::DType;
use amk_engine::{DecodeProgram, Engine, EngineOptions, Generation, Request};
use std::path::Path;

/// The passage prompts are cut from (repeated as needed).
const PASSAGE: &str = "The river town woke slowly in the autumn of that year. Fishermen \
pulled their boats onto the gravel before the sun had cleared the hills, and the baker on the \
corner swept flour from his step while the first carts rattled across the old stone bridge. \
Nobody in the town could remember who had built the bridge, only that it had always been \
there, and that the spring floods had never once reached the top of its arches. Children \
raced along the parapet on their way to the schoolhouse, where a patient teacher wrote sums \
on a slate board and read aloud from a book of maps. In the afternoons the market filled \
with apples, cheese, wool and news from the villages upstream, and the traders argued about \
prices, weather and the new railway that was said to be coming from the capital. Some \
welcomed it, saying the town would grow rich; others feared that the young would leave on \
the first train and never come back. The old ferryman, who had carried passengers across \
the water for forty years, said nothing at all, but he began to mend his nets more carefully \
than before, as if he expected to need them for a long time yet. ";

/// Token ids of at least `n` tokens of the passage (repeated), cut to exactly `n`.
pub(crate) fn text_ids(
    tok: &amk_model_llama::Tokenizer,
    n: usize,
) -> Result<Vec<u32>, ModelCmdError> {
    let once = tok.encode(PASSAGE)?;
    if once.is_empty() {
        return Err(ModelCmdError::Usage(
            "the tokenizer encodes the benchmark text to no tokens".into(),
        ));
    }
    Ok(once.iter().copied().cycle().take(n).collect())
}

/// One generation request with no end tokens (so exactly `max_new` tokens come out).
fn generate(
    engine: &mut Engine,
    prompt: &[u32],
    max_new: usize,
) -> Result<Generation, ModelCmdError> {
    let req = Request::greedy(prompt, max_new, &[]);
    let g = engine.generate(&req, &mut |_| true)?;
    if g.tokens.len() != max_new {
        return Err(ModelCmdError::Usage(format!(
            "asked for {max_new} tokens after {} prompt tokens, got {} ({}): raise --max-seq",
            prompt.len(),
            g.tokens.len(),
            g.finish.as_str()
        )));
    }
    Ok(g)
}

/// The decode figures of one depth.
struct DepthPoint {
    depth: usize,
    /// Median over the repeats: generated tokens per second after the first.
    decode_tok_s: f64,
    /// Median device ms per decode pass.
    kernel_ms: Option<f64>,
}

/// The logits at the last position of `ids`, teacher-forced.
fn last_logits(engine: &mut Engine, ids: &[u32]) -> Result<Vec<f32>, ModelCmdError> {
    let mut last = Vec::new();
    engine.forced_logits(ids, &mut |_, l| last = l.to_vec())?;
    Ok(last)
}

/// Runs the end-to-end benchmark for prompts of `prompts` tokens (`--prompt-tokens`).
pub fn bench_e2e(a: &BenchArgs, prompts: &[usize]) -> Result<(), ModelCmdError> {
    let dtype = parse_dtype(&a.dtype)?;
    let path = a.model.as_deref().ok_or_else(|| {
        ModelCmdError::Usage(
            "--prompt-tokens (the end-to-end benchmark) needs --model: a checkpoint with a tokenizer"
                .into(),
        )
    })?;
    if prompts.iter().any(|&p| p < 2) || a.gen_tokens < 2 {
        return Err(ModelCmdError::Usage(
            "--prompt-tokens and --gen must be at least 2".into(),
        ));
    }
    let longest_prompt = prompts.iter().copied().max().unwrap_or(2);
    let depths: Vec<usize> = a.depth.iter().map(|&d| d as usize).collect();
    let longest = depths
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(longest_prompt)
        + a.gen_tokens;
    let gpu = crate::bench_cmd::open_gpu()?;
    let reg = registry()?;
    let model = import_model(path)?;
    let tok = model.tokenizer.clone().ok_or_else(|| {
        ModelCmdError::Usage(format!(
            "{}: the model carries no tokenizer",
            path.display()
        ))
    })?;
    let mut target = target_named(&a.target)?;
    target.num_sms = gpu.info().sms as i64;
    let (schedule, schedule_name) = schedule_config(a.config.as_deref(), true)?;
    let options = |dtype: DType| {
        let at = amk_engine::Placement {
            gpu: true,
            scoring: false,
        };
        EngineOptions {
            max_seq: Some(a.max_seq.unwrap_or(longest as u64 + 1)),
            ..EngineOptions::defaults(schedule.clone(), target.clone(), dtype, at)
                .with_asked(None, a.short_context)
        }
    };
    let gate_ids = text_ids(&tok, longest_prompt.min(GATE_TOKENS))?;
    crate::status::status!(
        "gate: f32 reference over {} tokens of text...",
        gate_ids.len()
    );
    let want = {
        let mut f32_engine = amk_engine::lower_and_load(&model, &options(DType::F32), &gpu, &reg)?;
        last_logits(&mut f32_engine, &gate_ids)?
    };
    let mut engine = amk_engine::lower_and_load(&model, &options(dtype), &gpu, &reg)?;
    let gate = Gate::check(&last_logits(&mut engine, &gate_ids)?, &want, a.tolerance);
    if !gate.passed() {
        return Err(ModelCmdError::Gate(format!(
            "{} at position {}: {}",
            dtype.name(),
            gate_ids.len() - 1,
            gate.why()
        )));
    }
    crate::status::status!("gate passed ({}); warming up...", gate.why());
    generate(&mut engine, &text_ids(&tok, 8)?, 8)?;
    let repeat = a.repeat.max(1);
    let mut firsts = Vec::new();
    for &tokens in prompts {
        crate::status::status!("prompt of {tokens} tokens, {repeat} times...");
        firsts.push(first_token(&mut engine, &text_ids(&tok, tokens)?, repeat)?);
    }
    let mut points = Vec::new();
    for &depth in &depths {
        crate::status::status!("depth {depth}: {} tokens, {repeat} times...", a.gen_tokens);
        let ids = text_ids(&tok, depth.max(1))?;
        let (mut rates, mut kernel) = (Vec::new(), Vec::new());
        for _ in 0..repeat {
            // Device time a token: the difference between a generation of two tokens and one
            // of N, over N - 2 passes (with a prompt program the first token comes from it,
            // so a one-token generation runs no decode pass to subtract).
            let two = generate(&mut engine, &ids, 2)?;
            let g = generate(&mut engine, &ids, a.gen_tokens)?;
            rates.push(g.decode_tokens_per_s().unwrap_or(f64::NAN));
            if let (Some(k2), Some(kn), true) = (two.kernel_ms, g.kernel_ms, a.gen_tokens > 2) {
                kernel.push((kn - k2) / (a.gen_tokens - 2) as f64);
            }
        }
        points.push(DepthPoint {
            depth,
            decode_tok_s: summarize(&rates).0,
            kernel_ms: (!kernel.is_empty()).then(|| summarize(&kernel).0),
        });
    }
    if a.trace {
        trace_depths(a, path, &mut engine, &reg, &depths, |d| {
            text_ids(&tok, d.max(1))
        })?;
    }
    let programs = Programs {
        schedule: schedule_name,
        prefill_rows: engine.prefill_chunk_sizes(),
        short_context: engine.short_context(),
    };
    report(a, path, &gpu, dtype, &firsts, &gate, &points, &programs);
    Ok(())
}

/// A prompt's time to the first token, and the part of it the prompt programs took (medians).
struct FirstToken {
    prompt_tokens: usize,
    ttft_s: f64,
    prefill_s: f64,
}

impl FirstToken {
    fn prompt_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.ttft_s
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "prompt_tokens": self.prompt_tokens,
            "ttft_ms": self.ttft_s * 1e3,
            "prefill_ms": self.prefill_s * 1e3,
            "prompt_tok_s": self.prompt_tok_s(),
        })
    }
}

/// `prompt`'s first token generated `repeat` times.
fn first_token(
    engine: &mut Engine,
    prompt: &[u32],
    repeat: usize,
) -> Result<FirstToken, ModelCmdError> {
    let (mut ttft, mut prefill) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        let g = generate(engine, prompt, 1)?;
        ttft.push(g.first_token_s().unwrap_or(g.total_s));
        prefill.push(g.prefill_s);
    }
    Ok(FirstToken {
        prompt_tokens: prompt.len(),
        ttft_s: summarize(&ttft).0,
        prefill_s: summarize(&prefill).0,
    })
}

/// One more generation at each depth with the decode programs traced, each program that ran
/// written to `--trace-out` (its last pass; `model` names the file and the program, `pos` the
/// depth) and summed up on stderr.
fn trace_depths(
    a: &BenchArgs,
    path: &Path,
    engine: &mut Engine,
    reg: &amk_core::Registry,
    depths: &[usize],
    ids_for: impl Fn(usize) -> Result<Vec<u32>, ModelCmdError>,
) -> Result<(), ModelCmdError> {
    if !engine.enable_trace(reg)? {
        return Err(ModelCmdError::Usage(
            "--trace: this backend records no task times".into(),
        ));
    }
    let file = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    for &depth in depths {
        crate::status::status!("depth {depth}: one traced generation...");
        let g = generate(engine, &ids_for(depth)?, a.gen_tokens)?;
        for t in engine.decode_traces()? {
            // A program that ran no pass of this generation holds an earlier one's trace.
            let ran = match t.role {
                DecodeProgram::ShortContext => g.short_passes > 0,
                DecodeProgram::Main => g.passes > g.short_passes,
            };
            if !ran || t.tasks.iter().all(|r| r.reached == 0) {
                continue;
            }
            let span = pass_span_us(&t.tasks);
            crate::output::errln!(
                "depth {depth}: {} program's last pass {span:.1} us ({} tasks)",
                t.role.as_str(),
                t.tasks.len()
            );
            if let Some(out) = &a.trace_out {
                let model = format!("{file} {}", t.role.as_str());
                crate::bench_cmd::write_trace(out, &model, depth as u64, t.program, &t.tasks)?;
            }
        }
    }
    Ok(())
}

/// A traced pass's span: its first task reached to its last one done, in µs.
fn pass_span_us(tasks: &[amk_core::TaskTrace]) -> f64 {
    let start = tasks.iter().map(|t| t.reached).filter(|&r| r > 0).min();
    let end = tasks.iter().map(|t| t.done).max();
    match (start, end) {
        (Some(s), Some(e)) => e.saturating_sub(s) as f64 / 1e3,
        _ => 0.0,
    }
}

/// Which programs the engine runs beside its decode loop, for the report.
struct Programs {
    /// The decode schedule (`--config`).
    schedule: String,
    /// The prompt programs' rows.
    prefill_rows: Vec<u64>,
    /// The positions the short-context decode program runs.
    short_context: Option<u64>,
}

/// Tokens of text the gate teacher-forces (at most the prompt's length).
const GATE_TOKENS: usize = 64;

#[allow(clippy::too_many_arguments)] // reason: one report's every figure
fn report(
    a: &BenchArgs,
    path: &Path,
    gpu: &CudaBackend,
    dtype: DType,
    firsts: &[FirstToken],
    gate: &Gate,
    points: &[DepthPoint],
    programs: &Programs,
) {
    let depths: Vec<serde_json::Value> = points
        .iter()
        .map(|p| {
            serde_json::json!({
                "depth": p.depth,
                "decode_tok_s": p.decode_tok_s,
                "wall_ms_per_token": 1e3 / p.decode_tok_s,
                "kernel_ms_per_token": p.kernel_ms,
                "tokens": a.gen_tokens,
            })
        })
        .collect();
    if a.json {
        let mut v = serde_json::json!({
            "tool": "amk",
            "mode": "e2e",
            "device": gpu.info().to_string(),
            "model": path.display().to_string(),
            "dtype": dtype.name(),
            "gen_tokens": a.gen_tokens,
            "repeat": a.repeat.max(1),
            "prompts": firsts.iter().map(FirstToken::json).collect::<Vec<_>>(),
            "gate": gate.json(),
            "schedule": programs.schedule,
            "prefill_rows": programs.prefill_rows,
            "short_context": programs.short_context,
            "depths": depths,
        });
        // The first prompt's figures at the top level too, as a one-prompt run reports them.
        if let (Some(obj), Some(serde_json::Value::Object(first))) =
            (v.as_object_mut(), firsts.first().map(FirstToken::json))
        {
            obj.extend(first);
        }
        outln!("{v}");
        return;
    }
    outln!(
        "device: {}; model {}; {}; schedule {}; median of {} runs",
        gpu.info(),
        path.display(),
        dtype.name(),
        programs.schedule,
        a.repeat.max(1)
    );
    outln!(
        "prompt programs of {:?} rows; short-context decode program: {}",
        programs.prefill_rows,
        programs
            .short_context
            .map_or("none".to_string(), |b| format!("positions below {b}"))
    );
    for f in firsts {
        outln!(
            "prompt: {} tokens, time to first token {:.2} ms ({:.0} tok/s; prompt programs {:.2} ms of it)",
            f.prompt_tokens,
            f.ttft_s * 1e3,
            f.prompt_tok_s(),
            f.prefill_s * 1e3,
        );
    }
    outln!("| depth | decode tok/s | wall ms/token | kernel ms/token | loop overhead |");
    outln!("|---|---|---|---|---|");
    for p in points {
        let wall = 1e3 / p.decode_tok_s;
        let (k, over) = match p.kernel_ms {
            Some(k) => (
                format!("{k:.3}"),
                format!("{:.1} %", 100.0 * (wall / k - 1.0)),
            ),
            None => ("—".into(), "—".into()),
        };
        outln!(
            "| {} | {:.0} | {:.3} | {k} | {over} |",
            p.depth,
            p.decode_tok_s,
            wall
        );
    }
}
