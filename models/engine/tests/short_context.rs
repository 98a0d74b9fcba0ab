//! The short-context decode program on the CPU VM: the engine runs it for the positions below
//! its bound and its own program from there, handing the loop's state over between launches,
//! and the tokens are those of the engine's program alone (the reference: an engine without
//! the short program, its teacher-forced logits one pass a launch, argmaxed on the host)
//! wherever the bound falls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use amk_backend_cpu::CpuBackend;
use amk_core::{DType, GpuTarget, ScheduleConfig};
use amk_engine::{
    Engine, EngineError, EngineOptions, Request, Sampling, argmax, default_short_context,
    lower_and_load,
};
use amk_model_llama::lower::{
    DecodeLoop, LowerOptions, lower, short_context_schedule, tuned_schedule,
};
use rstest::rstest;
use support::{registry, tiny};

fn engine(short_context: Option<u64>) -> Engine {
    let opts = EngineOptions {
        schedule: tuned_schedule(),
        target: GpuTarget::by_name("h100").unwrap(),
        dtype: DType::F32,
        max_seq: Some(32),
        stop_slots: 4,
        prefill_rows: None,
        short_context,
    };
    lower_and_load(&tiny(), &opts, &CpuBackend::default(), &registry()).unwrap()
}

/// Greedy continuation by teacher forcing (one pass a launch, argmaxed on the host).
fn host_greedy(e: &mut Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        seq.push(0);
        let mut last = Vec::new();
        e.forced_logits(&seq, &mut |_, l| last = l.to_vec())
            .unwrap();
        *seq.last_mut().unwrap() = argmax(&last);
    }
    seq[prompt.len()..].to_vec()
}

const PROMPT: &[u32] = &[3, 17, 5, 29, 11];
const NEW: usize = 12;

/// Bounds inside the prompt, at its last token, inside the generated tokens and past the
/// request; launches of every pass, of a few, and of one.
#[rstest]
fn the_short_program_runs_below_its_bound_and_changes_no_token(
    #[values(1, 4, 5, 9, 40)] below: u64,
    #[values(None, Some(1), Some(3))] per_launch: Option<u64>,
) {
    // The reference: the split program alone (the two layouts round alike enough on this
    // model that greedy tokens agree).
    let want = host_greedy(&mut engine(None), PROMPT, NEW);
    let mut e = engine(Some(below));
    assert_eq!(
        e.short_context(),
        Some(below.min(32)),
        "{:?}",
        e.short_refused()
    );
    assert_eq!(host_greedy(&mut e, PROMPT, NEW), want, "teacher-forced");
    let req = Request {
        passes_per_launch: per_launch,
        ..Request::greedy(PROMPT, NEW, &[])
    };
    let g = e.generate(&req, &mut |_| true).unwrap();
    assert_eq!(g.ids(), want);
    // Positions 0..=15 run a pass each (the last token is not fed).
    let passes = (PROMPT.len() + NEW - 1) as u64;
    assert_eq!(g.passes, passes);
    assert_eq!(g.short_passes, below.min(passes));
}

#[test]
fn a_seeded_sample_is_the_same_with_and_without_the_short_program() {
    let sample = |e: &mut Engine| {
        let req = Request {
            sampling: Sampling {
                temperature: 1.3,
                top_p: 0.9,
                top_k: 0,
                seed: 11,
            },
            ..Request::greedy(PROMPT, NEW, &[])
        };
        e.generate(&req, &mut |_| true).unwrap().ids()
    };
    let alone = sample(&mut engine(None));
    let mut both = engine(Some(8));
    assert_eq!(sample(&mut both), alone);
    // A second request starts over in the short program.
    assert_eq!(sample(&mut both), alone);
}

#[test]
fn a_stop_token_in_the_short_program_ends_the_request_there() {
    let mut e = engine(Some(9));
    let full = e
        .generate(&Request::greedy(PROMPT, NEW, &[]), &mut |_| true)
        .unwrap()
        .ids();
    let stop = [full[1]];
    let first = full.iter().position(|t| *t == full[1]).unwrap();
    let g = e
        .generate(&Request::greedy(PROMPT, NEW, &stop), &mut |_| true)
        .unwrap();
    assert_eq!(g.ids(), full[..=first]);
}

#[test]
fn attach_short_checks_the_interface() {
    let mut e = engine(None);
    let lowered = |max_seq| {
        let opts = LowerOptions {
            dtype: DType::F32,
            max_seq: Some(max_seq),
            argmax: false,
            decode_loop: Some(DecodeLoop { stop_slots: 4 }),
        };
        let cfg = short_context_schedule(&tuned_schedule()).unwrap();
        lower(&tiny(), &cfg, &GpuTarget::by_name("h100").unwrap(), &opts).unwrap()
    };
    let other = lowered(16);
    let err = e
        .attach_short(other.program, &other.weights, &registry(), 8)
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Interface(m) if m.contains("interface")),
        "{err}"
    );
    assert_eq!(e.short_context(), None);
    let good = lowered(32);
    e.attach_short(good.program, &good.weights, &registry(), 8)
        .unwrap();
    assert_eq!(e.short_context(), Some(8));
}

#[test]
fn the_short_schedule_takes_one_split_a_kv_head() {
    let short = short_context_schedule(&tuned_schedule()).unwrap();
    assert_eq!(short.tile("attention", "split_kv"), Some(1));
    assert_eq!(
        short.tile("attention", "split_chunk"),
        tuned_schedule().tile("attention", "split_chunk")
    );
    assert_eq!(short.fusion_grouping, tuned_schedule().fusion_grouping);
    // A schedule that does not split the attention has no short-context program, and an
    // engine with it attaches none.
    assert_eq!(short_context_schedule(&ScheduleConfig::default()), None);
    assert_eq!(short_context_schedule(&short), None);
    let opts = EngineOptions {
        schedule: ScheduleConfig::default(),
        target: GpuTarget::by_name("h100").unwrap(),
        dtype: DType::F32,
        max_seq: Some(32),
        stop_slots: 4,
        prefill_rows: None,
        short_context: Some(8),
    };
    let e = lower_and_load(&tiny(), &opts, &CpuBackend::default(), &registry()).unwrap();
    assert_eq!(e.short_context(), None);
}

#[test]
fn the_default_bound_is_for_gpus_only() {
    assert_eq!(default_short_context(false), None);
    assert_eq!(
        default_short_context(true),
        Some(amk_engine::SHORT_CONTEXT_ROWS)
    );
}

/// A backend that records no task times says so: the CPU VM's engine (with its short-context
/// program) answers `false` to `enable_trace`, and its decode programs' traces are empty.
#[test]
fn a_backend_without_task_times_says_so() {
    let mut e = engine(Some(4));
    assert!(e.short_context().is_some());
    assert!(!e.enable_trace(&registry()).unwrap());
    let traces = e.decode_traces().unwrap();
    let roles: Vec<&str> = traces.iter().map(|t| t.role.as_str()).collect();
    assert_eq!(roles, ["decode", "short-context"]);
    assert!(traces.iter().all(|t| t.tasks.is_empty()));
}
