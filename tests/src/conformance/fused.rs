//! The fused decode ops (RMSNORM_GEMV, ATTENTION_GEMV, GATE_UP_SILU, QKV_ROPE_APPEND), each
//! against the formula of the chain of ops it fuses, in tiles and on each CUDA path.

use super::Ctx;
use super::compare::{F32_TOL, Tol};
use super::formulas::{Attn, attention, attention_params, linear, rmsnorm, rope_scaled, silu};
use super::outcome::CaseResult;
use super::run::{Inputs, in_vals, set_input};
use super::tiny::{Tiny, check_formula, int, no_change, real};
use amk_core::sim::SplitMix;
use amk_core::{DType, Opcode, Tensor};

pub(super) fn op_rmsnorm_gemv(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(41);
    let x = t.input("x", DType::F32, &[1, 24]);
    let (nw, nwv) = t.weight("norm", DType::F32, &[24], 0.5, 1.5);
    let (w, wv) = t.weight("w", DType::F32, &[10, 24], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", DType::F32, &[10], -0.5, 0.5);
    let x13 = t.input("x13", DType::F32, &[1, 13]);
    let (nw13, nw13v) = t.weight("norm13", DType::F32, &[13], 0.5, 1.5);
    let (w13, w13v) = t.weight("w13", DType::F32, &[5, 13], -0.5, 0.5);
    let y = t.output("y", DType::F32, &[1, 10]);
    let y13 = t.output("y13", DType::F32, &[1, 5]);
    let ct = t.counter();
    for (off, nt) in [(0, 6), (6, 4)] {
        t.task_on(
            ct,
            Opcode::RMSNORM_GEMV,
            &[x, nw, w, bias],
            &[y],
            &[],
            &[
                ("eps", real(1e-5)),
                ("K", int(24)),
                ("N_tile", int(nt)),
                ("n_off", int(off)),
            ],
        );
    }
    t.task(
        Opcode::RMSNORM_GEMV,
        &[x13, nw13, w13],
        &[y13],
        &[],
        &[
            ("eps", real(1e-6)),
            ("K", int(13)),
            ("N_tile", int(5)),
            ("n_off", int(0)),
        ],
    );
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xn = rmsnorm(&in_vals(ins, "x")?, &nwv, 1e-5);
        let xn13 = rmsnorm(&in_vals(ins, "x13")?, &nw13v, 1e-6);
        Ok(vec![
            ("y", linear(&xn, &wv, 24, Some(&bv))),
            ("y13", linear(&xn13, &w13v, 13, None)),
        ])
    })
}

/// ATTENTION_GEMV on the three attention paths of the CUDA kernel: bf16 GQA over 5 rows (tiny
/// path; the row rounded to bf16 before the products, as the op specifies), f32 over 40 rows
/// (fast path) and f32 with head_dim 12 (generic path), each with its tiles of a projection.
pub(super) fn op_attention_gemv(c: &Ctx<'_>) -> CaseResult {
    const MAX_SEQ: u64 = 48;
    struct Part {
        a: Attn,
        dt: DType,
        wdt: DType,
        start: u64,
        len: u64,
        n: u64,
        tiles: &'static [(u64, u64)],
        bias: bool,
        out: &'static str,
    }
    let a = |nh, nkv, hd: usize| Attn {
        nh,
        nkv,
        hd,
        scale: 1.0 / (hd as f64).sqrt(),
    };
    let parts = [
        Part {
            a: a(8, 2, 64),
            dt: DType::BF16,
            wdt: DType::BF16,
            start: 2,
            len: 5,
            n: 24,
            tiles: &[(0, 16), (16, 8)],
            bias: true,
            out: "y_tiny",
        },
        Part {
            a: a(4, 1, 32),
            dt: DType::F32,
            wdt: DType::F32,
            start: 0,
            len: 40,
            n: 10,
            tiles: &[(0, 10)],
            bias: false,
            out: "y_fast",
        },
        Part {
            a: a(3, 3, 12),
            dt: DType::F32,
            wdt: DType::F16,
            start: 1,
            len: 6,
            n: 7,
            tiles: &[(0, 3), (3, 4)],
            bias: true,
            out: "y_generic",
        },
    ];
    let mut t = Tiny::new(43);
    let mut vals = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let (nh, nkv, hd) = (p.a.nh as u64, p.a.nkv as u64, p.a.hd as u64);
        let k = nh * hd;
        let q = t.input(&format!("q{i}"), p.dt, &[nh, hd]);
        let shape = [MAX_SEQ, nkv, hd];
        let (kc, kv) = t.weight(&format!("kcache{i}"), p.dt, &shape, -1.0, 1.0);
        let (vc, vv) = t.weight(&format!("vcache{i}"), p.dt, &shape, -1.0, 1.0);
        let (w, wv) = t.weight(&format!("w{i}"), p.wdt, &[p.n, k], -0.5, 0.5);
        let mut ins = vec![q, kc, vc, w];
        let bv = if p.bias {
            let (b, bv) = t.weight(&format!("bias{i}"), p.dt, &[p.n], -0.5, 0.5);
            ins.push(b);
            Some(bv)
        } else {
            None
        };
        let y = t.output(p.out, DType::F32, &[1, p.n]);
        let ct = t.counter();
        for &(off, nt) in p.tiles {
            let mut params = attention_params(p.a, p.start as usize, p.len as usize);
            params.extend([
                ("K", int(k as i64)),
                ("N_tile", int(nt as i64)),
                ("n_off", int(off as i64)),
            ]);
            t.task_on(ct, Opcode::ATTENTION_GEMV, &ins, &[y], &[], &params);
        }
        vals.push((kv, vv, wv, bv));
    }
    let tol = Tol {
        rtol: 1e-3,
        atol: 1e-4,
    };
    check_formula(c, t, 2, tol, no_change, |ins| {
        parts
            .iter()
            .zip(&vals)
            .enumerate()
            .map(|(i, (p, (kv, vv, wv, bv)))| {
                let q = in_vals(ins, &format!("q{i}"))?;
                let (start, len) = (p.start as usize, p.len as usize);
                // the attention row as the op keeps it: rounded to q's dtype
                let row: Vec<f64> = attention(p.a, &q, kv, vv, start, len)
                    .into_iter()
                    .map(|v| amk_core::round_to(p.dt, v as f32) as f64)
                    .collect();
                Ok((p.out, linear(&row, wv, p.a.nh * p.a.hd, bv.as_deref())))
            })
            .collect()
    })
}

pub(super) fn op_gate_up_silu(c: &Ctx<'_>) -> CaseResult {
    let mut t = Tiny::new(42);
    let x = t.input("x", DType::F32, &[1, 16]);
    let (nw, nwv) = t.weight("norm", DType::F32, &[16], 0.5, 1.5);
    let (wg, wgv) = t.weight("wg", DType::F32, &[12, 16], -0.5, 0.5);
    let (wu, wuv) = t.weight("wu", DType::F32, &[12, 16], -0.5, 0.5);
    let x10 = t.input("x10", DType::F32, &[1, 10]);
    let (wg10, wg10v) = t.weight("wg10", DType::F32, &[3, 10], -0.5, 0.5);
    let (wu10, wu10v) = t.weight("wu10", DType::F32, &[3, 10], -0.5, 0.5);
    let y = t.output("y", DType::F32, &[1, 12]);
    let yp = t.output("y_plain", DType::F32, &[1, 12]);
    let y10 = t.output("y10", DType::F32, &[1, 3]);
    let ct = t.counter();
    for (off, nt) in [(0, 8), (8, 4)] {
        let tile = [("K", int(16)), ("N_tile", int(nt)), ("n_off", int(off))];
        let mut normed = tile.to_vec();
        normed.push(("eps", real(1e-5)));
        t.task_on(
            ct,
            Opcode::GATE_UP_SILU,
            &[x, wg, wu, nw],
            &[y],
            &[],
            &normed,
        );
    }
    let tile = [("K", int(16)), ("N_tile", int(12)), ("n_off", int(0))];
    t.task(Opcode::GATE_UP_SILU, &[x, wg, wu], &[yp], &[], &tile);
    let tile10 = [("K", int(10)), ("N_tile", int(3)), ("n_off", int(0))];
    t.task(
        Opcode::GATE_UP_SILU,
        &[x10, wg10, wu10],
        &[y10],
        &[],
        &tile10,
    );
    let swiglu = |x: &[f64], wg: &[f64], wu: &[f64], k: usize| -> Vec<f64> {
        let (g, u) = (linear(x, wg, k, None), linear(x, wu, k, None));
        g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect()
    };
    check_formula(c, t, 2, F32_TOL, no_change, |ins| {
        let xv = in_vals(ins, "x")?;
        let xn = rmsnorm(&xv, &nwv, 1e-5);
        Ok(vec![
            ("y", swiglu(&xn, &wgv, &wuv, 16)),
            ("y_plain", swiglu(&xv, &wgv, &wuv, 16)),
            ("y10", swiglu(&in_vals(ins, "x10")?, &wg10v, &wu10v, 10)),
        ])
    })
}

pub(super) fn op_qkv_rope_append(c: &Ctx<'_>) -> CaseResult {
    qkv_rope_append_case(c, QkvParts::default())
}

pub(super) fn op_qkv_rope_append_factors(c: &Ctx<'_>) -> CaseResult {
    let parts = QkvParts {
        factors: true,
        ..QkvParts::default()
    };
    qkv_rope_append_case(c, parts)
}

pub(super) fn op_qkv_rope_append_qk_norm(c: &Ctx<'_>) -> CaseResult {
    let parts = QkvParts {
        qk_norm: true,
        ..QkvParts::default()
    };
    qkv_rope_append_case(c, parts)
}

/// The optional parts of a [`qkv_rope_append_case`].
#[derive(Debug, Clone, Copy, Default)]
struct QkvParts {
    /// Llama 3's frequency divisors as the last input (`rope_factors` = 1).
    factors: bool,
    /// Qwen3's per-head q/k norm weights (`qk_norm` = 1), in tiles of whole heads.
    qk_norm: bool,
}

/// RMSNORM of every head of `v` (rows of `w.len()` elements) with weight `w`, when given.
fn head_rmsnorm(v: Vec<f64>, w: Option<&[f64]>) -> Vec<f64> {
    w.map_or(v.clone(), |w| rmsnorm(&v, w, 1e-5))
}

/// QKV_ROPE_APPEND tiles over three steps, with the optional `parts`.
fn qkv_rope_append_case(c: &Ctx<'_>, parts: QkvParts) -> CaseResult {
    let with_factors = parts.factors;
    let (nh, nkv, hd, k, seq) = (2usize, 1usize, 8usize, 16usize, 4usize);
    let theta = 10000.0;
    let mut t = Tiny::new(43);
    let x = t.input("x", DType::F32, &[1, k as u64]);
    let pos = t.input("pos", DType::I32, &[1]);
    let (nw, nwv) = t.weight("norm", DType::F32, &[k as u64], 0.5, 1.5);
    let (wq, wqv) = t.weight("wq", DType::F32, &[(nh * hd) as u64, k as u64], -0.5, 0.5);
    let (wk, wkv) = t.weight("wk", DType::F32, &[(nkv * hd) as u64, k as u64], -0.5, 0.5);
    let (wv, wvv) = t.weight("wv", DType::F32, &[(nkv * hd) as u64, k as u64], -0.5, 0.5);
    let q = t.output("q", DType::F32, &[nh as u64, hd as u64]);
    let kc = t.kv("kcache", &[seq as u64, nkv as u64, hd as u64]);
    let vc = t.kv("vcache", &[seq as u64, nkv as u64, hd as u64]);
    let k_out = t.output("k_all", DType::F32, &[seq as u64, nkv as u64, hd as u64]);
    let v_out = t.output("v_all", DType::F32, &[seq as u64, nkv as u64, hd as u64]);
    let (fac, facv) = t.weight("factors", DType::F32, &[hd as u64 / 2], 1.0, 8.0);
    let facv = if with_factors { facv } else { Vec::new() };
    let (qn, qnv) = t.weight("q_norm", DType::F32, &[hd as u64], 0.5, 1.5);
    let (kn, knv) = t.weight("k_norm", DType::F32, &[hd as u64], 0.5, 1.5);
    let (qnv, knv) = (parts.qk_norm.then_some(qnv), parts.qk_norm.then_some(knv));
    let ct = t.counter();
    // Two tiles: units [0, 20) (Q heads and half of K) and [20, 32); with the per-head norms,
    // whole heads: [0, 16) (the Q heads) and [16, 32) (K and V).
    let tiles = if parts.qk_norm {
        [(0, 16), (16, 16)]
    } else {
        [(0, 20), (20, 12)]
    };
    for (off, nt) in tiles {
        let mut ins = vec![x, wq, wk, wv, pos, nw];
        let mut params = vec![
            ("K", int(k as i64)),
            ("N_tile", int(nt)),
            ("n_off", int(off)),
            ("head_dim", int(hd as i64)),
            ("n_heads", int(nh as i64)),
            ("n_kv_heads", int(nkv as i64)),
            ("theta", real(theta)),
            ("eps", real(1e-5)),
        ];
        if parts.qk_norm {
            ins.extend([qn, kn]);
            params.push(("qk_norm", int(1)));
        }
        if with_factors {
            ins.push(fac);
            params.push(("rope_factors", int(1)));
        }
        t.task_on(
            ct,
            Opcode::QKV_ROPE_APPEND,
            &ins,
            &[q, kc, vc],
            &[],
            &params,
        );
    }
    t.task(Opcode::COPY, &[kc], &[k_out], &[(ct, 2)], &[]);
    t.task(Opcode::COPY, &[vc], &[v_out], &[(ct, 2)], &[]);
    // Three steps at positions 1, 3, 1: the caches keep the rows of earlier steps, and the
    // row written twice holds the last step's values.
    let positions = [1usize, 3, 1];
    let steps = std::cell::Cell::new(0usize);
    let set_pos = |ins: &mut Inputs, _: &mut SplitMix| {
        let p = positions[steps.get() % positions.len()];
        steps.set(steps.get() + 1);
        set_input(
            ins,
            "pos",
            Tensor::from_f32(DType::I32, &[1], &[p as f32])
                .unwrap_or_else(|_| Tensor::zeros(DType::I32, &[1])),
        );
    };
    let row = nkv * hd;
    let k_all = std::cell::RefCell::new(vec![0.0; seq * row]);
    let v_all = std::cell::RefCell::new(vec![0.0; seq * row]);
    check_formula(c, t, 3, F32_TOL, set_pos, |ins| {
        let xn = rmsnorm(&in_vals(ins, "x")?, &nwv, 1e-5);
        let p = in_vals(ins, "pos")?[0] as usize;
        let pv = [p as f64];
        let (mut ka, mut va) = (k_all.borrow_mut(), v_all.borrow_mut());
        ka[p * row..(p + 1) * row].copy_from_slice(&rope_scaled(
            &head_rmsnorm(linear(&xn, &wkv, k, None), knv.as_deref()),
            &pv,
            hd,
            theta,
            &facv,
        ));
        va[p * row..(p + 1) * row].copy_from_slice(&linear(&xn, &wvv, k, None));
        Ok(vec![
            (
                "q",
                rope_scaled(
                    &head_rmsnorm(linear(&xn, &wqv, k, None), qnv.as_deref()),
                    &pv,
                    hd,
                    theta,
                    &facv,
                ),
            ),
            ("k_all", ka.clone()),
            ("v_all", va.clone()),
        ])
    })
}
