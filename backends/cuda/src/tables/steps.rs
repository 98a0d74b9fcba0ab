//! A FUSED task's steps as device step records (the steps from the registry's expansion).

use super::{TableBuilder, pack_params};
use crate::abi::{AmkInstruction, STEP_ZERO_OUTPUTS};
use amk_core::steps::{StepArg, StepOut};
use amk_core::{Opcode, Registry, Task, abi as core_abi};
use std::collections::HashMap;

/// Lays out the steps of a task that expands ([`amk_core::steps`], through the registry: the
/// backend knows no op's step format) as step records. Arguments resolve statically to buffer
/// ids: task input k → the task's buffer; slot j → the scratch buffer last written to slot j.
/// Every slot write gets a fresh zero-initialised scratch buffer (flag [`STEP_ZERO_OUTPUTS`]);
/// the final step writes the task output. A step op's in-place pairs become a COPY of the
/// argument into the output first, as the CPU reference starts the output as the argument.
pub(super) fn expand_fused(
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
