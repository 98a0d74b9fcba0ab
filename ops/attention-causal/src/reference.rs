//! CPU reference of ATTENTION_CAUSAL `[q, k_cache, v_cache, pos] -> o`: for every row `r` in
//! `[m_off, m_off + M_tile)` and query head `h` of columns `[n_off, n_off + N_tile)`, with `p =
//! pos[r]` and `g = h / (n_heads / n_kv_heads)`:
//!
//! ```text
//! s_j     = (Σ_d q[r,h,d] · k[j,g,d]) · scale          j = 0..=p
//! o[r,h]  = Σ_j exp(s_j − max s) · v[j,g] / Σ_j exp(s_j − max s)
//! ```
//!
//! in f32, cast on store: ATTENTION_TILE's arithmetic (its `attend`), row by row. A position
//! outside the cache is an index error, found when the task runs (positions are data).

use amk_core::{CpuCall, DType, OpError, Tensor};

/// The checked params and operand geometry of one call.
#[derive(Debug, Clone)]
struct Geometry {
    hd: usize,
    nh: usize,
    rep: usize,
    /// Elements of a cache row (`n_kv_heads · head_dim`).
    row: usize,
    max_seq: usize,
    scale: f32,
    rows: std::ops::Range<usize>,
    heads: std::ops::Range<usize>,
}

fn size(call: &CpuCall<'_, '_>, key: &str, zero_ok: bool) -> Result<usize, OpError> {
    let v = call.int(key)?;
    if v < 0 || (v == 0 && !zero_ok) {
        return Err(OpError::BadParam {
            key: key.into(),
            why: format!("{v} is out of range"),
        });
    }
    usize::try_from(v).map_err(|_| OpError::BadParam {
        key: key.into(),
        why: format!("{v} does not fit this host"),
    })
}

fn shape(msg: String) -> OpError {
    OpError::Shape(format!("ATTENTION_CAUSAL: {msg}"))
}

fn geometry(call: &CpuCall<'_, '_>) -> Result<Geometry, OpError> {
    let (hd, nh, nkv) = (
        size(call, "head_dim", false)?,
        size(call, "n_heads", false)?,
        size(call, "n_kv_heads", false)?,
    );
    let (m_off, m_tile) = (size(call, "m_off", true)?, size(call, "M_tile", false)?);
    let (n_off, n_tile) = (size(call, "n_off", true)?, size(call, "N_tile", false)?);
    let scale = call.real("scale")? as f32;
    if !scale.is_finite() || nh % nkv != 0 {
        return Err(OpError::BadParam {
            key: "scale/n_kv_heads".into(),
            why: "scale must be finite and n_heads a multiple of n_kv_heads".into(),
        });
    }
    let (q, kc, vc, pos) = (
        call.input(0)?,
        call.input(1)?,
        call.input(2)?,
        call.input(3)?,
    );
    let width = nh.saturating_mul(hd);
    let row = nkv.saturating_mul(hd);
    if q.numel() % width != 0 || kc.numel() != vc.numel() || kc.numel() % row != 0 {
        return Err(shape(format!(
            "the query {:?} must be rows of {width} and the caches {:?}, {:?} rows of {row}",
            q.shape(),
            kc.shape(),
            vc.shape()
        )));
    }
    let rows = q.numel() / width;
    if !pos.dtype().is_integer() || pos.numel() != rows {
        return Err(OpError::DType(format!(
            "ATTENTION_CAUSAL: the positions {} {:?} must be integers, one per query row ({rows})",
            pos.dtype(),
            pos.shape()
        )));
    }
    let m_end = m_off.saturating_add(m_tile);
    let n_end = n_off.saturating_add(n_tile);
    if m_end > rows || n_off % hd != 0 || n_tile % hd != 0 || n_end > width {
        return Err(shape(format!(
            "rows [{m_off}, {m_end}) and columns [{n_off}, {n_end}) must lie within {rows} rows \
             and whole heads of {width} columns"
        )));
    }
    Ok(Geometry {
        hd,
        nh,
        rep: nh / nkv,
        row,
        max_seq: kc.numel() / row,
        scale,
        rows: m_off..m_end,
        heads: n_off / hd..n_end / hd,
    })
}

/// Row `r`'s position, checked against the cache.
fn position(pos: &Tensor, r: usize, max_seq: usize) -> Result<usize, OpError> {
    let p = pos.get_i64(r);
    match usize::try_from(p) {
        Ok(p) if p < max_seq => Ok(p),
        _ => Err(OpError::IndexOutOfRange {
            at: r,
            value: p,
            limit: max_seq as u64,
        }),
    }
}

/// Row `r`'s heads `g.heads` attending over cache rows `0..=p`: ATTENTION_TILE's arithmetic
/// (its `attend`, on the row as a one-row query), each element as `(index in q, value)`.
fn attend_row(
    g: &Geometry,
    q: &Tensor,
    kc: &Tensor,
    vc: &Tensor,
    r: usize,
    p: usize,
) -> Result<Vec<(usize, f32)>, OpError> {
    let width = g.nh * g.hd;
    let row: Vec<f32> = (r * width..(r + 1) * width).map(|i| q.get_f32(i)).collect();
    let qr = Tensor::from_f32(DType::F32, &[1, width as u64], &row)
        .map_err(|e| shape(format!("row {r} of the query: {e}")))?;
    let tile = op_attention_tile::reference::Geometry {
        hd: g.hd,
        nh: g.nh,
        rep: g.rep,
        batch: 1,
        per_batch: g.max_seq * g.row,
        row: g.row,
        kv_start: 0,
        kv_len: p + 1,
        scale: g.scale,
        partial: false,
    };
    let mut out = Vec::with_capacity(g.heads.len() * g.hd);
    op_attention_tile::reference::attend(&tile, &qr, kc, vc, |i, v| {
        if g.heads.contains(&(i / g.hd)) {
            out.push((r * width + i, v));
        }
    });
    Ok(out)
}

/// Runs one ATTENTION_CAUSAL task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(4, 4, 1)?;
    let g = geometry(call)?;
    let (q, kc, vc, pos) = (
        call.input(0)?,
        call.input(1)?,
        call.input(2)?,
        call.input(3)?,
    );
    let q_numel = q.numel();
    let mut values = Vec::with_capacity(g.rows.len() * g.heads.len() * g.hd);
    for r in g.rows.clone() {
        let p = position(pos, r, g.max_seq)?;
        values.extend(attend_row(&g, q, kc, vc, r, p)?);
    }
    let out = call.output(0)?;
    if out.numel() != q_numel {
        return Err(shape(format!(
            "the output {:?} must be shaped like the query",
            out.shape()
        )));
    }
    for (i, v) in values {
        out.set_f32(i, v);
    }
    Ok(())
}
