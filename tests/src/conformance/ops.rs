//! One case per opcode: each op alone (or with a barrier or a copy) against its formula.

use super::Ctx;
use super::compare::{F32_TOL, Tol};
use super::formulas::{
    Attn, argmax_rows, attention, attention_params, attention_partial, combine, gelu, layernorm,
    linear, partial_layout, rmsnorm, rope, rope_scaled, silu, softmax_rows, token_nll,
};
use super::outcome::CaseResult;
use super::run::{Inputs, in_vals, set_input, vals};
use super::tiny::{Tiny, check_formula, int, no_change, real};
use crate::r#gen;
use amk_core::sim::SplitMix;
use amk_core::testkit::random_nonzero;
use amk_core::{BufferId, DType, Opcode, Tensor};

pub(super) fn op_nop(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(1);
    let x = t.input("x", DType::F32, &[2, 3]);
    let y = t.output("y", DType::F32, &[2, 3]);
    let n1 = t.task(Opcode::NOP, &[], &[], &[], &[]);
    let n2 = t.task(Opcode::NOP, &[], &[], &[(n1, 1)], &[]);
    t.task(Opcode::COPY, &[x], &[y], &[(n2, 1)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![("y", in_vals(ins, "x")?)])
    })
}

pub(super) fn op_copy(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(2);
    let x = t.input("x", DType::F32, &[2, 6]);
    let ids = t.input("ids", DType::I32, &[4]);
    let y = t.output("y", DType::F32, &[3, 4]);
    let yb = t.output("y_bf16", DType::BF16, &[12]);
    let yi = t.output("y_ids", DType::I32, &[2, 2]);
    t.task(Opcode::COPY, &[x], &[y], &[], &[]);
    t.task(Opcode::COPY, &[x], &[yb], &[], &[]);
    t.task(Opcode::COPY, &[ids], &[yi], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        Ok(vec![
            ("y", xv.clone()),
            ("y_bf16", xv),
            ("y_ids", in_vals(ins, "ids")?),
        ])
    })
}

pub(super) fn op_embed(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(3);
    let ids = t.input("ids", DType::I32, &[3]);
    let (table, tv) = t.weight("table", DType::F32, &[7, 5], -1.0, 1.0);
    let y = t.output("y", DType::F32, &[3, 5]);
    t.task(
        Opcode::EMBED,
        &[ids, table],
        &[y],
        &[],
        &[("hidden", int(5))],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let want = in_vals(ins, "ids")?
            .iter()
            .flat_map(|&id| tv[id as usize * 5..id as usize * 5 + 5].to_vec())
            .collect();
        Ok(vec![("y", want)])
    })
}

pub(super) fn op_rmsnorm(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(4);
    let x = t.input("x", DType::F32, &[2, 8]);
    let (w, wv) = t.weight("w", DType::F32, &[8], 0.5, 1.5);
    let y = t.output("y", DType::F32, &[2, 8]);
    t.task(
        Opcode::RMSNORM,
        &[x, w],
        &[y],
        &[],
        &[("eps", real(1e-5)), ("hidden", int(8))],
    );
    // Row tiles: tasks writing disjoint rows of one output (short rows; rows of 1,536, whose
    // two-row tile takes the GPU's wide warp rows and whose one-row tile the block's row).
    let mut tiled = Vec::new();
    for (name, rows, h, cuts) in [("y_rows", 5, 8, [0, 3, 5]), ("y_wide", 3, 1536, [0, 2, 3])] {
        let xr = t.input(&format!("x{name}"), DType::F32, &[rows, h]);
        let (wr, wrv) = t.weight(&format!("w{name}"), DType::F32, &[h], 0.5, 1.5);
        let yr = t.output(name, DType::F32, &[rows, h]);
        let c = t.counter();
        for m in cuts.windows(2) {
            let pr = [
                ("eps", real(1e-5)),
                ("hidden", int(h as i64)),
                ("m_off", int(m[0])),
                ("M_tile", int(m[1] - m[0])),
                ("n_off", int(0)),
                ("N_tile", int(h as i64)),
            ];
            t.task_on(c, Opcode::RMSNORM, &[xr, wr], &[yr], &[], &pr);
        }
        tiled.push((name, format!("x{name}"), wrv));
    }
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let mut want = vec![("y", rmsnorm(&in_vals(ins, "x")?, &wv, 1e-5))];
        for (name, x, wrv) in &tiled {
            want.push((*name, rmsnorm(&in_vals(ins, x)?, wrv, 1e-5)));
        }
        Ok(want)
    })
}

pub(super) fn op_layernorm(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(5);
    let x = t.input("x", DType::F32, &[3, 8]);
    let (w, wv) = t.weight("w", DType::F32, &[8], 0.5, 1.5);
    let (b, bv) = t.weight("b", DType::F32, &[8], -0.5, 0.5);
    let y = t.output("y", DType::F32, &[3, 8]);
    let y2 = t.output("y_nobias", DType::F32, &[3, 8]);
    let pr = [("eps", real(1e-5)), ("hidden", int(8))];
    t.task(Opcode::LAYERNORM, &[x, w, b], &[y], &[], &pr);
    t.task(Opcode::LAYERNORM, &[x, w], &[y2], &[], &pr);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        Ok(vec![
            ("y", layernorm(&xv, &wv, Some(&bv), 1e-5)),
            ("y_nobias", layernorm(&xv, &wv, None, 1e-5)),
        ])
    })
}

pub(super) fn op_gemv_tile(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(6);
    let x = t.input("x", DType::F32, &[1, 12]);
    let (w, wv) = t.weight("w", DType::F32, &[10, 12], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", DType::F32, &[10], -0.5, 0.5);
    let (qw, qv) = t.weight("qw", DType::I8, &[6, 12], -7.0, 7.0);
    let (sc, sv) = t.weight("scales", DType::F16, &[6, 3], 0.01, 0.1);
    let y = t.output("y", DType::F32, &[1, 10]);
    let yq = t.output("y_int8", DType::F32, &[1, 6]);
    t.task(
        Opcode::GEMV_TILE,
        &[x, w, bias],
        &[y],
        &[],
        &[("K", int(12)), ("N_tile", int(10)), ("n_off", int(0))],
    );
    t.task(
        Opcode::GEMV_TILE,
        &[x, qw, sc],
        &[yq],
        &[],
        &[
            ("K", int(12)),
            ("N_tile", int(6)),
            ("n_off", int(0)),
            ("qdtype", int(6)),
            ("group", int(4)),
        ],
    );
    // The int8 weight as real numbers: q[n, k] * scales[n, k / 4].
    let deq: Vec<f64> = (0..6 * 12)
        .map(|i| qv[i] * sv[(i / 12) * 3 + (i % 12) / 4])
        .collect();
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        Ok(vec![
            ("y", linear(&xv, &wv, 12, Some(&bv))),
            ("y_int8", linear(&xv, &deq, 12, None)),
        ])
    })
}

pub(super) fn op_gemm_tile(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(7);
    let x = t.input("x", DType::F32, &[3, 8]);
    let (w, wv) = t.weight("w", DType::F32, &[5, 8], -0.5, 0.5);
    let y = t.output("y", DType::F32, &[3, 5]);
    t.task(
        Opcode::GEMM_TILE,
        &[x, w],
        &[y],
        &[],
        &[
            ("K", int(8)),
            ("N_tile", int(5)),
            ("n_off", int(0)),
            ("M_tile", int(3)),
        ],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![("y", linear(&in_vals(ins, "x")?, &wv, 8, None))])
    })
}

pub(super) fn op_attention_tile(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(8);
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 4,
        scale: 0.5,
    };
    let q = t.input("q", DType::F32, &[4, 4]);
    let (kc, kv) = t.weight("kcache", DType::F32, &[6, 2, 4], -1.0, 1.0);
    let (vc, vv) = t.weight("vcache", DType::F32, &[6, 2, 4], -1.0, 1.0);
    let y = t.output("y", DType::F32, &[4, 4]);
    t.task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc],
        &[y],
        &[],
        &[
            ("head_dim", int(4)),
            ("kv_start", int(1)),
            ("kv_len", int(4)),
            ("scale", real(0.5)),
            ("n_heads", int(4)),
            ("n_kv_heads", int(2)),
        ],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![(
            "y",
            attention(a, &in_vals(ins, "q")?, &kv, &vv, 1, 4),
        )])
    })
}

/// One ATTENTION_TILE of an [`attention_paths`] case: output name, q / cache dtype, geometry,
/// cache rows `[start, start + len)`, and whether it writes a partial `[acc | m | l]` shard.
struct PathCase {
    out: &'static str,
    dt: DType,
    a: Attn,
    start: usize,
    len: usize,
    partial: bool,
}

/// Independent ATTENTION_TILE tasks over `[48, nkv, hd]` caches, each against the formula.
/// The geometries are those at which the CUDA kernel changes path (ops/attention-tile: the
/// tiny path up to 16 rows with head_dim / 8 a power of two, the fast path's one-row batches
/// up to 32 rows, its four-row batches beyond, the generic path), so every path is checked on
/// every backend.
fn attention_paths(c: &Ctx<'_>, seed: u64, cases: &[PathCase], tol: Tol) -> CaseResult {
    const MAX_SEQ: u64 = 48;
    let mut t = Tiny::new(seed);
    let mut caches = Vec::new();
    for (i, p) in cases.iter().enumerate() {
        let (nh, nkv, hd) = (p.a.nh as u64, p.a.nkv as u64, p.a.hd as u64);
        let q = t.input(&format!("q{i}"), p.dt, &[nh, hd]);
        let shape = [MAX_SEQ, nkv, hd];
        let (kc, kv) = t.weight(&format!("kcache{i}"), p.dt, &shape, -1.0, 1.0);
        let (vc, vv) = t.weight(&format!("vcache{i}"), p.dt, &shape, -1.0, 1.0);
        let (odt, width) = if p.partial {
            (DType::F32, hd + 2)
        } else {
            (p.dt, hd)
        };
        let y = t.output(p.out, odt, &[nh, width]);
        let mut params = attention_params(p.a, p.start, p.len);
        if p.partial {
            params.push(("flags", int(2)));
        }
        t.task(Opcode::ATTENTION_TILE, &[q, kc, vc], &[y], &[], &params);
        caches.push((kv, vv));
    }
    check_formula(c, t, 2, tol, no_change, |ins| {
        cases
            .iter()
            .zip(&caches)
            .enumerate()
            .map(|(i, (p, (kv, vv)))| {
                let q = in_vals(ins, &format!("q{i}"))?;
                let y = if p.partial {
                    partial_layout(&attention_partial(p.a, &q, kv, vv, p.start, p.len))
                } else {
                    attention(p.a, &q, kv, vv, p.start, p.len)
                };
                Ok((p.out, y))
            })
            .collect()
    })
}

pub(super) fn op_attention_tile_paths_bf16(c: &Ctx<'_>) -> CaseResult {
    let gqa = |hd: usize| Attn {
        nh: 8,
        nkv: 2,
        hd,
        scale: 1.0 / (hd as f64).sqrt(),
    };
    let case = |out, a, start, len| PathCase {
        out,
        dt: DType::BF16,
        a,
        start,
        len,
        partial: false,
    };
    // six heads of 64: the second warp of the tiny path runs two heads and two idle groups
    let six = Attn {
        nh: 6,
        nkv: 3,
        hd: 64,
        scale: 0.125,
    };
    let one_to_one = Attn {
        nh: 4,
        nkv: 4,
        hd: 128,
        scale: 1.0 / 128f64.sqrt(),
    };
    let hd96 = Attn {
        nh: 6,
        nkv: 3,
        hd: 96,
        scale: 1.0 / 96f64.sqrt(),
    };
    let cases = [
        case("one_row", gqa(64), 0, 1),
        case("tiny_bound", gqa(64), 3, 32),
        case("first_fast", gqa(64), 0, 33),
        case("four_row_batches", gqa(64), 2, 40),
        case("idle_groups", six, 5, 2),
        case("head_dim_128", one_to_one, 1, 5),
        // head_dim 96 (12 lanes, not a power of two): the fast path's one-row batches
        case("head_dim_96", hd96, 0, 3),
        case("head_dim_96_short_bound", hd96, 16, 32),
        case("head_dim_4", gqa(4), 7, 4),
    ];
    // bf16 outputs: the formula's value rounded to bf16 (the tolerance adds bf16's epsilon)
    let tol = Tol {
        rtol: 1e-3,
        atol: 1e-3,
    };
    attention_paths(c, 41, &cases, tol)
}

pub(super) fn op_attention_tile_paths_f32(c: &Ctx<'_>) -> CaseResult {
    let a = |nh, nkv, hd: usize| Attn {
        nh,
        nkv,
        hd,
        scale: 1.0 / (hd as f64).sqrt(),
    };
    let case = |out, a, start, len, partial| PathCase {
        out,
        dt: DType::F32,
        a,
        start,
        len,
        partial,
    };
    let cases = [
        case("tiny", a(8, 2, 64), 4, 9, false),
        case("tiny_bound", a(8, 2, 64), 1, 32, false),
        case("one_row_batches", a(6, 3, 96), 1, 20, false),
        case("long", a(8, 2, 64), 0, 33, false),
        case("tiny_shard", a(4, 1, 32), 2, 6, true),
        case("tiny_shard_bound", a(4, 1, 32), 3, 32, true),
        case("fast_shard", a(4, 1, 32), 3, 37, true),
        case("empty_shard", a(4, 1, 32), 5, 0, true),
        // a trailing split-KV shard: empty, starting at max_seq (nothing may be read)
        case("empty_shard_at_end", a(4, 1, 32), 48, 0, true),
        // head_dim 8, 16 and 256: one, two and thirty-two lanes per head on the tiny path
        case("head_dim_8", a(8, 8, 8), 0, 3, false),
        case("head_dim_16", a(4, 2, 16), 6, 2, false),
        case("head_dim_256", a(2, 1, 256), 1, 4, false),
    ];
    attention_paths(c, 42, &cases, F32_TOL)
}

pub(super) fn op_rope(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(9);
    let x = t.input("x", DType::F32, &[3, 8]);
    let pos = t.input("pos", DType::I32, &[1]);
    let xb = t.input("xb", DType::F32, &[2, 3, 4]);
    let posb = t.input("posb", DType::I32, &[2]);
    let y = t.output("y", DType::F32, &[3, 8]);
    let yb = t.output("yb", DType::F32, &[2, 3, 4]);
    // Llama 3's frequency factors: a third input of head_dim / 2 divisors.
    let (fac, facv) = t.weight("factors", DType::F32, &[4], 1.0, 8.0);
    let ys = t.output("ys", DType::F32, &[3, 8]);
    t.task(
        Opcode::ROPE,
        &[x, pos, fac],
        &[ys],
        &[],
        &[("head_dim", int(8)), ("theta", real(10000.0))],
    );
    t.task(
        Opcode::ROPE,
        &[x, pos],
        &[y],
        &[],
        &[("head_dim", int(8)), ("theta", real(10000.0))],
    );
    t.task(
        Opcode::ROPE,
        &[xb, posb],
        &[yb],
        &[],
        &[("head_dim", int(4)), ("theta", real(500.0))],
    );
    let tol = Tol {
        rtol: 1e-4,
        atol: 1e-4,
    };
    check_formula(c, t, 2, tol, no_change, |ins| {
        Ok(vec![
            (
                "y",
                rope(&in_vals(ins, "x")?, &in_vals(ins, "pos")?, 8, 10000.0),
            ),
            (
                "ys",
                rope_scaled(
                    &in_vals(ins, "x")?,
                    &in_vals(ins, "pos")?,
                    8,
                    10000.0,
                    &facv,
                ),
            ),
            (
                "yb",
                rope(&in_vals(ins, "xb")?, &in_vals(ins, "posb")?, 4, 500.0),
            ),
        ])
    })
}

pub(super) fn op_silu_mul(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(10);
    let g = t.input("gate", DType::F32, &[1, 10]);
    let u = t.input("up", DType::F32, &[1, 10]);
    let y = t.output("y", DType::F32, &[1, 10]);
    t.task(Opcode::SILU_MUL, &[g, u], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let (g, u) = (in_vals(ins, "gate")?, in_vals(ins, "up")?);
        Ok(vec![(
            "y",
            g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect(),
        )])
    })
}

pub(super) fn op_gelu(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(11);
    let x = t.input("x", DType::F32, &[2, 7]);
    let y = t.output("y", DType::F32, &[2, 7]);
    t.task(Opcode::GELU, &[x], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![(
            "y",
            in_vals(ins, "x")?.into_iter().map(gelu).collect(),
        )])
    })
}

pub(super) fn op_add(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(12);
    let a = t.input("a", DType::F32, &[3, 5]);
    let b = t.input("b", DType::F32, &[15]);
    let y = t.output("y", DType::F32, &[3, 5]);
    t.task(Opcode::ADD, &[a, b], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let (a, b) = (in_vals(ins, "a")?, in_vals(ins, "b")?);
        Ok(vec![("y", a.iter().zip(&b).map(|(a, b)| a + b).collect())])
    })
}

pub(super) fn op_mul(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(13);
    let a = t.input("a", DType::F32, &[2, 6]);
    let b = t.input("b", DType::F32, &[2, 6]);
    let y = t.output("y", DType::F32, &[2, 6]);
    let ys = t.output("y_scaled", DType::F32, &[2, 6]);
    t.task(Opcode::MUL, &[a, b], &[y], &[], &[]);
    t.task(Opcode::MUL, &[a], &[ys], &[], &[("scale", real(-1.75))]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let (a, b) = (in_vals(ins, "a")?, in_vals(ins, "b")?);
        Ok(vec![
            ("y", a.iter().zip(&b).map(|(a, b)| a * b).collect()),
            ("y_scaled", a.iter().map(|a| a * -1.75).collect()),
        ])
    })
}

pub(super) fn op_dequant(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(14);
    let (q, qv) = t.weight("q", DType::I8, &[4, 8], -7.0, 7.0);
    let (s, sv) = t.weight("scales", DType::F32, &[8], 0.01, 0.5);
    let x = t.input("x", DType::F32, &[4, 8]);
    let d = t.act("wdq", &[4, 8]);
    let y = t.output("y", DType::F32, &[4, 8]);
    let cd = t.task(
        Opcode::DEQUANT,
        &[q, s],
        &[d],
        &[],
        &[("qdtype", int(6)), ("group", int(4))],
    );
    // Multiply by an input so each step's output differs.
    t.task(Opcode::MUL, &[d, x], &[y], &[(cd, 1)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        Ok(vec![(
            "y",
            (0..32).map(|i| qv[i] * sv[i / 4] * xv[i]).collect(),
        )])
    })
}

pub(super) fn op_softmax(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(15);
    let x = t.input("x", DType::F32, &[3, 6]);
    let y = t.output("y", DType::F32, &[3, 6]);
    let y0 = t.output("y_dim0", DType::F32, &[3, 6]);
    t.task(Opcode::SOFTMAX, &[x], &[y], &[], &[("dim", int(-1))]);
    t.task(Opcode::SOFTMAX, &[x], &[y0], &[], &[("dim", int(0))]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        // Along dim 0: transpose, softmax rows of 3, transpose back.
        let tr: Vec<f64> = (0..18).map(|i| xv[(i % 3) * 6 + i / 3]).collect();
        let s0 = softmax_rows(&tr, 3);
        let back: Vec<f64> = (0..18).map(|i| s0[(i % 6) * 3 + i / 6]).collect();
        Ok(vec![("y", softmax_rows(&xv, 6)), ("y_dim0", back)])
    })
}

pub(super) fn op_allreduce_shard(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(16);
    let a = t.input("a", DType::F32, &[2, 4]);
    let b = t.input("b", DType::F32, &[2, 4]);
    let d = t.input("d", DType::F32, &[8]);
    let y = t.output("y", DType::F32, &[2, 4]);
    t.task(Opcode::ALLREDUCE_SHARD, &[a, b, d], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let (a, b, d) = (in_vals(ins, "a")?, in_vals(ins, "b")?, in_vals(ins, "d")?);
        Ok(vec![("y", (0..8).map(|i| a[i] + b[i] + d[i]).collect())])
    })
}

pub(super) fn op_kv_append(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(17);
    let new = t.input("k_new", DType::F32, &[1, 2, 4]);
    let cache = t.kv("kcache", &[5, 2, 4]);
    let y = t.output("cache_out", DType::F32, &[5, 2, 4]);
    let ca = t.task(
        Opcode::KV_APPEND,
        &[new, cache],
        &[cache],
        &[],
        &[("pos", int(3))],
    );
    t.task(Opcode::COPY, &[cache], &[y], &[(ca, 1)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let nv = in_vals(ins, "k_new")?;
        let mut want = vec![0.0; 40];
        want[24..32].copy_from_slice(&nv);
        Ok(vec![("cache_out", want)])
    })?;
    kv_append_rows(c)
}

/// A prompt chunk's rows at once: 70 rows of [8, 64] at position 7 of an 80-row cache (4,480
/// 8-element units: several of the device's register batches a thread, or 18 stages of its
/// shared-memory ring, the last one partial), from f32 rows and from bf16 ones.
fn kv_append_rows(c: &Ctx<'_>) -> CaseResult {
    for dtype in [DType::F32, DType::BF16] {
        kv_append_rows_of(c, dtype)?;
    }
    Ok(())
}

fn kv_append_rows_of(c: &Ctx<'_>, dtype: DType) -> CaseResult {
    let (rows, at, cap, row) = (70u64, 7usize, 80u64, 8 * 64usize);
    let mut t = Tiny::new(19);
    let new = t.input("k_rows", dtype, &[rows, 8, 64]);
    let cache = t.kv("kcache_rows", &[cap, 8, 64]);
    let y = t.output("cache_rows_out", DType::F32, &[cap, 8, 64]);
    let ca = t.task(
        Opcode::KV_APPEND,
        &[new, cache],
        &[cache],
        &[],
        &[("pos", int(at as i64))],
    );
    t.task(Opcode::COPY, &[cache], &[y], &[(ca, 1)], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let nv = in_vals(ins, "k_rows")?;
        let mut want = vec![0.0; cap as usize * row];
        want[at * row..at * row + nv.len()].copy_from_slice(&nv);
        Ok(vec![("cache_rows_out", want)])
    })
}

pub(super) fn op_sample_argmax(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(18);
    let x = t.input("logits", DType::F32, &[3, 9]);
    let y = t.output("token", DType::I32, &[3]);
    t.task(Opcode::SAMPLE_ARGMAX, &[x], &[y], &[], &[]);
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![("token", argmax_rows(&in_vals(ins, "logits")?, 9))])
    })
}

/// TOKEN_NLL: a whole f32 task (rows of 1,000, the vector path), a bf16 buffer of 2,048 a row
/// in two row tiles sharing a counter, and f16 rows of 37 (the element path).
pub(super) fn op_token_nll(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(29);
    let cases: [(&'static str, &'static str, &'static str, DType, [u64; 2]); 3] = [
        ("logits", "targets", "nll", DType::F32, [3, 1000]),
        ("logits_b", "targets_b", "nll_b", DType::BF16, [6, 2048]),
        ("logits_h", "targets_h", "nll_h", DType::F16, [2, 37]),
    ];
    for (k, &(x, ids, y, dtype, shape)) in cases.iter().enumerate() {
        let x = t.input(x, dtype, &shape);
        let ids = t.input(ids, DType::I32, &shape[..1]);
        let y = t.output(y, DType::F32, &shape[..1]);
        if k != 1 {
            t.task(Opcode::TOKEN_NLL, &[x, ids], &[y], &[], &[]);
            continue;
        }
        let ct = t.counter();
        for (m_off, m_tile) in [(0, 4), (4, 2)] {
            let tile = [
                ("m_off", int(m_off)),
                ("M_tile", int(m_tile)),
                ("n_off", int(0)),
                ("N_tile", int(1)),
            ];
            t.task_on(ct, Opcode::TOKEN_NLL, &[x, ids], &[y], &[], &tile);
        }
    }
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        cases
            .iter()
            .map(|&(x, ids, y, _, [_, vocab])| {
                let (xv, tv) = (in_vals(ins, x)?, in_vals(ins, ids)?);
                Ok((y, token_nll(&xv, &tv, vocab as usize)))
            })
            .collect()
    })
}

pub(super) fn op_attention_combine(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(19);
    let (heads, hd) = (3usize, 4usize);
    let shape = [heads as u64, hd as u64 + 2];
    let parts: Vec<BufferId> = (0..3)
        .map(|i| t.input(&format!("part{i}"), DType::F32, &shape))
        .collect();
    let y = t.output("y", DType::F32, &[heads as u64, hd as u64]);
    t.task(
        Opcode::ATTENTION_COMBINE,
        &parts,
        &[y],
        &[],
        &[
            ("head_dim", int(hd as i64)),
            ("n_heads", int(heads as i64)),
            ("n_kv_heads", int(1)),
        ],
    );
    // Valid partials: l > 0 with its running max m; head 1 of part 2 is an empty shard.
    let make = |ins: &mut Inputs, rng: &mut SplitMix| {
        for p in 0..3 {
            let mut v = vals(&random_nonzero(DType::F32, &shape, rng, -1.0, 1.0));
            for h in 0..heads {
                let b = h * (hd + 2);
                if p == 2 && h == 1 {
                    v[b..b + hd].iter_mut().for_each(|x| *x = 0.0);
                    v[b + hd] = f64::NEG_INFINITY;
                    v[b + hd + 1] = 0.0;
                } else {
                    v[b + hd] *= 2.0;
                    v[b + hd + 1] = 0.5 + v[b + hd + 1].abs() * 2.0;
                }
            }
            let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            if let Ok(t) = Tensor::from_f32(DType::F32, &shape, &f) {
                set_input(ins, &format!("part{p}"), t);
            }
        }
    };
    check_formula(c, t, 2, F32_TOL, make, |ins| {
        let ps = (0..3)
            .map(|p| in_vals(ins, &format!("part{p}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(vec![("y", combine(&ps, hd))])
    })
}

pub(super) fn op_fused(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(20);
    let x = t.input("x", DType::F32, &[2, 5]);
    let y = t.output("y", DType::F32, &[2, 5]);
    t.task(
        Opcode::FUSED,
        &[x],
        &[y],
        &[],
        &[("recipe", r#gen::gelu_scale_recipe())],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        Ok(vec![(
            "y",
            in_vals(ins, "x")?
                .into_iter()
                .map(|v| gelu(v) * 0.5)
                .collect(),
        )])
    })
}
