//! NEXT_TOKEN, the tail of an on-device decode iteration: forcing, greedy, sampling and halts
//! over several steps of one session.

use super::Ctx;
use super::compare::output;
use super::formulas::argmax_rows;
use super::outcome::{CaseResult, fail};
use super::run::{Inputs, in_vals, run_steps, vals};
use super::tiny::{Tiny, int};
use amk_core::testkit::random_nonzero;
use amk_core::{BufferId, BufferKind, CounterId, DType, Opcode, Outputs, Tensor};

/// The settings of one iteration of [`op_next_token`].
#[derive(Clone, Copy)]
struct NtStep {
    p: i64,
    prompt_len: i64,
    end: i64,
    top_k: i64,
    seed: u64,
    limit: i64,
    temperature: f32,
    top_p: f32,
    /// The stop ids hold the greedy token (and, when forcing, the prompt token fed).
    stop_hit: bool,
}

const NT_ROWS: u64 = 16;
/// What `emitted` holds before every step: rows NEXT_TOKEN must not touch keep it.
const NT_UNTOUCHED: i64 = -7;
const NT_PROMPT: [i64; 8] = [3, 17, 42, 5, 9, 1, 2, 0];
const NT_BASE: NtStep = NtStep {
    p: 4,
    prompt_len: 4,
    end: 100,
    top_k: 0,
    seed: 0x5EED_0000_0000_0001,
    limit: 0,
    temperature: 0.0,
    top_p: 1.0,
    stop_hit: false,
};
/// Forcing (a stop id that does not halt) while sampling and while greedy, greedy, plain
/// sampling, top-k + top-p, top-p with a vocabulary limit, greedy onto a stop id, greedy with a
/// vocabulary limit, sampling into the last row of `emitted` at the end, another seed. (With
/// summaries, a greedy step and a sampling one take different device paths.)
const NT_STEPS: [NtStep; 10] = [
    NtStep {
        p: 1,
        temperature: 1.0,
        stop_hit: true,
        ..NT_BASE
    },
    NtStep {
        p: 2,
        stop_hit: true,
        ..NT_BASE
    },
    NT_BASE,
    NtStep {
        p: 5,
        temperature: 1.0,
        ..NT_BASE
    },
    NtStep {
        p: 6,
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        ..NT_BASE
    },
    NtStep {
        p: 7,
        temperature: 1.3,
        top_p: 0.5,
        limit: -2, // V / 2, set per case
        ..NT_BASE
    },
    NtStep {
        p: 8,
        stop_hit: true,
        ..NT_BASE
    },
    NtStep {
        p: 9,
        limit: -2, // V / 2, set per case
        ..NT_BASE
    },
    NtStep {
        p: 14,
        end: 16,
        temperature: 1.0,
        top_k: 5,
        ..NT_BASE
    },
    NtStep {
        p: 10,
        temperature: 0.7,
        top_p: 0.95,
        seed: 0xFEED_FACE_CAFE_BEEF,
        ..NT_BASE
    },
];

/// NEXT_TOKEN, the tail of an on-device decode iteration, over the steps of [`NT_STEPS`] in one
/// session (the position and `emitted` are activations set from IO inputs by COPYs, advanced
/// and written by NEXT_TOKEN, copied out), f32 logits `[1, 300]` and bf16 logits `[2000]`.
/// Against the oracle: tokens, halts and positions exactly, `emitted` exactly except the
/// log-probability words (to 1e-5). Against the formula: the prompt token while forcing (no
/// row emitted, no halt on a stop id), the greedy token and its f64 log-probability, ids below
/// the vocabulary limit, the halts, and no row but q written.
pub(super) fn op_next_token(c: &Ctx<'_>) -> CaseResult {
    next_token_case(c, 26, DType::F32, &[1, 300], None)
        .map_err(|e| fail(format!("f32 logits [1, 300]: {e}")))?;
    next_token_case(c, 27, DType::BF16, &[2000], None)
        .map_err(|e| fail(format!("bf16 logits [2000]: {e}")))
}

/// [`op_next_token`]'s steps with the logits summarised first by LOGIT_STATS tasks (input 6 of
/// NEXT_TOKEN): slots of 40 f32 logits, two a task (the last slot short), and of 64 bf16 logits,
/// one a task; and 13 f16 logits in slots of 5 (starts that are not 16-byte aligned: the
/// element path). Against the oracle and the formula as there.
pub(super) fn op_next_token_stats(c: &Ctx<'_>) -> CaseResult {
    next_token_case(
        c,
        28,
        DType::F32,
        &[1, 300],
        Some(Slots {
            cols: 40,
            per_task: 2,
        }),
    )
    .map_err(|e| fail(format!("f32 logits [1, 300], slots of 40: {e}")))?;
    next_token_case(
        c,
        29,
        DType::BF16,
        &[2000],
        Some(Slots {
            cols: 64,
            per_task: 1,
        }),
    )
    .map_err(|e| fail(format!("bf16 logits [2000], slots of 64: {e}")))?;
    next_token_case(
        c,
        30,
        DType::F16,
        &[13],
        Some(Slots {
            cols: 5,
            per_task: 1,
        }),
    )
    .map_err(|e| fail(format!("f16 logits [13], slots of 5: {e}")))
}

/// How a case's LOGIT_STATS tasks summarise the logits.
#[derive(Clone, Copy)]
pub(super) struct Slots {
    pub(super) cols: u64,
    pub(super) per_task: u64,
}

/// The LOGIT_STATS tasks over `logits` (limits from `limits`), `per_task` slots of `cols`
/// each a task, all on one counter; returns the stats buffer and the wait for them.
fn stats_tasks(
    t: &mut Tiny,
    logits: BufferId,
    limits: BufferId,
    v: u64,
    s: Slots,
) -> (BufferId, (CounterId, i64)) {
    let slots = v.div_ceil(s.cols);
    let stats = t.p.new_buffer(
        "stats",
        BufferKind::ACTIVATION,
        DType::I32,
        &[op_logit_stats::ROWS, slots],
    );
    (stats, slot_tasks(t, logits, limits, stats, slots, s))
}

/// LOGIT_STATS tasks writing the `slots` columns of `stats`, `per_task` slots of `cols` each a
/// task, all on one counter; returns the wait for them.
pub(super) fn slot_tasks(
    t: &mut Tiny,
    logits: BufferId,
    limits: BufferId,
    stats: BufferId,
    slots: u64,
    s: Slots,
) -> (CounterId, i64) {
    let ctr = t.counter();
    let mut tasks = 0;
    for first in (0..slots).step_by(s.per_task as usize) {
        let n = s.per_task.min(slots - first);
        let params = [
            ("cols", int(s.cols as i64)),
            ("n_off", int(first as i64)),
            ("N_tile", int(n as i64)),
        ];
        t.task_on(
            ctr,
            Opcode::LOGIT_STATS,
            &[logits, limits],
            &[stats],
            &[],
            &params,
        );
        tasks += 1;
    }
    (ctr, tasks)
}

fn next_token_case(
    c: &Ctx<'_>,
    seed: u64,
    dtype: DType,
    shape: &[u64],
    slots: Option<Slots>,
) -> CaseResult {
    let v = shape.iter().product::<u64>() as usize;
    let mut t = Tiny::new(seed);
    let logits = t.input("logits", dtype, shape);
    let pos_in = t.input("pos_in", DType::I32, &[1]);
    let prompt = t.input("prompt", DType::I32, &[NT_PROMPT.len() as u64]);
    let stop = t.input("stop", DType::I32, &[3]);
    let limits = t.input("limits", DType::I32, &[6]);
    let sampling = t.input("sampling", DType::F32, &[2]);
    let em_in = t.input("emitted_in", DType::I32, &[NT_ROWS, 2]);
    let pos =
        t.p.new_buffer("pos", BufferKind::ACTIVATION, DType::I32, &[1]);
    let em =
        t.p.new_buffer("em", BufferKind::ACTIVATION, DType::I32, &[NT_ROWS, 2]);
    let token = t.output("token", DType::I32, &[1]);
    let halt = t.output("halt", DType::I32, &[1]);
    let pos_out = t.output("pos_out", DType::I32, &[1]);
    let emitted = t.output("emitted", DType::I32, &[NT_ROWS, 2]);
    let cp = t.task(Opcode::COPY, &[pos_in], &[pos], &[], &[]);
    let ce = t.task(Opcode::COPY, &[em_in], &[em], &[], &[]);
    let mut ins = vec![logits, pos, prompt, stop, limits, sampling];
    let mut waits = vec![(cp, 1), (ce, 1)];
    if let Some(s) = slots {
        let (stats, wait) = stats_tasks(&mut t, logits, limits, v as u64, s);
        ins.push(stats);
        waits.push(wait);
    }
    let cn = t.task(
        Opcode::NEXT_TOKEN,
        &ins,
        &[pos, token, halt, em],
        &waits,
        &[],
    );
    t.task(Opcode::COPY, &[pos], &[pos_out], &[(cn, 1)], &[]);
    t.task(Opcode::COPY, &[em], &[emitted], &[(cn, 1)], &[]);
    let Tiny { p, w, mut rng } = t;

    let i32s = |vals: &[i64]| {
        Tensor::from_i64(DType::I32, &[vals.len() as u64], vals)
            .map_err(|e| fail(format!("suite bug: {e}")))
    };
    let mut steps: Vec<Inputs> = Vec::new();
    for s in &NT_STEPS {
        let x = random_nonzero(dtype, shape, &mut rng, -6.0, 6.0);
        let greedy = argmax_rows(&vals(&x), v)[0] as i64;
        let q = (s.p + 1) as usize;
        let stop_ids = match (s.stop_hit, s.p + 1 < s.prompt_len) {
            (true, true) => [-1, NT_PROMPT[q], -3],
            (true, false) => [-1, greedy, -3],
            (false, _) => [-1, -1, -1],
        };
        let limit = if s.limit < 0 { (v / 2) as i64 } else { s.limit };
        let lim = [
            s.prompt_len,
            s.end,
            s.top_k,
            s.seed as u32 as i32 as i64,
            (s.seed >> 32) as u32 as i32 as i64,
            limit,
        ];
        let em0 = Tensor::from_i64(
            DType::I32,
            &[NT_ROWS, 2],
            &[NT_UNTOUCHED; 2 * NT_ROWS as usize],
        )
        .map_err(|e| fail(format!("suite bug: {e}")))?;
        let smp = Tensor::from_f32(DType::F32, &[2], &[s.temperature, s.top_p])
            .map_err(|e| fail(format!("suite bug: {e}")))?;
        steps.push(vec![
            ("logits".to_string(), x),
            ("pos_in".to_string(), i32s(&[s.p])?),
            ("prompt".to_string(), i32s(&NT_PROMPT)?),
            ("stop".to_string(), i32s(&stop_ids)?),
            ("limits".to_string(), i32s(&lim)?),
            ("sampling".to_string(), smp),
            ("emitted_in".to_string(), em0),
        ]);
    }
    let want = run_steps(&c.oracle, &c.registry, &p, &w, &steps)
        .map_err(|e| fail(format!("oracle: {e}")))?;
    let got = run_steps(c.backend, &c.registry, &p, &w, &steps)?;

    for (k, ((s, ins), (g, o))) in NT_STEPS
        .iter()
        .zip(&steps)
        .zip(got.iter().zip(&want))
        .enumerate()
    {
        let get = |out: &Outputs, name: &str| output(out, name, k).map(vals);
        let (g_tok, g_halt, g_pos, g_em) = (
            get(g, "token")?[0],
            get(g, "halt")?[0],
            get(g, "pos_out")?[0],
            get(g, "emitted")?,
        );
        let (o_tok, o_halt, o_pos, o_em) = (
            get(o, "token")?[0],
            get(o, "halt")?[0],
            get(o, "pos_out")?[0],
            get(o, "emitted")?,
        );
        let q = s.p + 1;
        let forcing = q < s.prompt_len;
        let lp_word = if forcing {
            usize::MAX
        } else {
            2 * q as usize + 1
        };
        let as_f32 = |word: f64| f32::from_bits(word as i64 as i32 as u32);
        // The backend against the oracle.
        if (g_tok, g_halt, g_pos) != (o_tok, o_halt, o_pos) {
            return Err(fail(format!(
                "step {k}: (token, halt, pos) = ({g_tok}, {g_halt}, {g_pos}), the oracle's \
                 ({o_tok}, {o_halt}, {o_pos})"
            )));
        }
        for (i, (&ge, &oe)) in g_em.iter().zip(&o_em).enumerate() {
            let same = if i == lp_word {
                let (gl, ol) = (as_f32(ge) as f64, as_f32(oe) as f64);
                (gl.is_nan() && ol.is_nan()) || (gl - ol).abs() <= 1e-5 * ol.abs().max(1.0)
            } else {
                ge == oe
            };
            if !same {
                return Err(fail(format!(
                    "step {k}: emitted element {i} is {ge}, the oracle's {oe} (q = {q})"
                )));
            }
        }
        // Both against the formula.
        let x = in_vals(ins, "logits")?;
        let stop_ids = in_vals(ins, "stop")?;
        let limit = in_vals(ins, "limits")?[5] as usize;
        let vp = if limit > 0 { limit.min(v) } else { v };
        let mut why = Vec::new();
        if g_pos != q as f64 {
            why.push(format!("pos {g_pos}, want {q}"));
        }
        for (i, &e) in g_em.iter().enumerate() {
            let row_q = !forcing && i / 2 == q as usize;
            if !row_q && e != NT_UNTOUCHED as f64 {
                why.push(format!("emitted element {i} = {e} was written"));
            }
        }
        let want_halt =
            (!forcing && stop_ids.iter().any(|&id| id >= 0.0 && id == g_tok)) || q + 1 >= s.end;
        if g_halt != f64::from(u8::from(want_halt)) {
            why.push(format!("halt {g_halt}, want {want_halt}"));
        }
        if forcing {
            if g_tok != NT_PROMPT[q as usize] as f64 {
                why.push(format!(
                    "forced token {g_tok}, want {}",
                    NT_PROMPT[q as usize]
                ));
            }
        } else {
            if !(0.0..vp as f64).contains(&g_tok) {
                why.push(format!("token {g_tok} outside [0, {vp})"));
            }
            if g_em[2 * q as usize] != g_tok {
                why.push(format!(
                    "emitted token {}, want {g_tok}",
                    g_em[2 * q as usize]
                ));
            }
            // The log-probability at temperature 1 over [0, vp).
            let m = x[..vp].iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + x[..vp].iter().map(|l| (l - m).exp()).sum::<f64>().ln();
            let lp = x[g_tok as usize] - lse;
            let got_lp = as_f32(g_em[2 * q as usize + 1]) as f64;
            if (got_lp - lp).abs() > 1e-5 * lp.abs().max(1.0) {
                why.push(format!("log-probability {got_lp}, want {lp}"));
            }
            if s.temperature == 0.0 {
                let greedy = argmax_rows(&x[..vp], vp)[0];
                if g_tok != greedy {
                    why.push(format!("greedy token {g_tok}, want {greedy}"));
                }
            }
        }
        if !why.is_empty() {
            return Err(fail(format!("step {k} (q = {q}): {}", why.join("; "))));
        }
    }
    Ok(())
}
