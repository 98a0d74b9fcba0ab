//! CPU reference of ATTENTION_COMBINE: merges `P` split-KV partials into the normalised
//! attention output.
//!
//! Each input is viewed as `[heads, head_dim + 2]` = `[acc | m | l]` per head (as
//! ATTENTION_TILE writes with `flags & 2`), the output as `[heads, head_dim]`, where
//! `heads = out.numel / head_dim` (a batch of `B` sequences is simply `B · n_heads` heads).
//! Per head: `m = max_p m_p`; `w_p = exp(m_p − m)` if `l_p > 0`, else 0;
//! `l = Σ_p l_p·w_p`; `out = (Σ_p acc_p·w_p) / max(l, 1e−20)`. So a shard that saw no rows
//! (`l = 0`, `m = −inf`) contributes nothing, and if every shard is empty the output is 0.
//! Computed in fp32, cast on store.

use amk_core::{CpuCall, OpError};

/// The floor of the combined denominator.
const MIN_DENOMINATOR: f32 = 1e-20;

/// Runs one ATTENTION_COMBINE task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 8, 1)?;
    let hd = call.int("head_dim")?;
    if hd <= 0 {
        return Err(OpError::BadParam {
            key: "head_dim".into(),
            why: format!("{hd} must be positive"),
        });
    }
    let hd = usize::try_from(hd).map_err(|_| OpError::BadParam {
        key: "head_dim".into(),
        why: format!("{hd} does not fit this host's address space"),
    })?;
    let n_heads = call.int_opt("n_heads")?;
    let parts = (0..call.n_inputs())
        .map(|i| call.input(i))
        .collect::<Result<Vec<_>, _>>()?;
    let out = call.output(0)?;
    if out.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "ATTENTION_COMBINE's output must be floating point, got {}",
            out.dtype()
        )));
    }
    if out.numel() % hd != 0 {
        return Err(OpError::Shape(format!(
            "the output {:?} is not a whole number of heads of head_dim = {hd}",
            out.shape()
        )));
    }
    let heads = out.numel() / hd;
    if let Some(nh) = n_heads
        && (usize::try_from(nh).ok() != Some(heads) || nh == 0)
    {
        return Err(OpError::BadParam {
            key: "n_heads".into(),
            why: format!("{nh}, but the output {:?} holds {heads} heads", out.shape()),
        });
    }
    let stride = hd + 2;
    let want = heads
        .checked_mul(stride)
        .ok_or_else(|| OpError::Shape(format!("{heads} heads x {stride} overflows")))?;
    for (p, part) in parts.iter().enumerate() {
        if part.numel() != want {
            return Err(OpError::Shape(format!(
                "partial {p} {:?} must hold {heads} heads x (head_dim + 2) = {want} elements \
                 ([acc | m | l] per head), has {}",
                part.shape(),
                part.numel()
            )));
        }
    }

    let vals: Vec<Vec<f32>> = parts.iter().map(|t| t.to_f32_vec()).collect();
    let mut weights = vec![0f32; vals.len()];
    for h in 0..heads {
        let base = h * stride;
        let m = vals
            .iter()
            .map(|v| v[base + hd])
            .fold(f32::NEG_INFINITY, f32::max);
        let mut l = 0f32;
        for (w, v) in weights.iter_mut().zip(&vals) {
            let (m_p, l_p) = (v[base + hd], v[base + hd + 1]);
            *w = if l_p > 0.0 { (m_p - m).exp() } else { 0.0 };
            l += l_p * *w;
        }
        let denom = l.max(MIN_DENOMINATOR);
        for d in 0..hd {
            let acc: f32 = weights
                .iter()
                .zip(&vals)
                .map(|(w, v)| if *w == 0.0 { 0.0 } else { v[base + d] * w })
                .sum();
            out.set_f32(h * hd + d, acc / denom);
        }
    }
    Ok(())
}
