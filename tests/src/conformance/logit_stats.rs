//! LOGIT_STATS on its own: the four words of every slot against the oracle and against the
//! formula, over rows with NaN logits, tied maxima and vocabulary limits that cut a slot.

use super::Ctx;
use super::compare::output;
use super::next_token::{Slots, slot_tasks};
use super::outcome::{CaseResult, fail};
use super::run::{Inputs, run_steps};
use super::tiny::Tiny;
use amk_core::testkit::random_nonzero;
use amk_core::{DType, Tensor};

/// One row layout of [`op_logit_stats`].
struct StatsCase {
    dtype: DType,
    v: usize,
    cols: usize,
    /// Slots a task (the last task may have fewer).
    per_task: usize,
}

/// Vocabulary limits of the steps: none, one inside a slot, one past the row.
const LIMITS: [fn(usize) -> i64; 3] = [|_| 0, |v| (v as i64 * 5) / 6 + 3, |v| v as i64 + 10];

/// LOGIT_STATS over: f32 [3000] in slots of 1,024 (a short last slot), bf16 [2051] in slots
/// of 384, three a task (the decode tail's width for a 49,152 vocabulary; a last slot of whole
/// 16-byte vectors and three logits past them), f16 [2000] in slots of 1,032, two a task, and
/// bf16 [13] in slots of 5 (starts not 16-byte aligned: the device's element path). Each
/// step's row holds NaNs (a whole slot of them in one step), a maximum tied at two ids of one
/// slot and one of the limits in [`LIMITS`]. Against the oracle: maximum, first id and count
/// exactly, the sum to 1e-5 relative; against the formula (f64 over the valid ids) likewise.
pub(super) fn op_logit_stats(c: &Ctx<'_>) -> CaseResult {
    let cases = [
        StatsCase {
            dtype: DType::F32,
            v: 3000,
            cols: 1024,
            per_task: 1,
        },
        StatsCase {
            dtype: DType::BF16,
            v: 2051,
            cols: 384,
            per_task: 3,
        },
        StatsCase {
            dtype: DType::F16,
            v: 2000,
            cols: 1032,
            per_task: 2,
        },
        StatsCase {
            dtype: DType::BF16,
            v: 13,
            cols: 5,
            per_task: 1,
        },
    ];
    for (i, s) in cases.iter().enumerate() {
        stats_case(c, 40 + i as u64, s).map_err(|e| {
            fail(format!(
                "{:?} logits [{}], slots of {}: {e}",
                s.dtype, s.v, s.cols
            ))
        })?;
    }
    Ok(())
}

fn stats_case(c: &Ctx<'_>, seed: u64, s: &StatsCase) -> CaseResult {
    let slots = s.v.div_ceil(s.cols);
    let mut t = Tiny::new(seed);
    let logits = t.input("logits", s.dtype, &[s.v as u64]);
    let limits = t.input("limits", DType::I32, &[6]);
    let stats = t.output("stats", DType::I32, &[op_logit_stats::ROWS, slots as u64]);
    let layout = Slots {
        cols: s.cols as u64,
        per_task: s.per_task as u64,
    };
    slot_tasks(&mut t, logits, limits, stats, slots as u64, layout);
    let Tiny { p, w, mut rng } = t;
    let mut steps: Vec<Inputs> = Vec::new();
    for (k, limit) in LIMITS.iter().enumerate() {
        let mut x = random_nonzero(s.dtype, &[s.v as u64], &mut rng, -6.0, 6.0).to_f32_vec();
        for i in (k..s.v).step_by(7) {
            x[i] = f32::NAN;
        }
        if k == 1 {
            // A slot of NaNs only (the first; the row's first id below it stays valid).
            x[..s.cols.min(s.v)].fill(f32::NAN);
        }
        // A maximum tied at two ids of the last slot (a tie the lower id must win).
        let last = (slots - 1) * s.cols;
        let (a, b) = (last + (s.v - last) / 3, s.v - 1);
        x[a] = 7.5;
        x[b] = 7.5;
        let x = Tensor::from_f32(s.dtype, &[s.v as u64], &x)
            .map_err(|e| fail(format!("suite bug: {e}")))?;
        let lim = Tensor::from_i64(DType::I32, &[6], &[0, 0, 0, 0, 0, limit(s.v)])
            .map_err(|e| fail(format!("suite bug: {e}")))?;
        steps.push(vec![("logits".to_string(), x), ("limits".to_string(), lim)]);
    }
    let want = run_steps(&c.oracle, &c.registry, &p, &w, &steps)
        .map_err(|e| fail(format!("oracle: {e}")))?;
    let got = run_steps(c.backend, &c.registry, &p, &w, &steps)?;
    for (k, ins) in steps.iter().enumerate() {
        let g = output(&got[k], "stats", k)?;
        let o = output(&want[k], "stats", k)?;
        let x = ins[0].1.to_f32_vec();
        let vp = op_logit_stats::effective_vocab(s.v, ins[1].1.get_i64(5));
        for slot in 0..slots {
            let ids = op_logit_stats::slot_ids(slot, s.cols, vp);
            let words =
                |t: &Tensor| -> [i64; 4] { std::array::from_fn(|r| t.get_i64(r * slots + slot)) };
            let (gw, ow) = (words(g), words(o));
            let fw = formula(&x[ids.clone()], ids.start);
            for (who, w) in [("the oracle", ow), ("the formula", fw)] {
                if let Some(why) = differ(gw, w) {
                    return Err(fail(format!(
                        "step {k} (limit {vp}), slot {slot}: {why} against {who}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// A slot's words from its logits (ids from `offset`) in f64: the first largest non-NaN logit,
/// its id, `Σ exp(l − max)` over the non-NaN ones (0 when there is none), their count.
fn formula(x: &[f32], offset: usize) -> [i64; 4] {
    let valid = || x.iter().enumerate().filter(|(_, l)| !l.is_nan());
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in valid() {
        if best.is_none_or(|(_, m)| l > m) {
            best = Some((i, l));
        }
    }
    let Some((i, m)) = best else {
        return [f32::NEG_INFINITY.to_bits() as i32 as i64, -1, 0, 0];
    };
    let sum: f64 = valid().map(|(_, &l)| (l as f64 - m as f64).exp()).sum();
    [
        m.to_bits() as i32 as i64,
        (offset + i) as i64,
        (sum as f32).to_bits() as i32 as i64,
        valid().count() as i64,
    ]
}

/// Why two slots' words differ: the maximum, first id and count must be equal, the sums within
/// 1e-5 relative.
fn differ(got: [i64; 4], want: [i64; 4]) -> Option<String> {
    let f = |w: i64| f32::from_bits(w as i32 as u32);
    let names = ["maximum", "first id", "sum", "count"];
    for r in [0, 1, 3] {
        if got[r] != want[r] {
            let show = |w: i64| {
                if r == 0 {
                    format!("{}", f(w))
                } else {
                    w.to_string()
                }
            };
            return Some(format!(
                "{} {}, want {}",
                names[r],
                show(got[r]),
                show(want[r])
            ));
        }
    }
    let (gs, ws) = (f(got[2]) as f64, f(want[2]) as f64);
    ((gs - ws).abs() > 1e-5 * ws.abs().max(1.0)).then(|| format!("sum {gs}, want {ws}"))
}
