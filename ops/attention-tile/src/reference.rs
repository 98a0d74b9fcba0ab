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
//! Everything is computed in fp32 and cast on store. No causal mask (decode); a fourth input
//! is accepted and ignored.

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
    let partial = call.int_opt("flags")?.unwrap_or(0) & FLAG_PARTIAL_WRITE != 0;
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
    let per_head = if partial { hd + 2 } else { hd };
    let out_len = mul(batch, mul(nh, per_head)?)?;
    let out = call.output(0)?;
    require_float(out, "output")?;
    if out.numel() != out_len {
        return Err(OpError::Shape(format!(
            "the output {:?} must hold {batch} x {nh} heads x {per_head} = {out_len} elements",
            out.shape()
        )));
    }

    let (qv, kv, vv) = (q.to_f32_vec(), kc.to_f32_vec(), vc.to_f32_vec());
    let mut scores = vec![0f32; kv_len];
    let mut acc = vec![0f32; hd];
    for b in 0..batch {
        for h in 0..nh {
            let qh = &qv[(b * nh + h) * hd..][..hd];
            let kvh = h / rep;
            // Element offset of (batch b, cache row j, kv head kvh).
            let at = |j: usize| b * per_batch + (kv_start + j) * row + kvh * hd;
            let mut m = f32::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                let k = &kv[at(j)..][..hd];
                let dot: f32 = qh.iter().zip(k).map(|(a, b)| a * b).sum();
                *s = dot * scale;
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
            if partial {
                for (d, &a) in acc.iter().enumerate() {
                    out.set_f32(base + d, a);
                }
                out.set_f32(base + hd, m);
                out.set_f32(base + hd + 1, l);
            } else {
                for (d, &a) in acc.iter().enumerate() {
                    out.set_f32(base + d, a / l);
                }
            }
        }
    }
    Ok(())
}
