//! CPU reference of ATTENTION_TILE: GQA decode attention of `n_heads` query heads over the
//! cache rows `[kv_start, kv_start + kv_len)`.
//!
//! Layouts (operands are viewed, so flat or head-shaped tensors of the right size both work):
//! - cache `[max_seq, n_kv_heads, head_dim]`, or batched `[B, max_seq, n_kv_heads, head_dim]`
//!   (rank 4); the value cache has the key cache's layout;
//! - query `[B, n_heads, head_dim]` (`B = 1` unless the caches are rank 4);
//! - output `[B, n_heads, head_dim]`, or with `flags & 2` (a split-KV shard)
//!   `[B, n_heads, head_dim + 2]` = `[acc | m | l]` per head, un-normalised.
//!
//! Query head `h` reads kv head `h / (n_heads / n_kv_heads)`. Scores `s_j = (q·k_j)·scale`,
//! `m = max_j s_j`, `e_j = exp(s_j − m)`, `l = Σ e_j`, `acc = Σ e_j·v_j`; the normalised output
//! is `acc / l`. An empty shard (`kv_len = 0`, partial only) writes `acc = 0, m = −inf, l = 0`.
//! Everything is computed in fp32 and cast on store. No causal mask (decode).
//!
//! With a fourth input `pos` (integer, element 0 = `p`) the rows are `[kv_start, kv_start + n)`
//! with `n = min(kv_len, max(0, p + 1 − kv_start))`: the params give a static window and the
//! position clips it (crate docs). `p < 0` is [`OpError::IndexOutOfRange`]; an empty window
//! (`p < kv_start`) is an empty shard for a partial and [`OpError::BadParam`] otherwise (as
//! `kv_len = 0` is). The result is exactly the param-only task's over the same rows.

use crate::FLAG_PARTIAL_WRITE;
use amk_core::{CpuCall, OpError, Tensor};

/// A required integer param that must be `> 0` (or `>= 0` when `allow_zero`).
fn size_param(call: &CpuCall<'_, '_>, key: &str, allow_zero: bool) -> Result<usize, OpError> {
    let v = call.int(key)?;
    if v < 0 || (v == 0 && !allow_zero) {
        return Err(OpError::BadParam {
            key: key.into(),
            why: format!(
                "{v} must be {}",
                if allow_zero {
                    "non-negative"
                } else {
                    "positive"
                }
            ),
        });
    }
    usize::try_from(v).map_err(|_| OpError::BadParam {
        key: key.into(),
        why: format!("{v} does not fit this host's address space"),
    })
}

/// Checked product of sizes, as a shape error when it overflows.
fn mul(a: usize, b: usize) -> Result<usize, OpError> {
    a.checked_mul(b)
        .ok_or_else(|| OpError::Shape(format!("{a} x {b} overflows")))
}

fn require_float(t: &Tensor, role: &str) -> Result<(), OpError> {
    if t.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "ATTENTION_TILE's {role} must be floating point, got {}",
            t.dtype()
        )));
    }
    Ok(())
}

/// Runs one ATTENTION_TILE task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(3, 4, 1)?;
    let partial = call.int_opt("flags")?.unwrap_or(0) & FLAG_PARTIAL_WRITE != 0;
    let g = geometry(call, partial, (call.n_inputs() == 4).then_some(3))?;
    let (q, kc, vc) = (call.input(0)?, call.input(1)?, call.input(2)?);
    let per_head = if partial { g.hd + 2 } else { g.hd };
    let out_len = mul(g.batch, mul(g.nh, per_head)?)?;
    let out = call.output(0)?;
    require_float(out, "output")?;
    if out.numel() != out_len {
        return Err(OpError::Shape(format!(
            "the output {:?} must hold {} x {} heads x {per_head} = {out_len} elements",
            out.shape(),
            g.batch,
            g.nh
        )));
    }
    attend(&g, q, kc, vc, |i, v| out.set_f32(i, v));
    Ok(())
}

/// The checked geometry of one attention call: its params and the caches' layout.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Elements per head.
    pub hd: usize,
    /// Query heads.
    pub nh: usize,
    /// Query heads per KV head.
    pub rep: usize,
    /// Batch (1 unless the caches are rank 4).
    pub batch: usize,
    /// Elements per batch of a cache.
    pub per_batch: usize,
    /// Elements per cache row (`n_kv_heads · head_dim`).
    pub row: usize,
    /// First cache row attended to.
    pub kv_start: usize,
    /// Rows attended to (the param, clipped by the position when there is one).
    pub kv_len: usize,
    /// Score scale.
    pub scale: f32,
    /// Writes un-normalised `[acc | m | l]` partials.
    pub partial: bool,
}

/// The attention params and operands of `call` (inputs `[q, k_cache, v_cache, ..]`) checked as
/// ATTENTION_TILE checks them (`partial`: a split-KV shard, which may be empty; `pos`: the input
/// holding the position that clips the window, if any); shared with the ops that compute the
/// attention inside another op (ATTENTION_GEMV). The static checks come first, the position's
/// last (as on the device, where it is data read when the task runs).
pub fn geometry(
    call: &CpuCall<'_, '_>,
    partial: bool,
    pos: Option<usize>,
) -> Result<Geometry, OpError> {
    let (q, kc, vc) = (call.input(0)?, call.input(1)?, call.input(2)?);
    let hd = size_param(call, "head_dim", false)?;
    let nh = size_param(call, "n_heads", false)?;
    let nkv = size_param(call, "n_kv_heads", false)?;
    let kv_start = size_param(call, "kv_start", true)?;
    let kv_len = size_param(call, "kv_len", true)?;
    let scale = call.real("scale")? as f32;
    if !scale.is_finite() {
        return Err(OpError::BadParam {
            key: "scale".into(),
            why: format!("{scale} is not a finite fp32 number"),
        });
    }
    if nh % nkv != 0 {
        return Err(OpError::BadParam {
            key: "n_kv_heads".into(),
            why: format!("n_heads = {nh} is not a multiple of n_kv_heads = {nkv}"),
        });
    }
    let rep = nh / nkv;

    // Cache geometry: rows of n_kv x head_dim, optionally batched (rank 4).
    let row = mul(nkv, hd)?;
    if kc.numel() != vc.numel() {
        return Err(OpError::Shape(format!(
            "the key cache {:?} and value cache {:?} hold different element counts",
            kc.shape(),
            vc.shape()
        )));
    }
    let (batch, max_seq) = match kc.shape() {
        [b, s, _, _] => (*b as usize, *s as usize),
        _ => (1, kc.numel() / row),
    };
    let per_batch = mul(max_seq, row)?;
    if kc.numel() != mul(batch, per_batch)? {
        return Err(OpError::Shape(format!(
            "the cache {:?} is not a whole number of rows of n_kv_heads x head_dim = {row}",
            kc.shape()
        )));
    }
    if kv_len == 0 && !partial {
        return Err(OpError::BadParam {
            key: "kv_len".into(),
            why: "0 rows attend to nothing (only a partial-write shard may be empty)".into(),
        });
    }
    let end = kv_start.saturating_add(kv_len);
    if end > max_seq {
        return Err(OpError::BadParam {
            key: "kv_len".into(),
            why: format!("cache rows [{kv_start}, {end}) exceed the cache's {max_seq} rows"),
        });
    }
    let q_per_batch = mul(nh, hd)?;
    if q.numel() != mul(batch, q_per_batch)? {
        return Err(OpError::Shape(format!(
            "the query {:?} must hold {batch} x {nh} heads x {hd} = {} elements",
            q.shape(),
            batch * q_per_batch
        )));
    }
    require_float(q, "query")?;
    let kv_len = match pos {
        None => kv_len,
        Some(i) => {
            let p = position(call, i)?;
            let n = clipped_len(kv_start, kv_len, p);
            if n == 0 && !partial {
                return Err(OpError::BadParam {
                    key: "kv_start".into(),
                    why: format!(
                        "position {p} is before the window's first row {kv_start}: no rows to \
                         attend to (only a partial-write shard may be empty)"
                    ),
                });
            }
            n
        }
    };
    Ok(Geometry {
        hd,
        nh,
        rep,
        batch,
        per_batch,
        row,
        kv_start,
        kv_len,
        scale,
        partial,
    })
}

/// Exclusive upper bound of a position (they are int32 on the device).
const POSITION_LIMIT: u64 = 1 << 31;

/// Element 0 of the position buffer, input `i`: a non-empty integer buffer holding a
/// non-negative position (`OpError::DType`, `OpError::IndexOutOfRange` otherwise).
pub fn position(call: &CpuCall<'_, '_>, i: usize) -> Result<u64, OpError> {
    let t = call.input(i)?;
    if !t.dtype().is_integer() || t.numel() == 0 {
        return Err(OpError::DType(format!(
            "the position buffer must be a non-empty integer buffer, got {} {:?}",
            t.dtype(),
            t.shape()
        )));
    }
    let p = t.get_i64(0);
    u64::try_from(p)
        .ok()
        .filter(|&p| p < POSITION_LIMIT)
        .ok_or(OpError::IndexOutOfRange {
            at: 0,
            value: p,
            limit: POSITION_LIMIT,
        })
}

/// Rows of the window `[kv_start, kv_start + kv_len)` at or before position `p`:
/// `min(kv_len, max(0, p + 1 − kv_start))`.
pub fn clipped_len(kv_start: usize, kv_len: usize, p: u64) -> usize {
    let upto = usize::try_from(p.saturating_add(1)).unwrap_or(usize::MAX);
    upto.saturating_sub(kv_start).min(kv_len)
}

/// Elements `[start, start + len)` of `t` as f32: borrowed from an F32 tensor, converted
/// otherwise.
fn f32_range(t: &Tensor, start: usize, len: usize) -> std::borrow::Cow<'_, [f32]> {
    match t.as_f32() {
        Some(all) => std::borrow::Cow::Borrowed(&all[start..start + len]),
        None => std::borrow::Cow::Owned((start..start + len).map(|i| t.get_f32(i)).collect()),
    }
}

/// The attention of `g` over the operands, in fp32: `emit(i, v)` receives element `i` of the
/// output layout (`[B, n_heads, head_dim]`, or `[B, n_heads, head_dim + 2]` partials), each
/// once, before any cast.
pub fn attend(
    g: &Geometry,
    q: &Tensor,
    kc: &Tensor,
    vc: &Tensor,
    mut emit: impl FnMut(usize, f32),
) {
    let (hd, nh) = (g.hd, g.nh);
    let per_head = if g.partial { hd + 2 } else { hd };
    let qv = q.to_f32_vec();
    let mut scores = vec![0f32; g.kv_len];
    let mut acc = vec![0f32; hd];
    for b in 0..g.batch {
        // Only the window's rows: a decode step attends to the rows written so far, a sliver
        // of a long cache.
        let first = b * g.per_batch + g.kv_start * g.row;
        let (kv, vv) = (
            f32_range(kc, first, g.kv_len * g.row),
            f32_range(vc, first, g.kv_len * g.row),
        );
        for h in 0..nh {
            let qh = &qv[(b * nh + h) * hd..][..hd];
            let kvh = h / g.rep;
            // Offset in the window of (cache row kv_start + j, kv head kvh).
            let at = |j: usize| j * g.row + kvh * hd;
            let mut m = f32::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                let k = &kv[at(j)..][..hd];
                let dot: f32 = qh.iter().zip(k).map(|(a, b)| a * b).sum();
                *s = dot * g.scale;
                m = m.max(*s);
            }
            acc.fill(0.0);
            let mut l = 0f32;
            for (j, &s) in scores.iter().enumerate() {
                let e = (s - m).exp();
                l += e;
                for (a, v) in acc.iter_mut().zip(&vv[at(j)..][..hd]) {
                    *a += e * v;
                }
            }
            let base = (b * nh + h) * per_head;
            if g.partial {
                for (d, &a) in acc.iter().enumerate() {
                    emit(base + d, a);
                }
                emit(base + hd, m);
                emit(base + hd + 1, l);
            } else {
                for (d, &a) in acc.iter().enumerate() {
                    emit(base + d, a / l);
                }
            }
        }
    }
}
