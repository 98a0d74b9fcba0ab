//! How NEXT_TOKEN chooses a token from one row of logits: greedy, or a seeded draw from the
//! softmax at a temperature restricted to the top-k / top-p set, with the chosen token's
//! log-probability.
//!
//! Let `V' = min(vocab_limit, V)` when `vocab_limit > 0`, else `V`. The **valid** ids are the
//! `i < V'` whose logit `l_i` (as f32) is not NaN; no other id is ever chosen.
//!
//! **Greedy** (temperature not both `> 0` and finite, i.e. 0, negative, NaN or `+∞`): the
//! lowest index of the largest valid `l_i` (SAMPLE_ARGMAX's rule); 0 when no id is valid.
//!
//! **Sampling** (`T` = temperature `> 0` and finite), all in f32 unless said otherwise:
//! - `z_i = l_i / T`, `m = max z_i` over the valid ids (`= m1 / T`, `m1` the largest valid
//!   logit: division by `T > 0` rounds monotonically). When `m` is not finite (no valid id,
//!   every valid logit `−∞`, a `+∞` logit, or `l / T` overflowing) there is no distribution to
//!   draw from and the choice falls back to greedy.
//! - `w_i = exp(z_i − m)` in (0, 1] (0 for `z_i = −∞`), and the integer **key**
//!   `k_i = min(⌊w_i · 2^32⌋, 2^32 − 1)` (exact: `w_i · 2^32` is exact in f64). The largest
//!   logit has `w = 1`, key `2^32 − 1`. Keys order the ids like their probabilities, in
//!   integers, so the device's thresholds (a radix select over histograms with integer
//!   atomics) are exact and independent of the order threads add in.
//! - **top-k** when `0 < top_k < n_valid`: `t_k` = the `top_k`-th largest key (counting
//!   repeats), `K = {valid i : k_i ≥ t_k}` (every id tied at the threshold stays); else `K` =
//!   every valid id.
//! - **top-p** when `top_p < 1` (a NaN `top_p` is off): `U = Σ_{i∈K} k_i` (u64), `target =
//!   max(1, ⌈top_p · U⌉)` (the product and the ceiling in f64, then u64; `top_p ≤ 0` gives 1),
//!   `t_p` = the largest `t` with `Σ_{i∈K, k_i ≥ t} k_i ≥ target`, and the kept set is
//!   `{i ∈ K : k_i ≥ t_p}`; else the kept set is `K`.
//! - ids with key 0 (probability below `2^-32` of the top one's) are dropped; the kept set
//!   still holds the largest logit.
//! - the draw: `next` = the lowest index of the largest `z_i + g_i` (f32 add) over the kept
//!   ids, `g_i` the Gumbel noise of [`crate::noise`] at `(seed, q, i)`. Gumbel-max: the argmax
//!   of `z_i + g_i` is distributed as `softmax(z)` restricted to the kept set.
//!
//! **Log-probability** of `next`, at temperature 1 over every valid id (whatever the
//! truncation): `l_next − m1 − ln Σ_{valid i} exp(l_i − m1)` (`−∞` logits add 0). The reference
//! computes it in f64 and rounds to f32 (the device computes it in f32). It is NaN (stored as
//! the canonical `0x7FC00000`) when no id is valid or `m1` is infinite.

use crate::noise;
use op_logit_stats::Summary;

/// The settings of one choice, as read from the `limits` and `sampling` inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Sampling temperature; greedy unless `> 0` and finite.
    pub temperature: f32,
    /// Keep the `top_k` largest keys (ties included); off when `≤ 0` or `≥` the valid ids.
    pub top_k: i64,
    /// Keep the smallest head of the distribution holding at least this much of it; off
    /// when `≥ 1` or NaN.
    pub top_p: f32,
    /// The draw's seed.
    pub seed: u64,
    /// Ids at or beyond `min(vocab_limit, V)` are never chosen; `≤ 0`: no limit.
    pub vocab_limit: i64,
}

/// What [`choose`] picked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// The token id.
    pub token: usize,
    /// Its log-probability at temperature 1 over the valid ids (NaN when undefined).
    pub logprob: f32,
}

/// The canonical NaN the op stores for an undefined log-probability (the device writes the
/// same bits).
pub const NAN_BITS: u32 = 0x7FC0_0000;

/// `2^32` as f64: the scale of the keys.
const KEY_SCALE: f64 = 4_294_967_296.0;

pub use op_logit_stats::effective_vocab;

/// The integer key of a scaled logit `z` under the maximum `m`: `min(⌊exp(z − m)·2^32⌋,
/// 2^32 − 1)`, the exponential in f32.
pub fn key(z: f32, m: f32) -> u32 {
    let w = (z - m).exp();
    (w as f64 * KEY_SCALE).floor().min(u32::MAX as f64) as u32
}

/// Chooses the next token from `logits` (already read as f32) at position `q`.
pub fn choose(logits: &[f32], s: &Settings, q: u64) -> Choice {
    let vp = effective_vocab(logits.len(), s.vocab_limit);
    choose_given(logits, s, q, &Summary::of(&logits[..vp], 0))
}

/// [`choose`] with the valid ids' [`Summary`] already known (NEXT_TOKEN's stats input): the
/// greedy token, the maximum, the valid count and the log-probability's denominator come from
/// it; a seeded draw still reads the logits.
pub fn choose_given(logits: &[f32], s: &Settings, q: u64, g: &Summary) -> Choice {
    let Some(first) = g.first else {
        return Choice {
            token: 0,
            logprob: f32::from_bits(NAN_BITS),
        };
    };
    let m1 = g.max;
    let t = s.temperature;
    let (token, l_next) = if t > 0.0 && t.is_finite() && (m1 / t).is_finite() {
        let vp = effective_vocab(logits.len(), s.vocab_limit);
        let valid: Vec<(usize, f32)> = logits[..vp]
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .collect();
        let token = sample(&valid, s, m1 / t, q);
        (token, logits[token])
    } else {
        (first, m1)
    };
    Choice {
        token,
        logprob: logprob(l_next, m1, g.sum_exp),
    }
}

/// `l_next − m1 − ln Σ exp(l_i − m1)` in f64 (the sum given), rounded to f32; canonical NaN
/// when `m1` is infinite.
fn logprob(l_next: f32, m1: f32, sum_exp: f64) -> f32 {
    if !m1.is_finite() {
        return f32::from_bits(NAN_BITS);
    }
    let lp = ((l_next as f64 - m1 as f64) - sum_exp.ln()) as f32;
    if lp.is_nan() {
        f32::from_bits(NAN_BITS)
    } else {
        lp
    }
}

/// The seeded draw over the kept set (`m` = the largest scaled logit, finite).
fn sample(valid: &[(usize, f32)], s: &Settings, m: f32, q: u64) -> usize {
    let t = s.temperature;
    let keyed: Vec<(usize, f32, u32)> = valid
        .iter()
        .map(|&(i, l)| {
            let z = l / t;
            (i, z, key(z, m))
        })
        .collect();
    let t_k = top_k_threshold(keyed.iter().map(|e| e.2), s.top_k);
    let t_p = top_p_threshold(keyed.iter().map(|e| e.2).filter(|&k| k >= t_k), s.top_p);
    let threshold = t_k.max(t_p).max(1);
    let base = noise::position_base(s.seed, q);
    let mut best: Option<(usize, f32)> = None;
    for &(i, z, k) in &keyed {
        if k < threshold {
            continue;
        }
        let score = z + noise::gumbel(base, i as u64);
        if best.is_none_or(|(_, b)| score > b) {
            best = Some((i, score));
        }
    }
    // The largest logit has key 2^32 − 1 ≥ every threshold, so `best` is always set.
    best.map_or(0, |(i, _)| i)
}

/// The `top_k`-th largest of `keys` (repeats counted), or 0 when top-k is off (`top_k ≤ 0`
/// or not fewer than the keys).
fn top_k_threshold(keys: impl Iterator<Item = u32>, top_k: i64) -> u32 {
    let mut keys: Vec<u32> = keys.collect();
    match usize::try_from(top_k) {
        Ok(k) if k > 0 && k < keys.len() => {
            // A selection, not a sort: the engine chooses a first token on the host this way.
            let (_, kth, _) = keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
            *kth
        }
        _ => 0,
    }
}

/// The largest key `t` such that the keys `≥ t` sum to at least `max(1, ⌈top_p · Σ keys⌉)`,
/// or 0 when top-p is off (`top_p ≥ 1` or NaN).
fn top_p_threshold(keys: impl Iterator<Item = u32>, top_p: f32) -> u32 {
    if top_p.is_nan() || top_p >= 1.0 {
        return 0;
    }
    // Keys of 0 add nothing to any mass and come last: only the others are sorted (most of a
    // peaked distribution's keys are 0).
    let mut sorted: Vec<u32> = keys.filter(|&k| k > 0).collect();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = sorted.iter().map(|&k| k as u64).sum();
    let target = top_p_target(top_p, total);
    let mut mass = 0u64;
    for &k in &sorted {
        mass += k as u64;
        if mass >= target {
            return k;
        }
    }
    // Unreachable (target ≤ total); keep every key.
    0
}

/// `max(1, ⌈top_p · total⌉)`, the product and the ceiling in f64 (as the device computes it).
pub fn top_p_target(top_p: f32, total: u64) -> u64 {
    let c = (top_p as f64 * total as f64).ceil();
    if c < 1.0 { 1 } else { c as u64 }
}
