//! The static validator: proves a program cannot deadlock or race before anything runs it.
//!
//! Checks run in the reference's order (per-task structure, waits vs producers, acyclicity,
//! read-after-write provenance, write-after-write, on-chip placement, per-SM queue order, page
//! aliasing, output reachability), with our stricter rules folded in where they belong. The
//! validator is total: any loaded program yields a result, never a panic, and every proof runs
//! at every size (reachability is answered in 64-task blocks, see [`crate::graph::Reach`]).

mod diag;

pub use diag::{
    Diagnostic, ErrorKind, Stats, ValidatedProgram, ValidationError, ValidationResult,
    ValidationWarning, WarningKind,
};

use crate::abi;
use crate::graph::{Ans, Incidence, Reach, find_cycle};
use crate::ir::*;
use crate::json::Value;
use crate::registry::{ParamType, Registry, TaskContext, WriteRegion};
use std::collections::HashMap;

/// At most this many findings of one kind are listed; the rest are summarised in one more.
pub const MAX_PER_KIND: usize = 1000;

/// Validates `p` against the ops in `reg`.
pub fn validate(p: &Program, reg: &Registry) -> ValidationResult {
    // Every reference is positional; the `id` fields only repeat the position. A program built
    // in memory with other ids (the loader refuses them) is checked as if they were positions.
    if !ids_are_canonical(p) {
        let mut q = p.clone();
        canonicalise_ids(&mut q);
        return validate(&q, reg);
    }
    let idx = CounterIndex::new(p);
    Validator::new(p, reg, &idx).run()
}

/// `next[t]`: the task after `t` in its SM's queue (task-list order), or `NO_NEXT`.
fn queue_successors(p: &Program) -> Vec<TaskId> {
    let mut next = vec![crate::graph::NO_NEXT; p.tasks.len()];
    // SM ids are small in practice: index a vector, fall back to a map for odd values.
    let mut dense = vec![crate::graph::NO_NEXT; 1024];
    let mut sparse: HashMap<i32, TaskId> = HashMap::new();
    for (i, t) in p.tasks.iter().enumerate() {
        if let Some(s) = t.sm {
            let slot = match usize::try_from(s) {
                Ok(k) if k < dense.len() => &mut dense[k],
                _ => sparse.entry(s).or_insert(crate::graph::NO_NEXT),
            };
            if *slot != crate::graph::NO_NEXT {
                next[*slot as usize] = i as TaskId;
            }
            *slot = i as TaskId;
        }
    }
    next
}

fn ids_are_canonical(p: &Program) -> bool {
    p.tasks.iter().enumerate().all(|(i, t)| t.id as usize == i)
        && p.buffers
            .iter()
            .enumerate()
            .all(|(i, b)| b.id as usize == i)
        && p.counters
            .iter()
            .enumerate()
            .all(|(i, c)| c.id as usize == i)
        && p.pages.as_ref().is_none_or(|pa| {
            pa.pages
                .iter()
                .enumerate()
                .all(|(i, pg)| pg.id as usize == i)
        })
}

fn canonicalise_ids(p: &mut Program) {
    for (i, t) in p.tasks.iter_mut().enumerate() {
        t.id = i as TaskId;
    }
    for (i, b) in p.buffers.iter_mut().enumerate() {
        b.id = i as BufferId;
    }
    for (i, c) in p.counters.iter_mut().enumerate() {
        c.id = i as CounterId;
    }
    if let Some(pa) = &mut p.pages {
        for (i, pg) in pa.pages.iter_mut().enumerate() {
            pg.id = i as PageId;
        }
    }
}

/// Validates and, on success, wraps the program so backends can accept it.
pub fn validate_owned(p: Program, reg: &Registry) -> Result<ValidatedProgram, ValidationResult> {
    let r = validate(&p, reg);
    if r.ok() {
        Ok(ValidatedProgram::new(p, r))
    } else {
        Err(r)
    }
}

struct Validator<'a> {
    p: &'a Program,
    reg: &'a Registry,
    idx: &'a CounterIndex,
    errors: Vec<ValidationError>,
    warnings: Vec<ValidationWarning>,
    counts: HashMap<ErrorKind, usize>,
    wcounts: HashMap<WarningKind, usize>,
}

fn tag(t: &Task) -> String {
    format!("task {} ({})", t.id, t.display_label())
}

/// A write region: `(columns, rows)` half-open ranges, rows `None` = all rows; `None` = the
/// whole buffer.
type Region = Option<((i64, i64), Option<(i64, i64)>)>;

fn region(t: &Task, kind: WriteRegion) -> Region {
    if kind == WriteRegion::Whole {
        return None;
    }
    let n_off = t.param_i64("n_off")?;
    let n_tile = t.param_i64("N_tile")?;
    if n_off < 0 || n_tile <= 0 {
        return None;
    }
    let rows = if kind == WriteRegion::ColumnsAndRows {
        match (t.param_i64("m_off"), t.param_i64("M_tile")) {
            (Some(m), Some(mt)) if m >= 0 && mt > 0 => Some((m, m.saturating_add(mt))),
            _ => None,
        }
    } else {
        None
    };
    Some(((n_off, n_off.saturating_add(n_tile)), rows))
}

fn disjoint(a: &Region, b: &Region) -> bool {
    let (Some((ca, ra)), Some((cb, rb))) = (a, b) else {
        return false;
    };
    let cols = ca.1 <= cb.0 || cb.1 <= ca.0;
    let rows = match (ra, rb) {
        (Some(x), Some(y)) => x.1 <= y.0 || y.1 <= x.0,
        _ => false,
    };
    cols || rows
}

impl<'a> Validator<'a> {
    fn new(p: &'a Program, reg: &'a Registry, idx: &'a CounterIndex) -> Self {
        Validator {
            p,
            reg,
            idx,
            errors: Vec::new(),
            warnings: Vec::new(),
            counts: HashMap::new(),
            wcounts: HashMap::new(),
        }
    }

    fn err(&mut self, d: ValidationError) {
        let n = self.counts.entry(d.kind).or_insert(0);
        *n += 1;
        if *n <= MAX_PER_KIND {
            self.errors.push(d);
        }
    }

    fn warn(&mut self, d: ValidationWarning) {
        let n = self.wcounts.entry(d.kind).or_insert(0);
        *n += 1;
        if *n <= MAX_PER_KIND {
            self.warnings.push(d);
        }
    }

    fn buf(&self, b: BufferId) -> Option<&'a Buffer> {
        self.p.buffers.get(b as usize)
    }

    fn bname(&self, b: BufferId) -> String {
        self.buf(b).map_or_else(String::new, |x| x.name.clone())
    }

    fn run(mut self) -> ValidationResult {
        for t in &self.p.tasks {
            self.check_task(t);
        }
        self.check_counters();
        self.check_waits();
        // With SMs assigned, one Kahn pass over dependency + queue-order edges usually decides
        // both acyclicity and queue safety (its order is a valid dependency order too).
        let next = self.p.sm_assigned().then(|| queue_successors(self.p));
        let (order, queue_deadlock) = match next
            .as_deref()
            .map(|n| crate::graph::topo_order_with(self.p, self.idx, Some(n)))
        {
            Some(Some(o)) => (Some(o), false),
            Some(None) => {
                let o = crate::graph::topo_order(self.p, self.idx);
                let deadlock = o.is_some();
                (o, deadlock)
            }
            None => (crate::graph::topo_order(self.p, self.idx), false),
        };
        if order.is_none() {
            let path = find_cycle(self.p, self.idx).unwrap_or_default();
            let rendered: Vec<String> = path
                .iter()
                .map(|&t| format!("{}:{}", t, self.p.tasks[t as usize].display_label()))
                .collect();
            let mut d = ValidationError::new(
                ErrorKind::Cycle,
                format!(
                    "the dependency graph has a cycle, so these tasks can never all start (structural deadlock): {}",
                    if rendered.is_empty() {
                        "<cycle not localised>".to_string()
                    } else {
                        rendered.join(" -> ")
                    }
                ),
            );
            d.task = path.first().copied();
            d.path = path;
            self.err(d);
        }
        if let Some(order) = &order {
            self.check_races(order);
        }
        self.check_onchip();
        self.check_sms(order.is_some(), queue_deadlock, next.as_deref());
        if order.is_none() {
            self.check_page_table();
        }
        self.check_outputs();
        // Summaries of truncated kinds.
        let mut over: Vec<(ErrorKind, usize)> = self
            .counts
            .iter()
            .filter(|(_, n)| **n > MAX_PER_KIND)
            .map(|(k, n)| (*k, *n))
            .collect();
        over.sort();
        for (k, n) in over {
            self.errors.push(ValidationError::new(
                k,
                format!("... and {} more {} errors not listed", n - MAX_PER_KIND, k),
            ));
        }
        let stats = Stats {
            tasks: self.p.tasks.len(),
            buffers: self.p.buffers.len(),
            counters: self.p.counters.len(),
            edges: self.p.edge_count_with(self.idx),
            acyclic: order.is_some(),
            weight_mb: (self.p.total_weight_bytes() as f64 / 1e6 * 100.0).round() / 100.0,
            sm_assigned: self.p.sm_assigned(),
            pages: self.p.pages.as_ref().map_or(0, |pa| pa.pages.len()),
        };
        ValidationResult {
            errors: self.errors,
            warnings: self.warnings,
            stats,
        }
    }

    // ---- Check 1: per-task structure ------------------------------------------------------

    fn check_task(&mut self, t: &'a Task) {
        let nb = self.p.buffers.len();
        let nc = self.p.counters.len();
        let mut refs_ok = true;
        for &b in &t.inputs {
            if b as usize >= nb {
                refs_ok = false;
                self.err(
                    ValidationError::new(
                        ErrorKind::MissingBuffer,
                        format!("{} reads buffer #{b}, which does not exist", tag(t)),
                    )
                    .task(t.id)
                    .buffer(b),
                );
            }
        }
        for &b in &t.outputs {
            if b as usize >= nb {
                refs_ok = false;
                self.err(
                    ValidationError::new(
                        ErrorKind::MissingBuffer,
                        format!("{} writes buffer #{b}, which does not exist", tag(t)),
                    )
                    .task(t.id)
                    .buffer(b),
                );
            }
        }
        if t.out_counter as usize >= nc {
            self.err(
                ValidationError::new(
                    ErrorKind::MissingCounter,
                    format!(
                        "{} signals counter #{}, which does not exist",
                        tag(t),
                        t.out_counter
                    ),
                )
                .task(t.id)
                .counter(t.out_counter),
            );
        }
        let caps = [
            (
                t.inputs.len(),
                abi::MAX_INPUTS,
                ErrorKind::CapInputs,
                "inputs",
            ),
            (
                t.outputs.len(),
                abi::MAX_OUTPUTS,
                ErrorKind::CapOutputs,
                "outputs",
            ),
            (t.waits.len(), abi::MAX_WAITS, ErrorKind::CapWaits, "waits"),
        ];
        for (n, cap, kind, what) in caps {
            if n > cap {
                self.err(
                    ValidationError::new(
                        kind,
                        format!(
                            "{} has {n} {what}; the device instruction holds at most {cap}",
                            tag(t)
                        ),
                    )
                    .task(t.id),
                );
            }
        }
        let all = || t.inputs.iter().chain(&t.outputs);
        for (i, &b) in all().enumerate() {
            if let Some(buf) = self.buf(b) {
                // Report each over-ranked buffer once per task.
                if buf.rank() > abi::MAX_RANK && !all().take(i).any(|&x| x == b) {
                    self.err(
                        ValidationError::new(
                            ErrorKind::CapRank,
                            format!(
                                "{} uses buffer #{b} ('{}') of rank {}; the device supports rank ≤ {}",
                                tag(t),
                                buf.name,
                                buf.rank(),
                                abi::MAX_RANK
                            ),
                        )
                        .task(t.id)
                        .buffer(b),
                    );
                }
            }
        }
        for w in &t.waits {
            if w.counter as usize >= nc {
                self.err(
                    ValidationError::new(
                        ErrorKind::MissingCounter,
                        format!(
                            "{} waits on counter #{}, which does not exist",
                            tag(t),
                            w.counter
                        ),
                    )
                    .task(t.id)
                    .counter(w.counter),
                );
            }
            if w.threshold < 1 {
                self.err(
                    ValidationError::new(
                        ErrorKind::BadThreshold,
                        format!(
                            "{} waits for counter #{} to reach {}; thresholds must be ≥ 1",
                            tag(t),
                            w.counter,
                            w.threshold
                        ),
                    )
                    .task(t.id)
                    .counter(w.counter),
                );
            }
        }
        for w in &t.waits {
            if w.counter == t.out_counter {
                self.err(
                    ValidationError::new(
                        ErrorKind::SelfWait,
                        format!(
                            "{} waits on counter #{}, which only it could advance (self-deadlock)",
                            tag(t),
                            w.counter
                        ),
                    )
                    .task(t.id)
                    .counter(w.counter),
                );
                break;
            }
        }
        for &b in &t.outputs {
            if let Some(buf) = self.buf(b) {
                if buf.kind.is_read_only() {
                    self.err(
                        ValidationError::new(
                            ErrorKind::WriteReadonly,
                            format!(
                                "{} writes buffer #{b} ('{}') of kind {}, which is read-only",
                                tag(t),
                                buf.name,
                                buf.kind
                            ),
                        )
                        .task(t.id)
                        .buffer(b),
                    );
                }
            }
        }
        let Some(spec) = self.reg.get(t.op) else {
            self.err(
                ValidationError::new(
                    ErrorKind::UnregisteredOp,
                    format!(
                        "{} uses opcode {} (code {}), which no registered op provides",
                        tag(t),
                        t.op,
                        t.op.0
                    ),
                )
                .task(t.id),
            );
            return;
        };
        let mut op_ok = refs_ok;
        let ni = t.inputs.len();
        if ni < spec.min_inputs as usize || spec.max_inputs.is_some_and(|m| ni > m as usize) {
            op_ok = false;
            self.err(
                ValidationError::new(
                    ErrorKind::ArityInputs,
                    format!(
                        "{} has {ni} inputs; {} takes {}",
                        tag(t),
                        spec.name,
                        spec.arity_text()
                    ),
                )
                .task(t.id),
            );
        }
        if let Some(no) = spec.n_outputs {
            if t.outputs.len() != no as usize {
                op_ok = false;
                self.err(
                    ValidationError::new(
                        ErrorKind::ArityOutputs,
                        format!(
                            "{} has {} outputs; {} writes exactly {no}",
                            tag(t),
                            t.outputs.len(),
                            spec.name
                        ),
                    )
                    .task(t.id),
                );
            }
        }
        for decl in spec.required_params() {
            if !t.params.contains_key(&decl.name) {
                op_ok = false;
                self.err(
                    ValidationError::new(
                        ErrorKind::MissingParam,
                        format!(
                            "{} lacks the param '{}' that {} requires",
                            tag(t),
                            decl.name,
                            spec.name
                        ),
                    )
                    .task(t.id),
                );
            }
        }
        for (k, v) in t.params.iter() {
            match spec.param_type(k) {
                None => self.warn(
                    ValidationWarning::new(
                        WarningKind::UnknownParam,
                        format!(
                            "{} has param '{k}', which is not a device param field and not declared by {}; it will not reach the device",
                            tag(t),
                            spec.name
                        ),
                    )
                    .task(t.id),
                ),
                Some(ty) => {
                    let good = match ty {
                        ParamType::Int => v
                            .as_i64()
                            .is_some_and(|i| i >= i32::MIN as i64 && i <= i32::MAX as i64),
                        ParamType::Real => v.as_f64().is_some_and(|f| f.abs() <= f32::MAX as f64),
                        ParamType::Object => matches!(v, Value::Object(_)),
                    };
                    if !good {
                        op_ok = false;
                        let want = match ty {
                            ParamType::Int => "an integer within int32",
                            ParamType::Real => "a number within float32 range",
                            ParamType::Object => "an object",
                        };
                        self.err(
                            ValidationError::new(
                                ErrorKind::ParamType,
                                format!(
                                    "{} param '{k}' = {} must be {want}",
                                    tag(t),
                                    v.render_compact()
                                ),
                            )
                            .task(t.id),
                        );
                    }
                }
            }
        }
        // Zero-sized dims never load from JSON, but a program built in memory may have them;
        // op rules divide by dims, so refuse them here.
        for &b in t.inputs.iter().chain(&t.outputs) {
            if let Some(buf) = self.buf(b) {
                if buf.shape.contains(&0) {
                    op_ok = false;
                    self.err(
                        ValidationError::new(
                            ErrorKind::ShapeMismatch,
                            format!(
                                "{} uses buffer #{b} ('{}') with a zero-sized dim {:?}",
                                tag(t),
                                buf.name,
                                buf.shape
                            ),
                        )
                        .task(t.id)
                        .buffer(b),
                    );
                }
            }
        }
        if op_ok {
            if let Some(check) = spec.check {
                let ctx = TaskContext {
                    task: t,
                    buffers: &self.p.buffers,
                    registry: self.reg,
                };
                for f in check(&ctx) {
                    self.err(
                        ValidationError::new(f.kind, format!("{}: {}", tag(t), f.message))
                            .task(t.id),
                    );
                }
            }
        }
    }

    fn check_counters(&mut self) {
        for c in &self.p.counters {
            if c.init != 0 {
                self.err(
                    ValidationError::new(
                        ErrorKind::CounterInit,
                        format!(
                            "counter #{} starts at {}; counters are zeroed at every launch, so init must be 0",
                            c.id, c.init
                        ),
                    )
                    .counter(c.id),
                );
            }
        }
    }

    // ---- Checks 2/3: waits vs producers ---------------------------------------------------

    fn check_waits(&mut self) {
        for t in &self.p.tasks {
            for w in &t.waits {
                if w.counter as usize >= self.p.counters.len() {
                    continue;
                }
                let np = self.idx.n_producers(w.counter) as i64;
                if np == 0 {
                    self.err(
                        ValidationError::new(
                            ErrorKind::NoProducer,
                            format!(
                                "{} waits on counter #{}, which no task signals (deadlock)",
                                tag(t),
                                w.counter
                            ),
                        )
                        .task(t.id)
                        .counter(w.counter),
                    );
                } else if w.threshold < 1 {
                    // Already reported as bad_threshold.
                } else if w.threshold > np {
                    self.err(
                        ValidationError::new(
                            ErrorKind::ThresholdExceeds,
                            format!(
                                "{} waits for counter #{} to reach {}, but only {np} task(s) signal it (deadlock)",
                                tag(t),
                                w.counter,
                                w.threshold
                            ),
                        )
                        .task(t.id)
                        .counter(w.counter),
                    );
                } else if np > 1 && w.threshold != np {
                    self.err(
                        ValidationError::new(
                            ErrorKind::PartialSharedWait,
                            format!(
                                "{} waits for {} of the {np} signals on shared counter #{}; a count cannot tell which producers finished, so a shared counter must be waited on in full ({np})",
                                tag(t),
                                w.threshold,
                                w.counter
                            ),
                        )
                        .task(t.id)
                        .counter(w.counter),
                    );
                }
            }
        }
    }

    // ---- Checks 5, 5a, 7: provenance, write-after-write, pages ------------------------------

    fn check_races(&mut self, order: &[TaskId]) {
        let p = self.p;
        let writers = Incidence::writers(p);
        let readers = Incidence::readers(p);
        let mut reach = Reach::new(p, self.idx, order);

        // Phase 1: ask every question the three checks need.
        // Check 5: (reader, buffer, every other writer happens-before the reader?).
        let mut reads: Vec<(TaskId, BufferId, Ans)> = Vec::new();
        let mut others: Vec<TaskId> = Vec::new();
        for &t in order {
            let task = &p.tasks[t as usize];
            for (i, &b) in task.inputs.iter().enumerate() {
                if task.inputs[..i].contains(&b) {
                    continue;
                }
                let Some(buf) = self.buf(b) else { continue };
                if buf.kind.is_read_only() {
                    continue;
                }
                others.clear();
                others.extend(writers[b as usize].iter().copied().filter(|&w| w != t));
                let a = reach.ask_all(&others, &[t]);
                reads.push((t, b, a));
            }
        }
        // Check 5a: writers sorted by topological position must form a chain.
        let tiled = |t: &Task| {
            self.reg
                .get(t.op)
                .map_or(WriteRegion::Whole, |s| s.write_region)
        };
        // Buffers whose writers share one counter and write pairwise-disjoint tiles pass at
        // once; the others need their writers totally ordered.
        let mut multi: Vec<(BufferId, bool, Vec<Ans>)> = Vec::new();
        let mut chain: Vec<TaskId> = Vec::new();
        let mut regions: Vec<Region> = Vec::new();
        for b in 0..writers.len() {
            let ws = &writers[b];
            if ws.len() < 2 || p.buffers[b].kind.is_read_only() {
                continue;
            }
            let c0 = p.tasks[ws[0] as usize].out_counter;
            let same_counter = ws.iter().all(|&w| p.tasks[w as usize].out_counter == c0);
            if same_counter {
                regions.clear();
                regions.extend(
                    ws.iter()
                        .map(|&w| region(&p.tasks[w as usize], tiled(&p.tasks[w as usize]))),
                );
                if all_disjoint(&regions) {
                    continue;
                }
            }
            chain.clear();
            chain.extend_from_slice(ws);
            chain.sort_by_key(|&w| (reach.position(w), w));
            let links = chain.windows(2).map(|pr| reach.ask(pr[0], pr[1])).collect();
            multi.push((b as BufferId, same_counter, links));
        }
        // Check 7: per page, writer-bearing buffers sorted by their first writer must form a
        // chain of "every use of one happens-before every write of the next".
        let page_chains = self.page_chains(&writers, &reach);
        let mut page_links: Vec<Vec<Ans>> = Vec::new();
        let mut uses: Vec<TaskId> = Vec::new();
        for chain in &page_chains {
            let mut links = Vec::new();
            for pair in chain.windows(2) {
                uses.clear();
                uses.extend(readers[pair[0] as usize].iter().copied());
                uses.extend(writers[pair[0] as usize].iter().copied());
                links.push(reach.ask_all(&uses, &writers[pair[1] as usize]));
            }
            page_links.push(links);
        }
        reach.resolve();

        // Phase 2: decide, and only for failures ask the finer questions messages need.
        let failed_reads: Vec<(TaskId, BufferId)> = reads
            .iter()
            .filter(|(_, _, a)| !reach.answer(*a))
            .map(|&(t, b, _)| (t, b))
            .collect();
        let mut detail = Reach::new(p, self.idx, &[]);
        if !failed_reads.is_empty() {
            detail = Reach::new(p, self.idx, order);
        }
        let per_writer: Vec<Vec<(TaskId, Ans)>> = failed_reads
            .iter()
            .take(MAX_PER_KIND * 2)
            .map(|&(t, b)| {
                writers[b as usize]
                    .iter()
                    .filter(|&&w| w != t)
                    .map(|&w| (w, detail.ask(w, t)))
                    .collect()
            })
            .collect();
        detail.resolve();
        let mut failed = failed_reads.iter().zip(per_writer.iter());
        for &(t, b, a) in &reads {
            let task = &p.tasks[t as usize];
            let buf = &p.buffers[b as usize];
            let ws = &writers[b as usize];
            let is_kv = buf.kind == BufferKind::KV_CACHE;
            if ws.is_empty() {
                if !is_kv {
                    self.err(
                        ValidationError::new(
                            ErrorKind::NeverProduced,
                            format!(
                                "{} reads buffer #{b} ('{}'), which no task writes",
                                tag(task),
                                buf.name
                            ),
                        )
                        .task(t)
                        .buffer(b),
                    );
                }
                continue;
            }
            if !reach.answer(a) {
                let mut missing: Vec<TaskId> = match failed.next() {
                    Some((_, ws)) => ws
                        .iter()
                        .filter(|(_, a)| !detail.answer(*a))
                        .map(|(w, _)| *w)
                        .collect(),
                    None => ws.iter().copied().filter(|&w| w != t).collect(),
                };
                missing.sort_unstable();
                missing.dedup();
                let (kind, what) = if is_kv {
                    (ErrorKind::RawRaceKv, "KV cache")
                } else {
                    (ErrorKind::RawRace, "buffer")
                };
                let list: Vec<String> = missing.iter().map(|w| w.to_string()).collect();
                self.err(
                    ValidationError::new(
                        kind,
                        format!(
                            "{} reads {what} #{b} ('{}') but writer task(s) {} are not ordered before it (data race)",
                            tag(task),
                            buf.name,
                            list.join(", ")
                        ),
                    )
                    .task(t)
                    .buffer(b)
                    .others(missing),
                );
            } else if !is_kv && ws.iter().all(|&w| w == t) {
                self.err(
                    ValidationError::new(
                        ErrorKind::InplaceUninitRead,
                        format!(
                            "{} reads buffer #{b} ('{}') that only it writes: it would read its own uninitialised output",
                            tag(task),
                            buf.name
                        ),
                    )
                    .task(t)
                    .buffer(b),
                );
            }
        }

        // Check 5a: multi-writer buffers.
        for (b, same_counter, links) in &multi {
            if links.iter().all(|&a| reach.answer(a)) {
                continue;
            }
            let ws = &writers[*b as usize];
            let regions: Vec<Region> = ws
                .iter()
                .map(|&w| region(&p.tasks[w as usize], tiled(&p.tasks[w as usize])))
                .collect();
            self.report_waw(*b, ws, &regions, *same_counter, order);
        }

        // Check 7: page aliasing.
        self.check_page_table();
        for (chain, links) in page_chains.iter().zip(&page_links) {
            for (pair, &a) in chain.windows(2).zip(links) {
                if reach.answer(a) {
                    continue;
                }
                let (a, b2) = (pair[0], pair[1]);
                let page = self.page_of(a).unwrap_or(0);
                self.err(
                    ValidationError::new(
                        ErrorKind::PageClobber,
                        format!(
                            "page {page} is shared by buffers #{a} ('{}') and #{b2} ('{}') whose live ranges are not ordered: a write to one can clobber the other",
                            self.bname(a),
                            self.bname(b2)
                        ),
                    )
                    .buffer(a)
                    .others(writers[b2 as usize].to_vec()),
                );
            }
        }
    }

    fn report_waw(
        &mut self,
        b: BufferId,
        ws: &[TaskId],
        regions: &[Region],
        same_counter: bool,
        order: &[TaskId],
    ) {
        // The witness is the first pair in writer order that is neither disjoint-with-a-shared-
        // counter nor ordered. Pairs are examined in batches (bounded for hostile inputs);
        // past the bound, the first unordered link of the topologically sorted writers is
        // reported instead (also a genuinely racing pair).
        const BUDGET: usize = 1 << 22;
        const BATCH: usize = 1 << 16;
        let mut reach = Reach::new(self.p, self.idx, order);
        let k = ws.len();
        // Candidate pairs, in writer order: with a shared counter only overlapping tiles can
        // race (found by a sweep over column starts); otherwise every pair must be ordered.
        let candidates: Vec<(usize, usize)> = if same_counter {
            overlapping_pairs(regions, BUDGET)
        } else {
            (0..k)
                .flat_map(|i| (i + 1..k).map(move |j| (i, j)))
                .take(BUDGET)
                .collect()
        };
        let mut culprit = None;
        for chunk in candidates.chunks(BATCH) {
            reach.clear();
            let asked: Vec<_> = chunk
                .iter()
                .map(|&(i, j)| (i, j, reach.ask(ws[i], ws[j]), reach.ask(ws[j], ws[i])))
                .collect();
            reach.resolve();
            culprit = asked
                .iter()
                .find(|&&(_, _, x, y)| !reach.answer(x) && !reach.answer(y))
                .map(|&(i, j, _, _)| (i, j));
            if culprit.is_some() {
                break;
            }
        }
        let culprit = culprit.unwrap_or_else(|| {
            reach.clear();
            let mut chain: Vec<usize> = (0..k).collect();
            chain.sort_by_key(|&i| (reach.position(ws[i]), ws[i]));
            let links: Vec<(usize, usize, Ans)> = chain
                .windows(2)
                .map(|w| (w[0], w[1], reach.ask(ws[w[0]], ws[w[1]])))
                .collect();
            reach.resolve();
            links
                .iter()
                .find(|&&(_, _, a)| !reach.answer(a))
                .map_or((0, 1), |&(i, j, _)| (i.min(j), i.max(j)))
        });
        let (wi, wj) = (ws[culprit.0], ws[culprit.1]);
        let why = if wi == wj {
            "lists the buffer twice among its outputs".to_string()
        } else if same_counter {
            "share a counter but their tiles overlap, and neither is ordered before the other"
                .to_string()
        } else {
            "signal different counters and neither is ordered before the other".to_string()
        };
        let (ti, tj) = (&self.p.tasks[wi as usize], &self.p.tasks[wj as usize]);
        let msg = if wi == wj {
            format!(
                "write-after-write race on buffer #{b} ('{}'): task {} ('{}') {why}",
                self.bname(b),
                wi,
                ti.display_label()
            )
        } else {
            format!(
                "write-after-write race on buffer #{b} ('{}'): writers {} ('{}') and {} ('{}') {why}",
                self.bname(b),
                wi,
                ti.display_label(),
                wj,
                tj.display_label()
            )
        };
        self.err(
            ValidationError::new(ErrorKind::WawRace, msg)
                .task(wi)
                .buffer(b)
                .others(vec![wj]),
        );
    }

    fn page_of(&self, b: BufferId) -> Option<PageId> {
        self.p
            .pages
            .as_ref()?
            .buffer_to_page
            .iter()
            .find(|(x, _)| *x == b)
            .map(|(_, pg)| *pg)
    }

    /// Per page, the buffers that have writers, sorted by their earliest writer's position.
    fn page_chains(&self, writers: &Incidence, reach: &Reach<'_>) -> Vec<Vec<BufferId>> {
        let Some(pa) = &self.p.pages else {
            return Vec::new();
        };
        let mut by_page: Vec<Vec<BufferId>> = vec![Vec::new(); pa.pages.len()];
        for &(b, pg) in &pa.buffer_to_page {
            if (b as usize) < self.p.buffers.len() && !writers[b as usize].is_empty() {
                if let Some(list) = by_page.get_mut(pg as usize) {
                    list.push(b);
                }
            }
        }
        by_page
            .into_iter()
            .filter(|bs| bs.len() >= 2)
            .map(|mut bs| {
                bs.sort_by_key(|&b| {
                    let first = writers[b as usize]
                        .iter()
                        .map(|&w| reach.position(w))
                        .min()
                        .unwrap_or(u32::MAX);
                    (first, b)
                });
                bs
            })
            .collect()
    }

    fn check_page_table(&mut self) {
        let Some(pa) = &self.p.pages else {
            return;
        };
        for &(b, pg) in &pa.buffer_to_page {
            let Some(buf) = self.buf(b) else {
                self.err(
                    ValidationError::new(
                        ErrorKind::PageTable,
                        format!("the page table binds buffer #{b}, which does not exist"),
                    )
                    .buffer(b),
                );
                continue;
            };
            let Some(page) = pa.pages.get(pg as usize) else {
                self.err(
                    ValidationError::new(
                        ErrorKind::PageTable,
                        format!(
                            "the page table binds buffer #{b} ('{}') to page {pg}, which does not exist",
                            buf.name
                        ),
                    )
                    .buffer(b),
                );
                continue;
            };
            if buf.kind != BufferKind::ACTIVATION {
                self.err(
                    ValidationError::new(
                        ErrorKind::PageTable,
                        format!(
                            "buffer #{b} ('{}') of kind {} is bound to page {pg}; only transient ACTIVATION buffers may live in shared scratch pages",
                            buf.name, buf.kind
                        ),
                    )
                    .buffer(b),
                );
            }
            if buf.nbytes() > page.nbytes {
                self.err(
                    ValidationError::new(
                        ErrorKind::PageTable,
                        format!(
                            "buffer #{b} ('{}') needs {} bytes but page {pg} holds only {}",
                            buf.name,
                            buf.nbytes(),
                            page.nbytes
                        ),
                    )
                    .buffer(b),
                );
            }
        }
    }

    // ---- Check 5b: on-chip buffers ------------------------------------------------------------

    fn check_onchip(&mut self) {
        let mut users: HashMap<BufferId, Vec<TaskId>> = HashMap::new();
        for t in &self.p.tasks {
            for &b in t.inputs.iter().chain(&t.outputs) {
                if self.buf(b).is_some_and(|x| x.space.is_on_chip()) {
                    users.entry(b).or_default().push(t.id);
                }
            }
        }
        let mut bs: Vec<_> = users.into_iter().collect();
        bs.sort_by_key(|(b, _)| *b);
        for (b, us) in bs {
            let buf = &self.p.buffers[b as usize];
            let mut sms: Vec<i32> = us
                .iter()
                .filter_map(|&t| self.p.tasks[t as usize].sm)
                .collect();
            sms.sort_unstable();
            sms.dedup();
            let unplaced = us.iter().any(|&t| self.p.tasks[t as usize].sm.is_none());
            if sms.len() > 1 {
                let list: Vec<String> = sms.iter().map(|s| s.to_string()).collect();
                self.err(
                    ValidationError::new(
                        ErrorKind::OnchipCrossSm,
                        format!(
                            "on-chip buffer #{b} ('{}', {}) is used from SMs {}; counters order tasks but cannot move on-chip data between SMs (use GLOBAL_SCRATCH/HBM or place all users on one SM)",
                            buf.name,
                            buf.space,
                            list.join(", ")
                        ),
                    )
                    .buffer(b)
                    .others(us),
                );
            } else if unplaced {
                self.warn(
                    ValidationWarning::new(
                        WarningKind::OnchipUnverified,
                        format!(
                            "on-chip buffer #{b} ('{}') needs all its users on one SM, but some are not assigned an SM yet",
                            buf.name
                        ),
                    )
                    .buffer(b),
                );
            }
        }
    }

    // ---- Check 6: SM queues ----------------------------------------------------------------

    fn check_sms(&mut self, acyclic: bool, queue_deadlock: bool, next: Option<&[TaskId]>) {
        let Some(next) = next else {
            return;
        };
        let p = self.p;
        // Each SM runs its queue in task-list order, so the dependency edges plus "next on the
        // same SM" edges must be acyclic; a cycle through several SMs deadlocks just the same
        // as a producer listed after its consumer on one SM. `run` decided it with one Kahn
        // pass; only when it failed (or the dependency graph itself is cyclic) do we look for
        // the direct same-SM violations, whose messages are the most precise.
        let queue_cycle = queue_deadlock
            .then(|| crate::graph::find_cycle_with(p, self.idx, Some(next)).unwrap_or_default());
        if !acyclic || queue_cycle.is_some() {
            let before = self.count(ErrorKind::SmQueueOrder);
            self.direct_sm_violations();
            let direct_found = self.count(ErrorKind::SmQueueOrder) > before;
            if let Some(path) = queue_cycle {
                if !direct_found {
                    let rendered: Vec<String> = path
                        .iter()
                        .map(|&t| match p.tasks[t as usize].sm {
                            Some(s) => format!("{t}@SM{s}"),
                            None => format!("{t}"),
                        })
                        .collect();
                    let mut d = ValidationError::new(
                        ErrorKind::SmQueueOrder,
                        format!(
                            "the SM queues deadlock: each SM runs its tasks in list order, and this cycle of dependencies and queue order can never make progress: {}",
                            rendered.join(" -> ")
                        ),
                    );
                    d.task = path.first().copied();
                    d.path = path;
                    self.err(d);
                }
            }
        }
        let num_sms = p.target.as_ref().map(|t| t.num_sms);
        for t in &p.tasks {
            let Some(s) = t.sm else { continue };
            let bad = s < 0 || num_sms.is_some_and(|n| s as i64 >= n);
            if bad {
                let range = num_sms.map_or_else(|| "≥ 0".to_string(), |n| format!("in [0, {n})"));
                self.err(
                    ValidationError::new(
                        ErrorKind::SmOutOfRange,
                        format!("task {} is assigned to SM {s}; SMs must be {range}", t.id),
                    )
                    .task(t.id),
                );
            }
        }
    }

    fn count(&self, kind: ErrorKind) -> usize {
        self.counts.get(&kind).copied().unwrap_or(0)
    }

    /// A producer listed after its consumer on the same SM.
    fn direct_sm_violations(&mut self) {
        let p = self.p;
        let idx = self.idx;
        for t in &p.tasks {
            let Some(s) = t.sm else { continue };
            for (i, w) in t.waits.iter().enumerate() {
                if t.waits[..i].iter().any(|x| x.counter == w.counter) {
                    continue;
                }
                for &a in idx.producers(w.counter) {
                    if a >= t.id && p.tasks[a as usize].sm == Some(s) {
                        self.err(
                            ValidationError::new(
                                ErrorKind::SmQueueOrder,
                                format!(
                                    "SM {s} runs task {} after task {a}, but task {} depends on task {a}: the SM would wait forever on its own later queue entry",
                                    t.id, t.id
                                ),
                            )
                            .task(t.id)
                            .others(vec![a]),
                        );
                    }
                }
            }
        }
    }

    // ---- Check 8: outputs and labels ---------------------------------------------------------

    fn check_outputs(&mut self) {
        let mut written = vec![false; self.p.buffers.len()];
        for t in &self.p.tasks {
            for &b in &t.outputs {
                if let Some(w) = written.get_mut(b as usize) {
                    *w = true;
                }
            }
        }
        for b in &self.p.buffers {
            if b.kind == BufferKind::IO_OUTPUT && !written[b.id as usize] {
                self.err(
                    ValidationError::new(
                        ErrorKind::OutputUnproduced,
                        format!(
                            "output buffer #{} ('{}') is never written by any task",
                            b.id, b.name
                        ),
                    )
                    .buffer(b.id),
                );
            }
        }
        if let (Some(t), Some(Value::Str(gpu))) = (&self.p.target, self.p.meta.get("gpu")) {
            if !gpu.is_empty() && *gpu != t.name {
                self.warn(ValidationWarning::new(
                    WarningKind::GpuLabelMismatch,
                    format!(
                        "meta.gpu is '{gpu}' but the target is '{}'; results are filed under the target's name",
                        t.name
                    ),
                ));
            }
        }
    }
}

/// Pairs `(i, j)`, `i < j`, of regions that overlap, sorted, at most `budget` of them.
fn overlapping_pairs(regions: &[Region], budget: usize) -> Vec<(usize, usize)> {
    let span = |r: &Region| r.map_or((i64::MIN, i64::MAX), |(c, _)| c);
    let mut by_start: Vec<usize> = (0..regions.len()).collect();
    by_start.sort_by_key(|&i| (span(&regions[i]).0, i));
    let mut out = Vec::new();
    'outer: for (n, &a) in by_start.iter().enumerate() {
        let end_a = span(&regions[a]).1;
        for &b in &by_start[n + 1..] {
            if span(&regions[b]).0 >= end_a {
                break;
            }
            if !disjoint(&regions[a], &regions[b]) {
                out.push((a.min(b), a.max(b)));
                if out.len() >= budget {
                    break 'outer;
                }
            }
        }
    }
    out.sort_unstable();
    out
}

fn all_disjoint(regions: &[Region]) -> bool {
    if regions.iter().any(Option::is_none) {
        return false;
    }
    let full_rows = regions
        .iter()
        .all(|r| r.is_some_and(|(_, rows)| rows.is_none()));
    if full_rows {
        // Only columns matter: sort intervals and check neighbours.
        let mut cols: Vec<(i64, i64)> = regions.iter().filter_map(|r| r.map(|(c, _)| c)).collect();
        cols.sort_unstable();
        return cols.windows(2).all(|w| w[0].1 <= w[1].0);
    }
    for i in 0..regions.len() {
        for j in i + 1..regions.len() {
            if !disjoint(&regions[i], &regions[j]) {
                return false;
            }
        }
    }
    true
}
