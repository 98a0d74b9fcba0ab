//! The IR's enums. Their numeric values are the ABI codes; JSON stores their NAMES.

/// Declares an enum with ABI codes and JSON names, plus lookups both ways.
macro_rules! abi_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $code:expr),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        #[allow(non_camel_case_types)]
        pub enum $name { $($(#[$vm])* $v = $code),+ }

        impl $name {
            /// Every variant, in code order.
            pub const ALL: &'static [$name] = &[$($name::$v),+];
            /// The JSON name (identical to the ABI enumerator suffix).
            pub const fn name(self) -> &'static str {
                match self { $($name::$v => stringify!($v)),+ }
            }
            /// The ABI code.
            pub const fn code(self) -> u8 { self as u8 }
            /// Parses a JSON name (exact, case-sensitive).
            pub fn from_name(s: &str) -> Option<Self> {
                match s { $(stringify!($v) => Some($name::$v),)+ _ => None }
            }
            /// Looks up an ABI code.
            pub fn from_code(c: u8) -> Option<Self> {
                match c { $($code => Some($name::$v),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

abi_enum! {
    /// Element types of buffers.
    DType {
        /// IEEE binary32.
        F32 = 0,
        /// IEEE binary16.
        F16 = 1,
        /// bfloat16.
        BF16 = 2,
        /// fp8 e4m3.
        F8E4M3 = 3,
        /// fp8 e5m2.
        F8E5M2 = 4,
        /// 32-bit signed integer.
        I32 = 5,
        /// 8-bit signed integer.
        I8 = 6,
        /// 4-bit integer, two per byte (low nibble first).
        I4 = 7,
        /// 8-bit unsigned integer.
        U8 = 8,
        /// Boolean, one byte.
        BOOL = 9,
    }
}

impl DType {
    /// Bits per element.
    pub const fn bits(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 32,
            DType::F16 | DType::BF16 => 16,
            DType::I4 => 4,
            _ => 8,
        }
    }
    /// Bytes needed for `count` elements (packed types round up).
    pub const fn nbytes(self, count: u64) -> u64 {
        (count.saturating_mul(self.bits()).saturating_add(7)) / 8
    }
    /// Whether values of this type are integers (token ids, positions, quantized weights).
    pub const fn is_integer(self) -> bool {
        matches!(
            self,
            DType::I32 | DType::I8 | DType::I4 | DType::U8 | DType::BOOL
        )
    }
}

abi_enum! {
    /// Where a buffer lives.
    MemSpace {
        /// Device HBM (weights, KV, IO).
        HBM = 0,
        /// Global scratch arena (large activations).
        GLOBAL_SCRATCH = 1,
        /// Shared memory of one SM.
        SMEM = 2,
        /// Registers of one SM (a lowering hint).
        REGISTER = 3,
        /// Host memory mapped into the device: the host may read it while a launch runs (a
        /// decode loop's emitted tokens stream out through it). Slow for the device to read.
        HOST = 4,
    }
}

impl MemSpace {
    /// On-chip spaces: producer and consumer must run on the same SM.
    pub const fn is_on_chip(self) -> bool {
        matches!(self, MemSpace::SMEM | MemSpace::REGISTER)
    }
}

abi_enum! {
    /// What a buffer holds, which decides who may write it.
    BufferKind {
        /// Model weights (read-only, bound by `source`).
        WEIGHT = 0,
        /// Transient activations.
        ACTIVATION = 1,
        /// KV cache: persists across forward passes.
        KV_CACHE = 2,
        /// Model input set by the host each pass (read-only to tasks).
        IO_INPUT = 3,
        /// Model output read by the host.
        IO_OUTPUT = 4,
        /// Constants (read-only, bound by `source`).
        CONST = 5,
        /// State carried from one forward pass to the next (a decode loop's position and
        /// token): the host sets it before a run and reads it after; in a pass, a task ordered
        /// before every writer reads the previous pass's value, one ordered after them reads
        /// this pass's. Never paged.
        STATE = 6,
    }
}

impl BufferKind {
    /// Kinds no task may write and whose reads never need a producer.
    pub const fn is_read_only(self) -> bool {
        matches!(
            self,
            BufferKind::WEIGHT | BufferKind::CONST | BufferKind::IO_INPUT
        )
    }
    /// Kinds whose value outlives a pass (a read with no writer in the pass is the previous
    /// pass's value, not an uninitialised one).
    pub const fn persists(self) -> bool {
        matches!(self, BufferKind::KV_CACHE | BufferKind::STATE)
    }
}
