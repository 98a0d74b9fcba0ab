//! The engine on the CPU VM: a request as one loop of passes gives the tokens that one pass at
//! a time gives; stop tokens, cancels, the KV cache's end and sampling seeds behave as the
//! engine promises. The reference is the engine's own teacher-forced logits, one pass per
//! launch (the path the perplexity takes), argmaxed on the host.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use amk_backend_cpu::CpuBackend;
use amk_core::{DType, GpuTarget, ScheduleConfig};
use amk_engine::{
    Alternative, Engine, EngineError, EngineOptions, Finish, Request, Sampling, argmax,
    lower_and_load, top_alternatives,
};
use amk_model_llama::Model;
use amk_model_llama::lower::tuned_schedule;
use rstest::rstest;
use support::{registry, tiny};

fn engine(schedule: ScheduleConfig, max_seq: u64) -> Engine {
    let opts = EngineOptions {
        schedule,
        target: GpuTarget::by_name("h100").unwrap(),
        dtype: DType::F32,
        max_seq: Some(max_seq),
        stop_slots: 4,
        prefill_rows: None,
        short_context: None,
    };
    lower_and_load(&tiny(), &opts, &CpuBackend::default(), &registry()).unwrap()
}

fn request<'a>(prompt: &'a [u32], max_new: usize, stop: &'a [u32]) -> Request<'a> {
    Request::greedy(prompt, max_new, stop)
}

fn ids(e: &mut Engine, req: &Request<'_>) -> (Vec<u32>, Finish) {
    let g = e.generate(req, &mut |_| true).unwrap();
    (g.ids(), g.finish)
}

/// Greedy continuation by teacher forcing: one pass per launch, logits argmaxed on the host.
fn host_greedy(e: &mut Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        seq.push(0); // forced_logits feeds all but the last id
        let mut last = Vec::new();
        e.forced_logits(&seq, &mut |_, l| last = l.to_vec())
            .unwrap();
        *seq.last_mut().unwrap() = argmax(&last);
    }
    seq[prompt.len()..].to_vec()
}

const PROMPT: &[u32] = &[3, 17, 5, 29, 11];

#[rstest]
#[case::reference(ScheduleConfig::default())]
#[case::tuned(tuned_schedule())]
fn one_launch_gives_the_tokens_of_one_pass_per_launch(#[case] schedule: ScheduleConfig) {
    let mut e = engine(schedule, 32);
    let want = host_greedy(&mut e, PROMPT, 12);
    let (got, finish) = ids(&mut e, &request(PROMPT, 12, &[]));
    assert_eq!(got, want);
    assert_eq!(finish, Finish::Length);
    for chunk in [1, 2, 5] {
        let req = Request {
            passes_per_launch: Some(chunk),
            top_logprobs: 0,
            ..request(PROMPT, 12, &[])
        };
        assert_eq!(ids(&mut e, &req).0, want, "{chunk} passes per launch");
    }
}

/// The tail that merges LOGIT_STATS summaries (the tuned schedule's `next_token.stats_slots`)
/// chooses what the tail reading the whole row chooses: the same greedy and seeded tokens, under
/// a vocabulary limit too, with log-probabilities within 1e-6.
#[test]
fn a_tail_merging_summaries_chooses_as_one_reading_the_logits() {
    let plain = {
        let mut s = tuned_schedule();
        s.tiling.retain(|(g, _)| g != "next_token");
        s
    };
    let mut with = engine(tuned_schedule(), 40);
    let mut without = engine(plain, 40);
    let count = |e: &Engine| {
        (e.program().program().tasks.iter())
            .filter(|t| t.op == amk_core::Opcode::LOGIT_STATS)
            .count()
    };
    assert!(count(&with) > 1 && count(&without) == 0);
    let sampled = |seed, vocab_limit| Request {
        sampling: Sampling {
            temperature: 1.3,
            top_p: 0.9,
            top_k: 0,
            seed,
        },
        vocab_limit,
        ..request(PROMPT, 16, &[])
    };
    for req in [
        request(PROMPT, 16, &[]),
        Request {
            vocab_limit: Some(23),
            ..request(PROMPT, 16, &[])
        },
        sampled(5, None),
        sampled(6, Some(17)),
    ] {
        let a = with.generate(&req, &mut |_| true).unwrap();
        let b = without.generate(&req, &mut |_| true).unwrap();
        assert_eq!(a.ids(), b.ids());
        for (x, y) in a.tokens.iter().zip(&b.tokens) {
            let (x, y) = (f64::from(x.logprob), f64::from(y.logprob));
            assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "{x} against {y}");
        }
    }
}

#[test]
fn a_stop_token_ends_generation_at_exactly_that_token() {
    let mut e = engine(ScheduleConfig::default(), 32);
    let full = ids(&mut e, &request(PROMPT, 12, &[])).0;
    // The first token whose id did not appear before it: generation must end there.
    let k = (1..full.len())
        .find(|&i| !full[..i].contains(&full[i]))
        .expect("a fresh token");
    let (got, finish) = ids(&mut e, &request(PROMPT, 12, &[full[k], 39]));
    assert_eq!(got, full[..=k]);
    assert_eq!(finish, Finish::Stop);
    // A stop id among the prompt's tokens does not end the prompt.
    let (got, _) = ids(&mut e, &request(PROMPT, 12, &[PROMPT[2]]));
    assert!(!got.is_empty());
}

#[test]
fn a_cancel_keeps_the_tokens_so_far_and_the_engine_usable() {
    let mut e = engine(ScheduleConfig::default(), 32);
    let full = ids(&mut e, &request(PROMPT, 10, &[])).0;
    let mut seen = 0;
    let g = e
        .generate(&request(PROMPT, 10, &[]), &mut |_| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!(g.finish, Finish::Cancelled);
    assert_eq!(
        g.tokens.len(),
        3,
        "the CPU VM stops after the pass that was running"
    );
    let got = g.ids();
    assert_eq!(got, full[..3]);
    assert_eq!(ids(&mut e, &request(PROMPT, 10, &[])).0, full);
}

#[test]
fn a_full_cache_ends_generation_and_says_so() {
    let mut e = engine(ScheduleConfig::default(), 12);
    let (got, finish) = ids(&mut e, &request(PROMPT, 100, &[]));
    assert_eq!(got.len(), 12 - PROMPT.len());
    assert_eq!(finish, Finish::ContextFull);
}

#[test]
fn greedy_log_probabilities_are_the_models() {
    let mut e = engine(ScheduleConfig::default(), 32);
    let g = e.generate(&request(PROMPT, 4, &[]), &mut |_| true).unwrap();
    let mut seq = PROMPT.to_vec();
    seq.extend(g.ids());
    let mut logits = Vec::new();
    e.forced_logits(&seq, &mut |pos, l| logits.push((pos, l.to_vec())))
        .unwrap();
    for (i, t) in g.tokens.iter().enumerate() {
        let l = &logits[PROMPT.len() - 1 + i].1;
        let want = -amk_engine::nll(l, t.id as usize);
        assert!(
            (f64::from(t.logprob) - want).abs() < 1e-4,
            "token {i}: {} vs {want}",
            t.logprob
        );
    }
}

#[test]
fn a_seed_repeats_its_text_and_other_seeds_differ() {
    let mut e = engine(ScheduleConfig::default(), 40);
    let sample = |e: &mut Engine, seed: u64| {
        let req = Request {
            sampling: Sampling {
                temperature: 1.5,
                top_p: 0.95,
                top_k: 0,
                seed,
            },
            ..request(PROMPT, 16, &[])
        };
        ids(e, &req).0
    };
    let a = sample(&mut e, 1);
    assert_eq!(sample(&mut e, 1), a, "same seed, same tokens");
    let others: Vec<Vec<u32>> = (2..6).map(|s| sample(&mut e, s)).collect();
    assert!(
        others.iter().any(|o| *o != a),
        "four other seeds all gave {a:?}"
    );
    // top-k 1 is greedy whatever the temperature.
    let greedy = ids(&mut e, &request(PROMPT, 16, &[])).0;
    let req = Request {
        sampling: Sampling {
            temperature: 2.0,
            top_p: 1.0,
            top_k: 1,
            seed: 9,
        },
        ..request(PROMPT, 16, &[])
    };
    assert_eq!(ids(&mut e, &req).0, greedy);
}

#[test]
fn a_vocabulary_limit_is_never_exceeded() {
    let mut e = engine(ScheduleConfig::default(), 40);
    let req = Request {
        sampling: Sampling {
            temperature: 3.0,
            top_p: 1.0,
            top_k: 0,
            seed: 4,
        },
        vocab_limit: Some(10),
        ..request(PROMPT, 30, &[])
    };
    let (got, _) = ids(&mut e, &req);
    assert!(got.iter().all(|&t| t < 10), "{got:?}");
}

#[rstest]
#[case::empty_prompt(&[], &[], Sampling::greedy())]
#[case::id_outside_the_vocabulary(&[3, 40], &[], Sampling::greedy())]
#[case::too_many_stop_tokens(&[3], &[1, 2, 3, 4, 5], Sampling::greedy())]
#[case::negative_temperature(&[3], &[], Sampling { temperature: -1.0, ..Sampling::greedy() })]
#[case::top_p_zero(&[3], &[], Sampling { top_p: 0.0, ..Sampling::greedy() })]
fn bad_requests_are_request_errors(
    #[case] prompt: &[u32],
    #[case] stop: &[u32],
    #[case] sampling: Sampling,
) {
    let mut e = engine(ScheduleConfig::default(), 16);
    let req = Request {
        sampling,
        ..request(prompt, 4, stop)
    };
    match e.generate(&req, &mut |_| true) {
        Err(EngineError::Request(msg)) => assert!(!msg.is_empty()),
        other => panic!("expected a request error, got {other:?}"),
    }
    // The engine still serves a good request afterwards.
    assert_eq!(ids(&mut e, &request(PROMPT, 3, &[])).0.len(), 3);
}

#[test]
fn a_prompt_longer_than_the_cache_is_a_context_error() {
    let mut e = engine(ScheduleConfig::default(), 4);
    match e.generate(&request(PROMPT, 1, &[]), &mut |_| true) {
        Err(EngineError::ContextFull { prompt, max_seq }) => {
            assert_eq!((prompt, max_seq), (PROMPT.len(), 4));
        }
        other => panic!("expected ContextFull, got {other:?}"),
    }
}

#[test]
fn a_program_without_a_decode_loop_is_refused_with_the_reason() {
    let lowered = amk_model_llama::lower::lower(
        &tiny(),
        &ScheduleConfig::default(),
        &GpuTarget::by_name("h100").unwrap(),
        &amk_model_llama::lower::LowerOptions::default(),
    )
    .unwrap();
    match Engine::new(
        lowered.program,
        &lowered.weights,
        &CpuBackend::default(),
        &registry(),
    ) {
        Err(EngineError::Interface(msg)) => assert!(msg.contains("step loop"), "{msg}"),
        other => panic!("expected an interface error, got {other:?}"),
    }
}

/// A watched prompt reports its progress launch by launch — every `every` passes, counts that
/// grow to the last prompt token — and gives the same tokens as an unwatched one.
#[test]
fn a_watched_prompt_reports_progress_and_changes_no_token() {
    let mut e = engine(ScheduleConfig::default(), 32);
    let want = ids(&mut e, &request(PROMPT, 6, &[])).0;
    let mut seen: Vec<(u64, u64)> = Vec::new();
    let mut on = |done: u64, total: u64| seen.push((done, total));
    let watch = amk_engine::PromptWatch {
        every: 2,
        on: &mut on,
    };
    let g = e
        .generate_observed(&request(PROMPT, 6, &[]), &mut |_| true, Some(watch))
        .unwrap();
    let got = g.ids();
    assert_eq!(got, want);
    let n = PROMPT.len() as u64;
    let want_seen: Vec<(u64, u64)> = (1..n)
        .filter(|k| k % 2 == 0 || *k == n - 1)
        .map(|k| (k, n))
        .collect();
    assert_eq!(seen, want_seen);
}

fn engine_with_prefill(max_seq: u64, rows: u64) -> Engine {
    let opts = EngineOptions {
        schedule: tuned_schedule(),
        target: GpuTarget::by_name("h100").unwrap(),
        dtype: DType::F32,
        max_seq: Some(max_seq),
        stop_slots: 4,
        prefill_rows: Some(rows),
        short_context: None,
    };
    let e = lower_and_load(&tiny(), &opts, &CpuBackend::default(), &registry()).unwrap();
    assert_eq!(e.prefill_rows(), Some(rows), "{:?}", e.prefill_refused());
    e
}

/// The tiny model's prefill program of 4 rows in f32 with `logits`, for a cache of `max_seq`.
fn tiny_prefill(
    logits: amk_model_llama::lower::prefill::PrefillLogits,
    max_seq: u64,
) -> amk_model_llama::lower::Lowered {
    use amk_model_llama::lower::prefill::{PrefillOptions, lower_prefill};
    let opts = PrefillOptions {
        dtype: DType::F32,
        max_seq,
        rows: 4,
        logits,
    };
    lower_prefill(&tiny(), &GpuTarget::by_name("h100").unwrap(), &opts).unwrap()
}

/// `p` with its buffer `name` renamed away.
fn renamed(p: &amk_core::Program, name: &str) -> amk_core::Program {
    let mut p = p.clone();
    if let Some(b) = p.buffers.iter_mut().find(|b| b.name == name) {
        b.name = format!("{name}_elsewhere");
    }
    p
}

/// A prompt written by the prefill program (whole chunks, a padded last chunk, a remainder
/// past the last chunk that fits the cache) gives the tokens the decode program alone gives:
/// on the CPU VM every op rounds as the decode path, so the caches are the same bit for bit.
#[rstest]
#[case::one_token(&[7], 32, 4)]
#[case::padded_chunk(PROMPT, 32, 4)]
#[case::chunks_and_remainder(&[3, 17, 5, 29, 11, 2, 8, 13, 21, 34, 1, 9, 4, 6, 30, 22, 19, 27, 12, 15, 31, 16, 24, 10, 14, 20, 33], 30, 8)]
fn prefilled_prompts_give_the_decode_paths_tokens(
    #[case] prompt: &[u32],
    #[case] max_seq: u64,
    #[case] rows: u64,
) {
    let want = ids(
        &mut engine(tuned_schedule(), max_seq),
        &request(prompt, 3, &[]),
    );
    let mut e = engine_with_prefill(max_seq, rows);
    let got = ids(&mut e, &request(prompt, 3, &[]));
    assert_eq!(got, want);
    // The engine stays usable: a second request (the caches rewritten from position 0).
    assert_eq!(ids(&mut e, &request(prompt, 3, &[])), want);
    let seeded = Request {
        sampling: Sampling {
            temperature: 0.8,
            top_p: 0.9,
            top_k: 0,
            seed: 5,
        },
        ..request(prompt, 3, &[])
    };
    let a = e.generate(&seeded, &mut |_| true).unwrap().ids();
    let b = engine(tuned_schedule(), max_seq)
        .generate(&seeded, &mut |_| true)
        .unwrap()
        .ids();
    assert_eq!(a, b, "sampling with a seed after a prefilled prompt");
}

/// With every prompt row written by the prefill programs, their logits of the last prompt
/// token choose the first token (no decode pass at the prompt's last position): the same
/// tokens, log-probabilities and finish as the decode path alone, at the edges too — one token
/// asked for, the first token a stop token, a prompt one short of the cache and one filling it.
#[test]
fn the_first_token_from_the_prompt_program_is_the_decode_paths() {
    let tokens = |e: &mut Engine, req: &Request<'_>| {
        let g = e.generate(req, &mut |_| true).unwrap();
        let logprobs: Vec<u32> = g.tokens.iter().map(|t| t.logprob.to_bits()).collect();
        (g.ids(), logprobs, g.finish, g.passes)
    };
    let mut plain = engine(tuned_schedule(), 32);
    let mut pre = engine_with_prefill(32, 4);
    let first = ids(&mut plain, &request(PROMPT, 1, &[])).0[0];
    let long: Vec<u32> = (0..31).map(|i| (i * 7 + 3) % 40).collect();
    let cases = [
        request(PROMPT, 1, &[]),
        request(PROMPT, 6, &[]),
        request(PROMPT, 6, std::slice::from_ref(&first)),
        request(&long, 5, &[]),
        request(&long[..29], 5, &[]),
    ];
    for req in &cases {
        let want = tokens(&mut plain, req);
        assert_eq!(tokens(&mut pre, req), want, "{:?}", req.prompt.len());
    }
    assert_eq!(tokens(&mut pre, &cases[2]).2, Finish::Stop);
    assert_eq!(tokens(&mut pre, &cases[3]).0.len(), 1);
    // A prompt that fills the cache leaves no room for a token.
    let full: Vec<u32> = (0..32).map(|i| i % 40).collect();
    let g = pre
        .generate(&request(&full, 3, &[]), &mut |_| true)
        .unwrap();
    assert!(g.tokens.is_empty());
    assert_eq!(g.finish, Finish::ContextFull);
}

/// A model with attention biases (Qwen2) prefills its prompt too, to the decode path's tokens.
#[test]
fn attention_biases_are_prefilled() {
    let mut c = tiny().config;
    c.attention_bias = true;
    let model = Model::random(c, 7).unwrap();
    let opts = |prefill_rows| EngineOptions {
        schedule: tuned_schedule(),
        target: GpuTarget::by_name("h100").unwrap(),
        dtype: DType::F32,
        max_seq: Some(32),
        stop_slots: 4,
        prefill_rows,
        short_context: None,
    };
    let load =
        |rows| lower_and_load(&model, &opts(rows), &CpuBackend::default(), &registry()).unwrap();
    let mut pre = load(Some(4));
    assert_eq!(pre.prefill_rows(), Some(4), "{:?}", pre.prefill_refused());
    let want = ids(&mut load(None), &request(PROMPT, 3, &[]));
    assert_eq!(ids(&mut pre, &request(PROMPT, 3, &[])), want);
}

/// Teacher-forced logits through the scoring prefill program (whole chunks, then the rest a
/// decode pass a position) equal the decode path's, so the perplexity does too (f32 on the
/// CPU VM: the same roundings, bit for bit).
#[rstest]
#[case::chunks(32, 4)]
#[case::chunks_and_remainder(30, 8)]
fn scoring_through_prefill_equals_the_decode_path(#[case] max_seq: u64, #[case] rows: u64) {
    let text: Vec<u32> = (0..27u32).map(|i| (i * 7 + 3) % 40).collect();
    let logits = |e: &mut Engine| {
        let mut all = Vec::new();
        e.forced_logits(&text, &mut |pos, l| all.push((pos, l.to_vec())))
            .unwrap();
        all
    };
    let mut plain = engine(tuned_schedule(), max_seq);
    let mut pre = engine_with_prefill(max_seq, rows);
    let (want, got) = (logits(&mut plain), logits(&mut pre));
    assert_eq!(got.len(), text.len() - 1);
    assert_eq!(got, want);
    let (a, b) = (
        plain.perplexity(&text).unwrap(),
        pre.perplexity(&text).unwrap(),
    );
    assert_eq!(a.0, b.0);
    assert!((a.1 - b.1).abs() <= 1e-6 * a.1.abs(), "{a:?} vs {b:?}");
    // Generation after scoring starts its sequence anew.
    let req = request(PROMPT, 3, &[]);
    assert_eq!(ids(&mut pre, &req), ids(&mut plain, &req));
    // `score` is the mean of the rows' NLLs — the scorer's TOKEN_NLL values, each an f32
    // rounding of the host's f64 value — with the logits it was asked to keep (a position
    // twice is kept once).
    let mean = want
        .iter()
        .map(|(p, l)| amk_engine::nll(l, text[p + 1] as usize))
        .sum::<f64>()
        / want.len() as f64;
    let s = pre.score(&text, &[20, 3, 20, 25]).unwrap();
    assert_eq!(s.predictions, text.len() - 1);
    assert!(
        (s.mean_nll - mean).abs() <= 1e-6 * mean,
        "{} vs {mean}",
        s.mean_nll
    );
    let kept: Vec<(usize, Vec<f32>)> = [3, 20, 25].map(|p| want[p].clone()).to_vec();
    assert_eq!(s.kept, kept);
}

/// The rows' NLLs on many cores are the one-core values, row for row (bf16 logits too).
#[test]
fn nll_rows_on_every_core_equal_one_core() {
    let (rows, vocab) = (203usize, 97usize);
    let mut rng = amk_core::sim::SplitMix(5);
    for dtype in [DType::F32, DType::BF16] {
        let t = amk_core::Tensor::random(dtype, &[rows as u64, vocab as u64], &mut rng, -8.0, 8.0);
        let targets: Vec<u32> = (0..rows as u32).map(|r| (r * 31) % vocab as u32).collect();
        let all = t.to_f32_vec();
        let want: Vec<f64> = all
            .chunks(vocab)
            .zip(&targets)
            .map(|(row, &g)| amk_engine::nll(row, g as usize))
            .collect();
        assert_eq!(amk_engine::nll_rows(&t, vocab, &targets), want);
    }
}

/// With a short prompt program beside the chunk's (2 and 8 rows), each chunk takes the
/// smallest that holds the rest of the prompt; the tokens are the decode path's, and a
/// program of rows already there replaces it.
#[rstest]
#[case::short(&[7, 3])]
#[case::one_short_chunk(&[7, 3, 9])]
#[case::chunks_then_short(&[3, 17, 5, 29, 11, 2, 8, 13, 21, 34, 1, 9])]
fn prompts_take_the_smallest_program_that_holds_them(#[case] prompt: &[u32]) {
    use amk_model_llama::lower::prefill::{PrefillLogits, PrefillOptions, lower_prefill};
    let want = ids(&mut engine(tuned_schedule(), 32), &request(prompt, 3, &[]));
    let mut e = engine_with_prefill(32, 8);
    for _ in 0..2 {
        let opts = PrefillOptions {
            dtype: DType::F32,
            max_seq: 32,
            rows: 2,
            logits: PrefillLogits::Last,
        };
        let short = lower_prefill(&tiny(), &GpuTarget::by_name("h100").unwrap(), &opts).unwrap();
        e.attach_prefill(short.program, &short.weights, &registry())
            .unwrap();
    }
    assert_eq!(e.prefill_chunk_sizes(), [2, 8]);
    assert_eq!(e.prefill_rows(), Some(8));
    assert_eq!(ids(&mut e, &request(prompt, 3, &[])), want);
}

#[test]
fn a_chunk_of_256_rows_or_more_brings_a_quarter_size_one() {
    assert_eq!(amk_engine::prefill_chunk_sizes(512), [128, 512]);
    assert_eq!(amk_engine::prefill_chunk_sizes(256), [64, 256]);
    assert_eq!(amk_engine::prefill_chunk_sizes(255), [255]);
    assert_eq!(amk_engine::prefill_chunk_sizes(64), [64]);
}

/// A program that is not a prefill program for this engine is refused with a reason: caches
/// of another length, or no chunk inputs at all.
#[test]
fn attach_prefill_checks_the_interface() {
    use amk_engine::EngineError;
    use amk_model_llama::lower::prefill::PrefillLogits;
    let mut e = engine(tuned_schedule(), 32);
    let lowered = |max_seq| tiny_prefill(PrefillLogits::Last, max_seq);
    let other = lowered(16);
    let err = e
        .attach_prefill(other.program, &other.weights, &registry())
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Interface(m) if m.contains("kcache")),
        "{err}"
    );
    let decode = e.program().program().clone();
    let err = e
        .attach_prefill(decode, &other.weights, &registry())
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Interface(m) if m.contains("prefill.ids")),
        "{err}"
    );
    assert_eq!(e.prefill_rows(), None);
    let good = lowered(32);
    e.attach_prefill(good.program, &good.weights, &registry())
        .unwrap();
    assert_eq!(e.prefill_rows(), Some(4));
}

/// A scorer's targets input and NLL output come together or not at all: a scorer whose NLL
/// output was renamed away is refused, naming both; the whole scorer's perplexity (its NLLs
/// from TOKEN_NLL) is the decode path's (host NLLs) to 1e-6.
#[test]
fn a_scorer_has_both_targets_and_nlls_or_neither() {
    use amk_engine::EngineError;
    use amk_model_llama::lower::prefill::{NLL, PrefillLogits, TARGETS};
    let scorer = tiny_prefill(PrefillLogits::Every, 32);
    let half = renamed(&scorer.program, NLL);
    let mut e = engine(tuned_schedule(), 32);
    let err = e
        .attach_prefill(half, &scorer.weights, &registry())
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Interface(m) if m.contains(TARGETS) && m.contains(NLL)),
        "{err}"
    );
    e.attach_prefill(scorer.program, &scorer.weights, &registry())
        .unwrap();
    let text: Vec<u32> = (0..11u32).map(|i| (i * 5 + 1) % 40).collect();
    let mut plain = engine(tuned_schedule(), 32);
    let (a, b) = (
        plain.perplexity(&text).unwrap(),
        e.perplexity(&text).unwrap(),
    );
    assert_eq!(a.0, b.0);
    assert!((a.1 - b.1).abs() <= 1e-6 * a.1, "{a:?} vs {b:?}");
}

/// A prompt program's limits input and summaries output come together or not at all (one
/// renamed away: refused, naming both); without them the engine reads the logits row back and
/// chooses from it, with them from the summaries — the same tokens and log-probabilities, greedy
/// and seeded.
#[test]
fn a_prompt_program_has_both_limits_and_stats_or_neither() {
    use amk_engine::EngineError;
    use amk_model_llama::lower::prefill::{LIMITS, PrefillLogits, STATS};
    let prompt = tiny_prefill(PrefillLogits::Last, 32);
    let mut e = engine(tuned_schedule(), 32);
    let err = e
        .attach_prefill(
            renamed(&prompt.program, STATS),
            &prompt.weights,
            &registry(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Interface(m) if m.contains(LIMITS) && m.contains(STATS)),
        "{err}"
    );
    // Without the stats output the summaries' tasks write a buffer nobody reads: the row
    // comes back and the host summarises it.
    let mut unsummarised = renamed(&renamed(&prompt.program, STATS), LIMITS);
    if let Some(b) = (unsummarised.buffers.iter_mut()).find(|b| b.name.starts_with(LIMITS)) {
        b.kind = amk_core::BufferKind::STATE; // zeros: no vocabulary limit
    }
    let mut row = engine(tuned_schedule(), 32);
    row.attach_prefill(unsummarised, &prompt.weights, &registry())
        .unwrap();
    e.attach_prefill(prompt.program.clone(), &prompt.weights, &registry())
        .unwrap();
    let seeded = Request {
        sampling: Sampling {
            temperature: 0.7,
            top_p: 0.95,
            top_k: 0,
            seed: 11,
        },
        ..request(PROMPT, 4, &[])
    };
    for req in [request(PROMPT, 4, &[]), seeded] {
        let a = e.generate(&req, &mut |_| true).unwrap();
        let b = row.generate(&req, &mut |_| true).unwrap();
        let bits = |g: &amk_engine::Generation| -> Vec<(u32, u32)> {
            g.tokens
                .iter()
                .map(|t| (t.id, t.logprob.to_bits()))
                .collect()
        };
        assert_eq!(bits(&a), bits(&b));
    }
}

/// The tokens `req` generates, each with its alternatives.
fn with_alternatives(e: &mut Engine, req: &Request<'_>) -> (Vec<u32>, Vec<Vec<Alternative>>) {
    let mut alts = Vec::new();
    let g = e
        .generate_with(
            req,
            &mut |_, a| {
                alts.push(a.to_vec());
                true
            },
            None,
        )
        .unwrap();
    (g.ids(), alts)
}

/// The teacher-forced logits that predict each of `generated` after `prompt`.
fn forced_after(e: &mut Engine, prompt: &[u32], generated: &[u32]) -> Vec<Vec<f32>> {
    let mut seq = prompt.to_vec();
    seq.extend(generated);
    let mut forced = Vec::new();
    e.forced_logits(&seq, &mut |pos, l| {
        if pos + 1 >= prompt.len() {
            forced.push(l.to_vec());
        }
    })
    .unwrap();
    assert_eq!(forced.len(), generated.len());
    forced
}

/// Alternatives come from the logits each token was drawn from: greedy tokens lead their own
/// alternatives, which equal the top of the teacher-forced logits at that position; asking
/// for them changes no token; sampled tokens keep their seeded ids and get their own logits'
/// top.
#[rstest]
#[case::reference(ScheduleConfig::default())]
#[case::tuned(tuned_schedule())]
fn alternatives_are_the_top_of_each_tokens_logits(#[case] schedule: ScheduleConfig) {
    let mut e = engine(schedule, 32);
    let plain = ids(&mut e, &request(PROMPT, 8, &[])).0;
    let mut seen: Vec<(u32, f32)> = Vec::new();
    let req = Request {
        top_logprobs: 3,
        ..request(PROMPT, 8, &[])
    };
    let mut alts = Vec::new();
    let g = e
        .generate_with(
            &req,
            &mut |t, a| {
                seen.push((t.id, t.logprob));
                alts.push(a.to_vec());
                true
            },
            None,
        )
        .unwrap();
    assert_eq!(g.ids(), plain);
    let forced = forced_after(&mut e, PROMPT, &plain);
    for (i, ((id, logprob), a)) in seen.iter().zip(&alts).enumerate() {
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].id, *id, "greedy: the token is the most likely");
        assert!((a[0].logprob - logprob).abs() < 1e-5, "{a:?} vs {logprob}");
        assert!(a.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        assert_eq!(a, &top_alternatives(&forced[i], 40, 3));
    }
    // Sampled: the same seed gives the same tokens with and without alternatives, and these
    // are the top two of the logits each token was drawn from (which it need not lead).
    let sampled = Request {
        sampling: Sampling {
            temperature: 0.8,
            top_p: 0.9,
            top_k: 0,
            seed: 3,
        },
        ..request(PROMPT, 8, &[])
    };
    let want = ids(&mut e, &sampled).0;
    let (got, alts) = with_alternatives(
        &mut e,
        &Request {
            top_logprobs: 2,
            ..sampled
        },
    );
    assert_eq!(got, want);
    for (i, l) in forced_after(&mut e, PROMPT, &want).iter().enumerate() {
        assert_eq!(alts[i], top_alternatives(l, 40, 2), "token {i}");
    }
    let too_many = Request {
        top_logprobs: amk_engine::MAX_TOP_LOGPROBS + 1,
        ..request(PROMPT, 2, &[])
    };
    assert!(matches!(
        e.generate(&too_many, &mut |_| true),
        Err(EngineError::Request(_))
    ));
}

#[test]
fn top_alternatives_order_ties_by_id_and_respect_the_limit() {
    let logits = [1.0f32, 3.0, 3.0, -1.0, 9.0];
    let top = top_alternatives(&logits, 4, 3);
    let ids: Vec<u32> = top.iter().map(|a| a.id).collect();
    assert_eq!(ids, vec![1, 2, 0], "id 4 is past the limit; ties by id");
    let lse = (1f64.exp() + 2.0 * 3f64.exp() + (-1f64).exp()).ln();
    assert!((top[0].logprob as f64 - (3.0 - lse)).abs() < 1e-6);
    assert_eq!(top_alternatives(&logits, 5, 0), vec![]);
    assert_eq!(top_alternatives(&logits, 2, 9).len(), 2);
}

/// With the prompt written by the prefill program (the decode loop starts at its last token),
/// the alternatives are still those of each token's own logits; a callback that returns
/// false still cancels.
#[test]
fn alternatives_after_a_prefilled_prompt_and_a_cancel() {
    let mut plain = engine(ScheduleConfig::default(), 32);
    let want = ids(&mut plain, &request(PROMPT, 8, &[])).0;
    let mut e = engine_with_prefill(32, 4);
    let req = Request {
        top_logprobs: 4,
        ..request(PROMPT, 8, &[])
    };
    let (got, alts) = with_alternatives(&mut e, &req);
    assert_eq!(got, want);
    for (i, l) in forced_after(&mut plain, PROMPT, &want).iter().enumerate() {
        assert_eq!(alts[i][0].id, want[i]);
        assert_eq!(alts[i], top_alternatives(l, 40, 4), "token {i}");
    }
    let mut n = 0;
    let g = e
        .generate_with(
            &req,
            &mut |_, a| {
                assert_eq!(a.len(), 4);
                n += 1;
                n < 3
            },
            None,
        )
        .unwrap();
    assert_eq!(g.finish, Finish::Cancelled);
    assert_eq!(g.ids(), want[..3]);
}

/// `engine_programs` lists what `lower_and_load` loads, in its order: the decode loop (the
/// same program), the short-context loop below its bound, and the prompt programs (a chunk's,
/// computing its last row's logits, and its scoring twin computing every row's); a chunk
/// longer than the cache makes no prompt program, in both.
#[rstest]
#[case::prompts(Some(16))]
#[case::chunk_longer_than_the_cache(Some(128))]
#[case::no_prompts(None)]
fn engine_programs_are_the_ones_the_engine_loads(#[case] prefill_rows: Option<u64>) {
    use amk_engine::{ProgramRole, engine_programs};
    use amk_model_llama::lower::prefill::PrefillLogits;
    let opts = EngineOptions {
        schedule: tuned_schedule(),
        target: GpuTarget::by_name("h100").unwrap(),
        dtype: DType::F32,
        max_seq: Some(64),
        stop_slots: 4,
        prefill_rows,
        short_context: Some(16),
    };
    let model = tiny();
    let plan = engine_programs(&model, &opts).unwrap();
    assert!(plan.refused.is_empty(), "{:?}", plan.refused);
    let e = lower_and_load(&model, &opts, &CpuBackend::default(), &registry()).unwrap();
    assert_eq!(e.short_context(), Some(16), "{:?}", e.short_refused());
    let mut want = vec![ProgramRole::Decode, ProgramRole::ShortContext];
    for &rows in &e.prefill_chunk_sizes() {
        want.push(ProgramRole::Prompt {
            rows,
            logits: PrefillLogits::Last,
        });
    }
    if let Some(rows) = e.prefill_rows() {
        want.push(ProgramRole::Prompt {
            rows,
            logits: PrefillLogits::Every,
        });
    }
    let roles: Vec<ProgramRole> = plan.programs.iter().map(|(r, _)| *r).collect();
    assert_eq!(roles, want);
    assert_eq!(&plan.programs[0].1, e.program().program());
    assert_eq!(
        e.prefill_rows().is_some(),
        prefill_rows == Some(16),
        "a 128-row chunk does not fit a 64-row cache"
    );
}
