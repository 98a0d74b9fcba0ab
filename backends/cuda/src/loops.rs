//! Which of the fused tiles' vector loops a program's megakernel compiles in.
//!
//! The weight-streaming loop (`amk_fused_pick` in `ops/oplib-tile`) has one instantiation per
//! (weight dtype, row dtype) pair: f32, f16 or bf16 weights against an f32 or a 16-bit row, six
//! in all. A bf16 model runs one of them. Compiling only the pairs a program's tasks name made
//! every shape 0.011–0.023 ms a token faster on the H100 (docs/perf-notes.md round 16 §7 and
//! round 17): the code a program never runs changes where the code it runs lands. So the
//! backend assembles one megakernel per distinct set (`AMK_FUSED_LOOPS`), keyed and cached
//! like any other variant; a pair the set leaves out still computes right, on the generic loop.
//!
//! [`fused_vecs`] sizes the same loop's unrolled pass to the program's rows.

use amk_core::Registry;
use amk_core::ir::{Buffer, DType, Program, Task};

/// A set of (weight, row) dtype pairs: bit `2 * w + x16`, `w` 0/1/2 for f32/f16/bf16 weights,
/// `x16` 1 for a 16-bit row (f16 and bf16 rows share a loop), 0 for an f32 row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FusedLoops(u8);

/// The device code's name for the set (`#define AMK_FUSED_LOOPS <bits>`).
pub const DEFINE: &str = "AMK_FUSED_LOOPS";

/// The weight index of a vector dtype (the device's `AMK_TILE_W_*`), if it is one.
fn weight_index(dt: DType) -> Option<u8> {
    match dt {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::BF16 => Some(2),
        _ => None,
    }
}

impl FusedLoops {
    /// Every pair: the kernel of a program mixing dtypes in ways not listed here, or with no
    /// row-loop op (they share one cubin), and the default of the device code.
    pub const ALL: FusedLoops = FusedLoops(63);

    /// The set's bits.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// The pair of `weights` against a row of `row`, if both are vector dtypes.
    fn pair(weights: DType, row: DType) -> Option<FusedLoops> {
        let w = weight_index(weights)?;
        let x16 = u8::from(weight_index(row)? != 0);
        Some(FusedLoops(1 << (2 * w + x16)))
    }

    /// The loop a model program in `dtype` runs (its weights and activations in that dtype),
    /// or `None` for a dtype with no vector loop.
    pub fn of_dtype(dtype: DType) -> Option<FusedLoops> {
        FusedLoops::pair(dtype, dtype)
    }

    /// The pairs `program`'s tasks name through their ops' [`amk_core::RowLoop`]; every pair
    /// when they name none (no task would run a loop, and such programs then share one
    /// kernel). Out-of-range operands are skipped: the validator refuses them anyway.
    pub fn of_program(program: &Program, registry: &Registry) -> FusedLoops {
        let mut bits = 0u8;
        for t in &program.tasks {
            let Some(rl) = registry.cuda(t.op).and_then(|c| c.row_loop) else {
                continue;
            };
            let dtype = |i: usize| operand(program, t, i).map(|b| b.dtype);
            let Some(row) = dtype(rl.row) else { continue };
            for &w in rl.weights {
                if let Some(p) = dtype(w).and_then(|w| FusedLoops::pair(w, row)) {
                    bits |= p.0;
                }
            }
        }
        if bits == 0 {
            FusedLoops::ALL
        } else {
            FusedLoops(bits)
        }
    }

    /// The define that selects the set, `None` for [`FusedLoops::ALL`] (the device code's
    /// default, so that kernel's source, and its cache key, has no define for it).
    pub fn define(self) -> Option<(String, String)> {
        (self != FusedLoops::ALL).then(|| (DEFINE.to_string(), self.0.to_string()))
    }
}

impl std::fmt::Display for FusedLoops {
    /// `all`, or the pairs as `weights/row` (`bf16/16`, `f32/f32`, ...), comma-separated.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == FusedLoops::ALL {
            return f.write_str("all");
        }
        let mut first = true;
        for (w, wn) in ["f32", "f16", "bf16"].iter().enumerate() {
            for (x16, xn) in ["f32", "16"].iter().enumerate() {
                if self.0 & (1 << (2 * w + x16)) != 0 {
                    if !first {
                        f.write_str(",")?;
                    }
                    first = false;
                    write!(f, "{wn}/{xn}")?;
                }
            }
        }
        Ok(())
    }
}

/// The device code's name for a lane's 16-byte weight vectors in flight a pass of the fused
/// loop (`#define AMK_FUSED_VECS <n>`), and its default there.
pub const VECS_DEFINE: &str = "AMK_FUSED_VECS";
/// The device code's default (and the most this backend picks).
pub const DEFAULT_VECS: u32 = 8;
/// Smaller passes tried, largest first: 6 measured 0.012 ms a token faster than 8 on
/// SmolLM2-135M, whose rows fit one pass either way, and slower on the 1B, where it adds passes
/// (docs/perf-notes.md round 18); 4 was slower on both.
const SMALLER_VECS: [u32; 1] = [6];

/// The device code's name for "every row is whole passes" (`#define AMK_FUSED_EXACT 1`).
pub const EXACT_DEFINE: &str = "AMK_FUSED_EXACT";

/// Input `i` of task `t`, if it names a buffer of `program` (the validator refuses the rest).
fn operand<'a>(program: &'a Program, t: &Task, i: usize) -> Option<&'a Buffer> {
    t.inputs
        .get(i)
        .and_then(|&b| program.buffers.get(b as usize))
}

/// Elements in a 16-byte vector of the fused loop for weights of `dt` (`None`: no vector loop).
fn vector_width(dt: DType) -> Option<u64> {
    match dt {
        DType::F32 => Some(4),
        DType::F16 | DType::BF16 => Some(8),
        _ => None,
    }
}

/// One row-loop task as the loop analyses see it.
struct LoopRow {
    /// The row's elements (`K`).
    k: u64,
    /// Elements of a 16-byte vector of its weights' dtype (`None`: no vector loop).
    ve: Option<u64>,
    /// Its rows a unit.
    nr: u32,
    /// Row and first weight both 16-bit floats (f16 or bf16).
    half: bool,
}

/// Every row-loop task of `program` whose row and first weight are buffers of it. The row's
/// length is the task's `K` param when it has one (every built-in row-loop op does): an op
/// that makes its row in the tile (COMBINE_GEMV merges it from partials) names as its `row`
/// an input of the row's dtype, not one of its length.
fn loop_rows<'a>(
    program: &'a Program,
    registry: &'a Registry,
) -> impl Iterator<Item = LoopRow> + 'a {
    let half = |d: DType| matches!(d, DType::F16 | DType::BF16);
    program.tasks.iter().filter_map(move |t| {
        let rl = registry.cuda(t.op).and_then(|c| c.row_loop)?;
        let row = operand(program, t, rl.row)?;
        let w = rl.weights.first().and_then(|&i| operand(program, t, i))?;
        let k = t
            .param_i64("K")
            .filter(|&k| k > 0)
            .map_or(row.numel(), |k| k as u64);
        Some(LoopRow {
            k,
            ve: vector_width(w.dtype),
            nr: rl.unit_rows.max(1) as u32,
            half: half(row.dtype) && half(w.dtype),
        })
    })
}

/// The device code's name for "load each warp's units before the wait"
/// (`#define AMK_ROW_PRE 1`).
pub const ROW_PRE_DEFINE: &str = "AMK_ROW_PRE";

/// Whether `program`'s kernel should load each warp's weights before its wait
/// (`AMK_ROW_PRE`): every row-loop task has a 16-bit row and 16-bit weights, rows of one pass
/// at `vecs` vectors a lane (`K / 8 <= 32 * (vecs / NR)`), and there is at least one. Then every
/// projection phase's body is one DRAM round trip, which the loads before the wait overlap:
/// SmolLM2-135M measured 0.02 ms a token faster. The 1B's o_proj alone qualifies, and the
/// 1B measured slower with it (docs/perf-notes.md round 19). The device takes the path only for
/// tiles whose units a warp all fit in registers across the wait — up to three units a warp,
/// an even one-row tile two rows a unit, rows of up to 6 vectors a lane as one unit a warp, a
/// gate/up tile three pairs a unit (docs/perf-notes.md rounds 21–22); an LM head keeps its
/// multi-unit loop. It computes the same bits either way, so the rule is one of speed only.
pub fn row_pre(program: &Program, registry: &Registry, vecs: u32) -> bool {
    let mut any = false;
    for r in loop_rows(program, registry) {
        let u = u64::from((vecs / r.nr).max(1));
        let one_pass = r.ve == Some(8) && r.k % 8 == 0 && r.k / 8 <= 32 * u;
        if !(r.half && one_pass) {
            return false;
        }
        any = true;
    }
    any
}

/// The defines of a kernel whose tiles stream two units a warp at once ([`pairs`]): every fused
/// tile's loop may pair (`AMK_FUSED_PAIR` 7: the one-row projections, gate/up and Q/K/V), and
/// does from two units a warp (`AMK_FUSED_PAIR_MIN` 2).
pub const PAIR_DEFINES: [(&str, &str); 2] = [("AMK_FUSED_PAIR", "7"), ("AMK_FUSED_PAIR_MIN", "2")];

/// The shortest weight row, in bytes, of a program whose tiles pair ([`pairs`]).
pub const PAIR_ROW_BYTES: u64 = 4096;

/// Whether `program`'s fused tiles should stream two of a warp's units at once
/// ([`PAIR_DEFINES`]): every vector row-loop task's weight rows are at least
/// [`PAIR_ROW_BYTES`] long, and there is at least one. A warp's pass holds 4 KB of its unit's
/// rows (one to four passes a unit on the 1B), each pass a DRAM round trip; paired, a warp
/// has twice the bytes in flight a pass and half the round trips. Measured on an H200 end to end
/// (docs/perf-notes.md round 60): the Llama-3.2-1B shape's decode (4 KB and 16 KB rows) 1.9 %
/// faster, SmolLM2-135M's (1.1 and 3 KB rows, one pass each) 1.1–1.5 % slower. Each unit's
/// sums are the same bits either way (the same vectors a lane, in the same order), so the
/// rule is one of speed only.
pub fn pairs(program: &Program, registry: &Registry) -> bool {
    let mut any = false;
    for r in loop_rows(program, registry) {
        let Some(ve) = r.ve else {
            continue; // the generic loop: no units to pair
        };
        if r.k.div_ceil(ve) * 16 < PAIR_ROW_BYTES {
            return false;
        }
        any = true;
    }
    any
}

/// Whether every row-loop task of `program` streams whole passes at `vecs` vectors a lane: its
/// row a multiple of every pass the device loop can make of it (`32 * (vecs * 2 / P) / NR`
/// vectors a row for P = 1, 2 or 4 units a warp at once). Then the loop needs no bounds tests
/// (`AMK_FUSED_EXACT`): less code on every layer's path. `false` for a program with no such
/// task, or with a task whose row is not a whole number of vectors (the generic loop's), a
/// FUSED task (its steps may be any op), or a task of a plugin op that declares no row loop
/// (it might run the loop all the same).
pub fn fused_exact(program: &Program, registry: &Registry, vecs: u32) -> bool {
    let unsure = program.tasks.iter().any(|t| {
        let declared = registry.cuda(t.op).is_some_and(|c| c.row_loop.is_some());
        let builtin = matches!(registry.origin(t.op), Some(amk_core::Origin::Builtin));
        t.op == amk_core::Opcode::FUSED || (!declared && !builtin)
    });
    let mut any = false;
    for LoopRow { k, ve, nr, .. } in loop_rows(program, registry) {
        let Some(ve) = ve else {
            continue; // not a vector loop
        };
        // A pass holds 32 * U vectors of each row: U = vecs / NR one or two units a warp at
        // once, vecs / (2 NR) four (amk_fused_fast; the four-unit loop is for NR = 1).
        let whole = k % ve == 0
            && [vecs / nr, vecs / (2 * nr)]
                .into_iter()
                .all(|u| u > 0 && (k / ve) % (32 * u64::from(u)) == 0);
        if !whole {
            return false;
        }
        any = true;
    }
    any && !unsure
}

/// The fewest vectors a lane a pass (`AMK_FUSED_VECS`) at which no row-loop task of `program`
/// takes more passes than at [`DEFAULT_VECS`]: a pass of a unit of `NR` rows holds
/// `32 * (vecs / NR)` vectors of each row ([`amk_core::RowLoop::unit_rows`]), a row `K / VE`
/// (`VE` elements a vector of the weights' dtype). A smaller pass is less code on every
/// layer's path; an extra pass is one more DRAM round trip with fewer bytes in flight. The
/// count is the one-unit loop's (a paired tile's is alike for the shapes measured).
pub fn fused_vecs(program: &Program, registry: &Registry) -> u32 {
    let rows: Vec<(u64, u32)> = loop_rows(program, registry)
        .filter_map(|r| Some((r.k.div_ceil(r.ve?), r.nr)))
        .collect();
    let passes = |vecs: u32| -> Vec<u64> {
        rows.iter()
            .map(|&(n, nr)| n.div_ceil(32 * u64::from((vecs / nr).max(1))))
            .collect()
    };
    let base = passes(DEFAULT_VECS);
    SMALLER_VECS
        .iter()
        .copied()
        .filter(|&v| !rows.is_empty() && passes(v) == base)
        .min()
        .unwrap_or(DEFAULT_VECS)
}
