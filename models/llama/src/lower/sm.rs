//! SM assignment: writes `Task.sm` for every task of a lowered program, per
//! [`SmAssignment`] (docs/models.md, "Lowering": every knob takes effect).
//!
//! A persistent kernel gives each SM a queue that it runs serially, in task-list order. The
//! validator (check 6) accepts an assignment only if dependency edges plus "next in the same
//! queue" edges stay acyclic. Every strategy here keeps each queue in task-list order and
//! first checks that the task list is topological (every producer listed before each of its
//! consumers). A queue is then a subsequence of a topological order, so it is a linear
//! extension of the DAG, and every queue edge and every dependency edge points forward in
//! the list. The combined graph is acyclic whatever SM each task gets.
//!
//! Tasks sharing an on-chip (SMEM/REGISTER) buffer must run on one SM (validator check 5b).
//! The round-robin and load-balance strategies place such a group together, on the SM picked
//! for its first task. An explicit map is taken exactly as given.
//!
//! # Load balancing
//!
//! Decode on a persistent kernel is a sequence of short phases: the tiles of one projection
//! all become ready together, stream their weights in parallel, and then one small task (a
//! norm, ROPE, an add) joins them. A phase lasts as long as its most loaded SM. Balancing
//! only each SM's total `est_bytes` over the whole program (plain LPT, as in the reference
//! loader) can give one SM two tiles of a phase while another SM is idle, as long as the
//! totals even out over the program. Tiny tasks cost almost nothing in bytes, so plain LPT
//! places them anywhere, possibly behind a long queue.
//!
//! The model used here: each SM has a time at which its queue is drained (`avail`), and a
//! task is ready when every producer it waits on has finished. A task of cost `est_bytes +
//! TASK_OVERHEAD_BYTES` goes to the SM where it can start earliest, `max(avail, ready)`.
//! Ties are broken by opcode affinity (below), then the SM's cumulative `est_bytes`, then
//! `est_flops`, then task count, then the lowest SM id. In effect:
//! * the tiles of a projection spread over idle SMs (one each while idle SMs remain), and
//!   among the idle SMs the least loaded overall are picked, so the weight streams rotate
//!   over the chip and a busy SM's queue does not grow;
//! * a small join task lands on an SM that is idle when its inputs are complete, never
//!   behind another phase's tiles;
//! * among SMs that could start a task equally early, the one that ran the last task of the
//!   same opcode wins first: a decode layer's single attention task then runs on one SM
//!   layer after layer, whose instruction cache still holds its code (docs/perf-notes.md
//!   round 7);
//! * when every task is ready at once (no waits), every SM's start time is `avail` and
//!   this is the classic LPT greedy over `est_bytes`.
//!
//! The result is deterministic. The cost is O(tasks × num_sms).
//!
//! # Reserved SMs
//!
//! [`assign_sms_reserving`] sets the last SMs of the grid aside for some opcodes (the lowering's
//! `tiling.attention.own_sms`: a layer's attention on SMs that run nothing else). Those tasks go
//! only there and every other task only elsewhere, under each strategy but the explicit map,
//! which is taken as given; tasks that must share an SM (an on-chip buffer) on both sides of
//! the reservation are refused. Why: the block that runs a layer's attention finishes it last, so
//! any projection tile it runs next starts late (its code cold, its stage still to check) and
//! ends the next phase late too (docs/perf-notes.md round 10).
//!
//! # Alternating phases
//!
//! With [`Reserve::alternate`] (a lowering that tiles a layer's projections for half the SMs),
//! the load-balancing tie-break first takes, among SMs that can start a task equally early,
//! the one idle longest: a phase then lands on SMs that sat out the phase before, and its
//! tiles load their weights and wait while that phase runs, instead of starting on an SM that
//! is still finishing it. A task that waits on a reserved task (the output projection after
//! the attention) takes the SM busy last instead, that is, the Q/K/V tiles' SMs: the gate/up
//! tiles, which come next, then load their weights before the attention rather than beside it,
//! where they slow it (docs/perf-notes.md round 21).

use crate::error::ModelError;
use amk_core::{Opcode, Program, SmAssignment, Task};
use std::collections::HashMap;

/// The fixed cost of one task in the [`SmAssignment::LoadBalance`] timing model, in the same
/// unit as `est_bytes`. It stands for the counter wait, the signal and the instruction
/// dispatch that every task pays. It keeps zero-byte tasks (reshapes, ROPE) from counting as
/// free, but is small next to any GEMV tile.
pub const TASK_OVERHEAD_BYTES: u64 = 2048;

/// How many offending entries an error message lists before it gives a count.
const LIST_LIMIT: usize = 10;

/// Assigns every task of `p` an SM in `[0, num_sms)` and overwrites any assignment already
/// there.
///
/// * [`SmAssignment::RoundRobin`]: the i-th task of the task list goes to SM `i % num_sms`.
/// * [`SmAssignment::LoadBalance`]: greedy list scheduling in task-list order over a simple
///   timing model of the persistent kernel. It generalises LPT over `est_bytes`; the module
///   documentation describes the model and why it is used.
/// * [`SmAssignment::Explicit`]: `(task id, sm)` pairs. Every task must be mapped exactly
///   once and every SM must be `< num_sms`.
///
/// Each SM's queue is its tasks in task-list order. The task list must be topological: a
/// lowering emits producers before consumers, and this function refuses a list that breaks
/// that rule.
///
/// Errors ([`ModelError::Lower`]): `num_sms` is 0, larger than `i32::MAX`, or larger than
/// `p.target`'s SM count; the list is not topological; the explicit map is incomplete or
/// inconsistent. On error `p` is left unchanged.
pub fn assign_sms(
    p: &mut Program,
    strategy: &SmAssignment,
    num_sms: u32,
) -> Result<(), ModelError> {
    assign_sms_reserving(p, strategy, num_sms, &Reserve::default())
}

/// SMs set aside for some opcodes: the last `sms` SMs of the grid run the tasks whose op is in
/// `ops`, and nothing else; those tasks run nowhere else. `sms` = 0 reserves nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserve {
    /// The opcodes that run on the reserved SMs.
    pub ops: Vec<Opcode>,
    /// How many SMs, counted from the end of the grid.
    pub sms: u32,
    /// Phases alternate ([`SmAssignment::LoadBalance`] only; see "Alternating phases" in the
    /// module documentation).
    pub alternate: bool,
}

impl Reserve {
    fn holds(&self, t: &Task) -> bool {
        self.sms > 0 && self.ops.contains(&t.op)
    }
}

/// [`assign_sms`] with SMs reserved for some opcodes ([`Reserve`]; the module documentation
/// says why). The explicit map ignores the reservation. Errors as [`assign_sms`], and when the
/// reservation takes every SM of the grid.
pub fn assign_sms_reserving(
    p: &mut Program,
    strategy: &SmAssignment,
    num_sms: u32,
    reserve: &Reserve,
) -> Result<(), ModelError> {
    check_grid(p, num_sms)?;
    check_list_order(p)?;
    if reserve.sms > 0 && reserve.sms >= num_sms {
        return Err(ModelError::Lower(format!(
            "reserving {} SM(s) for {:?} leaves none of the {num_sms} for the other tasks",
            reserve.sms, reserve.ops
        )));
    }
    if reserve.sms > 0 && !matches!(strategy, SmAssignment::Explicit(_)) {
        check_groups_keep_to_one_side(p, reserve)?;
    }
    let sms = match strategy {
        SmAssignment::RoundRobin => round_robin(p, num_sms, reserve),
        SmAssignment::LoadBalance => load_balance(p, num_sms, reserve),
        SmAssignment::Explicit(map) => explicit(p, map, num_sms)?,
    };
    for (t, s) in p.tasks.iter_mut().zip(sms) {
        // `s < num_sms <= i32::MAX` (checked in `check_grid`).
        t.sm = i32::try_from(s).ok();
    }
    Ok(())
}

/// Moves a program's last task, when it is a NEXT_TOKEN, to the SM whose queue without it
/// drains first in the load-balance timing model ([`estimated_makespan`]'s), among SMs
/// `0..first_reserved` (ties: the lowest id). Why: the timing model ties every SM that is free
/// once the logits' summaries are done, and its tie-breaks then give the tail to an SM that
/// summarises a slot, so the task is reached only when the last summary is done, and its
/// dispatch and the work it does before its wait (its checks, the launch's settings) come after
/// that on the tail's critical path (2.9 µs of a 1B-shaped pass, docs/perf-notes.md round 53).
/// On an SM that drains earlier, it is reached while the LM head and the summaries still run.
/// Being last in the list, it is last in any queue, so every queue stays in list order. Does
/// nothing when the last task is another op or some task has no SM.
pub fn seat_next_token_early(p: &mut Program, first_reserved: u32) {
    let Some((last, rest)) = p.tasks.split_last() else {
        return;
    };
    if last.op != Opcode::NEXT_TOKEN || first_reserved == 0 {
        return;
    }
    let Some(model) = run_model(rest, p.counters.len()) else {
        return;
    };
    let drained = |s: u32| model.drained.get(&(s as i32)).copied().unwrap_or(0);
    let best = (0..first_reserved)
        .min_by_key(|&s| (drained(s), s))
        .unwrap_or(0);
    if let Some(t) = p.tasks.last_mut() {
        t.sm = i32::try_from(best).ok();
    }
}

/// Per-SM totals of an assigned program (for tests and performance notes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmLoad {
    /// Sum of `est_bytes` (negative hints count as 0).
    pub bytes: u64,
    /// Sum of `est_flops` (negative hints count as 0).
    pub flops: u64,
    /// Number of tasks.
    pub tasks: u64,
}

/// Totals per SM for SMs `0..num_sms`. Tasks with no SM, or with an SM outside that range,
/// are not counted.
pub fn sm_loads(p: &Program, num_sms: u32) -> Vec<SmLoad> {
    let mut loads = vec![SmLoad::default(); num_sms as usize];
    for t in &p.tasks {
        let Some(l) =
            t.sm.and_then(|s| usize::try_from(s).ok())
                .and_then(|s| loads.get_mut(s))
        else {
            continue;
        };
        l.bytes = l.bytes.saturating_add(hint(t.est_bytes));
        l.flops = l.flops.saturating_add(hint(t.est_flops));
        l.tasks += 1;
    }
    loads
}

/// The finish time of the last task in the load-balance timing model (see the module
/// documentation), for an already assigned program: each SM runs its queue in task-list
/// order, and a task starts once its SM is free and every producer it waits on has finished.
/// Costs are `est_bytes + TASK_OVERHEAD_BYTES`, in bytes. `None` if some task has no SM or
/// the task list is not topological. This compares strategies under one model; it is not a
/// measurement.
pub fn estimated_makespan(p: &Program) -> Option<u64> {
    if check_list_order(p).is_err() {
        return None;
    }
    run_model(&p.tasks, p.counters.len()).map(|m| m.makespan)
}

/// The load-balance timing model run over already assigned tasks.
struct ModelRun {
    /// When each SM (by id) has run its queue.
    drained: HashMap<i32, u64>,
    /// When the last task finishes.
    makespan: u64,
}

/// Runs the timing model over `tasks` in list order (each SM its queue in that order, a task
/// starting once its SM is free and every counter it waits on is complete); `None` if some
/// task has no SM.
fn run_model(tasks: &[Task], n_counters: usize) -> Option<ModelRun> {
    let mut drained: HashMap<i32, u64> = HashMap::new();
    let mut ctr_done = vec![0u64; n_counters];
    let mut makespan = 0u64;
    for t in tasks {
        let slot = drained.entry(t.sm?).or_insert(0);
        let finish = (*slot)
            .max(ready_time(t, &ctr_done))
            .saturating_add(task_cost(t));
        *slot = finish;
        if let Some(c) = ctr_done.get_mut(t.out_counter as usize) {
            *c = (*c).max(finish);
        }
        makespan = makespan.max(finish);
    }
    Some(ModelRun { drained, makespan })
}

/// A cost hint as an unsigned amount (negative hints are meaningless and count as 0).
fn hint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A task's duration in the timing model, in byte-equivalents.
fn task_cost(t: &Task) -> u64 {
    hint(t.est_bytes).saturating_add(TASK_OVERHEAD_BYTES)
}

/// When every counter `t` waits on is complete, given the finish times of the producers
/// scheduled so far (all of them, in a topological list).
fn ready_time(t: &Task, ctr_done: &[u64]) -> u64 {
    t.waits
        .iter()
        .filter_map(|w| ctr_done.get(w.counter as usize))
        .copied()
        .max()
        .unwrap_or(0)
}

fn check_grid(p: &Program, num_sms: u32) -> Result<(), ModelError> {
    if num_sms == 0 {
        return Err(ModelError::Lower(
            "SM assignment needs at least one SM (num_sms is 0)".into(),
        ));
    }
    if i32::try_from(num_sms).is_err() {
        return Err(ModelError::Lower(format!(
            "num_sms {num_sms} does not fit the IR's SM field (at most {})",
            i32::MAX
        )));
    }
    if let Some(t) = &p.target
        && i64::from(num_sms) > t.num_sms
    {
        return Err(ModelError::Lower(format!(
            "num_sms {num_sms} exceeds the target '{}', which has {} SMs",
            t.name, t.num_sms
        )));
    }
    Ok(())
}

/// Refuses a task list in which some task waits on a counter that a task at the same or a
/// later position produces. Queue order is list order, so such a list could deadlock. Waits
/// on counters with no producer, or on counters that do not exist, are left to the validator.
fn check_list_order(p: &Program) -> Result<(), ModelError> {
    let mut last_producer: Vec<Option<usize>> = vec![None; p.counters.len()];
    for (i, t) in p.tasks.iter().enumerate() {
        if let Some(slot) = last_producer.get_mut(t.out_counter as usize) {
            *slot = Some(i);
        }
    }
    let mut bad: Vec<String> = Vec::new();
    let mut count = 0usize;
    for (i, t) in p.tasks.iter().enumerate() {
        for (k, w) in t.waits.iter().enumerate() {
            if t.waits[..k].iter().any(|x| x.counter == w.counter) {
                continue;
            }
            if let Some(Some(j)) = last_producer.get(w.counter as usize)
                && *j >= i
            {
                count += 1;
                if bad.len() < LIST_LIMIT {
                    bad.push(format!(
                        "task {i} waits on counter {} produced by task {j}",
                        w.counter
                    ));
                }
            }
        }
    }
    if count == 0 {
        return Ok(());
    }
    Err(ModelError::Lower(format!(
        "SM assignment needs the task list in topological order (each SM runs its tasks in list order), but {count} wait(s) point at a producer listed at or after the waiter: {}",
        listing(&bad, count)
    )))
}

/// `items` joined, with "… and N more" when `total` exceeds what is listed.
fn listing(items: &[String], total: usize) -> String {
    let mut s = items.join(", ");
    if total > items.len() {
        s.push_str(&format!(", … and {} more", total - items.len()));
    }
    s
}

/// Groups of tasks that must share an SM because they use a common on-chip buffer:
/// `group[t]` is a representative task index (union–find root), `t` itself when the task
/// touches no on-chip buffer.
fn colocation_groups(p: &Program) -> Vec<usize> {
    let n = p.tasks.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    if !p.buffers.iter().any(|b| b.space.is_on_chip()) {
        return parent;
    }
    let mut first_user: Vec<Option<usize>> = vec![None; p.buffers.len()];
    for (i, t) in p.tasks.iter().enumerate() {
        for &b in t.inputs.iter().chain(&t.outputs) {
            let on_chip = p
                .buffers
                .get(b as usize)
                .is_some_and(|x| x.space.is_on_chip());
            if !on_chip {
                continue;
            }
            match first_user[b as usize] {
                None => first_user[b as usize] = Some(i),
                Some(f) => {
                    let (ra, rb) = (root(&mut parent, f), root(&mut parent, i));
                    if ra != rb {
                        // The earlier task stays the root, so a group is keyed by its first
                        // member.
                        let (lo, hi) = (ra.min(rb), ra.max(rb));
                        parent[hi] = lo;
                    }
                }
            }
        }
    }
    (0..n).map(|i| root(&mut parent, i)).collect()
}

/// Tasks that must share an SM (an on-chip buffer) must all run on reserved SMs or all off
/// them: a group that mixes both cannot honour the reservation.
fn check_groups_keep_to_one_side(p: &Program, reserve: &Reserve) -> Result<(), ModelError> {
    // A group is keyed by its first task: each member is compared with it.
    for (i, &g) in colocation_groups(p).iter().enumerate() {
        if reserve.holds(&p.tasks[i]) != reserve.holds(&p.tasks[g]) {
            return Err(ModelError::Lower(format!(
                "tasks {g} and {i} share an on-chip buffer, so they must run on one SM, but only one of them is an op reserved SMs run ({:?})",
                reserve.ops
            )));
        }
    }
    Ok(())
}

/// Round robin by list position: task i goes to SM `i % num_sms`. With SMs reserved, by the
/// task's position among its kind, within the reserved SMs or within the others. A task in an
/// on-chip co-location group follows the group's first task.
fn round_robin(p: &Program, num_sms: u32, reserve: &Reserve) -> Vec<u32> {
    let group = colocation_groups(p);
    let others = (num_sms - reserve.sms) as usize;
    let mut seen = [0usize; 2];
    let mut sms: Vec<u32> = Vec::with_capacity(p.tasks.len());
    for (i, &g) in group.iter().enumerate() {
        let s = if g < i {
            sms[g]
        } else if reserve.sms == 0 {
            (i % others) as u32
        } else if reserve.holds(&p.tasks[i]) {
            seen[1] += 1;
            (others + (seen[1] - 1) % reserve.sms as usize) as u32
        } else {
            seen[0] += 1;
            ((seen[0] - 1) % others) as u32
        };
        sms.push(s);
    }
    sms
}

/// Load balancing (see the module documentation for the model and why it is used).
fn load_balance(p: &Program, num_sms: u32, reserve: &Reserve) -> Vec<u32> {
    // At most one SM per task is ever used, and among SMs nobody has used yet, ties go to the
    // lowest id, so SMs past the task count would never be picked: capping each range (the
    // others, then the reserved ones) changes nothing but the memory and time spent on a huge
    // grid. Slot k < n_other is SM k; slot n_other + j is reserved SM (num_sms - sms) + j.
    let cap = p.tasks.len().max(1);
    let first_reserved = (num_sms - reserve.sms) as usize;
    let n_other = first_reserved.min(cap); // >= 1: the reservation leaves an SM
    let n_sms = n_other + (reserve.sms as usize).min(cap);
    let sm_of = |slot: usize| {
        if slot < n_other {
            slot
        } else {
            first_reserved + (slot - n_other)
        }
    };
    let group = colocation_groups(p);
    let mut avail = vec![0u64; n_sms];
    let mut bytes = vec![0u64; n_sms];
    let mut flops = vec![0u64; n_sms];
    let mut count = vec![0u64; n_sms];
    let mut ctr_done = vec![0u64; p.counters.len()];
    let mut sms: Vec<u32> = Vec::with_capacity(p.tasks.len());
    let mut slot_of: Vec<usize> = Vec::with_capacity(p.tasks.len());
    let mut last_of_op: HashMap<Opcode, usize> = HashMap::new();
    // Counters that reserved tasks signal (alternating phases).
    let mut from_reserved = vec![false; p.counters.len()];
    for (i, t) in p.tasks.iter().enumerate() {
        let ready = ready_time(t, &ctr_done);
        let after_reserved = reserve.alternate
            && t.waits.iter().any(|w| {
                from_reserved
                    .get(w.counter as usize)
                    .copied()
                    .unwrap_or(false)
            });
        if reserve.holds(t)
            && let Some(c) = from_reserved.get_mut(t.out_counter as usize)
        {
            *c = true;
        }
        let g = group[i];
        let s = if g < i {
            slot_of[g]
        } else {
            let range = if reserve.holds(t) {
                n_other..n_sms
            } else {
                0..n_other
            };
            let mut best = range.start;
            let mut best_key = (u64::MAX, u64::MAX, u64::MAX, u64::MAX, u64::MAX, u64::MAX);
            let affine = last_of_op.get(&t.op).copied();
            for s in range {
                let key = (
                    avail[s].max(ready),
                    match (reserve.alternate, after_reserved) {
                        (false, _) => 0,
                        (true, false) => avail[s],
                        (true, true) => u64::MAX - avail[s],
                    },
                    u64::from(affine != Some(s)),
                    bytes[s],
                    flops[s],
                    count[s],
                );
                if key < best_key {
                    best_key = key;
                    best = s;
                }
            }
            best
        };
        let finish = avail[s].max(ready).saturating_add(task_cost(t));
        avail[s] = finish;
        bytes[s] = bytes[s].saturating_add(hint(t.est_bytes));
        flops[s] = flops[s].saturating_add(hint(t.est_flops));
        count[s] += 1;
        last_of_op.insert(t.op, s);
        if let Some(c) = ctr_done.get_mut(t.out_counter as usize) {
            *c = (*c).max(finish);
        }
        slot_of.push(s);
        sms.push(sm_of(s) as u32);
    }
    sms
}

/// Checks an explicit map and returns one SM per task. Collects every problem (unknown
/// task ids, tasks mapped twice, SMs out of range, unmapped tasks) into one error.
fn explicit(p: &Program, map: &[(u32, u32)], num_sms: u32) -> Result<Vec<u32>, ModelError> {
    let n = p.tasks.len();
    let mut sms: Vec<Option<u32>> = vec![None; n];
    let mut unknown: Vec<String> = Vec::new();
    let mut n_unknown = 0usize;
    let mut dup: Vec<String> = Vec::new();
    let mut n_dup = 0usize;
    let mut range: Vec<String> = Vec::new();
    let mut n_range = 0usize;
    for &(t, s) in map {
        if s >= num_sms {
            n_range += 1;
            if range.len() < LIST_LIMIT {
                range.push(format!("task {t} → SM {s}"));
            }
        }
        let Some(slot) = sms.get_mut(t as usize) else {
            n_unknown += 1;
            if unknown.len() < LIST_LIMIT {
                unknown.push(t.to_string());
            }
            continue;
        };
        if slot.is_some() {
            n_dup += 1;
            if dup.len() < LIST_LIMIT {
                dup.push(t.to_string());
            }
            continue;
        }
        *slot = Some(s);
    }
    let unmapped: Vec<usize> = (0..n).filter(|&i| sms[i].is_none()).collect();
    let mut problems: Vec<String> = Vec::new();
    if !unmapped.is_empty() {
        let shown: Vec<String> = unmapped
            .iter()
            .take(LIST_LIMIT)
            .map(|t| t.to_string())
            .collect();
        problems.push(format!(
            "{} task(s) unmapped: {}",
            unmapped.len(),
            listing(&shown, unmapped.len())
        ));
    }
    if n_dup > 0 {
        problems.push(format!(
            "{n_dup} extra entr(y/ies) for task(s) already mapped: {}",
            listing(&dup, n_dup)
        ));
    }
    if n_range > 0 {
        problems.push(format!(
            "{n_range} SM(s) out of range [0, {num_sms}): {}",
            listing(&range, n_range)
        ));
    }
    if n_unknown > 0 {
        problems.push(format!(
            "{n_unknown} entr(y/ies) for task ids that do not exist (the program has {n} tasks): {}",
            listing(&unknown, n_unknown)
        ));
    }
    if !problems.is_empty() {
        return Err(ModelError::Lower(format!(
            "explicit SM map must map every task exactly once to an SM in [0, {num_sms}): {}",
            problems.join("; ")
        )));
    }
    Ok(sms.into_iter().map(|s| s.unwrap_or(0)).collect())
}
