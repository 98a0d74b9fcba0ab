//! The validator's vocabulary: why a program is rejected ([`ErrorKind`]) and what it warns of
//! ([`WarningKind`]). Its own floor: op rules (`spec::Finding`) name a kind, the validator
//! reports it, and neither imports the other for it.

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
        /// A floating task whose runner the program cannot name: not exactly one wait, a
        /// partial wait, a counter others wait on too, a floating producer, an SM of its own
        /// or an on-chip buffer.
        FloatingTask = "floating_task",
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
