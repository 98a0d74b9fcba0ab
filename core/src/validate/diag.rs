//! Typed validation findings, the result, and `ValidatedProgram`.

use crate::ir::{BufferId, CounterId, Program, TaskId};
pub use crate::kinds::{ErrorKind, WarningKind};

/// One finding with the ids it concerns.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic<K> {
    /// Kind (stable vocabulary).
    pub kind: K,
    /// Human message (our wording).
    pub message: String,
    /// The task at fault (the reader, for races).
    pub task: Option<TaskId>,
    /// The buffer concerned.
    pub buffer: Option<BufferId>,
    /// The counter concerned.
    pub counter: Option<CounterId>,
    /// Other tasks involved (unordered writers, the second writer of a WAW pair, …).
    pub others: Vec<TaskId>,
    /// For cycles: a witness path `[a, b, …, a]`.
    pub path: Vec<TaskId>,
}

impl<K> Diagnostic<K> {
    /// A finding with only a message.
    pub fn new(kind: K, message: impl Into<String>) -> Self {
        Diagnostic {
            kind,
            message: message.into(),
            task: None,
            buffer: None,
            counter: None,
            others: Vec::new(),
            path: Vec::new(),
        }
    }
    /// Sets the task.
    pub fn task(mut self, t: TaskId) -> Self {
        self.task = Some(t);
        self
    }
    /// Sets the buffer.
    pub fn buffer(mut self, b: BufferId) -> Self {
        self.buffer = Some(b);
        self
    }
    /// Sets the counter.
    pub fn counter(mut self, c: CounterId) -> Self {
        self.counter = Some(c);
        self
    }
    /// Sets the other tasks.
    pub fn others(mut self, o: Vec<TaskId>) -> Self {
        self.others = o;
        self
    }
}

/// A rejection reason.
pub type ValidationError = Diagnostic<ErrorKind>;
/// A non-fatal finding.
pub type ValidationWarning = Diagnostic<WarningKind>;

/// Summary numbers of a validation.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct Stats {
    /// Task count.
    pub tasks: usize,
    /// Buffer count.
    pub buffers: usize,
    /// Counter count.
    pub counters: usize,
    /// Distinct dependency edges.
    pub edges: u64,
    /// Whether the dependency graph is acyclic.
    pub acyclic: bool,
    /// Weight megabytes (10^6 bytes), rounded to 2 decimals.
    #[serde(rename = "weight_MB")]
    pub weight_mb: f64,
    /// Whether any task carries an SM.
    pub sm_assigned: bool,
    /// Scratch pages.
    pub pages: usize,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tasks={} buffers={} counters={} edges={} acyclic={} weight_MB={:.2} sm_assigned={} pages={}",
            self.tasks,
            self.buffers,
            self.counters,
            self.edges,
            self.acyclic,
            self.weight_mb,
            self.sm_assigned,
            self.pages
        )
    }
}

/// The outcome of [`super::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationResult {
    /// Rejection reasons, in check order.
    pub errors: Vec<ValidationError>,
    /// Non-fatal findings.
    pub warnings: Vec<ValidationWarning>,
    /// Summary numbers.
    pub stats: Stats,
    /// `(task, buffer)`: reads of a STATE buffer that are ordered before every other writer
    /// of it, sorted: the value such a task reads is final when the pass starts (the host's,
    /// or the previous pass's), so a backend may read it before the task's waits.
    pub carried_reads: Box<[(TaskId, BufferId)]>,
}

impl ValidationResult {
    /// Accepted iff there are no errors.
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }
    /// Whether any error has `kind`.
    pub fn has(&self, kind: ErrorKind) -> bool {
        self.errors.iter().any(|e| e.kind == kind)
    }
    /// Distinct error kinds, sorted.
    pub fn error_kinds(&self) -> Vec<ErrorKind> {
        let mut k: Vec<ErrorKind> = self.errors.iter().map(|e| e.kind).collect();
        k.sort();
        k.dedup();
        k
    }
    /// Multi-line human report: a `[VALID]`/`[REJECTED]` header with the stats, then one
    /// line per error and per warning.
    pub fn report(&self) -> String {
        let mut s = format!(
            "[{}] {}",
            if self.ok() { "VALID" } else { "REJECTED" },
            self.stats
        );
        for e in &self.errors {
            s.push_str(&format!("\n  error[{}]: {}", e.kind, e.message));
        }
        for w in &self.warnings {
            s.push_str(&format!("\n  warning[{}]: {}", w.kind, w.message));
        }
        s
    }
}

/// A program that passed validation. Only [`super::validate_owned`] constructs one, so "a
/// rejected program cannot reach a backend" is enforced by the type system.
#[derive(Debug, Clone)]
pub struct ValidatedProgram {
    program: Program,
    result: ValidationResult,
    id: u64,
    /// The counter index, built on first use (every param patch of a decode step needs it).
    index: std::sync::OnceLock<crate::ir::CounterIndex>,
}

/// Source of [`ValidatedProgram::id`]s.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ValidatedProgram {
    pub(super) fn new(program: Program, result: ValidationResult) -> Self {
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ValidatedProgram {
            program,
            result,
            id,
            index: std::sync::OnceLock::new(),
        }
    }
    /// The program's counter index (built once, on first use).
    pub fn counter_index(&self) -> &crate::ir::CounterIndex {
        self.index
            .get_or_init(|| crate::ir::CounterIndex::new(&self.program))
    }
    /// A process-unique id of this validation (clones share it): param patches carry it so a
    /// backend can refuse a patch checked against another program.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The program.
    pub fn program(&self) -> &Program {
        &self.program
    }
    /// The (passing) validation result, with its warnings and stats.
    pub fn result(&self) -> &ValidationResult {
        &self.result
    }
    /// Gives the program back (it stops being "validated").
    pub fn into_inner(self) -> Program {
        self.program
    }
}
