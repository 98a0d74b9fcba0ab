//! Program → device tables, on the host, with no GPU: buffer descriptors (and where each
//! buffer's memory comes from), one instruction record per task, FUSED recipes expanded into
//! step records, and the per-SM queues. Built once per loaded program; the session only fills
//! in device addresses and re-packs the records a param patch touches.

use crate::abi::{
    AmkBuffer, AmkInstruction, AmkParams, AmkPrefetch, BUF_LAUNCH_CONST, L2_RANGES, MAX_EXT_PARAMS,
    PRESENT_EXT0, STEP_ZERO_OUTPUTS, TASK_SLOTS,
};
use crate::queues::{Queues, build_queues};
use amk_core::json::{Map, Value};
use amk_core::registry::param_field_index;
use amk_core::steps::{StepArg, StepOut};
use amk_core::{
    BufferKind, DType, MemSpace, OpSpec, Opcode, ParamType, Program, Registry, Task,
    abi as core_abi,
};
use std::collections::HashMap;

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

/// Sets [`BUF_LAUNCH_CONST`] on every descriptor that no task and no FUSED step writes
/// (weights, constants, inputs such as the position): whatever it holds was written before the
/// launch, so an op that waits itself may read it before its wait (QKV_ROPE_APPEND's position).
/// Ids out of range are skipped (the device's id check fails such a task).
pub fn mark_launch_constant(
    buffers: &mut [AmkBuffer],
    instructions: &[AmkInstruction],
    fused_steps: &[AmkInstruction],
) {
    let mut written = vec![false; buffers.len()];
    for r in instructions.iter().chain(fused_steps) {
        for &id in r.live_outputs() {
            if let Some(w) = usize::try_from(id).ok().and_then(|b| written.get_mut(b)) {
                *w = true;
            }
        }
    }
    for (d, w) in buffers.iter_mut().zip(written) {
        if w {
            d.flags &= !BUF_LAUNCH_CONST;
        } else {
            d.flags |= BUF_LAUNCH_CONST;
        }
    }
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

/// Packs a task's params into the device record: device fields by name (ints checked to fit
/// int32, reals rounded to f32), op-declared params outside them into `ext` in declaration
/// order, a `present` bit for each; object params (FUSED recipes) stay on the host.
pub fn pack_params(spec: &OpSpec, params: &Map) -> Result<AmkParams, String> {
    let mut p: AmkParams = bytemuck::Zeroable::zeroed();
    for (key, value) in params.iter() {
        if let Some(idx) = param_field_index(key) {
            set_field(&mut p, idx, key, value)?;
            p.present |= 1 << idx;
        }
    }
    let ext: Vec<_> = spec
        .params
        .iter()
        .filter(|d| param_field_index(&d.name).is_none() && d.ty != ParamType::Object)
        .collect();
    if ext.len() > MAX_EXT_PARAMS {
        return Err(format!(
            "op {} declares {} params outside the device fields; an instruction carries {}",
            spec.name,
            ext.len(),
            MAX_EXT_PARAMS
        ));
    }
    for (i, d) in ext.iter().enumerate() {
        if let Some(v) = params.get(&d.name) {
            p.ext[i] = match d.ty {
                ParamType::Int => int32(&d.name, v)?,
                _ => (real(&d.name, v)? as f32).to_bits() as i32,
            };
            p.present |= 1 << (PRESENT_EXT0 + i as u32);
        }
    }
    Ok(p)
}

fn int32(key: &str, v: &Value) -> Result<i32, String> {
    match v {
        Value::Int(i) => {
            i32::try_from(*i).map_err(|_| format!("param '{key}' = {i} does not fit int32"))
        }
        Value::Bool(b) => Ok(*b as i32),
        other => Err(format!(
            "param '{key}' must be an integer, found {}",
            other.type_name()
        )),
    }
}

fn real(key: &str, v: &Value) -> Result<f64, String> {
    match v {
        Value::Int(i) => Ok(*i as f64),
        Value::Float(f) => Ok(*f),
        other => Err(format!(
            "param '{key}' must be a number, found {}",
            other.type_name()
        )),
    }
}

fn set_field(p: &mut AmkParams, idx: usize, key: &str, v: &Value) -> Result<(), String> {
    let slot: &mut i32 = match idx {
        0 => &mut p.k,
        1 => &mut p.n,
        2 => &mut p.m,
        3 => &mut p.n_tile,
        4 => &mut p.m_tile,
        5 => &mut p.n_off,
        6 => &mut p.m_off,
        7 => &mut p.hidden,
        8 => &mut p.vocab,
        9 => &mut p.head_dim,
        10 => &mut p.n_heads,
        11 => &mut p.n_kv_heads,
        12 => &mut p.kv_start,
        13 => &mut p.kv_len,
        14 => &mut p.pos,
        15 => &mut p.qdtype,
        16 => &mut p.flags,
        17 => &mut p.dim,
        18 => &mut p.group,
        19 => {
            p.eps = real(key, v)? as f32;
            return Ok(());
        }
        20 => {
            p.scale = real(key, v)? as f32;
            return Ok(());
        }
        21 => {
            p.theta = real(key, v)? as f32;
            return Ok(());
        }
        _ => return Err(format!("param '{key}' has no device field")),
    };
    *slot = int32(key, v)?;
    Ok(())
}

/// Lays out the steps of a task that expands ([`amk_core::steps`], through the registry: the
/// backend knows no op's step format) as step records. Arguments resolve statically to buffer
/// ids: task input k → the task's buffer; slot j → the scratch buffer last written to slot j.
/// Every slot write gets a fresh zero-initialised scratch buffer (flag [`STEP_ZERO_OUTPUTS`]);
/// the final step writes the task output. A step op's in-place pairs become a COPY of the
/// argument into the output first, as the CPU reference starts the output as the argument.
fn expand_fused(
    t: &Task,
    ins: &[i32],
    out: i32,
    registry: &Registry,
    tb: &mut TableBuilder,
    steps_out: &mut Vec<AmkInstruction>,
) -> Result<(), String> {
    let expand = registry
        .expansion(t.op)
        .ok_or(format!("op {} registers no step expansion", t.op))?;
    let steps = expand(t, registry)?;
    let out_desc = tb.buffers[out as usize];
    let mut slots: HashMap<i64, i32> = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        let spec = registry
            .get(step.op)
            .ok_or(format!("step {i}: op {} is not registered", step.op.0))?;
        let mut rec = AmkInstruction::zeroed_record();
        rec.op = step.op.0 as i32;
        if step.args.len() > core_abi::MAX_INPUTS {
            return Err(format!("step {i} has {} arguments", step.args.len()));
        }
        rec.n_inputs = step.args.len() as i32;
        for (j, a) in step.args.iter().enumerate() {
            rec.inputs[j] = match *a {
                StepArg::Input(k) => *ins
                    .get(k)
                    .ok_or(format!("step {i} argument {j}: no task input {k}"))?,
                StepArg::Slot(k) => *slots
                    .get(&k)
                    .ok_or(format!("step {i} argument {j}: slot {k} is unwritten"))?,
            };
        }
        rec.params = pack_params(spec, &step.params).map_err(|e| format!("step {i}: {e}"))?;
        rec.n_outputs = 1;
        rec.outputs[0] = match &step.out {
            StepOut::Final => out,
            StepOut::Slot { slot, shape, dtype } => {
                let shape: Vec<u64> = match shape {
                    Some(s) => s.clone(),
                    None => (out_desc.shape[..out_desc.rank as usize].iter())
                        .map(|&d| d as u64)
                        .collect(),
                };
                let id = tb.push(*dtype, &shape, 0, None)?;
                slots.insert(*slot, id);
                rec.sm = STEP_ZERO_OUTPUTS;
                id
            }
        };
        let in_place = registry
            .reference(step.op)
            .map(|r| r.in_place.to_vec())
            .unwrap_or_default();
        for (a, o) in in_place {
            if o != 0 || a >= step.args.len() {
                continue;
            }
            let mut copy = AmkInstruction::zeroed_record();
            copy.op = Opcode::COPY.0 as i32;
            copy.n_inputs = 1;
            copy.inputs[0] = rec.inputs[a];
            copy.n_outputs = 1;
            copy.outputs[0] = rec.outputs[0];
            steps_out.push(copy);
            rec.inputs[a] = rec.outputs[0];
            rec.sm = 0;
        }
        steps_out.push(rec);
    }
    Ok(())
}

/// The label of task index `t` for error messages.
pub fn task_label(program: &Program, t: usize) -> String {
    program
        .tasks
        .get(t)
        .map_or_else(|| format!("task #{t}"), Task::display_label)
}

/// Per buffer: a model weight that no instruction of the program writes (so no counter
/// orders a read of it: a task may start reading it before its waits).
fn constant_weights(
    instructions: &[AmkInstruction],
    descs: &[AmkBuffer],
    placement: &[Placement],
) -> Vec<bool> {
    let mut constant: Vec<bool> = (0..descs.len())
        .map(|b| matches!(placement.get(b), Some(Placement::Weight(_))) && descs[b].ptr != 0)
        .collect();
    for r in instructions {
        for &o in r.outputs.iter().take(r.n_outputs.max(0) as usize) {
            if let Some(w) = usize::try_from(o).ok().and_then(|i| constant.get_mut(i)) {
                *w = false;
            }
        }
    }
    constant
}

/// Rows `[first, first + count)` of the `[rows, k]` float weight `descs[id]` as a device
/// byte range, when `id` is a constant weight of a float dtype and the rows lie inside it.
fn weight_rows(
    descs: &[AmkBuffer],
    constant: &[bool],
    id: i32,
    k: i32,
    first: u64,
    count: u64,
) -> Option<AmkPrefetch> {
    let b = usize::try_from(id)
        .ok()
        .filter(|&b| constant.get(b) == Some(&true))?;
    let w = &descs[b];
    let esize: u64 = match w.dtype {
        0 => 4,
        1 | 2 => 2,
        _ => return None,
    };
    let k = u64::try_from(k).ok().filter(|&k| k > 0)?;
    let rows = w.numel.max(0) as u64 / k;
    if count == 0 || first + count > rows {
        return None;
    }
    Some(AmkPrefetch {
        addr: w.ptr + first * k * esize,
        bytes: count * k * esize,
    })
}

/// Per instruction, the weight rows a GEMV tile streams (device address and bytes, from its
/// input 1 and its `K`, `N_tile`, `n_off`), which the scheduler starts copying into shared
/// memory before the task's wait; zero for every other task. `descs` carry device addresses.
///
/// Listed only where starting early is safe and the ring will take it: GEMV_TILE over a float
/// weight (F32/F16/BF16) bound from the model's tensors, that no instruction of the program
/// writes (so no counter orders it), with the row range inside the buffer. The device checks
/// the rest (alignment, one row of x) and waits out the copies of a tile it does not stream.
pub fn prefetch_ranges(
    instructions: &[AmkInstruction],
    descs: &[AmkBuffer],
    placement: &[Placement],
) -> Vec<AmkPrefetch> {
    let none = AmkPrefetch { addr: 0, bytes: 0 };
    let constant = constant_weights(instructions, descs, placement);
    instructions
        .iter()
        .map(|r| {
            if r.op != i32::from(Opcode::GEMV_TILE.0) || r.n_inputs < 2 {
                return none;
            }
            streamed_rows(r)
                .first()
                .and_then(|&(i, first, count)| {
                    weight_rows(descs, &constant, r.inputs[i], r.params.k, first, count)
                })
                .unwrap_or(none)
        })
        .collect()
}

/// The weight row ranges a task of a built-in projection op streams, in the order it reads
/// them: `(input, first row, rows)`. Empty for every other op (and for malformed params: the
/// device reports those when the program is loaded, in the megakernel's check mode).
fn streamed_rows(r: &AmkInstruction) -> Vec<(usize, u64, u64)> {
    let p = &r.params;
    if p.n_tile <= 0 || p.n_off < 0 {
        return Vec::new();
    }
    let (off, n) = (p.n_off as u64, p.n_tile as u64);
    let op = Opcode(r.op.clamp(0, i32::from(u16::MAX)) as u16);
    match op {
        Opcode::GEMV_TILE => vec![(1, off, n)],
        Opcode::RMSNORM_GEMV => vec![(2, off, n)],
        Opcode::GATE_UP_SILU => vec![(1, off, n), (2, off, n)],
        Opcode::QKV_ROPE_APPEND => qkv_rows(p, off, n),
        _ => Vec::new(),
    }
}

/// QKV_ROPE_APPEND's units `[off, off + n)` as weight rows (op_qkv_rope_append's numbering:
/// unit `u` is row `i + (u mod 2)·hd/2` of head `u div hd`, `i = (u mod hd) div 2`; heads are
/// Q's, then K's, then V's), merged into runs of consecutive rows of one weight.
fn qkv_rows(p: &AmkParams, off: u64, n: u64) -> Vec<(usize, u64, u64)> {
    let (hd, nh, nkv) = (p.head_dim, p.n_heads, p.n_kv_heads);
    if hd <= 0 || hd % 2 != 0 || nh <= 0 || nkv <= 0 {
        return Vec::new();
    }
    let (hd, nh, nkv) = (hd as u64, nh as u64, nkv as u64);
    let mut runs: Vec<(usize, u64, u64)> = Vec::new();
    for u in off..off + n {
        let head = u / hd;
        let row = (u % hd) / 2 + (u % 2) * (hd / 2);
        let (input, h) = if head < nh {
            (1, head)
        } else if head < nh + nkv {
            (2, head - nh)
        } else if head < nh + 2 * nkv {
            (3, head - nh - nkv)
        } else {
            break;
        };
        let row = h * hd + row;
        match runs
            .iter_mut()
            .find(|(i, f, c)| *i == input && *f + *c == row)
        {
            Some(run) => run.2 += 1,
            None => runs.push((input, row, 1)),
        }
    }
    runs
}

/// The operand descriptors of every instruction, [`TASK_SLOTS`] per task, laid out as the
/// scheduler keeps them in shared memory: input `i` in slot `i`, output `j` in slot
/// `MAX_INPUTS + j`, unused slots zero. The scheduler copies a task's instruction and this
/// record in one asynchronous round trip while the block still runs the task before (an id
/// read from the instruction would otherwise make the descriptors a second, dependent round
/// trip on the critical path: docs/perf-notes.md round 7). Ids out of range (a program the
/// validator did not see) leave their slot zero; the device's id check fails such a task
/// before any op reads a descriptor.
pub fn task_buffers(instructions: &[AmkInstruction], descs: &[AmkBuffer]) -> Vec<AmkBuffer> {
    let zero: AmkBuffer = bytemuck::Zeroable::zeroed();
    let mut out = vec![zero; instructions.len() * TASK_SLOTS];
    let desc = |id: i32| usize::try_from(id).ok().and_then(|b| descs.get(b)).copied();
    for (t, r) in instructions.iter().enumerate() {
        let slots = &mut out[t * TASK_SLOTS..(t + 1) * TASK_SLOTS];
        for (slot, &id) in slots.iter_mut().zip(r.live_inputs()) {
            *slot = desc(id).unwrap_or(zero);
        }
        for (slot, &id) in slots[r.inputs.len()..].iter_mut().zip(r.live_outputs()) {
            *slot = desc(id).unwrap_or(zero);
        }
    }
    out
}

/// Sets [`BUF_LAUNCH_CONST`] in task `t`'s descriptor slots of buffer `b` for every carried
/// read `(t, b)` the validator found (a STATE buffer read before every other writer of it in
/// the pass: its value is final when the pass starts, so the op may read it before its wait,
/// as it may an input no task writes).
pub fn mark_carried_reads(
    task_bufs: &mut [AmkBuffer],
    instructions: &[AmkInstruction],
    carried: &[(u32, u32)],
) {
    for &(t, b) in carried {
        let Some(r) = instructions.get(t as usize) else {
            continue;
        };
        for (k, &id) in r.live_inputs().iter().enumerate() {
            if id == b as i32
                && let Some(slot) = task_bufs.get_mut(t as usize * TASK_SLOTS + k)
            {
                slot.flags |= BUF_LAUNCH_CONST;
            }
        }
    }
}

/// Which tasks wait on a counter an attention task (ATTENTION_TILE, ATTENTION_COMBINE) signals:
/// in decode, the projection after each layer's attention. With the attention on an SM of its
/// own, the memory system is idle while it runs, so these tasks' weights can be pulled into L2
/// then ([`keep_ranges`]; docs/perf-notes.md round 12).
pub fn waits_on_attention(instructions: &[AmkInstruction]) -> Vec<bool> {
    let attention = [Opcode::ATTENTION_TILE, Opcode::ATTENTION_COMBINE].map(|o| i32::from(o.0));
    let signalled: std::collections::HashSet<i32> = instructions
        .iter()
        .filter(|r| attention.contains(&r.op) && r.out_counter >= 0)
        .map(|r| r.out_counter)
        .collect();
    instructions
        .iter()
        .map(|r| {
            let n = usize::try_from(r.n_waits)
                .unwrap_or(0)
                .min(r.wait_counter.len());
            r.wait_counter[..n].iter().any(|c| signalled.contains(c))
        })
        .collect()
}

/// Which tasks keep their [`l2_ranges`]: those `tasks` selects (every task, only those that
/// [`waits_on_attention`] marks, or every other one) whose op is in `ops` (empty: any op).
pub fn prefetch_keep(
    instructions: &[AmkInstruction],
    tasks: crate::L2PrefetchTasks,
    ops: &[Opcode],
) -> Vec<bool> {
    use crate::L2PrefetchTasks as T;
    let after = match tasks {
        T::All => vec![false; instructions.len()],
        T::AfterAttention | T::NotAfterAttention => waits_on_attention(instructions),
    };
    instructions
        .iter()
        .zip(after)
        .map(|(r, after)| {
            let by_attention = match tasks {
                T::All => true,
                T::AfterAttention => after,
                T::NotAfterAttention => !after,
            };
            by_attention && (ops.is_empty() || ops.iter().any(|o| i32::from(o.0) == r.op))
        })
        .collect()
}

/// Clears the [`l2_ranges`] of every task `keep` does not mark.
pub fn keep_ranges(ranges: &mut [AmkPrefetch], keep: &[bool]) {
    for (t, task) in ranges.chunks_mut(L2_RANGES).enumerate() {
        if !keep.get(t).copied().unwrap_or(false) {
            task.fill(AmkPrefetch { addr: 0, bytes: 0 });
        }
    }
}

/// Byte ranges per instruction ([`L2_RANGES`] each, unused ones zero) of the weights the task
/// streams, which the scheduler pulls into L2 (after the task's wait, or before it with
/// [`crate::abi::PROG_L2_PREFETCH_EARLY`]) so that the tile's first loads find their lines on
/// the way. Off by default: every variant measured slower on the H100 (docs/perf-notes.md
/// round 6). Each task gets at most `cap` bytes, shared among its ranges in proportion to their
/// sizes (a fused tile reads its weights side by side); `cap` 0 lists nothing. Only constant
/// float weights are listed (see [`prefetch_ranges`]); a prefetch is a hint and never faults.
pub fn l2_ranges(
    instructions: &[AmkInstruction],
    descs: &[AmkBuffer],
    placement: &[Placement],
    cap: u64,
) -> Vec<AmkPrefetch> {
    let none = AmkPrefetch { addr: 0, bytes: 0 };
    let mut out = vec![none; instructions.len() * L2_RANGES];
    if cap == 0 {
        return out;
    }
    let constant = constant_weights(instructions, descs, placement);
    for (t, r) in instructions.iter().enumerate() {
        let ranges: Vec<AmkPrefetch> = streamed_rows(r)
            .into_iter()
            .filter_map(|(i, first, count)| {
                let id = *r.inputs.get(i).filter(|_| (i as i32) < r.n_inputs)?;
                weight_rows(descs, &constant, id, r.params.k, first, count)
            })
            .take(L2_RANGES)
            .collect();
        let total: u64 = ranges.iter().map(|g| g.bytes).sum();
        for (k, g) in ranges.iter().enumerate() {
            let bytes = if total <= cap {
                g.bytes
            } else {
                (g.bytes as u128 * cap as u128 / total as u128) as u64
            };
            out[t * L2_RANGES + k] = AmkPrefetch {
                addr: g.addr,
                bytes,
            };
        }
    }
    out
}
