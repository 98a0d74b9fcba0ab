//! Random weights and inputs for a program, and running it for a few steps on a backend
//! (validated first: a program the validator rejects is a bug of the suite).

use super::outcome::{Failure, fail};
use amk_core::sim::SplitMix;
use amk_core::testkit::random_nonzero;
use amk_core::{
    Backend, BufferId, BufferKind, DType, Opcode, Outputs, Program, Registry, Session, Tensor,
    WeightStore, validate_owned,
};

/// Named IO input tensors of one step.
pub type Inputs = Vec<(String, Tensor)>;

/// Exclusive upper bound of random integer IO inputs that feed ROPE positions.
const POSITION_BOUND: i64 = 32;

/// Random values for every WEIGHT/CONST buffer of `p`, keyed by its `source` (floats in
/// `±0.5`, never 0; int8 in `[-7, 7]`; unsigned and int4 in `[1, 15]`; I4 buffers get a packed
/// U8 tensor, as the safetensors binding rule wants).
pub fn random_weights(p: &Program, seed: u64) -> WeightStore {
    let mut rng = SplitMix(seed ^ 0x5EED_3E16_A7A5_0001);
    let mut w = WeightStore::new();
    for b in &p.buffers {
        if !matches!(b.kind, BufferKind::WEIGHT | BufferKind::CONST) {
            continue;
        }
        let Some(src) = &b.source else { continue };
        if w.get(src).is_some() {
            continue;
        }
        let (lo, hi) = match b.dtype {
            DType::I8 => (-7.0, 7.0),
            DType::U8 | DType::I4 => (1.0, 15.0),
            DType::I32 => (0.0, 3.0),
            DType::BOOL => (1.0, 1.0),
            _ => (-0.5, 0.5),
        };
        let t = random_nonzero(b.dtype, &b.shape, &mut rng, lo, hi);
        let t = if b.dtype == DType::I4 {
            let mut packed = b.shape.clone();
            if let Some(k) = packed.last_mut() {
                *k = k.div_ceil(2);
            }
            match Tensor::from_le_bytes(DType::U8, &packed, &t.to_le_bytes()) {
                Ok(u) => u,
                Err(_) => continue,
            }
        } else {
            t
        };
        w.insert(src.clone(), t);
    }
    w
}

/// Exclusive upper bound of valid values of the integer IO input `b`: the fewest rows of any
/// EMBED table it indexes, 32 when it only feeds ROPE positions, 4 otherwise.
pub fn int_input_bound(p: &Program, b: BufferId) -> i64 {
    let mut bound: Option<i64> = None;
    for t in &p.tasks {
        for (i, &inp) in t.inputs.iter().enumerate() {
            if inp != b {
                continue;
            }
            let lim = if t.op == Opcode::EMBED && i == 0 {
                t.inputs
                    .get(1)
                    .and_then(|&tb| p.buffers.get(tb as usize))
                    .map(|tb| tb.shape.first().copied().unwrap_or(1) as i64)
            } else if t.op == Opcode::TOKEN_NLL && i == 1 {
                // The logits' vocabulary (input 0's last dim): the targets index it.
                t.inputs
                    .first()
                    .and_then(|&xb| p.buffers.get(xb as usize))
                    .map(|xb| xb.last_dim() as i64)
            } else if t.op == Opcode::ROPE && i == 1 {
                Some(POSITION_BOUND)
            } else if t.op == Opcode::QKV_ROPE_APPEND && i == 4 {
                // The cache rows (output 1): the position indexes them.
                t.outputs
                    .get(1)
                    .and_then(|&cb| p.buffers.get(cb as usize))
                    .map(|cb| cb.shape.first().copied().unwrap_or(1) as i64)
            } else if is_position_input(p, t, i) {
                // The rows of the cache (input 1) the position indexes, less KV_APPEND's
                // rows after the first; an attention's window clips any larger one.
                let cache = t.inputs.get(1).and_then(|&cb| p.buffers.get(cb as usize));
                let new = t.inputs.first().and_then(|&nb| p.buffers.get(nb as usize));
                cache.map(|cb| {
                    let s = &cb.shape;
                    let max_seq = if s.len() == 4 {
                        s[1]
                    } else {
                        s.first().copied().unwrap_or(1)
                    };
                    let rows = match (t.op, new) {
                        (Opcode::KV_APPEND, Some(nb)) if s.len() != 4 => {
                            nb.numel() / (cb.numel() / max_seq.max(1)).max(1)
                        }
                        _ => 1,
                    };
                    (max_seq + 1).saturating_sub(rows.max(1)) as i64
                })
            } else {
                None
            };
            if let Some(l) = lim {
                bound = Some(bound.map_or(l, |x| x.min(l)));
            }
        }
    }
    bound.unwrap_or(4).max(1)
}

/// Whether input `i` of `t` is the position of a KV_APPEND, ATTENTION_TILE or ATTENTION_GEMV
/// (the integer input after their operands).
fn is_position_input(p: &Program, t: &amk_core::Task, i: usize) -> bool {
    let integer = |k: usize| {
        t.inputs
            .get(k)
            .and_then(|&b| p.buffers.get(b as usize))
            .is_some_and(|b| b.dtype.is_integer())
    };
    match t.op {
        Opcode::KV_APPEND => i == 2,
        Opcode::ATTENTION_TILE => i == 3,
        // After W and the bias; a lone fifth input is the position when it holds integers.
        Opcode::ATTENTION_GEMV => match t.inputs.len() {
            5 => i == 4 && integer(4),
            6 => i == 5,
            _ => false,
        },
        _ => false,
    }
}

/// Random valid values for every IO_INPUT buffer of `p`: floats in `±1` (never 0), integers
/// in `[0, int_input_bound)`.
pub fn random_inputs(p: &Program, rng: &mut SplitMix) -> Inputs {
    let mut out = Vec::new();
    for b in &p.buffers {
        if b.kind != BufferKind::IO_INPUT {
            continue;
        }
        let t = if b.dtype.is_integer() {
            let hi = int_input_bound(p, b.id);
            Tensor::random(b.dtype, &b.shape, rng, 0.0, (hi - 1) as f64)
        } else {
            random_nonzero(b.dtype, &b.shape, rng, -1.0, 1.0)
        };
        out.push((b.name.clone(), t));
    }
    out
}

pub(super) fn set_input(inputs: &mut Inputs, name: &str, t: Tensor) {
    match inputs.iter_mut().find(|(n, _)| n == name) {
        Some(slot) => slot.1 = t,
        None => inputs.push((name.to_string(), t)),
    }
}

fn input<'a>(inputs: &'a Inputs, name: &str) -> Result<&'a Tensor, Failure> {
    inputs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .ok_or_else(|| fail(format!("suite bug: no input '{name}'")))
}

/// Every element as f64.
pub(super) fn vals(t: &Tensor) -> Vec<f64> {
    (0..t.numel())
        .map(|i| {
            if t.dtype().is_integer() {
                t.get_i64(i) as f64
            } else {
                t.get_f32(i) as f64
            }
        })
        .collect()
}

pub(super) fn in_vals(inputs: &Inputs, name: &str) -> Result<Vec<f64>, Failure> {
    input(inputs, name).map(vals)
}

pub(super) fn weight_vals(w: &WeightStore, name: &str) -> Result<Vec<f64>, Failure> {
    w.get(name)
        .map(|t| vals(t))
        .ok_or_else(|| fail(format!("suite bug: no weight '{name}'")))
}

/// Validates `p` (a rejection is a bug of the suite) and loads it on `backend`.
fn load(
    backend: &dyn Backend,
    reg: &Registry,
    p: &Program,
    w: &WeightStore,
) -> Result<Box<dyn Session>, Failure> {
    let vp = validate_owned(p.clone(), reg).map_err(|r| {
        fail(format!(
            "suite bug: the program is rejected: {}",
            r.report()
        ))
    })?;
    backend
        .load(&vp, w, reg)
        .map_err(|e| fail(format!("{} backend: load failed: {e}", backend.name())))
}

fn step(
    s: &mut dyn Session,
    backend: &dyn Backend,
    inputs: &Inputs,
    k: usize,
) -> Result<Outputs, Failure> {
    let refs: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    s.step(&refs)
        .map_err(|e| fail(format!("{} backend: step {k} failed: {e}", backend.name())))
}

/// Runs `steps` (one input set per forward pass) in one session of `backend`.
pub(super) fn run_steps(
    backend: &dyn Backend,
    reg: &Registry,
    p: &Program,
    w: &WeightStore,
    steps: &[Inputs],
) -> Result<Vec<Outputs>, Failure> {
    let mut s = load(backend, reg, p, w)?;
    steps
        .iter()
        .enumerate()
        .map(|(k, ins)| step(s.as_mut(), backend, ins, k))
        .collect()
}
