//! CPU reference of GEMV_TILE, shared with GEMM_TILE through [`linear`].
//!
//! Semantics (docs/ir.md, "Numerics", with our deliberate fixes listed in "Opcodes and
//! params"): the weight has the torch `Linear` layout `[N, K]`; for every row `m` of `x`
//! (viewed as `[M, K]`) and every column `n` of the tile `[n_off, n_off + N_tile)`:
//!
//! ```text
//! out[m, n] = Σ_k f32(x[m, k]) · f32(W[n, k])   (+ f32(bias[n]) with a third float input)
//! ```
//!
//! accumulated in fp32 and cast on store. The output is viewed as rows of its last dim (which
//! must hold the tile); nothing outside the tile (and, for GEMM with `m_off`, outside the row
//! range) is touched.
//!
//! Weight-only quantised mode (`qdtype` 7 = int4 or 6 = int8, with 3 or 4 inputs
//! `[x, qW, scales(, zeros)]`): `group` defaults to `K`; scales and zeros are float tensors of
//! `N · ceil(K / group)` elements, column `k` of row `n` using element `n · ceil(K/group) + k / group`.
//! The real weight is `(q − z) · scale`, where `q` is the stored integer (the raw nibble `0..=15`
//! for `I4`) and `z` is the zero point when given, otherwise 8 for int4 and 0 for int8. So
//! asymmetric int4 is `(nibble − zero) · scale` (no extra −8, a deliberate fix), symmetric int8
//! weights are `I8` and asymmetric ones `U8`.
//!
//! Every bad call is an [`OpError`], checked before any element is read: wrong arity
//! ([`OpError::Arity`]), missing or non-integer or non-positive params ([`OpError::MissingParam`],
//! [`OpError::BadParam`]), operands that do not fit the params (a `K` that is not the last dim,
//! a tile beyond the weight's rows or the output's last dim, wrong scale/bias counts, a storage
//! that does not hold the shape: [`OpError::Shape`]), and dtype combinations the mode does not
//! take ([`OpError::DType`]). The rules mirror `amk_core::opcheck::linear`.
//!
//! Speed: the rows of `x` are loaded once as fp32 (borrowed in place when `x` is F32); F32
//! weight rows are read in place and reduced by [`dot`] (16 independent lanes, auto-vectorised),
//! BF16 rows by [`dot_bf16`] (widened in the loop: a bf16 is the high half of an f32); other
//! weights (F16 through `half`'s slice conversion, quantised rows unpacked and dequantised per
//! group) are widened into a scratch row first. Each weight row is read once for all rows of
//! `x`.

use amk_core::{CpuCall, DType, OpError, Storage, Tensor};
use half::bf16;
use half::slice::HalfFloatSliceExt;
use std::borrow::Cow;
use std::ops::Range;

/// Quantised weight mode `params.qdtype = 6`: int8 weights.
pub const QDTYPE_I8: i64 = 6;
/// Quantised weight mode `params.qdtype = 7`: packed int4 weights.
pub const QDTYPE_I4: i64 = 7;

/// Which tiled linear opcode a call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linear {
    /// GEMV_TILE: every row of `x`.
    Gemv,
    /// GEMM_TILE: rows `[m_off, m_off + M_tile)` when `m_off` is given, otherwise every row
    /// (`M_tile` is required and must fit the rows either way).
    Gemm,
}

impl Linear {
    fn name(self) -> &'static str {
        match self {
            Linear::Gemv => "GEMV_TILE",
            Linear::Gemm => "GEMM_TILE",
        }
    }
}

/// Runs one GEMV_TILE task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    linear(call, Linear::Gemv)
}

/// How the weight operand is to be read.
enum Weights<'a> {
    /// Float weights, optional float bias of `N` elements.
    Float {
        w: &'a Tensor,
        bias: Option<&'a Tensor>,
    },
    /// Integer weights dequantised per row.
    Quant {
        q: &'a Tensor,
        scales: &'a Tensor,
        zeros: Option<&'a Tensor>,
        /// Subtracted when there are no zeros: 8 for int4, 0 for int8.
        offset: f32,
        group: usize,
        n_groups: usize,
    },
}

/// Runs one GEMV_TILE (`Linear::Gemv`) or GEMM_TILE (`Linear::Gemm`) task.
pub fn linear(call: &mut CpuCall<'_, '_>, op: Linear) -> Result<(), OpError> {
    let name = op.name();
    call.expect_arity(2, 4, 1)?;
    let pr = LinearParams::read(call, op)?;
    let k = pr.k;
    let x = call.input(0)?;
    let w = call.input(1)?;
    check_storage(x, "input")?;
    check_storage(w, "weight")?;
    for (t, role) in [(w, "weight"), (x, "input")] {
        if t.last_dim() != k {
            return Err(OpError::Shape(format!(
                "{name}: param K = {k} must equal the last dim of the {role} {:?}",
                t.shape()
            )));
        }
    }
    require_float(x, name, "input")?;
    let n = w.numel() / k;
    let m = x.numel() / k;
    let weights = match pr.qdtype {
        None => float_weights(call, name, n)?,
        Some(qd @ (QDTYPE_I8 | QDTYPE_I4)) => quant_weights(call, name, qd, n, k)?,
        Some(qd) => {
            return Err(OpError::BadParam {
                key: "qdtype".into(),
                why: format!("{qd} is not a weight-only mode (6 = int8, 7 = int4)"),
            });
        }
    };
    let (n_off, n_tile) = (pr.n_off, pr.n_tile);
    let end = n_off
        .checked_add(n_tile)
        .filter(|&e| e <= n)
        .ok_or_else(|| {
            OpError::Shape(format!(
                "{name}: columns [{n_off}, {n_off} + {n_tile}) exceed the {n} rows of the weight {:?}",
                w.shape()
            ))
        })?;
    let rows = pr.rows(name, m, x)?;
    let out = call.output(0)?;
    let ldo = check_output(out, name, n_off..end, m, x)?;
    let tile = compute(x, &weights, k, n_off..end, rows.clone())?;
    store(out, &tile, ldo, n_off..end, rows)
}

/// A linear task's params: the reduction length, its column tile, the weight-only quantised
/// mode, and (GEMM) its row tile.
struct LinearParams {
    k: usize,
    n_tile: usize,
    n_off: usize,
    qdtype: Option<i64>,
    m_tile: Option<usize>,
    m_off: Option<usize>,
}

impl LinearParams {
    fn read(call: &CpuCall<'_, '_>, op: Linear) -> Result<Self, OpError> {
        let gemm = matches!(op, Linear::Gemm);
        Ok(LinearParams {
            k: positive(call, "K")?,
            n_tile: positive(call, "N_tile")?,
            n_off: non_negative(call, "n_off")?,
            qdtype: call.int_opt("qdtype")?,
            m_tile: if gemm {
                Some(positive(call, "M_tile")?)
            } else {
                None
            },
            // GEMV never reads `m_off`.
            m_off: match gemm {
                true if call.int_opt("m_off")?.is_some() => Some(non_negative(call, "m_off")?),
                _ => None,
            },
        })
    }

    /// The input rows the task computes: every row (GEMV, or GEMM without `m_off`), or its
    /// row tile, which must lie within the input's `m` rows.
    fn rows(&self, name: &str, m: usize, x: &Tensor) -> Result<std::ops::Range<usize>, OpError> {
        let Some(mt) = self.m_tile else {
            return Ok(0..m);
        };
        let start = self.m_off.unwrap_or(0);
        let stop = start.checked_add(mt).filter(|&e| e <= m).ok_or_else(|| {
            OpError::Shape(format!(
                "{name}: rows [{start}, {start} + {mt}) exceed the {m} row(s) of the input {:?}",
                x.shape()
            ))
        })?;
        Ok(if self.m_off.is_some() {
            start..stop
        } else {
            0..m
        })
    }
}

/// A float weight and its optional bias of `n` elements (3 inputs at most).
fn float_weights<'a>(call: &CpuCall<'a, '_>, name: &str, n: usize) -> Result<Weights<'a>, OpError> {
    let n_in = call.n_inputs();
    let w = call.input(1)?;
    if n_in == 4 {
        return Err(OpError::Arity {
            what: "inputs",
            expected: "2..3 (4 only with a quantised weight, params.qdtype 6 or 7)".into(),
            got: n_in,
        });
    }
    require_float(w, name, "weight")?;
    let bias = if n_in == 3 {
        let b = call.input(2)?;
        check_storage(b, "bias")?;
        require_float(b, name, "bias")?;
        if b.numel() != n {
            return Err(OpError::Shape(format!(
                "{name}: bias {:?} must have {n} elements (the weight's rows)",
                b.shape()
            )));
        }
        Some(b)
    } else {
        None
    };
    Ok(Weights::Float { w, bias })
}

/// An int8/int4 weight (`qd`) of `n` rows of `k`, its grouped scales and optional zeros.
fn quant_weights<'a>(
    call: &CpuCall<'a, '_>,
    name: &str,
    qd: i64,
    n: usize,
    k: usize,
) -> Result<Weights<'a>, OpError> {
    let n_in = call.n_inputs();
    let w = call.input(1)?;
    if n_in < 3 {
        return Err(OpError::Arity {
            what: "inputs",
            expected: "3..4 ([x, qW, scales(, zeros)] with params.qdtype)".into(),
            got: n_in,
        });
    }
    let asym = n_in == 4;
    let want = match (qd, asym) {
        (QDTYPE_I4, _) => DType::I4,
        (_, false) => DType::I8,
        (_, true) => DType::U8,
    };
    if w.dtype() != want {
        return Err(OpError::DType(format!(
            "{name}: qdtype {qd} with {} needs a {want} weight, got {}",
            if asym { "zeros" } else { "no zeros" },
            w.dtype()
        )));
    }
    let group = match call.int_opt("group")? {
        None => k,
        Some(_) => positive(call, "group")?,
    };
    let n_groups = k.div_ceil(group);
    let want_numel = n
        .checked_mul(n_groups)
        .ok_or_else(|| OpError::Shape(format!("{name}: {n} x {n_groups} scales overflow")))?;
    let scales = call.input(2)?;
    let zeros = if asym { Some(call.input(3)?) } else { None };
    for (t, role) in [(Some(scales), "scales"), (zeros, "zeros")] {
        let Some(t) = t else { continue };
        check_storage(t, role)?;
        require_float(t, name, role)?;
        if t.numel() != want_numel {
            return Err(OpError::Shape(format!(
                "{name}: {role} {:?} must have {want_numel} elements \
                 ({n} rows x ceil(K {k} / group {group}))",
                t.shape()
            )));
        }
    }
    Ok(Weights::Quant {
        q: w,
        scales,
        zeros,
        offset: if qd == QDTYPE_I4 { 8.0 } else { 0.0 },
        group,
        n_groups,
    })
}

/// The output: float storage whose rows hold columns `[n_off, end)` and whose row count is
/// the input's `m`; returns its row length.
fn check_output(
    out: &Tensor,
    name: &str,
    columns: std::ops::Range<usize>,
    m: usize,
    x: &Tensor,
) -> Result<usize, OpError> {
    let (n_off, end) = (columns.start, columns.end);
    check_storage(out, "output")?;
    require_float(out, name, "output")?;
    let ldo = out.last_dim();
    if end > ldo {
        return Err(OpError::Shape(format!(
            "{name}: columns [{n_off}, {end}) exceed the last dim of the output {:?}",
            out.shape()
        )));
    }
    if out.numel() / ldo != m {
        return Err(OpError::Shape(format!(
            "{name}: the output {:?} must have {m} row(s), like the input {:?}",
            out.shape(),
            x.shape()
        )));
    }
    Ok(ldo)
}

/// The `[rows × cols]` tile of results, row-major.
fn compute(
    x: &Tensor,
    weights: &Weights<'_>,
    k: usize,
    cols: Range<usize>,
    rows: Range<usize>,
) -> Result<Vec<f32>, OpError> {
    let (m0, mr) = (rows.start, rows.len());
    let nc = cols.len();
    let xs: Cow<'_, [f32]> = match x.as_f32() {
        Some(v) => Cow::Borrowed(slice(v, m0 * k, mr * k, "input")?),
        None => {
            let mut buf = vec![0.0; mr * k];
            decode(x, m0 * k, &mut buf)?;
            Cow::Owned(buf)
        }
    };
    let mut tile = vec![0.0f32; mr * nc];
    let mut wbuf = vec![0.0f32; k];
    let (mut sbuf, mut zbuf) = (Vec::new(), Vec::new());
    if let Weights::Quant { n_groups, .. } = weights {
        sbuf.resize(*n_groups, 0.0);
        zbuf.resize(*n_groups, 0.0);
    }
    let mut bias_v = [0.0f32];
    for (j, n) in cols.enumerate() {
        let mut bias = 0.0f32;
        let wrow: &[f32] = match weights {
            Weights::Float { w, bias: b } => {
                if let Some(b) = b {
                    decode(b, n, &mut bias_v)?;
                    bias = bias_v[0];
                }
                match w.storage() {
                    Storage::F32(v) => slice(v, n * k, k, "weight")?,
                    Storage::BF16(v) => {
                        let wr = v.get(n * k..(n + 1) * k).ok_or_else(|| short("weight"))?;
                        for (i, xr) in xs.chunks_exact(k).enumerate() {
                            if let Some(t) = tile.get_mut(i * nc + j) {
                                *t = dot_bf16(xr, wr) + bias;
                            }
                        }
                        continue;
                    }
                    _ => {
                        decode(w, n * k, &mut wbuf)?;
                        &wbuf
                    }
                }
            }
            Weights::Quant {
                q,
                scales,
                zeros,
                offset,
                group,
                n_groups,
            } => {
                decode(q, n * k, &mut wbuf)?;
                decode(scales, n * n_groups, &mut sbuf)?;
                match zeros {
                    Some(z) => decode(z, n * n_groups, &mut zbuf)?,
                    None => zbuf.fill(*offset),
                }
                for ((chunk, &s), &z) in wbuf.chunks_mut(*group).zip(&sbuf).zip(&zbuf) {
                    for v in chunk {
                        *v = (*v - z) * s;
                    }
                }
                &wbuf
            }
        };
        for (i, xr) in xs.chunks_exact(k).enumerate() {
            if let Some(t) = tile.get_mut(i * nc + j) {
                *t = dot(xr, wrow) + bias;
            }
        }
    }
    Ok(tile)
}

/// Writes the tile into `out` (viewed as rows of `ldo`), cast on store.
fn store(
    out: &mut Tensor,
    tile: &[f32],
    ldo: usize,
    cols: Range<usize>,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let nc = cols.len();
    for (r, vals) in rows.zip(tile.chunks_exact(nc)) {
        let at = r * ldo + cols.start;
        match out.as_f32_mut() {
            Some(o) => o
                .get_mut(at..at + nc)
                .ok_or_else(|| short("output"))?
                .copy_from_slice(vals),
            None => {
                for (i, &v) in vals.iter().enumerate() {
                    out.set_f32(at + i, v);
                }
            }
        }
    }
    Ok(())
}

/// `Σ_k x[k]·W[n, k]` for a float weight `W` of rows `x.len()` long: the sum GEMV_TILE
/// computes, in the same order (the fused tiles reuse it so that their results equal the
/// unfused program's). `scratch` holds a widened row (`x.len()` elements) when `W` is F16.
pub fn float_row_dot(x: &[f32], w: &Tensor, n: usize, scratch: &mut [f32]) -> Result<f32, OpError> {
    let k = x.len();
    match w.storage() {
        Storage::F32(v) => Ok(dot(x, slice(v, n * k, k, "weight")?)),
        Storage::BF16(v) => Ok(dot_bf16(
            x,
            v.get(n * k..(n + 1) * k).ok_or_else(|| short("weight"))?,
        )),
        _ => {
            let row = scratch.get_mut(..k).ok_or_else(|| short("scratch"))?;
            decode(w, n * k, row)?;
            Ok(dot(x, row))
        }
    }
}

/// `Σ a[i]·b[i]` over the common length, in fp32 with 16 independent partial sums (so the
/// loop vectorises), then the sum of the lanes plus the ragged tail.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_by(a, b, |v| v)
}

/// [`dot`] with bf16 weights widened on the fly (a bf16 is the high half of an f32).
pub fn dot_bf16(a: &[f32], b: &[bf16]) -> f32 {
    dot_by(a, b, |v| f32::from_bits(u32::from(v.to_bits()) << 16))
}

#[inline(always)]
fn dot_by<T: Copy>(a: &[f32], b: &[T], widen: impl Fn(T) -> f32) -> f32 {
    const LANES: usize = 16;
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&x, &y)| x * widen(y))
        .sum();
    let mut acc = [0.0f32; LANES];
    for (xa, xb) in ca.zip(cb) {
        // Fixed-size views (always `Ok` for exact chunks) so LLVM sees full-width vectors.
        let (Ok(xa), Ok(xb)) = (<&[f32; LANES]>::try_from(xa), <&[T; LANES]>::try_from(xb)) else {
            continue;
        };
        for ((s, &p), &q) in acc.iter_mut().zip(xa).zip(xb) {
            *s += p * widen(q);
        }
    }
    // A plain sum of the lanes: a pairwise tree here makes LLVM's SLP vectoriser pick
    // 2-wide vectors for the main loop above.
    acc.iter().sum::<f32>() + tail
}

/// `v[start .. start + len]`, or a shape error if the storage is too short.
fn slice<'v>(v: &'v [f32], start: usize, len: usize, role: &str) -> Result<&'v [f32], OpError> {
    v.get(start..start + len).ok_or_else(|| short(role))
}

fn short(role: &str) -> OpError {
    OpError::Shape(format!("{role}: storage is shorter than its shape"))
}

/// Loads elements `start .. start + dst.len()` (row-major) of `t` as f32: floats widened,
/// integers as stored (`I4`: the raw nibble `0..=15`).
pub fn decode(t: &Tensor, start: usize, dst: &mut [f32]) -> Result<(), OpError> {
    let len = dst.len();
    let range = start..start + len;
    let err = || short("operand");
    match t.storage() {
        Storage::F32(v) => dst.copy_from_slice(v.get(range).ok_or_else(err)?),
        Storage::F16(v) => v.get(range).ok_or_else(err)?.convert_to_f32_slice(dst),
        Storage::BF16(v) => {
            let src = v.get(range).ok_or_else(err)?;
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f32::from_bits(u32::from(s.to_bits()) << 16);
            }
        }
        Storage::I32(v) => {
            let src = v.get(range).ok_or_else(err)?;
            dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s as f32);
        }
        Storage::I8(v) => {
            let src = v.get(range).ok_or_else(err)?;
            dst.iter_mut()
                .zip(src)
                .for_each(|(d, &s)| *d = f32::from(s));
        }
        Storage::U8(v) => {
            let src = v.get(range).ok_or_else(err)?;
            dst.iter_mut()
                .zip(src)
                .for_each(|(d, &s)| *d = f32::from(s));
        }
        Storage::I4(bytes) => {
            let kd = t.last_dim();
            if len == 0 {
                return Ok(());
            }
            if kd == 0 {
                return Err(err());
            }
            let per_row = kd.div_ceil(2);
            if start.is_multiple_of(kd) && len.is_multiple_of(kd) {
                // Whole rows: two nibbles per byte, a lone low nibble closing an odd row.
                for (r, d) in dst.chunks_exact_mut(kd).enumerate() {
                    let at = (start / kd + r) * per_row;
                    let src = bytes.get(at..at + per_row).ok_or_else(err)?;
                    let mut pairs = d.chunks_exact_mut(2);
                    for (p, &b) in (&mut pairs).zip(src) {
                        p[0] = f32::from(b & 0xF);
                        p[1] = f32::from(b >> 4);
                    }
                    if let ([last], Some(&b)) = (pairs.into_remainder(), src.last()) {
                        *last = f32::from(b & 0xF);
                    }
                }
                return Ok(());
            }
            let (mut row, mut col) = (start / kd, start % kd);
            for d in dst.iter_mut() {
                let byte = *bytes.get(row * per_row + col / 2).ok_or_else(err)?;
                *d = f32::from((byte >> (4 * (col % 2))) & 0xF);
                col += 1;
                if col == kd {
                    col = 0;
                    row += 1;
                }
            }
        }
        Storage::Bytes(v) => {
            if v.len() < range.end {
                return Err(err());
            }
            for (d, i) in dst.iter_mut().zip(range) {
                *d = t.get_f32(i);
            }
        }
    }
    Ok(())
}

/// Requires `t`'s storage to be the variant of its dtype and to hold exactly its shape, so no
/// later element access can go out of bounds.
pub fn check_storage(t: &Tensor, role: &str) -> Result<(), OpError> {
    let numel = t.numel();
    let (ok_variant, len) = match (t.storage(), t.dtype()) {
        (Storage::F32(v), DType::F32) => (true, v.len()),
        (Storage::F16(v), DType::F16) => (true, v.len()),
        (Storage::BF16(v), DType::BF16) => (true, v.len()),
        (Storage::I32(v), DType::I32) => (true, v.len()),
        (Storage::I8(v), DType::I8) => (true, v.len()),
        (Storage::U8(v), DType::U8) => (true, v.len()),
        (Storage::I4(v), DType::I4) => (true, v.len()),
        (Storage::Bytes(v), DType::BOOL | DType::F8E4M3 | DType::F8E5M2) => (true, v.len()),
        _ => (false, 0),
    };
    if !ok_variant {
        return Err(OpError::DType(format!(
            "{role}: storage does not hold {} elements",
            t.dtype()
        )));
    }
    let want = if t.dtype() == DType::I4 {
        let kd = t.last_dim();
        (numel.checked_div(kd).unwrap_or(0)).saturating_mul(kd.div_ceil(2))
    } else {
        numel
    };
    if len != want {
        return Err(OpError::Shape(format!(
            "{role}: storage holds {len} slots, shape {:?} needs {want}",
            t.shape()
        )));
    }
    Ok(())
}

fn require_float(t: &Tensor, op: &str, role: &str) -> Result<(), OpError> {
    if t.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "{op}: {role} {:?} must have a floating-point dtype, has {}",
            t.shape(),
            t.dtype()
        )));
    }
    Ok(())
}

/// A required integer param that must be > 0, as `usize`.
pub fn positive(call: &CpuCall<'_, '_>, key: &str) -> Result<usize, OpError> {
    let v = call.int(key)?;
    if v <= 0 {
        return Err(OpError::BadParam {
            key: key.into(),
            why: format!("{v} must be positive"),
        });
    }
    to_usize(key, v)
}

/// A required integer param that must be ≥ 0, as `usize`.
pub fn non_negative(call: &CpuCall<'_, '_>, key: &str) -> Result<usize, OpError> {
    let v = call.int(key)?;
    if v < 0 {
        return Err(OpError::BadParam {
            key: key.into(),
            why: format!("{v} must not be negative"),
        });
    }
    to_usize(key, v)
}

fn to_usize(key: &str, v: i64) -> Result<usize, OpError> {
    usize::try_from(v).map_err(|_| OpError::BadParam {
        key: key.into(),
        why: format!("{v} does not fit this host's address space"),
    })
}
