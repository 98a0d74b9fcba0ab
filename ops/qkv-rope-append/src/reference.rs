//! CPU reference of QKV_ROPE_APPEND `[x, Wq, Wk, Wv, pos (, norm_w) (, factors)] -> [q, kcache,
//! vcache]`.
//!
//! For every pair `(u, u + 1)` of the tile's units (crate docs: head `h = u div head_dim`,
//! rows `r = h_local·head_dim + i` and `r + half`, `i = (u mod head_dim) div 2`,
//! `half = head_dim / 2`), with `xn` = `x` or its RMS-normalised row (RMSNORM's reference,
//! rounded to `x`'s dtype):
//!
//! ```text
//! a, b = round_to(dtype(dst), Σ_k xn[k]·W[r, k]), round_to(dtype(dst), Σ_k xn[k]·W[r + half, k])
//! qk_norm, Q and K heads: each head's head_dim values (a, b of its pairs) become RMSNORM's row
//!              with the q or k norm weight, rounded to dtype(dst) (op_rmsnorm::reference::rms_row)
//! Q, K heads:  ang = f32(pos) · inv_freq[i];  c, s = cos/sin(ang) (f64, rounded to f32)
//!              (inv_freq[i] / factors[i] with frequency factors, as ROPE)
//!              dst[r] = a·c − b·s,  dst[r + half] = b·c + a·s        (fp32, as ROPE)
//! V heads:     dst[r] = a,          dst[r + half] = b
//! ```
//!
//! `dst` is `q` (element `r`), or the K/V cache at row `pos` (element `pos·n_kv·head_dim + r`),
//! `pos` being element 0 of the integer input `pos`; a position outside the caches is
//! [`OpError::IndexOutOfRange`].
//! Nothing else is touched: the caches keep every other row. Exactly what RMSNORM, the Q/K/V
//! GEMV_TILEs, the reshape, ROPE and KV_APPEND of the unfused program compute.

use amk_core::{CpuCall, OpError, Tensor, round_to};
use op_gemv_tile::reference::{float_row_dot, non_negative, positive};
use op_rmsnorm::reference::{fused_input, rms_row};
use op_rmsnorm_gemv::reference::{float_operand, tile_end};
use op_rope::reference::scaled_inv_freq;

/// Where a unit's pair lands: output index (0 = q, 1 = kcache, 2 = vcache), the row `r` of
/// its projection (the pair is `r`, `r + half`) and the pair's frequency index `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    /// 0 = Q, 1 = K, 2 = V.
    pub proj: usize,
    /// Row of the projection's weight (and element of its destination head row).
    pub row: usize,
    /// Frequency index, `0 ≤ i < head_dim / 2`.
    pub i: usize,
}

/// The pair that unit `u` (even) starts, for `n_heads` Q heads and `n_kv` K and V heads.
pub fn pair_of(u: usize, head_dim: usize, n_heads: usize, n_kv: usize) -> Pair {
    let (head, i) = (u / head_dim, (u % head_dim) / 2);
    let (proj, local) = if head < n_heads {
        (0, head)
    } else if head < n_heads + n_kv {
        (1, head - n_heads)
    } else {
        (2, head - n_heads - n_kv)
    };
    Pair {
        proj,
        row: local * head_dim + i,
        i,
    }
}

/// Runs one QKV_ROPE_APPEND task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(5, 8, 3)?;
    let o = crate::Options {
        rope_factors: flag(call, "rope_factors")?,
        qk_norm: flag(call, "qk_norm")?,
    };
    let opt = crate::optional_inputs(call.n_inputs(), o).ok_or_else(|| OpError::Arity {
        what: "inputs",
        expected: format!(
            "{}..{} with rope_factors = {} and qk_norm = {}",
            5 + usize::from(o.rope_factors) + 2 * usize::from(o.qk_norm),
            6 + usize::from(o.rope_factors) + 2 * usize::from(o.qk_norm),
            u8::from(o.rope_factors),
            u8::from(o.qk_norm)
        ),
        got: call.n_inputs(),
    })?;
    let k = positive(call, "K")?;
    let n_tile = positive(call, "N_tile")?;
    let n_off = non_negative(call, "n_off")?;
    let hd = positive(call, "head_dim")?;
    let nh = positive(call, "n_heads")?;
    let nkv = positive(call, "n_kv_heads")?;
    let theta = call.real("theta")? as f32;
    if hd % 2 != 0 {
        return Err(OpError::BadParam {
            key: "head_dim".into(),
            why: format!("{hd} must be even (RoPE rotates pairs)"),
        });
    }
    if !(theta.is_finite() && theta > 0.0) {
        return Err(OpError::BadParam {
            key: "theta".into(),
            why: format!("{theta} must be a positive finite fp32 number"),
        });
    }
    if n_off % 2 != 0 || n_tile % 2 != 0 {
        return Err(OpError::BadParam {
            key: "n_off".into(),
            why: format!("n_off = {n_off} and N_tile = {n_tile} must be even (whole RoPE pairs)"),
        });
    }
    if o.qk_norm && (n_off % hd != 0 || n_tile % hd != 0) {
        return Err(OpError::BadParam {
            key: "n_off".into(),
            why: format!(
                "with qk_norm a tile holds whole heads: n_off = {n_off} and N_tile = {n_tile} must be multiples of head_dim = {hd}"
            ),
        });
    }
    let positions = call.input(4)?;
    if !positions.dtype().is_integer() || positions.numel() == 0 {
        return Err(OpError::DType(format!(
            "QKV_ROPE_APPEND: the position buffer must be a non-empty integer buffer, got {} {:?}",
            positions.dtype(),
            positions.shape()
        )));
    }
    let pos_value = positions.get_i64(0);
    let xn = fused_input(call, opt.norm, k)?;
    let rows = [nh * hd, nkv * hd, nkv * hd];
    let mut ws: Vec<&Tensor> = Vec::with_capacity(3);
    for (j, &want) in rows.iter().enumerate() {
        let w = call.input(j + 1)?;
        float_operand(w, "weight")?;
        if w.last_dim() != k || w.numel() != want * k {
            return Err(OpError::Shape(format!(
                "QKV_ROPE_APPEND: weight {j} {:?} must be [{want}, K = {k}]",
                w.shape()
            )));
        }
        ws.push(w);
    }
    let end = tile_end(n_off, n_tile, (nh + 2 * nkv) * hd, "Q/K/V output rows")?;
    let mut scratch = vec![0.0f32; k];
    let mut sums = Vec::with_capacity(n_tile / 2);
    for u in (n_off..end).step_by(2) {
        let p = pair_of(u, hd, nh, nkv);
        let a = float_row_dot(&xn, ws[p.proj], p.row, &mut scratch)?;
        let b = float_row_dot(&xn, ws[p.proj], p.row + hd / 2, &mut scratch)?;
        sums.push((p, a, b));
    }
    let dts = [
        call.output(0)?.dtype(),
        call.output(1)?.dtype(),
        call.output(2)?.dtype(),
    ];
    for (p, a, b) in sums.iter_mut() {
        (*a, *b) = (round_to(dts[p.proj], *a), round_to(dts[p.proj], *b));
    }
    if let Some(qk) = opt.qk_norm {
        let eps = call.real("eps")? as f32 as f64;
        let weights = [head_weight(call, qk.q, hd)?, head_weight(call, qk.k, hd)?];
        normalize_heads(&mut sums, hd, &weights, eps, &dts);
    }
    let factors = match opt.factors {
        Some(i) => Some(call.input(i)?),
        None => None,
    };
    let freqs = scaled_inv_freq(theta, hd / 2, factors)?;
    let row_len = nkv * hd;
    for (j, want) in [nh * hd, 0, 0].into_iter().enumerate() {
        let out = call.output(j)?;
        float_operand(out, "output")?;
        if j == 0 && out.numel() != want {
            return Err(OpError::Shape(format!(
                "QKV_ROPE_APPEND: q {:?} must hold n_heads·head_dim = {want} elements",
                out.shape()
            )));
        }
        if j > 0 && (out.numel() % row_len != 0 || out.numel() < row_len) {
            return Err(OpError::Shape(format!(
                "QKV_ROPE_APPEND: the cache {:?} is not rows of {row_len} elements",
                out.shape()
            )));
        }
    }
    let rows_in_cache = (call.output(1)?.numel() / row_len).min(call.output(2)?.numel() / row_len);
    let pos = usize::try_from(pos_value)
        .ok()
        .filter(|&p| p < rows_in_cache)
        .ok_or(OpError::IndexOutOfRange {
            at: 0,
            value: pos_value,
            limit: rows_in_cache as u64,
        })?;
    for (p, a, b) in sums {
        let out = call.output(p.proj)?;
        let (ya, yb) = if p.proj < 2 {
            let ang = (pos as f32 * freqs[p.i]) as f64;
            let (c, s) = (ang.cos() as f32, ang.sin() as f32);
            (a * c - b * s, b * c + a * s)
        } else {
            (a, b)
        };
        let base = if p.proj == 0 { 0 } else { pos * row_len };
        out.set_f32(base + p.row, ya);
        out.set_f32(base + p.row + hd / 2, yb);
    }
    Ok(())
}

/// Param `key`: absent or 0 is false, 1 true, anything else a [`OpError::BadParam`].
fn flag(call: &CpuCall<'_, '_>, key: &str) -> Result<bool, OpError> {
    match call.int_opt(key)? {
        None | Some(0) => Ok(false),
        Some(1) => Ok(true),
        Some(v) => Err(OpError::BadParam {
            key: key.into(),
            why: format!("{v} must be 0 or 1"),
        }),
    }
}

/// A per-head norm weight (input `i`, `head_dim` float elements), widened to f64.
fn head_weight(call: &CpuCall<'_, '_>, i: usize, hd: usize) -> Result<Vec<f64>, OpError> {
    let w = call.input(i)?;
    float_operand(w, "q/k norm weight")?;
    if w.numel() != hd {
        return Err(OpError::Shape(format!(
            "QKV_ROPE_APPEND: the q/k norm weight {:?} must hold head_dim = {hd} elements",
            w.shape()
        )));
    }
    Ok((0..hd).map(|j| w.get_f32(j) as f64).collect())
}

/// Qwen3's per-head RMSNorm of the tile's Q and K heads (whole heads: the caller checked),
/// in place on the rounded pair sums: RMSNORM's row (`op_rmsnorm::reference::rms_row`) over
/// each head's `head_dim` values in element order, rounded to the destination's dtype, as the
/// unfused program's RMSNORM task stores it for ROPE to read. V heads are left alone.
fn normalize_heads(
    sums: &mut [(Pair, f32, f32)],
    hd: usize,
    weights: &[Vec<f64>; 2],
    eps: f64,
    dts: &[amk_core::DType; 3],
) {
    let half = hd / 2;
    let (mut row, mut y) = (vec![0.0f64; hd], vec![0.0f32; hd]);
    for head in sums.chunks_mut(half) {
        let proj = head[0].0.proj;
        if proj == 2 {
            continue;
        }
        for (p, a, b) in head.iter() {
            (row[p.i], row[p.i + half]) = (*a as f64, *b as f64);
        }
        rms_row(&row, &weights[proj], eps, &mut y);
        for (p, a, b) in head.iter_mut() {
            (*a, *b) = (
                round_to(dts[proj], y[p.i]),
                round_to(dts[proj], y[p.i + half]),
            );
        }
    }
}
