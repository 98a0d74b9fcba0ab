//! CPU reference of ATTENTION_SPLIT `[q, k_cache, v_cache, pos] -> partials`.
//!
//! The task is split `s` of KV head `g` (`n_off / N_tile = g · n_splits + s`); at position
//! `p` it attends the rows [`split_rows`]`(p, s, n_splits, chunk)` for each query head
//! `h = g · rep + r` (`r < rep`) exactly as ATTENTION_TILE's reference does: scores
//! `s_j = (q_h · k_j) · scale`, `m = max_j s_j`, `e_j = exp(s_j − m)`, `l = Σ e_j`,
//! `acc = Σ e_j · v_j`, in fp32, rows in order. It writes `[acc | m | l]` of head `r` at
//! `n_off + r · (head_dim + 2)`. An inactive split (no rows) writes nothing. A position
//! outside the cache is [`OpError::IndexOutOfRange`].
//!
//! Normalised ([`crate::FLAG_NORMALIZED`], one split a KV head): it writes `acc / l` of head
//! `r` at `n_off + r · head_dim` of the attention row instead (ATTENTION_TILE's output),
//! rounded to the row's dtype.

use crate::{SplitGeometry, SplitTask, split_rows};
use amk_core::{CpuCall, OpError, Tensor};
use op_gemv_tile::reference::{non_negative, positive};

/// The split params of `call` (ATTENTION_SPLIT's or COMBINE_GEMV's), checked as the validator
/// checks them.
pub fn split_geometry(call: &CpuCall<'_, '_>) -> Result<SplitGeometry, OpError> {
    let g = SplitGeometry {
        hd: positive(call, "head_dim")? as u64,
        nh: positive(call, "n_heads")? as u64,
        nkv: positive(call, "n_kv_heads")? as u64,
        n_splits: positive(call, "n_splits")? as u64,
        chunk: positive(call, "chunk")? as u64,
    };
    if !g.nh.is_multiple_of(g.nkv) {
        return Err(OpError::BadParam {
            key: "n_kv_heads".into(),
            why: format!(
                "n_heads = {} is not a multiple of n_kv_heads = {}",
                g.nh, g.nkv
            ),
        });
    }
    if g.n_splits > crate::MAX_SPLITS as u64 {
        return Err(OpError::BadParam {
            key: "n_splits".into(),
            why: format!("{} exceeds {}", g.n_splits, crate::MAX_SPLITS),
        });
    }
    Ok(g)
}

/// The partials operand of `g`: F32 with `g.partials_len()` elements.
pub fn check_partials(t: &Tensor, g: &SplitGeometry) -> Result<(), OpError> {
    if t.dtype() != amk_core::DType::F32 {
        return Err(OpError::DType(format!(
            "the partials must be F32, got {}",
            t.dtype()
        )));
    }
    if t.numel() as u64 != g.partials_len() {
        return Err(OpError::Shape(format!(
            "the partials {:?} must hold n_kv_heads x n_splits x rep x (head_dim + 2) = {} elements",
            t.shape(),
            g.partials_len()
        )));
    }
    Ok(())
}

/// The position (element 0 of input `i`), which must name a row of a cache of `rows` rows.
pub fn position_in(call: &CpuCall<'_, '_>, i: usize, rows: u64) -> Result<u64, OpError> {
    let p = op_attention_tile::reference::position(call, i)?;
    if p >= rows {
        return Err(OpError::IndexOutOfRange {
            at: 0,
            value: p as i64,
            limit: rows,
        });
    }
    Ok(p)
}

/// Runs one ATTENTION_SPLIT task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(4, 4, 1)?;
    let g = split_geometry(call)?;
    let scale = call.real("scale")? as f32;
    if !scale.is_finite() {
        return Err(OpError::BadParam {
            key: "scale".into(),
            why: format!("{scale} is not finite"),
        });
    }
    let flags = call.int_opt("flags")?.unwrap_or(0);
    if flags & !crate::FLAG_NORMALIZED != 0 {
        return Err(OpError::BadParam {
            key: "flags".into(),
            why: format!("{flags}: only bit 0 (normalised rows) is defined"),
        });
    }
    let normalized = flags & crate::FLAG_NORMALIZED != 0;
    if normalized && g.n_splits != 1 {
        return Err(OpError::BadParam {
            key: "n_splits".into(),
            why: format!(
                "normalised rows need one split a KV head, got {}",
                g.n_splits
            ),
        });
    }
    let tile = if normalized {
        g.normalized_tile()
    } else {
        g.tile()
    };
    let n_tile = positive(call, "N_tile")? as u64;
    let n_off = non_negative(call, "n_off")? as u64;
    if n_tile != tile || !n_off.is_multiple_of(n_tile) || n_off / n_tile >= g.nkv * g.n_splits {
        return Err(OpError::BadParam {
            key: "n_off".into(),
            why: format!(
                "N_tile = {n_tile}, n_off = {n_off}: a task is one KV head's split, N_tile = \
                 {tile} at n_off = (kv_head x {} + split) x N_tile",
                g.n_splits
            ),
        });
    }
    let (q, kc, vc) = (call.input(0)?, call.input(1)?, call.input(2)?);
    let row = g.nkv * g.hd;
    if q.dtype().is_integer() || kc.dtype().is_integer() || vc.dtype().is_integer() {
        return Err(OpError::DType(
            "the query and the caches must be floating point".into(),
        ));
    }
    if q.numel() as u64 != g.nh * g.hd
        || kc.numel() != vc.numel()
        || !(kc.numel() as u64).is_multiple_of(row)
    {
        return Err(OpError::Shape(format!(
            "query {:?} and caches {:?}/{:?} do not fit {} heads of {} and rows of {row}",
            q.shape(),
            kc.shape(),
            vc.shape(),
            g.nh,
            g.hd
        )));
    }
    let rows = kc.numel() as u64 / row;
    let p = position_in(call, 3, rows)?;
    let SplitTask { kv_head, split } = SplitTask::of(n_off, n_tile, g.n_splits);
    let span = split_rows(p, split, g.n_splits, g.chunk);
    if normalized {
        check_row(call.output(0)?, &g)?;
    } else {
        check_partials(call.output(0)?, &g)?;
    }
    if span.len == 0 {
        return Ok(());
    }
    let mut parts = vec![0f32; g.tile() as usize];
    attend_group(
        &GroupCall {
            q,
            kc,
            vc,
            g: &g,
            kv_head,
            span,
            scale,
        },
        &mut parts,
    );
    let out = call.output(0)?;
    if normalized {
        let hd = g.hd as usize;
        for (r, head) in parts.chunks_exact(hd + 2).enumerate() {
            let l = head[hd + 1];
            for (d, &acc) in head[..hd].iter().enumerate() {
                out.set_f32(n_off as usize + r * hd + d, acc / l);
            }
        }
        return Ok(());
    }
    for (i, &v) in parts.iter().enumerate() {
        out.set_f32(n_off as usize + i, v);
    }
    Ok(())
}

/// The normalised output of `g`: a float row of `n_heads · head_dim` elements.
fn check_row(t: &Tensor, g: &SplitGeometry) -> Result<(), OpError> {
    if t.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "the attention row must be floating point, got {}",
            t.dtype()
        )));
    }
    if t.numel() as u64 != g.nh * g.hd {
        return Err(OpError::Shape(format!(
            "the attention row {:?} must hold n_heads x head_dim = {} elements",
            t.shape(),
            g.nh * g.hd
        )));
    }
    Ok(())
}

/// One KV head's attention over a span of rows.
struct GroupCall<'a> {
    q: &'a Tensor,
    kc: &'a Tensor,
    vc: &'a Tensor,
    g: &'a SplitGeometry,
    kv_head: u64,
    span: crate::SplitRows,
    scale: f32,
}

/// `[acc | m | l]` of each query head of the group into `parts` (`rep · (hd + 2)`), reading
/// only the span's rows of the KV head.
fn attend_group(a: &GroupCall<'_>, parts: &mut [f32]) {
    let (hd, rep) = (a.g.hd as usize, a.g.rep() as usize);
    let row = (a.g.nkv * a.g.hd) as usize;
    let at = |j: u64| (a.span.start + j) as usize * row + a.kv_head as usize * hd;
    let rows = |t: &Tensor| -> Vec<Vec<f32>> {
        (0..a.span.len)
            .map(|j| (0..hd).map(|d| t.get_f32(at(j) + d)).collect())
            .collect()
    };
    let (ks, vs) = (rows(a.kc), rows(a.vc));
    let mut scores = vec![0f32; ks.len()];
    for r in 0..rep {
        let h = a.kv_head as usize * rep + r;
        let qh: Vec<f32> = (0..hd).map(|d| a.q.get_f32(h * hd + d)).collect();
        let mut m = f32::NEG_INFINITY;
        for (s, k) in scores.iter_mut().zip(&ks) {
            let dot: f32 = qh.iter().zip(k).map(|(x, y)| x * y).sum();
            *s = dot * a.scale;
            m = m.max(*s);
        }
        let out = &mut parts[r * (hd + 2)..][..hd + 2];
        out.fill(0.0);
        let mut l = 0f32;
        for (&s, v) in scores.iter().zip(&vs) {
            let e = (s - m).exp();
            l += e;
            for (o, x) in out[..hd].iter_mut().zip(v) {
                *o += e * x;
            }
        }
        out[hd] = m;
        out[hd + 1] = l;
    }
}

/// The attention row `[n_heads · head_dim]` merged from the partials of `g` at position `p`
/// (the splits active there, in split order): per query head `m = max_s m_s`,
/// `w_s = exp(m_s − m)` (0 when `l_s = 0`), `l = Σ_s l_s · w_s`,
/// `row = Σ_s acc_s · w_s / max(l, 1e-20)` — ATTENTION_COMBINE's arithmetic, in fp32.
pub fn combine(parts: &Tensor, g: &SplitGeometry, p: u64) -> Vec<f32> {
    combine_heads(parts, g, p, 0..g.nh as usize)
}

/// [`combine`] of the query heads `heads` only: their `head_dim` elements each, in order.
pub fn combine_heads(
    parts: &Tensor,
    g: &SplitGeometry,
    p: u64,
    heads: std::ops::Range<usize>,
) -> Vec<f32> {
    let (hd, rep) = (g.hd as usize, g.rep() as usize);
    let active = crate::active_splits(p, g.n_splits, g.chunk).min(g.n_splits) as usize;
    let n_splits = g.n_splits as usize;
    let mut row = vec![0f32; heads.len() * hd];
    let (mut ms, mut ls, mut ws) = (vec![0f32; active], vec![0f32; active], vec![0f32; active]);
    for (h, out) in heads.zip(row.chunks_exact_mut(hd)) {
        let (kv_head, r) = (h / rep, h % rep);
        let base = |s: usize| ((kv_head * n_splits + s) * rep + r) * (hd + 2);
        let mut m = f32::NEG_INFINITY;
        for s in 0..active {
            ms[s] = parts.get_f32(base(s) + hd);
            ls[s] = parts.get_f32(base(s) + hd + 1);
            m = m.max(ms[s]);
        }
        let mut l = 0f32;
        for s in 0..active {
            ws[s] = if ls[s] > 0.0 { (ms[s] - m).exp() } else { 0.0 };
            l += ls[s] * ws[s];
        }
        let denom = l.max(1e-20);
        for (d, o) in out.iter_mut().enumerate() {
            let mut acc = 0f32;
            for (s, &w) in ws.iter().enumerate() {
                if w != 0.0 {
                    acc += parts.get_f32(base(s) + d) * w;
                }
            }
            *o = acc / denom;
        }
    }
    row
}
