//! Hand-built DAGs: chains, fan-in joins, tiled groups, split-KV attention + combine and
//! in-place KV appends across steps.

use super::Ctx;
use super::compare::{F32_TOL, close, output};
use super::formulas::{
    Attn, attention, attention_partial, gelu, linear, partial_layout, rmsnorm, silu, softmax_rows,
};
use super::outcome::CaseResult;
use super::run::{in_vals, random_inputs, run_steps};
use super::tiny::{Tiny, check_formula, int, no_change, real};
use crate::r#gen;
use amk_core::json::Value;
use amk_core::{BufferId, CounterId, DType, Opcode};

/// Tiles `[x, w(, extra..)] -> out` of widths `widths` (summing to N) on one new counter.
fn gemv_tiles(
    t: &mut Tiny,
    ins: &[BufferId],
    out: BufferId,
    k: i64,
    widths: &[i64],
    waits: &[(CounterId, i64)],
    extra: &[(&str, Value)],
) -> (CounterId, i64) {
    let c = t.counter();
    let mut off = 0;
    for &w in widths {
        let mut pr = vec![("K", int(k)), ("N_tile", int(w)), ("n_off", int(off))];
        pr.extend(extra.iter().cloned());
        t.task_on(c, Opcode::GEMV_TILE, ins, &[out], waits, &pr);
        off += w;
    }
    (c, widths.len() as i64)
}

pub(super) fn dag_chain(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(21);
    let (h, i) = (16u64, 24u64);
    let x = t.input("x", DType::F32, &[1, h]);
    let (nw, nwv) = t.weight("norm", DType::F32, &[h], 0.5, 1.5);
    let (wg, wgv) = t.weight("gate", DType::F32, &[i, h], -0.5, 0.5);
    let (wu, wuv) = t.weight("up", DType::F32, &[i, h], -0.5, 0.5);
    let (wd, wdv) = t.weight("down", DType::F32, &[h, i], -0.5, 0.5);
    let (bd, bdv) = t.weight("down_bias", DType::F32, &[h], -0.5, 0.5);
    let xn = t.act("xn", &[1, h]);
    let g = t.act("g", &[1, i]);
    let u = t.act("u", &[1, i]);
    let a = t.act("a", &[1, i]);
    let d = t.act("d", &[1, h]);
    let y = t.output("y", DType::F32, &[1, h]);
    let probs = t.output("probs", DType::F32, &[1, h]);
    let cn = t.task(
        Opcode::RMSNORM,
        &[x, nw],
        &[xn],
        &[],
        &[("eps", real(1e-6)), ("hidden", int(h as i64))],
    );
    let wg_ = gemv_tiles(&mut t, &[xn, wg], g, h as i64, &[8, 8, 8], &[(cn, 1)], &[]);
    let wu_ = gemv_tiles(&mut t, &[xn, wu], u, h as i64, &[5, 19], &[(cn, 1)], &[]);
    let ca = t.task(Opcode::SILU_MUL, &[g, u], &[a], &[wg_, wu_], &[]);
    let wd_ = gemv_tiles(
        &mut t,
        &[a, wd, bd],
        d,
        i as i64,
        &[3, 6, 7],
        &[(ca, 1)],
        &[],
    );
    let cy = t.task(Opcode::ADD, &[x, d], &[y], &[wd_], &[]);
    t.task(Opcode::SOFTMAX, &[y], &[probs], &[(cy, 1)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        let xn = rmsnorm(&xv, &nwv, 1e-6);
        let g = linear(&xn, &wgv, h as usize, None);
        let u = linear(&xn, &wuv, h as usize, None);
        let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        let d = linear(&a, &wdv, i as usize, Some(&bdv));
        let y: Vec<f64> = xv.iter().zip(&d).map(|(x, d)| x + d).collect();
        Ok(vec![("probs", softmax_rows(&y, h as usize)), ("y", y)])
    })
}

pub(super) fn dag_fan_in(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(22);
    let x = t.input("x", DType::F32, &[2, 4]);
    let parts: Vec<BufferId> = (0..4).map(|k| t.act(&format!("p{k}"), &[2, 4])).collect();
    let y = t.output("sum", DType::F32, &[2, 4]);
    let y2 = t.output("pair", DType::F32, &[2, 4]);
    let cp = t.counter();
    t.task_on(cp, Opcode::COPY, &[x], &[parts[0]], &[], &[]);
    t.task_on(
        cp,
        Opcode::MUL,
        &[x],
        &[parts[1]],
        &[],
        &[("scale", real(2.5))],
    );
    t.task_on(cp, Opcode::GELU, &[x], &[parts[2]], &[], &[]);
    t.task_on(
        cp,
        Opcode::FUSED,
        &[x],
        &[parts[3]],
        &[],
        &[("recipe", r#gen::gelu_scale_recipe())],
    );
    let barrier = t.task(Opcode::NOP, &[], &[], &[(cp, 4)], &[]);
    t.task(Opcode::ALLREDUCE_SHARD, &parts, &[y], &[(barrier, 1)], &[]);
    t.task(Opcode::ADD, &[parts[1], parts[3]], &[y2], &[(cp, 4)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        let p: Vec<[f64; 4]> = xv
            .iter()
            .map(|&v| [v, v * 2.5, gelu(v), gelu(v) * 0.5])
            .collect();
        Ok(vec![
            ("sum", p.iter().map(|q| q.iter().sum()).collect()),
            ("pair", p.iter().map(|q| q[1] + q[3]).collect()),
        ])
    })
}

pub(super) fn dag_tiled_groups(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(23);
    let (k, n) = (16u64, 20u64);
    let x = t.input("x", DType::F32, &[1, k]);
    let (qw, qv) = t.weight("qw", DType::I8, &[n, k], -7.0, 7.0);
    let (sc, sv) = t.weight("scales", DType::F32, &[n, 2], 0.01, 0.1);
    let y = t.output("y", DType::F32, &[1, n]);
    gemv_tiles(
        &mut t,
        &[x, qw, sc],
        y,
        k as i64,
        &[1, 7, 4, 5, 3],
        &[],
        &[("qdtype", int(6)), ("group", int(8))],
    );
    // GEMM over a DEQUANT-produced weight: 2 row tiles x 3 column tiles.
    let (m, n2) = (3u64, 9u64);
    let xm = t.input("xm", DType::F32, &[m, k]);
    let (q2, q2v) = t.weight("q2", DType::I8, &[n2, k], -7.0, 7.0);
    let (s2, s2v) = t.weight("s2", DType::F32, &[n2 * k / 4], 0.01, 0.1);
    let w2 = t.act("w2", &[n2, k]);
    let ym = t.output("ym", DType::F32, &[m, n2]);
    let cd = t.task(
        Opcode::DEQUANT,
        &[q2, s2],
        &[w2],
        &[],
        &[("qdtype", int(6)), ("group", int(4))],
    );
    let cm = t.counter();
    for (r0, rl) in [(0i64, 2i64), (2, 1)] {
        for (c0, cl) in [(0i64, 4i64), (4, 2), (6, 3)] {
            t.task_on(
                cm,
                Opcode::GEMM_TILE,
                &[xm, w2],
                &[ym],
                &[(cd, 1)],
                &[
                    ("K", int(k as i64)),
                    ("N_tile", int(cl)),
                    ("n_off", int(c0)),
                    ("M_tile", int(rl)),
                    ("m_off", int(r0)),
                ],
            );
        }
    }
    let ku = k as usize;
    let deq: Vec<f64> = (0..(n as usize) * ku)
        .map(|i| qv[i] * sv[(i / ku) * 2 + (i % ku) / 8])
        .collect();
    let deq2: Vec<f64> = (0..(n2 as usize) * ku)
        .map(|i| q2v[i] * s2v[i / 4])
        .collect();
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![
            ("y", linear(&in_vals(ins, "x")?, &deq, ku, None)),
            ("ym", linear(&in_vals(ins, "xm")?, &deq2, ku, None)),
        ])
    })
}

pub(super) fn dag_split_kv(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(24);
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 8,
        scale: 0.25,
    };
    let (max_seq, len) = (10u64, 7u64);
    let row = [2u64, 8];
    let q = t.input("q", DType::F32, &[4, 8]);
    let kn = t.input("k_rows", DType::F32, &[len, row[0], row[1]]);
    let vn = t.input("v_rows", DType::F32, &[len, row[0], row[1]]);
    let kc = t.kv("kcache", &[max_seq, row[0], row[1]]);
    let vc = t.kv("vcache", &[max_seq, row[0], row[1]]);
    let start = 1i64;
    let ck = t.task(
        Opcode::KV_APPEND,
        &[kn, kc],
        &[kc],
        &[],
        &[("pos", int(start))],
    );
    let cv = t.task(
        Opcode::KV_APPEND,
        &[vn, vc],
        &[vc],
        &[],
        &[("pos", int(start))],
    );
    let attn_params = |s: i64, l: i64, partial: bool| {
        let mut p = vec![
            ("head_dim", int(8)),
            ("kv_start", int(s)),
            ("kv_len", int(l)),
            ("scale", real(0.25)),
            ("n_heads", int(4)),
            ("n_kv_heads", int(2)),
        ];
        if partial {
            p.push(("flags", int(2)));
        }
        p
    };
    let shards = [(1i64, 3i64), (4, 0), (4, 2), (6, 2)];
    let mut parts = Vec::new();
    let mut waits = Vec::new();
    for (i, &(s, l)) in shards.iter().enumerate() {
        let part = t.act(&format!("partial{i}"), &[4, 10]);
        let cs = t.task(
            Opcode::ATTENTION_TILE,
            &[q, kc, vc],
            &[part],
            &[(ck, 1), (cv, 1)],
            &attn_params(s, l, true),
        );
        parts.push(part);
        waits.push((cs, 1));
    }
    let y = t.output("combined", DType::F32, &[1, 32]);
    let yf = t.output("full", DType::F32, &[4, 8]);
    let p0 = t.output("partial0_out", DType::F32, &[4, 10]);
    t.task(
        Opcode::ATTENTION_COMBINE,
        &parts,
        &[y],
        &waits,
        &[
            ("head_dim", int(8)),
            ("n_heads", int(4)),
            ("n_kv_heads", int(2)),
        ],
    );
    t.task(Opcode::COPY, &[parts[0]], &[p0], &[waits[0]], &[]);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc],
        &[yf],
        &[(ck, 1), (cv, 1)],
        &attn_params(start, len as i64, false),
    );
    let ms = max_seq as usize;
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let rowlen = 16;
        let mut kcv = vec![0.0; ms * rowlen];
        let mut vcv = vec![0.0; ms * rowlen];
        let s = start as usize;
        let l = len as usize;
        kcv[s * rowlen..(s + l) * rowlen].copy_from_slice(&in_vals(ins, "k_rows")?);
        vcv[s * rowlen..(s + l) * rowlen].copy_from_slice(&in_vals(ins, "v_rows")?);
        let qv = in_vals(ins, "q")?;
        let full = attention(a, &qv, &kcv, &vcv, s, l);
        let p0 = partial_layout(&attention_partial(a, &qv, &kcv, &vcv, 1, 3));
        Ok(vec![
            ("combined", full.clone()),
            ("full", full),
            ("partial0_out", p0),
        ])
    })
}

pub(super) fn dag_kv_append_steps(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(25);
    let a = Attn {
        nh: 2,
        nkv: 1,
        hd: 4,
        scale: 0.5,
    };
    let q = t.input("q", DType::F32, &[2, 4]);
    let kn = t.input("k_rows", DType::F32, &[2, 1, 4]);
    let vn = t.input("v_row", DType::F32, &[4]);
    let kc = t.kv("kcache", &[6, 1, 4]);
    let vc = t.kv("vcache", &[6, 1, 4]);
    // Two key rows at 2..4, one value row at 3; rows 0, 1 and 4 of the window stay zero.
    // (One KV_APPEND per cache: the validator refuses two, even ordered ones, because the
    // earlier append reads the cache the later one writes.)
    let ck = t.task(Opcode::KV_APPEND, &[kn, kc], &[kc], &[], &[("pos", int(2))]);
    let cv = t.task(Opcode::KV_APPEND, &[vn, vc], &[vc], &[], &[("pos", int(3))]);
    let y = t.output("attn", DType::F32, &[2, 4]);
    let kout = t.output("kcache_out", DType::F32, &[24]);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc],
        &[y],
        &[(ck, 1), (cv, 1)],
        &[
            ("head_dim", int(4)),
            ("kv_start", int(0)),
            ("kv_len", int(5)),
            ("scale", real(0.5)),
            ("n_heads", int(2)),
            ("n_kv_heads", int(1)),
        ],
    );
    t.task(Opcode::COPY, &[kc], &[kout], &[(ck, 1)], &[]);
    let Tiny { p, w, mut rng } = t;
    let s0 = random_inputs(&p, &mut rng);
    let s1 = random_inputs(&p, &mut rng);
    // Step 2 sets nothing: every input keeps its step-1 value.
    let steps = vec![s0.clone(), s1.clone(), Vec::new()];
    let got = run_steps(c.backend, &c.registry, &p, &w, &steps)?;
    for (k, (o, ins)) in got.iter().zip([&s0, &s1, &s1]).enumerate() {
        let mut kcv = vec![0.0; 24];
        let mut vcv = vec![0.0; 24];
        kcv[8..16].copy_from_slice(&in_vals(ins, "k_rows")?);
        vcv[12..16].copy_from_slice(&in_vals(ins, "v_row")?);
        let want = attention(a, &in_vals(ins, "q")?, &kcv, &vcv, 0, 5);
        close(
            &format!("step {k}: output 'attn'"),
            output(o, "attn", k)?,
            &want,
            F32_TOL,
        )?;
        close(
            &format!("step {k}: output 'kcache_out'"),
            output(o, "kcache_out", k)?,
            &kcv,
            F32_TOL,
        )?;
    }
    Ok(())
}
