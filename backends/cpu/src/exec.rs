//! The session: buffer store, IO inputs, one forward pass per step, op dispatch.

use crate::schedule::{Picker, WaitTable};
use crate::tiles::{Tile, copy_region, tile_of};
use crate::{CpuOptions, FiringMode};
use amk_core::sim::SplitMix;
use amk_core::{
    BackendError, Buffer, BufferKind, CpuCall, CpuReference, DType, Input, LoopRun, OnRow, OpError,
    Outputs, Program, Registry, RowWatch, Session, Storage, Task, TaskId, Tensor, WeightStore,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// One buffer's value: owned by the session, or a weight shared with the weight store.
#[derive(Debug)]
enum Slot {
    Owned(Tensor),
    Shared(Arc<Tensor>),
}

impl Slot {
    fn get(&self) -> &Tensor {
        match self {
            Slot::Owned(t) => t,
            Slot::Shared(t) => t,
        }
    }
    fn get_mut(&mut self) -> Option<&mut Tensor> {
        match self {
            Slot::Owned(t) => Some(t),
            Slot::Shared(_) => None,
        }
    }
    /// Moves the tensor out for a call (a weight, which no loaded task writes, is copied).
    fn take(&mut self) -> Tensor {
        match self {
            Slot::Owned(t) => std::mem::replace(t, placeholder()),
            Slot::Shared(t) => Tensor::clone(t),
        }
    }
}

/// An empty tensor standing in for one moved out of the store (allocates no elements).
fn placeholder() -> Tensor {
    Tensor::zeros(DType::F32, &[0])
}

/// Fills a tensor with the values of [`Tensor::poisoned`], in place (no reallocation).
fn poison(t: &mut Tensor) {
    let dtype = t.dtype();
    match t.storage_mut() {
        Storage::F32(v) => v.fill(f32::NAN),
        Storage::F16(v) => {
            if let Storage::F16(p) = Tensor::poisoned(dtype, &[1]).storage() {
                v.fill(p.first().copied().unwrap_or_default());
            }
        }
        Storage::BF16(v) => {
            if let Storage::BF16(p) = Tensor::poisoned(dtype, &[1]).storage() {
                v.fill(p.first().copied().unwrap_or_default());
            }
        }
        Storage::I32(v) => v.fill(i32::MIN),
        Storage::I8(v) => v.fill(i8::MIN),
        Storage::U8(v) | Storage::I4(v) | Storage::Bytes(v) => v.fill(0xFF),
    }
}

/// A loaded program on the CPU: every buffer's tensor, the counters' wait table and the
/// options. Implements [`Session`]; also shows and sets buffers by name.
pub struct CpuSession {
    program: Program,
    registry: Registry,
    options: CpuOptions,
    /// Reference of every task's op.
    refs: Vec<CpuReference>,
    /// Every buffer's value, by position.
    store: Vec<Slot>,
    /// Whether each IO_INPUT buffer has been given a value.
    io_set: Vec<bool>,
    /// Buffer positions by name.
    names: HashMap<String, Vec<u32>>,
    waits: WaitTable,
    /// The tile each task writes, when it may run on a worker thread.
    tiles: Vec<Option<Tile>>,
    /// Number of tasks writing each buffer (the KV-cache race rule).
    n_writers: Vec<u32>,
    /// Per worker, per buffer: scratch outputs of tiles run on that worker (a worker locks
    /// only its own, uncontended; the lock lets a group whose thread could not be started run
    /// on the calling thread instead).
    scratch: Vec<Mutex<Vec<Option<Tensor>>>>,
    /// Forward passes started.
    passes: u64,
    /// Tile batches run on more than one thread.
    parallel_batches: u64,
    /// [`amk_core::ValidatedProgram::id`] of the loaded program.
    program_id: u64,
    /// Params as loaded, of every task a patch has edited.
    loaded_params: HashMap<TaskId, amk_core::json::Map>,
    /// Tasks the current patch edited.
    patched: Vec<TaskId>,
    /// KV caches shared with sessions loaded beside this one ([`Session::load_beside`]): each
    /// lives in its mutex between calls and in `store` during one (checked out at the start of
    /// a step, a loop or a read, checked back in at its end), so whichever session runs sees
    /// what the other wrote.
    links: Vec<(usize, Arc<Mutex<Tensor>>)>,
}

impl std::fmt::Debug for CpuSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuSession")
            .field("options", &self.options)
            .field("program", &self.program.summary())
            .field("passes", &self.passes)
            .finish_non_exhaustive()
    }
}

fn task_label(task: &Task) -> String {
    task.display_label()
}

fn unsupported(t: usize, task: &Task, why: String) -> BackendError {
    BackendError::Unsupported(format!("task {t} ({}): {why}", task_label(task)))
}

/// Bytes of buffer `b`, None when they do not fit in memory addressing.
fn buffer_bytes(b: &Buffer) -> Option<usize> {
    let numel = (b.shape.iter()).try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?));
    numel
        .and_then(|n| n.checked_mul(b.dtype.bits().div_ceil(8) as usize))
        .filter(|&bytes| bytes <= isize::MAX as usize)
}

/// Memory this machine can still give, from Linux's `/proc/meminfo` (`MemAvailable`); None
/// where that is not known.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The buffers the session allocates (all but weights and constants), refused together when
/// they exceed the memory available, naming the largest: a program the validator accepts may
/// still ask for more than the machine has, and an allocation that fails aborts.
fn check_memory(buffers: &[&Buffer]) -> Result<(), BackendError> {
    let mut sizes: Vec<(u64, &Buffer)> = Vec::with_capacity(buffers.len());
    for b in buffers {
        let Some(bytes) = buffer_bytes(b) else {
            return Err(BackendError::Unsupported(format!(
                "buffer '{}': {} {:?} is too large to allocate",
                b.name, b.dtype, b.shape
            )));
        };
        sizes.push((bytes as u64, b));
    }
    let total = sizes.iter().fold(0u64, |a, (s, _)| a.saturating_add(*s));
    let Some(avail) = available_memory() else {
        return Ok(());
    };
    if total <= avail {
        return Ok(());
    }
    sizes.sort_by_key(|s| std::cmp::Reverse(s.0));
    let largest: Vec<String> = (sizes.iter().take(4))
        .map(|(s, b)| {
            format!(
                "'{}' {} {:?} ({})",
                b.name,
                b.dtype,
                b.shape,
                human_bytes(*s)
            )
        })
        .collect();
    Err(BackendError::Unsupported(format!(
        "the program's buffers need {} and this machine has {} available; the largest: {}",
        human_bytes(total),
        human_bytes(avail),
        largest.join(", ")
    )))
}

/// `n` bytes as GiB or MiB with one decimal.
fn human_bytes(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    }
}

/// A zeroed tensor for `b` (whose size [`check_memory`] accepted), refused when the allocator
/// cannot give it.
fn allocate(b: &Buffer) -> Result<Tensor, BackendError> {
    Tensor::try_zeros(b.dtype, &b.shape).ok_or_else(|| {
        BackendError::Unsupported(format!(
            "buffer '{}': {} {:?}: the allocation failed (out of memory)",
            b.name, b.dtype, b.shape
        ))
    })
}

impl CpuSession {
    /// Loads `program` (validated by the caller; checked here only for what this backend needs:
    /// existing buffer ids, a CPU reference for every op, no writes to read-only buffers, no
    /// buffer listed twice as one task's output).
    pub(crate) fn new(
        program: Program,
        program_id: u64,
        weights: &WeightStore,
        registry: &Registry,
        options: CpuOptions,
    ) -> Result<Self, BackendError> {
        let bound = weights.bind(&program)?;
        let nb = program.buffers.len();
        let mut refs = Vec::with_capacity(program.tasks.len());
        let mut n_writers = vec![0u32; nb];
        for (t, task) in program.tasks.iter().enumerate() {
            let reference = registry.reference(task.op).ok_or_else(|| {
                let name = registry
                    .name_of(task.op)
                    .map_or_else(|| format!("opcode {}", task.op.0), |n| n.to_string());
                unsupported(t, task, format!("op {name} has no CPU reference"))
            })?;
            for &b in task.inputs.iter().chain(&task.outputs) {
                if b as usize >= nb {
                    return Err(unsupported(t, task, format!("buffer {b} does not exist")));
                }
            }
            for (j, &b) in task.outputs.iter().enumerate() {
                let buf = &program.buffers[b as usize];
                if buf.kind.is_read_only() {
                    return Err(unsupported(
                        t,
                        task,
                        format!("writes the read-only {} buffer '{}'", buf.kind, buf.name),
                    ));
                }
                if task.outputs[..j].contains(&b) {
                    return Err(unsupported(
                        t,
                        task,
                        format!("lists buffer '{}' twice as an output", buf.name),
                    ));
                }
                n_writers[b as usize] += 1;
            }
            refs.push(reference.clone());
        }
        let owned: Vec<&Buffer> = (program.buffers.iter())
            .filter(|b| !matches!(b.kind, BufferKind::WEIGHT | BufferKind::CONST))
            .collect();
        check_memory(&owned)?;
        let mut store = Vec::with_capacity(nb);
        let mut names: HashMap<String, Vec<u32>> = HashMap::new();
        for (i, b) in program.buffers.iter().enumerate() {
            let slot = match b.kind {
                BufferKind::WEIGHT | BufferKind::CONST => {
                    let t = bound.by_buffer.get(i).cloned().flatten().ok_or_else(|| {
                        BackendError::Weights {
                            buffer: b.name.clone(),
                            message: "no tensor was bound".into(),
                        }
                    })?;
                    Slot::Shared(t)
                }
                _ => Slot::Owned(allocate(b)?),
            };
            store.push(slot);
            names.entry(b.name.clone()).or_default().push(i as u32);
        }
        let tiles = (0..program.tasks.len())
            .map(|t| tile_of(&program, t))
            .collect();
        Ok(CpuSession {
            waits: WaitTable::new(&program),
            io_set: vec![false; nb],
            program,
            registry: registry.clone(),
            options,
            refs,
            store,
            names,
            tiles,
            n_writers,
            scratch: Vec::new(),
            passes: 0,
            parallel_batches: 0,
            program_id,
            loaded_params: HashMap::new(),
            patched: Vec::new(),
            links: Vec::new(),
        })
    }

    /// The program this session runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The options this session runs with.
    pub fn options(&self) -> &CpuOptions {
        &self.options
    }

    /// Number of forward passes started so far.
    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// Number of GEMV/GEMM tile batches run on more than one thread so far (always 0 with one
    /// thread).
    pub fn parallel_batches(&self) -> u64 {
        self.parallel_batches
    }

    /// The current value of the first buffer named `name` (weights, KV caches, activations,
    /// IO buffers). A KV cache shared with a session loaded beside this one is empty here
    /// between calls; [`Session::read`] gives its value.
    pub fn buffer(&self, name: &str) -> Option<&Tensor> {
        let b = *self.names.get(name)?.first()?;
        self.store.get(b as usize).map(Slot::get)
    }

    /// Every buffer with its current value, in buffer order.
    pub fn buffers(&self) -> impl Iterator<Item = (&Buffer, &Tensor)> {
        self.program
            .buffers
            .iter()
            .zip(self.store.iter().map(Slot::get))
    }

    /// Replaces the state of the KV_CACHE buffer `name` (e.g. to carry caches over to a
    /// program lowered for the next position). Errors are [`BackendError::Input`].
    pub fn set_kv_cache(&mut self, name: &str, value: Tensor) -> Result<(), BackendError> {
        let b = self.find(name, BufferKind::KV_CACHE)?;
        self.check_fits(b, &value)?;
        match self.links.iter().find(|(l, _)| *l == b) {
            Some((_, m)) => *lock(m) = value,
            None => self.store[b] = Slot::Owned(value),
        }
        Ok(())
    }

    /// Moves every linked KV cache into the store for a call.
    fn check_out(&mut self) {
        for (b, m) in &self.links {
            self.store[*b] = Slot::Owned(std::mem::replace(&mut *lock(m), placeholder()));
        }
    }

    /// Moves every linked KV cache back to its mutex after a call.
    fn check_in(&mut self) {
        for (b, m) in &self.links {
            *lock(m) = self.store[*b].take();
        }
    }

    /// `f` with the linked KV caches in the store.
    fn with_links<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.check_out();
        let r = f(self);
        self.check_in();
        r
    }

    /// The link of this session's buffer `b` (made now if it has none: the tensor moves into
    /// it).
    fn link(&mut self, b: usize) -> Arc<Mutex<Tensor>> {
        if let Some((_, m)) = self.links.iter().find(|(l, _)| *l == b) {
            return Arc::clone(m);
        }
        let m = Arc::new(Mutex::new(self.store[b].take()));
        self.links.push((b, Arc::clone(&m)));
        m
    }

    /// The one buffer named `name` of kind `kind`.
    fn find(&self, name: &str, kind: BufferKind) -> Result<usize, BackendError> {
        let err = |message: String| BackendError::Input {
            name: name.to_string(),
            message,
        };
        let all = self
            .names
            .get(name)
            .ok_or_else(|| err("no buffer has this name".into()))?;
        let mut of_kind = all
            .iter()
            .filter(|&&b| self.program.buffers[b as usize].kind == kind);
        match (of_kind.next(), of_kind.next()) {
            (Some(&b), None) => Ok(b as usize),
            (Some(_), Some(_)) => Err(err(format!(
                "{} {kind} buffers have this name",
                2 + of_kind.count()
            ))),
            (None, _) => {
                let b = &self.program.buffers[all[0] as usize];
                Err(err(format!(
                    "buffer {} is a {} buffer, not {kind}",
                    all[0], b.kind
                )))
            }
        }
    }

    fn check_fits(&self, b: usize, value: &Tensor) -> Result<(), BackendError> {
        let buf = &self.program.buffers[b];
        if value.dtype() != buf.dtype || value.shape() != buf.shape.as_slice() {
            return Err(BackendError::Input {
                name: buf.name.clone(),
                message: format!(
                    "expected {} {:?}, got {} {:?}",
                    buf.dtype,
                    buf.shape,
                    value.dtype(),
                    value.shape()
                ),
            });
        }
        Ok(())
    }

    /// Checks every input, then stores them all (nothing changes on an error), then checks
    /// that every IO_INPUT has a value.
    fn set_inputs(&mut self, inputs: &[(&str, Tensor)]) -> Result<(), BackendError> {
        let targets = amk_core::backend::io_input_targets(&self.program, inputs)?;
        for (&b, (_, value)) in targets.iter().zip(inputs) {
            match self.store[b].get_mut() {
                Some(t) => t.clone_from(value),
                None => self.store[b] = Slot::Owned(value.clone()),
            }
            self.io_set[b] = true;
        }
        for (b, buf) in self.program.buffers.iter().enumerate() {
            if buf.kind == BufferKind::IO_INPUT && !self.io_set[b] {
                return Err(amk_core::backend::io_input_never_set(buf));
            }
        }
        Ok(())
    }

    /// Every IO_OUTPUT buffer's value, in buffer order.
    fn outputs(&self) -> Outputs {
        Outputs {
            tensors: self
                .program
                .buffers
                .iter()
                .zip(&self.store)
                .filter(|(b, _)| b.kind == BufferKind::IO_OUTPUT)
                .map(|(b, s)| (b.name.clone(), s.get().clone()))
                .collect(),
        }
    }

    /// Race-hunting check of task `t` before it runs: every transient buffer it reads has been
    /// written by a fired task. A KV cache no task writes (previous steps' state) and a task
    /// reading the cache it appends to are not races.
    fn check_race(&self, t: usize, written: &[bool], seed: u64) -> Result<(), BackendError> {
        let task = &self.program.tasks[t];
        for &b in &task.inputs {
            let bi = b as usize;
            let buf = &self.program.buffers[bi];
            let transient = match buf.kind {
                BufferKind::ACTIVATION | BufferKind::IO_OUTPUT => true,
                BufferKind::KV_CACHE => self.n_writers[bi] > 0 && !task.outputs.contains(&b),
                _ => false,
            };
            if transient && !written[bi] {
                return Err(BackendError::Race {
                    task: t as TaskId,
                    label: task_label(task),
                    buffer: buf.name.clone(),
                    seed,
                });
            }
        }
        Ok(())
    }

    /// One forward pass: counters at zero, tasks fired until none is ready.
    fn run_pass(&mut self) -> Result<(), BackendError> {
        let pass = self.passes;
        self.passes += 1;
        let (mut counters, ready) = self.waits.start();
        let race_seed = match self.options.mode {
            FiringMode::ListOrder => None,
            FiringMode::RaceHunt { seed } => Some(seed),
        };
        let mut picker = match race_seed {
            None => Picker::list(ready),
            Some(seed) => Picker::random(
                ready,
                SplitMix(seed ^ pass.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            ),
        };
        let mut written = Vec::new();
        if race_seed.is_some() {
            written = vec![false; self.program.buffers.len()];
            for (buf, slot) in self.program.buffers.iter().zip(self.store.iter_mut()) {
                if matches!(buf.kind, BufferKind::ACTIVATION | BufferKind::IO_OUTPUT)
                    && let Some(t) = slot.get_mut()
                {
                    poison(t);
                }
            }
        }
        let threads = self.options.threads.max(1);
        let mut fired = 0usize;
        let mut batch: Vec<u32> = Vec::new();
        let mut candidates: Vec<u32> = Vec::new();
        let mut newly: Vec<u32> = Vec::new();
        while let Some(t) = picker.pick() {
            batch.clear();
            batch.push(t);
            if threads > 1 && self.tiles[t as usize].is_some() {
                candidates.clear();
                picker.take_matching(|u| self.tiles[u as usize].is_some(), &mut candidates);
                for &u in &candidates {
                    if self.joins_batch(u, &batch) {
                        batch.push(u);
                    } else {
                        picker.push(u);
                    }
                }
            }
            if let Some(seed) = race_seed {
                for &u in &batch {
                    self.check_race(u as usize, &written, seed)?;
                }
            }
            if batch.len() == 1 {
                fire(
                    &self.program.tasks[t as usize],
                    t as usize,
                    &self.refs[t as usize],
                    &self.registry,
                    &mut self.store,
                )?;
            } else {
                self.fire_tiles(&batch, threads)?;
            }
            for &u in &batch {
                let task = &self.program.tasks[u as usize];
                if race_seed.is_some() {
                    for &b in &task.outputs {
                        written[b as usize] = true;
                    }
                }
                counters.bump(&self.waits, task.out_counter, &mut newly);
                fired += 1;
            }
            for &n in &newly {
                picker.push(n);
            }
            newly.clear();
        }
        let stuck = self.program.tasks.len() - fired;
        if stuck > 0 {
            return Err(BackendError::Deadlock(stuck));
        }
        Ok(())
    }

    /// Whether tile task `u` may run together with the tile tasks of `batch`: its tile overlaps
    /// none of theirs, and no task of the batch reads what another writes.
    fn joins_batch(&self, u: u32, batch: &[u32]) -> bool {
        let (Some(tu), task_u) = (self.tiles[u as usize], &self.program.tasks[u as usize]) else {
            return false;
        };
        batch.iter().all(|&v| {
            let Some(tv) = self.tiles[v as usize] else {
                return false;
            };
            let task_v = &self.program.tasks[v as usize];
            !tu.overlaps(&tv)
                && !task_u.inputs.contains(&tv.out)
                && !task_v.inputs.contains(&tu.out)
        })
    }

    /// Runs the tile tasks of `batch` (pairwise independent, see [`Self::joins_batch`]) on up to
    /// `threads` scoped threads, each into its own scratch outputs, then copies every tile back.
    fn fire_tiles(&mut self, batch: &[u32], threads: usize) -> Result<(), BackendError> {
        let workers = threads.min(batch.len());
        self.parallel_batches += 1;
        let nb = self.program.buffers.len();
        if self.scratch.len() < workers {
            self.scratch.resize_with(workers, || Mutex::new(Vec::new()));
        }
        // Greedy balancing: each task (in batch order) goes to the least loaded worker.
        let mut load = vec![0u64; workers];
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); workers];
        let mut worker_of = vec![0usize; batch.len()];
        for (i, &t) in batch.iter().enumerate() {
            let Some(tile) = self.tiles[t as usize] else {
                continue;
            };
            let w = (0..workers).min_by_key(|&w| load[w]).unwrap_or(0);
            load[w] = load[w].saturating_add(tile.cost);
            groups[w].push(i);
            worker_of[i] = w;
            let scratch = self.scratch[w]
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            if scratch.len() < nb {
                scratch.resize_with(nb, || None);
            }
            let buf = &self.program.buffers[tile.out as usize];
            let slot = &mut scratch[tile.out as usize];
            let fits = slot
                .as_ref()
                .is_some_and(|s| s.dtype() == buf.dtype && s.shape() == buf.shape.as_slice());
            if !fits {
                *slot = Some(Tensor::zeros(buf.dtype, &buf.shape));
            }
        }
        let program = &self.program;
        let refs = &self.refs;
        let registry = &self.registry;
        let store = &self.store;
        let tiles = &self.tiles;
        let work = |group: &[usize], scratch: &Mutex<Vec<Option<Tensor>>>| {
            let mut scratch = scratch.lock().unwrap_or_else(PoisonError::into_inner);
            run_group(
                group,
                batch,
                program,
                refs,
                registry,
                store,
                tiles,
                &mut scratch,
            )
        };
        let failures: Vec<(usize, BackendError)> = std::thread::scope(|s| {
            let mut jobs = groups.iter().zip(self.scratch.iter());
            let first = jobs.next();
            let mut handles = Vec::new();
            let mut failures = Vec::new();
            for (group, scratch) in jobs {
                let spawned = std::thread::Builder::new()
                    .name("amk-cpu-tile".into())
                    .spawn_scoped(s, || work(group, scratch));
                match spawned {
                    Ok(h) => handles.push((group, h)),
                    // No thread to be had: run the group here instead.
                    Err(_) => failures.extend(work(group, scratch)),
                }
            }
            if let Some((group, scratch)) = first {
                failures.extend(work(group, scratch));
            }
            for (group, h) in handles {
                match h.join() {
                    Ok(f) => failures.extend(f),
                    Err(_) => {
                        let i = group.first().copied().unwrap_or(0);
                        failures.push((
                            i,
                            BackendError::Unsupported(format!(
                                "a worker thread panicked running task {}",
                                batch.get(i).copied().unwrap_or(0)
                            )),
                        ));
                    }
                }
            }
            failures
        });
        // Report the failure of the earliest task of the batch (deterministic).
        if let Some((_, e)) = failures.into_iter().min_by_key(|(i, _)| *i) {
            return Err(e);
        }
        for (i, &t) in batch.iter().enumerate() {
            let Some(tile) = self.tiles[t as usize] else {
                continue;
            };
            let o = tile.out as usize;
            let scratch = self.scratch[worker_of[i]]
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            let src = scratch.get(o).and_then(Option::as_ref);
            let dst = self.store[o].get_mut();
            let copied = match (src, dst) {
                (Some(src), Some(dst)) => copy_region(src, dst, &tile),
                _ => None,
            };
            if copied.is_none() {
                let task = &self.program.tasks[t as usize];
                return Err(unsupported(
                    t as usize,
                    task,
                    "its tile could not be copied back from the worker's scratch".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Runs one worker's tile tasks (batch indices `group`) into its scratch outputs; returns the
/// first failure (batch index and error), if any.
#[allow(clippy::too_many_arguments)] // reason: the borrowed parts of the session, split for threads
fn run_group(
    group: &[usize],
    batch: &[u32],
    program: &Program,
    refs: &[CpuReference],
    registry: &Registry,
    store: &[Slot],
    tiles: &[Option<Tile>],
    scratch: &mut [Option<Tensor>],
) -> Option<(usize, BackendError)> {
    for &i in group {
        let t = batch.get(i).copied().unwrap_or(0) as usize;
        let task = &program.tasks[t];
        let out = tiles[t].and_then(|tile| scratch.get_mut(tile.out as usize)?.as_mut());
        let Some(out) = out else {
            return Some((i, unsupported(t, task, "no scratch output".into())));
        };
        let ins: Vec<Input<'_>> = task
            .inputs
            .iter()
            .map(|&b| Input::Tensor(store[b as usize].get()))
            .collect();
        let result = refs[t].call(&mut CpuCall {
            task,
            registry: Some(registry),
            inputs: &ins,
            outputs: std::slice::from_mut(out),
        });
        if let Err(source) = result {
            return Some((i, op_error(t, task, source)));
        }
    }
    None
}

fn op_error(t: usize, task: &Task, source: OpError) -> BackendError {
    BackendError::Op {
        task: t as TaskId,
        label: task_label(task),
        source,
    }
}

/// Runs task `t` through its reference: outputs are moved out of the store for the call and
/// back after; an input that is also an output is passed as [`Input::InPlace`] when the op
/// declares the pair, and as a snapshot copy otherwise.
fn fire(
    task: &Task,
    t: usize,
    reference: &CpuReference,
    registry: &Registry,
    store: &mut [Slot],
) -> Result<(), BackendError> {
    let mut outs: Vec<Tensor> = task
        .outputs
        .iter()
        .map(|&b| store[b as usize].take())
        .collect();
    // Position of each input among the outputs (only computed when some input is one).
    let aliased = |b: u32| task.outputs.iter().position(|&o| o == b);
    let any_alias = task.inputs.iter().any(|&b| aliased(b).is_some());
    let snapshots: Vec<Option<Tensor>> = if any_alias {
        task.inputs
            .iter()
            .enumerate()
            .map(|(i, &b)| match aliased(b) {
                Some(j) if !reference.in_place.contains(&(i, j)) => outs.get(j).cloned(),
                _ => None,
            })
            .collect()
    } else {
        Vec::new()
    };
    let result = {
        let store: &[Slot] = store;
        let ins: Vec<Input<'_>> = task
            .inputs
            .iter()
            .enumerate()
            .map(|(i, &b)| match snapshots.get(i).and_then(Option::as_ref) {
                Some(s) => Input::Tensor(s),
                None => match aliased(b) {
                    Some(j) if any_alias => Input::InPlace(j),
                    _ => Input::Tensor(store[b as usize].get()),
                },
            })
            .collect();
        reference.call(&mut CpuCall {
            task,
            registry: Some(registry),
            inputs: &ins,
            outputs: &mut outs,
        })
    };
    for (&b, o) in task.outputs.iter().zip(outs) {
        store[b as usize] = Slot::Owned(o);
    }
    result.map_err(|source| op_error(t, task, source))
}

/// A resolved [`RowWatch`]: the buffer, its row width and row count, the next row to report.
struct Watched {
    buffer: usize,
    cols: usize,
    rows: u64,
    next: u64,
}

impl CpuSession {
    /// Sets IO_INPUT and STATE buffers by name: every value is checked before any is stored.
    fn write_named(&mut self, values: &[(&str, Tensor)]) -> Result<(), BackendError> {
        let kinds = [BufferKind::IO_INPUT, BufferKind::STATE];
        let targets = amk_core::backend::named_targets(&self.program, values, &kinds)?;
        for (&b, (_, value)) in targets.iter().zip(values) {
            self.store[b] = Slot::Owned(value.clone());
            self.io_set[b] = true;
        }
        Ok(())
    }

    /// Resolves `watch` and marks its rows from `first_row` on as unwritten.
    fn watch_rows(&mut self, watch: &RowWatch) -> Result<Watched, BackendError> {
        let w = amk_core::backend::watched_rows(&self.program, watch)?;
        let t = self.store[w.buffer]
            .get_mut()
            .ok_or_else(|| BackendError::Input {
                name: watch.buffer.clone(),
                message: "the buffer is not writable".into(),
            })?;
        for r in watch.first_row..w.rows {
            t.set_i64(r as usize * w.cols, RowWatch::UNWRITTEN as i64);
        }
        Ok(Watched {
            buffer: w.buffer,
            cols: w.cols,
            rows: w.rows,
            next: watch.first_row,
        })
    }

    /// Reports every newly written row of `w`; `false` once `on_row` asked to stop.
    fn report_rows(&self, w: &mut Watched, on_row: &mut OnRow<'_>) -> bool {
        let t = self.store[w.buffer].get();
        let mut row = vec![0i32; w.cols];
        while w.next < w.rows {
            let at = w.next as usize * w.cols;
            if t.get_i64(at) == RowWatch::UNWRITTEN as i64 {
                break;
            }
            for (c, x) in row.iter_mut().enumerate() {
                *x = t.get_i64(at + c) as i32;
            }
            w.next += 1;
            if !on_row(w.next - 1, &row) {
                return false;
            }
        }
        true
    }

    /// The loop of passes: the same passes [`Session::step`] runs, one after another, with
    /// the halt word read after each.
    fn loop_passes(
        &mut self,
        max_passes: u64,
        watch: Option<&RowWatch>,
        on_row: &mut OnRow<'_>,
    ) -> Result<LoopRun, BackendError> {
        let halt = self
            .program
            .step_loop
            .map(|l| l.halt as usize)
            .ok_or_else(|| {
                BackendError::Unsupported("the program has no step loop to run".into())
            })?;
        if halt >= self.store.len() {
            return Err(BackendError::Unsupported(
                "the step loop's halt buffer does not exist".into(),
            ));
        }
        self.set_inputs(&[])?;
        let mut watched = watch.map(|w| self.watch_rows(w)).transpose()?;
        let mut run = LoopRun::default();
        while run.passes < max_passes && !run.halted && !run.cancelled {
            self.run_pass()?;
            run.passes += 1;
            if let Some(w) = &mut watched {
                run.cancelled = !self.report_rows(w, on_row);
            }
            run.halted = self.store[halt].get().get_i64(0) != 0;
        }
        Ok(run)
    }
}

/// A linked cache's mutex, locked. The lock is only ever held to move the tensor in or out
/// (never across a call), so a poisoned one still holds a whole tensor: it is taken as is.
fn lock(m: &Mutex<Tensor>) -> std::sync::MutexGuard<'_, Tensor> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Session for CpuSession {
    fn step(&mut self, inputs: &[(&str, Tensor)]) -> Result<Outputs, BackendError> {
        self.with_links(|s| {
            s.set_inputs(inputs)?;
            s.run_pass()?;
            Ok(s.outputs())
        })
    }

    fn write(&mut self, values: &[(&str, Tensor)]) -> Result<(), BackendError> {
        self.write_named(values)
    }

    fn read(&mut self, name: &str) -> Result<Tensor, BackendError> {
        let b = amk_core::backend::readable_buffer(&self.program, name)?;
        self.with_links(|s| Ok(s.store[b].get().clone()))
    }

    fn run_loop(
        &mut self,
        max_passes: u64,
        watch: Option<&RowWatch>,
        on_row: &mut OnRow<'_>,
    ) -> Result<LoopRun, BackendError> {
        self.with_links(|s| s.loop_passes(max_passes, watch, on_row))
    }

    fn load_beside(
        &mut self,
        program: &amk_core::ValidatedProgram,
        weights: &amk_core::WeightStore,
        registry: &Registry,
    ) -> Result<Box<dyn Session>, BackendError> {
        let mut other = CpuSession::new(
            program.program().clone(),
            program.id(),
            weights,
            registry,
            self.options,
        )?;
        for b in 0..other.program.buffers.len() {
            let buf = &other.program.buffers[b];
            if buf.kind != BufferKind::KV_CACHE {
                continue;
            }
            let mine = self.program.buffers.iter().position(|m| m.same_slot(buf));
            if let Some(mine) = mine {
                other.store[b] = Slot::Owned(placeholder());
                other.links.push((b, self.link(mine)));
            }
        }
        Ok(Box::new(other))
    }

    fn set_params(&mut self, patch: &amk_core::ParamPatch) -> Result<(), BackendError> {
        if patch.program_id() != self.program_id {
            return Err(BackendError::Unsupported(
                "param patch was checked against another program than the one this session runs"
                    .into(),
            ));
        }
        // Patches are absolute: undo the previous one before applying this one.
        for t in self.patched.drain(..) {
            if let (Some(task), Some(orig)) = (
                self.program.tasks.get_mut(t as usize),
                self.loaded_params.get(&t),
            ) {
                task.params = orig.clone();
            }
        }
        for t in patch.tasks() {
            if let Some(task) = self.program.tasks.get(t as usize) {
                self.loaded_params
                    .entry(t)
                    .or_insert_with(|| task.params.clone());
            }
            self.patched.push(t);
        }
        patch.apply(&mut self.program.tasks);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amk_core::Opcode;
    use amk_core::json::Map;

    fn registry() -> Registry {
        amk_ops::registry().expect("registry")
    }

    fn session(p: Program, mode: FiringMode) -> Result<CpuSession, BackendError> {
        CpuSession::new(
            p,
            0,
            &WeightStore::new(),
            &registry(),
            CpuOptions { mode, threads: 1 },
        )
    }

    fn x_value() -> Tensor {
        Tensor::from_f32(DType::F32, &[4], &[1.0, -2.0, 3.0, -4.0]).expect("x")
    }

    /// `x → a → b → out` by COPYs; the last COPY's wait on the middle one is dropped (not a
    /// valid program: `validate` rejects it as a race).
    fn dropped_wait() -> Program {
        let mut p = Program::new();
        let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[4]);
        let a = p.new_buffer("a", BufferKind::ACTIVATION, DType::F32, &[4]);
        let b = p.new_buffer("b", BufferKind::ACTIVATION, DType::F32, &[4]);
        let out = p.new_buffer("out", BufferKind::IO_OUTPUT, DType::F32, &[4]);
        let (ca, cb, co) = (p.new_counter("a"), p.new_counter("b"), p.new_counter("o"));
        p.push_task(Opcode::COPY, &[x], &[a], ca, &[], Map::new(), "copy_a");
        p.push_task(
            Opcode::COPY,
            &[a],
            &[b],
            cb,
            &[(ca, 1)],
            Map::new(),
            "copy_b",
        );
        p.push_task(Opcode::COPY, &[b], &[out], co, &[], Map::new(), "copy_out");
        p
    }

    #[test]
    fn poison_in_place_equals_tensor_poisoned() {
        for &dtype in DType::ALL {
            let mut t = Tensor::zeros(dtype, &[3, 5]);
            poison(&mut t);
            assert_eq!(
                t.to_le_bytes(),
                Tensor::poisoned(dtype, &[3, 5]).to_le_bytes(),
                "{dtype}"
            );
        }
    }

    #[test]
    fn race_hunt_detects_a_dropped_wait() {
        assert!(!amk_core::validate(&dropped_wait(), &registry()).ok());
        let mut races = 0;
        for seed in 0..16 {
            let mut s = session(dropped_wait(), FiringMode::RaceHunt { seed }).expect("load");
            match s.step(&[("x", x_value())]) {
                Ok(o) => {
                    assert_eq!(o.get("out"), Some(&x_value()), "seed {seed}");
                }
                Err(BackendError::Race {
                    task,
                    label,
                    buffer,
                    seed: s,
                }) => {
                    assert_eq!(
                        (task, label.as_str(), buffer.as_str()),
                        (2, "copy_out", "b")
                    );
                    assert_eq!(s, seed);
                    races += 1;
                }
                Err(e) => panic!("seed {seed}: {e}"),
            }
        }
        assert!(races > 0, "no seed of 16 exposed the race");
        // List order happens to run the tasks in a safe order and sees nothing.
        let mut s = session(dropped_wait(), FiringMode::ListOrder).expect("load");
        let o = s.step(&[("x", x_value())]).expect("list order");
        assert_eq!(o.get("out"), Some(&x_value()));
    }

    #[test]
    fn race_hunt_detects_a_kv_read_before_its_append() {
        let mut p = Program::new();
        let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[4]);
        let kv = p.new_buffer("kv", BufferKind::KV_CACHE, DType::F32, &[3, 4]);
        let out = p.new_buffer("out", BufferKind::IO_OUTPUT, DType::F32, &[3, 4]);
        let (ck, co) = (p.new_counter("k"), p.new_counter("o"));
        let mut pos = Map::new();
        pos.insert("pos", amk_core::json::Value::Int(1));
        p.push_task(Opcode::KV_APPEND, &[x, kv], &[kv], ck, &[], pos, "append");
        p.push_task(Opcode::COPY, &[kv], &[out], co, &[], Map::new(), "read_kv");
        let mut races = 0;
        for seed in 0..16 {
            let mut s = session(p.clone(), FiringMode::RaceHunt { seed }).expect("load");
            match s.step(&[("x", x_value())]) {
                Ok(_) => {}
                Err(BackendError::Race { task, buffer, .. }) => {
                    assert_eq!((task, buffer.as_str()), (1, "kv"));
                    races += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(races > 0);
    }

    #[test]
    fn unsatisfiable_waits_are_a_deadlock() {
        let mut p = dropped_wait();
        // A wait on a counter nobody increments past 0... and on one that does not exist.
        p.tasks[1].waits[0].threshold = 2;
        p.tasks[2].waits.push(amk_core::Wait {
            counter: 99,
            threshold: 1,
        });
        for mode in [FiringMode::ListOrder, FiringMode::RaceHunt { seed: 1 }] {
            let mut s = session(p.clone(), mode).expect("load");
            match s.step(&[("x", x_value())]) {
                Err(BackendError::Deadlock(n)) => assert_eq!(n, 2),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn malformed_programs_are_refused_at_load() {
        let mut p = dropped_wait();
        p.tasks[0].inputs[0] = 42;
        assert!(matches!(
            session(p, FiringMode::ListOrder),
            Err(BackendError::Unsupported(m)) if m.contains("buffer 42")
        ));
        let mut p = dropped_wait();
        p.tasks[0].outputs[0] = 0; // the IO_INPUT x
        assert!(matches!(
            session(p, FiringMode::ListOrder),
            Err(BackendError::Unsupported(m)) if m.contains("read-only")
        ));
        let mut p = dropped_wait();
        p.tasks[0].outputs = vec![1, 1];
        assert!(matches!(
            session(p, FiringMode::ListOrder),
            Err(BackendError::Unsupported(m)) if m.contains("twice")
        ));
        let mut p = dropped_wait();
        p.buffers[1].shape = vec![u64::MAX, u64::MAX];
        assert!(matches!(
            session(p, FiringMode::ListOrder),
            Err(BackendError::Unsupported(m)) if m.contains("too large")
        ));
    }

    #[test]
    fn an_undeclared_alias_reads_a_snapshot() {
        // ADD(a, a) → a: the op did not declare an in-place pair, so input 0 and 1 are
        // snapshots of a's value before the call. Reading `a` uninitialised is fine here (the
        // validator would refuse it; the VM only needs to be well defined).
        let mut p = Program::new();
        let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[4]);
        let a = p.new_buffer("a", BufferKind::ACTIVATION, DType::F32, &[4]);
        let out = p.new_buffer("out", BufferKind::IO_OUTPUT, DType::F32, &[4]);
        let (c0, c1, c2) = (p.new_counter("0"), p.new_counter("1"), p.new_counter("2"));
        p.push_task(Opcode::COPY, &[x], &[a], c0, &[], Map::new(), "copy");
        p.push_task(
            Opcode::ADD,
            &[a, a],
            &[a],
            c1,
            &[(c0, 1)],
            Map::new(),
            "double",
        );
        p.push_task(
            Opcode::COPY,
            &[a],
            &[out],
            c2,
            &[(c1, 1)],
            Map::new(),
            "out",
        );
        let mut s = session(p, FiringMode::ListOrder).expect("load");
        let o = s.step(&[("x", x_value())]).expect("step");
        assert_eq!(
            o.get("out").map(Tensor::to_f32_vec),
            Some(vec![2.0, -4.0, 6.0, -8.0])
        );
    }
}
