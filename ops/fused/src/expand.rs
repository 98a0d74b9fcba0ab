//! A FUSED task as backend-neutral steps ([`amk_core::steps`]): the recipe, once it passes the
//! structural rule ([`check_recipe`]), read into [`Step`]s. The CPU reference runs these, and
//! a device backend lays them out as its step records, without either reading the recipe.

use crate::recipe::check_recipe;
use amk_core::json::{Map, Value};
use amk_core::steps::{Step, StepArg, StepOut};
use amk_core::{DType, Opcode, Registry, SpecTable, Task};

/// The steps of a FUSED task (its `params.recipe`).
pub fn expand_task(task: &Task, reg: &Registry) -> Result<Vec<Step>, String> {
    let Some(Value::Object(recipe)) = task.params.get("recipe") else {
        return Err("params.recipe is not an object".into());
    };
    steps(recipe, task.inputs.len(), reg)
}

/// The steps of `recipe` for a task of `n_inputs` inputs: every problem the structural rule
/// finds, joined, or the steps in order.
pub fn steps(recipe: &Map, n_inputs: usize, reg: &dyn SpecTable) -> Result<Vec<Step>, String> {
    let problems = check_recipe(recipe, n_inputs, reg);
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let list = recipe.get("steps").and_then(Value::as_array).unwrap_or(&[]);
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            let s = s.as_object().ok_or("not an object");
            s.and_then(read_step)
                .map_err(|e| format!("recipe step {i}: {e}"))
        })
        .collect()
}

/// Scratch dtype for a step's `out_dtype` (absent → F32; `float64` → F32: tensors have no
/// 64-bit float type, and f32 is the precision every reference computes in).
pub fn scratch_dtype(out_dtype: Option<&str>) -> Option<DType> {
    Some(match out_dtype {
        None | Some("float32") | Some("float64") => DType::F32,
        Some("float16") => DType::F16,
        Some("bfloat16") => DType::BF16,
        Some("int8") => DType::I8,
        Some("int32") => DType::I32,
        Some(_) => return None,
    })
}

/// One step object, read (the structural rule has passed: a failure here is its bug, still
/// an error rather than a panic).
fn read_step(s: &Map) -> Result<Step, &'static str> {
    let op = s
        .get("op")
        .and_then(Value::as_i64)
        .and_then(|c| u16::try_from(c).ok())
        .map(Opcode)
        .ok_or("no usable 'op' code")?;
    let args = s.get("args").and_then(Value::as_array).unwrap_or(&[]);
    let args = args.iter().map(read_arg).collect::<Option<_>>();
    let params = match s.get("params") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    Ok(Step {
        op,
        args: args.ok_or("an argument is malformed")?,
        params,
        out: read_out(s)?,
    })
}

/// `{"in": k}` (k ≥ 0) or `{"s": k}`.
fn read_arg(a: &Value) -> Option<StepArg> {
    let m = a.as_object();
    let get = |k: &str| m.and_then(|m| m.get(k)).and_then(Value::as_i64);
    match (get("in"), get("s")) {
        (Some(k), None) => usize::try_from(k).ok().map(StepArg::Input),
        (None, Some(k)) => Some(StepArg::Slot(k)),
        _ => None,
    }
}

/// `"out": "final"` or `-1` → the task's output; `"out": k ≥ 0` → slot `k`, of `out_shape`
/// (default: the task output's) and `out_dtype` ([`scratch_dtype`]).
fn read_out(s: &Map) -> Result<StepOut, &'static str> {
    let slot = match s.get("out") {
        Some(Value::Str(f)) if f == "final" => return Ok(StepOut::Final),
        Some(Value::Int(-1)) => return Ok(StepOut::Final),
        Some(Value::Int(k)) if *k >= 0 => *k,
        _ => return Err("'out' is malformed"),
    };
    let shape = match s.get("out_shape").and_then(Value::as_array) {
        Some(dims) => Some(
            dims.iter()
                .map(|d| d.as_i64().and_then(|d| u64::try_from(d).ok()))
                .collect::<Option<Vec<u64>>>()
                .ok_or("out_shape is malformed")?,
        ),
        None => None,
    };
    let dtype = scratch_dtype(s.get("out_dtype").and_then(Value::as_str))
        .ok_or("out_dtype is malformed")?;
    Ok(StepOut::Slot { slot, shape, dtype })
}
