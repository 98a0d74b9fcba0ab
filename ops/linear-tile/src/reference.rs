//! CPU reference of LINEAR_TILE `[x, W (, norm_w) (, bias) (, r | U | pos (, divisors))] -> y`,
//! for every row `m` in `[m_off, m_off + M_tile)` and column `n` in `[n_off, n_off + N_tile)`:
//!
//! ```text
//! xn      = x[m], or round_to(dtype(x), rmsnorm(x[m], norm_w, eps)) with norm = 1
//! s       = Σ_k xn[k] · f32(W[n, k]) (+ f32(bias[n]))    (GEMV_TILE's sum and order)
//! y[m, n] = s                                              epilogue 0
//!         = round_to(dtype(y), s) + f32(r[m, n])           epilogue 1 (residual)
//!         = silu(round_to(dtype(y), s)) · round_to(dtype(y), Σ_k xn[k] · f32(U[n, k]))
//!                                                          epilogue 2 (SwiGLU)
//!         = rope(round_to(dtype(y), s))                    epilogue 3 (RoPE at pos[m],
//!                                                          ROPE's arithmetic)
//! ```
//!
//! in f32, cast on store (the output viewed as `[rows of x, width]`): exactly what RMSNORM,
//! GEMM_TILE into activations of the output's dtype and ADD, SILU_MUL or ROPE store. Nothing
//! outside the tile is touched.

use crate::{Epilogue, Layout};
use amk_core::{CpuCall, DType, OpError, Tensor, round_to};
use op_gemv_tile::reference::{float_row_dot, non_negative, positive};
use op_rmsnorm::reference::normed_row_at;

/// The tile a task computes, from its params.
#[derive(Debug, Clone)]
struct Tile {
    k: usize,
    cols: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
}

fn tile(call: &CpuCall<'_, '_>) -> Result<Tile, OpError> {
    let k = positive(call, "K")?;
    let (n_tile, n_off) = (positive(call, "N_tile")?, non_negative(call, "n_off")?);
    let (m_tile, m_off) = (positive(call, "M_tile")?, non_negative(call, "m_off")?);
    Ok(Tile {
        k,
        cols: n_off..n_off.saturating_add(n_tile),
        rows: m_off..m_off.saturating_add(m_tile),
    })
}

fn layout(call: &CpuCall<'_, '_>) -> Result<Layout, OpError> {
    Layout::from_params(
        call.int_opt("norm")?,
        call.int_opt("flags")?,
        call.int_opt("epilogue")?,
        call.int_opt("rope_factors")?,
    )
    .ok_or_else(|| OpError::BadParam {
        key: "norm/flags/epilogue/rope_factors".into(),
        why: "norm must be 0 or 1, flags 0 or 1 (bias), epilogue 0 to 3 and rope_factors 0 or 1"
            .into(),
    })
}

fn float(t: &Tensor, role: &str) -> Result<(), OpError> {
    if matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        Ok(())
    } else {
        Err(OpError::DType(format!(
            "LINEAR_TILE: the {role} must be F32, F16 or BF16, got {}",
            t.dtype()
        )))
    }
}

fn shape(msg: String) -> OpError {
    OpError::Shape(format!("LINEAR_TILE: {msg}"))
}

/// Row `m` of `x` as the product reads it: as stored, or RMS-normalised and rounded to `x`'s
/// dtype (what an RMSNORM task stores).
fn input_row(x: &Tensor, norm: Option<(&Tensor, f32)>, m: usize, k: usize) -> Vec<f32> {
    match norm {
        Some((w, eps)) => normed_row_at(x, m, w, eps),
        None => (m * k..(m + 1) * k).map(|i| x.get_f32(i)).collect(),
    }
}

/// Runs one LINEAR_TILE task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    let l = layout(call)?;
    call.expect_arity(l.n_inputs, l.n_inputs, 1)?;
    let t = tile(call)?;
    let (x, w) = (call.input(0)?, call.input(1)?);
    float(x, "input")?;
    float(w, "weight")?;
    if x.last_dim() != t.k || w.last_dim() != t.k {
        return Err(shape(format!(
            "param K = {} must equal the last dims of the input {:?} and the weight {:?}",
            t.k,
            x.shape(),
            w.shape()
        )));
    }
    let (rows, n) = (x.numel() / t.k, w.numel() / t.k);
    if t.rows.end > rows || t.cols.end > n {
        return Err(shape(format!(
            "the tile rows {:?} x columns {:?} exceed the input's {rows} rows or the weight's {n}",
            t.rows, t.cols
        )));
    }
    let norm = match l.norm {
        Some(i) => {
            let nw = call.input(i)?;
            float(nw, "norm weight")?;
            if nw.numel() != t.k {
                return Err(shape(format!(
                    "the norm weight {:?} must hold K = {} elements",
                    nw.shape(),
                    t.k
                )));
            }
            Some((nw, call.real("eps")? as f32))
        }
        None => None,
    };
    let extra = l.extra.map(|i| call.input(i)).transpose()?;
    if let Some(e) = extra.filter(|_| l.epilogue != Epilogue::Rope) {
        float(e, "epilogue operand")?;
        if l.epilogue == Epilogue::SwiGlu && e.shape() != w.shape() {
            return Err(shape(format!(
                "the up weight {:?} must be shaped like the gate weight {:?}",
                e.shape(),
                w.shape()
            )));
        }
    }
    let bias = match l.bias {
        Some(i) => {
            let b = call.input(i)?;
            float(b, "bias")?;
            if b.numel() != n {
                return Err(shape(format!(
                    "the bias {:?} must hold the weight's {n} rows",
                    b.shape()
                )));
            }
            Some(b)
        }
        None => None,
    };
    let up = extra.filter(|_| l.epilogue == Epilogue::SwiGlu);
    let sums = products(x, &TileWeights { w, bias, up }, norm, &t)?;
    let rope = match l.epilogue {
        Epilogue::Rope => Some(Rope::new(call, &l, &t, rows)?),
        _ => None,
    };
    let residual: Option<Vec<f32>> = match (l.epilogue, extra) {
        (Epilogue::Residual, Some(r)) => Some((0..r.numel()).map(|i| r.get_f32(i)).collect()),
        _ => None,
    };
    let out = call.output(0)?;
    float(out, "output")?;
    let width = out.numel() / rows.max(1);
    if out.numel() != rows * width || t.cols.end > width {
        return Err(shape(format!(
            "the output {:?} must have the input's {rows} rows and hold columns {:?}",
            out.shape(),
            t.cols
        )));
    }
    if residual.as_ref().is_some_and(|r| r.len() != out.numel()) {
        return Err(shape(format!(
            "the residual must have the output's {} elements",
            out.numel()
        )));
    }
    let dt = out.dtype();
    let cols = t.cols.len();
    if let Some(rope) = rope {
        for (i, m) in t.rows.clone().enumerate() {
            let row: Vec<f32> = (0..cols)
                .map(|j| round_to(dt, sums[i * cols + j].0))
                .collect();
            for (j, v) in rope.rotate(&row, i).into_iter().enumerate() {
                out.set_f32(m * width + t.cols.start + j, v);
            }
        }
        return Ok(());
    }
    for (i, m) in t.rows.clone().enumerate() {
        for (j, col) in t.cols.clone().enumerate() {
            let (s, u) = sums[i * cols + j];
            let at = m * width + col;
            let v = match (l.epilogue, &residual) {
                (Epilogue::Residual, Some(r)) => round_to(dt, s) + r[at],
                (Epilogue::SwiGlu, _) => {
                    let (g, u) = (round_to(dt, s), round_to(dt, u));
                    g / (1.0 + (-g).exp()) * u
                }
                _ => s,
            };
            out.set_f32(at, v);
        }
    }
    Ok(())
}

/// The weights a tile multiplies by: `W`, its bias, and SwiGLU's up weight `U`.
struct TileWeights<'t> {
    w: &'t Tensor,
    bias: Option<&'t Tensor>,
    up: Option<&'t Tensor>,
}

/// The tile's sums `(x·W^T (+ bias), x·U^T)` (the second 0 without `U`), row-major over the
/// tile.
fn products(
    x: &Tensor,
    weights: &TileWeights<'_>,
    norm: Option<(&Tensor, f32)>,
    t: &Tile,
) -> Result<Vec<(f32, f32)>, OpError> {
    let TileWeights { w, bias, up } = *weights;
    let mut scratch = vec![0f32; t.k];
    let mut sums = Vec::with_capacity(t.rows.len() * t.cols.len());
    for m in t.rows.clone() {
        let xn = input_row(x, norm, m, t.k);
        for col in t.cols.clone() {
            let s =
                float_row_dot(&xn, w, col, &mut scratch)? + bias.map_or(0.0, |b| b.get_f32(col));
            let u = match up {
                Some(u) => float_row_dot(&xn, u, col, &mut scratch)?,
                None => 0.0,
            };
            sums.push((s, u));
        }
    }
    Ok(sums)
}

/// The RoPE epilogue's operands: each tile row's cos and sin per pair frequency, as ROPE
/// computes them.
struct Rope {
    hd: usize,
    /// `(cos, sin)` of every pair frequency, per tile row.
    trig: Vec<Vec<(f32, f32)>>,
}

impl Rope {
    fn new(call: &CpuCall<'_, '_>, l: &Layout, t: &Tile, rows: usize) -> Result<Rope, OpError> {
        let hd = positive(call, "head_dim")?;
        let theta = call.real("theta")? as f32;
        if hd % 2 != 0 || !(theta.is_finite() && theta > 0.0) {
            return Err(OpError::BadParam {
                key: "head_dim/theta".into(),
                why: format!("head_dim {hd} must be even and theta {theta} positive"),
            });
        }
        if !t.cols.start.is_multiple_of(hd) || !t.cols.len().is_multiple_of(hd) {
            return Err(shape(format!(
                "columns {:?} must be whole heads of {hd} for the RoPE epilogue",
                t.cols
            )));
        }
        let pos = call.input(l.extra.unwrap_or(0))?;
        if !pos.dtype().is_integer() || pos.numel() != rows {
            return Err(OpError::DType(format!(
                "LINEAR_TILE: the positions {} {:?} must be integers, one per row ({rows})",
                pos.dtype(),
                pos.shape()
            )));
        }
        let factors = l.factors.map(|i| call.input(i)).transpose()?;
        let freqs = op_rope::reference::scaled_inv_freq(theta, hd / 2, factors)?;
        let mut trig = Vec::with_capacity(t.rows.len());
        for m in t.rows.clone() {
            let p = pos.get_i64(m);
            if !(0..1 << 31).contains(&p) {
                return Err(OpError::IndexOutOfRange {
                    at: m,
                    value: p,
                    limit: 1 << 31,
                });
            }
            let p = p as f32;
            trig.push(
                freqs
                    .iter()
                    .map(|&f| {
                        let ang = f64::from(p * f);
                        (ang.cos() as f32, ang.sin() as f32)
                    })
                    .collect(),
            );
        }
        Ok(Rope { hd, trig })
    }

    /// Tile row `i`'s values (whole heads) rotated: ROPE's rotate-half pairs.
    fn rotate(&self, row: &[f32], i: usize) -> Vec<f32> {
        let half = self.hd / 2;
        let mut out = row.to_vec();
        for head in row.chunks(self.hd).enumerate().map(|(h, _)| h * self.hd) {
            for (k, &(c, s)) in self.trig[i].iter().enumerate() {
                let (x1, x2) = (row[head + k], row[head + k + half]);
                out[head + k] = x1 * c - x2 * s;
                out[head + k + half] = x2 * c + x1 * s;
            }
        }
        out
    }
}
