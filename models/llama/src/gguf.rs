//! GGUF (versions 2 and 3) reader.
//!
//! Layout (little-endian): magic `"GGUF"`, `u32` version, `u64` tensor count, `u64` metadata
//! key/value count, the key/value pairs (`string` key, `u32` value type, value), the tensor
//! infos (`string` name, `u32` n_dims, `u64` dims innermost-first, `u32` ggml type, `u64`
//! offset relative to the data section), padding to `general.alignment` (default 32), then
//! the data section. A `string` is a `u64` byte length and UTF-8 bytes; an array is a `u32`
//! element type, a `u64` count and the elements (arrays may nest).
//!
//! The whole file is read into memory (the workspace forbids `unsafe`, so no mmap). Every
//! size and offset is computed with checked arithmetic and checked against the file length
//! when the file is parsed, so [`GgufFile::tensor`] only fails on unsupported types. Shapes
//! are reported row-major: GGUF's `[ne0, ne1, …]` (ne0 = row length) becomes `[…, ne1, ne0]`.

pub mod write;

use crate::error::ModelError;
use amk_core::ir::DType;
use amk_core::tensor::{Storage, Tensor};
use half::{bf16, f16};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The GGUF magic.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// The deepest array nesting accepted (guards the recursion against hostile files).
pub const MAX_ARRAY_DEPTH: usize = 16;

/// The most memory the parsed metadata may take (its values, their strings), whatever the
/// file. Arrays of scalars cost their bytes ([`ScalarArray`]); an array of strings or arrays
/// costs a `GgufValue` (32 bytes) an element against at least 8 bytes of file. A vector built
/// from an array ([`GgufFile::get_i64_array`], ...) is held to the same bound. Real files stay
/// far below (a 150,000-token vocabulary with its merges: ≈ 20 MB).
pub const MAX_METADATA_MEMORY: u64 = 512 << 20;

/// A metadata value type code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// 0: `u8`.
    U8,
    /// 1: `i8`.
    I8,
    /// 2: `u16`.
    U16,
    /// 3: `i16`.
    I16,
    /// 4: `u32`.
    U32,
    /// 5: `i32`.
    I32,
    /// 6: `f32`.
    F32,
    /// 7: `bool` (one byte, 0 or 1).
    Bool,
    /// 8: string.
    String,
    /// 9: array.
    Array,
    /// 10: `u64`.
    U64,
    /// 11: `i64`.
    I64,
    /// 12: `f64`.
    F64,
}

impl ValueType {
    /// The type of a code, if known.
    pub fn from_code(code: u32) -> Option<ValueType> {
        Some(match code {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The type's code.
    pub fn code(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// The size of one element of this type when it is a fixed-size scalar (every type but
    /// string and array).
    pub fn scalar_size(self) -> Option<usize> {
        match self {
            ValueType::String | ValueType::Array => None,
            t => Some(t.min_size() as usize),
        }
    }

    /// The fewest bytes one value of this type occupies in a file.
    fn min_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }

    /// Lower-case name (`"u32"`, `"string"`, …).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone)]
pub enum GgufValue {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// String.
    String(String),
    /// Array: element type and elements (all of that type; arrays may nest). The reader
    /// makes these for strings and nested arrays; arrays of scalars it reads as
    /// [`GgufValue::Scalars`].
    Array(ValueType, Vec<GgufValue>),
    /// An array of fixed-size scalars as the file stores them: one byte of memory a byte of
    /// file (as `Array` values, a `u8` array took 32). Equal to the `Array` of the same
    /// elements.
    Scalars(Box<ScalarArray>),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl GgufValue {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            GgufValue::U8(_) => ValueType::U8,
            GgufValue::I8(_) => ValueType::I8,
            GgufValue::U16(_) => ValueType::U16,
            GgufValue::I16(_) => ValueType::I16,
            GgufValue::U32(_) => ValueType::U32,
            GgufValue::I32(_) => ValueType::I32,
            GgufValue::F32(_) => ValueType::F32,
            GgufValue::Bool(_) => ValueType::Bool,
            GgufValue::String(_) => ValueType::String,
            GgufValue::Array(..) | GgufValue::Scalars(_) => ValueType::Array,
            GgufValue::U64(_) => ValueType::U64,
            GgufValue::I64(_) => ValueType::I64,
            GgufValue::F64(_) => ValueType::F64,
        }
    }

    /// A description for error messages (`"u32"`, `"array of string"`, …).
    pub fn type_description(&self) -> String {
        match self {
            GgufValue::Array(t, _) => format!("array of {}", t.name()),
            GgufValue::Scalars(a) => format!("array of {}", a.elem().name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an integer, for any integer type.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as `f64`, for `f32` and `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
}

impl PartialEq for GgufValue {
    /// Values of the same type and contents; an [`GgufValue::Array`] of scalars equals the
    /// [`GgufValue::Scalars`] of the same elements.
    fn eq(&self, other: &Self) -> bool {
        use GgufValue as V;
        match (self, other) {
            (V::U8(a), V::U8(b)) => a == b,
            (V::I8(a), V::I8(b)) => a == b,
            (V::U16(a), V::U16(b)) => a == b,
            (V::I16(a), V::I16(b)) => a == b,
            (V::U32(a), V::U32(b)) => a == b,
            (V::I32(a), V::I32(b)) => a == b,
            (V::F32(a), V::F32(b)) => a == b,
            (V::Bool(a), V::Bool(b)) => a == b,
            (V::String(a), V::String(b)) => a == b,
            (V::U64(a), V::U64(b)) => a == b,
            (V::I64(a), V::I64(b)) => a == b,
            (V::F64(a), V::F64(b)) => a == b,
            (V::Array(t, a), V::Array(u, b)) => t == u && a == b,
            (V::Scalars(a), V::Scalars(b)) => a == b,
            (V::Array(t, items), V::Scalars(a)) | (V::Scalars(a), V::Array(t, items)) => {
                *t == a.elem()
                    && items.len() == a.len()
                    && items.iter().zip(a.iter()).all(|(x, y)| *x == y)
            }
            _ => false,
        }
    }
}

/// An array of fixed-size scalars, kept as their little-endian bytes.
#[derive(Debug, Clone)]
pub struct ScalarArray {
    elem: ValueType,
    data: Vec<u8>,
}

impl PartialEq for ScalarArray {
    /// Element by element, as the values compare (floats as numbers: `NaN` unequal, `-0 == 0`),
    /// so that it agrees with an [`GgufValue::Array`] of the same elements.
    fn eq(&self, other: &Self) -> bool {
        self.elem == other.elem
            && self.len() == other.len()
            && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl ScalarArray {
    /// The array of `elem` elements whose bytes are `data` (little-endian, back to back), or
    /// why it is not one: a type that is not a fixed-size scalar, a length that is not a
    /// whole number of elements, a bool byte other than 0 or 1.
    pub fn new(elem: ValueType, data: Vec<u8>) -> Result<ScalarArray, String> {
        let size = elem
            .scalar_size()
            .ok_or_else(|| format!("{} is not a fixed-size scalar type", elem.name()))?;
        if !data.len().is_multiple_of(size) {
            return Err(format!(
                "{} bytes are not a whole number of {} elements",
                data.len(),
                elem.name()
            ));
        }
        if elem == ValueType::Bool
            && let Some(b) = data.iter().find(|&&b| b > 1)
        {
            return Err(format!("bool byte {b} is neither 0 nor 1"));
        }
        Ok(ScalarArray { elem, data })
    }

    /// The element type.
    pub fn elem(&self) -> ValueType {
        self.elem
    }

    /// The elements' bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.data.len() / self.elem.scalar_size().unwrap_or(1)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Element `i` as a value.
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        let size = self.elem.scalar_size()?;
        let start = i.checked_mul(size)?;
        let b = self.data.get(start..start.checked_add(size)?)?;
        let mut w = [0u8; 8];
        w[..size].copy_from_slice(b);
        Some(match self.elem {
            ValueType::U8 => GgufValue::U8(w[0]),
            ValueType::I8 => GgufValue::I8(w[0] as i8),
            ValueType::Bool => GgufValue::Bool(w[0] == 1),
            ValueType::U16 => GgufValue::U16(u16::from_le_bytes([w[0], w[1]])),
            ValueType::I16 => GgufValue::I16(i16::from_le_bytes([w[0], w[1]])),
            ValueType::U32 => GgufValue::U32(u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            ValueType::I32 => GgufValue::I32(i32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            ValueType::F32 => GgufValue::F32(f32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            ValueType::U64 => GgufValue::U64(u64::from_le_bytes(w)),
            ValueType::I64 => GgufValue::I64(i64::from_le_bytes(w)),
            ValueType::F64 => GgufValue::F64(f64::from_le_bytes(w)),
            ValueType::String | ValueType::Array => return None,
        })
    }

    /// The elements as values.
    pub fn iter(&self) -> impl Iterator<Item = GgufValue> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

/// A ggml tensor type code (kept open: files may hold types this reader cannot decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GgmlType(pub u32);

#[allow(missing_docs)]
impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q8_1: GgmlType = GgmlType(9);
    pub const Q2_K: GgmlType = GgmlType(10);
    pub const Q3_K: GgmlType = GgmlType(11);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const Q8_K: GgmlType = GgmlType(15);
    pub const I8: GgmlType = GgmlType(24);
    pub const I16: GgmlType = GgmlType(25);
    pub const I32: GgmlType = GgmlType(26);
    pub const I64: GgmlType = GgmlType(27);
    pub const F64: GgmlType = GgmlType(28);
    pub const BF16: GgmlType = GgmlType(30);
}

impl GgmlType {
    /// The type's name as ggml spells it (`"Q4_K"`), or `"unknown"`.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            _ => "unknown",
        }
    }

    /// `(elements per block, bytes per block)`, for the types whose layout is known.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        Some(match self.0 {
            0 => (1, 4),
            1 => (1, 2),
            2 => (32, 18),
            3 => (32, 20),
            6 => (32, 22),
            7 => (32, 24),
            8 => (32, 34),
            9 => (32, 36),
            10 => (256, 84),
            11 => (256, 110),
            12 => (256, 144),
            13 => (256, 176),
            14 => (256, 210),
            15 => (256, 292),
            20 => (32, 18),
            24 => (1, 1),
            25 => (1, 2),
            26 => (1, 4),
            27 => (1, 8),
            28 => (1, 8),
            30 => (1, 2),
            _ => return None,
        })
    }

    /// Whether [`GgufFile::tensor`] can dequantise this type.
    pub fn is_supported(self) -> bool {
        matches!(self.0, 0 | 1 | 2 | 3 | 8 | 12 | 14 | 30)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// One tensor's description.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Name (`"blk.0.attn_q.weight"`).
    pub name: String,
    /// Row-major shape (`[ne[n-1], …, ne[0]]`; the last dim is GGUF's `ne[0]`, the row length).
    pub shape: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the data, relative to the data section.
    pub offset: u64,
    /// Byte length of the data (`None` for a type whose layout is unknown).
    pub n_bytes: Option<u64>,
}

impl TensorInfo {
    /// Number of elements (saturating; the parser checked it fits).
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

/// A parsed GGUF file held in memory.
#[derive(Clone)]
pub struct GgufFile {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, GgufValue)>,
    meta_index: BTreeMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: BTreeMap<String, usize>,
    data_start: usize,
    bytes: Backing,
}

/// The file's bytes: read into memory (tests, [`GgufFile::parse`]) or memory-mapped
/// ([`GgufFile::read`], so a multi-GB model is not copied before its tensors are used).
#[derive(Clone)]
enum Backing {
    Owned(Arc<Vec<u8>>),
    Mapped(Arc<memmap2::Mmap>),
}

impl std::ops::Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Owned(v) => v,
            Backing::Mapped(m) => m,
        }
    }
}

/// Maps `file` read-only.
#[allow(unsafe_code)]
fn map_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and private to this process; the one assumption is that no
    // other process truncates or rewrites the model file while it is open (then reads could
    // fault or see changed bytes — the same contract every mmap-based model loader has). Tensor
    // data is copied out and dequantised on load, so nothing keeps pointing into the map for
    // long.
    unsafe { memmap2::Mmap::map(file) }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the bytes (models are hundreds of MB) nor the long arrays (the vocabulary).
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata_keys", &self.meta_index.keys().collect::<Vec<_>>())
            .field("tensors", &self.tensors.len())
            .field("data_start", &self.data_start)
            .field("file_len", &self.bytes.len())
            .finish()
    }
}

/// A bounds-checked cursor over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Memory the metadata parsed so far takes (bounded by [`MAX_METADATA_MEMORY`]).
    spent: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos.min(self.buf.len())) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], ModelError> {
        let truncated = || ModelError::Truncated {
            what: what(),
            offset: self.pos as u64,
            need: n,
            len: self.buf.len() as u64,
        };
        let n_usize = usize::try_from(n).map_err(|_| truncated())?;
        let end = self.pos.checked_add(n_usize).ok_or_else(truncated)?;
        let s = self.buf.get(self.pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], ModelError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, ModelError> {
        let start = self.pos;
        let len = self.u64(&|| format!("length of {}", what()))?;
        if len > self.remaining() {
            return Err(ModelError::Truncated {
                what: format!("{} (string of {len} bytes)", what()),
                offset: start as u64,
                need: len.saturating_add(8),
                len: self.buf.len() as u64,
            });
        }
        self.spend(len, what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            ModelError::Corrupt(format!("{} at byte {start}: invalid UTF-8 ({e})", what()))
        })
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in the rest of
    /// the file (so a hostile count cannot make us allocate or loop absurdly).
    /// Counts `bytes` more of parsed metadata against [`MAX_METADATA_MEMORY`] (before they
    /// are allocated).
    fn spend(&mut self, bytes: u64, what: &dyn Fn() -> String) -> Result<(), ModelError> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > MAX_METADATA_MEMORY {
            return Err(ModelError::Corrupt(format!(
                "{}: the metadata would take more than {} MiB of memory",
                what(),
                MAX_METADATA_MEMORY >> 20
            )));
        }
        Ok(())
    }

    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<usize, ModelError> {
        let need = count.checked_mul(min_size);
        match need {
            Some(need) if need <= self.remaining() => usize::try_from(count)
                .map_err(|_| ModelError::Corrupt(format!("{what}: absurd count {count}"))),
            _ => Err(ModelError::Corrupt(format!(
                "{what}: absurd count {count} at byte {} (the remaining {} bytes cannot hold it)",
                self.pos,
                self.remaining()
            ))),
        }
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<GgufValue, ModelError> {
        let what = || format!("value of '{key}'");
        Ok(match ty {
            ValueType::U8 => GgufValue::U8(u8::from_le_bytes(self.array(&what)?)),
            ValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.array(&what)?)),
            ValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => {
                let at = self.pos;
                match self.array::<1>(&what)? {
                    [0] => GgufValue::Bool(false),
                    [1] => GgufValue::Bool(true),
                    [b] => {
                        return Err(ModelError::Corrupt(format!(
                            "{} at byte {at}: bool byte {b} is neither 0 nor 1",
                            what()
                        )));
                    }
                }
            }
            ValueType::String => GgufValue::String(self.string(&what)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(ModelError::Corrupt(format!(
                        "{}: arrays nested deeper than {MAX_ARRAY_DEPTH}",
                        what()
                    )));
                }
                let at = self.pos;
                let code = self.u32(&|| format!("array element type of '{key}'"))?;
                let elem = ValueType::from_code(code).ok_or_else(|| {
                    ModelError::Corrupt(format!(
                        "'{key}' at byte {at}: unknown array element type {code}"
                    ))
                })?;
                let count = self.u64(&|| format!("array length of '{key}'"))?;
                let n = self.check_count(count, elem.min_size(), &format!("array '{key}'"))?;
                if let Some(size) = elem.scalar_size() {
                    // Scalars stay as the file's bytes: memory in proportion to the file.
                    let bytes = (n as u64).saturating_mul(size as u64);
                    self.spend(bytes, &|| format!("array '{key}'"))?;
                    let at = self.pos;
                    let data = self.take(bytes, &|| format!("array '{key}'"))?.to_vec();
                    let array = ScalarArray::new(elem, data).map_err(|e| {
                        ModelError::Corrupt(format!("array '{key}' at byte {at}: {e}"))
                    })?;
                    return Ok(GgufValue::Scalars(Box::new(array)));
                }
                let item = std::mem::size_of::<GgufValue>() as u64;
                self.spend((n as u64).saturating_mul(item), &|| {
                    format!("array '{key}'")
                })?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                GgufValue::Array(elem, items)
            }
        })
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    let r = x % a;
    if r == 0 {
        Some(x)
    } else {
        x.checked_add(a - r)
    }
}

/// What a GGUF file's header says: its version and how many metadata pairs and tensor infos
/// follow (each count checked against the bytes left).
struct Counts {
    version: u32,
    n_kv: usize,
    n_tensors: usize,
}

/// The parsed header, metadata and tensor infos, and where the data section starts.
struct Layout {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<TensorInfo>,
    data_start: usize,
}

/// The magic, the version (2 or 3) and the two counts.
fn read_header(c: &mut Cursor<'_>, bytes: &[u8]) -> Result<Counts, ModelError> {
    let magic = bytes.get(..4).unwrap_or(bytes);
    if magic != MAGIC {
        return Err(ModelError::BadMagic {
            found: magic.to_vec(),
        });
    }
    c.pos = 4;
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(ModelError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor
    // info at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
    let n_kv = c.check_count(n_kv, 13, "metadata count")?;
    let n_tensors = c.check_count(n_tensors, 24, "tensor count")?;
    Ok(Counts {
        version,
        n_kv,
        n_tensors,
    })
}

/// Metadata pairs in file order.
type Metadata = Vec<(String, GgufValue)>;

/// The `n_kv` metadata pairs, in file order, and each key's index (a key twice is corrupt).
fn read_metadata(
    c: &mut Cursor<'_>,
    n_kv: usize,
) -> Result<(Metadata, BTreeMap<String, usize>), ModelError> {
    let mut metadata = Vec::with_capacity(n_kv);
    let mut seen = BTreeMap::new();
    for i in 0..n_kv {
        let at = c.pos;
        let key = c.string(&|| format!("key of metadata pair {i}"))?;
        let code = c.u32(&|| format!("value type of '{key}'"))?;
        let ty = ValueType::from_code(code).ok_or_else(|| {
            ModelError::Corrupt(format!(
                "metadata '{key}' at byte {at}: unknown value type {code}"
            ))
        })?;
        let v = c.value(ty, &key, 0)?;
        if seen.insert(key.clone(), metadata.len()).is_some() {
            return Err(ModelError::Corrupt(format!(
                "duplicate metadata key '{key}'"
            )));
        }
        metadata.push((key, v));
    }

    Ok((metadata, seen))
}

/// `general.alignment` (a power-of-two u32), or the default.
fn alignment_of(
    metadata: &[(String, GgufValue)],
    seen: &BTreeMap<String, usize>,
) -> Result<u64, ModelError> {
    Ok(
        match seen.get("general.alignment").and_then(|&i| metadata.get(i)) {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => {
                let a = match v {
                    GgufValue::U32(a) => u64::from(*a),
                    other => {
                        return Err(ModelError::Corrupt(format!(
                            "general.alignment is {}, expected u32",
                            other.type_description()
                        )));
                    }
                };
                if a == 0 || !a.is_power_of_two() {
                    return Err(ModelError::Corrupt(format!(
                        "general.alignment {a} is not a power of two"
                    )));
                }
                a
            }
        },
    )
}

/// Tensor info `i`: its name, dims (GGUF's order reversed into row-major), type, offset (a
/// multiple of `alignment`) and byte size (for the block types amk reads).
fn read_tensor_info(
    c: &mut Cursor<'_>,
    i: usize,
    alignment: u64,
) -> Result<TensorInfo, ModelError> {
    let name = c.string(&|| format!("name of tensor {i}"))?;
    let n_dims = c.u32(&|| format!("n_dims of tensor '{name}'"))?;
    if n_dims > MAX_DIMS {
        return Err(ModelError::Corrupt(format!(
            "tensor '{name}': {n_dims} dims (at most {MAX_DIMS})"
        )));
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        ne.push(c.u64(&|| format!("dim {d} of tensor '{name}'"))?);
    }
    let ggml_type = GgmlType(c.u32(&|| format!("type of tensor '{name}'"))?);
    let offset = c.u64(&|| format!("offset of tensor '{name}'"))?;
    let numel = ne
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| {
            ModelError::Corrupt(format!(
                "tensor '{name}': element count of dims {ne:?} overflows"
            ))
        })?;
    let n_bytes = match ggml_type.block_layout() {
        None => None,
        Some((block, size)) => {
            let row = ne.first().copied().unwrap_or(1);
            if row % block != 0 {
                return Err(ModelError::Corrupt(format!(
                    "tensor '{name}': row length {row} is not a multiple of the \
                     {} block size {block}",
                    ggml_type.name()
                )));
            }
            Some((numel / block).checked_mul(size).ok_or_else(|| {
                ModelError::Corrupt(format!("tensor '{name}': byte size overflows"))
            })?)
        }
    };
    if offset % alignment != 0 {
        return Err(ModelError::Corrupt(format!(
            "tensor '{name}': offset {offset} is not a multiple of the alignment \
             {alignment}"
        )));
    }
    let shape: Vec<u64> = ne.iter().rev().copied().collect();
    Ok(TensorInfo {
        name,
        shape,
        ggml_type,
        offset,
        n_bytes,
    })
}

/// Each tensor's index by name (a name twice is corrupt), every tensor's data within the
/// file's `file_len` bytes from `data_start`.
fn index_tensors(
    tensors: &[TensorInfo],
    data_start: usize,
    file_len: u64,
) -> Result<BTreeMap<String, usize>, ModelError> {
    let data_len = file_len.saturating_sub(data_start as u64);
    let mut tensor_index = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        if tensor_index.insert(t.name.clone(), i).is_some() {
            return Err(ModelError::Corrupt(format!(
                "duplicate tensor name '{}'",
                t.name
            )));
        }
        let n = t.n_bytes.unwrap_or(0);
        let end = t.offset.checked_add(n);
        match end {
            Some(end) if end <= data_len => {}
            _ => {
                return Err(ModelError::Truncated {
                    what: format!("data of tensor '{}' ({} bytes)", t.name, n),
                    offset: (data_start as u64).saturating_add(t.offset),
                    need: n,
                    len: file_len,
                });
            }
        }
    }
    Ok(tensor_index)
}

impl GgufFile {
    /// Reads and parses a GGUF file.
    pub fn read(path: impl AsRef<Path>) -> Result<GgufFile, ModelError> {
        let path = path.as_ref();
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let map = map_file(&file).map_err(io)?;
        GgufFile::parse_backing(Backing::Mapped(Arc::new(map)))
    }

    /// Parses GGUF bytes. Every tensor's extent is checked here, so later reads only fail on
    /// unsupported types.
    pub fn parse(bytes: Vec<u8>) -> Result<GgufFile, ModelError> {
        GgufFile::parse_backing(Backing::Owned(Arc::new(bytes)))
    }

    fn parse_backing(bytes: Backing) -> Result<GgufFile, ModelError> {
        let layout = {
            let mut c = Cursor {
                buf: &bytes,
                pos: 0,
                spent: 0,
            };
            let counts = read_header(&mut c, &bytes)?;
            let (metadata, seen) = read_metadata(&mut c, counts.n_kv)?;
            let alignment = alignment_of(&metadata, &seen)?;
            let tensors = (0..counts.n_tensors)
                .map(|i| read_tensor_info(&mut c, i, alignment))
                .collect::<Result<Vec<_>, _>>()?;
            let data_start = align_up(c.pos as u64, alignment)
                .and_then(|d| usize::try_from(d).ok())
                .ok_or_else(|| ModelError::Corrupt("data section start overflows".into()))?;
            Layout {
                version: counts.version,
                alignment,
                metadata,
                tensors,
                data_start,
            }
        };
        let tensor_index = index_tensors(&layout.tensors, layout.data_start, bytes.len() as u64)?;
        let meta_index = (layout.metadata.iter())
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        Ok(GgufFile {
            version: layout.version,
            alignment: layout.alignment,
            metadata: layout.metadata,
            meta_index,
            tensors: layout.tensors,
            tensor_index,
            data_start: layout.data_start,
            bytes,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }
    /// The data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// Byte offset of the data section in the file.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// Metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }
    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.meta_index
            .get(key)
            .and_then(|&i| self.metadata.get(i))
            .map(|(_, v)| v)
    }
    /// Whether a metadata key is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.meta_index.contains_key(key)
    }

    fn require(&self, key: &str) -> Result<&GgufValue, ModelError> {
        self.get(key)
            .ok_or_else(|| ModelError::MissingKey(key.to_string()))
    }

    fn key_type(key: &str, expected: &str, found: &GgufValue) -> ModelError {
        ModelError::KeyType {
            key: key.to_string(),
            expected: expected.to_string(),
            found: found.type_description(),
        }
    }

    /// An integer value (any GGUF integer type) that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, ModelError> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| Self::key_type(key, "an integer fitting u32", v))
    }
    /// An integer value (any GGUF integer type) that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64, ModelError> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|x| u64::try_from(x).ok())
            .ok_or_else(|| Self::key_type(key, "an integer fitting u64", v))
    }
    /// An integer value (any GGUF integer type) that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64, ModelError> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|x| i64::try_from(x).ok())
            .ok_or_else(|| Self::key_type(key, "an integer fitting i64", v))
    }
    /// A float value (`f32`, or `f64` rounded to `f32`).
    pub fn get_f32(&self, key: &str) -> Result<f32, ModelError> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| Self::key_type(key, "f32", v))
    }
    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool, ModelError> {
        match self.require(key)? {
            GgufValue::Bool(b) => Ok(*b),
            v => Err(Self::key_type(key, "bool", v)),
        }
    }
    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, ModelError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::key_type(key, "string", v))
    }
    /// An array value's element type and length.
    pub fn get_array_len(&self, key: &str) -> Result<(ValueType, usize), ModelError> {
        match self.require(key)? {
            GgufValue::Array(t, items) => Ok((*t, items.len())),
            GgufValue::Scalars(a) => Ok((a.elem(), a.len())),
            v => Err(Self::key_type(key, "array", v)),
        }
    }
    /// An array of strings (the tokenizer vocabulary, merges, …).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, ModelError> {
        let v = self.require(key)?;
        match v {
            GgufValue::Array(ValueType::String, items) => items
                .iter()
                .map(|s| {
                    s.as_str()
                        .ok_or_else(|| Self::key_type(key, "array of string", v))
                })
                .collect(),
            _ => Err(Self::key_type(key, "array of string", v)),
        }
    }
    /// Refuses to turn an array of `len` elements into a vector of `elem_bytes` each past the
    /// metadata budget: a file's compact array of bytes must not become gigabytes of `i64`.
    fn check_materialised(key: &str, len: usize, elem_bytes: usize) -> Result<(), ModelError> {
        if (len as u64).saturating_mul(elem_bytes as u64) > MAX_METADATA_MEMORY {
            return Err(ModelError::Corrupt(format!(
                "'{key}': {len} elements would take more than {} MiB of memory",
                MAX_METADATA_MEMORY >> 20
            )));
        }
        Ok(())
    }

    /// An array of floats (`f32` or `f64` elements), e.g. token scores.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, ModelError> {
        let (_, len) = self.get_array_len(key)?;
        Self::check_materialised(key, len, 4)?;
        let v = self.require(key)?;
        match v {
            GgufValue::Array(ValueType::F32 | ValueType::F64, items) => items
                .iter()
                .map(|x| {
                    x.as_f64()
                        .map(|f| f as f32)
                        .ok_or_else(|| Self::key_type(key, "array of f32", v))
                })
                .collect(),
            GgufValue::Scalars(a) if matches!(a.elem(), ValueType::F32 | ValueType::F64) => Ok(a
                .iter()
                .filter_map(|x| x.as_f64())
                .map(|f| f as f32)
                .collect()),
            _ => Err(Self::key_type(key, "array of f32", v)),
        }
    }
    /// An array of integers (any integer element type) that fit in `i64`, e.g. token types.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, ModelError> {
        let (_, len) = self.get_array_len(key)?;
        Self::check_materialised(key, len, 8)?;
        let v = self.require(key)?;
        let int = |x: GgufValue| {
            x.as_i128()
                .and_then(|i| i64::try_from(i).ok())
                .ok_or_else(|| Self::key_type(key, "array of integers", v))
        };
        match v {
            GgufValue::Array(_, items) => items.iter().cloned().map(int).collect(),
            GgufValue::Scalars(a) => a.iter().map(int).collect(),
            _ => Err(Self::key_type(key, "array of integers", v)),
        }
    }

    /// Tensor names in file order.
    pub fn tensor_names(&self) -> Vec<&str> {
        self.tensors.iter().map(|t| t.name.as_str()).collect()
    }
    /// Tensor infos in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }
    /// One tensor's info.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn unsupported(info: &TensorInfo) -> ModelError {
        ModelError::UnsupportedTensorType {
            tensor: info.name.clone(),
            type_name: info.ggml_type.name().to_string(),
            code: info.ggml_type.0,
        }
    }

    /// A tensor's raw bytes (as stored: quantised blocks for quantised types).
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], ModelError> {
        let info = self.tensor_info(name)?;
        let n = info.n_bytes.ok_or_else(|| Self::unsupported(info))?;
        let start = (self.data_start as u64).checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(n));
        start
            .zip(end)
            .and_then(|(s, e)| Some((usize::try_from(s).ok()?, usize::try_from(e).ok()?)))
            .and_then(|(s, e)| self.bytes.get(s..e))
            .ok_or_else(|| ModelError::Truncated {
                what: format!("data of tensor '{name}'"),
                offset: start.unwrap_or(u64::MAX),
                need: n,
                len: self.bytes.len() as u64,
            })
    }

    /// A tensor dequantised to `F32`, with its row-major shape.
    pub fn tensor(&self, name: &str) -> Result<Tensor, ModelError> {
        let info = self.tensor_info(name)?;
        if !info.ggml_type.is_supported() {
            return Err(Self::unsupported(info));
        }
        let raw = self.tensor_bytes(name)?;
        let values = dequantize(info.ggml_type, raw).ok_or_else(|| Self::unsupported(info))?;
        // Hand the dequantised vector over as the tensor's storage (no zero-fill, no copy).
        Tensor::from_storage(DType::F32, &info.shape, Storage::F32(values))
            .map_err(|e| ModelError::Shape(format!("tensor '{name}': {e}")))
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    match b.get(i..i + 2) {
        Some(s) => f16::from_le_bytes([s[0], s[1]]).to_f32(),
        None => f32::NAN,
    }
}

/// Dequantises raw bytes of a supported type (whole blocks) to `f32`; `None` for a type
/// that [`GgmlType::is_supported`] rejects.
pub fn dequantize(ty: GgmlType, raw: &[u8]) -> Option<Vec<f32>> {
    let (block, size) = ty.block_layout()?;
    let (block, size) = (block as usize, size as usize);
    let mut out = Vec::with_capacity(raw.len() / size * block);
    let blocks = raw.chunks_exact(size);
    match ty {
        GgmlType::F32 => out.extend(blocks.map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        GgmlType::F16 => out.extend(blocks.map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())),
        GgmlType::BF16 => out.extend(blocks.map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        GgmlType::Q8_0 => {
            for b in blocks {
                let d = f16_at(b, 0);
                out.extend(b[2..34].iter().map(|&q| d * f32::from(q as i8)));
            }
        }
        GgmlType::Q4_0 => {
            for b in blocks {
                let d = f16_at(b, 0);
                let qs = &b[2..18];
                out.extend(qs.iter().map(|&q| d * (f32::from(q & 0xF) - 8.0)));
                out.extend(qs.iter().map(|&q| d * (f32::from(q >> 4) - 8.0)));
            }
        }
        GgmlType::Q4_1 => {
            for b in blocks {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let qs = &b[4..20];
                out.extend(qs.iter().map(|&q| d * f32::from(q & 0xF) + m));
                out.extend(qs.iter().map(|&q| d * f32::from(q >> 4) + m));
            }
        }
        GgmlType::Q4_K => {
            for b in blocks {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let scales = &b[4..16];
                let qs = &b[16..144];
                for j in 0..4 {
                    let (sc1, m1) = scale_min_k4(2 * j, scales);
                    let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
                    let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
                    let q = &qs[32 * j..32 * j + 32];
                    out.extend(q.iter().map(|&x| d1 * f32::from(x & 0xF) - m1));
                    out.extend(q.iter().map(|&x| d2 * f32::from(x >> 4) - m2));
                }
            }
        }
        GgmlType::Q6_K => {
            for b in blocks {
                let (ql_all, qh_all, sc_all) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for n in 0..2 {
                    let ql = &ql_all[64 * n..64 * n + 64];
                    let qh = &qh_all[32 * n..32 * n + 32];
                    let sc = &sc_all[8 * n..8 * n + 8];
                    let mut y = [0f32; 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                        let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                        let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                        let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                        let s = |k: usize| d * f32::from(sc[is + k] as i8);
                        y[l] = s(0) * q1 as f32;
                        y[l + 32] = s(2) * q2 as f32;
                        y[l + 64] = s(4) * q3 as f32;
                        y[l + 96] = s(6) * q4 as f32;
                    }
                    out.extend_from_slice(&y);
                }
            }
        }
        _ => return None,
    }
    Some(out)
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}
