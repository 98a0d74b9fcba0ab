//! FUSED recipes: `params.recipe = {"steps": [step, …]}` where each step is
//! `{"op": code, "args": [{"in": k} | {"s": j}, …], "out": j | "final" | -1, "params": {…},
//! "out_shape": [..]?, "out_dtype": "float32"|…?}`. Step `args` read task input `k` or scratch
//! slot `j`; `out` writes scratch slot `j ≥ 0`, or the task's output (`"final"` or `-1`).
//!
//! The rule below is structural (checked statically, unlike the reference, which only checked
//! at execution time): every referenced op exists and is not FUSED, arities and required
//! params hold, inputs and slots are in range, slots are written before they are read, and
//! exactly the last step writes the task output.

use amk_core::ErrorKind;
use amk_core::json::{Map, Value};
use amk_core::opcheck::Checker;
use amk_core::{Opcode, ParamType};

/// Element types a step may declare for its output.
pub const OUT_DTYPES: &[&str] = &["float32", "float16", "bfloat16", "float64", "int8", "int32"];

/// Most steps one recipe may hold.
pub const MAX_STEPS: usize = 64;

/// Checks `params.recipe` of the task in `c`, recording `fused_recipe` findings.
pub fn check(c: &mut Checker<'_, '_>) {
    let n_inputs = c.ctx.n_inputs();
    let task = c.ctx.task;
    let Some(Value::Object(recipe)) = task.params.get("recipe") else {
        return; // missing/typed-wrong params are reported before op rules run
    };
    let problems = check_recipe(recipe, n_inputs, c.ctx.registry);
    for p in problems {
        c.push(ErrorKind::FusedRecipe, p);
    }
}

/// The structural rule on a recipe object; returns one message per problem.
pub fn check_recipe(recipe: &Map, n_inputs: usize, reg: &amk_core::Registry) -> Vec<String> {
    let mut out = Vec::new();
    let Some(steps) = recipe.get("steps").and_then(Value::as_array) else {
        out.push("recipe needs a 'steps' array".into());
        return out;
    };
    if steps.is_empty() {
        out.push("recipe has no steps".into());
        return out;
    }
    if steps.len() > MAX_STEPS {
        out.push(format!(
            "recipe has {} steps; at most {MAX_STEPS} are allowed",
            steps.len()
        ));
        return out;
    }
    let mut written: Vec<i64> = Vec::new();
    let mut finals = 0usize;
    for (i, step) in steps.iter().enumerate() {
        let at = format!("recipe step {i}");
        let Some(s) = step.as_object() else {
            out.push(format!("{at} must be an object"));
            continue;
        };
        let Some(code) = s.get("op").and_then(Value::as_i64) else {
            out.push(format!("{at} needs an integer 'op' code"));
            continue;
        };
        let op = u16::try_from(code).ok().map(Opcode);
        let Some(spec) = op.and_then(|op| reg.get(op)) else {
            out.push(format!("{at} uses op code {code}, which is not registered"));
            continue;
        };
        if spec.code == Opcode::FUSED {
            out.push(format!("{at} nests FUSED, which is not allowed"));
            continue;
        }
        let args = s.get("args").and_then(Value::as_array).unwrap_or(&[]);
        if s.get("args").is_some_and(|a| a.as_array().is_none()) {
            out.push(format!("{at}: 'args' must be an array"));
        }
        let n = args.len();
        if n < spec.min_inputs as usize || spec.max_inputs.is_some_and(|m| n > m as usize) {
            out.push(format!(
                "{at} gives {} {n} argument(s); it takes {}",
                spec.name,
                spec.arity_text()
            ));
        }
        for (j, a) in args.iter().enumerate() {
            let arg = a.as_object();
            let input = arg.and_then(|m| m.get("in")).and_then(Value::as_i64);
            let slot = arg.and_then(|m| m.get("s")).and_then(Value::as_i64);
            match (arg.map_or(0, Map::len), input, slot) {
                (1, Some(k), None) => {
                    if k < 0 || k as usize >= n_inputs {
                        out.push(format!(
                            "{at} argument {j} reads task input {k}; the task has {n_inputs}"
                        ));
                    }
                }
                (1, None, Some(k)) => {
                    if !written.contains(&k) {
                        out.push(format!(
                            "{at} argument {j} reads scratch slot {k} before any step writes it"
                        ));
                    }
                }
                _ => out.push(format!(
                    "{at} argument {j} must be {{\"in\": k}} or {{\"s\": j}}"
                )),
            }
        }
        match s.get("out") {
            Some(Value::Str(f)) if f == "final" => finals += 1,
            Some(Value::Int(-1)) => finals += 1,
            Some(Value::Int(k)) if *k >= 0 => {
                if i + 1 == steps.len() {
                    out.push(format!(
                        "{at} is the last step but writes scratch slot {k}, not the task output"
                    ));
                }
                written.push(*k);
            }
            other => out.push(format!(
                "{at} 'out' must be a slot ≥ 0, \"final\" or -1, found {}",
                other.map_or("nothing".to_string(), Value::render_compact)
            )),
        }
        let params = match s.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                out.push(format!(
                    "{at} 'params' must be an object, found {}",
                    other.type_name()
                ));
                Map::new()
            }
        };
        for decl in spec.required_params() {
            if !params.contains_key(&decl.name) {
                out.push(format!(
                    "{at} lacks the param '{}' that {} requires",
                    decl.name, spec.name
                ));
            }
        }
        for (k, v) in params.iter() {
            let ok = match spec.param_type(k) {
                Some(ParamType::Int) => v.as_i64().is_some_and(|x| i32::try_from(x).is_ok()),
                Some(ParamType::Real) => v.as_f64().is_some(),
                Some(ParamType::Object) => v.as_object().is_some(),
                None => true,
            };
            if !ok {
                out.push(format!(
                    "{at} param '{k}' = {} has the wrong type",
                    v.render_compact()
                ));
            }
        }
        if let Some(d) = s.get("out_dtype")
            && !d.as_str().is_some_and(|d| OUT_DTYPES.contains(&d))
        {
            out.push(format!(
                "{at} out_dtype {} is not one of {}",
                d.render_compact(),
                OUT_DTYPES.join(", ")
            ));
        }
        if let Some(shape) = s.get("out_shape") {
            let ok = shape
                .as_array()
                .is_some_and(|a| a.iter().all(|d| d.as_i64().is_some_and(|d| d > 0)));
            if !ok {
                out.push(format!(
                    "{at} out_shape must be an array of positive integers"
                ));
            }
        }
    }
    if finals != 1 {
        out.push(format!(
            "exactly one step (the last) must write the task output; {finals} do"
        ));
    }
    out
}
