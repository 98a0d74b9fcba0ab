//! The f64 formulas the cases check against, written here independently of the ops'
//! reference implementations.

use super::tiny::{int, real};
use amk_core::json::Value;

pub(super) fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

pub(super) fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// `eps` as the device carries it (an f32).
fn eps32(eps: f64) -> f64 {
    eps as f32 as f64
}

pub(super) fn rmsnorm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let h = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(h) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps32(eps)).sqrt();
        out.extend(row.iter().zip(w).map(|(v, wj)| v * inv * wj));
    }
    out
}

pub(super) fn layernorm(x: &[f64], w: &[f64], b: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let h = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(h) {
        let mean = row.iter().sum::<f64>() / h as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
        let r = 1.0 / (var + eps32(eps)).sqrt();
        for (j, v) in row.iter().enumerate() {
            out.push((v - mean) * r * w[j] + b.map_or(0.0, |b| b[j]));
        }
    }
    out
}

/// `x[M, K] @ w[N, K]^T (+ bias[N]) -> [M, N]`.
pub(super) fn linear(x: &[f64], w: &[f64], k: usize, bias: Option<&[f64]>) -> Vec<f64> {
    let n = w.len() / k;
    let mut out = Vec::new();
    for row in x.chunks(k) {
        for j in 0..n {
            let dot: f64 = row
                .iter()
                .zip(&w[j * k..(j + 1) * k])
                .map(|(a, b)| a * b)
                .sum();
            out.push(dot + bias.map_or(0.0, |b| b[j]));
        }
    }
    out
}

/// Softmax of every run of `n` consecutive elements.
pub(super) fn softmax_rows(x: &[f64], n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        out.extend(row.iter().map(|v| (v - m).exp() / s));
    }
    out
}

/// Rotate-half RoPE of `rows` rows (one position each) of whole heads of `hd`.
pub(super) fn rope(x: &[f64], pos: &[f64], hd: usize, theta: f64) -> Vec<f64> {
    rope_scaled(x, pos, hd, theta, &[])
}

/// [`rope`] with frequency `i` divided by `factors[i]` (none: all 1).
pub(super) fn rope_scaled(
    x: &[f64],
    pos: &[f64],
    hd: usize,
    theta: f64,
    factors: &[f64],
) -> Vec<f64> {
    let mut out = x.to_vec();
    let rows = pos.len();
    let row_len = x.len() / rows.max(1);
    let half = hd / 2;
    for (r, &p) in pos.iter().enumerate() {
        for head in 0..row_len / hd {
            let base = r * row_len + head * hd;
            for i in 0..half {
                let f = factors.get(i).copied().unwrap_or(1.0);
                let ang = p * theta.powf(-(i as f64) / half as f64) / f;
                let (c, s) = (ang.cos(), ang.sin());
                let (x1, x2) = (x[base + i], x[base + i + half]);
                out[base + i] = x1 * c - x2 * s;
                out[base + i + half] = x2 * c + x1 * s;
            }
        }
    }
    out
}

/// Geometry of a decode attention over a `[max_seq, nkv, hd]` cache.
#[derive(Clone, Copy)]
pub(super) struct Attn {
    pub(super) nh: usize,
    pub(super) nkv: usize,
    pub(super) hd: usize,
    pub(super) scale: f64,
}

/// The attention params of an ATTENTION_TILE or ATTENTION_GEMV task of geometry `a` over cache
/// rows `[start, start + len)`.
pub(super) fn attention_params(a: Attn, start: usize, len: usize) -> Vec<(&'static str, Value)> {
    vec![
        ("head_dim", int(a.hd as i64)),
        ("kv_start", int(start as i64)),
        ("kv_len", int(len as i64)),
        ("scale", real(a.scale)),
        ("n_heads", int(a.nh as i64)),
        ("n_kv_heads", int(a.nkv as i64)),
    ]
}

/// Un-normalised `(acc, m, l)` of every head over cache rows `[start, start + len)`.
pub(super) fn attention_partial(
    a: Attn,
    q: &[f64],
    kc: &[f64],
    vc: &[f64],
    start: usize,
    len: usize,
) -> Vec<(Vec<f64>, f64, f64)> {
    let rep = a.nh / a.nkv;
    let row = a.nkv * a.hd;
    (0..a.nh)
        .map(|h| {
            let qh = &q[h * a.hd..(h + 1) * a.hd];
            let at = |j: usize| (start + j) * row + (h / rep) * a.hd;
            let s: Vec<f64> = (0..len)
                .map(|j| {
                    qh.iter()
                        .zip(&kc[at(j)..at(j) + a.hd])
                        .map(|(x, y)| x * y)
                        .sum::<f64>()
                        * a.scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut acc = vec![0.0; a.hd];
            let mut l = 0.0;
            for (j, &sj) in s.iter().enumerate() {
                let e = (sj - m).exp();
                l += e;
                for (d, v) in vc[at(j)..at(j) + a.hd].iter().enumerate() {
                    acc[d] += e * v;
                }
            }
            (acc, m, l)
        })
        .collect()
}

/// Normalised attention output `[nh, hd]`.
pub(super) fn attention(
    a: Attn,
    q: &[f64],
    kc: &[f64],
    vc: &[f64],
    start: usize,
    len: usize,
) -> Vec<f64> {
    attention_partial(a, q, kc, vc, start, len)
        .into_iter()
        .flat_map(|(acc, _, l)| acc.into_iter().map(move |x| x / l))
        .collect()
}

/// `[acc | m | l]` per head, as a partial-write shard lays it out.
pub(super) fn partial_layout(parts: &[(Vec<f64>, f64, f64)]) -> Vec<f64> {
    parts
        .iter()
        .flat_map(|(acc, m, l)| acc.iter().copied().chain([*m, *l]))
        .collect()
}

/// ATTENTION_COMBINE of `[heads, hd + 2]` partials.
pub(super) fn combine(parts: &[Vec<f64>], hd: usize) -> Vec<f64> {
    let stride = hd + 2;
    let heads = parts.first().map_or(0, |p| p.len() / stride);
    let mut out = Vec::with_capacity(heads * hd);
    for h in 0..heads {
        let b = h * stride;
        let m = parts
            .iter()
            .map(|p| p[b + hd])
            .fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = parts
            .iter()
            .map(|p| {
                if p[b + hd + 1] > 0.0 {
                    (p[b + hd] - m).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let l: f64 = parts.iter().zip(&w).map(|(p, w)| p[b + hd + 1] * w).sum();
        for d in 0..hd {
            let acc: f64 = parts.iter().zip(&w).map(|(p, w)| p[b + d] * w).sum();
            out.push(acc / l.max(1e-20));
        }
    }
    out
}

pub(super) fn argmax_rows(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .map(|row| {
            let mut best = 0;
            for (j, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = j;
                }
            }
            best as f64
        })
        .collect()
}

/// Each run of `n` logits' `ln Σ exp(x) - x[t]` for its target `t` (one a row).
pub(super) fn token_nll(x: &[f64], targets: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .zip(targets)
        .map(|(row, &t)| {
            let s: f64 = row.iter().map(|v| v.exp()).sum();
            s.ln() - row[t as usize]
        })
        .collect()
}
