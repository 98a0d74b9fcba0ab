//! Typed validation findings, the result, and `ValidatedProgram`.

use crate::ir::{BufferId, CounterId, Program, TaskId};

macro_rules! kinds {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vm])* $v),+ }
        impl $name {
            /// Every kind.
            pub const ALL: &'static [$name] = &[$($name::$v),+];
            /// The stable vocabulary string (`--json` emits it).
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$v => $s),+ }
            }
            /// Parses a vocabulary string.
            pub fn from_str_opt(s: &str) -> Option<Self> {
                match s { $($s => Some($name::$v),)+ _ => None }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

kinds! {
    /// Why a program is rejected.
    ErrorKind {
        /// A task names a buffer id that does not exist.
        MissingBuffer = "missing_buffer",
        /// A task names a counter id that does not exist.
        MissingCounter = "missing_counter",
        /// More inputs than the ABI holds.
        CapInputs = "cap_inputs",
        /// More outputs than the ABI holds.
        CapOutputs = "cap_outputs",
        /// More waits than the ABI holds.
        CapWaits = "cap_waits",
        /// A buffer of rank above the ABI maximum.
        CapRank = "cap_rank",
        /// A wait threshold below 1.
        BadThreshold = "bad_threshold",
        /// A task waits on the counter it increments.
        SelfWait = "self_wait",
        /// The opcode is not in the registry.
        UnregisteredOp = "unregistered_op",
        /// Input count outside the op's arity.
        ArityInputs = "arity_inputs",
        /// Output count differs from the op's.
        ArityOutputs = "arity_outputs",
        /// A required param is absent.
        MissingParam = "missing_param",
        /// A param has the wrong JSON type or range.
        ParamType = "param_type",
        /// A wait on a counter nobody increments.
        NoProducer = "no_producer",
        /// A threshold above the number of producers.
        ThresholdExceeds = "threshold_exceeds",
        /// A partial wait on a counter shared by several producers.
        PartialSharedWait = "partial_shared_wait",
        /// The dependency graph has a cycle.
        Cycle = "cycle",
        /// A transient buffer is read but never written.
        NeverProduced = "never_produced",
        /// A read not ordered after every other writer of the buffer.
        RawRace = "raw_race",
        /// The same, for a KV cache.
        RawRaceKv = "raw_race_kv",
        /// Two writers of one buffer neither disjoint nor ordered.
        WawRace = "waw_race",
        /// An on-chip buffer used from several SMs.
        OnchipCrossSm = "onchip_cross_sm",
        /// An SM's queue lists a consumer before its producer.
        SmQueueOrder = "sm_queue_order",
        /// An SM id outside the target.
        SmOutOfRange = "sm_out_of_range",
        /// Two buffers share a page with unordered live ranges.
        PageClobber = "page_clobber",
        /// An IO_OUTPUT buffer no task writes.
        OutputUnproduced = "output_unproduced",
        /// A task writes a WEIGHT, CONST or IO_INPUT buffer.
        WriteReadonly = "write_readonly",
        /// A tile or range param indexes outside its buffer.
        TileOutOfBounds = "tile_out_of_bounds",
        /// Operand shapes or dtypes that do not fit the op.
        ShapeMismatch = "shape_mismatch",
        /// A counter with a non-zero initial value.
        CounterInit = "counter_init",
        /// A task reads its own output that nobody else wrote.
        InplaceUninitRead = "inplace_uninit_read",
        /// A malformed FUSED recipe.
        FusedRecipe = "fused_recipe",
        /// A page table entry naming a missing page or buffer, or an unfit binding.
        PageTable = "page_table",
        /// A step loop whose gate is not a barrier of the whole pass, or whose halt word is
        /// not an integer STATE buffer.
        StepLoop = "step_loop",
        /// A schedule config or GPU target value outside its range.
        BadConfig = "bad_config",
    }
}

kinds! {
    /// Findings that do not reject a program.
    WarningKind {
        /// A param key the device param block does not have.
        UnknownParam = "unknown_param",
        /// An on-chip buffer whose users are not (all) placed on an SM yet.
        OnchipUnverified = "onchip_unverified",
        /// `meta.gpu` disagrees with `target.name`.
        GpuLabelMismatch = "gpu_label_mismatch",
    }
}

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
