//! The backend contract: a backend loads a `ValidatedProgram` plus a `WeightStore` and returns
//! a `Session`; each `Session::step` runs one forward pass (counters start at 0, KV caches
//! persist across steps, IO inputs are set per step, IO outputs are read back).
//!
//! Also here: the weight store and its safetensors reader/writer (our own: the format is an
//! 8-byte header length, a JSON header, then raw little-endian data), and the binding of
//! WEIGHT/CONST buffers to tensors by `Buffer.source` (docs/ir.md, "Binding weights to
//! buffers").

use crate::cpu::OpError;
use crate::ir::{BufferKind, DType, Program, TaskId};
use crate::json::{self, Map, Value};
use crate::registry::Registry;
use crate::tensor::Tensor;
use crate::validate::ValidatedProgram;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What can go wrong loading or running a program on a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A weights file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A weights file is malformed (truncated, bad header, offsets out of range, …).
    #[error("{path}: not a valid safetensors file: {message}")]
    Format {
        /// File.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A WEIGHT/CONST buffer cannot be bound to its tensor.
    #[error("buffer '{buffer}': {message}")]
    Weights {
        /// Buffer name.
        buffer: String,
        /// What is wrong (names the tensor).
        message: String,
    },
    /// An IO input is unknown, mistyped or missing.
    #[error("input '{name}': {message}")]
    Input {
        /// Buffer name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// An op's reference refused a task.
    #[error("task {task} ({label}): {source}")]
    Op {
        /// Task.
        task: TaskId,
        /// Its label or opcode.
        label: String,
        /// Cause.
        source: OpError,
    },
    /// A task read a transient buffer before any writer finished (race-hunting mode).
    #[error(
        "race: task {task} ({label}) read buffer '{buffer}' before it was written (seed {seed})"
    )]
    Race {
        /// Reader.
        task: TaskId,
        /// Its label.
        label: String,
        /// Buffer name.
        buffer: String,
        /// Firing-order seed.
        seed: u64,
    },
    /// Tasks that can never fire (cannot happen for a validated program).
    #[error("deadlock: {0} task(s) never became ready")]
    Deadlock(usize),
    /// The backend cannot run this (no reference for an op, feature not compiled, …).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A forward pass did not finish within the watchdog's limit; the device was told to
    /// abort (whether it still answers is in the message).
    #[error("timeout: the forward pass did not finish within {after_ms} ms ({detail})")]
    Timeout {
        /// The watchdog's limit.
        after_ms: u64,
        /// What became of the launch.
        detail: String,
    },
    /// A task stopped on the device with an error (bad id, index out of range, …).
    #[error("device error in task {task} ({label}): {reason}")]
    DeviceTrap {
        /// Task.
        task: TaskId,
        /// Its label or opcode.
        label: String,
        /// What went wrong.
        reason: String,
    },
    /// The device or its driver failed.
    #[error("device: {0}")]
    Device(String),
}

/// One forward pass's IO outputs, by buffer name, in buffer order.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    /// `(name, value)` of every IO_OUTPUT buffer.
    pub tensors: Vec<(String, Tensor)>,
}

impl Outputs {
    /// The output named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

/// Rows of one buffer a loop of passes streams to the host as they are written
/// ([`Session::run_loop`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowWatch {
    /// An I32 buffer of rank 2 (`[rows, columns]`), STATE or IO_OUTPUT.
    pub buffer: String,
    /// The first row reported. Before the run the backend sets element 0 of this row and of
    /// every later one to [`RowWatch::UNWRITTEN`]; a row is reported, in order, once its
    /// element 0 holds anything else (so a program writes a row's element 0 last).
    pub first_row: u64,
}

impl RowWatch {
    /// The marker of a row not written yet.
    pub const UNWRITTEN: i32 = i32::MIN;
}

/// How a loop of passes ended ([`Session::run_loop`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoopRun {
    /// Passes completed.
    pub passes: u64,
    /// The program's halt word stopped the loop (otherwise the pass budget or a cancel did).
    pub halted: bool,
    /// The host asked to stop (the row callback returned `false`); the loop ended after the
    /// pass that was running.
    pub cancelled: bool,
    /// Device time of the launch, where the backend measures one.
    pub kernel_ms: Option<f64>,
}

/// What to do with each streamed row: `(row index, the row's elements)`; return `false` to
/// stop the loop after the current pass.
pub type OnRow<'a> = dyn FnMut(u64, &[i32]) -> bool + 'a;

/// Probe words a traced task carries beside the scheduler's points ([`TaskTrace::probes`]).
pub const TRACE_PROBES: usize = 8;

/// When one task ran in a traced launch, from the device's clock (nanoseconds; one clock for
/// the whole device; 0 where a point was not recorded). In a looped launch every pass writes
/// its tasks' times over the pass before: the trace is the last pass's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskTrace {
    /// Task index.
    pub task: usize,
    /// The block (queue) that ran it.
    pub block: u32,
    /// When the block reached the task.
    pub reached: u64,
    /// When its waits were met.
    pub ready: u64,
    /// When it signalled its counter.
    pub done: u64,
    /// When its op's prologue ended (0: the op records none; the row tiles record when their
    /// row is ready in shared memory or in place).
    pub prologue: u64,
    /// When its op returned (then the block signals).
    pub returned: u64,
    /// When the scheduler dispatched it (its staged records landed, its ids checked).
    pub dispatched: u64,
    /// When its wait began (the op's own checks done, its wait entered).
    pub waiting: u64,
    /// When its op reached its own probe points (0: not reached or none there).
    pub probes: [u64; TRACE_PROBES],
}

/// A loaded program ready to run forward passes.
pub trait Session {
    /// Sets IO inputs by buffer name (values persist to later steps), runs one forward pass,
    /// returns every IO output.
    fn step(&mut self, inputs: &[(&str, Tensor)]) -> Result<Outputs, BackendError>;
    /// [`Session::step`], returning only the IO outputs named in `outputs`: a backend that
    /// copies outputs off a device then reads only those (a scored chunk's logits are 50 MB,
    /// its negative log-likelihoods 2 KB).
    fn step_reading(
        &mut self,
        inputs: &[(&str, Tensor)],
        outputs: &[&str],
    ) -> Result<Outputs, BackendError> {
        let mut out = self.step(inputs)?;
        out.tensors
            .retain(|(name, _)| outputs.contains(&name.as_str()));
        Ok(out)
    }
    /// Applies a checked param patch (positions between decode steps); it lasts until the
    /// next patch. Patches are absolute: each one is relative to the loaded program.
    fn set_params(&mut self, patch: &crate::validate::ParamPatch) -> Result<(), BackendError>;
    /// Sets IO_INPUT and STATE buffers by name, without running anything (values persist).
    fn write(&mut self, values: &[(&str, Tensor)]) -> Result<(), BackendError> {
        let _ = values;
        Err(BackendError::Unsupported(
            "this backend cannot set buffers outside a step".into(),
        ))
    }
    /// The current value of the STATE, IO_OUTPUT or KV_CACHE buffer named `name`.
    fn read(&mut self, name: &str) -> Result<Tensor, BackendError> {
        Err(BackendError::Unsupported(format!(
            "this backend cannot read buffer '{name}' back"
        )))
    }
    /// Loads `program` to run beside this session, on the same device: each of its KV caches
    /// named, typed and shaped as one of this session's *is* that cache (one cache, which
    /// both sessions write and read; a prefill program fills the rows a decode program then
    /// attends to), and its weights come from `weights` (a backend may share the uploaded
    /// tensors of this session's weights of the same names instead). The two sessions must
    /// not run at once; a shared cache is read through the session that was loaded first.
    fn load_beside(
        &mut self,
        program: &ValidatedProgram,
        weights: &WeightStore,
        registry: &Registry,
    ) -> Result<Box<dyn Session>, BackendError> {
        let _ = (program, weights, registry);
        Err(BackendError::Unsupported(
            "this backend cannot load a program beside another".into(),
        ))
    }
    /// Runs up to `max_passes` passes of a program with a step loop in one go (one launch on
    /// a GPU), stopping early when the program's halt word is set after a pass or when
    /// `on_row` returns `false`; rows of `watch` stream to `on_row` as they are written.
    /// Every IO input must have been set (by [`Session::write`] or an earlier step).
    fn run_loop(
        &mut self,
        max_passes: u64,
        watch: Option<&RowWatch>,
        on_row: &mut OnRow<'_>,
    ) -> Result<LoopRun, BackendError> {
        let _ = (max_passes, watch, on_row);
        Err(BackendError::Unsupported(
            "this backend cannot run a loop of passes".into(),
        ))
    }
    /// Records every task's times in the launches after this one (a backend may run a kernel
    /// of its own for it); `false`: this backend records none.
    fn enable_trace(&mut self, registry: &Registry) -> Result<bool, BackendError> {
        let _ = registry;
        Ok(false)
    }
    /// The last launch's task times ([`TaskTrace`]; a looped launch's last pass), in task
    /// order; empty unless [`Session::enable_trace`] turned them on.
    fn trace(&self) -> Result<Vec<TaskTrace>, BackendError> {
        Ok(Vec::new())
    }
}

/// An execution backend.
pub trait Backend {
    /// Short name (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Loads a validated program with its weights.
    fn load(
        &self,
        program: &ValidatedProgram,
        weights: &WeightStore,
        registry: &Registry,
    ) -> Result<Box<dyn Session>, BackendError>;
}

/// Named tensors (weights and constants), shared cheaply between sessions.
#[derive(Debug, Clone, Default)]
pub struct WeightStore {
    tensors: BTreeMap<String, Arc<Tensor>>,
}

/// The result of binding a program's WEIGHT/CONST buffers.
#[derive(Debug, Clone)]
pub struct BoundWeights {
    /// `by_buffer[b]`: the tensor of buffer `b` (WEIGHT/CONST buffers only).
    pub by_buffer: Vec<Option<Arc<Tensor>>>,
    /// Tensors no buffer uses (a warning, not an error).
    pub unused: Vec<String>,
}

fn st_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I32" => DType::I32,
        "I8" => DType::I8,
        "U8" => DType::U8,
        "BOOL" => DType::BOOL,
        "F8_E4M3" => DType::F8E4M3,
        "F8_E5M2" => DType::F8E5M2,
        _ => return None,
    })
}

fn st_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I32 => "I32",
        DType::I8 => "I8",
        DType::U8 | DType::I4 => "U8",
        DType::BOOL => "BOOL",
        DType::F8E4M3 => "F8_E4M3",
        DType::F8E5M2 => "F8_E5M2",
    }
}

impl WeightStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds (or replaces) a tensor.
    pub fn insert(&mut self, name: impl Into<String>, t: Tensor) {
        self.tensors.insert(name.into(), Arc::new(t));
    }
    /// Adds (or replaces) a shared tensor without copying it.
    pub fn insert_shared(&mut self, name: impl Into<String>, t: Arc<Tensor>) {
        self.tensors.insert(name.into(), t);
    }
    /// Takes the tensor named `name` out of the store.
    pub fn remove(&mut self, name: &str) -> Option<Arc<Tensor>> {
        self.tensors.remove(name)
    }
    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Tensor>> {
        self.tensors.get(name)
    }
    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }
    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Reads a safetensors file.
    pub fn load_safetensors(path: &Path) -> Result<WeightStore, BackendError> {
        let bytes = std::fs::read(path).map_err(|source| BackendError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_safetensors_bytes(&bytes).map_err(|message| BackendError::Format {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses safetensors bytes with the strict header checks of [`crate::safetensors`] (errors
    /// are messages; the caller names the file).
    pub fn from_safetensors_bytes(bytes: &[u8]) -> Result<WeightStore, String> {
        let names = "F32, F16, BF16, I32, I8, U8, BOOL, F8_E4M3, F8_E5M2";
        let accepted = crate::safetensors::Accepted {
            dtype: &st_dtype,
            names,
        };
        let (start, entries) = crate::safetensors::parse_header(bytes, &accepted)?;
        let data = bytes.get(start..).unwrap_or_default();
        let mut store = WeightStore::new();
        for e in entries {
            let t = Tensor::from_le_bytes(e.dtype, &e.shape, &data[e.begin..e.end])
                .map_err(|err| format!("tensor '{}': {err}", e.name))?;
            store.insert(e.name, t);
        }
        Ok(store)
    }

    /// Serialises every tensor to safetensors bytes (sorted names, 8-byte aligned data).
    pub fn to_safetensors_bytes(&self) -> Vec<u8> {
        let mut header = Map::new();
        let mut data = Vec::new();
        for (name, t) in &self.tensors {
            let shape: Vec<u64> = if t.dtype() == DType::I4 {
                let mut s = t.shape().to_vec();
                if let Some(k) = s.last_mut() {
                    *k = k.div_ceil(2);
                }
                s
            } else {
                t.shape().to_vec()
            };
            let bytes = t.to_le_bytes();
            let mut e = Map::new();
            e.insert("dtype", Value::from(st_name(t.dtype())));
            e.insert(
                "shape",
                Value::Array(shape.iter().map(|&d| Value::Int(d as i64)).collect()),
            );
            e.insert(
                "data_offsets",
                Value::Array(vec![
                    Value::Int(data.len() as i64),
                    Value::Int((data.len() + bytes.len()) as i64),
                ]),
            );
            data.extend_from_slice(&bytes);
            header.insert(name.clone(), Value::Object(e));
        }
        let mut text = String::new();
        json::write::write_compact(&Value::Object(header), &mut text);
        while !(8 + text.len()).is_multiple_of(8) {
            text.push(' ');
        }
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(&data);
        out
    }

    /// Writes a safetensors file.
    pub fn save_safetensors(&self, path: &Path) -> Result<(), BackendError> {
        std::fs::write(path, self.to_safetensors_bytes()).map_err(|source| BackendError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Binds every WEIGHT/CONST buffer of `p` to the tensor named by its `source`: dtype and
    /// shape must match (an `I4` buffer `[.., K]` binds to a `U8` tensor `[.., ceil(K/2)]`).
    pub fn bind(&self, p: &Program) -> Result<BoundWeights, BackendError> {
        let mut by_buffer = vec![None; p.buffers.len()];
        let mut used = std::collections::BTreeSet::new();
        for b in &p.buffers {
            if !matches!(b.kind, BufferKind::WEIGHT | BufferKind::CONST) {
                continue;
            }
            let err = |message: String| BackendError::Weights {
                buffer: b.name.clone(),
                message,
            };
            let Some(src) = &b.source else {
                return Err(err(format!(
                    "{} buffer has no `source` naming its tensor",
                    b.kind
                )));
            };
            let t = self
                .tensors
                .get(src)
                .ok_or_else(|| err(format!("tensor '{src}' is not in the weights")))?;
            let t = if b.dtype == DType::I4 && t.dtype() == DType::U8 {
                // Reinterpret the packed bytes with the buffer's logical shape.
                let packed: Vec<u64> = {
                    let mut s = b.shape.clone();
                    if let Some(k) = s.last_mut() {
                        *k = k.div_ceil(2);
                    }
                    s
                };
                if t.shape() != packed.as_slice() {
                    return Err(err(format!(
                        "I4 buffer {:?} needs a U8 tensor of shape {packed:?}, tensor '{src}' is {:?}",
                        b.shape,
                        t.shape()
                    )));
                }
                Arc::new(
                    Tensor::from_le_bytes(DType::I4, &b.shape, &t.to_le_bytes())
                        .map_err(|e| err(e.to_string()))?,
                )
            } else {
                if t.dtype() != b.dtype || t.shape() != b.shape.as_slice() {
                    return Err(err(format!(
                        "buffer is {} {:?} but tensor '{src}' is {} {:?}",
                        b.dtype,
                        b.shape,
                        t.dtype(),
                        t.shape()
                    )));
                }
                Arc::clone(t)
            };
            used.insert(src.clone());
            by_buffer[b.id as usize] = Some(t);
        }
        let unused = self
            .tensors
            .keys()
            .filter(|k| !used.contains(*k))
            .cloned()
            .collect();
        Ok(BoundWeights { by_buffer, unused })
    }
}

/// The buffer each named input sets (checked: exactly one IO_INPUT buffer has the name, and
/// the value's dtype and shape are the buffer's), in input order.
pub fn io_input_targets(
    program: &Program,
    inputs: &[(&str, Tensor)],
) -> Result<Vec<usize>, BackendError> {
    named_targets(program, inputs, &[BufferKind::IO_INPUT])
}

/// The buffer each named value sets, for [`Session::write`]: exactly one buffer of one of
/// `kinds` has the name, and the value's dtype and shape are the buffer's.
pub fn named_targets(
    program: &Program,
    inputs: &[(&str, Tensor)],
    kinds: &[BufferKind],
) -> Result<Vec<usize>, BackendError> {
    let kind_names = || {
        kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(" or ")
    };
    inputs
        .iter()
        .map(|(name, value)| {
            let err = |message: String| BackendError::Input {
                name: name.to_string(),
                message,
            };
            let b = named_buffer(program, name, kinds)
                .map_err(|m| err(m.replace("{kinds}", &kind_names())))?;
            let buf = &program.buffers[b];
            if value.dtype() != buf.dtype || value.shape() != buf.shape.as_slice() {
                return Err(err(format!(
                    "expected {} {:?}, got {} {:?}",
                    buf.dtype,
                    buf.shape,
                    value.dtype(),
                    value.shape()
                )));
            }
            Ok(b)
        })
        .collect()
}

/// A [`RowWatch`] resolved against a program: the buffer's index, its row count and width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchedRows {
    /// Buffer index.
    pub buffer: usize,
    /// Rows (the first dim).
    pub rows: u64,
    /// Elements per row (the second dim).
    pub cols: usize,
}

/// Resolves `watch` (every backend's `run_loop` starts here, so they refuse the same watches
/// with the same messages): one STATE or IO_OUTPUT buffer of that name, I32 and of rank 2.
pub fn watched_rows(program: &Program, watch: &RowWatch) -> Result<WatchedRows, BackendError> {
    let err = |message: String| BackendError::Input {
        name: watch.buffer.clone(),
        message,
    };
    let kinds = [BufferKind::STATE, BufferKind::IO_OUTPUT];
    let b = named_buffer(program, &watch.buffer, &kinds)
        .map_err(|m| err(m.replace("{kinds}", "STATE or IO_OUTPUT")))?;
    let buf = &program.buffers[b];
    if buf.dtype != DType::I32 || buf.rank() != 2 {
        return Err(err(format!(
            "a watched buffer must be I32 [rows, columns], not {} {:?}",
            buf.dtype, buf.shape
        )));
    }
    Ok(WatchedRows {
        buffer: b,
        rows: buf.shape[0],
        cols: buf.shape[1] as usize,
    })
}

/// The buffer [`Session::read`] reads: the one STATE, IO_OUTPUT or KV_CACHE buffer named
/// `name` (every backend refuses the same names with the same messages).
pub fn readable_buffer(program: &Program, name: &str) -> Result<usize, BackendError> {
    let kinds = [
        BufferKind::STATE,
        BufferKind::IO_OUTPUT,
        BufferKind::KV_CACHE,
    ];
    named_buffer(program, name, &kinds).map_err(|m| BackendError::Input {
        name: name.to_string(),
        message: m.replace("{kinds}", "STATE, IO_OUTPUT or KV_CACHE"),
    })
}

/// The one buffer named `name` whose kind is one of `kinds`; the error message says why not
/// (with `{kinds}` standing for the kinds' names).
pub fn named_buffer(program: &Program, name: &str, kinds: &[BufferKind]) -> Result<usize, String> {
    let all: Vec<usize> = (0..program.buffers.len())
        .filter(|&b| program.buffers[b].name == name)
        .collect();
    let Some(&first) = all.first() else {
        return Err("no buffer has this name".into());
    };
    let of_kind: Vec<usize> = (all.iter().copied())
        .filter(|&b| kinds.contains(&program.buffers[b].kind))
        .collect();
    match of_kind.as_slice() {
        [b] => Ok(*b),
        [] => Err(format!(
            "buffer {first} is a {} buffer, not {{kinds}}",
            program.buffers[first].kind
        )),
        many => Err(format!("{} {{kinds}} buffers have this name", many.len())),
    }
}

/// The error for an IO input no step has given yet.
pub fn io_input_never_set(buffer: &crate::ir::Buffer) -> BackendError {
    BackendError::Input {
        name: buffer.name.clone(),
        message: "never set: every IO input must be given at the first step (values persist to \
                  later steps)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SplitMix;

    #[test]
    fn safetensors_round_trip_and_corruption_is_an_error() {
        let mut rng = SplitMix(3);
        let mut s = WeightStore::new();
        s.insert(
            "a.weight",
            Tensor::random(DType::F32, &[3, 5], &mut rng, -1.0, 1.0),
        );
        s.insert("b", Tensor::random(DType::BF16, &[7], &mut rng, -1.0, 1.0));
        s.insert(
            "ids",
            Tensor::random(DType::I32, &[2, 2], &mut rng, 0.0, 9.0),
        );
        let bytes = s.to_safetensors_bytes();
        let back = WeightStore::from_safetensors_bytes(&bytes).unwrap();
        assert_eq!(back.len(), 3);
        for n in s.names() {
            assert_eq!(s.get(n), back.get(n));
        }
        for cut in [0, 4, 8, 20, bytes.len() - 1] {
            assert!(
                WeightStore::from_safetensors_bytes(&bytes[..cut]).is_err(),
                "cut {cut}"
            );
        }
    }
}
