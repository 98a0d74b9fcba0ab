//! Host tensors with typed storage: the one "typed view" layer every op's CPU reference loads
//! and stores through, so no op crate re-implements dtype conversions.
//!
//! Conventions (frozen, see `docs/ir.md`): compute in fp32, cast on store. Floating stores
//! round to nearest even; integer stores truncate toward zero and saturate (NaN stores 0).
//! `I4` is packed per row: a logical row of `K` columns occupies `ceil(K/2)` bytes, column
//! `2b` in the low nibble of byte `b`, `2b+1` in the high nibble. Loads of `I4` return the raw
//! nibble `0..=15`; what it means (offset 8, or a zero point) is the consuming op's business.

use crate::ir::DType;
use crate::op_error::OpError;
use crate::sim::SplitMix;
use half::{bf16, f16};

/// Element storage.
#[derive(Debug, Clone, PartialEq)]
pub enum Storage {
    /// `F32`.
    F32(Vec<f32>),
    /// `F16`.
    F16(Vec<f16>),
    /// `BF16`.
    BF16(Vec<bf16>),
    /// `I32`.
    I32(Vec<i32>),
    /// `I8`.
    I8(Vec<i8>),
    /// `U8`.
    U8(Vec<u8>),
    /// `I4`, packed per row (see the module docs).
    I4(Vec<u8>),
    /// `BOOL`, `F8E4M3`, `F8E5M2`: one byte per element.
    Bytes(Vec<u8>),
}

/// Where a float tensor holds NaN or infinity ([`Tensor::non_finite`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFinite {
    /// Index of the first such element.
    pub first: usize,
    /// Its value.
    pub value: f32,
    /// How many elements are NaN or infinite.
    pub count: usize,
}

/// A host tensor: dtype, logical shape and storage.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<u64>,
    data: Storage,
}

fn numel_of(shape: &[u64]) -> usize {
    shape
        .iter()
        .fold(1usize, |a, &d| a.saturating_mul(d as usize))
}

fn row_len(shape: &[u64]) -> usize {
    shape.last().copied().unwrap_or(1) as usize
}

/// `x` as an element of `dtype` would read back after [`Tensor::set_f32`]: F32 unchanged,
/// F16/BF16 rounded to nearest even (fused ops use it to round an intermediate exactly as the
/// unfused program rounds it on store).
pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F32 => x,
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => {
            let mut t = Tensor::zeros(dtype, &[1]);
            t.set_f32(0, x);
            t.get_f32(0)
        }
    }
}

impl Tensor {
    /// A tensor of zeros, or None when the allocator cannot give its memory (instead of the
    /// abort a failed allocation is).
    pub fn try_zeros(dtype: DType, shape: &[u64]) -> Option<Tensor> {
        /// `n` copies of `x`, or None when the allocator cannot give the memory.
        fn filled<T: Clone>(n: usize, x: T) -> Option<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).ok()?;
            v.resize(n, x);
            Some(v)
        }
        let n = numel_of(shape);
        let data = match dtype {
            DType::F32 => Storage::F32(filled(n, 0.0)?),
            DType::F16 => Storage::F16(filled(n, f16::ZERO)?),
            DType::BF16 => Storage::BF16(filled(n, bf16::ZERO)?),
            DType::I32 => Storage::I32(filled(n, 0)?),
            DType::I8 => Storage::I8(filled(n, 0)?),
            DType::U8 => Storage::U8(filled(n, 0)?),
            DType::I4 => {
                let k = row_len(shape);
                let rows = n.checked_div(k).unwrap_or(0);
                Storage::I4(filled(rows.checked_mul(k.div_ceil(2))?, 0)?)
            }
            DType::BOOL | DType::F8E4M3 | DType::F8E5M2 => Storage::Bytes(filled(n, 0)?),
        };
        Some(Tensor {
            dtype,
            shape: shape.to_vec(),
            data,
        })
    }

    /// A zero tensor (aborts, as any allocation, when memory runs out: [`Tensor::try_zeros`]
    /// for sizes that input decides). Not built on `try_zeros`: `vec![0; n]` takes zeroed
    /// pages from the allocator (a large cache costs nothing until written), where a fallible
    /// reservation must write its zeros.
    pub fn zeros(dtype: DType, shape: &[u64]) -> Tensor {
        let n = numel_of(shape);
        let data = match dtype {
            DType::F32 => Storage::F32(vec![0.0; n]),
            DType::F16 => Storage::F16(vec![f16::ZERO; n]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n]),
            DType::I32 => Storage::I32(vec![0; n]),
            DType::I8 => Storage::I8(vec![0; n]),
            DType::U8 => Storage::U8(vec![0; n]),
            DType::I4 => {
                let k = row_len(shape);
                let rows = n.checked_div(k).unwrap_or(0);
                Storage::I4(vec![0; rows * k.div_ceil(2)])
            }
            DType::BOOL | DType::F8E4M3 | DType::F8E5M2 => Storage::Bytes(vec![0; n]),
        };
        Tensor {
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }

    /// A tensor whose every element is a poison value (NaN for floats, the type's minimum
    /// for integers), so a test can tell an element the op never wrote.
    pub fn poisoned(dtype: DType, shape: &[u64]) -> Tensor {
        let mut t = Tensor::zeros(dtype, shape);
        match &mut t.data {
            Storage::F32(v) => v.fill(f32::NAN),
            Storage::F16(v) => v.fill(f16::NAN),
            Storage::BF16(v) => v.fill(bf16::NAN),
            Storage::I32(v) => v.fill(i32::MIN),
            Storage::I8(v) => v.fill(i8::MIN),
            Storage::U8(v) | Storage::I4(v) | Storage::Bytes(v) => v.fill(0xFF),
        }
        t
    }

    /// Builds a tensor from fp32 values, cast on store.
    pub fn from_f32(dtype: DType, shape: &[u64], values: &[f32]) -> Result<Tensor, OpError> {
        let mut t = Tensor::zeros(dtype, shape);
        if values.len() != t.numel() {
            return Err(OpError::Shape(format!(
                "{} values for a tensor of shape {shape:?} ({} elements)",
                values.len(),
                t.numel()
            )));
        }
        t.store_f32(values);
        Ok(t)
    }

    /// Builds a tensor from integer values, cast on store.
    pub fn from_i64(dtype: DType, shape: &[u64], values: &[i64]) -> Result<Tensor, OpError> {
        let mut t = Tensor::zeros(dtype, shape);
        if values.len() != t.numel() {
            return Err(OpError::Shape(format!(
                "{} values for a tensor of shape {shape:?} ({} elements)",
                values.len(),
                t.numel()
            )));
        }
        for (i, &v) in values.iter().enumerate() {
            t.set_i64(i, v);
        }
        Ok(t)
    }

    /// Fresh random values: floats uniform in `[lo, hi)`, integers uniform in
    /// `[lo.ceil(), hi.floor()]` (clamped to the type's range).
    pub fn random(dtype: DType, shape: &[u64], rng: &mut SplitMix, lo: f64, hi: f64) -> Tensor {
        let mut t = Tensor::zeros(dtype, shape);
        let n = t.numel();
        if dtype.is_integer() {
            let (a, b) = (lo.ceil() as i64, hi.floor() as i64);
            let span = (b - a + 1).max(1) as u64;
            for i in 0..n {
                t.set_i64(i, a + (rng.next() % span) as i64);
            }
        } else {
            for i in 0..n {
                let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
                t.set_f32(i, (lo + (hi - lo) * u) as f32);
            }
        }
        t
    }

    /// A tensor over existing storage; the storage variant and length must fit dtype and shape.
    pub fn from_storage(dtype: DType, shape: &[u64], data: Storage) -> Result<Tensor, OpError> {
        let want = Tensor::zeros(dtype, &[]).data; // variant for the dtype
        let n = numel_of(shape);
        let expect_len = match dtype {
            DType::I4 => {
                let k = row_len(shape);
                n.checked_div(k).unwrap_or(0) * k.div_ceil(2)
            }
            _ => n,
        };
        let (same_variant, len) = match (&want, &data) {
            (Storage::F32(_), Storage::F32(v)) => (true, v.len()),
            (Storage::F16(_), Storage::F16(v)) => (true, v.len()),
            (Storage::BF16(_), Storage::BF16(v)) => (true, v.len()),
            (Storage::I32(_), Storage::I32(v)) => (true, v.len()),
            (Storage::I8(_), Storage::I8(v)) => (true, v.len()),
            (Storage::U8(_), Storage::U8(v)) => (true, v.len()),
            (Storage::I4(_), Storage::I4(v)) => (true, v.len()),
            (Storage::Bytes(_), Storage::Bytes(v)) => (true, v.len()),
            _ => (false, 0),
        };
        if !same_variant {
            return Err(OpError::DType(format!(
                "storage does not hold {dtype} elements"
            )));
        }
        if len != expect_len {
            return Err(OpError::Shape(format!(
                "{len} stored elements for a {dtype} tensor of shape {shape:?} (needs {expect_len})"
            )));
        }
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            data,
        })
    }

    /// Decodes little-endian bytes (the safetensors / device layout; `I4` packed per row).
    pub fn from_le_bytes(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<Tensor, OpError> {
        let data = match dtype {
            DType::F32 => Storage::F32(
                le_words::<u32>(bytes)
                    .into_iter()
                    .map(f32::from_bits)
                    .collect(),
            ),
            DType::F16 => Storage::F16(
                le_words::<u16>(bytes)
                    .into_iter()
                    .map(f16::from_bits)
                    .collect(),
            ),
            DType::BF16 => Storage::BF16(
                le_words::<u16>(bytes)
                    .into_iter()
                    .map(bf16::from_bits)
                    .collect(),
            ),
            DType::I32 => Storage::I32(
                le_words::<u32>(bytes)
                    .into_iter()
                    .map(|w| w as i32)
                    .collect(),
            ),
            DType::I8 => Storage::I8(bytes.iter().map(|&b| b as i8).collect()),
            DType::U8 => Storage::U8(bytes.to_vec()),
            DType::I4 => Storage::I4(bytes.to_vec()),
            DType::BOOL | DType::F8E4M3 | DType::F8E5M2 => Storage::Bytes(bytes.to_vec()),
        };
        let bits = dtype.bits() as usize;
        if bits >= 8 && !bytes.len().is_multiple_of(bits / 8) {
            return Err(OpError::Shape(format!(
                "{} bytes is not a whole number of {dtype} elements",
                bytes.len()
            )));
        }
        Tensor::from_storage(dtype, shape, data)
    }

    /// Little-endian bytes of the storage (the inverse of [`Tensor::from_le_bytes`]).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            Storage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::I8(v) => v.iter().map(|&x| x as u8).collect(),
            Storage::U8(v) | Storage::I4(v) | Storage::Bytes(v) => v.clone(),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Logical shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }
    /// Number of logical elements.
    pub fn numel(&self) -> usize {
        numel_of(&self.shape)
    }
    /// Last dim (1 for rank 0).
    pub fn last_dim(&self) -> usize {
        row_len(&self.shape)
    }
    /// The storage.
    pub fn storage(&self) -> &Storage {
        &self.data
    }
    /// The storage, mutably.
    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.data
    }
    /// The elements as `f32`, when the storage is `F32` (zero-copy fast paths).
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Storage::F32(v) => Some(v),
            _ => None,
        }
    }
    /// The elements as mutable `f32`, when the storage is `F32`.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.data {
            Storage::F32(v) => Some(v),
            _ => None,
        }
    }

    fn nibble_at(&self, i: usize) -> (usize, u32) {
        let k = self.last_dim().max(1);
        let (row, col) = (i / k, i % k);
        (row * k.div_ceil(2) + col / 2, 4 * (col % 2) as u32)
    }

    /// Element `i` (row-major) as `f32`.
    pub fn get_f32(&self, i: usize) -> f32 {
        match &self.data {
            Storage::F32(v) => v[i],
            Storage::F16(v) => v[i].to_f32(),
            Storage::BF16(v) => v[i].to_f32(),
            Storage::I32(v) => v[i] as f32,
            Storage::I8(v) => v[i] as f32,
            Storage::U8(v) => v[i] as f32,
            Storage::I4(v) => {
                let (b, s) = self.nibble_at(i);
                ((v[b] >> s) & 0xF) as f32
            }
            Storage::Bytes(v) => match self.dtype {
                DType::F8E4M3 => f8_to_f32(v[i], F8E4M3),
                DType::F8E5M2 => f8_to_f32(v[i], F8E5M2),
                _ => f32::from(v[i] != 0),
            },
        }
    }

    /// Stores `x` at element `i`, cast to the tensor's dtype.
    pub fn set_f32(&mut self, i: usize, x: f32) {
        let (b, s) = if self.dtype == DType::I4 {
            self.nibble_at(i)
        } else {
            (0, 0)
        };
        let dtype = self.dtype;
        match &mut self.data {
            Storage::F32(v) => v[i] = x,
            Storage::F16(v) => v[i] = f16::from_f32(x),
            Storage::BF16(v) => v[i] = bf16::from_f32(x),
            Storage::I32(v) => v[i] = x as i32,
            Storage::I8(v) => v[i] = x as i8,
            Storage::U8(v) => v[i] = x as u8,
            Storage::I4(v) => {
                let q = (x as i64).clamp(0, 15) as u8;
                v[b] = (v[b] & !(0xF << s)) | (q << s);
            }
            Storage::Bytes(v) => {
                v[i] = match dtype {
                    DType::F8E4M3 => f32_to_f8(x, F8E4M3),
                    DType::F8E5M2 => f32_to_f8(x, F8E5M2),
                    _ => u8::from(x != 0.0),
                }
            }
        }
    }

    /// Element `i` as an integer (floats truncate toward zero).
    pub fn get_i64(&self, i: usize) -> i64 {
        match &self.data {
            Storage::I32(v) => v[i] as i64,
            Storage::I8(v) => v[i] as i64,
            Storage::U8(v) => v[i] as i64,
            _ => self.get_f32(i) as i64,
        }
    }

    /// Stores an integer at element `i` (saturating to the dtype's range).
    pub fn set_i64(&mut self, i: usize, x: i64) {
        match &mut self.data {
            Storage::I32(v) => v[i] = x.clamp(i32::MIN as i64, i32::MAX as i64) as i32,
            Storage::I8(v) => v[i] = x.clamp(i8::MIN as i64, i8::MAX as i64) as i8,
            Storage::U8(v) => v[i] = x.clamp(0, 255) as u8,
            _ => self.set_f32(i, x as f32),
        }
    }

    /// Where a float tensor (F32, F16, BF16) holds NaN or infinity, if it does; None for other
    /// dtypes. A scan of every element: what an importer runs once per weight.
    pub fn non_finite(&self) -> Option<NonFinite> {
        fn scan<T: Copy>(
            v: &[T],
            bad: impl Fn(T) -> bool,
            f: impl Fn(T) -> f32,
        ) -> Option<NonFinite> {
            let first = v.iter().position(|&x| bad(x))?;
            Some(NonFinite {
                first,
                value: f(v[first]),
                count: v.iter().filter(|&&x| bad(x)).count(),
            })
        }
        match &self.data {
            Storage::F32(v) => scan(v, |x| !x.is_finite(), |x| x),
            Storage::F16(v) => scan(v, |x| !x.is_finite(), f32::from),
            Storage::BF16(v) => scan(v, |x| !x.is_finite(), f32::from),
            _ => None,
        }
    }

    /// Every element as `f32`.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            Storage::F32(v) => v.clone(),
            _ => (0..self.numel()).map(|i| self.get_f32(i)).collect(),
        }
    }

    /// Stores every element from `values` (cast on store); `values.len()` must equal `numel`.
    pub fn store_f32(&mut self, values: &[f32]) {
        match &mut self.data {
            Storage::F32(v) => v.copy_from_slice(values),
            Storage::F16(v) => v
                .iter_mut()
                .zip(values)
                .for_each(|(d, &s)| *d = f16::from_f32(s)),
            Storage::BF16(v) => v
                .iter_mut()
                .zip(values)
                .for_each(|(d, &s)| *d = bf16::from_f32(s)),
            _ => {
                for (i, &x) in values.iter().enumerate() {
                    self.set_f32(i, x);
                }
            }
        }
    }
}

/// An 8-bit float format: exponent bits, mantissa bits, bias, and whether the all-ones
/// exponent encodes inf/NaN (e5m2) or ordinary values (e4m3, where only `S.1111.111` is NaN).
#[derive(Clone, Copy)]
struct F8 {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    ieee_special: bool,
}

const F8E4M3: F8 = F8 {
    exp_bits: 4,
    man_bits: 3,
    bias: 7,
    ieee_special: false,
};
const F8E5M2: F8 = F8 {
    exp_bits: 5,
    man_bits: 2,
    bias: 15,
    ieee_special: true,
};

fn f8_to_f32(b: u8, f: F8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> f.man_bits) & ((1 << f.exp_bits) - 1)) as i32;
    let m = (b & ((1 << f.man_bits) - 1)) as i32;
    let e_max = (1 << f.exp_bits) - 1;
    if f.ieee_special && e == e_max {
        return if m == 0 {
            sign * f32::INFINITY
        } else {
            f32::NAN
        };
    }
    if !f.ieee_special && e == e_max && m == (1 << f.man_bits) - 1 {
        return f32::NAN;
    }
    let scale = (1 << f.man_bits) as f32;
    if e == 0 {
        sign * (m as f32 / scale) * 2f32.powi(1 - f.bias)
    } else {
        sign * (1.0 + m as f32 / scale) * 2f32.powi(e - f.bias)
    }
}

/// Round to the nearest representable value (ties to even code), saturating to the largest
/// finite value (e4m3 has no infinity).
fn f32_to_f8(x: f32, f: F8) -> u8 {
    if x.is_nan() {
        return 0x7F; // a NaN code in both formats
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    // Positive codes in increasing value order: 0x00..max finite.
    let max_code: u8 = if f.ieee_special {
        (((1u16 << f.exp_bits) - 2) << f.man_bits) as u8 | ((1 << f.man_bits) - 1)
    } else {
        0x7E
    };
    if f.ieee_special && a.is_infinite() {
        return sign | ((((1u16 << f.exp_bits) - 1) << f.man_bits) as u8);
    }
    let (mut lo, mut hi) = (0u8, max_code);
    if a >= f8_to_f32(max_code, f) {
        return sign | max_code;
    }
    // Binary search the last code whose value is ≤ a.
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if f8_to_f32(mid, f) <= a {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let below = lo;
    let above = lo + 1;
    let (vb, va) = (f8_to_f32(below, f), f8_to_f32(above, f));
    let code = if a - vb < va - a || (a - vb == va - a && below % 2 == 0) {
        below
    } else {
        above
    };
    sign | code
}

/// A machine word read from little-endian bytes ([`le_words`]).
trait LeWord: bytemuck::Pod {
    fn le_to_host(self) -> Self;
}
impl LeWord for u16 {
    fn le_to_host(self) -> Self {
        u16::from_le(self)
    }
}
impl LeWord for u32 {
    fn le_to_host(self) -> Self {
        u32::from_le(self)
    }
}

/// `bytes` as little-endian words (a trailing partial word dropped): one copy, and no swap on
/// a little-endian host, instead of a decode element by element (a 512-row chunk's logits
/// read back from the device are 50 MB).
fn le_words<W: LeWord>(bytes: &[u8]) -> Vec<W> {
    let n = bytes.len() / std::mem::size_of::<W>();
    let mut words = vec![W::zeroed(); n];
    bytemuck::cast_slice_mut::<W, u8>(&mut words)
        .copy_from_slice(&bytes[..n * std::mem::size_of::<W>()]);
    for w in &mut words {
        *w = w.le_to_host();
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_round_to_nearest_even_and_ints_truncate() {
        let t = Tensor::from_f32(
            DType::BF16,
            &[3],
            &[1.0, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0],
        )
        .unwrap();
        // bf16 has 7 mantissa bits: 1 + 2^-8 is a tie → even (1.0); 1 + 3·2^-8 → 1 + 2^-6.
        assert_eq!(t.to_f32_vec(), vec![1.0, 1.0, 1.015625]);
        let i = Tensor::from_f32(DType::I32, &[3], &[2.7, -2.7, f32::NAN]).unwrap();
        assert_eq!(i.to_f32_vec(), vec![2.0, -2.0, 0.0]);
    }

    #[test]
    fn i4_packs_per_row_low_nibble_first() {
        let mut t = Tensor::zeros(DType::I4, &[2, 3]);
        for i in 0..6 {
            t.set_f32(i, (i + 9) as f32);
        }
        match t.storage() {
            Storage::I4(bytes) => assert_eq!(bytes, &vec![0xA9, 0x0B, 0xDC, 0x0E]),
            other => panic!("{other:?}"),
        }
        assert_eq!(t.get_f32(4), 13.0);
    }

    #[test]
    fn f8_round_trips_every_code() {
        for f in [F8E4M3, F8E5M2] {
            for code in 0u8..=255 {
                let v = f8_to_f32(code, f);
                if v.is_nan() {
                    continue;
                }
                let back = f32_to_f8(v, f);
                assert_eq!(f8_to_f32(back, f), v, "code {code:#x}");
            }
        }
        assert_eq!(f8_to_f32(f32_to_f8(448.0, F8E4M3), F8E4M3), 448.0);
        assert_eq!(f8_to_f32(f32_to_f8(1e6, F8E4M3), F8E4M3), 448.0);
        assert_eq!(f8_to_f32(f32_to_f8(57344.0, F8E5M2), F8E5M2), 57344.0);
    }
}
