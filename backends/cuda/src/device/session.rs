//! A program loaded on the device: its memory, tables and the launch loop with the watchdog.

use super::CudaBackend;
use super::driver::{DeviceMem, Event, MappedFlag, Module, describe};
use crate::CudaError;
use crate::TaskTrace;
use crate::abi::{AmkDeviceProgram, AmkInstruction, AmkStatus, COUNTER_STRIDE, status};
use crate::tables::{self, Placement, Tables, pack_params, task_label};
use amk_core::{
    BackendError, BufferKind, Outputs, ParamPatch, Program, Registry, Session, Tensor, WeightStore,
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
    arena: DeviceMem,
    _weights: Vec<DeviceMem>,
    /// Buffer descriptors, per-instruction prefetch ranges, and the per-task descriptor records.
    _descs: (DeviceMem, DeviceMem, DeviceMem, DeviceMem),
    instructions: DeviceMem,
    /// One i32 per task: 1 once `amk_verify_tasks` passed its record (`abi` `task_verified`).
    verified: DeviceMem,
    _fused: (DeviceMem, DeviceMem),
    _queues: (DeviceMem, DeviceMem),
    counters: DeviceMem,
    status: DeviceMem,
    patch_ids: DeviceMem,
    patch_recs: DeviceMem,
    abort: MappedFlag,
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

/// Blocks of `threads` threads and `smem` bytes of dynamic shared memory that fit on one SM
/// with `module`'s kernel, after the opt-in a launch needs past 48 KB in all (static
/// included).
fn blocks_per_sm(module: &Module, threads: u32, smem: usize) -> Result<usize, CudaError> {
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
    ) -> Result<Self, CudaError> {
        let inner = &backend.inner;
        let ctx = &inner.ctx;
        let (module, mk) = backend.module_for(registry, program, false)?;
        for t in &program.tasks {
            if !mk.has(t.op) {
                return Err(CudaError::UnsupportedOp {
                    task: t.id,
                    label: t.display_label(),
                    op: registry
                        .name_of(t.op)
                        .map_or_else(|| t.op.0.to_string(), |n| n.into_owned()),
                });
            }
        }
        let threads = inner.options.threads;
        // The GEMV weight ring (sm_90+) takes the dynamic shared memory that the device
        // allows beside the kernel's static shared memory, up to `ring_bytes`.
        let ring = if inner.info.compute_capability.0 >= 9 {
            inner
                .options
                .ring_bytes
                .min(inner.smem_optin.saturating_sub(module.static_smem()))
                & !1023
        } else {
            0
        };
        let smem = (mk.shared_bytes_for(program) as usize)
            .max(ring)
            .max(inner.options.min_smem_bytes);
        if smem > inner.smem_optin {
            return Err(CudaError::DeviceUnsuitable {
                device: inner.info.name.clone(),
                why: format!(
                    "ops need {smem} B of shared memory per block, the device allows {}",
                    inner.smem_optin
                ),
            });
        }
        let per_sm = blocks_per_sm(&module, threads, smem)?;
        let resident = per_sm * inner.info.sms;
        if resident == 0 {
            return Err(CudaError::Occupancy {
                needed: 1,
                resident,
                per_sm,
                sms: inner.info.sms,
                threads,
                smem,
            });
        }
        let tables = tables::build(program, registry, resident).map_err(CudaError::Layout)?;
        for s in &tables.fused_steps {
            if !mk.has(amk_core::Opcode(s.op as u16)) {
                return Err(CudaError::Layout(format!(
                    "a FUSED step uses op {}, which has no CUDA device function",
                    s.op
                )));
            }
        }
        let grid = tables.queues.len();
        if grid > resident {
            return Err(CudaError::Occupancy {
                needed: grid,
                resident,
                per_sm,
                sms: inner.info.sms,
                threads,
                smem,
            });
        }

        // Memory: weights once (deduplicated by tensor), one zeroed arena for the rest.
        let mut uploads: Vec<DeviceMem> = Vec::new();
        let mut weight_ptr = vec![0u64; program.buffers.len()];
        match weights {
            WeightSource::Store(store) => {
                let bound = store.bind(program)?;
                let mut by_tensor: HashMap<*const Tensor, usize> = HashMap::new();
                for (b, t) in bound.by_buffer.iter().enumerate() {
                    let Some(t) = t else { continue };
                    let key = Arc::as_ptr(t);
                    let slot = match by_tensor.get(&key) {
                        Some(&i) => i,
                        None => {
                            uploads.push(DeviceMem::from_slice(ctx, &t.to_le_bytes())?);
                            by_tensor.insert(key, uploads.len() - 1);
                            uploads.len() - 1
                        }
                    };
                    weight_ptr[b] = uploads[slot].ptr();
                }
            }
            WeightSource::Synthetic(synth) => {
                let mut by_name: HashMap<&str, (usize, &amk_core::Buffer)> = HashMap::new();
                for w in synth.plan(program)? {
                    let (b, src) = (w.buffer, w.name);
                    let buf = &program.buffers[b];
                    let slot = match by_name.get(src) {
                        Some(&(i, first)) => {
                            if first.dtype != buf.dtype || first.shape != buf.shape {
                                return Err(CudaError::Layout(format!(
                                    "buffers '{}' and '{}' name tensor '{src}' with different dtypes or shapes",
                                    first.name, buf.name
                                )));
                            }
                            i
                        }
                        None => {
                            let mem = DeviceMem::zeroed(ctx, buf.nbytes() as usize)?;
                            let ts = amk_core::synth::tensor_seed(synth.seed, w.seed_name);
                            backend.synth_fill(mem.ptr(), buf.numel(), buf.dtype, ts, w.init)?;
                            uploads.push(mem);
                            by_name.insert(src, (uploads.len() - 1, buf));
                            uploads.len() - 1
                        }
                    };
                    weight_ptr[b] = uploads[slot].ptr();
                }
            }
        }
        let arena = DeviceMem::zeroed(ctx, tables.arena_bytes as usize)?;
        let mut descs = tables.buffers.clone();
        for (d, p) in descs.iter_mut().zip(&tables.placement) {
            d.ptr = match *p {
                Placement::Weight(b) => weight_ptr[b],
                Placement::Arena { offset, .. } => arena.ptr() + offset,
            };
            if d.ptr == 0 {
                return Err(CudaError::Layout(
                    "a weight buffer has no bound tensor".into(),
                ));
            }
        }
        let descs_mem = DeviceMem::from_slice(ctx, &descs)?;
        let prefetch = DeviceMem::from_slice(
            ctx,
            &tables::prefetch_ranges(&tables.instructions, &descs, &tables.placement),
        )?;
        let l2_cap = inner.options.l2_prefetch_bytes;
        let mut l2_list =
            tables::l2_ranges(&tables.instructions, &descs, &tables.placement, l2_cap);
        let ops = (inner.options.l2_prefetch_ops.iter())
            .map(|name| {
                registry.resolve_name(name).ok_or_else(|| {
                    CudaError::Layout(format!(
                        "AMK_CUDA_L2_PREFETCH_OPS names '{name}', which is no registered op"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let keep =
            tables::prefetch_keep(&tables.instructions, inner.options.l2_prefetch_tasks, &ops);
        tables::keep_ranges(&mut l2_list, &keep);
        let l2 = DeviceMem::from_slice(ctx, &l2_list)?;
        let task_bufs =
            DeviceMem::from_slice(ctx, &tables::task_buffers(&tables.instructions, &descs))?;
        let instructions = DeviceMem::from_slice(ctx, &tables.instructions)?;
        let verified = DeviceMem::zeroed(ctx, tables.instructions.len().max(1) * 4)?;
        let fused_steps = DeviceMem::from_slice(ctx, &tables.fused_steps)?;
        let fused_off = DeviceMem::from_slice(ctx, &tables.fused_off)?;
        let queue_tasks = DeviceMem::from_slice(ctx, &tables.queues.tasks)?;
        let queue_off = DeviceMem::from_slice(ctx, &tables.queues.off)?;
        let counters = DeviceMem::zeroed(ctx, program.counters.len().max(1) * COUNTER_STRIDE * 4)?;
        let status_mem = DeviceMem::zeroed(ctx, std::mem::size_of::<AmkStatus>())?;
        let n = tables.instructions.len().max(1);
        let patch_ids = DeviceMem::zeroed(ctx, n * 4)?;
        let patch_recs = DeviceMem::zeroed(ctx, n * std::mem::size_of::<AmkInstruction>())?;
        let abort = MappedFlag::new(ctx)?;
        let prog = AmkDeviceProgram {
            buffers: descs_mem.ptr(),
            instructions: instructions.ptr(),
            fused_steps: fused_steps.ptr(),
            fused_off: fused_off.ptr(),
            queue_tasks: queue_tasks.ptr(),
            queue_off: queue_off.ptr(),
            counters: counters.ptr(),
            abort_flag: abort.dev_ptr(),
            status: status_mem.ptr(),
            n_buffers: descs.len() as i32,
            n_counters: program.counters.len() as i32,
            n_instructions: tables.instructions.len() as i32,
            n_queues: grid as i32,
            smem_bytes: smem as i32,
            epoch: 1,
            trace: 0,
            prefetch: if inner.options.prestart && ring > 0 {
                prefetch.ptr()
            } else {
                0
            },
            ring_bytes: ring as i32,
            flags: if inner.options.l2_evict_first {
                crate::abi::PROG_L2_EVICT_FIRST
            } else {
                0
            } | if inner.options.l2_prefetch_early {
                crate::abi::PROG_L2_PREFETCH_EARLY
            } else {
                0
            },
            l2_ranges: if l2_cap > 0 { l2.ptr() } else { 0 },
            task_bufs: task_bufs.ptr(),
            task_verified: verified.ptr(),
        };
        // Every task's ids and pre-wait op checks, once, on the device: the megakernel skips
        // them for the tasks that pass (docs/perf-notes.md round 11). A failure is the error
        // its step would have raised. The status read waits for the launch (same stream).
        if !tables.instructions.is_empty() {
            let vgrid = (tables.instructions.len() as u32).min(inner.info.sms.max(1) as u32);
            module.launch_verify(&prog, vgrid, threads)?;
            let mut st = [0u8; std::mem::size_of::<AmkStatus>()];
            status_mem.read(0, &mut st)?;
            if let Some(e) = status_error(program, registry, bytemuck::pod_read_unaligned(&st)) {
                return Err(e);
            }
        }
        Ok(CudaSession {
            backend: backend.clone(),
            current: tables.instructions.clone(),
            module,
            program: program.clone(),
            program_id,
            registry: registry.clone(),
            patched: Vec::new(),
            arena,
            _weights: uploads,
            _descs: (descs_mem, prefetch, l2, task_bufs),
            instructions,
            verified,
            _fused: (fused_steps, fused_off),
            _queues: (queue_tasks, queue_off),
            counters,
            status: status_mem,
            patch_ids,
            patch_recs,
            abort,
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
                let (off, bytes) = self.arena_range(b)?;
                self.arena.write(off, &vec![0xffu8; bytes])?;
            }
        }
        Ok(())
    }

    /// Sets the watchdog limit for later steps.
    pub fn set_watchdog(&mut self, limit: Duration) {
        self.watchdog = limit;
    }

    fn arena_range(&self, b: usize) -> Result<(usize, usize), CudaError> {
        match self.tables.placement[b] {
            Placement::Arena { offset, bytes } => Ok((offset as usize, bytes as usize)),
            Placement::Weight(_) => Err(CudaError::Layout(format!(
                "buffer '{}' is a weight, not an IO buffer",
                self.program.buffers[b].name
            ))),
        }
    }

    /// Uploads IO inputs, launches once, waits under the watchdog, reads the IO outputs.
    pub fn run(&mut self, inputs: &[(&str, Tensor)]) -> Result<Outputs, CudaError> {
        if let Some(why) = &self.lost {
            return Err(CudaError::ContextLost(why.clone()));
        }
        let targets = amk_core::backend::io_input_targets(&self.program, inputs)?;
        for (&b, (_, value)) in targets.iter().zip(inputs) {
            let (off, _) = self.arena_range(b)?;
            self.arena.write(off, &value.to_le_bytes())?;
            self.io_set[b] = true;
        }
        for (b, buf) in self.program.buffers.iter().enumerate() {
            if buf.kind == BufferKind::IO_INPUT && !self.io_set[b] {
                return Err(amk_core::backend::io_input_never_set(buf).into());
            }
        }
        self.launch_and_wait()?;
        let mut out = Outputs::default();
        for (b, buf) in self.program.buffers.iter().enumerate() {
            if buf.kind != BufferKind::IO_OUTPUT {
                continue;
            }
            let (off, bytes) = self.arena_range(b)?;
            let mut host = vec![0u8; bytes];
            self.arena.read(off, &mut host)?;
            let t = Tensor::from_le_bytes(buf.dtype, &buf.shape, &host)
                .map_err(|e| CudaError::Layout(format!("output '{}': {e}", buf.name)))?;
            out.tensors.push((buf.name.clone(), t));
        }
        Ok(out)
    }

    fn launch_and_wait(&mut self) -> Result<(), CudaError> {
        self.counters.zero()?;
        self.status.zero()?;
        self.abort.set(0);
        self.start.record()?;
        self.module
            .launch(&self.prog, self.grid, self.threads, self.smem)?;
        self.end.record()?;
        let t0 = Instant::now();
        let mut nap = Duration::from_micros(20);
        let mut aborted_at: Option<Instant> = None;
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
            match aborted_at {
                None if t0.elapsed() > self.watchdog => {
                    self.abort.set(1);
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
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
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
    fn set_params(&mut self, patch: &ParamPatch) -> Result<(), BackendError> {
        Ok(self.patch(patch)?)
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
