//! A program loaded on the device: its memory, tables and the launch loop with the watchdog.

use super::CudaBackend;
use super::driver::{DeviceMem, Event, MappedMem, Module, describe};
use super::load;
use crate::CudaError;
use crate::TaskTrace;
use crate::abi::{AmkDeviceProgram, AmkInstruction, AmkStatus, status};
use crate::tables::{Placement, Tables, pack_params, task_label};
use amk_core::{
    BackendError, BufferKind, LoopRun, OnRow, Outputs, ParamPatch, Program, Registry, RowWatch,
    Session, Tensor, WeightStore,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a session's weights come from.
#[derive(Debug, Clone, Copy)]
pub enum WeightSource<'a> {
    /// Host tensors, uploaded once.
    Store(&'a WeightStore),
    /// Generated on the device from a seed (`amk_core::synth`), never on the host.
    Synthetic(&'a amk_core::synth::SyntheticWeights),
}

/// How long the watchdog waits for the kernel to stop after raising the abort flag.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// Polls of a running launch that spin before the host starts yielding its thread between
/// polls (each poll is a driver query, about a microsecond).
const SPIN_POLLS: u64 = 20_000;

/// Where a non-weight buffer's bytes are: the device arena, or host-mapped memory.
#[derive(Debug, Clone, Copy)]
struct IoMem {
    host: bool,
    offset: usize,
    bytes: usize,
}

/// A [`RowWatch`] resolved: the buffer, its row width and count, the next row to report,
/// whether it can be read while a launch runs (host-mapped), and whether the host asked to
/// stop.
#[derive(Debug)]
struct Watched {
    buffer: usize,
    cols: usize,
    rows: u64,
    next: u64,
    live: bool,
    stopped: bool,
}

/// A loaded program: everything lives on the device for the session's life (weights uploaded
/// once, tables built once); a step zeroes the counters, launches once and reads the outputs.
pub struct CudaSession {
    backend: CudaBackend,
    module: Arc<Module>,
    program: Program,
    program_id: u64,
    pub(super) registry: Registry,
    tables: Tables,
    /// The device copy of each instruction record, mirrored on the host.
    current: Vec<AmkInstruction>,
    patched: Vec<usize>,
    arena: Arc<DeviceMem>,
    weights_mem: Vec<Arc<DeviceMem>>,
    /// Each buffer's device address (0: none).
    addrs: Vec<u64>,
    /// Buffers that live in the memory of the session this one was loaded beside.
    borrowed: Vec<bool>,
    /// That memory, kept alive as long as this session is.
    _lent: Vec<Arc<DeviceMem>>,
    /// Buffer descriptors and the per-task descriptor records.
    _descs: load::Descriptors,
    instructions: DeviceMem,
    /// One i32 per task: 1 once `amk_verify_tasks` passed its record (`abi` `task_verified`).
    verified: DeviceMem,
    _fused: (DeviceMem, DeviceMem),
    _queues: (DeviceMem, DeviceMem),
    counters: DeviceMem,
    status: DeviceMem,
    patch_ids: DeviceMem,
    patch_recs: DeviceMem,
    abort: MappedMem,
    /// Buffers in `MemSpace::HOST` (none: a minimal allocation).
    host: MappedMem,
    /// The step loop's words: `loop_stop` on the device, [`abi::LOOP_WORDS`] mapped.
    loop_stop: DeviceMem,
    loop_words: MappedMem,
    /// The last pass count a poll saw in the loop words.
    loop_seen: i32,
    prog: AmkDeviceProgram,
    grid: u32,
    threads: u32,
    smem: u32,
    io_set: Vec<bool>,
    watchdog: Duration,
    lost: Option<String>,
    last_ms: Option<f32>,
    start: Event,
    end: Event,
    trace: Option<DeviceMem>,
}

impl std::fmt::Debug for CudaSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSession")
            .field("tasks", &self.program.tasks.len())
            .field("grid", &self.grid)
            .field("threads", &self.threads)
            .finish()
    }
}

/// What a session loaded beside another ([`amk_core::Session::load_beside`]) takes from it:
/// the device addresses of its KV caches and weights by buffer name (with kind, dtype and
/// shape, which must match), and the memory that holds them, kept alive by the new session.
pub(crate) struct Beside {
    by_name: HashMap<String, Lent>,
    keep: Vec<Arc<DeviceMem>>,
}

/// One buffer the other session lends: what it is, and where it lives on the device.
struct Lent {
    buf: amk_core::Buffer,
    addr: u64,
}

impl Beside {
    /// The address `buf` takes from the other session, if that session has a KV cache or
    /// weight of its name, kind, dtype and shape.
    pub(super) fn lends(&self, buf: &amk_core::Buffer) -> Option<u64> {
        if !matches!(buf.kind, BufferKind::KV_CACHE | BufferKind::WEIGHT) {
            return None;
        }
        let l = self.by_name.get(&buf.name)?;
        l.buf.same_slot(buf).then_some(l.addr)
    }
}

/// Blocks of `threads` threads and `smem` bytes of dynamic shared memory that fit on one SM
/// with `module`'s kernel, after the opt-in a launch needs past 48 KB in all (static
/// included).
pub(super) fn blocks_per_sm(
    module: &Module,
    threads: u32,
    smem: usize,
) -> Result<usize, CudaError> {
    if smem + module.static_smem() > 48 << 10 {
        module.set_max_dynamic_smem(smem)?;
    }
    module.occupancy(threads, smem)
}

impl CudaSession {
    /// Lays out and uploads `program` (validated by the caller, except in tests of the
    /// watchdog). `program_id` binds param patches to it.
    pub(crate) fn load(
        backend: &CudaBackend,
        program: &Program,
        program_id: u64,
        weights: WeightSource<'_>,
        registry: &Registry,
        carried: &[(u32, u32)],
        beside: Option<&Beside>,
    ) -> Result<Self, CudaError> {
        let inner = &backend.inner;
        let ctx = &inner.ctx;
        let lent = load::lent_addresses(program, beside);
        let (module, mk) = backend.module_for(registry, program, false)?;
        load::check_ops(program, registry, &mk)?;
        let shape = load::LaunchShape::of(inner, &module, &mk, program)?;
        let tables = load::build_tables(inner, program, registry, &mk, &shape)?;
        // Memory: weights once (deduplicated by tensor), one zeroed arena for the rest.
        let uploads = load::upload_weights(backend, program, weights, &lent)?;
        let mem = load::BufferMem {
            arena: Arc::new(DeviceMem::zeroed(ctx, tables.arena_bytes as usize)?),
            host: MappedMem::new(ctx, tables.host_bytes as usize)?,
        };
        let descs = load::descriptors(&tables, &uploads.ptr, &mem, &lent)?;
        let source = load::TableSource {
            program,
            tables: &tables,
            descs: &descs,
            carried,
        };
        let dev = load::device_tables(inner, &source)?;
        let prog = load::device_program(inner, &source, &dev, &shape);
        let launch = Launch {
            threads: shape.threads,
            sms: inner.info.sms,
        };
        verify_tasks(&module, &prog, program, registry, &dev.status, launch)?;
        let load::DeviceTables {
            descs: descs_mem,
            instructions,
            verified,
            fused,
            queues,
            counters,
            status: status_mem,
            patch_ids,
            patch_recs,
            abort,
            loop_stop,
            loop_words,
        } = dev;
        let load::BufferMem { arena, host } = mem;
        let grid = tables.queues.len();
        let threads = shape.threads;
        let smem = shape.smem;
        let addrs: Vec<u64> = descs.iter().map(|d| d.ptr).collect();
        let uploads = uploads.mem;
        Ok(CudaSession {
            backend: backend.clone(),
            current: tables.instructions.clone(),
            module,
            program: program.clone(),
            program_id,
            registry: registry.clone(),
            patched: Vec::new(),
            arena,
            weights_mem: uploads,
            addrs,
            borrowed: lent.iter().map(Option::is_some).collect(),
            _lent: beside.map(|b| b.keep.clone()).unwrap_or_default(),
            _descs: descs_mem,
            instructions,
            verified,
            _fused: fused,
            _queues: queues,
            counters,
            status: status_mem,
            patch_ids,
            patch_recs,
            abort,
            host,
            loop_stop,
            loop_words,
            loop_seen: 0,
            prog,
            grid: grid as u32,
            threads,
            smem: smem as u32,
            io_set: vec![false; program.buffers.len()],
            watchdog: inner.options.watchdog,
            lost: None,
            last_ms: None,
            start: Event::new(ctx)?,
            end: Event::new(ctx)?,
            trace: None,
            tables,
        })
    }

    /// What a session loaded beside this one takes from it: its KV caches and weights (and
    /// the memory holding them).
    pub(crate) fn beside(&self) -> Beside {
        let mut by_name = HashMap::new();
        for (b, buf) in self.program.buffers.iter().enumerate() {
            if matches!(buf.kind, BufferKind::KV_CACHE | BufferKind::WEIGHT) && self.addrs[b] != 0 {
                let lent = Lent {
                    buf: buf.clone(),
                    addr: self.addrs[b],
                };
                by_name.insert(buf.name.clone(), lent);
            }
        }
        let mut keep = self._lent.clone();
        keep.push(Arc::clone(&self.arena));
        keep.extend(self.weights_mem.iter().cloned());
        Beside { by_name, keep }
    }

    /// Kernel time of the last forward pass, from device events.
    pub fn last_kernel_ms(&self) -> Option<f32> {
        self.last_ms
    }

    /// Blocks per launch.
    pub fn grid(&self) -> u32 {
        self.grid
    }

    /// Registers per thread and stack bytes per thread of the megakernel.
    pub fn kernel_resources(&self) -> (i32, i32) {
        (self.module.regs, self.module.local_bytes)
    }

    /// Records, from the next step on, when every task was reached, ready and done (for
    /// performance analysis; a few global stores per task). The session's kernel has no trace
    /// points (code a launch does not run costs time, docs/perf-notes.md round 18), so this
    /// loads the same program's kernel with them (compiled on first use, `registry` being the
    /// one the session was loaded with): a traced step runs that kernel.
    pub fn enable_trace(&mut self, registry: &Registry) -> Result<(), CudaError> {
        if self.trace.is_none() {
            let (module, _) = self.backend.module_for(registry, &self.program, true)?;
            let smem = self.smem as usize;
            let info = &self.backend.inner.info;
            let per_sm = blocks_per_sm(&module, self.threads, smem)?;
            if per_sm * info.sms < self.grid as usize {
                return Err(CudaError::Occupancy {
                    needed: self.grid as usize,
                    resident: per_sm * info.sms,
                    per_sm,
                    sms: info.sms,
                    threads: self.threads,
                    smem,
                });
            }
            self.module = module;
            let words = self.program.tasks.len().max(1) * crate::abi::TRACE_WORDS;
            let mem = DeviceMem::zeroed(self.arena.context(), words * 8)?;
            self.prog.trace = mem.ptr();
            self.trace = Some(mem);
        }
        Ok(())
    }

    /// The last step's per-task trace (empty unless [`CudaSession::enable_trace`] was called).
    pub fn trace(&self) -> Result<Vec<TaskTrace>, CudaError> {
        let Some(mem) = &self.trace else {
            return Ok(Vec::new());
        };
        let n = self.program.tasks.len();
        let mut raw = vec![0u8; n * crate::abi::TRACE_WORDS * 8];
        mem.read(0, &mut raw)?;
        let w: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        Ok((0..n)
            .map(|t| {
                let r = &w[t * crate::abi::TRACE_WORDS..(t + 1) * crate::abi::TRACE_WORDS];
                TaskTrace {
                    task: t,
                    block: r[3] as u32,
                    reached: r[0],
                    ready: r[1],
                    done: r[2],
                    prologue: r[4],
                    returned: r[5],
                    dispatched: r[6],
                    waiting: r[7],
                    probes: std::array::from_fn(|k| r.get(8 + k).copied().unwrap_or(0)),
                }
            })
            .collect())
    }

    /// The program this session runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Fills buffer `buffer` (an activation or KV-cache buffer, not a weight) with the
    /// synthetic tensor named after the buffer (`amk_core::synth`, seed `seed`): e.g. a KV
    /// cache holding a random prefix for a benchmark at a later position.
    pub fn fill_synthetic(
        &mut self,
        buffer: usize,
        seed: u64,
        init: amk_core::synth::Init,
    ) -> Result<(), CudaError> {
        let buf = self
            .program
            .buffers
            .get(buffer)
            .ok_or_else(|| CudaError::Layout(format!("no buffer {buffer}")))?;
        let (off, _) = self.arena_range(buffer)?;
        let ts = amk_core::synth::tensor_seed(seed, &buf.name);
        self.backend.synth_fill(
            self.arena.ptr() + off as u64,
            buf.numel(),
            buf.dtype,
            ts,
            init,
        )
    }

    /// Overwrites every IO output with all-ones bytes (NaN for floats, -1 for integers), so a
    /// step that fails to write an output cannot pass for one that did.
    pub fn poison_outputs(&mut self) -> Result<(), CudaError> {
        for b in 0..self.program.buffers.len() {
            if self.program.buffers[b].kind == BufferKind::IO_OUTPUT {
                let bytes = self.io_mem(b)?.bytes;
                self.io_write(b, 0, &vec![0xffu8; bytes])?;
            }
        }
        Ok(())
    }

    fn arena_range(&self, b: usize) -> Result<(usize, usize), CudaError> {
        match self.io_mem(b)? {
            IoMem {
                host: false,
                offset,
                bytes,
            } => Ok((offset, bytes)),
            _ => Err(CudaError::Layout(format!(
                "buffer '{}' lives in host-mapped memory, not in the arena",
                self.program.buffers[b].name
            ))),
        }
    }

    /// Where buffer `b`'s bytes are (any buffer but a weight).
    fn io_mem(&self, b: usize) -> Result<IoMem, CudaError> {
        if self.borrowed.get(b).copied().unwrap_or(false) {
            return Err(CudaError::Layout(format!(
                "buffer '{}' is the KV cache of the session this one was loaded beside: read \
                 and write it there",
                self.program.buffers[b].name
            )));
        }
        match self.tables.placement.get(b) {
            Some(&Placement::Arena { offset, bytes }) => Ok(IoMem {
                host: false,
                offset: offset as usize,
                bytes: bytes as usize,
            }),
            Some(&Placement::Host { offset, bytes }) => Ok(IoMem {
                host: true,
                offset: offset as usize,
                bytes: bytes as usize,
            }),
            _ => Err(CudaError::Layout(format!(
                "buffer {b} is a weight (or does not exist), not an IO or state buffer"
            ))),
        }
    }

    /// Writes `data` at byte `at` of buffer `b`.
    fn io_write(&self, b: usize, at: usize, data: &[u8]) -> Result<(), CudaError> {
        let m = self.io_mem(b)?;
        if at.checked_add(data.len()).is_none_or(|e| e > m.bytes) {
            return Err(CudaError::Layout(format!(
                "a write of {} bytes at {at} overruns buffer {b}",
                data.len()
            )));
        }
        if m.host {
            self.host.write(m.offset + at, data)
        } else {
            self.arena.write(m.offset + at, data)
        }
    }

    /// Reads `out.len()` bytes at byte `at` of buffer `b`. A device buffer's read waits for
    /// the device (never call it while a launch runs); a host-mapped one's does not.
    fn io_read(&self, b: usize, at: usize, out: &mut [u8]) -> Result<(), CudaError> {
        let m = self.io_mem(b)?;
        if at.checked_add(out.len()).is_none_or(|e| e > m.bytes) {
            return Err(CudaError::Layout(format!(
                "a read of {} bytes at {at} overruns buffer {b}",
                out.len()
            )));
        }
        if m.host {
            self.host.read(m.offset + at, out)
        } else {
            self.arena.read(m.offset + at, out)
        }
    }

    /// Buffer `b`'s whole value.
    fn io_tensor(&self, b: usize) -> Result<Tensor, CudaError> {
        let buf = &self.program.buffers[b];
        let mut host = vec![0u8; self.io_mem(b)?.bytes];
        self.io_read(b, 0, &mut host)?;
        Tensor::from_le_bytes(buf.dtype, &buf.shape, &host)
            .map_err(|e| CudaError::Layout(format!("buffer '{}': {e}", buf.name)))
    }

    /// Errors unless every IO input has a value.
    fn check_inputs_set(&self) -> Result<(), CudaError> {
        for (b, buf) in self.program.buffers.iter().enumerate() {
            if buf.kind == BufferKind::IO_INPUT && !self.io_set[b] {
                return Err(amk_core::backend::io_input_never_set(buf).into());
            }
        }
        Ok(())
    }

    /// Uploads IO inputs, launches once, waits under the watchdog, reads the IO outputs.
    pub fn run(&mut self, inputs: &[(&str, Tensor)]) -> Result<Outputs, CudaError> {
        self.run_reading(inputs, None)
    }

    /// [`CudaSession::run`], reading back only the IO outputs named in `only` (all of them
    /// when `None`).
    pub fn run_reading(
        &mut self,
        inputs: &[(&str, Tensor)],
        only: Option<&[&str]>,
    ) -> Result<Outputs, CudaError> {
        if let Some(why) = &self.lost {
            return Err(CudaError::ContextLost(why.clone()));
        }
        self.write_named(inputs, &[BufferKind::IO_INPUT])?;
        self.check_inputs_set()?;
        self.launch_and_wait()?;
        let wanted = |name: &str| only.is_none_or(|names| names.contains(&name));
        let mut out = Outputs::default();
        for (b, buf) in self.program.buffers.iter().enumerate() {
            if buf.kind == BufferKind::IO_OUTPUT && wanted(&buf.name) {
                out.tensors.push((buf.name.clone(), self.io_tensor(b)?));
            }
        }
        Ok(out)
    }

    /// Sets buffers of `kinds` by name: every value is checked before any is written.
    fn write_named(
        &mut self,
        values: &[(&str, Tensor)],
        kinds: &[BufferKind],
    ) -> Result<(), CudaError> {
        let targets = amk_core::backend::named_targets(&self.program, values, kinds)?;
        for (&b, (_, value)) in targets.iter().zip(values) {
            self.io_write(b, 0, &value.to_le_bytes())?;
            self.io_set[b] = true;
        }
        Ok(())
    }

    /// The current value of the STATE, IO_OUTPUT or KV_CACHE buffer `name`.
    pub fn read_named(&self, name: &str) -> Result<Tensor, CudaError> {
        let b = amk_core::backend::readable_buffer(&self.program, name)?;
        self.io_tensor(b)
    }

    /// Starts one launch of the megakernel (counters, status and abort flag reset first).
    fn launch(&mut self) -> Result<(), CudaError> {
        self.counters.zero()?;
        self.status.zero()?;
        self.abort.set(0, 0);
        self.start.record()?;
        self.module
            .launch(&self.prog, self.grid, self.threads, self.smem)?;
        self.end.record()
    }

    /// Waits for the launch to end, calling `poll` between checks (it returns true when the
    /// launch made progress, which restarts the watchdog's clock). Spins, then yields: never
    /// sleeps past the end (a sleep's granularity is tens of microseconds, a pass a fraction
    /// of a millisecond).
    fn wait_launch(
        &mut self,
        poll: &mut dyn FnMut(&mut Self) -> Result<bool, CudaError>,
    ) -> Result<(), CudaError> {
        let mut progress_at = Instant::now();
        let mut aborted_at: Option<Instant> = None;
        let mut polls: u64 = 0;
        loop {
            match self.end.done() {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    let why = format!("the forward pass failed: {}", describe(&e));
                    self.lost = Some(why.clone());
                    return Err(CudaError::ContextLost(why));
                }
            }
            if poll(self)? {
                progress_at = Instant::now();
            }
            match aborted_at {
                None if progress_at.elapsed() > self.watchdog => {
                    self.abort.set(0, 1);
                    aborted_at = Some(Instant::now());
                }
                Some(at) if at.elapsed() > ABORT_GRACE => {
                    let why = "a forward pass ignored the abort flag".to_string();
                    self.lost = Some(why);
                    return Err(CudaError::Timeout {
                        after: self.watchdog,
                        recovered: false,
                    });
                }
                _ => {}
            }
            polls += 1;
            if polls < SPIN_POLLS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if aborted_at.is_some() {
            return Err(CudaError::Timeout {
                after: self.watchdog,
                recovered: true,
            });
        }
        self.last_ms = self.start.elapsed_ms(&self.end).ok();
        let mut st = [0u8; std::mem::size_of::<AmkStatus>()];
        self.status.read(0, &mut st)?;
        match status_error(
            &self.program,
            &self.registry,
            bytemuck::pod_read_unaligned(&st),
        ) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn launch_and_wait(&mut self) -> Result<(), CudaError> {
        self.launch()?;
        self.wait_launch(&mut |_| Ok(false))
    }

    /// Resolves `watch` and marks its rows from `first_row` on as unwritten.
    fn watch_rows(&mut self, watch: &RowWatch) -> Result<Watched, CudaError> {
        let w = amk_core::backend::watched_rows(&self.program, watch)?;
        let marker = RowWatch::UNWRITTEN.to_le_bytes();
        for r in watch.first_row..w.rows {
            self.io_write(w.buffer, r as usize * w.cols * 4, &marker)?;
        }
        Ok(Watched {
            buffer: w.buffer,
            cols: w.cols,
            rows: w.rows,
            next: watch.first_row,
            live: self.io_mem(w.buffer)?.host,
            stopped: false,
        })
    }

    /// Reports every newly written row of `w` (until `on_row` asks to stop); true when it
    /// reported any.
    fn report_rows(&self, w: &mut Watched, on_row: &mut OnRow<'_>) -> Result<bool, CudaError> {
        let mut row = vec![0u8; w.cols * 4];
        let mut any = false;
        while !w.stopped && w.next < w.rows {
            self.io_read(w.buffer, w.next as usize * w.cols * 4, &mut row[..4])?;
            if i32::from_le_bytes([row[0], row[1], row[2], row[3]]) == RowWatch::UNWRITTEN {
                break;
            }
            self.io_read(w.buffer, w.next as usize * w.cols * 4, &mut row)?;
            let vals: Vec<i32> = (row.chunks_exact(4))
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            w.next += 1;
            any = true;
            w.stopped = !on_row(w.next - 1, &vals);
        }
        Ok(any)
    }

    /// Runs up to `max_passes` passes of the program's step loop, as few launches as the
    /// counters allow (one, unless `max_passes` × the largest wait threshold overflows 32
    /// bits), streaming `watch`'s rows to `on_row` while the launch runs when the buffer is
    /// host-mapped (else after it).
    pub fn run_loop(
        &mut self,
        max_passes: u64,
        watch: Option<&RowWatch>,
        on_row: &mut OnRow<'_>,
    ) -> Result<LoopRun, CudaError> {
        if let Some(why) = &self.lost {
            return Err(CudaError::ContextLost(why.clone()));
        }
        let Some(l) = self.program.step_loop else {
            return Err(
                BackendError::Unsupported("the program has no step loop to run".into()).into(),
            );
        };
        self.check_inputs_set()?;
        let mut watched = watch.map(|w| self.watch_rows(w)).transpose()?;
        let widest = (self.program.tasks.iter())
            .flat_map(|t| t.waits.iter().map(|w| w.threshold.max(1) as u64))
            .max()
            .unwrap_or(1)
            .max(u64::from(self.prog.loop_gate_count));
        let per_launch = (u64::from(u32::MAX) / widest).saturating_sub(1).max(1);
        self.loop_stop.zero()?;
        let mut run = LoopRun::default();
        let mut kernel_ms = 0.0;
        while run.passes < max_passes && !run.halted && !run.cancelled {
            let n = (max_passes - run.passes).min(per_launch);
            self.loop_words.set(crate::abi::LOOP_CANCEL, 0);
            self.loop_words.set(crate::abi::LOOP_DONE, 0);
            self.prog.loop_passes = n as u32;
            self.prog.loop_words = self.loop_words.dev_ptr();
            self.loop_seen = 0;
            let launched = self
                .launch()
                .and_then(|()| self.wait_launch(&mut |me| me.poll_loop(&mut watched, on_row)));
            self.prog.loop_passes = 0;
            self.prog.loop_words = 0;
            launched?;
            kernel_ms += f64::from(self.last_ms.unwrap_or(0.0));
            run.passes += u64::from(self.loop_words.get(crate::abi::LOOP_DONE).max(0) as u32);
            let mut word = [0u8; 4];
            self.io_read(l.halt as usize, 0, &mut word)?;
            run.halted = i32::from_le_bytes(word) != 0;
            self.loop_stop.read(0, &mut word)?;
            run.cancelled = i32::from_le_bytes(word) != 0;
            if let Some(w) = &mut watched {
                self.report_rows(w, on_row)?;
                run.cancelled |= w.stopped;
            }
        }
        run.kernel_ms = Some(kernel_ms);
        Ok(run)
    }

    /// One poll of a running loop: streams new rows (host-mapped) and passes the host's stop
    /// request on; true when a pass ended since the last poll or a row arrived.
    fn poll_loop(
        &mut self,
        watched: &mut Option<Watched>,
        on_row: &mut OnRow<'_>,
    ) -> Result<bool, CudaError> {
        let mut progressed = false;
        if let Some(w) = watched.as_mut().filter(|w| w.live) {
            progressed = self.report_rows(w, on_row)?;
            if w.stopped {
                self.loop_words.set(crate::abi::LOOP_CANCEL, 1);
            }
        }
        let done = self.loop_words.get(crate::abi::LOOP_DONE);
        if done != self.loop_seen {
            self.loop_seen = done;
            progressed = true;
        }
        Ok(progressed)
    }

    /// Applies an absolute param patch: previously patched records go back to their loaded
    /// values, the new edits are packed like at load, and only the touched records are
    /// uploaded (one copy of ids, one of records, one small scatter launch).
    pub fn patch(&mut self, patch: &ParamPatch) -> Result<(), CudaError> {
        if let Some(why) = &self.lost {
            return Err(CudaError::ContextLost(why.clone()));
        }
        if patch.program_id() != self.program_id {
            return Err(BackendError::Unsupported(
                "param patch was checked against another program than the one this session runs"
                    .into(),
            )
            .into());
        }
        let mut touched: Vec<usize> = std::mem::take(&mut self.patched);
        let mut edits: std::collections::BTreeMap<usize, amk_core::json::Map> = Default::default();
        for (t, key, v) in patch.entries() {
            let t = *t as usize;
            let task = self.program.tasks.get(t).ok_or_else(|| {
                CudaError::Layout(format!("param patch names task {t}, which does not exist"))
            })?;
            edits
                .entry(t)
                .or_insert_with(|| task.params.clone())
                .insert(key.clone(), amk_core::json::Value::Int(*v));
        }
        let mut new_records = std::collections::BTreeMap::new();
        for t in &touched {
            new_records.insert(*t, self.tables.instructions[*t]);
        }
        for (t, params) in &edits {
            let spec = self
                .registry
                .get(self.program.tasks[*t].op)
                .ok_or_else(|| CudaError::Layout(format!("task {t}: op not registered")))?;
            let mut rec = self.tables.instructions[*t];
            rec.params = pack_params(spec, params)
                .map_err(|e| CudaError::Layout(format!("task {t}: {e}")))?;
            new_records.insert(*t, rec);
        }
        let mut ids: Vec<i32> = Vec::new();
        let mut recs: Vec<AmkInstruction> = Vec::new();
        for (t, rec) in new_records {
            if self.current[t] != rec {
                ids.push(t as i32);
                recs.push(rec);
                self.current[t] = rec;
            }
        }
        touched.clear();
        touched.extend(edits.keys().copied());
        self.patched = touched;
        if ids.is_empty() {
            return Ok(());
        }
        self.patch_ids.write(0, bytemuck::cast_slice(&ids))?;
        self.patch_recs.write(0, bytemuck::cast_slice(&recs))?;
        self.module.launch_patch(
            self.instructions.ptr(),
            self.patch_ids.ptr(),
            self.patch_recs.ptr(),
            ids.len() as i32,
            self.verified.ptr(),
        )
    }
}

impl CudaSession {
    /// Test hook (see `testing::overwrite_opcode`).
    #[cfg(feature = "testing")]
    pub(crate) fn overwrite_opcode(&mut self, task: usize, op: i32) -> Result<(), CudaError> {
        let mut rec = *self
            .current
            .get(task)
            .ok_or_else(|| CudaError::Layout(format!("no task {task}")))?;
        rec.op = op;
        self.current[task] = rec;
        self.instructions.write(
            task * std::mem::size_of::<AmkInstruction>(),
            bytemuck::bytes_of(&rec),
        )?;
        // A rewritten record is not the one amk_verify_tasks passed.
        self.verified.write(task * 4, &0i32.to_le_bytes())
    }
}

impl Session for CudaSession {
    fn step(&mut self, inputs: &[(&str, Tensor)]) -> Result<Outputs, BackendError> {
        Ok(self.run(inputs)?)
    }
    fn step_reading(
        &mut self,
        inputs: &[(&str, Tensor)],
        outputs: &[&str],
    ) -> Result<Outputs, BackendError> {
        Ok(self.run_reading(inputs, Some(outputs))?)
    }
    fn set_params(&mut self, patch: &ParamPatch) -> Result<(), BackendError> {
        Ok(self.patch(patch)?)
    }
    fn write(&mut self, values: &[(&str, Tensor)]) -> Result<(), BackendError> {
        if let Some(why) = &self.lost {
            return Err(CudaError::ContextLost(why.clone()).into());
        }
        Ok(self.write_named(values, &[BufferKind::IO_INPUT, BufferKind::STATE])?)
    }
    fn read(&mut self, name: &str) -> Result<Tensor, BackendError> {
        if let Some(why) = &self.lost {
            return Err(CudaError::ContextLost(why.clone()).into());
        }
        Ok(self.read_named(name)?)
    }
    fn load_beside(
        &mut self,
        program: &amk_core::ValidatedProgram,
        weights: &amk_core::WeightStore,
        registry: &Registry,
    ) -> Result<Box<dyn Session>, BackendError> {
        let beside = self.beside();
        let s = CudaSession::load(
            &self.backend,
            program.program(),
            program.id(),
            WeightSource::Store(weights),
            registry,
            &program.result().carried_reads,
            Some(&beside),
        )?;
        Ok(Box::new(s))
    }

    fn run_loop(
        &mut self,
        max_passes: u64,
        watch: Option<&RowWatch>,
        on_row: &mut OnRow<'_>,
    ) -> Result<LoopRun, BackendError> {
        Ok(CudaSession::run_loop(self, max_passes, watch, on_row)?)
    }

    fn enable_trace(&mut self, registry: &Registry) -> Result<bool, BackendError> {
        CudaSession::enable_trace(self, registry)?;
        Ok(true)
    }

    fn trace(&self) -> Result<Vec<amk_core::TaskTrace>, BackendError> {
        Ok(CudaSession::trace(self)?)
    }
}

/// The launch a program's kernel runs with: threads a block, blocks (one an SM).
#[derive(Clone, Copy)]
struct Launch {
    threads: u32,
    sms: usize,
}

/// Every task's ids and pre-wait op checks, once, on the device: the megakernel skips them for
/// the tasks that pass (docs/perf-notes.md round 11). A failure is the error its step would
/// have raised. The status read waits for the launch (same stream).
fn verify_tasks(
    module: &Module,
    prog: &AmkDeviceProgram,
    program: &Program,
    registry: &Registry,
    status_mem: &DeviceMem,
    launch: Launch,
) -> Result<(), CudaError> {
    let Launch { threads, sms } = launch;
    let n = prog.n_instructions.max(0) as u32;
    if n == 0 {
        return Ok(());
    }
    module.launch_verify(prog, n.min(sms.max(1) as u32), threads)?;
    let mut st = [0u8; std::mem::size_of::<AmkStatus>()];
    status_mem.read(0, &mut st)?;
    match status_error(program, registry, bytemuck::pod_read_unaligned(&st)) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The error a launch's status word reports (the first failing task's), or `None` when it
/// reports none.
fn status_error(program: &Program, registry: &Registry, st: AmkStatus) -> Option<CudaError> {
    if st.code == status::OK {
        return None;
    }
    let t = st.task.max(0) as usize;
    Some(CudaError::Trap {
        task: program.tasks.get(t).map_or(st.task as u32, |x| x.id),
        label: task_label(program, t),
        step: (st.step >= 0).then_some(st.step as u32),
        reason: format!(
            "{} (op {})",
            status::describe(st.code),
            registry
                .name_of(amk_core::Opcode(st.op as u16))
                .map_or_else(|| st.op.to_string(), |n| n.into_owned())
        ),
        detail: st.detail,
    })
}
