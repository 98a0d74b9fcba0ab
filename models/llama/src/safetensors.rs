//! A strict, memory-mapped safetensors reader for model checkpoints.
//!
//! The format: an 8-byte little-endian header length `N`, `N` bytes of JSON (an object from
//! tensor name to `{dtype, shape, data_offsets: [begin, end]}`, plus an optional
//! `__metadata__` entry, which is ignored), then the data section the offsets index into.
//!
//! The header is `amk_core::safetensors`' strict parser (the one `amk run --weights` uses too);
//! this module adds what checkpoints need: the file is memory-mapped instead of read (they are
//! gigabytes), the header is validated in full before any tensor is copied (so an importer can
//! look at the names and refuse a model without touching its data), only F32/F16/BF16 are
//! accepted, and every defect is a [`ModelError::Safetensors`] naming the file.

use std::fs::File;
use std::path::{Path, PathBuf};

use amk_core::safetensors::Accepted;
pub use amk_core::safetensors::{MAX_HEADER_BYTES, TensorEntry};
use amk_core::{DType, Tensor};
use memmap2::Mmap;

use crate::error::ModelError;

/// The dtypes this reader accepts: the ones Llama-family checkpoints are stored in and the
/// lowering knows how to convert.
const ACCEPTED: &str = "F32, F16, BF16";

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

/// The header length a safetensors file at `path` declares (its first 8 bytes), or `None` when
/// they cannot be read (the full open reports why).
pub fn declared_header_len(path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut head = [0u8; 8];
    File::open(path).ok()?.read_exact(&mut head).ok()?;
    Some(u64::from_le_bytes(head))
}

/// Validates the header of a whole safetensors file held in `bytes`, accepting the checkpoint
/// dtypes F32, F16 and BF16 ([`amk_core::safetensors::parse_header`]).
pub fn parse_header(bytes: &[u8]) -> Result<(usize, Vec<TensorEntry>), String> {
    let dtype = |name: &str| match name {
        "F32" => Some(DType::F32),
        "F16" => Some(DType::F16),
        "BF16" => Some(DType::BF16),
        _ => None,
    };
    amk_core::safetensors::parse_header(
        bytes,
        &Accepted {
            dtype: &dtype,
            names: ACCEPTED,
        },
    )
}
