//! A small GGUF writer (versions 2 and 3), for tests and fixtures: metadata of every value
//! type and tensors given as raw bytes of any ggml type. It writes what it is told; a value
//! whose array elements disagree with the declared element type is written as given.

use super::{DEFAULT_ALIGNMENT, GgmlType, GgufValue, MAGIC};

/// A GGUF file under construction.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(t, items) => {
            out.extend_from_slice(&t.code().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                put_value(out, i);
            }
        }
        GgufValue::Scalars(a) => {
            out.extend_from_slice(&a.elem().code().to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            out.extend_from_slice(a.bytes());
        }
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl GgufWriter {
    /// An empty file of the given version (2 or 3; other values are written as given).
    pub fn new(version: u32) -> Self {
        GgufWriter {
            version,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Adds a metadata pair (in order; `general.alignment` as `U32` sets the alignment).
    pub fn kv(&mut self, key: impl Into<String>, value: GgufValue) -> &mut Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Adds a tensor: row-major `shape` (written innermost-first), ggml type and raw bytes.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push((name.into(), shape.to_vec(), ty, data));
        self
    }

    /// Adds an `F32` tensor.
    pub fn tensor_f32(
        &mut self,
        name: impl Into<String>,
        shape: &[u64],
        values: &[f32],
    ) -> &mut Self {
        let data = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, shape, GgmlType::F32, data)
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .rev()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", GgufValue::U32(a)) if *a > 0 => Some(u64::from(*a)),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment() as usize;
        let pad = |n: usize| n.div_ceil(align) * align;
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&v.value_type().code().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0usize;
        for (name, shape, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape.iter().rev() {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.0.to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = pad(offset + data.len());
        }
        let start = pad(out.len());
        out.resize(start, 0);
        for (i, (_, _, _, data)) in self.tensors.iter().enumerate() {
            out.extend_from_slice(data);
            if i + 1 < self.tensors.len() {
                out.resize(start + pad(out.len() - start), 0);
            }
        }
        out
    }

    /// Writes the file.
    pub fn write(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_bytes())
    }
}
