//! The steps of loading a program on the device ([`super::session::CudaSession::load`]): the
//! ops checked against the kernel, the launch's shape, the weights uploaded, the buffer
//! descriptors laid out, every table the kernel reads copied to the device, and the device
//! program record that points at them.

use super::driver::{DeviceMem, MappedMem, Module};
use super::session::{Beside, WeightSource};
use super::{CudaBackend, Inner};
use crate::CudaError;
use crate::abi::{AmkDeviceProgram, AmkInstruction, AmkStatus, COUNTER_STRIDE};
use crate::assemble::Megakernel;
use crate::tables::{self, Placement, Tables};
use amk_core::{Program, Registry, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// Fails with the first task whose op the kernel has no device function for.
pub(super) fn check_ops(
    program: &Program,
    registry: &Registry,
    mk: &Megakernel,
) -> Result<(), CudaError> {
    match program.tasks.iter().find(|t| !mk.has(t.op)) {
        Some(t) => Err(CudaError::UnsupportedOp {
            task: t.id,
            label: t.display_label(),
            op: registry
                .name_of(t.op)
                .map_or_else(|| t.op.0.to_string(), |n| n.into_owned()),
        }),
        None => Ok(()),
    }
}

/// How the kernel is launched: its block, its dynamic shared memory and how many of its blocks
/// the device holds at once.
#[derive(Debug, Clone, Copy)]
pub(super) struct LaunchShape {
    pub(super) threads: u32,
    pub(super) smem: usize,
    pub(super) per_sm: usize,
    pub(super) resident: usize,
}

impl LaunchShape {
    /// The shape `program`'s ops need on this device, refused when their shared memory
    /// exceeds what a block may have or no block fits an SM.
    pub(super) fn of(
        inner: &Inner,
        module: &Module,
        mk: &Megakernel,
        program: &Program,
    ) -> Result<LaunchShape, CudaError> {
        let threads = inner.options.threads;
        let smem = (mk.shared_bytes_for(program) as usize).max(inner.options.min_smem_bytes);
        // The kernel's static shared memory (the scheduler's) counts against the same limit.
        let fixed = module.static_smem();
        if smem + fixed > inner.smem_optin {
            return Err(CudaError::DeviceUnsuitable {
                device: inner.info.name.clone(),
                why: format!(
                    "a block needs {smem} B of dynamic shared memory (its ops', or \
                     AMK_CUDA_SMEM_KB's) beside the kernel's {fixed} B of static shared \
                     memory, the device allows {} B in all",
                    inner.smem_optin
                ),
            });
        }
        let per_sm = super::session::blocks_per_sm(module, threads, smem)?;
        let shape = LaunchShape {
            threads,
            smem,
            per_sm,
            resident: per_sm * inner.info.sms,
        };
        if shape.resident == 0 {
            return Err(shape.occupancy(inner, 1));
        }
        Ok(shape)
    }

    /// The error for a grid of `needed` blocks that this shape cannot hold at once.
    pub(super) fn occupancy(&self, inner: &Inner, needed: usize) -> CudaError {
        CudaError::Occupancy {
            needed,
            resident: self.resident,
            per_sm: self.per_sm,
            sms: inner.info.sms,
            threads: self.threads,
            smem: self.smem,
        }
    }
}

/// The program's tables for a grid of at most `shape.resident` blocks, checked: every FUSED
/// step's op has a device function and the queues fit the resident blocks.
pub(super) fn build_tables(
    inner: &Inner,
    program: &Program,
    registry: &Registry,
    mk: &Megakernel,
    shape: &LaunchShape,
) -> Result<Tables, CudaError> {
    let tables = tables::build(program, registry, shape.resident).map_err(CudaError::Layout)?;
    if let Some(s) = (tables.fused_steps.iter()).find(|s| !mk.has(amk_core::Opcode(s.op as u16))) {
        return Err(CudaError::Layout(format!(
            "a FUSED step uses op {}, which has no CUDA device function",
            s.op
        )));
    }
    if tables.queues.len() > shape.resident {
        return Err(shape.occupancy(inner, tables.queues.len()));
    }
    Ok(tables)
}

/// The program's weights on the device: the allocations, and each buffer's address (0 for
/// buffers that are not weights).
pub(super) struct Uploaded {
    pub(super) mem: Vec<Arc<DeviceMem>>,
    pub(super) ptr: Vec<u64>,
}

/// Uploads `weights` (each tensor once, however many buffers name it); a buffer `lent` by the
/// session loaded first takes that session's address instead.
pub(super) fn upload_weights(
    backend: &CudaBackend,
    program: &Program,
    weights: WeightSource<'_>,
    lent: &[Option<u64>],
) -> Result<Uploaded, CudaError> {
    let mut up = Uploaded {
        mem: Vec::new(),
        ptr: vec![0u64; program.buffers.len()],
    };
    match weights {
        WeightSource::Store(store) => upload_store(backend, program, store, lent, &mut up)?,
        WeightSource::Synthetic(synth) => upload_synthetic(backend, program, synth, lent, &mut up)?,
    }
    Ok(up)
}

/// A store's tensors, deduplicated by tensor.
fn upload_store(
    backend: &CudaBackend,
    program: &Program,
    store: &amk_core::WeightStore,
    lent: &[Option<u64>],
    up: &mut Uploaded,
) -> Result<(), CudaError> {
    let ctx = &backend.inner.ctx;
    let bound = store.bind(program)?;
    let mut by_tensor: HashMap<*const Tensor, usize> = HashMap::new();
    for (b, t) in bound.by_buffer.iter().enumerate() {
        if let Some(addr) = lent[b] {
            up.ptr[b] = addr;
            continue;
        }
        let Some(t) = t else { continue };
        let key = Arc::as_ptr(t);
        let slot = match by_tensor.get(&key) {
            Some(&i) => i,
            None => {
                up.mem
                    .push(Arc::new(DeviceMem::from_slice(ctx, &t.to_le_bytes())?));
                by_tensor.insert(key, up.mem.len() - 1);
                up.mem.len() - 1
            }
        };
        up.ptr[b] = up.mem[slot].ptr();
    }
    Ok(())
}

/// A synthetic model's tensors, generated on the device (deduplicated by tensor name), and
/// the tensors it gives as they are (a model's RoPE divisors), uploaded like a store's.
fn upload_synthetic(
    backend: &CudaBackend,
    program: &Program,
    synth: &amk_core::synth::SyntheticWeights,
    lent: &[Option<u64>],
    up: &mut Uploaded,
) -> Result<(), CudaError> {
    let ctx = &backend.inner.ctx;
    let mut by_name: HashMap<&str, (usize, &amk_core::Buffer)> = HashMap::new();
    for w in synth.plan(program)? {
        let (b, src) = (w.buffer, w.name);
        if let Some(addr) = lent[b] {
            up.ptr[b] = addr;
            continue;
        }
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
                up.mem.push(Arc::new(mem));
                by_name.insert(src, (up.mem.len() - 1, buf));
                up.mem.len() - 1
            }
        };
        up.ptr[b] = up.mem[slot].ptr();
    }
    for (b, t) in synth.exact_bindings(program)? {
        if let Some(addr) = lent[b] {
            up.ptr[b] = addr;
            continue;
        }
        up.mem
            .push(Arc::new(DeviceMem::from_slice(ctx, &t.to_le_bytes())?));
        up.ptr[b] = up.mem[up.mem.len() - 1].ptr();
    }
    Ok(())
}

/// The memory a program's buffers live in besides its weights.
pub(super) struct BufferMem {
    /// One zeroed arena for every device buffer that is not a weight.
    pub(super) arena: Arc<DeviceMem>,
    /// Buffers in `MemSpace::HOST` (none: a minimal allocation).
    pub(super) host: MappedMem,
}

/// The buffer descriptors with their device addresses: weights, the arena, host memory, and
/// the other session's KV caches where it lends them.
pub(super) fn descriptors(
    tables: &Tables,
    weight_ptr: &[u64],
    mem: &BufferMem,
    lent: &[Option<u64>],
) -> Result<Vec<crate::abi::AmkBuffer>, CudaError> {
    let mut descs = tables.buffers.clone();
    for (d, p) in descs.iter_mut().zip(&tables.placement) {
        d.ptr = match *p {
            Placement::Weight(b) => weight_ptr[b],
            Placement::Arena { offset, .. } => mem.arena.ptr() + offset,
            Placement::Host { offset, .. } => mem.host.dev_ptr() + offset,
        };
        if d.ptr == 0 {
            return Err(CudaError::Layout(
                "a weight buffer has no bound tensor".into(),
            ));
        }
    }
    // The other session's KV caches (its weights are already in weight_ptr).
    for (d, addr) in descs.iter_mut().zip(lent) {
        if let Some(a) = addr {
            d.ptr = *a;
        }
    }
    Ok(descs)
}

/// The buffer descriptors on the device: the program's, and each task's operands' copies in
/// their slots (`amk_device_program::task_bufs`).
pub(super) struct Descriptors {
    pub(super) buffers: DeviceMem,
    pub(super) per_task: DeviceMem,
}

/// Every table the kernel reads, and the words it writes, on the device.
pub(super) struct DeviceTables {
    pub(super) descs: Descriptors,
    pub(super) instructions: DeviceMem,
    /// One i32 per task: 1 once `amk_verify_tasks` passed its record.
    pub(super) verified: DeviceMem,
    pub(super) fused: (DeviceMem, DeviceMem),
    pub(super) queues: (DeviceMem, DeviceMem),
    pub(super) counters: DeviceMem,
    pub(super) status: DeviceMem,
    pub(super) patch_ids: DeviceMem,
    pub(super) patch_recs: DeviceMem,
    pub(super) abort: MappedMem,
    /// The step loop's words: `loop_stop` on the device, `abi::LOOP_WORDS` mapped.
    pub(super) loop_stop: DeviceMem,
    pub(super) loop_words: MappedMem,
}

/// What the tables are built from: the program, its tables and descriptors, and the reads a
/// decode loop carries from pass to pass.
pub(super) struct TableSource<'a> {
    pub(super) program: &'a Program,
    pub(super) tables: &'a Tables,
    pub(super) descs: &'a [crate::abi::AmkBuffer],
    pub(super) carried: &'a [(u32, u32)],
}

/// Copies every table of `s` to the device and allocates the words the kernel writes.
pub(super) fn device_tables(inner: &Inner, s: &TableSource<'_>) -> Result<DeviceTables, CudaError> {
    let ctx = &inner.ctx;
    let t = s.tables;
    let descs_mem = DeviceMem::from_slice(ctx, s.descs)?;
    let mut per_task = tables::task_buffers(&t.instructions, s.descs);
    tables::mark_carried_reads(&mut per_task, &t.instructions, s.carried);
    let task_bufs = DeviceMem::from_slice(ctx, &per_task)?;
    let n = t.instructions.len().max(1);
    Ok(DeviceTables {
        descs: Descriptors {
            buffers: descs_mem,
            per_task: task_bufs,
        },
        instructions: DeviceMem::from_slice(ctx, &t.instructions)?,
        verified: DeviceMem::zeroed(ctx, n * 4)?,
        fused: (
            DeviceMem::from_slice(ctx, &t.fused_steps)?,
            DeviceMem::from_slice(ctx, &t.fused_off)?,
        ),
        queues: (
            DeviceMem::from_slice(ctx, &t.queues.tasks)?,
            DeviceMem::from_slice(ctx, &t.queues.off)?,
        ),
        counters: DeviceMem::zeroed(ctx, s.program.counters.len().max(1) * COUNTER_STRIDE * 4)?,
        status: DeviceMem::zeroed(ctx, std::mem::size_of::<AmkStatus>())?,
        patch_ids: DeviceMem::zeroed(ctx, n * 4)?,
        patch_recs: DeviceMem::zeroed(ctx, n * std::mem::size_of::<AmkInstruction>())?,
        abort: MappedMem::new(ctx, 64)?,
        loop_stop: DeviceMem::zeroed(ctx, 64)?,
        loop_words: MappedMem::new(ctx, crate::abi::LOOP_WORDS * 4)?,
    })
}

/// The device program record: where each table is, the grid's shape and the options' flags.
pub(super) fn device_program(
    inner: &Inner,
    s: &TableSource<'_>,
    d: &DeviceTables,
    shape: &LaunchShape,
) -> AmkDeviceProgram {
    let (program, t) = (s.program, s.tables);
    let (loop_gate, loop_gate_count, loop_halt) = match program.step_loop {
        Some(l) => (
            l.gate as i32,
            (program.tasks.iter())
                .filter(|t| t.out_counter == l.gate)
                .count() as u32,
            s.descs.get(l.halt as usize).map_or(0, |d| d.ptr),
        ),
        None => (-1, 0, 0),
    };
    AmkDeviceProgram {
        buffers: d.descs.buffers.ptr(),
        instructions: d.instructions.ptr(),
        fused_steps: d.fused.0.ptr(),
        fused_off: d.fused.1.ptr(),
        queue_tasks: d.queues.0.ptr(),
        queue_off: d.queues.1.ptr(),
        counters: d.counters.ptr(),
        abort_flag: d.abort.dev_ptr(),
        status: d.status.ptr(),
        n_buffers: s.descs.len() as i32,
        n_counters: program.counters.len() as i32,
        n_instructions: t.instructions.len() as i32,
        n_queues: t.queues.len() as i32,
        smem_bytes: shape.smem as i32,
        epoch: 1,
        trace: 0,
        task_bufs: d.descs.per_task.ptr(),
        task_verified: d.verified.ptr(),
        loop_passes: 0,
        loop_gate,
        loop_gate_count,
        flags: if inner.options.l2_evict_first {
            crate::abi::PROG_L2_EVICT_FIRST
        } else {
            0
        },
        loop_halt,
        loop_stop: d.loop_stop.ptr(),
        loop_words: 0,
    }
}

/// The addresses of the buffers the session loaded beside lends `program` (its KV caches and
/// weights of the same names, dtypes and shapes).
pub(super) fn lent_addresses(program: &Program, beside: Option<&Beside>) -> Vec<Option<u64>> {
    (program.buffers.iter())
        .map(|b| beside.and_then(|x| x.lends(b)))
        .collect()
}
