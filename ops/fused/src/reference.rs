//! CPU reference of FUSED: runs `params.recipe`'s steps in order, each through the CPU
//! reference of the op it names (looked up in the call's registry).
//!
//! Before any step runs, the recipe must pass the same structural rule the validator applies
//! ([`crate::recipe::check_recipe`]); every problem it finds is reported at once as
//! [`OpError::Recipe`]. The steps are the recipe read by [`crate::expand`].
//!
//! Each step gets a synthetic task of its op carrying the step's `params` and one operand per
//! `args` entry: `{"in": k}` is the FUSED task's input `k`, `{"s": j}` the tensor most recently
//! written to scratch slot `j`. Its single output is
//! - for `"out": "final"` (or `-1`): the FUSED task's output itself (not cleared first, so an
//!   op that writes part of its output, like a GEMV tile, leaves the rest as it was);
//! - for `"out": j ≥ 0`: a fresh zero-filled tensor that then replaces slot `j` (a step may
//!   read the slot it overwrites: it reads the old tensor). Its shape is `out_shape`, or by
//!   default the task output's shape; its dtype is `out_dtype` — `float32` → F32, `float16` →
//!   F16, `bfloat16` → BF16, `int8` → I8, `int32` → I32 — and F32 when absent. Tensors have no
//!   64-bit float type, so `float64` also gives F32 (the precision every reference computes in).
//!
//! A step op that declares in-place pairs `(input a, output 0)` (KV_APPEND's cache) sees its
//! output start as a copy of argument `a` (which must then match that output's dtype and
//! shape), and receives that argument as [`Input::InPlace`].
//!
//! Failures: no registry in the call, a step op without a CPU reference, and any error a step
//! returns are all [`OpError::Recipe`], naming the step index (and the step's own error).
//! Nested FUSED is refused by the structural rule.

use crate::expand::steps;
use amk_core::json::Value;
use amk_core::steps::{Step, StepArg, StepOut};
use amk_core::{BufferId, CpuCall, Input, OpError, Task, Tensor};
use std::collections::BTreeMap;

/// The buffer id a step's synthetic task gives a scratch operand (slots have no buffer).
pub const SCRATCH_ID: BufferId = BufferId::MAX;

/// Runs one FUSED task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(1, usize::MAX, 1)?;
    let recipe = match call.task.params.get("recipe") {
        None => return Err(OpError::MissingParam("recipe".into())),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(OpError::BadParam {
                key: "recipe".into(),
                why: format!("expected an object, found {}", other.type_name()),
            });
        }
    };
    let reg = call.registry.ok_or_else(|| {
        OpError::Recipe("FUSED needs the op registry to run its steps; the call has none".into())
    })?;
    let steps = steps(recipe, call.n_inputs(), reg).map_err(OpError::Recipe)?;
    let mut scratch: BTreeMap<i64, Tensor> = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        run_step(call, reg, i, step, &mut scratch)
            .map_err(|e| OpError::Recipe(format!("recipe step {i}: {e}")))?;
    }
    Ok(())
}

/// What running a step on the CPU needs of its op: the op's name and CPU reference.
struct Ready<'r> {
    name: String,
    reference: &'r amk_core::CpuReference,
}

/// Runs step `i`; errors are wrapped with the step index by the caller.
fn run_step(
    call: &mut CpuCall<'_, '_>,
    reg: &dyn amk_core::OpTable,
    i: usize,
    step: &Step,
    scratch: &mut BTreeMap<i64, Tensor>,
) -> Result<(), String> {
    // The structural rule has passed, so the lookups below only fail on its bugs; they still
    // fail as errors, never panics.
    let name = reg
        .name_of(step.op)
        .map_or_else(|| format!("op {}", step.op.0), |n| n.into_owned());
    let reference = reg
        .reference(step.op)
        .ok_or_else(|| format!("{name} has no CPU reference"))?;
    let st = Ready { name, reference };
    let (tensors, ids) = operands(call, scratch, &step.args)?;
    let task = step_task(call, i, step, ids);
    let mut fresh: Vec<Tensor> = Vec::new();
    let outputs: &mut [Tensor] = match &step.out {
        StepOut::Slot { .. } => {
            fresh.push(scratch_output(call, &step.out)?);
            &mut fresh
        }
        StepOut::Final => call.outputs.get_mut(..1).ok_or("the task has no output")?,
    };
    let inputs = bind_in_place(&st, &tensors, outputs)?;
    st.reference
        .call(&mut CpuCall {
            task: &task,
            registry: Some(reg),
            inputs: &inputs,
            outputs,
        })
        .map_err(|e| format!("{}: {e}", st.name))?;
    if let (StepOut::Slot { slot, .. }, Some(t)) = (&step.out, fresh.pop()) {
        scratch.insert(*slot, t);
    }
    Ok(())
}

/// The step's operand tensors (task inputs or scratch slots) and the buffer ids its synthetic
/// task names them by ([`SCRATCH_ID`] for a slot).
fn operands<'a: 't, 't>(
    call: &CpuCall<'a, '_>,
    scratch: &'t BTreeMap<i64, Tensor>,
    args: &[StepArg],
) -> Result<(Vec<&'t Tensor>, Vec<BufferId>), String> {
    let mut tensors: Vec<&Tensor> = Vec::with_capacity(args.len());
    let mut ids: Vec<BufferId> = Vec::with_capacity(args.len());
    for (j, a) in args.iter().enumerate() {
        match *a {
            StepArg::Input(k) => {
                tensors.push(call.input(k).map_err(|e| format!("argument {j}: {e}"))?);
                ids.push(call.task.inputs.get(k).copied().unwrap_or(SCRATCH_ID));
            }
            StepArg::Slot(k) => {
                tensors.push(
                    scratch
                        .get(&k)
                        .ok_or_else(|| format!("argument {j}: scratch slot {k} is unwritten"))?,
                );
                ids.push(SCRATCH_ID);
            }
        }
    }
    Ok((tensors, ids))
}

/// The synthetic task step `i` runs as: the step's op and params over `ids`, writing the FUSED
/// task's output or a scratch buffer.
fn step_task(call: &CpuCall<'_, '_>, i: usize, step: &Step, ids: Vec<BufferId>) -> Task {
    let out = match step.out {
        StepOut::Slot { .. } => SCRATCH_ID,
        StepOut::Final => call.task.outputs.first().copied().unwrap_or(SCRATCH_ID),
    };
    let mut task = Task::new(call.task.id, step.op, ids, vec![out], call.task.out_counter);
    task.params = step.params.clone();
    task.label = format!("{} step {i}", call.task.display_label());
    task
}

/// A zero-filled scratch output of the slot's shape (default: the task output's shape) and
/// dtype.
fn scratch_output(call: &CpuCall<'_, '_>, out: &StepOut) -> Result<Tensor, String> {
    let StepOut::Slot { shape, dtype, .. } = out else {
        return Err("the step writes the task's output, not a slot".into());
    };
    let shape: Vec<u64> = match shape {
        Some(s) => s.clone(),
        None => call
            .outputs
            .first()
            .map(|t| t.shape().to_vec())
            .ok_or("the task has no output")?,
    };
    Ok(Tensor::zeros(*dtype, &shape))
}

/// The step's inputs, its op's in-place pairs bound: the output starts as the argument, which
/// is passed as that output.
fn bind_in_place<'t>(
    st: &Ready<'_>,
    tensors: &[&'t Tensor],
    outputs: &mut [Tensor],
) -> Result<Vec<Input<'t>>, String> {
    let mut inputs: Vec<Input<'t>> = tensors.iter().map(|t| Input::Tensor(t)).collect();
    for &(a, o) in st.reference.in_place.iter() {
        let Some(&src) = tensors.get(a) else {
            continue;
        };
        let dst = outputs.get_mut(o).ok_or_else(|| {
            format!(
                "{} writes input {a} in place as output {o}; steps have one output",
                st.name
            )
        })?;
        if src.dtype() != dst.dtype() || src.shape() != dst.shape() {
            return Err(format!(
                "{} writes argument {a} in place, but it is {} {:?} and the step's output \
                 is {} {:?}",
                st.name,
                src.dtype(),
                src.shape(),
                dst.dtype(),
                dst.shape()
            ));
        }
        *dst = src.clone();
        inputs[a] = Input::InPlace(o);
    }
    Ok(inputs)
}
