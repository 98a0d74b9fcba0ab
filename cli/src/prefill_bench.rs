//! `amk bench --prefill ROWS`: correctness-gated prompt processing on the GPU — the prefill
//! program (`amk_model_llama::lower::prefill`) over one chunk of `ROWS` prompt tokens whose
//! first position is each `--pos`.
//!
//! Per point (chunk size × first position): lower the prefill program in f32 and in the
//! benchmarked half precision (logits of the chunk's last row); feed the same cache prefix to
//! both (a checkpoint: the first tokens of a real text, through the same program in chunks;
//! synthetic weights: a synthetic KV prefix generated on the device); run the f32 program once
//! for the reference, then the half-precision one with its output poisoned first, and time it
//! only when its logits pass the gate (as `amk bench`'s decode points). Prompt tokens per
//! second are `ROWS` over the kernel's median time.

use crate::bench_cmd::{BenchArgs, Gate, open, open_gpu};
use crate::model_cmd::{ModelCmdError, parse_dtype, registry};
use crate::output::{errln, outln};
use amk_backend_cuda::CudaSession;
use amk_core::{DType, Tensor, ValidatedProgram};
use amk_model_llama::ModelError;
use amk_model_llama::lower::Lowered;
use amk_model_llama::lower::prefill::{
    IDS, LAST, LIMITS, POS, PrefillLogits, PrefillOptions, lower_prefill,
};

/// One measured chunk.
struct Point {
    rows: u64,
    pos: u64,
    gate: Gate,
    times: Option<(f64, f64, f64)>,
    tasks: usize,
}

/// The chunk's inputs: `rows` ids from position `p0` (the text's, or fixed ones), its
/// positions, its last row as the logits row, and no vocabulary limit for its summaries.
fn inputs(rows: u64, p0: u64, text: Option<&[u32]>, vocab: u64) -> Vec<(&'static str, Tensor)> {
    let ids: Vec<i64> = (p0..p0 + rows)
        .map(|p| match text.and_then(|t| t.get(p as usize)) {
            Some(&t) => i64::from(t),
            None => ((p * 7919 + 1234) % vocab.max(1)) as i64,
        })
        .collect();
    let pos: Vec<i64> = (p0 as i64..(p0 + rows) as i64).collect();
    let mut out = Vec::new();
    for (name, v, len) in [
        (IDS, ids, rows),
        (POS, pos, rows),
        (LAST, vec![rows as i64 - 1], 1),
        (
            LIMITS,
            vec![0; amk_core::decode::LIMITS_LEN as usize],
            amk_core::decode::LIMITS_LEN,
        ),
    ] {
        if let Ok(t) = Tensor::from_i64(DType::I32, &[len], &v) {
            out.push((name, t));
        }
    }
    out
}

/// Runs the chunks before `p0` (a real text's), so the cache holds what the model wrote.
fn feed(
    s: &mut CudaSession,
    rows: u64,
    p0: u64,
    text: Option<&[u32]>,
    vocab: u64,
) -> Result<(), ModelCmdError> {
    if text.is_some() {
        for c0 in (0..p0).step_by(rows as usize) {
            s.run(&inputs(rows, c0, text, vocab))?;
        }
    }
    Ok(())
}

/// `amk bench --prefill`.
pub fn bench_prefill(a: &BenchArgs, chunks: &[u64]) -> Result<(), ModelCmdError> {
    let dtype = parse_dtype(&a.dtype)?;
    if dtype == DType::F32 || chunks.contains(&0) || a.iters == 0 {
        return Err(ModelCmdError::Usage(
            "--prefill: chunk sizes of at least 1 row, --dtype bf16 or f16, --iters at least 1"
                .into(),
        ));
    }
    let reg = registry()?;
    let subject = crate::bench_cmd::subject(a)?;
    let max_pos = a.pos.iter().copied().max().unwrap_or(0);
    let max_rows = chunks.iter().copied().max().unwrap_or(1);
    let text = match (&subject.synth, subject.model.tokenizer.as_ref()) {
        (Some(_), _) => None,
        (None, Some(tok)) => Some(crate::e2e_bench::text_ids(
            tok,
            (max_pos + max_rows) as usize,
        )?),
        (None, None) => {
            return Err(ModelCmdError::Usage(format!(
                "{}: the model carries no tokenizer to encode the gate's text",
                subject.source
            )));
        }
    };
    let text = text.as_deref();
    let max_seq = a.max_seq.unwrap_or(1024.max(max_pos + max_rows));
    let gpu = open_gpu()?;
    let mut target = crate::model_cmd::target_named(&a.target)?;
    target.num_sms = gpu.info().sms as i64;
    let vocab = subject.model.config.vocab as u64;
    let mut points = Vec::new();
    for &rows in chunks {
        for &p0 in &a.pos {
            let lower_at = |dt: DType| -> Result<(ValidatedProgram, Lowered), ModelCmdError> {
                let opts = PrefillOptions {
                    dtype: dt,
                    max_seq,
                    rows,
                    logits: PrefillLogits::Last,
                };
                let mut lowered = lower_prefill(&subject.model, &target, &opts)?;
                let program = std::mem::take(&mut lowered.program);
                let v = amk_core::validate_owned(program, &reg)
                    .map_err(|r| ModelError::Invalid(r.report()))?;
                Ok((v, lowered))
            };
            let ins = inputs(rows, p0, text, vocab);
            crate::status::status!("{} prefill {rows} at {p0}: f32 reference...", subject.name);
            let want = {
                let (v, lowered) = lower_at(DType::F32)?;
                let mut s = open(&gpu, &v, &lowered, subject.synth.as_ref(), &reg, a.seed)?;
                feed(&mut s, rows, p0, text, vocab)?;
                crate::bench_cmd::logits(Some(s.run(&ins)?))?
            };
            let (v, lowered) = lower_at(dtype)?;
            let mut s = open(&gpu, &v, &lowered, subject.synth.as_ref(), &reg, a.seed)?;
            feed(&mut s, rows, p0, text, vocab)?;
            s.poison_outputs()?;
            let got = crate::bench_cmd::logits(Some(s.run(&ins)?))?;
            let mut gate = Gate::check(&got, &want, a.tolerance);
            let mut times = None;
            if gate.passed() {
                match crate::bench_cmd::time_gated(&mut s, &ins, &want, a)? {
                    Ok(t) => times = Some(t),
                    Err(again) => gate = again,
                }
                if a.trace {
                    s.enable_trace(&reg)?;
                    s.run(&ins)?;
                    errln!(
                        "{} prefill {rows} at {p0} trace:\n{}",
                        subject.name,
                        s.trace_summary()?
                    );
                    if let Some(path) = &a.trace_out {
                        crate::bench_cmd::write_trace(
                            path,
                            &subject.name,
                            p0,
                            s.program(),
                            &s.trace()?,
                        )?;
                    }
                }
            }
            if times.is_none() {
                errln!(
                    "{} prefill {rows} at {p0}: GATE FAILED: {}",
                    subject.name,
                    gate.why()
                );
            }
            points.push(Point {
                rows,
                pos: p0,
                gate,
                times,
                tasks: v.program().tasks.len(),
            });
        }
    }
    report(a, &subject.name, &gpu.info().to_string(), dtype, &points);
    match points.iter().find(|p| p.times.is_none()) {
        Some(p) => Err(ModelCmdError::Gate(format!(
            "{} prefill {} at {}: {}",
            subject.name,
            p.rows,
            p.pos,
            p.gate.why()
        ))),
        None => Ok(()),
    }
}

fn report(a: &BenchArgs, name: &str, device: &str, dtype: DType, points: &[Point]) {
    let rows: Vec<serde_json::Value> = points
        .iter()
        .map(|p| {
            let med = p.times.map(|t| t.0);
            serde_json::json!({
                "model": name,
                "dtype": dtype.name(),
                "mode": "prefill",
                "rows": p.rows,
                "pos": p.pos,
                "iters": a.iters,
                "median_ms": med,
                "p10_ms": p.times.map(|t| t.1),
                "p90_ms": p.times.map(|t| t.2),
                "prompt_tokens_per_s": med.map(|m| p.rows as f64 / (m * 1e-3)),
                "tasks": p.tasks,
                "gate": p.gate.json(),
            })
        })
        .collect();
    if a.json {
        outln!(
            "{}",
            serde_json::json!({"tool": "amk", "device": device, "points": rows})
        );
        return;
    }
    outln!("device: {device}");
    outln!(
        "| model | dtype | rows | first pos | median ms | p10 | p90 | prompt tok/s | tasks | gate (rel err, argmax) |"
    );
    outln!("|---|---|---|---|---|---|---|---|---|---|");
    for (p, r) in points.iter().zip(&rows) {
        let f = |k: &str| crate::bench_cmd::cell(&r[k], 3);
        let tps = crate::bench_cmd::cell(&r["prompt_tokens_per_s"], 0);
        outln!(
            "| {name} | {} | {} | {} | {} | {} | {} | {tps} | {} | {} ({:.1e}) |",
            dtype.name(),
            p.rows,
            p.pos,
            f("median_ms"),
            f("p10_ms"),
            f("p90_ms"),
            p.tasks,
            if p.gate.passed() { "pass" } else { "FAIL" },
            p.gate.max_rel_err,
        );
    }
}
