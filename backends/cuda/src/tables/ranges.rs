//! The weight rows a projection tile streams, as address ranges: the shared-memory ring's
//! copies started before a tile's wait and the L2 prefetch ranges (both off by default:
//! measured slower, docs/perf-notes.md rounds 3, 6 and 15).

use super::Placement;
use crate::abi::{AmkBuffer, AmkInstruction, AmkParams, AmkPrefetch, L2_RANGES};
use amk_core::Opcode;

/// Per buffer: a model weight that no instruction of the program writes (so no counter
/// orders a read of it: a task may start reading it before its waits).
fn constant_weights(
    instructions: &[AmkInstruction],
    descs: &[AmkBuffer],
    placement: &[Placement],
) -> Vec<bool> {
    let mut constant: Vec<bool> = (0..descs.len())
        .map(|b| matches!(placement.get(b), Some(Placement::Weight(_))) && descs[b].ptr != 0)
        .collect();
    for r in instructions {
        for &o in r.outputs.iter().take(r.n_outputs.max(0) as usize) {
            if let Some(w) = usize::try_from(o).ok().and_then(|i| constant.get_mut(i)) {
                *w = false;
            }
        }
    }
    constant
}

/// Rows `[first, first + count)` of the `[rows, k]` float weight `descs[id]` as a device
/// byte range, when `id` is a constant weight of a float dtype and the rows lie inside it.
fn weight_rows(
    descs: &[AmkBuffer],
    constant: &[bool],
    id: i32,
    k: i32,
    first: u64,
    count: u64,
) -> Option<AmkPrefetch> {
    let b = usize::try_from(id)
        .ok()
        .filter(|&b| constant.get(b) == Some(&true))?;
    let w = &descs[b];
    let esize: u64 = match w.dtype {
        0 => 4,
        1 | 2 => 2,
        _ => return None,
    };
    let k = u64::try_from(k).ok().filter(|&k| k > 0)?;
    let rows = w.numel.max(0) as u64 / k;
    if count == 0 || first + count > rows {
        return None;
    }
    Some(AmkPrefetch {
        addr: w.ptr + first * k * esize,
        bytes: count * k * esize,
    })
}

/// Per instruction, the weight rows a GEMV tile streams (device address and bytes, from its
/// input 1 and its `K`, `N_tile`, `n_off`), which the scheduler starts copying into shared
/// memory before the task's wait; zero for every other task. `descs` carry device addresses.
///
/// Listed only where starting early is safe and the ring will take it: GEMV_TILE over a float
/// weight (F32/F16/BF16) bound from the model's tensors, that no instruction of the program
/// writes (so no counter orders it), with the row range inside the buffer. The device checks
/// the rest (alignment, one row of x) and waits out the copies of a tile it does not stream.
pub fn prefetch_ranges(
    instructions: &[AmkInstruction],
    descs: &[AmkBuffer],
    placement: &[Placement],
) -> Vec<AmkPrefetch> {
    let none = AmkPrefetch { addr: 0, bytes: 0 };
    let constant = constant_weights(instructions, descs, placement);
    instructions
        .iter()
        .map(|r| {
            if r.op != i32::from(Opcode::GEMV_TILE.0) || r.n_inputs < 2 {
                return none;
            }
            streamed_rows(r)
                .first()
                .and_then(|&(i, first, count)| {
                    weight_rows(descs, &constant, r.inputs[i], r.params.k, first, count)
                })
                .unwrap_or(none)
        })
        .collect()
}

/// The weight row ranges a task of a built-in projection op streams, in the order it reads
/// them: `(input, first row, rows)`. Empty for every other op (and for malformed params: the
/// device reports those when the program is loaded, in the megakernel's check mode).
fn streamed_rows(r: &AmkInstruction) -> Vec<(usize, u64, u64)> {
    let p = &r.params;
    if p.n_tile <= 0 || p.n_off < 0 {
        return Vec::new();
    }
    let (off, n) = (p.n_off as u64, p.n_tile as u64);
    let op = Opcode(r.op.clamp(0, i32::from(u16::MAX)) as u16);
    match op {
        Opcode::GEMV_TILE => vec![(1, off, n)],
        Opcode::RMSNORM_GEMV => vec![(2, off, n)],
        Opcode::GATE_UP_SILU => vec![(1, off, n), (2, off, n)],
        Opcode::QKV_ROPE_APPEND => qkv_rows(p, off, n),
        _ => Vec::new(),
    }
}

/// QKV_ROPE_APPEND's units `[off, off + n)` as weight rows (op_qkv_rope_append's numbering:
/// unit `u` is row `i + (u mod 2)·hd/2` of head `u div hd`, `i = (u mod hd) div 2`; heads are
/// Q's, then K's, then V's), merged into runs of consecutive rows of one weight.
fn qkv_rows(p: &AmkParams, off: u64, n: u64) -> Vec<(usize, u64, u64)> {
    let (hd, nh, nkv) = (p.head_dim, p.n_heads, p.n_kv_heads);
    if hd <= 0 || hd % 2 != 0 || nh <= 0 || nkv <= 0 {
        return Vec::new();
    }
    let (hd, nh, nkv) = (hd as u64, nh as u64, nkv as u64);
    let mut runs: Vec<(usize, u64, u64)> = Vec::new();
    for u in off..off + n {
        let head = u / hd;
        let row = (u % hd) / 2 + (u % 2) * (hd / 2);
        let (input, h) = if head < nh {
            (1, head)
        } else if head < nh + nkv {
            (2, head - nh)
        } else if head < nh + 2 * nkv {
            (3, head - nh - nkv)
        } else {
            break;
        };
        let row = h * hd + row;
        match runs
            .iter_mut()
            .find(|(i, f, c)| *i == input && *f + *c == row)
        {
            Some(run) => run.2 += 1,
            None => runs.push((input, row, 1)),
        }
    }
    runs
}

/// Which tasks wait on a counter an attention task (ATTENTION_TILE, ATTENTION_COMBINE) signals:
/// in decode, the projection after each layer's attention. With the attention on an SM of its
/// own, the memory system is idle while it runs, so these tasks' weights can be pulled into L2
/// then ([`keep_ranges`]; docs/perf-notes.md round 12).
pub fn waits_on_attention(instructions: &[AmkInstruction]) -> Vec<bool> {
    let attention = [Opcode::ATTENTION_TILE, Opcode::ATTENTION_COMBINE].map(|o| i32::from(o.0));
    let signalled: std::collections::HashSet<i32> = instructions
        .iter()
        .filter(|r| attention.contains(&r.op) && r.out_counter >= 0)
        .map(|r| r.out_counter)
        .collect();
    instructions
        .iter()
        .map(|r| {
            let n = usize::try_from(r.n_waits)
                .unwrap_or(0)
                .min(r.wait_counter.len());
            r.wait_counter[..n].iter().any(|c| signalled.contains(c))
        })
        .collect()
}

/// Which tasks keep their [`l2_ranges`]: those `tasks` selects (every task, only those that
/// [`waits_on_attention`] marks, or every other one) whose op is in `ops` (empty: any op).
pub fn prefetch_keep(
    instructions: &[AmkInstruction],
    tasks: crate::L2PrefetchTasks,
    ops: &[Opcode],
) -> Vec<bool> {
    use crate::L2PrefetchTasks as T;
    let after = match tasks {
        T::All => vec![false; instructions.len()],
        T::AfterAttention | T::NotAfterAttention => waits_on_attention(instructions),
    };
    instructions
        .iter()
        .zip(after)
        .map(|(r, after)| {
            let by_attention = match tasks {
                T::All => true,
                T::AfterAttention => after,
                T::NotAfterAttention => !after,
            };
            by_attention && (ops.is_empty() || ops.iter().any(|o| i32::from(o.0) == r.op))
        })
        .collect()
}

/// Clears the [`l2_ranges`] of every task `keep` does not mark.
pub fn keep_ranges(ranges: &mut [AmkPrefetch], keep: &[bool]) {
    for (t, task) in ranges.chunks_mut(L2_RANGES).enumerate() {
        if !keep.get(t).copied().unwrap_or(false) {
            task.fill(AmkPrefetch { addr: 0, bytes: 0 });
        }
    }
}

/// Byte ranges per instruction ([`L2_RANGES`] each, unused ones zero) of the weights the task
/// streams, which the scheduler pulls into L2 (after the task's wait, or before it with
/// [`crate::abi::PROG_L2_PREFETCH_EARLY`]) so that the tile's first loads find their lines on
/// the way. Off by default: every variant measured slower on the H100 (docs/perf-notes.md
/// round 6). Each task gets at most `cap` bytes, shared among its ranges in proportion to their
/// sizes (a fused tile reads its weights side by side); `cap` 0 lists nothing. Only constant
/// float weights are listed (see [`prefetch_ranges`]); a prefetch is a hint and never faults.
pub fn l2_ranges(
    instructions: &[AmkInstruction],
    descs: &[AmkBuffer],
    placement: &[Placement],
    cap: u64,
) -> Vec<AmkPrefetch> {
    let none = AmkPrefetch { addr: 0, bytes: 0 };
    let mut out = vec![none; instructions.len() * L2_RANGES];
    if cap == 0 {
        return out;
    }
    let constant = constant_weights(instructions, descs, placement);
    for (t, r) in instructions.iter().enumerate() {
        let ranges: Vec<AmkPrefetch> = streamed_rows(r)
            .into_iter()
            .filter_map(|(i, first, count)| {
                let id = *r.inputs.get(i).filter(|_| (i as i32) < r.n_inputs)?;
                weight_rows(descs, &constant, id, r.params.k, first, count)
            })
            .take(L2_RANGES)
            .collect();
        let total: u64 = ranges.iter().map(|g| g.bytes).sum();
        for (k, g) in ranges.iter().enumerate() {
            let bytes = if total <= cap {
                g.bytes
            } else {
                (g.bytes as u128 * cap as u128 / total as u128) as u64
            };
            out[t * L2_RANGES + k] = AmkPrefetch {
                addr: g.addr,
                bytes,
            };
        }
    }
    out
}
