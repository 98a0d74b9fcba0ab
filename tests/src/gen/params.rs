//! Op param objects as the generators write them, including a valid FUSED recipe.

use amk_core::Opcode;
use amk_core::json::{Map, Value};

/// Builds a param object from `(key, value)` pairs.
pub fn params(kv: &[(&str, Value)]) -> Map {
    let mut m = Map::new();
    for (k, v) in kv {
        m.insert(*k, v.clone());
    }
    m
}

pub(super) fn int(v: u64) -> Value {
    Value::Int(v as i64)
}

/// A valid FUSED recipe: `gelu(in0) * 0.5`.
pub fn gelu_scale_recipe() -> Value {
    let step0 = params(&[
        ("op", Value::Int(Opcode::GELU.0 as i64)),
        (
            "args",
            Value::Array(vec![Value::Object(params(&[("in", Value::Int(0))]))]),
        ),
        ("out", Value::Int(0)),
    ]);
    let step1 = params(&[
        ("op", Value::Int(Opcode::MUL.0 as i64)),
        (
            "args",
            Value::Array(vec![Value::Object(params(&[("s", Value::Int(0))]))]),
        ),
        ("out", Value::from("final")),
        (
            "params",
            Value::Object(params(&[("scale", Value::Float(0.5))])),
        ),
    ]);
    Value::Object(params(&[(
        "steps",
        Value::Array(vec![Value::Object(step0), Value::Object(step1)]),
    )]))
}
