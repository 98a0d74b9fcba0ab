//! The region a GEMV_TILE/GEMM_TILE/LINEAR_TILE task writes, for running tiles ready together
//! on several threads: each worker computes its tile into a scratch copy of the output, and the tile's
//! region is copied back (an exact copy, so the result is bit-identical to one thread).

use amk_core::{BufferKind, DType, Opcode, Program, Storage, Tensor};

/// Where one tile task writes: output buffer, rows and columns of the output viewed as rows of
/// its last dim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tile {
    /// Output buffer.
    pub(crate) out: u32,
    /// Rows `[start, end)`.
    pub(crate) rows: (usize, usize),
    /// Columns `[start, end)`.
    pub(crate) cols: (usize, usize),
    /// Row length of the output (its last dim).
    pub(crate) ldo: usize,
    /// Relative cost (weight elements read), for balancing workers.
    pub(crate) cost: u64,
}

impl Tile {
    /// Whether two tiles write a common element.
    pub(crate) fn overlaps(&self, other: &Tile) -> bool {
        self.out == other.out
            && self.rows.0 < other.rows.1
            && other.rows.0 < self.rows.1
            && self.cols.0 < other.cols.1
            && other.cols.0 < self.cols.1
    }
}

fn usize_param(p: &amk_core::Task, key: &str) -> Option<usize> {
    p.params
        .get(key)
        .and_then(amk_core::json::Value::as_i64)
        .and_then(|v| usize::try_from(v).ok())
}

/// The tile task `t` writes, when it may run on a worker thread: a GEMV_TILE, GEMM_TILE or
/// LINEAR_TILE with one ACTIVATION or IO_OUTPUT float output it does not also read, and params
/// that place the tile inside the output. Anything else (including every malformed task, whose
/// reference error the sequential path reports) is `None`.
pub(crate) fn tile_of(p: &Program, t: usize) -> Option<Tile> {
    let task = p.tasks.get(t)?;
    let gemm = match task.op {
        Opcode::GEMV_TILE => false,
        Opcode::GEMM_TILE | Opcode::LINEAR_TILE => true,
        _ => return None,
    };
    let [out] = task.outputs.as_slice() else {
        return None;
    };
    if task.inputs.contains(out) {
        return None;
    }
    let buf = p.buffers.get(*out as usize)?;
    if !matches!(buf.kind, BufferKind::ACTIVATION | BufferKind::IO_OUTPUT)
        || !matches!(
            buf.dtype,
            DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    {
        return None;
    }
    let ldo = row_length(p, task, buf)?;
    let n_rows = usize::try_from(buf.numel()).ok()? / ldo;
    let n_off = usize_param(task, "n_off")?;
    let n_tile = usize_param(task, "N_tile").filter(|&n| n > 0)?;
    let c_end = n_off.checked_add(n_tile).filter(|&e| e <= ldo)?;
    let rows = if gemm {
        let m_tile = usize_param(task, "M_tile").filter(|&m| m > 0)?;
        match task.params.get("m_off") {
            None => (0, n_rows),
            Some(v) => {
                let m_off = v.as_i64().and_then(|v| usize::try_from(v).ok())?;
                let end = m_off.checked_add(m_tile).filter(|&e| e <= n_rows)?;
                (m_off, end)
            }
        }
    } else {
        (0, n_rows)
    };
    let k = usize_param(task, "K").unwrap_or(1) as u64;
    Some(Tile {
        out: *out,
        rows,
        cols: (n_off, c_end),
        ldo,
        cost: k.saturating_mul(n_tile as u64).max(1),
    })
}

/// The output's row length: its last dim, or for LINEAR_TILE (whose output is viewed as
/// `[rows of x, width]`) its elements over the rows of `x`.
fn row_length(p: &Program, task: &amk_core::Task, out: &amk_core::Buffer) -> Option<usize> {
    let len = if task.op == Opcode::LINEAR_TILE {
        let x = p.buffers.get(*task.inputs.first()? as usize)?;
        let k = usize_param(task, "K").filter(|&k| k > 0)? as u64;
        let rows = x.numel() / k;
        (rows > 0 && out.numel().is_multiple_of(rows)).then(|| out.numel() / rows)?
    } else {
        out.last_dim()
    };
    usize::try_from(len).ok().filter(|&l| l > 0)
}

fn copy_rows<T: Copy>(src: &[T], dst: &mut [T], tile: &Tile) -> Option<()> {
    for r in tile.rows.0..tile.rows.1 {
        let a = r.checked_mul(tile.ldo)?.checked_add(tile.cols.0)?;
        let b = a + (tile.cols.1 - tile.cols.0);
        dst.get_mut(a..b)?.copy_from_slice(src.get(a..b)?);
    }
    Some(())
}

/// Copies `tile`'s region of `src` into `dst` (same dtype and shape); `None` if they differ.
pub(crate) fn copy_region(src: &Tensor, dst: &mut Tensor, tile: &Tile) -> Option<()> {
    if src.dtype() != dst.dtype() || src.shape() != dst.shape() {
        return None;
    }
    match (src.storage(), dst.storage_mut()) {
        (Storage::F32(s), Storage::F32(d)) => copy_rows(s, d, tile),
        (Storage::F16(s), Storage::F16(d)) => copy_rows(s, d, tile),
        (Storage::BF16(s), Storage::BF16(d)) => copy_rows(s, d, tile),
        (Storage::Bytes(s), Storage::Bytes(d)) => copy_rows(s, d, tile),
        _ => None,
    }
}
