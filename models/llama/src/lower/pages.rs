//! Scratch-page allocation: binds the transient activations of a lowered program to pages,
//! per [`PageStrategy`] (docs/models.md, "Lowering": `graph_color` must really share pages).
//!
//! Only ACTIVATION buffers outside on-chip memory are paged. The validator refuses any other
//! kind on a page (a weight, a KV cache or an output must keep its contents), and an SMEM or
//! register buffer lives on one SM, not in the global scratch arena. Two buffers may share a
//! page only when their live ranges are happens-before separated: every task that touches
//! the first (reader or writer) is a strict ancestor, in the dependency DAG, of every writer
//! of the second. Validator check 7 asks exactly this.
//!
//! Page sizes are rounded up to [`PAGE_ALIGN`]. The IR has no alignment rule (a page need
//! only be at least as large as each of its buffers), but the reference loader lays out its
//! arena with 256-byte-aligned offsets. Pages sized this way can be packed back to back and
//! keep that alignment.

use crate::error::ModelError;
use amk_core::graph::{Ans, Incidence, Reach, topo_order};
use amk_core::{
    Buffer, BufferId, BufferKind, CounterIndex, MemSpace, Page, PageAllocation, PageId,
    PageStrategy, Program, TaskId,
};

/// Page sizes are multiples of this many bytes.
pub const PAGE_ALIGN: u64 = 256;

/// Graph colouring first asks about each buffer's `WINDOW` most recently dead predecessors
/// (see [`allocate_pages`]).
const WINDOW: usize = 32;
/// Most follow-up rounds of reachability questions the colouring may ask.
const MAX_ROUNDS: usize = 4;
/// Most follow-up questions per buffer and round.
const MAX_EXTRA_PER_BUFFER: usize = 16;
/// Most size classes the lower bound distinguishes.
const LB_CLASSES: usize = 256;

/// What an allocation achieved, for performance notes and tests. Byte counts use page-aligned
/// sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageStats {
    /// Pages created.
    pub pages: usize,
    /// Buffers bound to a page.
    pub paged_buffers: usize,
    /// Bytes the pageable buffers take with no sharing: one region each, as with
    /// [`PageStrategy::None`] or [`PageStrategy::Linear`].
    pub bytes_without_sharing: u64,
    /// Bytes the allocation takes: the sum of page sizes (equal to `bytes_without_sharing`
    /// for `None`).
    pub bytes_with_sharing: u64,
    /// A lower bound on `bytes_with_sharing` for any valid sharing of the written pageable
    /// buffers. Writer-less ones keep a page of their own, and their bytes are added.
    /// Buffers whose spans [first writer, last use] overlap at one point of a topological
    /// order can never share a page. So if, at some point, `m` such buffers are at least
    /// `s` bytes each, then at least `m` pages are at least `s` bytes. The bound is the
    /// smallest page multiset meeting every such requirement. It ignores ordering that the
    /// interval view cannot see, such as parallel branches that never meet, so it can be
    /// loose. `None` if the program has a cycle.
    pub lower_bound_bytes: Option<u64>,
}

/// Binds pageable buffers to pages and replaces `p.pages`; returns what the allocation
/// achieved.
///
/// * [`PageStrategy::None`]: `p.pages = None`; every activation keeps its own memory.
/// * [`PageStrategy::Linear`]: one page per pageable buffer, in buffer order, sized to
///   the buffer.
/// * [`PageStrategy::GraphColor`]: pages are shared between happens-before separated
///   buffers.
///
/// # Graph colouring
///
/// Buffers with writers are visited in order of their first writer's position in the
/// topological order ([`amk_core::graph::topo_order`]), ties by id. Each page holds a chain
/// of buffers, and a buffer may join a page when the page's most recent member is separated
/// from it: every use of that member happens-before every writer of the buffer. By
/// transitivity the buffer is then separated from every earlier member, and this chain is
/// exactly what the validator checks. Among the pages the buffer may join, the smallest one
/// at least as large as the buffer is chosen; failing that, the largest, so the page grows
/// least. Joining a page never costs more than opening a new one. A buffer opens a new page
/// only when no page is free for it. Writer-less pageable buffers get a page each: they are
/// unused, or read without a producer, which the validator refuses anyway.
///
/// Separation questions go to [`amk_core::graph::Reach`], which answers them in batches by
/// propagating 64-task blocks of ancestors. Four reductions keep the batches small:
/// * Tasks that signal the same counter have the same descendants, so the uses of a buffer
///   are asked about through one task per distinct `out_counter`.
/// * Tasks that wait on the same set of counters have the same ancestors, so writers are
///   asked about through one task per distinct wait set. A projection's 64 tiles become one
///   question each way.
/// * Each buffer's horizon is the latest topological position that every one of its uses
///   can still reach. Once a later buffer's first writer comes after it, the buffer can
///   never precede anything on a page. Its page is closed, and nothing asks about it again.
///   This covers, for example, outputs that nothing reads.
/// * The first batch asks, for each buffer, only about the `WINDOW` (32) buffers whose last
///   uses come latest before its first writer. A buffer whose last use comes at or after
///   another buffer's first writer can never precede it on a page. The greedy pass then
///   runs on these answers. Pages it wanted to check but could not (at most
///   `MAX_EXTRA_PER_BUFFER` (16) per buffer, their last member being outside the window)
///   are asked about in a follow-up round, and the greedy pass runs again, for at most
///   `MAX_ROUNDS` (4) rounds. Questions still unanswered count as "not separated", which
///   can only cost memory and never correctness. On decode graphs the first round already
///   answers everything the greedy pass needs.
///
/// The output is deterministic. Pages are in the order they are opened, and the page table
/// is in buffer order.
///
/// Errors ([`ModelError::Lower`]): task ids that differ from their positions, and, for graph
/// colouring, a cyclic dependency graph.
pub fn allocate_pages(p: &mut Program, strategy: PageStrategy) -> Result<PageStats, ModelError> {
    if let Some((i, t)) = p
        .tasks
        .iter()
        .enumerate()
        .find(|(i, t)| t.id as usize != *i)
    {
        return Err(ModelError::Lower(format!(
            "page allocation needs canonical task ids, but task #{i} has id {}",
            t.id
        )));
    }
    let ctx = Ctx::new(p);
    let pageable: Vec<BufferId> = p
        .buffers
        .iter()
        .enumerate()
        .filter(|(_, b)| is_pageable(b))
        .map(|(i, _)| i as BufferId)
        .collect();
    let bytes_without_sharing = pageable
        .iter()
        .map(|&b| aligned(p.buffers[b as usize].nbytes()))
        .fold(0u64, u64::saturating_add);
    let lower_bound_bytes = ctx.as_ref().map(|c| c.lower_bound(p, &pageable));
    let alloc = match strategy {
        PageStrategy::None => None,
        PageStrategy::Linear => Some(linear(p, &pageable)),
        PageStrategy::GraphColor => {
            let Some(ctx) = ctx else {
                return Err(ModelError::Lower(
                    "graph-colour page allocation needs an acyclic dependency graph".into(),
                ));
            };
            Some(ctx.graph_color(p, &pageable))
        }
    };
    let stats = PageStats {
        pages: alloc.as_ref().map_or(0, |a| a.pages.len()),
        paged_buffers: alloc.as_ref().map_or(0, |a| a.buffer_to_page.len()),
        bytes_without_sharing,
        bytes_with_sharing: alloc.as_ref().map_or(bytes_without_sharing, |a| {
            a.pages
                .iter()
                .map(|pg| pg.nbytes)
                .fold(0u64, u64::saturating_add)
        }),
        lower_bound_bytes,
    };
    p.pages = alloc;
    Ok(stats)
}

/// Whether a buffer may live in a shared scratch page.
fn is_pageable(b: &Buffer) -> bool {
    b.kind == BufferKind::ACTIVATION && !b.space.is_on_chip()
}

/// `n` rounded up to [`PAGE_ALIGN`] (saturating).
fn aligned(n: u64) -> u64 {
    n.div_ceil(PAGE_ALIGN).saturating_mul(PAGE_ALIGN)
}

/// The smallest and largest task id among `uses` (`(-1, -1)` if empty).
fn id_span(uses: impl Iterator<Item = TaskId>) -> (i64, i64) {
    uses.fold((-1i64, -1i64), |(lo, hi), t| {
        let t = i64::from(t);
        (if lo < 0 { t } else { lo.min(t) }, hi.max(t))
    })
}

fn new_page(id: usize, nbytes: u64, span: (i64, i64)) -> Page {
    Page {
        id: id as PageId,
        space: MemSpace::GLOBAL_SCRATCH,
        nbytes,
        live_start: span.0,
        live_end: span.1,
    }
}

/// One page per pageable buffer, in buffer order.
fn linear(p: &Program, pageable: &[BufferId]) -> PageAllocation {
    let writers = Incidence::writers(p);
    let readers = Incidence::readers(p);
    let mut pa = PageAllocation::default();
    for (i, &b) in pageable.iter().enumerate() {
        let span = id_span(
            writers[b as usize]
                .iter()
                .chain(&readers[b as usize])
                .copied(),
        );
        pa.pages
            .push(new_page(i, aligned(p.buffers[b as usize].nbytes()), span));
        pa.buffer_to_page.push((b, i as PageId));
    }
    pa
}

/// A written pageable buffer as the colouring sees it.
struct Live {
    buffer: BufferId,
    /// Aligned size.
    bytes: u64,
    /// Topological position of its first writer.
    start: u32,
    /// Topological position of its last use.
    end: u32,
    /// One user per distinct `out_counter` (same descendants).
    use_reps: Vec<TaskId>,
    /// One writer per distinct wait set (same ancestors).
    writer_reps: Vec<TaskId>,
    /// The latest topological position any use can reach (−1: some use reaches nothing).
    /// A buffer whose first writer comes after this can never follow this one on a page.
    horizon: i64,
}

/// The dependency graph of an acyclic program, prepared once.
struct Ctx {
    idx: CounterIndex,
    order: Vec<TaskId>,
    pos: Vec<u32>,
    writers: Incidence,
    readers: Incidence,
    /// Per task, the largest topological position among its strict descendants (−1: none).
    reach_max: Vec<i64>,
}

impl Ctx {
    /// `None` if the program has a cycle.
    fn new(p: &Program) -> Option<Ctx> {
        let idx = CounterIndex::new(p);
        let order = topo_order(p, &idx)?;
        let mut pos = vec![0u32; p.tasks.len()];
        for (i, &t) in order.iter().enumerate() {
            pos[t as usize] = i as u32;
        }
        // Descendants' furthest position, in reverse topological order: every waiter of a
        // counter comes after all of its producers.
        let mut reach_max = vec![-1i64; p.tasks.len()];
        let mut ctr_max = vec![-1i64; idx.n_counters()];
        for (i, &t) in order.iter().enumerate().rev() {
            let task = &p.tasks[t as usize];
            let own = ctr_max
                .get(task.out_counter as usize)
                .copied()
                .unwrap_or(-1);
            reach_max[t as usize] = own;
            let mine = own.max(i as i64);
            for w in &task.waits {
                if let Some(c) = ctr_max.get_mut(w.counter as usize) {
                    *c = (*c).max(mine);
                }
            }
        }
        Some(Ctx {
            idx,
            order,
            pos,
            writers: Incidence::writers(p),
            readers: Incidence::readers(p),
            reach_max,
        })
    }

    fn uses(&self, b: BufferId) -> impl Iterator<Item = TaskId> + '_ {
        self.writers[b as usize]
            .iter()
            .chain(&self.readers[b as usize])
            .copied()
    }

    /// The colouring's view of a pageable buffer, `None` when nothing writes it.
    fn live(&self, p: &Program, b: BufferId) -> Option<Live> {
        let ws = &self.writers[b as usize];
        let start = ws.iter().map(|&w| self.pos[w as usize]).min()?;
        let end = self
            .uses(b)
            .map(|t| self.pos[t as usize])
            .max()
            .unwrap_or(start);
        // Uses: one per out_counter, the latest in the order (any member answers the same).
        let mut by_ctr: Vec<(u32, u32, TaskId)> = self
            .uses(b)
            .map(|t| (p.tasks[t as usize].out_counter, self.pos[t as usize], t))
            .collect();
        by_ctr.sort_unstable_by(|a, b| {
            (a.0, std::cmp::Reverse(a.1)).cmp(&(b.0, std::cmp::Reverse(b.1)))
        });
        by_ctr.dedup_by_key(|x| x.0);
        let use_reps: Vec<TaskId> = by_ctr.into_iter().map(|(_, _, t)| t).collect();
        let horizon = use_reps
            .iter()
            .map(|&u| self.reach_max[u as usize])
            .min()
            .unwrap_or(-1);
        // Writers: one per distinct set of waited counters, the earliest in the order.
        let mut by_waits: Vec<(Vec<u32>, u32, TaskId)> = ws
            .iter()
            .map(|&w| {
                let mut key: Vec<u32> = p.tasks[w as usize]
                    .waits
                    .iter()
                    .map(|x| x.counter)
                    .collect();
                key.sort_unstable();
                key.dedup();
                (key, self.pos[w as usize], w)
            })
            .collect();
        by_waits.sort_unstable();
        by_waits.dedup_by(|a, b| a.0 == b.0);
        let writer_reps = by_waits.into_iter().map(|(_, _, w)| w).collect();
        Some(Live {
            buffer: b,
            bytes: aligned(p.buffers[b as usize].nbytes()),
            start,
            end,
            use_reps,
            writer_reps,
            horizon,
        })
    }

    /// See [`PageStats::lower_bound_bytes`].
    fn lower_bound(&self, p: &Program, pageable: &[BufferId]) -> u64 {
        // Spans [first writer, last use] in the topological order; written buffers only.
        let mut spans: Vec<(u32, u32, u64)> = Vec::new();
        let mut unwritten = 0u64;
        for &b in pageable {
            let bytes = aligned(p.buffers[b as usize].nbytes());
            let ws = &self.writers[b as usize];
            let Some(start) = ws.iter().map(|&w| self.pos[w as usize]).min() else {
                unwritten = unwritten.saturating_add(bytes);
                continue;
            };
            let end = self
                .uses(b)
                .map(|t| self.pos[t as usize])
                .max()
                .unwrap_or(start);
            spans.push((start, end, bytes));
        }
        // Size classes, largest first: the distinct sizes, or LB_CLASSES of them spread
        // over the range when there are more (sizes are then rounded down to a class,
        // which keeps the bound valid).
        let mut sizes: Vec<u64> = spans.iter().map(|s| s.2).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes.dedup();
        if sizes.len() > LB_CLASSES {
            let n = sizes.len();
            sizes = (0..LB_CLASSES)
                .map(|i| sizes[i * (n - 1) / (LB_CLASSES - 1)])
                .collect();
            sizes.dedup();
        }
        let class = |bytes: u64| sizes.iter().position(|&t| t <= bytes);
        // Sweep: a span adds at `start` and leaves at `end + 1`; removals sort first.
        let mut events: Vec<(u32, bool, usize)> = Vec::new();
        for &(start, end, bytes) in &spans {
            if let Some(c) = class(bytes) {
                events.push((start, true, c));
                events.push((end.saturating_add(1), false, c));
            }
        }
        events.sort_unstable();
        let mut active = vec![0u64; sizes.len()];
        // most[j]: the most spans of class <= j (size >= sizes[j]) overlapping at one point.
        let mut most = vec![0u64; sizes.len()];
        for (_, add, c) in events {
            if add {
                active[c] += 1;
                let mut cum = 0u64;
                for (j, m) in most.iter_mut().enumerate() {
                    cum += active[j];
                    *m = (*m).max(cum);
                }
            } else {
                active[c] = active[c].saturating_sub(1);
            }
        }
        // At least most[j] pages are >= sizes[j]; the i-th largest page is at least the
        // largest class j with most[j] >= i.
        let mut bound = 0u64;
        let mut prev = 0u64;
        for (j, &m) in most.iter().enumerate() {
            if m > prev {
                bound = bound.saturating_add(sizes[j].saturating_mul(m - prev));
                prev = m;
            }
        }
        bound.saturating_add(unwritten)
    }

    fn graph_color(&self, p: &Program, pageable: &[BufferId]) -> PageAllocation {
        let mut lives: Vec<Live> = Vec::new();
        let mut unwritten: Vec<BufferId> = Vec::new();
        for &b in pageable {
            match self.live(p, b) {
                Some(l) => lives.push(l),
                None => unwritten.push(b),
            }
        }
        lives.sort_by_key(|l| (l.start, l.buffer));
        let m = lives.len();

        // First-round candidates: the WINDOW latest-ending buffers that end before each
        // buffer starts and whose horizon reaches it (scanning at most 4 × WINDOW).
        let mut by_end: Vec<(u32, BufferId, usize)> = lives
            .iter()
            .enumerate()
            .map(|(k, l)| (l.end, l.buffer, k))
            .collect();
        by_end.sort_unstable();
        let mut ask: Vec<Vec<u32>> = Vec::with_capacity(m);
        let mut ptr = 0usize;
        for l in &lives {
            while ptr < by_end.len() && by_end[ptr].0 < l.start {
                ptr += 1;
            }
            let lo = ptr.saturating_sub(4 * WINDOW);
            ask.push(
                by_end[lo..ptr]
                    .iter()
                    .rev()
                    .filter(|e| lives[e.2].horizon >= i64::from(l.start))
                    .take(WINDOW)
                    .map(|e| e.2 as u32)
                    .collect(),
            );
        }

        // answers[k]: (earlier buffer index, separated?) sorted by index.
        let mut answers: Vec<Vec<(u32, bool)>> = vec![Vec::new(); m];
        let mut result = Colouring::default();
        for round in 0..MAX_ROUNDS {
            let mut reach = Reach::new(p, &self.idx, &self.order);
            let mut asked: Vec<(usize, u32, Ans)> = Vec::new();
            for (k, cands) in ask.iter().enumerate() {
                for &a in cands {
                    let q = reach.ask_all(&lives[a as usize].use_reps, &lives[k].writer_reps);
                    asked.push((k, a, q));
                }
            }
            reach.resolve();
            for (k, a, q) in asked {
                answers[k].push((a, reach.answer(q)));
            }
            for list in &mut answers {
                list.sort_unstable();
                list.dedup_by_key(|x| x.0);
            }
            let (colouring, missing) = greedy(&lives, &answers);
            result = colouring;
            if missing.iter().all(Vec::is_empty) || round + 1 == MAX_ROUNDS {
                break;
            }
            ask = missing;
        }

        // Assemble pages and the table.
        let mut pages: Vec<Page> = result
            .pages
            .iter()
            .enumerate()
            .map(|(i, pg)| new_page(i, pg.bytes, (-1, -1)))
            .collect();
        let mut table: Vec<(BufferId, PageId)> = Vec::with_capacity(pageable.len());
        for (k, l) in lives.iter().enumerate() {
            let pg = result.page_of[k];
            table.push((l.buffer, pg as PageId));
            let span = id_span(self.uses(l.buffer));
            let page = &mut pages[pg];
            if page.live_start < 0 || (span.0 >= 0 && span.0 < page.live_start) {
                page.live_start = span.0;
            }
            page.live_end = page.live_end.max(span.1);
        }
        for b in unwritten {
            let id = pages.len();
            let span = id_span(self.uses(b));
            pages.push(new_page(id, aligned(p.buffers[b as usize].nbytes()), span));
            table.push((b, id as PageId));
        }
        table.sort_unstable();
        PageAllocation {
            buffer_to_page: table,
            pages,
        }
    }
}

/// A page under construction.
#[derive(Debug, Clone, Copy)]
struct OpenPage {
    bytes: u64,
    /// Index (into the sorted buffers) of its most recent member.
    last: usize,
}

#[derive(Debug, Default)]
struct Colouring {
    pages: Vec<OpenPage>,
    /// Page of each sorted buffer.
    page_of: Vec<usize>,
}

/// The greedy pass over buffers sorted by first writer. Uses only answered questions. Also
/// returns, per buffer, the page tails it could not check (at most
/// `MAX_EXTRA_PER_BUFFER`, the latest-ending first).
///
/// Pages are indexed by their tail's end (to find tails that end before a buffer starts) and
/// by their tail's horizon. A page whose tail's horizon falls before the current buffer's
/// first writer is closed for good, since later buffers start later still. This keeps the
/// pass near-linear even when many pages are blocked forever, such as pages holding outputs
/// nothing reads.
fn greedy(lives: &[Live], answers: &[Vec<(u32, bool)>]) -> (Colouring, Vec<Vec<u32>>) {
    use std::collections::BTreeSet;
    let mut c = Colouring {
        pages: Vec::new(),
        page_of: Vec::with_capacity(lives.len()),
    };
    let mut missing: Vec<Vec<u32>> = vec![Vec::new(); lives.len()];
    // Open pages by (tail end, page) and by (tail horizon, page).
    let mut by_end: BTreeSet<(u32, usize)> = BTreeSet::new();
    let mut by_horizon: BTreeSet<(i64, usize)> = BTreeSet::new();
    // The open page whose tail is this buffer, if any.
    let mut tail_page: Vec<Option<usize>> = vec![None; lives.len()];
    for (k, l) in lives.iter().enumerate() {
        // Close the pages no buffer from here on can join.
        while let Some(&(h, pg)) = by_horizon.first() {
            if h >= i64::from(l.start) {
                break;
            }
            by_horizon.pop_first();
            let tail = c.pages[pg].last;
            by_end.remove(&(lives[tail].end, pg));
            tail_page[tail] = None;
        }
        // Pages known to be free: tails answered "separated" that are still open tails.
        // Best page: (needs no growth? smallest : largest), then lowest id.
        let mut best: Option<(usize, (bool, u64))> = None;
        for &(a, sep) in &answers[k] {
            let Some(pg) = tail_page[a as usize].filter(|_| sep) else {
                continue;
            };
            let bytes = c.pages[pg].bytes;
            let key = if bytes >= l.bytes {
                (false, bytes)
            } else {
                (true, u64::MAX - bytes)
            };
            if best.is_none_or(|(bp, bk)| (key, pg) < (bk, bp)) {
                best = Some((pg, key));
            }
        }
        // Open tails ending before this buffer starts that were never asked about, latest
        // first.
        let mut unknown: Vec<u32> = Vec::new();
        for &(_, pg) in by_end.range(..(l.start, 0)).rev() {
            let tail = c.pages[pg].last as u32;
            if answers[k].binary_search_by_key(&tail, |x| x.0).is_err() {
                unknown.push(tail);
                if unknown.len() >= MAX_EXTRA_PER_BUFFER {
                    break;
                }
            }
        }
        missing[k] = unknown;
        let pg = match best {
            Some((pg, _)) => {
                let old = c.pages[pg].last;
                by_end.remove(&(lives[old].end, pg));
                by_horizon.remove(&(lives[old].horizon, pg));
                tail_page[old] = None;
                let page = &mut c.pages[pg];
                page.bytes = page.bytes.max(l.bytes);
                page.last = k;
                pg
            }
            None => {
                c.pages.push(OpenPage {
                    bytes: l.bytes,
                    last: k,
                });
                c.pages.len() - 1
            }
        };
        by_end.insert((l.end, pg));
        by_horizon.insert((l.horizon, pg));
        tail_page[k] = Some(pg);
        c.page_of.push(pg);
    }
    (c, missing)
}
