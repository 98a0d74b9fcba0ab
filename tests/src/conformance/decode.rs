//! Decode with the position in device memory (an IO input, or a buffer a task of the launch
//! writes): attention windows the position clips, KV appends at it across steps, split-KV
//! shards it leaves empty.

use super::Ctx;
use super::compare::{F32_TOL, Tol};
use super::formulas::{
    Attn, attention, attention_params, attention_partial, linear, partial_layout,
};
use super::outcome::{CaseResult, Failure};
use super::run::{Inputs, in_vals, set_input};
use super::tiny::{Tiny, check_formula, int};
use amk_core::json::Value;
use amk_core::sim::SplitMix;
use amk_core::{BufferId, BufferKind, CounterId, DType, Opcode, Tensor};

/// A step's position as the IO input `pos` (I32 `[1]`), from `positions` in turn.
fn position_steps(positions: &[usize]) -> impl FnMut(&mut Inputs, &mut SplitMix) + '_ {
    let mut step = 0usize;
    move |ins: &mut Inputs, _: &mut SplitMix| {
        let p = positions[step % positions.len()];
        step += 1;
        set_input(
            ins,
            "pos",
            Tensor::from_i64(DType::I32, &[1], &[p as i64])
                .unwrap_or_else(|_| Tensor::zeros(DType::I32, &[1])),
        );
    }
}

/// Rows of the window `[start, start + len)` at or before position `p`.
fn rows_upto(start: usize, len: usize, p: usize) -> usize {
    (start..start + len).filter(|&j| j <= p).count()
}

/// bf16 attention with the position in device memory, on the CUDA kernel's paths: caches of 48
/// rows (weights, so every step sees the same rows) at positions 3, 40 and 20 (the tiny path,
/// its plan made before the wait; the fast path's four-row batches; the tiny path again). An
/// ATTENTION_TILE and ATTENTION_GEMV tiles over the whole cache read the position input (final
/// before the wait); their twins over rows `[2, 30)` (which the window clips at 40) read a copy
/// of it that a task writes (read after the wait), the GEMV twin with a bias. Every row-loop
/// task is a one-pass bf16 row, so the CUDA kernel takes its pre path (AMK_ROW_PRE) where the
/// position allows it.
pub(super) fn op_attention_pos_bf16(c: &Ctx<'_>) -> CaseResult {
    const MAX_SEQ: usize = 48;
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 16,
        scale: 0.25,
    };
    let k = a.nh * a.hd;
    let (late_start, late_len) = (2usize, 28usize);
    let mut t = Tiny::new(44);
    let q = t.input("q", DType::BF16, &[4, 16]);
    let pos = t.input("pos", DType::I32, &[1]);
    let pos_dev =
        t.p.new_buffer("pos_dev", BufferKind::ACTIVATION, DType::I32, &[1]);
    let shape = [MAX_SEQ as u64, 2, 16];
    let (kc, kv) = t.weight("kcache", DType::BF16, &shape, -1.0, 1.0);
    let (vc, vv) = t.weight("vcache", DType::BF16, &shape, -1.0, 1.0);
    let (w, wv) = t.weight("w", DType::BF16, &[8, k as u64], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", DType::BF16, &[8], -0.5, 0.5);
    let cp = t.task(Opcode::COPY, &[pos], &[pos_dev], &[], &[]);
    let attn = t.output("attn", DType::F32, &[4, 16]);
    let whole = attention_params(a, 0, MAX_SEQ);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc, pos],
        &[attn],
        &[],
        &whole,
    );
    let attn_late = t.output("attn_late", DType::F32, &[4, 16]);
    let window = attention_params(a, late_start, late_len);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc, pos_dev],
        &[attn_late],
        &[(cp, 1)],
        &window,
    );
    let tile = |params: &[(&'static str, Value)], off: i64, nt: i64| with_tile(params, k, off, nt);
    let y = t.output("y", DType::F32, &[1, 8]);
    let cy = t.counter();
    for (off, nt) in [(0, 4), (4, 4)] {
        let p = tile(&whole, off, nt);
        t.task_on(
            cy,
            Opcode::ATTENTION_GEMV,
            &[q, kc, vc, w, pos],
            &[y],
            &[],
            &p,
        );
    }
    let y_late = t.output("y_late", DType::F32, &[1, 8]);
    t.task(
        Opcode::ATTENTION_GEMV,
        &[q, kc, vc, w, bias, pos_dev],
        &[y_late],
        &[(cp, 1)],
        &tile(&window, 0, 8),
    );
    // bf16 rows: the attention row rounds to bf16 before the products, so one element may
    // round the other way than the formula's; a wrong window moves the outputs far more.
    let tol = Tol {
        rtol: 5e-3,
        atol: 5e-3,
    };
    let positions = [3usize, 40, 20];
    check_formula(c, t, 3, tol, position_steps(&positions), |ins| {
        let p = in_vals(ins, "pos")?[0] as usize;
        let qv = in_vals(ins, "q")?;
        let full = attention(a, &qv, &kv, &vv, 0, p + 1);
        let late = attention(
            a,
            &qv,
            &kv,
            &vv,
            late_start,
            rows_upto(late_start, late_len, p),
        );
        let bf16 = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .map(|&x| amk_core::round_to(DType::BF16, x as f32) as f64)
                .collect()
        };
        Ok(vec![
            ("y", linear(&bf16(&full), &wv, k, None)),
            ("y_late", linear(&bf16(&late), &wv, k, Some(&bv))),
            ("attn", full),
            ("attn_late", late),
        ])
    })
}

/// `params` and a column tile's: `K` = `k`, `N_tile` = `nt`, `n_off` = `off`.
fn with_tile(
    params: &[(&'static str, Value)],
    k: usize,
    off: i64,
    nt: i64,
) -> Vec<(&'static str, Value)> {
    let mut p = params.to_vec();
    p.extend([
        ("K", int(k as i64)),
        ("N_tile", int(nt)),
        ("n_off", int(off)),
    ]);
    p
}

/// What the position-in-device-memory decode cases share: the operands of one decode step
/// over an 8-row cache of 2 KV heads × 8 (`q [4, 8]`, the step's K/V rows, the position as an
/// input and as `pos_dev`, a copy a task of the launch writes), a weight `[6, 32]` and a bias,
/// and the tasks that append the rows (K at `pos`, V at `pos_dev`, after the copy).
struct DecodeStep {
    q: BufferId,
    pos: BufferId,
    pos_dev: BufferId,
    kc: BufferId,
    vc: BufferId,
    w: BufferId,
    bias: BufferId,
    /// The values of `w` and `bias`.
    wv: Vec<f64>,
    bv: Vec<f64>,
    /// The copy's counter, and what a reader of the caches waits for.
    copied: CounterId,
    appended: [(CounterId, i64); 3],
}

/// Rows of the decode cases' caches.
const DECODE_ROWS: usize = 8;

fn decode_step(t: &mut Tiny) -> DecodeStep {
    let q = t.input("q", DType::F32, &[4, 8]);
    let kn = t.input("k_row", DType::F32, &[1, 2, 8]);
    let vn = t.input("v_row", DType::F32, &[1, 16]);
    let pos = t.input("pos", DType::I32, &[1]);
    let pos_dev =
        t.p.new_buffer("pos_dev", BufferKind::ACTIVATION, DType::I32, &[1]);
    let kc = t.kv("kcache", &[DECODE_ROWS as u64, 2, 8]);
    let vc = t.kv("vcache", &[DECODE_ROWS as u64, 2, 8]);
    let (w, wv) = t.weight("w", DType::F32, &[6, 32], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", DType::F32, &[6], -0.5, 0.5);
    let cp = t.task(Opcode::COPY, &[pos], &[pos_dev], &[], &[]);
    let ck = t.task(Opcode::KV_APPEND, &[kn, kc, pos], &[kc], &[], &[]);
    let cv = t.task(
        Opcode::KV_APPEND,
        &[vn, vc, pos_dev],
        &[vc],
        &[(cp, 1)],
        &[],
    );
    DecodeStep {
        q,
        pos,
        pos_dev,
        kc,
        vc,
        w,
        bias,
        wv,
        bv,
        copied: cp,
        appended: [(ck, 1), (cv, 1), (cp, 1)],
    }
}

/// The formula's side of a decode step: writes the step's K/V rows (`k_row`, `v_row` of `ins`)
/// at row `pos` of the mirrored caches `kc`, `vc` (rows of `row` elements); returns `pos`.
fn mirror_append(
    ins: &Inputs,
    kc: &mut [f64],
    vc: &mut [f64],
    row: usize,
) -> Result<usize, Failure> {
    let p = in_vals(ins, "pos")?[0] as usize;
    kc[p * row..(p + 1) * row].copy_from_slice(&in_vals(ins, "k_row")?);
    vc[p * row..(p + 1) * row].copy_from_slice(&in_vals(ins, "v_row")?);
    Ok(p)
}

/// Three decode steps at positions 1, 4 and 7 over caches of 8 rows with the position in
/// device memory: KV_APPEND k reads the position input, KV_APPEND v a copy of it that a task
/// writes (which the CUDA kernel reads after the wait, the input before it); an ATTENTION_TILE
/// over the whole cache and one over rows `[0, 6)` (the window clips the last step); split-KV
/// shards `[0, 3)`, `[3, 6)`, `[6, 8)` that the position leaves empty in the early steps, and
/// their combine; ATTENTION_GEMV tiles without a bias (the input) and with one (the copy). The
/// caches keep earlier steps' rows; rows no step writes stay zero.
pub(super) fn dag_position_decode(c: &Ctx<'_>) -> CaseResult {
    const MAX_SEQ: usize = DECODE_ROWS;
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 8,
        scale: 0.35,
    };
    let (row, k) = (a.nkv * a.hd, a.nh * a.hd);
    let mut t = Tiny::new(26);
    let DecodeStep {
        q,
        pos,
        pos_dev,
        kc,
        vc,
        w,
        bias,
        wv,
        bv,
        appended: kv_waits,
        ..
    } = decode_step(&mut t);
    let ck = kv_waits[0].0;
    let attn = t.output("attn", DType::F32, &[4, 8]);
    let whole = attention_params(a, 0, MAX_SEQ);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc, pos],
        &[attn],
        &kv_waits,
        &whole,
    );
    let attn6 = t.output("attn_window6", DType::F32, &[4, 8]);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc, pos_dev],
        &[attn6],
        &kv_waits,
        &attention_params(a, 0, 6),
    );
    let shards = [(0usize, 3usize), (3, 3), (6, 2)];
    let mut parts = Vec::new();
    let mut waits = Vec::new();
    for (i, &(s0, l)) in shards.iter().enumerate() {
        let part = t.act(&format!("partial{i}"), &[4, 10]);
        let mut params = attention_params(a, s0, l);
        params.push(("flags", int(2)));
        let src = if i == 2 { pos_dev } else { pos };
        let cs = t.task(
            Opcode::ATTENTION_TILE,
            &[q, kc, vc, src],
            &[part],
            &kv_waits,
            &params,
        );
        parts.push(part);
        waits.push((cs, 1));
    }
    let comb = t.output("combined", DType::F32, &[1, 32]);
    t.task(
        Opcode::ATTENTION_COMBINE,
        &parts,
        &[comb],
        &waits,
        &[
            ("head_dim", int(8)),
            ("n_heads", int(4)),
            ("n_kv_heads", int(2)),
        ],
    );
    let shard1 = t.output("shard1", DType::F32, &[4, 10]);
    t.task(Opcode::COPY, &[parts[1]], &[shard1], &[waits[1]], &[]);
    let tile = |off: i64, nt: i64| with_tile(&whole, k, off, nt);
    let proj = t.output("proj", DType::F32, &[1, 6]);
    let cg = t.counter();
    for (off, nt) in [(0, 4), (4, 2)] {
        t.task_on(
            cg,
            Opcode::ATTENTION_GEMV,
            &[q, kc, vc, w, pos],
            &[proj],
            &kv_waits,
            &tile(off, nt),
        );
    }
    let proj_b = t.output("proj_bias", DType::F32, &[1, 6]);
    t.task(
        Opcode::ATTENTION_GEMV,
        &[q, kc, vc, w, bias, pos_dev],
        &[proj_b],
        &kv_waits,
        &tile(0, 6),
    );
    let k_all = t.output("k_all", DType::F32, &[MAX_SEQ as u64, 2, 8]);
    t.task(Opcode::COPY, &[kc], &[k_all], &[(ck, 1)], &[]);
    let kcs = std::cell::RefCell::new(vec![0.0; MAX_SEQ * row]);
    let vcs = std::cell::RefCell::new(vec![0.0; MAX_SEQ * row]);
    let positions = [1usize, 4, 7];
    check_formula(c, t, 3, F32_TOL, position_steps(&positions), |ins| {
        let (mut kcv, mut vcv) = (kcs.borrow_mut(), vcs.borrow_mut());
        let p = mirror_append(ins, &mut kcv, &mut vcv, row)?;
        let qv = in_vals(ins, "q")?;
        let full = attention(a, &qv, &kcv, &vcv, 0, p + 1);
        let s1 = attention_partial(a, &qv, &kcv, &vcv, 3, rows_upto(3, 3, p));
        Ok(vec![
            ("attn", full.clone()),
            (
                "attn_window6",
                attention(a, &qv, &kcv, &vcv, 0, rows_upto(0, 6, p)),
            ),
            ("combined", full.clone()),
            ("shard1", partial_layout(&s1)),
            ("proj", linear(&full, &wv, k, None)),
            ("proj_bias", linear(&full, &wv, k, Some(&bv))),
            ("k_all", kcv.clone()),
        ])
    })
}

/// The split-KV attention of the decode cases' steps: `n_splits` ATTENTION_SPLIT tasks a KV
/// head of 2-row chunks writing `partials` (`[n_kv, n_splits, rep, hd + 2]`), the splits of KV
/// head 0 reading the position input `pos.0`, the others the copy `pos.1` a task writes.
struct SplitStep {
    parts: BufferId,
    /// The split params every reader of the partials takes.
    shape: [(&'static str, Value); 5],
    /// The splits' counter (every split signals it).
    cs: CounterId,
}

fn split_tasks(
    t: &mut Tiny,
    a: Attn,
    n_splits: usize,
    (q, kc, vc): (BufferId, BufferId, BufferId),
    pos: (BufferId, BufferId),
    waits: &[(CounterId, i64)],
) -> SplitStep {
    let rep = a.nh / a.nkv;
    let tile = rep * (a.hd + 2);
    let parts = t.act(
        "partials",
        &[a.nkv as u64, n_splits as u64, rep as u64, (a.hd + 2) as u64],
    );
    let shape = [
        ("head_dim", int(a.hd as i64)),
        ("n_heads", int(a.nh as i64)),
        ("n_kv_heads", int(a.nkv as i64)),
        ("n_splits", int(n_splits as i64)),
        ("chunk", int(2)),
    ];
    let cs = t.counter();
    for i in 0..a.nkv * n_splits {
        let mut pr = shape.to_vec();
        pr.extend([
            ("scale", Value::Float(a.scale)),
            ("N_tile", int(tile as i64)),
            ("n_off", int((i * tile) as i64)),
        ]);
        let src = if i < n_splits { pos.0 } else { pos.1 };
        t.task_on(
            cs,
            Opcode::ATTENTION_SPLIT,
            &[q, kc, vc, src],
            &[parts],
            waits,
            &pr,
        );
    }
    SplitStep { parts, shape, cs }
}

/// A decode step of the split-KV attention (2 KV heads × 3 splits of whole 2-row chunks over
/// an 8-row cache) at positions 1, 4 and 7 (one, three and two active splits): the splits of
/// KV head 0 read the position input (final before the launch), those of KV head 1 a copy a
/// task of the launch writes (read after their wait); COMBINE_GEMV tiles with and without a
/// bias, reading either. Checked against the f64 attention over rows `0..=p` times W.
pub(super) fn dag_split_kv_decode(c: &Ctx<'_>) -> CaseResult {
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 8,
        scale: 0.35,
    };
    let (k, n_splits) = (a.nh * a.hd, 3usize);
    let mut t = Tiny::new(27);
    let DecodeStep {
        q,
        pos,
        pos_dev,
        kc,
        vc,
        w,
        bias,
        wv,
        bv,
        copied: cp,
        appended: waits,
    } = decode_step(&mut t);
    let SplitStep { parts, shape, cs } =
        split_tasks(&mut t, a, n_splits, (q, kc, vc), (pos, pos_dev), &waits);
    let all = (cs, (a.nkv * n_splits) as i64);
    let gemv = |off: i64, nt: i64| with_tile(&shape, k, off, nt);
    let proj = t.output("proj", DType::F32, &[1, 6]);
    let cg = t.counter();
    for (off, nt, src) in [(0, 4, pos), (4, 2, pos_dev)] {
        t.task_on(
            cg,
            Opcode::COMBINE_GEMV,
            &[parts, w, src],
            &[proj],
            &[all],
            &gemv(off, nt),
        );
    }
    let proj_b = t.output("proj_bias", DType::F32, &[1, 6]);
    t.task(
        Opcode::COMBINE_GEMV,
        &[parts, w, bias, pos_dev],
        &[proj_b],
        &[all, (cp, 1)],
        &gemv(0, 6),
    );
    check_full_attention(c, t, a, &[1, 4, 7], |full| {
        vec![
            ("proj", linear(&full, &wv, k, None)),
            ("proj_bias", linear(&full, &wv, k, Some(&bv))),
        ]
    })
}

/// A decode step of the split-KV attention merged by ATTENTION_MERGE tasks: the splits of
/// `dag_split_kv_decode` (inactive ones too), then two merges — heads 0–2 reading the position
/// input, head 3 reading the copy a task writes — into the attention row, then GEMV tiles over
/// it. Checked against the f64 attention over rows `0..=p` (the row) and times W.
pub(super) fn dag_split_kv_merged(c: &Ctx<'_>) -> CaseResult {
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 8,
        scale: 0.35,
    };
    let (k, n_splits) = (a.nh * a.hd, 3usize);
    let mut t = Tiny::new(31);
    let DecodeStep {
        q,
        pos,
        pos_dev,
        kc,
        vc,
        w,
        wv,
        appended: waits,
        ..
    } = decode_step(&mut t);
    let SplitStep { parts, shape, cs } =
        split_tasks(&mut t, a, n_splits, (q, kc, vc), (pos, pos_dev), &waits);
    let attn = t.output("attn", DType::F32, &[1, k as u64]);
    let cm = t.counter();
    for (off, nt, src) in [(0, 24, pos), (24, 8, pos_dev)] {
        let mut pr = shape.to_vec();
        pr.extend([("N_tile", int(nt)), ("n_off", int(off))]);
        t.task_on(
            cm,
            Opcode::ATTENTION_MERGE,
            &[parts, src],
            &[attn],
            &[(cs, (a.nkv * n_splits) as i64)],
            &pr,
        );
    }
    let proj = t.output("proj", DType::F32, &[1, 6]);
    let cg = t.counter();
    for (off, nt) in [(0, 4), (4, 2)] {
        t.task_on(
            cg,
            Opcode::GEMV_TILE,
            &[attn, w],
            &[proj],
            &[(cm, 2)],
            &[
                ("K", int(k as i64)),
                ("N_tile", int(nt)),
                ("n_off", int(off)),
            ],
        );
    }
    check_full_attention(c, t, a, &[1, 4, 7], |full| {
        vec![("proj", linear(&full, &wv, k, None)), ("attn", full)]
    })
}

/// `check_formula` over decode steps at `positions`, with caches of [`DECODE_ROWS`] rows
/// mirrored from each step's appended K/V rows: `outputs` makes the expected values from the
/// whole attention over rows `0..=p`.
fn check_full_attention(
    c: &Ctx<'_>,
    t: Tiny,
    a: Attn,
    positions: &[usize],
    outputs: impl Fn(Vec<f64>) -> Vec<(&'static str, Vec<f64>)>,
) -> CaseResult {
    let row = a.nkv * a.hd;
    let kcs = std::cell::RefCell::new(vec![0.0; DECODE_ROWS * row]);
    let vcs = std::cell::RefCell::new(vec![0.0; DECODE_ROWS * row]);
    let steps = positions.len();
    check_formula(c, t, steps, F32_TOL, position_steps(positions), |ins| {
        let (mut kcv, mut vcv) = (kcs.borrow_mut(), vcs.borrow_mut());
        let p = mirror_append(ins, &mut kcv, &mut vcv, row)?;
        Ok(outputs(attention(
            a,
            &in_vals(ins, "q")?,
            &kcv,
            &vcv,
            0,
            p + 1,
        )))
    })
}

/// One split a KV head, normalised: each KV head's task writes its query heads' rows of the
/// attention (the position read as an input one head, as a buffer a task writes the other),
/// and GEMV tiles project the row.
pub(super) fn dag_split_kv_normalized(c: &Ctx<'_>) -> CaseResult {
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 8,
        scale: 0.35,
    };
    let k = a.nh * a.hd;
    let tile = (a.nh / a.nkv) * a.hd;
    let mut t = Tiny::new(29);
    let DecodeStep {
        q,
        pos,
        pos_dev,
        kc,
        vc,
        w,
        wv,
        appended: waits,
        ..
    } = decode_step(&mut t);
    let attn = t.output("attn", DType::F32, &[1, k as u64]);
    let cs = t.counter();
    for kv_head in 0..a.nkv {
        let pr = [
            ("head_dim", int(a.hd as i64)),
            ("n_heads", int(a.nh as i64)),
            ("n_kv_heads", int(a.nkv as i64)),
            ("n_splits", int(1)),
            ("chunk", int(2)),
            ("scale", Value::Float(a.scale)),
            ("N_tile", int(tile as i64)),
            ("n_off", int((kv_head * tile) as i64)),
            ("flags", int(1)), // op_attention_split::FLAG_NORMALIZED
        ];
        let src = if kv_head == 0 { pos } else { pos_dev };
        t.task_on(
            cs,
            Opcode::ATTENTION_SPLIT,
            &[q, kc, vc, src],
            &[attn],
            &waits,
            &pr,
        );
    }
    let proj = t.output("proj", DType::F32, &[1, 6]);
    let cg = t.counter();
    for (off, nt) in [(0, 4), (4, 2)] {
        t.task_on(
            cg,
            Opcode::GEMV_TILE,
            &[attn, w],
            &[proj],
            &[(cs, a.nkv as i64)],
            &[
                ("K", int(k as i64)),
                ("N_tile", int(nt)),
                ("n_off", int(off)),
            ],
        );
    }
    check_full_attention(c, t, a, &[0, 4, 7], |full| {
        vec![("proj", linear(&full, &wv, k, None)), ("attn", full)]
    })
}

/// ATTENTION_SPLIT at a real model's head size: head_dim 64, 8 query heads over 2 KV heads, bf16
/// q and caches of 64 rows, at positions 33, 40 and 63 — one split a KV head writing
/// normalised rows (its 34, 41 and 64 rows), and two splits of 8-row chunks writing partials
/// (24 and 10 rows; 24 and 17; 32 and 32: both active, so every partial is written). Against the
/// CPU oracle to f32 tolerance. (The other split cases use head_dim 8.)
pub(super) fn op_attention_split_hd64(c: &Ctx<'_>) -> CaseResult {
    split_against_oracle(
        c,
        SplitCase {
            seed: 41,
            nh: 8,
            nkv: 2,
            hd: 64,
            rows: 64,
            q: DType::BF16,
            cache: DType::BF16,
            out: DType::F32,
            splits: 2,
            chunk: 8,
            positions: &[33, 40, 63],
        },
    )
}

/// ATTENTION_SPLIT at the first positions of a decode, where a normalised task has a few to
/// 128 rows (on the device the short path, one warp a query head up to 32 rows and two beyond,
/// from 65 rows two rows a lane): head_dim 128 with 4 query heads a KV head over f16 q and
/// caches at positions 0, 7 and 31 (1, 8 and 32 rows), head_dim 32 with 3 over bf16 at 1, 32
/// and 50 (2, 33 and 51 rows), SmolLM2's grouping (head_dim 64, 3 query heads a KV head) over
/// bf16 writing bf16 rows, as the short-context program does, at 0, 20 and 40 (1, 21 and 41
/// rows) and at 64, 100 and 127 (65, 101 and 128 rows), and the 1B's (head_dim 64, 4 a KV
/// head) at 65 and 127 (66 and 128 rows); beside each, one split of partials a KV head over
/// the same rows. Against the CPU oracle to f32 tolerance (plus an ulp of the output's dtype).
pub(super) fn op_attention_split_short(c: &Ctx<'_>) -> CaseResult {
    split_against_oracle(
        c,
        SplitCase {
            seed: 53,
            nh: 8,
            nkv: 2,
            hd: 128,
            rows: 64,
            q: DType::F16,
            cache: DType::F16,
            out: DType::F32,
            splits: 1,
            chunk: 64,
            positions: &[0, 7, 31],
        },
    )?;
    split_against_oracle(
        c,
        SplitCase {
            seed: 59,
            nh: 6,
            nkv: 2,
            hd: 32,
            rows: 64,
            q: DType::BF16,
            cache: DType::BF16,
            out: DType::F32,
            splits: 1,
            chunk: 64,
            positions: &[1, 32, 50],
        },
    )?;
    split_against_oracle(
        c,
        SplitCase {
            seed: 61,
            nh: 9,
            nkv: 3,
            hd: 64,
            rows: 64,
            q: DType::BF16,
            cache: DType::BF16,
            out: DType::BF16,
            splits: 1,
            chunk: 64,
            positions: &[0, 20, 40],
        },
    )?;
    split_against_oracle(
        c,
        SplitCase {
            seed: 67,
            nh: 9,
            nkv: 3,
            hd: 64,
            rows: 128,
            q: DType::BF16,
            cache: DType::BF16,
            out: DType::BF16,
            splits: 1,
            chunk: 128,
            positions: &[64, 100, 127],
        },
    )?;
    split_against_oracle(
        c,
        SplitCase {
            seed: 71,
            nh: 8,
            nkv: 2,
            hd: 64,
            rows: 128,
            q: DType::BF16,
            cache: DType::BF16,
            out: DType::BF16,
            splits: 1,
            chunk: 128,
            positions: &[65, 127],
        },
    )
}

/// ATTENTION_SPLIT over long splits, where the device runs its rows in many batches and its
/// query heads in more than one pass: head_dim 128, 12 query heads over 2 KV heads (6 a KV
/// head), f32 q over f16 caches of 512 rows at positions 300, 511 and 77 (one split of up to
/// 512 rows a KV head, normalised; three splits of 32-row chunks, partials); and head_dim 64,
/// 9 query heads over 3 KV heads (SmolLM2's grouping), f32 caches of 300 rows at positions
/// 299, 150 and 70 (one split, and five of 16-row chunks). Every split is active at every
/// position (an inactive one writes nothing, which the oracle cannot follow). Against the CPU
/// oracle.
pub(super) fn op_attention_split_long(c: &Ctx<'_>) -> CaseResult {
    split_against_oracle(
        c,
        SplitCase {
            seed: 43,
            nh: 12,
            nkv: 2,
            hd: 128,
            rows: 512,
            q: DType::F32,
            cache: DType::F16,
            out: DType::F32,
            splits: 3,
            chunk: 32,
            positions: &[300, 511, 77],
        },
    )?;
    split_against_oracle(
        c,
        SplitCase {
            seed: 47,
            nh: 9,
            nkv: 3,
            hd: 64,
            rows: 300,
            q: DType::F32,
            cache: DType::F32,
            out: DType::F32,
            splits: 5,
            chunk: 16,
            positions: &[299, 150, 70],
        },
    )
}

/// ATTENTION_SPLIT at head_dim 64 over 16-bit caches of hundreds of rows (on the device the
/// tensor-core path where a kernel holds it, else the direct one): SmolLM2's grouping (9 query
/// heads over 3 KV heads) over bf16 q and caches of 1,100 rows at positions 1,099, 300 and 129
/// (normalised bf16 rows of 1,100, 301 and 130 rows: blocks of 16 rows, the last one partly
/// past the split; three splits of 64-row chunks, partials of up to 384 rows), and the 1B's
/// (8 over 2) over f16 at 511, 200 and 140 (five splits of 16-row chunks: 9 to 112 rows a
/// split). Every split is active at every position. Against the CPU oracle to f32 tolerance
/// (plus an ulp of the output's dtype).
pub(super) fn op_attention_split_hd64_long(c: &Ctx<'_>) -> CaseResult {
    split_against_oracle(
        c,
        SplitCase {
            seed: 73,
            nh: 9,
            nkv: 3,
            hd: 64,
            rows: 1100,
            q: DType::BF16,
            cache: DType::BF16,
            out: DType::BF16,
            splits: 3,
            chunk: 64,
            positions: &[1099, 300, 129],
        },
    )?;
    split_against_oracle(
        c,
        SplitCase {
            seed: 79,
            nh: 8,
            nkv: 2,
            hd: 64,
            rows: 512,
            q: DType::F16,
            cache: DType::F16,
            out: DType::F32,
            splits: 5,
            chunk: 16,
            positions: &[511, 200, 140],
        },
    )
}

/// One program of ATTENTION_SPLIT tasks over one cache (`split_against_oracle`).
struct SplitCase {
    seed: u64,
    nh: usize,
    nkv: usize,
    hd: usize,
    rows: u64,
    q: DType,
    cache: DType,
    /// The normalised rows' dtype (the partials are f32).
    out: DType,
    /// Splits a KV head of the partials' tasks (the normalised tasks take one).
    splits: usize,
    /// The partials' chunk (the normalised tasks' is `rows`).
    chunk: i64,
    positions: &'static [i64],
}

/// A program of one normalised ATTENTION_SPLIT task a KV head (the attention row) and
/// `splits` partial tasks a KV head, run at each position against the CPU oracle to f32
/// tolerance.
fn split_against_oracle(c: &Ctx<'_>, sc: SplitCase) -> CaseResult {
    let SplitCase {
        nh, nkv, hd, rows, ..
    } = sc;
    let rep = nh / nkv;
    let mut t = Tiny::new(sc.seed);
    let q = t.input("q", sc.q, &[(nh * hd) as u64]);
    let kc = t.input("k_cache", sc.cache, &[rows, (nkv * hd) as u64]);
    let vc = t.input("v_cache", sc.cache, &[rows, (nkv * hd) as u64]);
    let pos = t.input("pos", DType::I32, &[1]);
    let rows_out = t.output("attn", sc.out, &[1, (nh * hd) as u64]);
    let parts = t.output(
        "partials",
        DType::F32,
        &[nkv as u64, sc.splits as u64, rep as u64, (hd + 2) as u64],
    );
    let layout = |n_splits: usize, chunk: i64| {
        vec![
            ("head_dim", int(hd as i64)),
            ("n_heads", int(nh as i64)),
            ("n_kv_heads", int(nkv as i64)),
            ("n_splits", int(n_splits as i64)),
            ("chunk", int(chunk)),
            ("scale", Value::Float(1.0 / (hd as f64).sqrt())),
        ]
    };
    let (cn, cp) = (t.counter(), t.counter());
    for g in 0..nkv {
        let mut pr = layout(1, rows as i64);
        let tile = (rep * hd) as i64;
        pr.extend([
            ("N_tile", int(tile)),
            ("n_off", int(g as i64 * tile)),
            ("flags", int(1)),
        ]);
        t.task_on(
            cn,
            Opcode::ATTENTION_SPLIT,
            &[q, kc, vc, pos],
            &[rows_out],
            &[],
            &pr,
        );
    }
    for i in 0..nkv * sc.splits {
        let mut pr = layout(sc.splits, sc.chunk);
        let tile = (rep * (hd + 2)) as i64;
        pr.extend([("N_tile", int(tile)), ("n_off", int(i as i64 * tile))]);
        t.task_on(
            cp,
            Opcode::ATTENTION_SPLIT,
            &[q, kc, vc, pos],
            &[parts],
            &[],
            &pr,
        );
    }
    let Tiny { p, w, mut rng } = t;
    let steps: Vec<Inputs> = sc
        .positions
        .iter()
        .map(|&at| {
            let mut ins = super::run::random_inputs(&p, &mut rng);
            let pos = Tensor::from_i64(DType::I32, &[1], &[at])
                .map_err(|e| super::outcome::fail(format!("suite bug: {e}")))?;
            set_input(&mut ins, "pos", pos);
            Ok(ins)
        })
        .collect::<Result<_, Failure>>()?;
    super::compare::against_oracle(c, &p, &w, &steps, F32_TOL).map(|_| ())
}
