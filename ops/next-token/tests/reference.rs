//! NEXT_TOKEN's CPU reference, called as a backend calls it (`pos` passed in place as
//! `Input::InPlace(0)` and handed over as output 0; the other outputs poisoned), against a
//! naive model of the op written here: the keys straight from their formula, the top-k / top-p
//! thresholds by bisection over the threshold value (the reference sorts), the Gumbel noise from
//! its own SplitMix64, the log-probability in f64. Also: greedy ties and NaNs, teacher forcing,
//! halting, the vocabulary limit, top-k = 1 and a tiny top-p as greedy, sampled frequencies
//! against the softmax (chi-square), seeds, every error path (nothing written) and the
//! validator's shape rule.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Map;
use amk_core::testkit::{rng, task};
use amk_core::{
    BufferKind, CpuCall, DType, ErrorKind, Input, OpError, Opcode, Program, Registry, Tensor,
    validate,
};
use op_next_token::reference::run;
use rstest::rstest;

// ---- the naive model ---------------------------------------------------------------------------

/// Sampling settings of one call, as the test writes them into `limits` / `sampling`.
#[derive(Debug, Clone, Copy)]
struct Setup {
    temperature: f32,
    top_k: i64,
    top_p: f32,
    seed: u64,
    limit: i64,
}

const GREEDY: Setup = Setup {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    seed: 0,
    limit: 0,
};

fn sampled(temperature: f32, top_k: i64, top_p: f32) -> Setup {
    Setup {
        temperature,
        top_k,
        top_p,
        seed: 0x0123_4567_89AB_CDEF,
        limit: 0,
    }
}

/// SplitMix64's output function, written out.
fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

/// The Gumbel noise of id `i` at position `q`: the top 23 bits of the hash, centred, in f32.
fn gumbel(seed: u64, q: u64, i: u64) -> f32 {
    let r = splitmix(splitmix(seed ^ q.wrapping_mul(0x9E3779B97F4A7C15)) ^ i);
    let u = (((r >> 41) as f64 + 0.5) / 2f64.powi(23)) as f32;
    -(-u.ln()).ln()
}

/// The largest `t < 2^32` with `f(t) ≥ target`, for a non-increasing `f` with `f(0) ≥ target`
/// (bisection: independent of the reference's sorting and the device's radix select).
fn largest_reaching(f: impl Fn(u64) -> u64, target: u64) -> u64 {
    let (mut lo, mut hi) = (0u64, 1u64 << 32);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if f(mid) >= target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The naive choice: `(token, log-probability in f64)` (NaN when undefined).
fn naive(logits: &[f32], s: &Setup, q: u64) -> (usize, f64) {
    let v = logits.len();
    let vp = if s.limit > 0 {
        (s.limit as usize).min(v)
    } else {
        v
    };
    let valid: Vec<usize> = (0..vp).filter(|&i| !logits[i].is_nan()).collect();
    if valid.is_empty() {
        return (0, f64::NAN);
    }
    let m1 = valid
        .iter()
        .map(|&i| logits[i] as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let greedy = *valid.iter().find(|&&i| logits[i] as f64 == m1).unwrap();
    let t = s.temperature;
    let mut token = greedy;
    if t > 0.0 && t.is_finite() {
        let z: Vec<f32> = (0..vp).map(|i| logits[i] / t).collect();
        let m = valid
            .iter()
            .map(|&i| z[i])
            .fold(f32::NEG_INFINITY, f32::max);
        if m.is_finite() {
            let key = |i: usize| -> u64 {
                let w: f32 = (z[i] - m).exp();
                ((w as f64) * 2f64.powi(32)).floor().min(u32::MAX as f64) as u64
            };
            let keys: Vec<(usize, u64)> = valid.iter().map(|&i| (i, key(i))).collect();
            let count_ge = |t: u64| keys.iter().filter(|e| e.1 >= t).count() as u64;
            let t_k = if s.top_k > 0 && (s.top_k as usize) < keys.len() {
                largest_reaching(count_ge, s.top_k as u64)
            } else {
                0
            };
            let t_p = if s.top_p < 1.0 {
                let mass_ge = |t: u64| -> u64 {
                    keys.iter().filter(|e| e.1 >= t.max(t_k)).map(|e| e.1).sum()
                };
                let target = ((s.top_p as f64 * mass_ge(0) as f64).ceil()).max(1.0) as u64;
                largest_reaching(mass_ge, target)
            } else {
                0
            };
            let floor = t_k.max(t_p).max(1);
            let mut best: Option<(usize, f32)> = None;
            for &(i, k) in &keys {
                if k >= floor {
                    let score = z[i] + gumbel(s.seed, q, i as u64);
                    if best.is_none_or(|(_, b)| score > b) {
                        best = Some((i, score));
                    }
                }
            }
            token = best.unwrap().0;
        }
    }
    if !m1.is_finite() {
        return (token, f64::NAN);
    }
    let sum: f64 = valid.iter().map(|&i| (logits[i] as f64 - m1).exp()).sum();
    (token, logits[token] as f64 - m1 - sum.ln())
}

// ---- calling the op ----------------------------------------------------------------------------

/// One call's operands (outputs are built poisoned, `pos` holding `p`).
#[derive(Clone)]
struct Call {
    logits: Tensor,
    p: i64,
    prompt: Vec<i64>,
    stop: Vec<i64>,
    prompt_len: i64,
    end: i64,
    setup: Setup,
    rows: u64,
}

/// The outputs after a call.
#[derive(Debug, Clone, PartialEq)]
struct Out {
    pos: i64,
    token: i64,
    halt: i64,
    emitted: Vec<i64>,
}

const POISON: i64 = i32::MIN as i64;

impl Call {
    fn new(logits: Tensor, setup: Setup) -> Self {
        Call {
            logits,
            p: 2,
            prompt: vec![11, 12, 13],
            stop: vec![-1],
            prompt_len: 0,
            end: i32::MAX as i64,
            setup,
            rows: 8,
        }
    }

    fn limits(&self) -> Vec<i64> {
        let s = &self.setup;
        vec![
            self.prompt_len,
            self.end,
            s.top_k,
            s.seed as u32 as i32 as i64,
            (s.seed >> 32) as u32 as i32 as i64,
            s.limit,
        ]
    }

    fn inputs(&self) -> [Tensor; 4] {
        let i32s = |v: &[i64]| Tensor::from_i64(DType::I32, &[v.len() as u64], v).unwrap();
        [
            i32s(&self.prompt),
            i32s(&self.stop),
            i32s(&self.limits()),
            Tensor::from_f32(
                DType::F32,
                &[2],
                &[self.setup.temperature, self.setup.top_p],
            )
            .unwrap(),
        ]
    }

    fn outputs(&self) -> [Tensor; 4] {
        [
            Tensor::from_i64(DType::I32, &[1], &[self.p]).unwrap(),
            Tensor::poisoned(DType::I32, &[1]),
            Tensor::poisoned(DType::I32, &[1]),
            Tensor::poisoned(DType::I32, &[self.rows, 2]),
        ]
    }

    /// Runs the op with `pos` in place.
    fn run(&self) -> (Result<(), OpError>, Out) {
        let [prompt, stop, limits, sampling] = self.inputs();
        let mut outs = self.outputs();
        let r = call_in_place(
            &[&self.logits, &prompt, &stop, &limits, &sampling],
            &mut outs,
        );
        (r, read(&outs))
    }

    /// Runs the op with `stats` as input 6.
    fn run_with_stats(&self, stats: &Tensor) -> (Result<(), OpError>, Out) {
        let [prompt, stop, limits, sampling] = self.inputs();
        let mut outs = self.outputs();
        let r = call_with_stats(
            &[&self.logits, &prompt, &stop, &limits, &sampling],
            Some(stats),
            &mut outs,
        );
        (r, read(&outs))
    }

    /// LOGIT_STATS's summaries of the logits in slots of `cols`, under this call's limit (its
    /// own reference, one task a slot).
    fn stats(&self, cols: usize) -> Tensor {
        let v = self.logits.numel();
        let g = v.div_ceil(cols);
        let [_, _, limits, _] = self.inputs();
        let mut out = [Tensor::poisoned(DType::I32, &[4, g as u64])];
        for slot in 0..g {
            let p = [
                ("cols", amk_core::json::Value::Int(cols as i64)),
                ("n_off", amk_core::json::Value::Int(slot as i64)),
                ("N_tile", amk_core::json::Value::Int(1)),
            ];
            amk_core::testkit::call(
                op_logit_stats::reference::run,
                &task(Opcode::LOGIT_STATS, 2, 1, &p),
                &[&self.logits, &limits],
                &mut out,
            )
            .unwrap();
        }
        let [out] = out;
        out
    }

    /// Runs the op and requires success.
    fn ok(&self) -> Out {
        let (r, out) = self.run();
        r.unwrap();
        out
    }

    /// Runs the op and requires an error that wrote nothing.
    fn err(&self) -> OpError {
        let (r, out) = self.run();
        let e = r.unwrap_err();
        assert_eq!(out, read(&self.outputs()), "an erroring call wrote");
        e
    }
}

/// Calls the reference with `[logits, pos (in place), prompt, stop, limits, sampling]`.
fn call_in_place(ins: &[&Tensor; 5], outs: &mut [Tensor]) -> Result<(), OpError> {
    call_with_stats(ins, None, outs)
}

/// [`call_in_place`] with LOGIT_STATS's summaries as input 6 when given.
fn call_with_stats(
    ins: &[&Tensor; 5],
    stats: Option<&Tensor>,
    outs: &mut [Tensor],
) -> Result<(), OpError> {
    let [logits, prompt, stop, limits, sampling] = *ins;
    let mut inputs = vec![
        Input::Tensor(logits),
        Input::InPlace(0),
        Input::Tensor(prompt),
        Input::Tensor(stop),
        Input::Tensor(limits),
        Input::Tensor(sampling),
    ];
    inputs.extend(stats.map(Input::Tensor));
    run(&mut CpuCall {
        task: &task(Opcode::NEXT_TOKEN, inputs.len(), 4, &[]),
        registry: None,
        inputs: &inputs,
        outputs: outs,
    })
}

fn read(outs: &[Tensor]) -> Out {
    let e = &outs[3];
    Out {
        pos: outs[0].get_i64(0),
        token: outs[1].get_i64(0),
        halt: outs[2].get_i64(0),
        emitted: (0..e.numel()).map(|i| e.get_i64(i)).collect(),
    }
}

/// The log-probability a row of `emitted` holds.
fn logprob_of(out: &Out, row: usize) -> f32 {
    f32::from_bits(out.emitted[2 * row + 1] as i32 as u32)
}

fn random_logits(dtype: DType, shape: &[u64], seed: u64, range: f64) -> Tensor {
    let mut r = rng(seed);
    Tensor::random(dtype, shape, &mut r, -range, range)
}

fn f32_logits(v: &[f32]) -> Tensor {
    Tensor::from_f32(DType::F32, &[v.len() as u64], v).unwrap()
}

/// Checks a sampled call's outputs against the naive model: the token, `pos`, `halt` (no stop
/// ids, no end), row `q` of `emitted` and nothing else.
fn check_sampled(c: &Call) -> Out {
    let out = c.ok();
    let q = (c.p + 1) as usize;
    let (want, lp) = naive(&c.logits.to_f32_vec(), &c.setup, q as u64);
    assert_eq!(out.token, want as i64, "token at q = {q} ({:?})", c.setup);
    assert_eq!((out.pos, out.halt), (q as i64, 0));
    for (i, &e) in out.emitted.iter().enumerate() {
        if i / 2 != q {
            assert_eq!(e, POISON, "emitted element {i} was written");
        }
    }
    assert_eq!(out.emitted[2 * q], want as i64);
    let got = logprob_of(&out, q) as f64;
    if lp.is_nan() {
        assert_eq!(logprob_of(&out, q).to_bits(), 0x7FC0_0000);
    } else {
        assert!(
            (got - lp).abs() <= 1e-6 * lp.abs().max(1.0),
            "log-probability {got}, want {lp}"
        );
    }
    out
}

// ---- the choice against the naive model --------------------------------------------------------

#[rstest]
// V = 1: the only token, log-probability 0, whatever the settings.
#[case(&[1], DType::F32, 4.0, GREEDY)]
#[case(&[1, 1], DType::BF16, 4.0, sampled(1.0, 0, 1.0))]
#[case(&[1], DType::F16, 4.0, sampled(0.5, 1, 0.5))]
// V = 7.
#[case(&[7], DType::F32, 4.0, GREEDY)]
#[case(&[1, 7], DType::F32, 2.0, sampled(1.0, 0, 1.0))]
#[case(&[7], DType::F16, 2.0, sampled(0.7, 3, 1.0))]
#[case(&[7], DType::BF16, 2.0, sampled(1.5, 0, 0.6))]
// V = 1000: bf16 rows full of ties (ties at the thresholds are all kept).
#[case(&[1, 1000], DType::BF16, 1.0, GREEDY)]
#[case(&[1000], DType::F32, 8.0, sampled(1.0, 40, 1.0))]
#[case(&[1000], DType::BF16, 6.0, sampled(0.8, 50, 0.95))]
#[case(&[1, 1000], DType::F16, 8.0, sampled(1.3, 0, 0.9))]
#[case(&[1000], DType::F32, 1.0, sampled(2.0, 0, 1.0))]
// V = 49152 (SmolLM2's vocabulary).
#[case(&[1, 49152], DType::F32, 20.0, GREEDY)]
#[case(&[1, 49152], DType::BF16, 12.0, sampled(1.0, 0, 1.0))]
#[case(&[49152], DType::F32, 12.0, sampled(0.7, 50, 0.9))]
#[case(&[1, 49152], DType::F16, 10.0, sampled(1.0, 1000, 1.0))]
#[case(&[1, 49152], DType::BF16, 4.0, sampled(0.6, 0, 0.8))]
fn matches_the_naive_model(
    #[case] shape: &[u64],
    #[case] dtype: DType,
    #[case] range: f64,
    #[case] setup: Setup,
) {
    let seed = shape.iter().product::<u64>() * 31 + dtype as u64;
    let mut c = Call::new(random_logits(dtype, shape, seed, range), setup);
    c.rows = 12;
    let mut tokens = Vec::new();
    for p in 0..11 {
        c.p = p;
        tokens.push(check_sampled(&c).token);
    }
    let v = shape.iter().product::<u64>() as i64;
    assert!(tokens.iter().all(|&t| (0..v).contains(&t)));
}

/// Greedy takes the lowest index of the largest logit, NaN never wins, and a row with no
/// valid id gives 0 with the canonical NaN as its log-probability.
#[rstest]
#[case(&[1.0, 5.0, 2.0, 5.0, 5.0], 1)]
#[case(&[-3.0; 5], 0)]
#[case(&[0.0, -0.0, 0.0, -1.0], 0)] // -0 == 0: a tie
#[case(&[f32::NAN, 1.0, 3.0, 3.0], 2)]
#[case(&[2.0, f32::NAN, 9.0, f32::NAN], 2)]
#[case(&[f32::NAN, f32::NEG_INFINITY, f32::NAN], 1)]
#[case(&[f32::NAN; 4], 0)]
#[case(&[f32::NEG_INFINITY; 3], 0)]
#[case(&[f32::NEG_INFINITY, f32::NAN, f32::INFINITY, f32::INFINITY], 2)]
fn greedy_ties_and_nans(#[case] logits: &[f32], #[case] want: i64) {
    for temperature in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let c = Call::new(
            f32_logits(logits),
            Setup {
                temperature,
                ..GREEDY
            },
        );
        let out = check_sampled(&c);
        assert_eq!(out.token, want);
    }
    // Sampling falls back to greedy when the largest logit is infinite or there is none.
    if !logits.iter().any(|l| l.is_finite()) || logits.contains(&f32::INFINITY) {
        let c = Call::new(f32_logits(logits), sampled(1.0, 0, 1.0));
        assert_eq!(check_sampled(&c).token, want);
    }
}

#[test]
fn undefined_log_probabilities_are_the_canonical_nan() {
    for logits in [
        vec![f32::NAN; 3],
        vec![f32::NEG_INFINITY; 2],
        vec![1.0, f32::INFINITY],
    ] {
        let out = Call::new(f32_logits(&logits), GREEDY).ok();
        assert_eq!(logprob_of(&out, 3).to_bits(), 0x7FC0_0000, "{logits:?}");
    }
    // -inf logits add nothing: log-probabilities of [0, -inf, ln 3] are [-ln 4, -, ln 3 - ln 4].
    let out = Call::new(f32_logits(&[0.0, f32::NEG_INFINITY, 3f32.ln()]), GREEDY).ok();
    assert_eq!(out.token, 2);
    assert!((logprob_of(&out, 3) as f64 - (0.75f64).ln()).abs() < 1e-6);
}

// ---- teacher forcing, halting, positions ------------------------------------------------------

#[test]
fn teacher_forcing_feeds_the_prompt_and_emits_nothing() {
    let logits = random_logits(DType::F32, &[1, 50], 3, 4.0);
    let mut c = Call::new(logits, sampled(1.0, 0, 1.0));
    c.prompt = vec![7, 8, 9, 10, 3];
    c.prompt_len = 5;
    c.stop = vec![9, 3, -1];
    for p in 0..4 {
        c.p = p;
        let out = c.ok();
        // The prompt token, even when it is a stop id (9 at q = 2, 3 at q = 4): no halt.
        assert_eq!(
            out,
            Out {
                pos: p + 1,
                token: c.prompt[(p + 1) as usize],
                halt: 0,
                emitted: vec![POISON; 16],
            }
        );
    }
    // q = P: the first sampled token, emitted at row P.
    c.p = 4;
    let out = c.ok();
    let (want, _) = naive(&c.logits.to_f32_vec(), &c.setup, 5);
    assert_eq!((out.pos, out.token), (5, want as i64));
    assert_eq!(out.emitted[10], want as i64);
    // Tokens from the prompt pass through unchecked (negative, beyond V).
    c.prompt = vec![0, -5, 1 << 20];
    c.prompt_len = 3;
    for (p, want) in [(0, -5), (1, 1 << 20)] {
        c.p = p;
        assert_eq!(c.ok().token, want);
    }
}

#[test]
fn halts_on_a_stop_id_or_at_the_end() {
    // Greedy picks 3 (the largest logit).
    let mut c = Call::new(f32_logits(&[0.0, 1.0, 2.0, 5.0, 1.0]), GREEDY);
    c.stop = vec![-1, 3, -7];
    let out = c.ok();
    assert_eq!((out.token, out.halt), (3, 1));
    // Negative slots never match; other ids do not halt.
    c.stop = vec![-1, 4, -3];
    assert_eq!(c.ok().halt, 0);
    // The end: halt once q + 1 >= E (q = 3 here), whatever the token.
    for (end, halt) in [(5, 0), (4, 1), (3, 1), (-1, 1)] {
        c.end = end;
        assert_eq!(c.ok().halt, halt, "E = {end}");
    }
    // The end also halts while forcing the prompt.
    c.prompt_len = 3;
    c.p = 1;
    c.end = 3;
    assert_eq!((c.ok().token, c.ok().halt), (13, 1));
}

#[test]
fn the_position_advances_in_any_integer_dtype() {
    let logits = f32_logits(&[0.5, 0.25]);
    let c = Call::new(logits.clone(), GREEDY);
    let [prompt, stop, limits, sampling] = c.inputs();
    for dtype in [DType::I32, DType::I8, DType::U8] {
        let mut outs = c.outputs();
        outs[0] = Tensor::from_i64(dtype, &[1, 3], &[4, 70, 80]).unwrap();
        call_in_place(&[&logits, &prompt, &stop, &limits, &sampling], &mut outs).unwrap();
        let pos: Vec<i64> = (0..3).map(|i| outs[0].get_i64(i)).collect();
        assert_eq!(pos, [5, 70, 80], "{dtype}");
        assert_eq!(read(&outs).emitted[10], 0);
    }
}

/// A caller that passes the position as an ordinary input gets it copied into output 0.
#[test]
fn a_separate_position_is_copied_then_advanced() {
    let c = Call::new(f32_logits(&[0.5, 0.25]), GREEDY);
    let [prompt, stop, limits, sampling] = c.inputs();
    let pos = Tensor::from_i64(DType::I32, &[2], &[3, 9]).unwrap();
    let mut outs = c.outputs();
    outs[0] = Tensor::poisoned(DType::I32, &[2]);
    let t = task(Opcode::NEXT_TOKEN, 6, 4, &[]);
    let ins = [&c.logits, &pos, &prompt, &stop, &limits, &sampling];
    amk_core::testkit::call(run, &t, &ins, &mut outs).unwrap();
    assert_eq!((outs[0].get_i64(0), outs[0].get_i64(1)), (4, 9));
    assert_eq!(pos.get_i64(0), 3, "the input is not touched");
    // Different element counts are refused before any write.
    let mut outs = c.outputs();
    amk_core::testkit::call(run, &t, &ins, &mut outs).unwrap_err();
    assert_eq!(read(&outs), read(&c.outputs()));
}

// ---- the vocabulary limit, top-k, top-p --------------------------------------------------------

#[test]
fn ids_beyond_the_vocab_limit_are_never_chosen() {
    // The largest logits sit at ids 6 and 7, beyond a limit of 6.
    let logits = f32_logits(&[0.0, 1.0, 0.5, 2.0, 1.5, 0.25, 9.0, 8.0]);
    for limit in [6, 4, 1] {
        let setup = Setup { limit, ..GREEDY };
        let out = check_sampled(&Call::new(logits.clone(), setup));
        assert!(out.token < limit);
        let mut c = Call::new(
            logits.clone(),
            Setup {
                limit,
                ..sampled(4.0, 0, 1.0)
            },
        );
        c.rows = 300;
        for p in 0..298 {
            c.p = p;
            assert!(check_sampled(&c).token < limit);
        }
    }
    // 0, negative and beyond V: no limit.
    for limit in [0, -3, 8, 1000] {
        let out = check_sampled(&Call::new(logits.clone(), Setup { limit, ..GREEDY }));
        assert_eq!(out.token, 6);
    }
}

/// top-k = 1 and a tiny (or non-positive) top-p keep only the largest key: the token holds
/// the largest logit (the greedy one when that logit is unique, as in random f32 rows).
#[rstest]
#[case(DType::F32, 7)]
#[case(DType::F32, 1000)]
#[case(DType::F32, 49152)]
#[case(DType::BF16, 1000)]
fn top_k_one_and_a_tiny_top_p_are_greedy(#[case] dtype: DType, #[case] v: u64) {
    let logits = random_logits(dtype, &[1, v], v + 5, 6.0);
    let xs = logits.to_f32_vec();
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let unique = xs.iter().filter(|&&l| l == max).count() == 1;
    let greedy = Call::new(logits.clone(), GREEDY).ok().token;
    for setup in [
        sampled(1.0, 1, 1.0),
        sampled(3.0, 1, 0.5),
        sampled(1.0, 0, 1e-9),
        sampled(0.5, 0, 0.0),
        sampled(2.0, 0, -1.0),
    ] {
        let mut c = Call::new(logits.clone(), setup);
        for p in 0..6 {
            c.p = p;
            let t = check_sampled(&c).token;
            assert_eq!(xs[t as usize], max, "{setup:?}");
            if unique {
                assert_eq!(t, greedy, "{setup:?}");
            }
        }
    }
}

/// Sampled frequencies over 20 000 positions (one seed) follow softmax(l / T) restricted to
/// the top-k / top-p set: a chi-square over the kept ids, 3 or fewer degrees of freedom, below
/// 30 (a false alarm about once in a million runs).
#[rstest]
// Plain sampling: p = 0.1, 0.2, 0.3, 0.4.
#[case(1.0, 0, 1.0, &[0.1, 0.2, 0.3, 0.4])]
// T = 2 flattens: p^(1/2), normalised.
#[case(2.0, 0, 1.0, &[0.1f64.sqrt(), 0.2f64.sqrt(), 0.3f64.sqrt(), 0.4f64.sqrt()])]
// top-k = 2 keeps 0.3 and 0.4.
#[case(1.0, 2, 1.0, &[0.0, 0.0, 0.3, 0.4])]
// top-p = 0.5: 0.4 alone is not enough, 0.4 + 0.3 is.
#[case(1.0, 0, 0.5, &[0.0, 0.0, 0.3, 0.4])]
// top-p = 0.8 after top-k = 3: 0.3 + 0.4 is 0.78 of the 0.9 kept, not enough: all three stay.
#[case(1.0, 3, 0.8, &[0.0, 0.2, 0.3, 0.4])]
// top-p = 0.75 after top-k = 3: 0.3 + 0.4 is enough.
#[case(1.0, 3, 0.75, &[0.0, 0.0, 0.3, 0.4])]
fn frequencies_follow_the_softmax(
    #[case] temperature: f32,
    #[case] top_k: i64,
    #[case] top_p: f32,
    #[case] weights: &[f64],
) {
    const DRAWS: usize = 20_000;
    let logits = f32_logits(&[0.1f32.ln(), 0.2f32.ln(), 0.3f32.ln(), 0.4f32.ln()]);
    let mut c = Call::new(logits, sampled(temperature, top_k, top_p));
    c.rows = DRAWS as u64 + 1;
    // One set of outputs for every draw: each position writes its own row of `emitted`.
    let [prompt, stop, limits, sampling] = c.inputs();
    let mut outs = c.outputs();
    for p in 0..DRAWS as i64 {
        outs[0].set_i64(0, p);
        call_in_place(&[&c.logits, &prompt, &stop, &limits, &sampling], &mut outs).unwrap();
        assert_eq!(outs[0].get_i64(0), p + 1);
    }
    let mut counts = [0usize; 4];
    for q in 1..=DRAWS {
        counts[outs[3].get_i64(2 * q) as usize] += 1;
    }
    let total: f64 = weights.iter().sum();
    let mut chi2 = 0.0;
    for (k, &w) in weights.iter().enumerate() {
        let expected = DRAWS as f64 * w / total;
        if w == 0.0 {
            assert_eq!(counts[k], 0, "id {k} is outside the kept set: {counts:?}");
        } else {
            chi2 += (counts[k] as f64 - expected).powi(2) / expected;
        }
    }
    assert!(chi2 < 30.0, "chi-square {chi2:.1}, counts {counts:?}");
}

#[test]
fn the_same_seed_draws_the_same_token_and_seeds_differ() {
    let logits = random_logits(DType::F32, &[1, 1000], 77, 1.0);
    let mut c = Call::new(logits, sampled(1.0, 0, 1.0));
    let mut tokens = std::collections::BTreeSet::new();
    for seed in 0..20u64 {
        c.setup.seed = seed.wrapping_mul(0x1234_5678_9ABC_DEF1);
        let a = c.ok();
        assert_eq!(a, c.ok(), "seed {seed}: same call, same outputs");
        tokens.insert(a.token);
    }
    assert!(
        tokens.len() > 10,
        "20 seeds drew {} distinct tokens",
        tokens.len()
    );
    // The high word of the seed matters too.
    c.setup.seed = 5;
    let lo = c.ok().token;
    let differs = (1..20u64).any(|h| {
        c.setup.seed = 5 | (h << 32);
        c.ok().token != lo
    });
    assert!(differs);
}

// ---- errors: typed, and nothing written --------------------------------------------------------

#[test]
fn data_errors_write_nothing() {
    let logits = random_logits(DType::F32, &[1, 9], 1, 2.0);
    let mut c = Call::new(logits, sampled(1.0, 0, 1.0));
    // p < 0.
    c.p = -1;
    assert!(matches!(
        c.err(),
        OpError::IndexOutOfRange { value: -1, .. }
    ));
    // Forcing beyond the prompt: q = 3 < P = 5 but L = 3.
    c.p = 2;
    c.prompt_len = 5;
    assert!(matches!(
        c.err(),
        OpError::IndexOutOfRange {
            value: 3,
            limit: 3,
            ..
        }
    ));
    // Emitting beyond `emitted`: q = 8 with R = 8.
    c.prompt_len = 0;
    c.p = 7;
    assert!(matches!(
        c.err(),
        OpError::IndexOutOfRange {
            value: 8,
            limit: 8,
            ..
        }
    ));
    // q = R - 1 is fine.
    c.p = 6;
    assert_eq!(c.ok().pos, 7);
    // A position far beyond `emitted` is fine while forcing.
    c.prompt = vec![1; 50];
    c.prompt_len = 50;
    c.p = 40;
    assert_eq!(c.ok().token, 1);
}

/// Operands that break the shape rule: the reference refuses them (typed) before any write,
/// and the validator rejects the same program.
#[rstest]
#[case::integer_logits(0, DType::I32, &[1, 9], false)]
#[case::f8_logits(0, DType::F8E4M3, &[9], false)]
#[case::two_rows(0, DType::F32, &[2, 9], true)]
#[case::float_prompt(2, DType::F32, &[3], false)]
#[case::i8_stop(3, DType::I8, &[1], false)]
#[case::short_limits(4, DType::I32, &[5], true)]
#[case::integer_sampling(5, DType::I32, &[2], false)]
#[case::short_sampling(5, DType::F32, &[1], true)]
#[case::f32_token(7, DType::F32, &[1], false)]
#[case::f32_halt(8, DType::F32, &[1], false)]
#[case::flat_emitted(9, DType::I32, &[16], true)]
#[case::wide_emitted(9, DType::I32, &[8, 3], true)]
#[case::f32_emitted(9, DType::F32, &[8, 2], false)]
#[case::float_pos(1, DType::F32, &[1], false)]
fn bad_operands_are_refused(
    #[case] slot: usize,
    #[case] dtype: DType,
    #[case] shape: &[u64],
    #[case] shape_error: bool,
) {
    let c = Call::new(random_logits(DType::F32, &[1, 9], 4, 2.0), GREEDY);
    let [prompt, stop, limits, sampling] = c.inputs();
    let mut ins = [c.logits.clone(), prompt, stop, limits, sampling];
    let mut outs = c.outputs();
    // Slots: inputs 0, 2..5 (1 is pos, in place as output 0), outputs 1..3 as 7..9.
    let bad = Tensor::zeros(dtype, shape);
    match slot {
        0 => ins[0] = bad,
        1 => outs[0] = bad,
        2..=5 => ins[slot - 1] = bad,
        _ => outs[slot - 6] = bad,
    }
    let before = read(&outs);
    let [a, b, d, e, f] = &ins;
    let r = call_in_place(&[a, b, d, e, f], &mut outs);
    match r {
        Err(OpError::Shape(_)) if shape_error => {}
        Err(OpError::DType(_)) if !shape_error => {}
        other => panic!("slot {slot}: {other:?}"),
    }
    assert_eq!(read(&outs), before, "nothing written");

    // The same operands in a program: the validator's rule says shape_mismatch.
    let mut p = Program::new();
    let names = ["logits", "pos", "prompt", "stop", "limits", "sampling"];
    let mut ids = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let t = match i {
            0 => &ins[0],
            1 => &outs[0],
            _ => &ins[i - 1],
        };
        let kind = if i == 1 {
            BufferKind::KV_CACHE
        } else {
            BufferKind::IO_INPUT
        };
        ids.push(p.new_buffer(*name, kind, t.dtype(), t.shape()));
    }
    let mut out_ids = vec![ids[1]];
    for (j, name) in ["token", "halt", "emitted"].iter().enumerate() {
        let t = &outs[j + 1];
        out_ids.push(p.new_buffer(*name, BufferKind::IO_OUTPUT, t.dtype(), t.shape()));
    }
    let cnt = p.new_counter("c");
    p.push_task(
        Opcode::NEXT_TOKEN,
        &ids,
        &out_ids,
        cnt,
        &[],
        Map::new(),
        "next",
    );
    let r = validate(&p, &Registry::builtin().unwrap());
    assert!(
        r.has(ErrorKind::ShapeMismatch),
        "slot {slot}: {}",
        r.report()
    );
}

#[test]
fn the_validator_accepts_the_decode_layout_and_wants_pos_in_place() {
    let build = |in_place: bool| {
        let mut p = Program::new();
        let logits = p.new_buffer("logits", BufferKind::IO_INPUT, DType::BF16, &[1, 49152]);
        let pos = p.new_buffer("pos", BufferKind::KV_CACHE, DType::I32, &[1]);
        let prompt = p.new_buffer("prompt", BufferKind::IO_INPUT, DType::I32, &[64]);
        let stop = p.new_buffer("stop", BufferKind::IO_INPUT, DType::I32, &[4]);
        let limits = p.new_buffer("limits", BufferKind::IO_INPUT, DType::I32, &[6]);
        let sampling = p.new_buffer("sampling", BufferKind::IO_INPUT, DType::F32, &[2]);
        let pos_out = if in_place {
            pos
        } else {
            p.new_buffer("pos_out", BufferKind::IO_OUTPUT, DType::I32, &[1])
        };
        let token = p.new_buffer("token", BufferKind::IO_OUTPUT, DType::I32, &[1]);
        let halt = p.new_buffer("halt", BufferKind::IO_OUTPUT, DType::I32, &[1]);
        let emitted = p.new_buffer("emitted", BufferKind::IO_OUTPUT, DType::I32, &[512, 2]);
        let c = p.new_counter("c");
        p.push_task(
            Opcode::NEXT_TOKEN,
            &[logits, pos, prompt, stop, limits, sampling],
            &[pos_out, token, halt, emitted],
            c,
            &[],
            Map::new(),
            "next",
        );
        p
    };
    let reg = Registry::builtin().unwrap();
    let r = validate(&build(true), &reg);
    assert!(r.ok(), "{}", r.report());
    let r = validate(&build(false), &reg);
    assert!(r.has(ErrorKind::ShapeMismatch), "{}", r.report());
}

#[test]
fn bad_arity_is_typed() {
    let c = Call::new(f32_logits(&[1.0]), GREEDY);
    let [prompt, stop, limits, sampling] = c.inputs();
    let t = task(Opcode::NEXT_TOKEN, 6, 4, &[]);
    let mut outs = c.outputs();
    let five = [&c.logits, &prompt, &stop, &limits, &sampling];
    assert!(matches!(
        amk_core::testkit::call(run, &t, &five, &mut outs),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    let ins = [
        Input::Tensor(&c.logits),
        Input::InPlace(0),
        Input::Tensor(&prompt),
        Input::Tensor(&stop),
        Input::Tensor(&limits),
        Input::Tensor(&sampling),
    ];
    let mut three = [
        Tensor::from_i64(DType::I32, &[1], &[2]).unwrap(),
        Tensor::poisoned(DType::I32, &[1]),
        Tensor::poisoned(DType::I32, &[1]),
    ];
    let r = run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &ins,
        outputs: &mut three,
    });
    assert!(matches!(
        r,
        Err(OpError::Arity {
            what: "outputs",
            ..
        })
    ));
    // pos in place in another output than 0.
    let mut ins2 = ins;
    ins2[1] = Input::InPlace(1);
    let r = run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &ins2,
        outputs: &mut outs,
    });
    assert!(matches!(r, Err(OpError::Shape(_))));
    assert_eq!(read(&outs), read(&c.outputs()));
}

/// With LOGIT_STATS's summaries as input 6 the op makes the same choice as from the logits
/// alone: the same token, position, halt flag and emitted row, the log-probability within 1e-6
/// relative (its denominator summed by slot); and the naive model agrees.
#[rstest]
#[case(&[1, 49152], DType::BF16, 12.0, GREEDY, 384)]
#[case(&[1, 49152], DType::F32, 20.0, GREEDY, 49152)]
#[case(&[1000], DType::F16, 8.0, GREEDY, 7)]
#[case(&[1000], DType::F32, 8.0, sampled(1.0, 40, 1.0), 96)]
#[case(&[1, 49152], DType::BF16, 4.0, sampled(0.6, 0, 0.8), 400)]
#[case(&[7], DType::F32, 2.0, sampled(0.7, 3, 1.0), 2)]
#[case(&[1000], DType::BF16, 6.0, Setup { limit: 650, ..GREEDY }, 64)]
#[case(&[1000], DType::BF16, 6.0, Setup { limit: 650, ..sampled(0.8, 50, 0.95) }, 64)]
fn stats_give_the_choice_the_logits_give(
    #[case] shape: &[u64],
    #[case] dtype: DType,
    #[case] range: f64,
    #[case] setup: Setup,
    #[case] cols: usize,
) {
    let mut c = Call::new(random_logits(dtype, shape, cols as u64 + 17, range), setup);
    c.rows = 40;
    for p in [2, 9, 30] {
        c.p = p;
        let plain = check_sampled(&c);
        let (r, with) = c.run_with_stats(&c.stats(cols));
        r.unwrap();
        let q = (p + 1) as usize;
        assert_eq!(
            (with.token, with.pos, with.halt),
            (plain.token, plain.pos, plain.halt)
        );
        let (a, b) = (logprob_of(&with, q) as f64, logprob_of(&plain, q) as f64);
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} against {b}");
        let mut rest = with.emitted.clone();
        rest[2 * q + 1] = plain.emitted[2 * q + 1];
        assert_eq!(rest, plain.emitted);
    }
}

/// The stats decide the greedy token: a summary that points elsewhere is followed (the op
/// does not read the row again), and stats of the wrong shape or dtype are refused with
/// nothing written.
#[test]
fn the_stats_are_what_a_greedy_choice_reads() {
    let c = Call::new(f32_logits(&[0.0, 1.0, 9.0, 2.0, 3.0, 4.0]), GREEDY);
    let mut stats = c.stats(2);
    assert_eq!(c.run_with_stats(&stats).1.token, 2);
    // slot 2 claims id 5 holds 50.0
    stats.set_i64(2, 50.0f32.to_bits() as i32 as i64);
    stats.set_i64(3 + 2, 5);
    assert_eq!(c.run_with_stats(&stats).1.token, 5);
    for bad in [
        Tensor::zeros(DType::I32, &[3, 3]),
        Tensor::zeros(DType::F32, &[4, 3]),
        Tensor::zeros(DType::I32, &[12]),
    ] {
        let (r, out) = c.run_with_stats(&bad);
        assert!(
            matches!(r, Err(OpError::Shape(_) | OpError::DType(_))),
            "{r:?}"
        );
        assert_eq!(out, read(&c.outputs()), "nothing written");
    }
}

#[test]
fn registered_with_its_reference_in_place() {
    let reg = Registry::builtin().unwrap();
    let spec = reg.get(Opcode::NEXT_TOKEN).unwrap();
    assert_eq!((spec.name.as_ref(), spec.code.0), ("NEXT_TOKEN", 24));
    assert_eq!(Opcode::NEXT_TOKEN.to_string(), "NEXT_TOKEN");
    let r = reg.reference(Opcode::NEXT_TOKEN).unwrap();
    assert_eq!(r.in_place.as_ref(), &[(1, 0)]);
    let cuda = reg.cuda(Opcode::NEXT_TOKEN).unwrap();
    assert_eq!(cuda.entry, "amk_op_next_token");
    // It waits itself: its checks and the launch's settings come before its wait.
    assert!(cuda.own_wait);
}
