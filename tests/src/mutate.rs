//! Single-defect mutants: for every [`ErrorKind`] a mutation that takes a valid program and
//! introduces exactly that defect (other kinds may follow from it — a dropped wait can also
//! unorder a page — but the intended one is always present). Mutations inspect the program
//! generically (ops, kinds, waits) and check their own preconditions with the suite's own
//! happens-before ([`Hb`]); when a program offers no place for the defect they return `None`.
//!
//! [`perturb`] applies one to three random structural edits instead: its programs may be valid
//! or not, and serve to hunt for false accepts.

use crate::r#gen::{Hb, Rng, all_before, producers_of, users_of, writers_of};
use amk_core::json::{Map, Value};
use amk_core::{
    BufferId, BufferKind, DType, ErrorKind, GpuTarget, MemSpace, Opcode, Page, PageAllocation,
    Program, TaskId, Wait,
};

/// A mutated program and the error kind it must be rejected with.
#[derive(Debug, Clone)]
pub struct Mutant {
    /// The defective program.
    pub program: Program,
    /// The kind the validator must report.
    pub kind: ErrorKind,
    /// What was changed.
    pub note: String,
}

/// Most inputs / waits a task may carry on the device (docs/ir.md, "Device capacities").
const MAX_INPUTS: usize = 8;
const MAX_WAITS: usize = 8;

/// The largest input count of each op with a fixed upper bound ≤ 4 (docs/ir.md, "Opcodes and
/// params").
fn max_inputs(op: Opcode) -> Option<usize> {
    Some(match op {
        Opcode::COPY | Opcode::GELU | Opcode::SOFTMAX | Opcode::SAMPLE_ARGMAX => 1,
        Opcode::EMBED | Opcode::RMSNORM | Opcode::SILU_MUL | Opcode::ADD | Opcode::MUL => 2,
        // ROPE's third input: Llama 3's per-pair frequency factors.
        Opcode::LAYERNORM | Opcode::DEQUANT | Opcode::KV_APPEND | Opcode::ROPE => 3,
        Opcode::GEMV_TILE | Opcode::GEMM_TILE | Opcode::ATTENTION_TILE => 4,
        _ => return None,
    })
}

/// Required params whose removal does not change a write region.
fn removable_params(op: Opcode) -> &'static [&'static str] {
    match op {
        Opcode::EMBED => &["hidden"],
        Opcode::RMSNORM | Opcode::LAYERNORM => &["eps", "hidden"],
        Opcode::GEMV_TILE => &["K"],
        Opcode::GEMM_TILE => &["K"],
        Opcode::ATTENTION_TILE => &[
            "head_dim",
            "kv_start",
            "kv_len",
            "scale",
            "n_heads",
            "n_kv_heads",
        ],
        Opcode::ROPE => &["head_dim", "theta"],
        Opcode::DEQUANT => &["qdtype", "group"],
        Opcode::KV_APPEND => &["pos"],
        Opcode::ATTENTION_COMBINE => &["head_dim"],
        Opcode::FUSED => &["recipe"],
        _ => &[],
    }
}

const REGION_KEYS: &[&str] = &["n_off", "N_tile", "M_tile", "m_off"];

fn pick_task(p: &Program, rng: &mut Rng, ok: impl Fn(&amk_core::Task) -> bool) -> Option<TaskId> {
    let c: Vec<TaskId> = p.tasks.iter().filter(|t| ok(t)).map(|t| t.id).collect();
    rng.pick(&c).copied()
}

/// `(producer, consumer)` pairs where the consumer waits on the producer's counter.
fn direct_edges(p: &Program) -> Vec<(TaskId, TaskId)> {
    let prods = producers_of(p);
    let mut e = Vec::new();
    for t in &p.tasks {
        let mut seen = Vec::new();
        for w in &t.waits {
            if seen.contains(&w.counter) {
                continue;
            }
            seen.push(w.counter);
            if let Some(ps) = prods.get(w.counter as usize) {
                e.extend(ps.iter().filter(|&&q| q != t.id).map(|&q| (q, t.id)));
            }
        }
    }
    e
}

/// Moves task `from` to index `to` of the task list and renumbers ids (nothing else refers to
/// task ids: waits name counters).
pub fn move_task(p: &mut Program, from: usize, to: usize) {
    if from >= p.tasks.len() || to >= p.tasks.len() {
        return;
    }
    let t = p.tasks.remove(from);
    p.tasks.insert(to, t);
    for (i, t) in p.tasks.iter_mut().enumerate() {
        t.id = i as TaskId;
    }
}

fn ensure_target(p: &mut Program) -> i64 {
    if p.target.is_none() {
        p.target = GpuTarget::by_name("h100");
        p.meta.insert("gpu", Value::from("h100"));
    }
    p.target.as_ref().map_or(132, |t| t.num_sms)
}

fn unbind(p: &mut Program, bufs: &[BufferId]) {
    if let Some(pa) = &mut p.pages {
        pa.buffer_to_page.retain(|(b, _)| !bufs.contains(b));
    }
}

fn new_page(p: &mut Program, nbytes: u64) -> u32 {
    let pa = p.pages.get_or_insert_with(PageAllocation::default);
    let id = pa.pages.len() as u32;
    pa.pages.push(Page {
        id,
        space: MemSpace::GLOBAL_SCRATCH,
        nbytes,
        live_start: -1,
        live_end: -1,
    });
    id
}

fn fresh_like(p: &mut Program, b: BufferId, kind: BufferKind) -> BufferId {
    let (dtype, shape, name) = p.buffers.get(b as usize).map_or_else(
        || (DType::F32, vec![1], "fresh".to_string()),
        |x| (x.dtype, x.shape.clone(), format!("{}.fresh", x.name)),
    );
    p.new_buffer(name, kind, dtype, &shape)
}

fn np_of(p: &Program, c: u32) -> i64 {
    p.tasks.iter().filter(|t| t.out_counter == c).count() as i64
}

fn kind_of(p: &Program, b: BufferId) -> Option<BufferKind> {
    p.buffers.get(b as usize).map(|x| x.kind)
}

/// A broken FUSED recipe (one of several defects).
fn broken_recipe(rng: &mut Rng) -> Value {
    let arg = |k: &str, v: i64| Value::Object(crate::r#gen::params(&[(k, Value::Int(v))]));
    let step = |op: i64, args: Vec<Value>, out: Value| {
        Value::Object(crate::r#gen::params(&[
            ("op", Value::Int(op)),
            ("args", Value::Array(args)),
            ("out", out),
        ]))
    };
    let steps = match rng.below(5) {
        // reads a scratch slot nothing wrote
        0 => vec![step(10, vec![arg("s", 3)], Value::from("final"))],
        // nests FUSED
        1 => vec![step(19, vec![arg("in", 0)], Value::from("final"))],
        // reads a task input that does not exist
        2 => vec![step(10, vec![arg("in", 7)], Value::from("final"))],
        // the last step writes a scratch slot, not the output
        3 => vec![step(10, vec![arg("in", 0)], Value::Int(0))],
        // an unregistered step op
        _ => vec![step(777, vec![arg("in", 0)], Value::from("final"))],
    };
    Value::Object(crate::r#gen::params(&[("steps", Value::Array(steps))]))
}

/// Introduces a defect of `kind` into a copy of `base` (a valid program whose task list is in
/// topological order, as every generator emits). `None` if `base` has no place for it.
pub fn mutate(base: &Program, kind: ErrorKind, rng: &mut Rng) -> Option<Mutant> {
    let mut p = base.clone();
    let nb = p.buffers.len() as u32;
    let nc = p.counters.len() as u32;
    let note: String = match kind {
        ErrorKind::MissingBuffer => {
            let t = pick_task(&p, rng, |t| !t.inputs.is_empty() || !t.outputs.is_empty())?;
            let task = &mut p.tasks[t as usize];
            let bad = nb + rng.below(4) as u32;
            if !task.inputs.is_empty() && (task.outputs.is_empty() || rng.chance(50)) {
                let i = rng.index(task.inputs.len());
                task.inputs[i] = bad;
                format!("task {t} input {i} -> missing buffer #{bad}")
            } else {
                let i = rng.index(task.outputs.len());
                task.outputs[i] = bad;
                format!("task {t} output {i} -> missing buffer #{bad}")
            }
        }
        ErrorKind::MissingCounter => {
            let t = pick_task(&p, rng, |t| t.waits.len() < MAX_WAITS)?;
            let c = nc + rng.below(4) as u32;
            p.tasks[t as usize].waits.push(Wait {
                counter: c,
                threshold: 1,
            });
            format!("task {t} waits on missing counter #{c}")
        }
        ErrorKind::CapInputs => {
            let t = pick_task(&p, rng, |t| !t.inputs.is_empty())?;
            let task = &mut p.tasks[t as usize];
            let orig = task.inputs.clone();
            let mut i = 0;
            while task.inputs.len() <= MAX_INPUTS {
                task.inputs.push(orig[i % orig.len()]);
                i += 1;
            }
            format!("task {t} repeats its inputs up to {}", task.inputs.len())
        }
        ErrorKind::CapOutputs => {
            let t = pick_task(&p, rng, |t| !t.outputs.is_empty())?;
            for _ in 0..4 {
                let b = p.new_buffer("extra_out", BufferKind::ACTIVATION, DType::F32, &[1]);
                p.tasks[t as usize].outputs.push(b);
            }
            format!("task {t} gets 4 extra outputs")
        }
        ErrorKind::CapWaits => {
            let t = pick_task(&p, rng, |t| !t.waits.is_empty())?;
            let task = &mut p.tasks[t as usize];
            let orig = task.waits.clone();
            let mut i = 0;
            while task.waits.len() <= MAX_WAITS {
                task.waits.push(orig[i % orig.len()]);
                i += 1;
            }
            format!("task {t} repeats its waits up to {}", task.waits.len())
        }
        ErrorKind::CapRank => {
            let users = users_of(&p);
            let c: Vec<BufferId> = p
                .buffers
                .iter()
                .filter(|b| b.kind == BufferKind::ACTIVATION && b.rank() <= 4)
                .filter(|b| !users[b.id as usize].is_empty())
                .map(|b| b.id)
                .collect();
            let b = *rng.pick(&c)?;
            let buf = &mut p.buffers[b as usize];
            while buf.shape.len() < 5 {
                buf.shape.insert(0, 1);
            }
            format!("buffer #{b} padded to rank 5")
        }
        ErrorKind::BadThreshold => {
            let t = pick_task(&p, rng, |t| !t.waits.is_empty())?;
            let task = &mut p.tasks[t as usize];
            let i = rng.index(task.waits.len());
            let thr = -(rng.below(3) as i64);
            task.waits[i].threshold = thr;
            format!("task {t} wait {i} threshold -> {thr}")
        }
        ErrorKind::SelfWait => {
            let t = pick_task(&p, rng, |t| t.waits.len() < MAX_WAITS)?;
            let c = p.tasks[t as usize].out_counter;
            let np = np_of(&p, c);
            p.tasks[t as usize].waits.push(Wait {
                counter: c,
                threshold: np,
            });
            format!("task {t} waits on its own counter #{c} ({np})")
        }
        ErrorKind::UnregisteredOp => {
            let t = pick_task(&p, rng, |_| true)?;
            let code = 500 + rng.below(400) as u16;
            p.tasks[t as usize].op = Opcode(code);
            format!("task {t} opcode -> {code}")
        }
        ErrorKind::ArityInputs => {
            let t = pick_task(&p, rng, |t| {
                max_inputs(t.op).is_some_and(|m| t.inputs.len() <= m) && !t.inputs.is_empty()
            })?;
            let task = &mut p.tasks[t as usize];
            let m = max_inputs(task.op).unwrap_or(1);
            let first = task.inputs[0];
            while task.inputs.len() <= m {
                task.inputs.push(first);
            }
            format!("task {t} ({}) gets {} inputs", task.op, task.inputs.len())
        }
        ErrorKind::ArityOutputs => {
            let t = pick_task(&p, rng, |t| t.outputs.len() == 1)?;
            let o = p.tasks[t as usize].outputs[0];
            let b = fresh_like(&mut p, o, BufferKind::ACTIVATION);
            p.tasks[t as usize].outputs.push(b);
            format!("task {t} gets a second output #{b}")
        }
        ErrorKind::MissingParam => {
            let t = pick_task(&p, rng, |t| {
                removable_params(t.op)
                    .iter()
                    .any(|k| t.params.contains_key(k))
            })?;
            let task = &mut p.tasks[t as usize];
            let keys: Vec<&str> = removable_params(task.op)
                .iter()
                .copied()
                .filter(|k| task.params.contains_key(k))
                .collect();
            let k = *rng.pick(&keys)?;
            task.params.0.retain(|(x, _)| x != k);
            format!("task {t} loses required param {k}")
        }
        ErrorKind::ParamType => {
            let t = pick_task(&p, rng, |t| {
                t.params.iter().any(|(k, _)| !REGION_KEYS.contains(&k))
            })?;
            let task = &mut p.tasks[t as usize];
            let keys: Vec<String> = task
                .params
                .iter()
                .filter(|(k, _)| !REGION_KEYS.contains(k))
                .map(|(k, _)| k.to_string())
                .collect();
            let k = rng.pick(&keys)?.clone();
            let old = task.params.get(&k).cloned().unwrap_or(Value::Null);
            let new = match (&old, rng.below(3)) {
                (Value::Int(i), 0) => Value::Float(*i as f64 + 0.5),
                (Value::Int(_), 1) => Value::Int(1 << 40),
                (Value::Int(_), _) => Value::Bool(true),
                (Value::Float(_), 0) => Value::from("1.0"),
                (Value::Float(_), 1) => Value::Float(1e300),
                (Value::Float(_), _) => Value::Bool(false),
                (Value::Object(_), _) => Value::Int(1),
                _ => Value::Array(Vec::new()),
            };
            task.params.insert(k.clone(), new.clone());
            format!("task {t} param {k} -> {}", new.render_compact())
        }
        ErrorKind::NoProducer => {
            let t = pick_task(&p, rng, |t| t.waits.len() < MAX_WAITS)?;
            let c = p.new_counter("orphan");
            p.tasks[t as usize].waits.push(Wait {
                counter: c,
                threshold: 1,
            });
            format!("task {t} waits on producer-less counter #{c}")
        }
        ErrorKind::ThresholdExceeds => {
            let t = pick_task(&p, rng, |t| t.waits.iter().any(|w| w.counter < nc))?;
            let i = {
                let ws: Vec<usize> = p.tasks[t as usize]
                    .waits
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| w.counter < nc)
                    .map(|(i, _)| i)
                    .collect();
                *rng.pick(&ws)?
            };
            let c = p.tasks[t as usize].waits[i].counter;
            let thr = np_of(&p, c) + rng.range(1, 3) as i64;
            p.tasks[t as usize].waits[i].threshold = thr;
            format!("task {t} waits for {thr} on counter #{c}")
        }
        ErrorKind::PartialSharedWait => {
            let nps: Vec<i64> = (0..nc).map(|c| np_of(&p, c)).collect();
            let mut cands = Vec::new();
            for t in &p.tasks {
                for (i, w) in t.waits.iter().enumerate() {
                    if nps.get(w.counter as usize).is_some_and(|&n| n >= 2) {
                        cands.push((t.id, i));
                    }
                }
            }
            let &(t, i) = rng.pick(&cands)?;
            let c = p.tasks[t as usize].waits[i].counter;
            let np = nps[c as usize];
            let thr = rng.range(1, (np - 1) as u64) as i64;
            p.tasks[t as usize].waits[i].threshold = thr;
            format!("task {t} waits for {thr} of {np} on shared counter #{c}")
        }
        ErrorKind::Cycle => {
            let edges: Vec<(TaskId, TaskId)> = direct_edges(&p)
                .into_iter()
                .filter(|&(a, _)| p.tasks[a as usize].waits.len() < MAX_WAITS)
                .collect();
            let &(a, b) = rng.pick(&edges)?;
            let c = p.tasks[b as usize].out_counter;
            let np = np_of(&p, c);
            p.tasks[a as usize].waits.push(Wait {
                counter: c,
                threshold: np,
            });
            format!("task {a} (producer of {b}) now waits on {b}'s counter #{c}")
        }
        ErrorKind::NeverProduced => {
            let mut cands = Vec::new();
            for t in &p.tasks {
                for (i, &b) in t.inputs.iter().enumerate() {
                    if kind_of(&p, b) == Some(BufferKind::ACTIVATION) && !t.outputs.contains(&b) {
                        cands.push((t.id, i));
                    }
                }
            }
            let &(t, i) = rng.pick(&cands)?;
            let old = p.tasks[t as usize].inputs[i];
            let b = fresh_like(&mut p, old, BufferKind::ACTIVATION);
            p.tasks[t as usize].inputs[i] = b;
            format!("task {t} input {i} -> never-written buffer #{b}")
        }
        ErrorKind::RawRace | ErrorKind::RawRaceKv => {
            let kv = kind == ErrorKind::RawRaceKv;
            let writers = writers_of(&p);
            let mut cands = Vec::new();
            for t in &p.tasks {
                for &b in &t.inputs {
                    let k = kind_of(&p, b);
                    let fits = if kv {
                        k == Some(BufferKind::KV_CACHE)
                    } else {
                        matches!(k, Some(BufferKind::ACTIVATION | BufferKind::IO_OUTPUT))
                    };
                    if !fits {
                        continue;
                    }
                    for &w in &writers[b as usize] {
                        let c = p.tasks[w as usize].out_counter;
                        if w != t.id && t.waits.iter().any(|x| x.counter == c) {
                            cands.push((t.id, w, b, c));
                        }
                    }
                }
            }
            rng.shuffle(&mut cands);
            let mut done = None;
            for (t, w, b, c) in cands.into_iter().take(8) {
                let mut q = p.clone();
                q.tasks[t as usize].waits.retain(|x| x.counter != c);
                if Hb::full(&q).is_some_and(|hb| !hb.before(w, t)) {
                    done = Some((q, format!("task {t} no longer waits on writer {w} of #{b}")));
                    break;
                }
            }
            let (q, n) = done?;
            p = q;
            n
        }
        ErrorKind::WawRace => {
            let writers = writers_of(&p);
            let tiles: Vec<(BufferId, TaskId, TaskId)> = writers
                .iter()
                .enumerate()
                .filter(|(_, ws)| ws.len() >= 2)
                .flat_map(|(b, ws)| {
                    ws.iter()
                        .flat_map(move |&i| ws.iter().map(move |&j| (b as BufferId, i, j)))
                })
                .filter(|&(_, i, j)| i != j)
                .filter(|&(_, i, j)| {
                    let (a, c) = (&p.tasks[i as usize], &p.tasks[j as usize]);
                    // Same counter, both tiled, and the same rows (GEMM tiles may split rows).
                    a.out_counter == c.out_counter
                        && a.param_i64("n_off").is_some()
                        && c.param_i64("n_off").is_some()
                        && a.param_i64("m_off").unwrap_or(0) == c.param_i64("m_off").unwrap_or(0)
                })
                .collect();
            if let (Some(&(b, i, j)), true) = (rng.pick(&tiles), rng.chance(80)) {
                let n_i = p.tasks[i as usize].param_i64("N_tile").unwrap_or(1);
                let off_j = p.tasks[j as usize].param_i64("n_off").unwrap_or(0);
                let n_j = p.tasks[j as usize].param_i64("N_tile").unwrap_or(1);
                let end_j = off_j + n_j;
                // Overlap tile j without leaving the buffer: [end_j - n_i, end_j) or [off_j, ..).
                let new_off = (end_j - n_i).max(0).min(off_j);
                p.tasks[i as usize]
                    .params
                    .insert("n_off", Value::Int(new_off));
                format!("tile {i} of #{b} moved onto tile {j} (n_off {new_off})")
            } else {
                // A second, unordered whole-buffer writer: a copy of a non-tiled writer.
                let t = pick_task(&p, rng, |t| {
                    t.outputs.len() == 1
                        && t.param_i64("n_off").is_none()
                        && t.op != Opcode::KV_APPEND
                        && kind_of(&p, t.outputs[0]) == Some(BufferKind::ACTIVATION)
                })?;
                let mut dup = p.tasks[t as usize].clone();
                dup.out_counter = p.new_counter("dup");
                dup.label = format!("{}_dup", dup.label);
                let id = p.add_task(dup);
                format!("task {id} duplicates writer {t}")
            }
        }
        ErrorKind::OnchipCrossSm => {
            let writers = writers_of(&p);
            let users = users_of(&p);
            let cands: Vec<BufferId> = p
                .buffers
                .iter()
                .filter(|b| b.kind == BufferKind::ACTIVATION)
                .filter(|b| !writers[b.id as usize].is_empty() && users[b.id as usize].len() >= 2)
                .map(|b| b.id)
                .collect();
            let b = *rng.pick(&cands)?;
            let w = writers[b as usize][0];
            let r = *users[b as usize].iter().find(|&&u| u != w)?;
            let num = ensure_target(&mut p).max(2) as i32;
            let sw = p.tasks[w as usize].sm.unwrap_or(0);
            p.tasks[w as usize].sm = Some(sw);
            let sr = p.tasks[r as usize]
                .sm
                .filter(|&s| s != sw)
                .unwrap_or((sw + 1) % num);
            p.tasks[r as usize].sm = Some(sr);
            p.buffers[b as usize].space = MemSpace::SMEM;
            format!("buffer #{b} on SMEM, used by task {w} (SM {sw}) and task {r} (SM {sr})")
        }
        ErrorKind::SmQueueOrder => {
            let edges = direct_edges(&p);
            let &(a, b) = rng.pick(&edges)?;
            let num = ensure_target(&mut p).max(1) as i32;
            let s = p.tasks[b as usize]
                .sm
                .filter(|&s| s >= 0 && s < num)
                .unwrap_or(0);
            p.tasks[a as usize].sm = Some(s);
            p.tasks[b as usize].sm = Some(s);
            let (a, b) = (a as usize, b as usize);
            if a < b {
                move_task(&mut p, b, a);
            }
            format!("consumer {b} queued before its producer {a} on SM {s}")
        }
        ErrorKind::SmOutOfRange => {
            let num = ensure_target(&mut p);
            let t = pick_task(&p, rng, |_| true)?;
            let s = if rng.chance(70) {
                num + rng.below(8) as i64
            } else {
                -1 - rng.below(3) as i64
            };
            p.tasks[t as usize].sm = Some(s as i32);
            format!("task {t} on SM {s}")
        }
        ErrorKind::PageClobber => {
            let hb = Hb::full(&p)?;
            let writers = writers_of(&p);
            let users = users_of(&p);
            let acts: Vec<BufferId> = p
                .buffers
                .iter()
                .filter(|b| b.kind == BufferKind::ACTIVATION && !writers[b.id as usize].is_empty())
                .map(|b| b.id)
                .collect();
            let mut pairs = Vec::new();
            for (i, &a) in acts.iter().enumerate() {
                for &b in &acts[i + 1..] {
                    let ab = all_before(&hb, &users[a as usize], &writers[b as usize]);
                    let ba = all_before(&hb, &users[b as usize], &writers[a as usize]);
                    if !ab && !ba {
                        pairs.push((a, b));
                    }
                }
            }
            let &(a, b) = rng.pick(&pairs)?;
            unbind(&mut p, &[a, b]);
            let need = p.buffers[a as usize]
                .nbytes()
                .max(p.buffers[b as usize].nbytes());
            let pg = new_page(&mut p, need);
            if let Some(pa) = &mut p.pages {
                pa.buffer_to_page.push((a, pg));
                pa.buffer_to_page.push((b, pg));
            }
            format!("buffers #{a} and #{b} (live ranges not separated) share page {pg}")
        }
        ErrorKind::OutputUnproduced => {
            let b = p.new_buffer("dangling_out", BufferKind::IO_OUTPUT, DType::F32, &[1, 4]);
            format!("IO_OUTPUT #{b} never written")
        }
        ErrorKind::WriteReadonly => {
            let writers = writers_of(&p);
            let cands: Vec<BufferId> = p
                .buffers
                .iter()
                .filter(|b| b.kind == BufferKind::ACTIVATION && !writers[b.id as usize].is_empty())
                .map(|b| b.id)
                .collect();
            let b = *rng.pick(&cands)?;
            let k = *rng.pick(&[BufferKind::WEIGHT, BufferKind::CONST, BufferKind::IO_INPUT])?;
            unbind(&mut p, &[b]);
            let buf = &mut p.buffers[b as usize];
            buf.kind = k;
            if k != BufferKind::IO_INPUT {
                buf.source = Some(buf.name.clone());
            }
            format!("written buffer #{b} becomes {k}")
        }
        ErrorKind::TileOutOfBounds => tile_oob(&mut p, rng)?,
        ErrorKind::ShapeMismatch => shape_mismatch(&mut p, rng)?,
        ErrorKind::CounterInit => {
            if nc == 0 {
                return None;
            }
            let c = rng.below(nc as u64) as usize;
            let v = *rng.pick(&[-2i64, -1, 1, 2, 5])?;
            p.counters[c].init = v;
            format!("counter #{c} init -> {v}")
        }
        ErrorKind::InplaceUninitRead => {
            let writers = writers_of(&p);
            let mut cands = Vec::new();
            for t in &p.tasks {
                let [o] = t.outputs[..] else { continue };
                if kind_of(&p, o) != Some(BufferKind::ACTIVATION) || writers[o as usize] != [t.id] {
                    continue;
                }
                let oshape = &p.buffers[o as usize].shape;
                let onumel = p.buffers[o as usize].numel();
                let elementwise = matches!(
                    t.op,
                    Opcode::ADD
                        | Opcode::MUL
                        | Opcode::SILU_MUL
                        | Opcode::GELU
                        | Opcode::COPY
                        | Opcode::SOFTMAX
                        | Opcode::ALLREDUCE_SHARD
                );
                let norm = matches!(t.op, Opcode::RMSNORM | Opcode::LAYERNORM);
                for (i, &b) in t.inputs.iter().enumerate() {
                    let Some(x) = p.buffers.get(b as usize) else {
                        continue;
                    };
                    let fits = (elementwise && x.numel() == onumel)
                        || (norm && i == 0 && x.shape == *oshape);
                    if fits && b != o {
                        cands.push((t.id, i, o));
                    }
                }
            }
            let &(t, i, o) = rng.pick(&cands)?;
            p.tasks[t as usize].inputs[i] = o;
            format!("task {t} reads its own output #{o} as input {i}")
        }
        ErrorKind::FusedRecipe => {
            let fused = pick_task(&p, rng, |t| t.op == Opcode::FUSED);
            let t = match fused {
                Some(t) => t,
                None => pick_task(&p, rng, |t| {
                    matches!(t.op, Opcode::GELU | Opcode::COPY | Opcode::SOFTMAX)
                        && t.inputs.len() == 1
                        && t.outputs.len() == 1
                })?,
            };
            let task = &mut p.tasks[t as usize];
            task.op = Opcode::FUSED;
            let mut m = Map::new();
            m.insert("recipe", broken_recipe(rng));
            task.params = m;
            format!("task {t} gets a broken FUSED recipe")
        }
        ErrorKind::StepLoop => {
            // A gate that ends before the pass does: the first task's counter, which the
            // tasks after it in topological order cannot reach.
            let first = p.tasks.first()?;
            let gate = first.out_counter;
            if p.tasks.iter().all(|t| t.out_counter == gate) {
                return None;
            }
            let halt = p.new_buffer("halt", BufferKind::STATE, DType::I32, &[1]);
            p.step_loop = Some(amk_core::StepLoop { gate, halt });
            format!("step loop gated on the first task's counter #{gate}")
        }
        ErrorKind::FloatingTask => {
            // A floating task whose runner the program cannot name: one that has no wait or
            // several, or one given an SM of its own.
            if rng.chance(50)
                && let Some(t) = pick_task(&p, rng, |t| t.waits.len() != 1)
            {
                let task = &mut p.tasks[t as usize];
                task.floating = true;
                task.sm = None;
                format!("task {t} floats with {} waits", task.waits.len())
            } else {
                let t = pick_task(&p, rng, |_| true)?;
                let task = &mut p.tasks[t as usize];
                task.floating = true;
                let sm = task.sm.unwrap_or(0);
                task.sm = Some(sm);
                format!("task {t} floats but keeps SM {sm}")
            }
        }
        ErrorKind::BadConfig => {
            let c = p
                .config
                .get_or_insert_with(amk_core::ScheduleConfig::default);
            match rng.below(3) {
                0 => {
                    c.threads_per_block = 1 + 32 * rng.below(8) as i64;
                    format!("threads_per_block {}", c.threads_per_block)
                }
                1 => {
                    c.smem_bytes_per_block = -1 - rng.below(1000) as i64;
                    format!("smem_bytes_per_block {}", c.smem_bytes_per_block)
                }
                _ => {
                    c.pipelining_depth = -1 - rng.below(5) as i64;
                    format!("pipelining_depth {}", c.pipelining_depth)
                }
            }
        }
        ErrorKind::PageTable => {
            let users = users_of(&p);
            match rng.below(4) {
                0 => {
                    let b = rng.below(nb as u64) as u32;
                    let pages = p.pages.as_ref().map_or(0, |pa| pa.pages.len()) as u32;
                    let pg = pages + rng.below(3) as u32;
                    let pa = p.pages.get_or_insert_with(PageAllocation::default);
                    pa.buffer_to_page.push((b, pg));
                    format!("buffer #{b} bound to missing page {pg}")
                }
                1 => {
                    let pg = new_page(&mut p, 1 << 20);
                    let b = nb + rng.below(3) as u32;
                    if let Some(pa) = &mut p.pages {
                        pa.buffer_to_page.push((b, pg));
                    }
                    format!("missing buffer #{b} bound to page {pg}")
                }
                2 => {
                    let cands: Vec<BufferId> = p
                        .buffers
                        .iter()
                        .filter(|b| b.kind != BufferKind::ACTIVATION)
                        .map(|b| b.id)
                        .collect();
                    let b = *rng.pick(&cands)?;
                    unbind(&mut p, &[b]);
                    let need = p.buffers[b as usize].nbytes();
                    let pg = new_page(&mut p, need);
                    if let Some(pa) = &mut p.pages {
                        pa.buffer_to_page.push((b, pg));
                    }
                    format!("{} buffer #{b} paged", p.buffers[b as usize].kind)
                }
                _ => {
                    let cands: Vec<BufferId> = p
                        .buffers
                        .iter()
                        .filter(|b| b.kind == BufferKind::ACTIVATION)
                        .filter(|b| !users[b.id as usize].is_empty())
                        .map(|b| b.id)
                        .collect();
                    let b = *rng.pick(&cands)?;
                    unbind(&mut p, &[b]);
                    let need = p.buffers[b as usize].nbytes();
                    let pg = new_page(&mut p, need.saturating_sub(1 + rng.below(need)));
                    if let Some(pa) = &mut p.pages {
                        pa.buffer_to_page.push((b, pg));
                    }
                    format!("buffer #{b} on a page smaller than its {need} bytes")
                }
            }
        }
    };
    Some(Mutant {
        program: p,
        kind,
        note,
    })
}

fn tile_oob(p: &mut Program, rng: &mut Rng) -> Option<String> {
    let mut options: Vec<u8> = Vec::new();
    if p.tasks
        .iter()
        .any(|t| matches!(t.op, Opcode::GEMV_TILE | Opcode::GEMM_TILE))
    {
        options.extend([0, 1]);
    }
    if p.tasks.iter().any(|t| t.op == Opcode::KV_APPEND) {
        options.push(2);
    }
    if p.tasks.iter().any(|t| t.op == Opcode::ATTENTION_TILE) {
        options.push(3);
    }
    if p.tasks.iter().any(|t| t.op == Opcode::ROPE) {
        options.push(4);
    }
    match *rng.pick(&options)? {
        0 => {
            let t = pick_task(p, rng, |t| {
                matches!(t.op, Opcode::GEMV_TILE | Opcode::GEMM_TILE)
            })?;
            let task = &p.tasks[t as usize];
            let k = task.param_i64("K")?.max(1) as u64;
            let w = *task.inputs.get(1)?;
            let n = p.buffers.get(w as usize)?.numel() / k;
            let nt = task.param_i64("N_tile")?;
            let off = n as i64 - nt + 1 + rng.below(3) as i64;
            p.tasks[t as usize].params.insert("n_off", Value::Int(off));
            Some(format!("tile {t} n_off -> {off} (N = {n}, N_tile = {nt})"))
        }
        1 => {
            let t = pick_task(p, rng, |t| {
                matches!(t.op, Opcode::GEMV_TILE | Opcode::GEMM_TILE)
            })?;
            let key = if p.tasks[t as usize].op == Opcode::GEMM_TILE && rng.chance(50) {
                "M_tile"
            } else {
                "N_tile"
            };
            let v = -(rng.below(2) as i64);
            p.tasks[t as usize].params.insert(key, Value::Int(v));
            Some(format!("tile {t} {key} -> {v}"))
        }
        2 => {
            let t = pick_task(p, rng, |t| t.op == Opcode::KV_APPEND)?;
            let cache = *p.tasks[t as usize].inputs.get(1)?;
            let max_seq = *p.buffers.get(cache as usize)?.shape.first()?;
            let pos = max_seq + rng.below(2);
            p.tasks[t as usize]
                .params
                .insert("pos", Value::Int(pos as i64));
            Some(format!("KV_APPEND {t} pos -> {pos} (max_seq {max_seq})"))
        }
        3 => {
            let t = pick_task(p, rng, |t| t.op == Opcode::ATTENTION_TILE)?;
            let cache = *p.tasks[t as usize].inputs.get(1)?;
            let max_seq = *p.buffers.get(cache as usize)?.shape.first()? as i64;
            let start = p.tasks[t as usize].param_i64("kv_start").unwrap_or(0);
            let len = max_seq - start + 1 + rng.below(2) as i64;
            p.tasks[t as usize].params.insert("kv_len", Value::Int(len));
            Some(format!("attention {t} kv_len -> {len} (max_seq {max_seq})"))
        }
        _ => {
            let t = pick_task(p, rng, |t| t.op == Opcode::ROPE)?;
            p.tasks[t as usize]
                .params
                .insert("theta", Value::Float(-1.0));
            Some(format!("ROPE {t} theta -> -1"))
        }
    }
}

fn shape_mismatch(p: &mut Program, rng: &mut Rng) -> Option<String> {
    let t = pick_task(p, rng, |t| {
        matches!(
            t.op,
            Opcode::GEMV_TILE
                | Opcode::GEMM_TILE
                | Opcode::RMSNORM
                | Opcode::LAYERNORM
                | Opcode::ATTENTION_TILE
                | Opcode::EMBED
        )
    })?;
    let task = &mut p.tasks[t as usize];
    match task.op {
        Opcode::GEMV_TILE | Opcode::GEMM_TILE => {
            let k = task.param_i64("K")?;
            task.params.insert("K", Value::Int(k + 1));
            Some(format!("tile {t} K -> {}", k + 1))
        }
        Opcode::RMSNORM | Opcode::LAYERNORM => {
            let h = task.param_i64("hidden")?;
            task.params.insert("hidden", Value::Int(h + 1));
            Some(format!("norm {t} hidden -> {}", h + 1))
        }
        Opcode::ATTENTION_TILE => {
            let nh = task.param_i64("n_heads")?;
            let nkv = task.param_i64("n_kv_heads")?;
            task.params.insert("n_heads", Value::Int(nh + nkv));
            Some(format!("attention {t} n_heads -> {}", nh + nkv))
        }
        _ => {
            // EMBED: ids must be an integer buffer; give it a float id buffer of equal size.
            let ids = *task.inputs.first()?;
            let (shape, name) = {
                let b = p.buffers.get(ids as usize)?;
                (b.shape.clone(), format!("{}.f32", b.name))
            };
            let f = p.new_buffer(name, BufferKind::IO_INPUT, DType::F32, &shape);
            p.tasks[t as usize].inputs[0] = f;
            Some(format!("EMBED {t} ids -> float buffer #{f}"))
        }
    }
}

/// One to three random structural edits (drop or add a wait, move a threshold, move a tile,
/// give a tile row params, move a task in the list, change SMs, share a page, move a buffer on
/// chip, set a counter's init). The result may be valid or not; returns the edits made.
pub fn perturb(base: &Program, rng: &mut Rng) -> (Program, Vec<String>) {
    let mut p = base.clone();
    let mut notes = Vec::new();
    let edits = rng.range(1, 3);
    for _ in 0..edits {
        let n = p.tasks.len();
        if n == 0 {
            break;
        }
        let t = rng.index(n);
        let note = match rng.below(11) {
            0 => {
                let task = &mut p.tasks[t];
                if task.waits.is_empty() {
                    continue;
                }
                let i = rng.index(task.waits.len());
                task.waits.remove(i);
                format!("drop wait {i} of task {t}")
            }
            1 => {
                let prods = producers_of(&p);
                let cs: Vec<usize> = (0..prods.len()).filter(|&c| !prods[c].is_empty()).collect();
                let Some(&c) = rng.pick(&cs) else { continue };
                let np = prods[c].len() as i64;
                if p.tasks[t].waits.len() >= MAX_WAITS {
                    continue;
                }
                p.tasks[t].waits.push(Wait {
                    counter: c as u32,
                    threshold: np,
                });
                format!("task {t} waits on counter #{c}")
            }
            2 => {
                let task = &mut p.tasks[t];
                if task.waits.is_empty() {
                    continue;
                }
                let i = rng.index(task.waits.len());
                let d = if rng.chance(50) { 1 } else { -1 };
                task.waits[i].threshold += d;
                format!("task {t} wait {i} threshold {d:+}")
            }
            3 => {
                let writers = writers_of(&p);
                let tiles: Vec<(TaskId, TaskId)> = writers
                    .iter()
                    .filter(|ws| ws.len() >= 2)
                    .map(|ws| (ws[0], ws[ws.len() - 1]))
                    .filter(|&(a, _)| p.tasks[a as usize].param_i64("n_off").is_some())
                    .collect();
                let Some(&(a, b)) = rng.pick(&tiles) else {
                    continue;
                };
                let off = p.tasks[b as usize].param_i64("n_off").unwrap_or(0);
                p.tasks[a as usize].params.insert("n_off", Value::Int(off));
                format!("tile {a} n_off -> {off} (tile {b}'s)")
            }
            4 => {
                let to = rng.index(n);
                move_task(&mut p, t, to);
                format!("task {t} moved to list position {to}")
            }
            5 => {
                let num = ensure_target(&mut p).max(1);
                let s = rng.below(3.min(num as u64)) as i32;
                p.tasks[t].sm = Some(s);
                format!("task {t} on SM {s}")
            }
            6 => {
                let num = ensure_target(&mut p).max(1) as u64;
                let k = rng.range(1, 3.min(num));
                for task in &mut p.tasks {
                    task.sm = Some(rng.below(k) as i32);
                }
                let to = rng.index(n);
                move_task(&mut p, t, to);
                format!("all tasks on SMs 0..{k}, task {t} moved to {to}")
            }
            7 => {
                let acts: Vec<BufferId> = p
                    .buffers
                    .iter()
                    .filter(|b| b.kind == BufferKind::ACTIVATION)
                    .map(|b| b.id)
                    .collect();
                let (Some(&a), Some(&b)) = (rng.pick(&acts), rng.pick(&acts)) else {
                    continue;
                };
                if a == b {
                    continue;
                }
                unbind(&mut p, &[a, b]);
                let need = p.buffers[a as usize]
                    .nbytes()
                    .max(p.buffers[b as usize].nbytes());
                let pg = new_page(&mut p, need);
                if let Some(pa) = &mut p.pages {
                    pa.buffer_to_page.push((a, pg));
                    pa.buffer_to_page.push((b, pg));
                }
                format!("buffers #{a} and #{b} share page {pg}")
            }
            8 => {
                let acts: Vec<BufferId> = p
                    .buffers
                    .iter()
                    .filter(|b| b.kind == BufferKind::ACTIVATION)
                    .map(|b| b.id)
                    .collect();
                let Some(&b) = rng.pick(&acts) else { continue };
                p.buffers[b as usize].space = MemSpace::SMEM;
                format!("buffer #{b} on SMEM")
            }
            9 => {
                // Row params on every tile of one tiled group (GEMM honours them; GEMV has a
                // single row range, all rows, whatever its params say).
                let writers = writers_of(&p);
                let groups: Vec<&Vec<TaskId>> = writers
                    .iter()
                    .filter(|ws| {
                        ws.iter().all(|&w| {
                            matches!(
                                p.tasks[w as usize].op,
                                Opcode::GEMV_TILE | Opcode::GEMM_TILE
                            )
                        }) && !ws.is_empty()
                    })
                    .collect();
                let Some(&ws) = rng.pick(&groups) else {
                    continue;
                };
                let ws = ws.clone();
                for &w in &ws {
                    let task = &mut p.tasks[w as usize];
                    task.params.insert("m_off", Value::Int(rng.below(2) as i64));
                    task.params.insert("M_tile", Value::Int(1));
                }
                let (a, b) = (ws[0], ws[ws.len() - 1]);
                if a != b && rng.chance(50) {
                    let off = p.tasks[b as usize].param_i64("n_off").unwrap_or(0);
                    p.tasks[a as usize].params.insert("n_off", Value::Int(off));
                }
                format!("row params on tiles {ws:?}")
            }
            _ => {
                if p.counters.is_empty() {
                    continue;
                }
                let c = rng.index(p.counters.len());
                let v = if rng.chance(50) { 1 } else { -1 };
                p.counters[c].init = v;
                format!("counter #{c} init {v}")
            }
        };
        notes.push(note);
    }
    (p, notes)
}
