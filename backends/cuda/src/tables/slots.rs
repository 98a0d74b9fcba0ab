//! Per-task operand descriptor slots and the launch-constant marks on descriptors.

use crate::abi::{AmkBuffer, AmkInstruction, BUF_LAUNCH_CONST, TASK_SLOTS};

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
