//! `#[repr(C)]` mirrors of the structs in `include/amk_abi.h`, byte for byte. Sizes and every
//! field offset are asserted at compile time; `tests/host.rs` parses the header's `@offset`
//! comments, `#define`s and enums and compares them with these, so the two cannot drift.

use bytemuck::{Pod, Zeroable};
use std::mem::{offset_of, size_of};

/// Words per counter: each counter sits on its own 128-byte line.
pub const COUNTER_STRIDE: usize = 32;
/// Op-declared params outside the device fields that one instruction carries.
pub const MAX_EXT_PARAMS: usize = 3;
/// First `present` bit of the ext slots.
pub const PRESENT_EXT0: u32 = 24;

/// Device status codes (`amk_error_t`).
pub mod status {
    /// No error.
    pub const OK: i32 = 0;
    /// The dispatcher met an opcode with no device function.
    pub const UNKNOWN_OPCODE: i32 = 1;
    /// An instruction names a buffer id out of range.
    pub const BAD_BUFFER_ID: i32 = 2;
    /// An instruction names a counter id out of range.
    pub const BAD_COUNTER_ID: i32 = 3;
    /// An index read from data is out of range.
    pub const INDEX: i32 = 4;
    /// Operand shapes do not fit the op.
    pub const SHAPE: i32 = 5;
    /// An operand dtype the op does not handle.
    pub const DTYPE: i32 = 6;
    /// A param out of range.
    pub const PARAM: i32 = 7;
    /// The abort flag was seen.
    pub const ABORTED: i32 = 8;
    /// An op registered as waiting for its counters itself returned without waiting.
    pub const NO_WAIT: i32 = 9;

    /// A status code's meaning, for error messages.
    pub fn describe(code: i32) -> &'static str {
        match code {
            UNKNOWN_OPCODE => "unknown opcode (no device function)",
            BAD_BUFFER_ID => "buffer id out of range",
            BAD_COUNTER_ID => "counter id out of range",
            INDEX => "index out of range",
            SHAPE => "operand shapes do not fit the op",
            DTYPE => "operand dtype not handled by the op",
            PARAM => "param out of range",
            ABORTED => "aborted",
            NO_WAIT => "op returned without waiting for its counters",
            _ => "unknown device error",
        }
    }
}

/// `amk_params_t`: the frozen 88 bytes plus our `present` mask and `ext` slots.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
#[allow(missing_docs)]
pub struct AmkParams {
    pub k: i32,
    pub n: i32,
    pub m: i32,
    pub n_tile: i32,
    pub m_tile: i32,
    pub n_off: i32,
    pub m_off: i32,
    pub hidden: i32,
    pub vocab: i32,
    pub head_dim: i32,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub kv_start: i32,
    pub kv_len: i32,
    pub pos: i32,
    pub qdtype: i32,
    pub group: i32,
    pub flags: i32,
    pub dim: i32,
    pub eps: f32,
    pub scale: f32,
    pub theta: f32,
    /// Bit `amk_core::spec::param_field_index(key)`: the task gave that field; bit
    /// [`PRESENT_EXT0`] + i: ext slot i holds a value.
    pub present: i32,
    /// Op-declared params outside the device fields, in declaration order.
    pub ext: [i32; MAX_EXT_PARAMS],
}

/// `amk_buffer_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[allow(missing_docs)]
pub struct AmkBuffer {
    pub ptr: u64,
    pub numel: i64,
    pub rank: i32,
    pub dtype: i32,
    pub space: i32,
    pub flags: i32,
    pub shape: [i64; 4],
    pub stride: [i64; 4],
}

/// `amk_instruction_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
#[allow(missing_docs)]
pub struct AmkInstruction {
    pub op: i32,
    pub n_inputs: i32,
    pub n_outputs: i32,
    pub n_waits: i32,
    pub inputs: [i32; 8],
    pub outputs: [i32; 4],
    pub wait_counter: [i32; 8],
    pub wait_threshold: [i32; 8],
    pub out_counter: i32,
    /// The task's SM; inside `fused_steps`, step flags (bit 0: zero the outputs first).
    pub sm: i32,
    pub params: AmkParams,
}

/// `amk_status_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[allow(missing_docs)]
pub struct AmkStatus {
    pub code: i32,
    pub task: i32,
    pub op: i32,
    pub step: i32,
    pub detail: i64,
}

/// `amk_device_program_t`, the kernel's by-value parameter (pointers as device addresses).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[allow(missing_docs)]
pub struct AmkDeviceProgram {
    pub buffers: u64,
    pub instructions: u64,
    pub fused_steps: u64,
    pub fused_off: u64,
    pub queue_tasks: u64,
    pub queue_off: u64,
    pub counters: u64,
    pub abort_flag: u64,
    pub status: u64,
    pub n_buffers: i32,
    pub n_counters: i32,
    pub n_instructions: i32,
    pub n_queues: i32,
    pub smem_bytes: i32,
    pub epoch: u32,
    /// 0, or [`TRACE_WORDS`] u64 per task (see `amk_abi.h`).
    pub trace: u64,
    /// [`TASK_SLOTS`] [`AmkBuffer`] per instruction: its operands' descriptors, in the slots
    /// the scheduler stages them in (`tables::task_buffers`).
    pub task_bufs: u64,
    /// One i32 per instruction: 1 once `amk_verify_tasks` passed it (its ids, and the checks
    /// its op runs before its wait), 0 after any write of its record (load, patch). The
    /// megakernel skips those checks for a verified task.
    pub task_verified: u64,
    /// Passes of a step loop this launch runs (0 or 1: one pass, no gate).
    pub loop_passes: u32,
    /// The step loop's gate counter.
    pub loop_gate: i32,
    /// Producers of the gate counter (its count after each pass).
    pub loop_gate_count: u32,
    /// [`PROG_L2_EVICT_FIRST`], [`PROG_VERIFY`].
    pub flags: i32,
    /// Device address of element 0 of the step loop's halt buffer (0 without a loop).
    pub loop_halt: u64,
    /// Device address of a device word: non-zero stops the loop at the next gate.
    pub loop_stop: u64,
    /// Device address of [`LOOP_WORDS`] host-mapped words ([`LOOP_CANCEL`], [`LOOP_DONE`]; 0:
    /// no loop this launch).
    pub loop_words: u64,
}

/// Words at `amk_device_program::loop_words`.
pub const LOOP_WORDS: usize = 16;
/// Loop word the host sets to ask a running loop to stop after its pass.
pub const LOOP_CANCEL: usize = 0;
/// Loop word the gate's producers set to the pass they finished.
pub const LOOP_DONE: usize = 1;

/// Descriptor slots per task in `amk_device_program::task_bufs`: `AMK_MAX_INPUTS` inputs, then
/// `AMK_MAX_OUTPUTS` outputs.
pub const TASK_SLOTS: usize = 12;

/// `amk_device_program::flags` bit: streamed weights are evicted first from L2.
pub const PROG_L2_EVICT_FIRST: i32 = 1;

/// `amk_buffer_t::flags` bit: no task of the program writes the buffer (its data is the
/// host's, from before the launch), so an op may read it before its task's wait.
pub const BUF_LAUNCH_CONST: i32 = 1;

/// `amk_device_program::flags` bit: the launch runs `amk_verify_tasks` (every task's ids and
/// pre-wait op checks, marking `task_verified`) instead of the queues.
pub const PROG_VERIFY: i32 = 4;

/// Probe words of the per-task trace (`amk_abi.h`): points an op stamps itself (`amk_probe`).
pub const TRACE_PROBES: usize = 8;

/// Words of the per-task trace (`amk_abi.h`): reached, ready, done (ns), block, prologue,
/// returned, dispatched, waiting (ns), then the [`TRACE_PROBES`] probes (ns, 0: not stamped).
pub const TRACE_WORDS: usize = 8 + TRACE_PROBES;

/// Step flag in `AmkInstruction::sm` of a FUSED step: zero the step's outputs before it runs
/// (fresh scratch slots start at zero, as in the CPU reference).
pub const STEP_ZERO_OUTPUTS: i32 = 1;

/// `(struct, field, offset)` of every mirrored field, for the header drift test.
pub fn field_offsets() -> Vec<(&'static str, &'static str, usize)> {
    macro_rules! f {
        ($v:ident, $s:literal, $t:ty, $( $c:literal => $field:ident ),+ $(,)?) => {
            $( $v.push(($s, $c, offset_of!($t, $field))); )+
        };
    }
    let mut v = Vec::new();
    f!(v, "amk_params", AmkParams,
        "K" => k, "N" => n, "M" => m, "N_tile" => n_tile, "M_tile" => m_tile, "n_off" => n_off,
        "m_off" => m_off, "hidden" => hidden, "vocab" => vocab, "head_dim" => head_dim,
        "n_heads" => n_heads, "n_kv_heads" => n_kv_heads, "kv_start" => kv_start,
        "kv_len" => kv_len, "pos" => pos, "qdtype" => qdtype, "group" => group, "flags" => flags,
        "dim" => dim, "eps" => eps, "scale" => scale, "theta" => theta, "present" => present,
        "ext" => ext);
    f!(v, "amk_buffer", AmkBuffer,
        "ptr" => ptr, "numel" => numel, "rank" => rank, "dtype" => dtype, "space" => space,
        "flags" => flags, "shape" => shape, "stride" => stride);
    f!(v, "amk_instruction", AmkInstruction,
        "op" => op, "n_inputs" => n_inputs, "n_outputs" => n_outputs, "n_waits" => n_waits,
        "inputs" => inputs, "outputs" => outputs, "wait_counter" => wait_counter,
        "wait_threshold" => wait_threshold, "out_counter" => out_counter, "sm" => sm,
        "params" => params);
    f!(v, "amk_status", AmkStatus,
        "code" => code, "task" => task, "op" => op, "step" => step, "detail" => detail);
    f!(v, "amk_device_program", AmkDeviceProgram,
        "buffers" => buffers, "instructions" => instructions, "fused_steps" => fused_steps,
        "fused_off" => fused_off, "queue_tasks" => queue_tasks, "queue_off" => queue_off,
        "counters" => counters, "abort_flag" => abort_flag, "status" => status,
        "n_buffers" => n_buffers, "n_counters" => n_counters,
        "n_instructions" => n_instructions, "n_queues" => n_queues, "smem_bytes" => smem_bytes,
        "epoch" => epoch, "trace" => trace,
        "task_bufs" => task_bufs, "task_verified" => task_verified,
        "loop_passes" => loop_passes, "loop_gate" => loop_gate,
        "loop_gate_count" => loop_gate_count, "flags" => flags, "loop_halt" => loop_halt,
        "loop_stop" => loop_stop, "loop_words" => loop_words);
    v
}

/// `(struct, size)` of every mirrored struct.
pub fn struct_sizes() -> [(&'static str, usize); 5] {
    [
        ("amk_params", size_of::<AmkParams>()),
        ("amk_buffer", size_of::<AmkBuffer>()),
        ("amk_instruction", size_of::<AmkInstruction>()),
        ("amk_status", size_of::<AmkStatus>()),
        ("amk_device_program", size_of::<AmkDeviceProgram>()),
    ]
}

// The frozen layouts of the IR's device format, and ours.
const _: () = assert!(offset_of!(AmkParams, theta) == 84);
const _: () = assert!(offset_of!(AmkParams, present) == 88);
const _: () = assert!(size_of::<AmkParams>() == 104);
const _: () = assert!(offset_of!(AmkBuffer, shape) == 32 && offset_of!(AmkBuffer, stride) == 64);
const _: () = assert!(size_of::<AmkBuffer>() == 96);
const _: () = assert!(offset_of!(AmkInstruction, out_counter) == 128);
const _: () = assert!(offset_of!(AmkInstruction, params) == 136);
const _: () = assert!(size_of::<AmkInstruction>() == 240);
const _: () = assert!(size_of::<AmkStatus>() == 24);
const _: () = assert!(size_of::<AmkDeviceProgram>() == 160);
