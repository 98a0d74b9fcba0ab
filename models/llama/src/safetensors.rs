//! A strict, memory-mapped safetensors reader for model checkpoints.
//!
//! The format: an 8-byte little-endian header length `N`, `N` bytes of JSON (an object from
//! tensor name to `{dtype, shape, data_offsets: [begin, end]}`, plus an optional
//! `__metadata__` entry, which is ignored), then the data section the offsets index into.
//!
//! Why a second reader next to `amk_core::WeightStore::from_safetensors_bytes`: checkpoints are
//! gigabytes, so the file is memory-mapped instead of read, the header is validated in full
//! before any tensor is copied (so an importer can look at the names and refuse a model
//! without touching its data), and every defect is a [`ModelError::Safetensors`] naming the
//! file and the tensor: truncation, a header running past the end, invalid JSON, a dtype other
//! than F32/F16/BF16, offsets out of range, overlapping or leaving holes, and a byte count that
//! does not match the shape.

use std::fs::File;
use std::path::{Path, PathBuf};

use amk_core::json::{self, Value};
use amk_core::{DType, Tensor};
use memmap2::Mmap;

use crate::error::ModelError;

/// The dtypes this reader accepts: the ones Llama-family checkpoints are stored in and the
/// lowering knows how to convert.
const ACCEPTED: &str = "F32, F16, BF16";

/// The largest header accepted (the reference implementation's limit): a longer one means the
/// file is not safetensors, and parsing it would only waste time and memory.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor as described by the header (validated: offsets inside the data section and
/// consistent with dtype and shape).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// The tensor's name in the checkpoint.
    pub name: String,
    /// Its element type (F32, F16 or BF16).
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Start of its bytes, relative to the data section.
    pub begin: usize,
    /// End (exclusive) of its bytes, relative to the data section.
    pub end: usize,
}

/// An opened safetensors file: the mapping plus its validated header.
///
/// The mapping lives as long as this value; tensors are copied out by [`SafetensorsFile::tensor`]
/// so nothing returned borrows the file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: Mmap,
    data_start: usize,
    entries: Vec<TensorEntry>,
}

/// Maps `file` read-only.
#[allow(unsafe_code)]
fn map_file(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: `Mmap::map` is unsafe because the mapped bytes could change (or vanish, giving
    // SIGBUS) if another process modified or truncated the file while it is mapped. We assume
    // checkpoint files are not modified while an import runs; the mapping is only read, every
    // tensor we keep is copied out into an owned `Tensor`, and the mapping is dropped when the
    // import finishes.
    unsafe { Mmap::map(file) }
}

impl SafetensorsFile {
    /// Memory-maps `path` and validates its header (every entry, before any data is copied).
    ///
    /// # Errors
    /// [`ModelError::Io`] if the file cannot be opened or mapped, [`ModelError::Safetensors`]
    /// for any defect in the file.
    pub fn open(path: &Path) -> Result<SafetensorsFile, ModelError> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 8 {
            return Err(ModelError::Safetensors {
                path: path.to_path_buf(),
                message: format!("file is {len} bytes, shorter than the 8-byte header length"),
            });
        }
        let map = map_file(&file).map_err(io)?;
        let (data_start, entries) =
            parse_header(&map).map_err(|message| ModelError::Safetensors {
                path: path.to_path_buf(),
                message,
            })?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map,
            data_start,
            entries,
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every tensor in the file, in header order.
    pub fn entries(&self) -> &[TensorEntry] {
        &self.entries
    }

    /// The entry named `name`.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Copies the tensor of `entry` (one of [`SafetensorsFile::entries`]) out of the mapping,
    /// keeping its dtype.
    ///
    /// # Errors
    /// [`ModelError::Safetensors`] if the entry does not describe bytes of this file (an entry
    /// from another file).
    pub fn tensor(&self, entry: &TensorEntry) -> Result<Tensor, ModelError> {
        let err = |message: String| ModelError::Safetensors {
            path: self.path.clone(),
            message: format!("tensor '{}': {message}", entry.name),
        };
        let bytes = self
            .data_start
            .checked_add(entry.begin)
            .zip(self.data_start.checked_add(entry.end))
            .and_then(|(b, e)| self.map.get(b..e))
            .ok_or_else(|| err("data_offsets are not inside this file".into()))?;
        Tensor::from_le_bytes(entry.dtype, &entry.shape, bytes).map_err(|e| err(e.to_string()))
    }
}

/// Validates the header of a whole safetensors file held in `bytes`: returns where the data
/// section starts and every tensor entry (in header order).
///
/// Errors are messages (naming the tensor where there is one); the caller names the file.
pub fn parse_header(bytes: &[u8]) -> Result<(usize, Vec<TensorEntry>), String> {
    let file_len = bytes.len();
    let head: [u8; 8] = bytes
        .get(..8)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| {
            format!("file is {file_len} bytes, shorter than the 8-byte header length")
        })?;
    let n = u64::from_le_bytes(head);
    if n > MAX_HEADER_BYTES && n <= (file_len as u64).saturating_sub(8) {
        return Err(format!(
            "header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit; not a safetensors file?"
        ));
    }
    let data_start = 8u64
        .checked_add(n)
        .filter(|&e| e <= file_len as u64)
        .ok_or_else(|| {
            format!(
                "header length {n} runs past the end of the file ({file_len} bytes, so at most {} bytes of header)",
                file_len - 8
            )
        })? as usize;
    let header = bytes.get(8..data_start).unwrap_or_default();
    let text = std::str::from_utf8(header).map_err(|e| {
        format!("header is not UTF-8 ({e}); is the file truncated or not safetensors?")
    })?;
    let doc = json::parse(text).map_err(|e| format!("header is not valid JSON: {e}"))?;
    let map = doc
        .as_object()
        .ok_or_else(|| format!("header is {}, expected a JSON object", doc.type_name()))?;
    let data_len = file_len - data_start;

    let mut entries = Vec::with_capacity(map.len());
    for (name, info) in map.iter() {
        if name == "__metadata__" {
            continue;
        }
        entries.push(parse_entry(name, info, data_len)?);
    }

    // Offsets: no two tensors share bytes, and (as the format requires) the data section is
    // covered without holes, so a truncated or padded file cannot pass unnoticed.
    let mut order: Vec<&TensorEntry> = entries.iter().collect();
    order.sort_by_key(|e| (e.begin, e.end));
    let mut covered = 0usize;
    let mut prev: Option<&TensorEntry> = None;
    for e in order {
        if e.begin < covered {
            let other = prev.map_or(String::new(), |p| {
                format!(" '{}' (bytes {}..{})", p.name, p.begin, p.end)
            });
            return Err(format!(
                "tensor '{}': data_offsets [{}, {}] overlap tensor{other}",
                e.name, e.begin, e.end
            ));
        }
        if e.begin > covered {
            return Err(format!(
                "tensor '{}': data_offsets [{}, {}] leave a hole of {} unindexed bytes before it",
                e.name,
                e.begin,
                e.end,
                e.begin - covered
            ));
        }
        covered = e.end;
        prev = Some(e);
    }
    if covered != data_len {
        return Err(format!(
            "the data section is {data_len} bytes but the tensors cover only {covered}"
        ));
    }
    Ok((data_start, entries))
}

/// Reads and checks one header entry; `data_len` is the size of the data section.
fn parse_entry(name: &str, info: &Value, data_len: usize) -> Result<TensorEntry, String> {
    let err = |m: String| format!("tensor '{name}': {m}");
    let m = info
        .as_object()
        .ok_or_else(|| err(format!("entry is {}, expected an object", info.type_name())))?;
    let dname = match m.get("dtype") {
        Some(Value::Str(s)) => s.as_str(),
        Some(v) => {
            return Err(err(format!(
                "dtype is {}, expected a string",
                v.type_name()
            )));
        }
        None => return Err(err("missing dtype".into())),
    };
    let dtype = match dname {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        other => {
            return Err(err(format!(
                "dtype {other} is not supported (supported: {ACCEPTED})"
            )));
        }
    };
    let shape: Vec<u64> = m
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| err("missing shape (an array of non-negative integers)".into()))?
        .iter()
        .map(|d| d.as_i64().and_then(|d| u64::try_from(d).ok()))
        .collect::<Option<_>>()
        .ok_or_else(|| err("shape must be an array of non-negative integers".into()))?;
    let (begin, end) = m
        .get("data_offsets")
        .and_then(Value::as_array)
        .and_then(|a| match a {
            [b, e] => Some((
                b.as_i64().and_then(|x| u64::try_from(x).ok())?,
                e.as_i64().and_then(|x| u64::try_from(x).ok())?,
            )),
            _ => None,
        })
        .ok_or_else(|| err("data_offsets must be two non-negative integers [begin, end]".into()))?;
    if begin > end {
        return Err(err(format!(
            "data_offsets [{begin}, {end}] end before they begin"
        )));
    }
    if end > data_len as u64 {
        return Err(err(format!(
            "data_offsets [{begin}, {end}] run past the end of the data section ({data_len} bytes); is the file truncated?"
        )));
    }
    let elem = dtype.bits() / 8;
    let want = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(elem));
    let have = end - begin;
    if want != Some(have) {
        let want = want.map_or("more than 2^64".to_string(), |w| w.to_string());
        return Err(err(format!(
            "data_offsets [{begin}, {end}] hold {have} bytes, but {dtype} {shape:?} needs {want}"
        )));
    }
    Ok(TensorEntry {
        name: name.to_string(),
        dtype,
        shape,
        // Both fit: `end <= data_len`, a `usize`.
        begin: begin as usize,
        end: end as usize,
    })
}
