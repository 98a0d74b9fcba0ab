//! The prefill ops (LINEAR_TILE, its RoPE epilogue, ATTENTION_CAUSAL), many rows at a time,
//! against their formulas.

use super::Ctx;
use super::compare::{BF16_TOL, F16_TOL, F32_TOL, Tol};
use super::formulas::{Attn, attention, linear, rmsnorm, rope_scaled, silu};
use super::outcome::CaseResult;
use super::run::{Inputs, in_vals, set_input};
use super::tiny::{Tiny, check_formula, int, no_change, real};
use amk_core::sim::SplitMix;
use amk_core::{DType, Opcode, Tensor};

/// The f64 formula of a LINEAR_TILE over every row: `x` (RMS-normalised with `norm` = (weight,
/// eps)), times `w` (plus the bias), then the epilogue (`extra`: the residual or the up weight's values). The
/// values the op stores in `dt` at its stated rounding points (the normalised row, a product
/// before the epilogue) are rounded to `dt` here too: in bf16 they move a SwiGLU product by more
/// than the suite's tolerance.
fn linear_tile_formula(
    x: &[f64],
    (w, bias): (&[f64], Option<&[f64]>),
    k: usize,
    norm: Option<(&[f64], f64)>,
    (epi, dt): (op_linear_tile::Epilogue, DType),
    extra: &[f64],
) -> Vec<f64> {
    use op_linear_tile::Epilogue;
    let round = |v: Vec<f64>| -> Vec<f64> {
        v.into_iter()
            .map(|x| amk_core::round_to(dt, x as f32) as f64)
            .collect()
    };
    let xn = match norm {
        Some((nw, eps)) => round(rmsnorm(x, nw, eps)),
        None => x.to_vec(),
    };
    let s = linear(&xn, w, k, bias);
    if epi != Epilogue::None {
        let s = round(s);
        return match epi {
            Epilogue::Residual => s.iter().zip(extra).map(|(a, b)| a + b).collect(),
            _ => {
                let u = round(linear(&xn, extra, k, None));
                s.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect()
            }
        };
    }
    s
}

/// One LINEAR_TILE variant of [`linear_tile_case`].
struct LinearVariant {
    name: &'static str,
    norm: bool,
    bias: bool,
    epi: op_linear_tile::Epilogue,
}

/// LINEAR_TILE over `m` rows, `k` inputs and `n` columns in `dt`, as two row tiles × two column
/// tiles on one counter, for each variant: plain, RMS-normalised with the residual,
/// RMS-normalised with SwiGLU, RMS-normalised with a bias and the residual, SwiGLU, and a bias
/// with the residual.
fn linear_tile_case(c: &Ctx<'_>, dt: DType, m: u64, k: u64, n: u64, tol: Tol) -> CaseResult {
    use op_linear_tile::Epilogue;
    let mut t = Tiny::new(61 + k);
    let x = t.input("x", dt, &[m, k]);
    let resid = t.input("r", dt, &[m, n]);
    let (nw, nwv) = t.weight("norm", dt, &[k], 0.5, 1.5);
    let (w, wv) = t.weight("w", dt, &[n, k], -0.5, 0.5);
    let (u, uv) = t.weight("u", dt, &[n, k], -0.5, 0.5);
    let (bias, bv) = t.weight("bias", dt, &[n], -0.5, 0.5);
    let variants = [
        LinearVariant {
            name: "y",
            norm: false,
            bias: false,
            epi: Epilogue::None,
        },
        LinearVariant {
            name: "y_norm_resid",
            norm: true,
            bias: false,
            epi: Epilogue::Residual,
        },
        LinearVariant {
            name: "y_norm_swiglu",
            norm: true,
            bias: false,
            epi: Epilogue::SwiGlu,
        },
        LinearVariant {
            name: "y_norm_bias_resid",
            norm: true,
            bias: true,
            epi: Epilogue::Residual,
        },
        // Without a norm, as the prompt programs' MLP runs: the rows a task may take at once
        // on the wgmma path (256) are for those.
        LinearVariant {
            name: "y_swiglu",
            norm: false,
            bias: false,
            epi: Epilogue::SwiGlu,
        },
        LinearVariant {
            name: "y_bias_resid",
            norm: false,
            bias: true,
            epi: Epilogue::Residual,
        },
    ];
    let (m_split, n_split) = (m as i64 / 2 + 3, n as i64 / 2 + 5);
    for v in &variants {
        let y = t.output(v.name, dt, &[m, n]);
        let ct = t.counter();
        let mut ins = vec![x, w];
        if v.norm {
            ins.push(nw);
        }
        if v.bias {
            ins.push(bias);
        }
        match v.epi {
            // RoPE: `linear_tile_rope_case`.
            Epilogue::None | Epilogue::Rope => {}
            Epilogue::Residual => ins.push(resid),
            Epilogue::SwiGlu => ins.push(u),
        }
        for (mo, mt) in [(0, m_split), (m_split, m as i64 - m_split)] {
            for (no, nt) in [(0, n_split), (n_split, n as i64 - n_split)] {
                let mut p = vec![
                    ("K", int(k as i64)),
                    ("m_off", int(mo)),
                    ("M_tile", int(mt)),
                    ("n_off", int(no)),
                    ("N_tile", int(nt)),
                    ("epilogue", int(v.epi.code())),
                ];
                if v.norm {
                    p.push(("norm", int(1)));
                    p.push(("eps", real(1e-5)));
                }
                if v.bias {
                    p.push(("flags", int(op_linear_tile::FLAG_BIAS)));
                }
                t.task_on(ct, Opcode::LINEAR_TILE, &ins, &[y], &[], &p);
            }
        }
    }
    check_formula(c, t, 2, tol, no_change, |ins| {
        let (xv, rv) = (in_vals(ins, "x")?, in_vals(ins, "r")?);
        let k = k as usize;
        Ok(variants
            .iter()
            .map(|v| {
                let norm = v.norm.then_some((&nwv[..], 1e-5));
                let extra = if v.epi == Epilogue::SwiGlu { &uv } else { &rv };
                let bias = v.bias.then_some(&bv[..]);
                (
                    v.name,
                    linear_tile_formula(&xv, (&wv, bias), k, norm, (v.epi, dt), extra),
                )
            })
            .collect())
    })
}

pub(super) fn op_linear_tile(c: &Ctx<'_>) -> CaseResult {
    linear_tile_case(c, DType::F32, 70, 40, 136, F32_TOL)
}

pub(super) fn op_linear_tile_bf16(c: &Ctx<'_>) -> CaseResult {
    linear_tile_case(c, DType::BF16, 70, 96, 136, BF16_TOL)?;
    linear_tile_case(c, DType::BF16, 9, 40, 20, BF16_TOL)?;
    // Tasks of 153 and 147 rows: a wide (128-row) device tile, then a narrow one of the rest;
    // without a norm on sm_90a one 256-row tile, its last rows outside the task.
    linear_tile_case(c, DType::BF16, 300, 96, 136, BF16_TOL)?;
    // Tasks of 303 and 297 rows: without a norm on sm_90a a 256-row tile, then a narrow one;
    // K of five steps, so that every stage of each pipeline is refilled.
    linear_tile_case(c, DType::BF16, 600, 320, 136, BF16_TOL)
}

pub(super) fn op_linear_tile_f16(c: &Ctx<'_>) -> CaseResult {
    // The f16 tensor-core tiles (wgmma's f16 form on sm_90a): 64-row tiles, then tasks of 303
    // and 297 rows (256- or 128-row tiles, then a narrow one) whose K refills every stage.
    linear_tile_case(c, DType::F16, 70, 96, 136, F16_TOL)?;
    linear_tile_case(c, DType::F16, 600, 320, 136, F16_TOL)
}

/// KV_APPEND split into column slices on one counter: `rows` rows of `width` columns (`dt`)
/// into a `[max_seq, width]` cache at a position from a random start (the same one for the
/// whole chunk), the slices `[n_off, n_off + N_tile)` given by `cuts`; a COPY of the cache
/// after every slice is the output. Each step's cache holds that step's rows at its position
/// and the previous step's elsewhere (zeros before the first).
fn kv_append_slices_case(
    c: &Ctx<'_>,
    dt: DType,
    (rows, width, max_seq): (u64, u64, u64),
    cuts: &[u64],
) -> CaseResult {
    let mut t = Tiny::new(83 + rows + width);
    let new = t.input("new", dt, &[rows, width]);
    let pos = t.input("pos", DType::I32, &[1]);
    let cache = (t.p).new_buffer(
        "cache",
        amk_core::BufferKind::KV_CACHE,
        dt,
        &[max_seq, width],
    );
    let out = t.output("cache_out", dt, &[max_seq, width]);
    let ct = t.counter();
    for pair in cuts.windows(2) {
        let p = [
            ("n_off", int(pair[0] as i64)),
            ("N_tile", int((pair[1] - pair[0]) as i64)),
        ];
        t.task_on(ct, Opcode::KV_APPEND, &[new, cache, pos], &[cache], &[], &p);
    }
    let slices = cuts.len() as i64 - 1;
    t.task(Opcode::COPY, &[cache], &[out], &[(ct, slices)], &[]);
    let make = |ins: &mut Inputs, rng: &mut SplitMix| {
        let start = (rng.next() % (max_seq - rows + 1)) as i64;
        if let Ok(pt) = Tensor::from_i64(DType::I32, &[1], &[start]) {
            set_input(ins, "pos", pt);
        }
    };
    let state = std::cell::RefCell::new(vec![0.0; (max_seq * width) as usize]);
    check_formula(
        c,
        t,
        2,
        Tol {
            rtol: 0.0,
            atol: 0.0,
        },
        make,
        |ins| {
            let (nv, p) = (in_vals(ins, "new")?, in_vals(ins, "pos")?[0] as usize);
            let mut cv = state.borrow_mut();
            let w = width as usize;
            cv[p * w..p * w + nv.len()].copy_from_slice(&nv);
            Ok(vec![("cache_out", cv.clone())])
        },
    )
}

pub(super) fn op_kv_append_slices(c: &Ctx<'_>) -> CaseResult {
    // bf16, three slices of 16 (the device's 16-byte units); 300 rows (several rounds a slice).
    kv_append_slices_case(c, DType::BF16, (300, 48, 400), &[0, 16, 32, 48])?;
    // f32, uneven slices of whole units.
    kv_append_slices_case(c, DType::F32, (40, 48, 64), &[0, 24, 40, 48])?;
    // f32 rows of 15 (no 8-element units): element by element.
    kv_append_slices_case(c, DType::F32, (9, 15, 20), &[0, 7, 15])
}

/// The cache rows of the ATTENTION_CAUSAL cases: two key blocks of the device's tensor-core path.
const CAUSAL_SEQ: u64 = 80;

/// ATTENTION_CAUSAL over `rows` query rows at consecutive positions from a random start below
/// `max_seq`, in three tiles (the first half of the rows whole; the second half by KV head),
/// against the f64 attention of each row over the cache rows up to its position.
fn attention_causal_case(
    c: &Ctx<'_>,
    dt: DType,
    a: Attn,
    rows: u64,
    max_seq: u64,
    tol: Tol,
) -> CaseResult {
    let width = (a.nh * a.hd) as i64;
    let mut t = Tiny::new(71 + rows);
    let q = t.input("q", dt, &[rows, width as u64]);
    let pos = t.input("pos", DType::I32, &[rows]);
    let shape = [max_seq, a.nkv as u64, a.hd as u64];
    let (kc, kv) = t.weight("kcache", dt, &shape, -1.0, 1.0);
    let (vc, vv) = t.weight("vcache", dt, &shape, -1.0, 1.0);
    let y = t.output("y", dt, &[rows, width as u64]);
    let ct = t.counter();
    let half = rows as i64 / 2;
    let group = (a.nh / a.nkv * a.hd) as i64;
    let mut tiles = vec![(0, half, 0, width)];
    for g in 0..a.nkv as i64 {
        tiles.push((half, rows as i64 - half, g * group, group));
    }
    for (mo, mt, no, nt) in tiles {
        let p = [
            ("head_dim", int(a.hd as i64)),
            ("n_heads", int(a.nh as i64)),
            ("n_kv_heads", int(a.nkv as i64)),
            ("scale", real(a.scale)),
            ("m_off", int(mo)),
            ("M_tile", int(mt)),
            ("n_off", int(no)),
            ("N_tile", int(nt)),
        ];
        t.task_on(
            ct,
            Opcode::ATTENTION_CAUSAL,
            &[q, kc, vc, pos],
            &[y],
            &[],
            &p,
        );
    }
    let make = |ins: &mut Inputs, rng: &mut SplitMix| {
        let start = (rng.next() % (max_seq - rows + 1)) as i64;
        let p: Vec<i64> = (start..start + rows as i64).collect();
        if let Ok(pt) = Tensor::from_i64(DType::I32, &[rows], &p) {
            set_input(ins, "pos", pt);
        }
    };
    check_formula(c, t, 2, tol, make, |ins| {
        let (qv, pv) = (in_vals(ins, "q")?, in_vals(ins, "pos")?);
        let w = width as usize;
        let mut want = Vec::with_capacity(qv.len());
        for (r, p) in pv.iter().enumerate() {
            let row = &qv[r * w..(r + 1) * w];
            want.extend(attention(a, row, &kv, &vv, 0, *p as usize + 1));
        }
        Ok(vec![("y", want)])
    })
}

pub(super) fn op_attention_causal(c: &Ctx<'_>) -> CaseResult {
    let a = Attn {
        nh: 4,
        nkv: 2,
        hd: 16,
        scale: 0.25,
    };
    attention_causal_case(c, DType::F32, a, 6, CAUSAL_SEQ, F32_TOL)
}

pub(super) fn op_attention_causal_bf16(c: &Ctx<'_>) -> CaseResult {
    let a = Attn {
        nh: 6,
        nkv: 2,
        hd: 64,
        scale: 0.125,
    };
    attention_causal_case(c, DType::BF16, a, 40, CAUSAL_SEQ, BF16_TOL)?;
    // Up to 6 key blocks (the pipeline's stages wrap), 105 pairs a KV head in the whole tile (a
    // group of 64, then one of 41 whose fourth query tile is empty).
    attention_causal_case(c, DType::BF16, a, 70, 400, BF16_TOL)?;
    let wide = Attn {
        nh: 4,
        nkv: 1,
        hd: 128,
        scale: 0.088,
    };
    attention_causal_case(c, DType::BF16, wide, 50, CAUSAL_SEQ, BF16_TOL)
}

/// LINEAR_TILE's RoPE epilogue: `m` rows at positions from a random start, heads of `hd`
/// (two heads a tile, so a device tile holds whole heads), with and without frequency
/// divisors, against the f64 RoPE of the f64 product (rounded to `dt` before the rotation, as
/// the op stores it).
fn linear_tile_rope_case(c: &Ctx<'_>, dt: DType, m: u64, k: u64, hd: u64, tol: Tol) -> CaseResult {
    let heads = 4u64;
    let n = heads * hd;
    let mut t = Tiny::new(91 + k);
    let x = t.input("x", dt, &[m, k]);
    let pos = t.input("pos", DType::I32, &[m]);
    let (w, wv) = t.weight("w", dt, &[n, k], -0.5, 0.5);
    let (fac, facv) = t.weight("fac", DType::F32, &[hd / 2], 1.0, 8.0);
    let mut outs = Vec::new();
    for (name, factors) in [("y_rope", false), ("y_rope_scaled", true)] {
        let y = t.output(name, dt, &[m, heads, hd]);
        let ct = t.counter();
        let half_rows = m as i64 / 2 + 1;
        for (mo, mt) in [(0, half_rows), (half_rows, m as i64 - half_rows)] {
            for no in [0, 2 * hd as i64] {
                let mut p = vec![
                    ("K", int(k as i64)),
                    ("m_off", int(mo)),
                    ("M_tile", int(mt)),
                    ("n_off", int(no)),
                    ("N_tile", int(2 * hd as i64)),
                    ("epilogue", int(op_linear_tile::Epilogue::Rope.code())),
                    ("head_dim", int(hd as i64)),
                    ("theta", real(10000.0)),
                ];
                let mut ins = vec![x, w, pos];
                if factors {
                    p.push(("rope_factors", int(1)));
                    ins.push(fac);
                }
                t.task_on(ct, Opcode::LINEAR_TILE, &ins, &[y], &[], &p);
            }
        }
        outs.push((name, factors));
    }
    // Small positions: ROPE's angles are f32 products (spec), which at thousands move a value
    // by more than F32_TOL from the f64 formula's.
    let make = |ins: &mut Inputs, rng: &mut SplitMix| {
        let start = (rng.next() % 40) as i64;
        let p: Vec<i64> = (start..start + m as i64).collect();
        if let Ok(pt) = Tensor::from_i64(DType::I32, &[m], &p) {
            set_input(ins, "pos", pt);
        }
    };
    check_formula(c, t, 2, tol, make, |ins| {
        let (xv, pv) = (in_vals(ins, "x")?, in_vals(ins, "pos")?);
        let s: Vec<f64> = linear(&xv, &wv, k as usize, None)
            .into_iter()
            .map(|v| amk_core::round_to(dt, v as f32) as f64)
            .collect();
        Ok(outs
            .iter()
            .map(|&(name, factors)| {
                let f: &[f64] = if factors { &facv } else { &[] };
                (name, rope_scaled(&s, &pv, hd as usize, 10000.0, f))
            })
            .collect())
    })
}

pub(super) fn op_linear_tile_rope(c: &Ctx<'_>) -> CaseResult {
    linear_tile_rope_case(c, DType::F32, 9, 24, 16, F32_TOL)?;
    linear_tile_rope_case(c, DType::BF16, 70, 96, 64, BF16_TOL)?;
    // Tasks of 151 and 149 rows: a wide device tile, then a narrow one (on sm_90a one 256-row
    // tile, its last rows outside the task).
    linear_tile_rope_case(c, DType::BF16, 300, 96, 64, BF16_TOL)
}
