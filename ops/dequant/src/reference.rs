//! CPU reference of DEQUANT `[q, scales(, zeros)] -> out`: `q`'s last dim is split into groups
//! of `group` elements (groups never straddle rows), group `g` (row-major) uses `scales[g]`
//! and `zeros[g]`:
//!
//! ```text
//! out[i] = (q[i] − zeros[i / group]) · scales[i / group]   with zeros
//! out[i] = (q[i] − o) · scales[i / group]                  without
//! ```
//!
//! in fp32, cast on store. `q` is read as stored (integers, or floats holding integers); the
//! one exception is `I4` storage, whose raw nibble `0..=15` is offset by `o = 8` in the
//! symmetric form (no zeros) and by nothing in the asymmetric form, the same rule as
//! GEMV_TILE's int4 weights (`o = 0` for every other dtype). `out` is a view: it needs `q`'s
//! element count, not its dims. `scales`/`zeros` need `numel(q) / group` elements.
//!
//! Errors, checked before any element is read: arity ([`OpError::Arity`]), missing or bad
//! `qdtype` (6 or 7) / `group` (> 0) ([`OpError::MissingParam`], [`OpError::BadParam`]), a
//! last dim that is not a multiple of `group`, wrong scale/zero/output counts, storage not
//! holding the shape ([`OpError::Shape`]), an integer output ([`OpError::DType`]). The rules
//! mirror the op's validator check in `lib.rs`.

use amk_core::{CpuCall, OpError};
use op_gemv_tile::reference::{check_storage, decode, positive};

/// Runs one DEQUANT task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 3, 1)?;
    let qdtype = call.int("qdtype")?;
    if !matches!(qdtype, 6 | 7) {
        return Err(OpError::BadParam {
            key: "qdtype".into(),
            why: format!("{qdtype} must be 6 (int8) or 7 (int4)"),
        });
    }
    let group = positive(call, "group")?;
    let q = call.input(0)?;
    let scales = call.input(1)?;
    let zeros = if call.n_inputs() == 3 {
        Some(call.input(2)?)
    } else {
        None
    };
    check_storage(q, "q")?;
    let kd = q.last_dim();
    if kd % group != 0 {
        return Err(OpError::Shape(format!(
            "DEQUANT: the last dim of q {:?} must be a multiple of group = {group}",
            q.shape()
        )));
    }
    let numel = q.numel();
    let groups = numel / group;
    for (t, role) in [(Some(scales), "scales"), (zeros, "zeros")] {
        let Some(t) = t else { continue };
        check_storage(t, role)?;
        if t.numel() != groups {
            return Err(OpError::Shape(format!(
                "DEQUANT: {role} {:?} must have {groups} elements (one per group of {group})",
                t.shape()
            )));
        }
    }
    let offset = if zeros.is_none() && q.dtype() == amk_core::DType::I4 {
        8.0
    } else {
        0.0
    };

    let out = call.output(0)?;
    check_storage(out, "output")?;
    if out.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "DEQUANT: output {:?} must have a floating-point dtype, has {}",
            out.shape(),
            out.dtype()
        )));
    }
    if out.numel() != numel {
        return Err(OpError::Shape(format!(
            "DEQUANT: output {:?} must have {numel} elements like q {:?}",
            out.shape(),
            q.shape()
        )));
    }
    if numel == 0 {
        return Ok(());
    }

    // One row of q at a time: rows are whole groups, and I4 rows unpack fast.
    let per_row = kd / group;
    let mut vals = vec![0.0f32; kd];
    let (mut s, mut z) = (vec![0.0f32; per_row], vec![offset; per_row]);
    for row in 0..numel / kd {
        decode(q, row * kd, &mut vals)?;
        decode(scales, row * per_row, &mut s)?;
        if let Some(zt) = zeros {
            decode(zt, row * per_row, &mut z)?;
        }
        for ((chunk, &sc), &zp) in vals.chunks_mut(group).zip(&s).zip(&z) {
            for v in chunk {
                *v = (*v - zp) * sc;
            }
        }
        let at = row * kd;
        match out.as_f32_mut() {
            Some(o) => o
                .get_mut(at..at + kd)
                .ok_or_else(|| OpError::Shape("output: storage is shorter than its shape".into()))?
                .copy_from_slice(&vals),
            None => {
                for (i, &v) in vals.iter().enumerate() {
                    out.set_f32(at + i, v);
                }
            }
        }
    }
    Ok(())
}
