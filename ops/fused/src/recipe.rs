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
use amk_core::{OpSpec, Opcode, ParamType};

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
pub fn check_recipe(recipe: &Map, n_inputs: usize, reg: &dyn amk_core::SpecTable) -> Vec<String> {
    let steps = match steps_of(recipe) {
        Ok(steps) => steps,
        Err(why) => return vec![why],
    };
    let mut walk = Walk {
        out: Vec::new(),
        written: Vec::new(),
        finals: 0,
    };
    for (i, step) in steps.iter().enumerate() {
        walk.step(i, step, i + 1 == steps.len(), n_inputs, reg);
    }
    if walk.finals != 1 {
        walk.out.push(format!(
            "exactly one step (the last) must write the task output; {} do",
            walk.finals
        ));
    }
    walk.out
}

/// The recipe's steps: a non-empty array of at most [`MAX_STEPS`].
fn steps_of(recipe: &Map) -> Result<&[Value], String> {
    let Some(steps) = recipe.get("steps").and_then(Value::as_array) else {
        return Err("recipe needs a 'steps' array".into());
    };
    if steps.is_empty() {
        return Err("recipe has no steps".into());
    }
    if steps.len() > MAX_STEPS {
        return Err(format!(
            "recipe has {} steps; at most {MAX_STEPS} are allowed",
            steps.len()
        ));
    }
    Ok(steps)
}

/// What the walk over a recipe's steps has found so far: the problems, the scratch slots
/// written, the steps that write the task output.
struct Walk {
    out: Vec<String>,
    written: Vec<i64>,
    finals: usize,
}

impl Walk {
    /// Step `i` (`last`: the recipe's last), for a task of `n_inputs` inputs.
    fn step(
        &mut self,
        i: usize,
        step: &Value,
        last: bool,
        n_inputs: usize,
        reg: &dyn amk_core::SpecTable,
    ) {
        let at = format!("recipe step {i}");
        let Some(s) = step.as_object() else {
            self.out.push(format!("{at} must be an object"));
            return;
        };
        let spec = match step_spec(&at, s, reg) {
            Ok(spec) => spec,
            Err(why) => return self.out.push(why),
        };
        self.args(&at, s, spec, n_inputs);
        self.output(&at, s, last);
        self.params(&at, s, spec);
        self.layout(&at, s);
    }

    /// The step's arguments: an array within the op's arity, each a task input in range or a
    /// scratch slot an earlier step wrote.
    fn args(&mut self, at: &str, s: &Map, spec: &OpSpec, n_inputs: usize) {
        let args = s.get("args").and_then(Value::as_array).unwrap_or(&[]);
        if s.get("args").is_some_and(|a| a.as_array().is_none()) {
            self.out.push(format!("{at}: 'args' must be an array"));
        }
        let n = args.len();
        if n < spec.min_inputs as usize || spec.max_inputs.is_some_and(|m| n > m as usize) {
            self.out.push(format!(
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
                        self.out.push(format!(
                            "{at} argument {j} reads task input {k}; the task has {n_inputs}"
                        ));
                    }
                }
                (1, None, Some(k)) => {
                    if !self.written.contains(&k) {
                        self.out.push(format!(
                            "{at} argument {j} reads scratch slot {k} before any step writes it"
                        ));
                    }
                }
                _ => self.out.push(format!(
                    "{at} argument {j} must be {{\"in\": k}} or {{\"s\": j}}"
                )),
            }
        }
    }

    /// Where the step writes: a scratch slot (never the last step's), or the task output.
    fn output(&mut self, at: &str, s: &Map, last: bool) {
        match s.get("out") {
            Some(Value::Str(f)) if f == "final" => self.finals += 1,
            Some(Value::Int(-1)) => self.finals += 1,
            Some(Value::Int(k)) if *k >= 0 => {
                if last {
                    self.out.push(format!(
                        "{at} is the last step but writes scratch slot {k}, not the task output"
                    ));
                }
                self.written.push(*k);
            }
            other => self.out.push(format!(
                "{at} 'out' must be a slot ≥ 0, \"final\" or -1, found {}",
                other.map_or("nothing".to_string(), Value::render_compact)
            )),
        }
    }

    /// The step's params: an object holding the op's required params, each of its type.
    fn params(&mut self, at: &str, s: &Map, spec: &OpSpec) {
        let params = match s.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                self.out.push(format!(
                    "{at} 'params' must be an object, found {}",
                    other.type_name()
                ));
                Map::new()
            }
        };
        for decl in spec.required_params() {
            if !params.contains_key(&decl.name) {
                self.out.push(format!(
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
                self.out.push(format!(
                    "{at} param '{k}' = {} has the wrong type",
                    v.render_compact()
                ));
            }
        }
    }

    /// The step's declared output dtype and shape, where given.
    fn layout(&mut self, at: &str, s: &Map) {
        if let Some(d) = s.get("out_dtype")
            && !d.as_str().is_some_and(|d| OUT_DTYPES.contains(&d))
        {
            self.out.push(format!(
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
                self.out.push(format!(
                    "{at} out_shape must be an array of positive integers"
                ));
            }
        }
    }
}

/// The registered, non-FUSED op a step names.
fn step_spec<'r>(
    at: &str,
    s: &Map,
    reg: &'r dyn amk_core::SpecTable,
) -> Result<&'r OpSpec, String> {
    let Some(code) = s.get("op").and_then(Value::as_i64) else {
        return Err(format!("{at} needs an integer 'op' code"));
    };
    let op = u16::try_from(code).ok().map(Opcode);
    let Some(spec) = op.and_then(|op| reg.get(op)) else {
        return Err(format!("{at} uses op code {code}, which is not registered"));
    };
    if spec.code == Opcode::FUSED {
        return Err(format!("{at} nests FUSED, which is not allowed"));
    }
    Ok(spec)
}
