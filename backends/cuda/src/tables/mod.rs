//! Program → device tables, on the host, with no GPU: buffer descriptors (and where each
//! buffer's memory comes from), one instruction record per task (its params packed by
//! `params`), FUSED tasks as step records (`steps`), and the per-SM queues; the per-task
//! descriptor slots and launch-constant marks (`slots`). Built once per loaded program; the session only fills in
//! device addresses and re-packs the records a param patch touches.

use crate::abi::{AmkBuffer, AmkInstruction};
use crate::queues::{Queues, build_queues};
use amk_core::{BufferKind, DType, MemSpace, Opcode, Program, Registry, Task, abi as core_abi};
use std::collections::HashMap;

mod params;
mod slots;
mod steps;

pub use params::pack_params;
pub use slots::{mark_carried_reads, mark_launch_constant, task_buffers};
use steps::expand_fused;

/// Alignment of every arena buffer (wide vector loads need 16; 256 keeps rows of common
/// widths on separate cache-line groups).
pub const ARENA_ALIGN: u64 = 256;

/// Where a device buffer's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The bound weight tensor of program buffer `.0` (uploaded once, shared by every buffer
    /// bound to the same tensor).
    Weight(usize),
    /// `bytes` at `offset` in the zero-initialised arena (activations, KV caches, IO, FUSED
    /// scratch).
    Arena {
        /// Byte offset (a multiple of [`ARENA_ALIGN`]).
        offset: u64,
        /// Size in bytes.
        bytes: u64,
    },
    /// `bytes` at `offset` in the session's host-mapped memory (buffers in `MemSpace::HOST`:
    /// the host reads them while a launch runs).
    Host {
        /// Byte offset (a multiple of [`ARENA_ALIGN`]).
        offset: u64,
        /// Size in bytes.
        bytes: u64,
    },
}

/// Everything the device needs, minus addresses.
#[derive(Debug, Clone)]
pub struct Tables {
    /// Descriptors of program buffers (in program order), then FUSED scratch buffers;
    /// `ptr` is 0 until the session fills it in.
    pub buffers: Vec<AmkBuffer>,
    /// Where each descriptor's memory is.
    pub placement: Vec<Placement>,
    /// Arena size in bytes.
    pub arena_bytes: u64,
    /// Host-mapped memory size in bytes.
    pub host_bytes: u64,
    /// One record per task, in program order.
    pub instructions: Vec<AmkInstruction>,
    /// Expanded FUSED steps, task after task.
    pub fused_steps: Vec<AmkInstruction>,
    /// `fused_off[t]..fused_off[t + 1]`: task t's steps (empty for non-FUSED tasks).
    pub fused_off: Vec<i32>,
    /// The per-block queues.
    pub queues: Queues,
}

/// Lays out `program` for the device. `max_blocks` is how many blocks can be co-resident
/// (queues beyond it are folded onto others); `sms` is the device's SM count.
pub fn build(program: &Program, registry: &Registry, max_blocks: usize) -> Result<Tables, String> {
    let buffer_index: HashMap<u32, usize> = program
        .buffers
        .iter()
        .enumerate()
        .map(|(i, b)| (b.id, i))
        .collect();
    let counter_index: HashMap<u32, usize> = program
        .counters
        .iter()
        .enumerate()
        .map(|(i, c)| (c.id, i))
        .collect();
    let mut tb = TableBuilder {
        buffers: Vec::with_capacity(program.buffers.len()),
        placement: Vec::with_capacity(program.buffers.len()),
        arena_bytes: 0,
        host_bytes: 0,
    };
    for (i, b) in program.buffers.iter().enumerate() {
        let kind = if matches!(b.kind, BufferKind::WEIGHT | BufferKind::CONST) {
            Some(i)
        } else {
            None
        };
        tb.push(b.dtype, &b.shape, b.space.code() as i32, kind)
            .map_err(|e| format!("buffer '{}': {e}", b.name))?;
    }
    let buf = |id: u32, t: &Task| -> Result<i32, String> {
        buffer_index
            .get(&id)
            .map(|&i| i as i32)
            .ok_or_else(|| format!("task {} names buffer {id}, which does not exist", t.id))
    };
    let ctr = |id: u32, t: &Task| -> Result<i32, String> {
        counter_index
            .get(&id)
            .map(|&i| i as i32)
            .ok_or_else(|| format!("task {} names counter {id}, which does not exist", t.id))
    };

    let mut instructions = Vec::with_capacity(program.tasks.len());
    let mut fused_steps = Vec::new();
    let mut fused_off = Vec::with_capacity(program.tasks.len() + 1);
    for t in &program.tasks {
        let spec = registry
            .get(t.op)
            .ok_or_else(|| format!("task {}: op {} is not registered", t.id, t.op))?;
        let mut rec = AmkInstruction::zeroed_record();
        rec.op = t.op.0 as i32;
        let n_in = t.inputs.len().min(core_abi::MAX_INPUTS);
        if t.inputs.len() > core_abi::MAX_INPUTS && t.op != Opcode::FUSED {
            return Err(format!(
                "task {} has {} inputs; an instruction holds {}",
                t.id,
                t.inputs.len(),
                core_abi::MAX_INPUTS
            ));
        }
        rec.n_inputs = n_in as i32;
        for (k, &b) in t.inputs.iter().take(n_in).enumerate() {
            rec.inputs[k] = buf(b, t)?;
        }
        if t.outputs.len() > core_abi::MAX_OUTPUTS {
            return Err(format!("task {} has {} outputs", t.id, t.outputs.len()));
        }
        rec.n_outputs = t.outputs.len() as i32;
        for (k, &b) in t.outputs.iter().enumerate() {
            rec.outputs[k] = buf(b, t)?;
        }
        if t.waits.len() > core_abi::MAX_WAITS {
            return Err(format!("task {} has {} waits", t.id, t.waits.len()));
        }
        rec.n_waits = t.waits.len() as i32;
        for (k, w) in t.waits.iter().enumerate() {
            rec.wait_counter[k] = ctr(w.counter, t)?;
            rec.wait_threshold[k] = i32::try_from(w.threshold)
                .map_err(|_| format!("task {}: wait threshold {} overflows", t.id, w.threshold))?;
        }
        rec.out_counter = ctr(t.out_counter, t)?;
        rec.sm = t.sm.unwrap_or(-1);
        rec.params = pack_params(spec, &t.params).map_err(|e| format!("task {}: {e}", t.id))?;
        instructions.push(rec);

        fused_off.push(fused_steps.len() as i32);
        if t.op == Opcode::FUSED {
            let ins: Vec<i32> = t
                .inputs
                .iter()
                .map(|&b| buf(b, t))
                .collect::<Result<_, _>>()?;
            let out = match t.outputs.first() {
                Some(&b) => buf(b, t)?,
                None => return Err(format!("FUSED task {} has no output", t.id)),
            };
            expand_fused(t, &ins, out, registry, &mut tb, &mut fused_steps)
                .map_err(|e| format!("FUSED task {}: {e}", t.id))?;
        }
    }
    fused_off.push(fused_steps.len() as i32);
    if fused_steps.len() > i32::MAX as usize || tb.buffers.len() > i32::MAX as usize {
        return Err("too many records".into());
    }
    let queues = build_queues(program, max_blocks)?;
    mark_launch_constant(&mut tb.buffers, &instructions, &fused_steps);
    Ok(Tables {
        buffers: tb.buffers,
        placement: tb.placement,
        arena_bytes: tb.arena_bytes,
        host_bytes: tb.host_bytes,
        instructions,
        fused_steps,
        fused_off,
        queues,
    })
}

struct TableBuilder {
    buffers: Vec<AmkBuffer>,
    placement: Vec<Placement>,
    arena_bytes: u64,
    host_bytes: u64,
}

/// Places `bytes` at the next aligned offset of a region of `size` bytes (grown).
fn place(size: &mut u64, bytes: u64) -> Result<u64, String> {
    let offset = size.next_multiple_of(ARENA_ALIGN);
    *size = offset
        .checked_add(bytes.max(1))
        .ok_or_else(|| "memory size overflows".to_string())?;
    Ok(offset)
}

impl TableBuilder {
    /// Adds a descriptor; `weight = Some(b)` places it on program buffer b's bound tensor.
    fn push(
        &mut self,
        dtype: DType,
        shape: &[u64],
        space: i32,
        weight: Option<usize>,
    ) -> Result<i32, String> {
        if shape.len() > core_abi::MAX_RANK {
            return Err(format!(
                "rank {} exceeds the device's {}",
                shape.len(),
                core_abi::MAX_RANK
            ));
        }
        let mut d = AmkBuffer::zeroed_desc();
        d.rank = shape.len() as i32;
        d.dtype = dtype.code() as i32;
        d.space = space;
        let mut numel: u64 = 1;
        for (k, &s) in shape.iter().enumerate() {
            d.shape[k] = i64::try_from(s).map_err(|_| "dimension overflows int64".to_string())?;
            numel = numel
                .checked_mul(s)
                .ok_or_else(|| "element count overflows".to_string())?;
        }
        let mut stride: i64 = 1;
        for k in (0..shape.len()).rev() {
            d.stride[k] = stride;
            stride = stride.saturating_mul(d.shape[k]);
        }
        d.numel = i64::try_from(numel).map_err(|_| "element count overflows".to_string())?;
        let bytes = storage_bytes(dtype, shape);
        let placement = match weight {
            Some(b) => Placement::Weight(b),
            None if space == MemSpace::HOST.code() as i32 => Placement::Host {
                offset: place(&mut self.host_bytes, bytes)?,
                bytes,
            },
            None => Placement::Arena {
                offset: place(&mut self.arena_bytes, bytes)?,
                bytes,
            },
        };
        self.buffers.push(d);
        self.placement.push(placement);
        Ok((self.buffers.len() - 1) as i32)
    }
}

/// Bytes a buffer of `dtype` and `shape` occupies (row-packed I4: rows of ⌈K/2⌉ bytes).
pub fn storage_bytes(dtype: DType, shape: &[u64]) -> u64 {
    let numel: u64 = shape.iter().product();
    match dtype {
        DType::I4 => {
            let k = shape.last().copied().unwrap_or(1);
            numel.checked_div(k).map_or(0, |rows| rows * k.div_ceil(2))
        }
        d => numel * (d.bits() / 8),
    }
}

impl AmkInstruction {
    /// The input ids the record counts (`n_inputs`, clamped to the array: a record the
    /// validator did not see may hold any count).
    fn live_inputs(&self) -> &[i32] {
        &self.inputs[..self.n_inputs.clamp(0, self.inputs.len() as i32) as usize]
    }
    /// The output ids the record counts (`n_outputs`, clamped as [`Self::live_inputs`]).
    fn live_outputs(&self) -> &[i32] {
        &self.outputs[..self.n_outputs.clamp(0, self.outputs.len() as i32) as usize]
    }
    fn zeroed_record() -> Self {
        let mut r: AmkInstruction = bytemuck::Zeroable::zeroed();
        r.out_counter = -1;
        r.sm = -1;
        r
    }
}

impl AmkBuffer {
    fn zeroed_desc() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}

/// The label of task index `t` for error messages.
pub fn task_label(program: &Program, t: usize) -> String {
    program
        .tasks
        .get(t)
        .map_or_else(|| format!("task #{t}"), Task::display_label)
}
