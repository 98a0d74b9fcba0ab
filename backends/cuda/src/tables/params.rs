//! A task's params packed into its device record: device fields by name, op-declared ones
//! outside them into `ext`.

use crate::abi::{AmkParams, MAX_EXT_PARAMS, PRESENT_EXT0};
use amk_core::json::{Map, Value};
use amk_core::spec::param_field_index;
use amk_core::{OpSpec, ParamType};

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
