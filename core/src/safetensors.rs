//! The safetensors format's header, read strictly: one parser for every reader in the
//! project (the model importer's memory-mapped checkpoints, `amk run --weights`), so that the
//! same file is accepted or refused the same way everywhere.
//!
//! The format: an 8-byte little-endian header length `N`, `N` bytes of JSON (an object from
//! tensor name to `{dtype, shape, data_offsets: [begin, end]}`, plus an optional
//! `__metadata__` entry, which is ignored), then the data section the offsets index into.
//! Refused: a header past [`MAX_HEADER_BYTES`] or past the end of the file, invalid UTF-8 or
//! JSON, a dtype the caller does not accept, offsets out of range, overlapping (two names for
//! one byte range, which a reader would copy twice) or leaving holes, trailing bytes no tensor
//! indexes, and a byte count that does not match the shape.

use crate::ir::DType;
use crate::json::{self, Value};

/// The largest header accepted (the reference implementation's limit): a longer one means the
/// file is not safetensors, and parsing it would only waste time and memory.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor as described by the header (validated: offsets inside the data section and
/// consistent with dtype and shape).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// The tensor's name in the checkpoint.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Start of its bytes, relative to the data section.
    pub begin: usize,
    /// End (exclusive) of its bytes, relative to the data section.
    pub end: usize,
}

/// The dtypes a reader accepts: the safetensors names it maps, and how to list them in an
/// error.
pub struct Accepted<'a> {
    /// A safetensors dtype name to its [`DType`], `None` for a dtype the reader refuses.
    pub dtype: &'a dyn Fn(&str) -> Option<DType>,
    /// The accepted names, for messages (`"F32, F16, BF16"`).
    pub names: &'a str,
}

/// Validates the header of a whole safetensors file held in `bytes` (the data section need
/// only be addressable, e.g. memory-mapped): returns where the data section starts and every
/// tensor entry (in header order).
///
/// Errors are messages (naming the tensor where there is one); the caller names the file.
pub fn parse_header(
    bytes: &[u8],
    accepted: &Accepted<'_>,
) -> Result<(usize, Vec<TensorEntry>), String> {
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
        entries.push(parse_entry(name, info, data_len, accepted)?);
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
fn parse_entry(
    name: &str,
    info: &Value,
    data_len: usize,
    accepted: &Accepted<'_>,
) -> Result<TensorEntry, String> {
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
    let dtype = (accepted.dtype)(dname).ok_or_else(|| {
        err(format!(
            "dtype {dname} is not supported (supported: {})",
            accepted.names
        ))
    })?;
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
    let want = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.bits()))
        .map(|bits| bits.div_ceil(8));
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
