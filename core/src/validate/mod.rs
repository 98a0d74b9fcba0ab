//! The static validator: proves a program cannot deadlock or race before anything runs it.
//!
//! Checks run in the reference's order (per-task structure, waits vs producers, acyclicity,
//! read-after-write provenance, write-after-write, on-chip placement, per-SM queue order, page
//! aliasing, output reachability), with our stricter rules folded in where they belong. The
//! validator is total: any loaded program yields a result, never a panic, and every proof runs
//! at every size (reachability is answered in 64-task blocks, see [`crate::graph::Reach`]).

mod diag;
mod floating;
mod patch;
mod placement;
mod races;
mod step_loop;
mod structure;

pub use diag::{
    Diagnostic, ErrorKind, Stats, ValidatedProgram, ValidationError, ValidationResult,
    ValidationWarning, WarningKind,
};
pub use patch::{ParamPatch, REGION_PARAMS};

use crate::abi;
use crate::graph::{Ans, Incidence, Reach, find_cycle};
use crate::ir::*;
use crate::json::Value;
use crate::registry::Registry;
use crate::spec::{ParamType, TaskContext, WriteRegion};
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
    /// Reads of STATE buffers ordered before every other writer (see [`ValidationResult`]).
    carried: Vec<(TaskId, BufferId)>,
}

fn tag(t: &Task) -> String {
    format!("task {} ({})", t.id, t.display_label())
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
            carried: Vec::new(),
        }
    }

    fn err(&mut self, d: ValidationError) {
        let n = self.counts.entry(d.kind).or_insert(0);
        *n += 1;
        if *n <= MAX_PER_KIND {
            self.errors.push(d);
        }
    }

    /// Whether errors of `kind` are past the listing cap: a check may then count one without
    /// building it ([`Validator::count_only`]); a hostile program with tens of thousands of
    /// races would otherwise cost quadratic time and memory in messages nobody reads.
    fn listing_full(&self, kind: ErrorKind) -> bool {
        self.counts.get(&kind).is_some_and(|&n| n >= MAX_PER_KIND)
    }

    /// Counts one more error of `kind` past the listing cap (reported as "... and N more").
    fn count_only(&mut self, kind: ErrorKind) {
        *self.counts.entry(kind).or_insert(0) += 1;
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
        self.check_floating();
        // With SMs assigned, one Kahn pass over dependency + queue-order edges usually decides
        // both acyclicity and queue safety (its order is a valid dependency order too).
        let next = self
            .p
            .sm_assigned()
            .then(|| crate::graph::queue_successors(self.p));
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
        self.check_step_loop();
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
        self.carried.sort_unstable();
        ValidationResult {
            errors: self.errors,
            warnings: self.warnings,
            stats,
            carried_reads: self.carried.into_boxed_slice(),
        }
    }
}
