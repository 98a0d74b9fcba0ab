//! Opcodes: a small copyable id. Built-in codes 0–19 are fixed by the ABI; our own built-in
//! ops are appended from 20; plugin ops get codes ≥ 1000. Names resolve through the registry.

/// An opcode id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u16);

macro_rules! builtin_ops {
    ($($(#[$m:meta])* $c:ident = $n:expr),+ $(,)?) => {
        impl Opcode {
            $($(#[$m])* pub const $c: Opcode = Opcode($n);)+
            /// Every opcode of the ABI, in code order.
            pub const ABI_OPS: &'static [Opcode] = &[$(Opcode::$c),+];
            /// The canonical name of an ABI opcode (`None` for codes beyond the ABI table).
            pub const fn abi_name(self) -> Option<&'static str> {
                match self.0 { $($n => Some(stringify!($c)),)+ _ => None }
            }
            /// The ABI opcode with this canonical name.
            pub fn from_abi_name(s: &str) -> Option<Opcode> {
                match s { $(stringify!($c) => Some(Opcode::$c),)+ _ => None }
            }
        }
    };
}

builtin_ops! {
    /// Does nothing (a pure synchronisation point).
    NOP = 0,
    /// Copies one buffer into another (cast on store).
    COPY = 1,
    /// Row gather from a table by integer ids; also the reshape bridge.
    EMBED = 2,
    /// RMS normalisation.
    RMSNORM = 3,
    /// Layer normalisation.
    LAYERNORM = 4,
    /// A column tile of a matrix-vector product.
    GEMV_TILE = 5,
    /// A column tile of a small matrix-matrix product (batched decode).
    GEMM_TILE = 6,
    /// Decode attention over a KV range (optionally a split-KV shard).
    ATTENTION_TILE = 7,
    /// Rotary position embedding.
    ROPE = 8,
    /// `silu(gate) * up`.
    SILU_MUL = 9,
    /// Exact (erf) GELU.
    GELU = 10,
    /// Element-wise sum.
    ADD = 11,
    /// Element-wise product or scale.
    MUL = 12,
    /// Group-wise dequantisation.
    DEQUANT = 13,
    /// Softmax along one dimension.
    SOFTMAX = 14,
    /// Sum of shards (single-node all-reduce).
    ALLREDUCE_SHARD = 15,
    /// Appends rows to a KV cache in place.
    KV_APPEND = 16,
    /// Index of the largest logit.
    SAMPLE_ARGMAX = 17,
    /// Combines split-KV attention partials.
    ATTENTION_COMBINE = 18,
    /// A recipe of primitive steps run as one task.
    FUSED = 19,
}

impl Opcode {
    /// Number of opcodes in the ABI table (`AMK_OP__COUNT`).
    pub const ABI_COUNT: u16 = 20;
    /// First code available to our own appended built-in ops.
    pub const FIRST_EXTENDED: u16 = 20;
    /// First code a plugin may request.
    pub const FIRST_PLUGIN: u16 = 1000;
    /// RMS normalisation of one row fused into a GEMV column tile (our code 20).
    pub const RMSNORM_GEMV: Opcode = Opcode(20);
    /// A column tile of `silu(x·Wg^T) · (x·Wu^T)`, optionally RMS-normalising x first (21).
    pub const GATE_UP_SILU: Opcode = Opcode(21);
    /// A tile of the Q/K/V projections with RoPE, K and V appended to the caches,
    /// optionally RMS-normalising x first (22).
    pub const QKV_ROPE_APPEND: Opcode = Opcode(22);
    /// A column tile of `attention(q, K, V) · W^T (+ bias)`: each tile computes the layer's
    /// decode attention itself, then its rows of the output projection (23).
    pub const ATTENTION_GEMV: Opcode = Opcode(23);
    /// The tail of one on-device decode iteration: the next token (the next prompt token, or
    /// one chosen from the logits), the position advanced, the halt flag (24).
    pub const NEXT_TOKEN: Opcode = Opcode(24);
    /// One (KV head × split) piece of the decode attention, its rows chosen by the position:
    /// the un-normalised partials of the split-KV attention spread over every SM (25).
    pub const ATTENTION_SPLIT: Opcode = Opcode(25);
    /// A column tile of `combine(partials) · W^T (+ bias)`: the split-KV partials merged inside
    /// every tile of the output projection that reads them (26).
    pub const COMBINE_GEMV: Opcode = Opcode(26);
    /// A `[rows × columns]` tile of a linear layer over many rows (a prompt chunk), with an
    /// optional RMS-normalised input and a residual or SwiGLU epilogue (27).
    pub const LINEAR_TILE: Opcode = Opcode(27);
    /// Causal attention of many query rows (a prompt chunk) over the KV cache, each row up to
    /// its own position (28).
    pub const ATTENTION_CAUSAL: Opcode = Opcode(28);
    /// Each row's negative log-likelihood of its target token (a scored text's rows reduced
    /// where its logits are) (29).
    pub const TOKEN_NLL: Opcode = Opcode(29);
    /// Whole heads of the decode attention row merged from the split-KV partials at the
    /// position, once, for plain GEMV tiles to project (30).
    pub const ATTENTION_MERGE: Opcode = Opcode(30);
    /// A slice of one logits row summarised for the decode loop's tail (its first largest
    /// logit, the valid count, the sum of exps), so that NEXT_TOKEN merges summaries instead
    /// of reading the whole row on one SM (31).
    pub const LOGIT_STATS: Opcode = Opcode(31);
    /// Our appended built-in opcodes (code ≥ 20), in code order.
    pub const EXTENDED_OPS: &'static [Opcode] = &[
        Opcode::RMSNORM_GEMV,
        Opcode::GATE_UP_SILU,
        Opcode::QKV_ROPE_APPEND,
        Opcode::ATTENTION_GEMV,
        Opcode::NEXT_TOKEN,
        Opcode::ATTENTION_SPLIT,
        Opcode::COMBINE_GEMV,
        Opcode::LINEAR_TILE,
        Opcode::ATTENTION_CAUSAL,
        Opcode::TOKEN_NLL,
        Opcode::ATTENTION_MERGE,
        Opcode::LOGIT_STATS,
    ];

    /// The canonical name of one of our appended built-in opcodes.
    pub const fn extended_name(self) -> Option<&'static str> {
        match self.0 {
            20 => Some("RMSNORM_GEMV"),
            21 => Some("GATE_UP_SILU"),
            22 => Some("QKV_ROPE_APPEND"),
            23 => Some("ATTENTION_GEMV"),
            24 => Some("NEXT_TOKEN"),
            25 => Some("ATTENTION_SPLIT"),
            26 => Some("COMBINE_GEMV"),
            27 => Some("LINEAR_TILE"),
            28 => Some("ATTENTION_CAUSAL"),
            29 => Some("TOKEN_NLL"),
            30 => Some("ATTENTION_MERGE"),
            31 => Some("LOGIT_STATS"),
            _ => None,
        }
    }
}

impl std::fmt::Display for Opcode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.abi_name().or(self.extended_name()) {
            Some(n) => f.write_str(n),
            None => write!(f, "op#{}", self.0),
        }
    }
}
