//! Checks 5, 5a and 7: read-after-write provenance, write-after-write, page aliasing —
//! the proofs that need reachability.

use super::*;

/// A task's read of a STATE buffer and, per other writer `w`, the questions "w before the
/// reader?" and "the reader before w?".
struct StateRead {
    task: TaskId,
    buffer: BufferId,
    pairs: Vec<(TaskId, Ans, Ans)>,
}

/// Who writes and who reads each buffer.
struct Uses {
    writers: Incidence,
    readers: Incidence,
}

/// Check 5's questions: per read of a writable buffer (reader, buffer, every other writer
/// before it?), and the STATE buffers' reads apart.
struct Reads {
    plain: Vec<(TaskId, BufferId, Ans)>,
    state: Vec<StateRead>,
}

/// Check 5a's question for one buffer: is each writer, in topological order, before the next?
struct MultiWriter {
    buffer: BufferId,
    /// Every writer signals one counter (their tiles overlap, or they would have passed).
    same_counter: bool,
    links: Vec<Ans>,
}

/// Check 7's questions: each page's chain of buffers and, per consecutive pair, whether every
/// use of the first happens before every write of the second.
struct PageChains {
    chains: Vec<Vec<BufferId>>,
    links: Vec<Vec<Ans>>,
}

impl Validator<'_> {
    // ---- Checks 5, 5a, 7: provenance, write-after-write, pages ------------------------------

    pub(super) fn check_races(&mut self, order: &[TaskId]) {
        let p = self.p;
        let uses = Uses {
            writers: Incidence::writers(p),
            readers: Incidence::readers(p),
        };
        let mut reach = Reach::new(p, self.idx, order);
        // Phase 1: ask every question the three checks need, then answer them in one pass.
        let reads = self.ask_reads(order, &uses, &mut reach);
        let multi = self.ask_multi_writers(&uses, &mut reach);
        let pages = self.ask_page_chains(&uses, &mut reach);
        reach.resolve();
        // Phase 2: decide, and only for failures ask the finer questions messages need.
        self.report_reads(order, &uses, &reads.plain, &reach);
        self.check_state_reads(&reads.state, &reach);
        self.report_multi_writers(order, &uses, &multi, &reach);
        self.report_page_chains(&uses, &pages, &reach);
    }

    /// Check 5's questions: for every read of a writable buffer, whether every other writer
    /// happens before the reader (a STATE buffer's: per other writer, both ways).
    fn ask_reads(&self, order: &[TaskId], uses: &Uses, reach: &mut Reach<'_>) -> Reads {
        let (p, writers) = (self.p, &uses.writers);
        let mut reads: Vec<(TaskId, BufferId, Ans)> = Vec::new();
        let mut state_reads: Vec<StateRead> = Vec::new();
        let mut others: Vec<TaskId> = Vec::new();
        for &t in order {
            let task = &p.tasks[t as usize];
            let overwrites = self.overwrites_slice(task);
            for (i, &b) in task.inputs.iter().enumerate() {
                if task.inputs[..i].contains(&b) || (overwrites && task.outputs.contains(&b)) {
                    continue;
                }
                let Some(buf) = self.buf(b) else { continue };
                if buf.kind.is_read_only() {
                    continue;
                }
                if buf.kind == BufferKind::STATE {
                    let pairs = (writers[b as usize].iter().copied())
                        .filter(|&w| w != t)
                        .map(|w| (w, reach.ask(w, t), reach.ask(t, w)))
                        .collect();
                    state_reads.push(StateRead {
                        task: t,
                        buffer: b,
                        pairs,
                    });
                    continue;
                }
                others.clear();
                others.extend(writers[b as usize].iter().copied().filter(|&w| w != t));
                let a = reach.ask_all(&others, &[t]);
                reads.push((t, b, a));
            }
        }
        Reads {
            plain: reads,
            state: state_reads,
        }
    }

    /// Check 5a's questions: the writers of a buffer written by several tasks, sorted by
    /// topological position, must form a chain. Buffers whose writers share one counter and
    /// write pairwise-disjoint tiles pass at once.
    fn ask_multi_writers(&self, uses: &Uses, reach: &mut Reach<'_>) -> Vec<MultiWriter> {
        let (p, writers) = (self.p, &uses.writers);
        let mut multi: Vec<MultiWriter> = Vec::new();
        let mut chain: Vec<TaskId> = Vec::new();
        let mut regions: Vec<Region> = Vec::new();
        for b in 0..writers.len() {
            let ws = &writers[b];
            if ws.len() < 2 || p.buffers[b].kind.is_read_only() {
                continue;
            }
            let c0 = p.tasks[ws[0] as usize].out_counter;
            let same_counter = ws.iter().all(|&w| p.tasks[w as usize].out_counter == c0);
            if same_counter {
                regions.clear();
                regions.extend(ws.iter().map(|&w| {
                    region(
                        &p.tasks[w as usize],
                        self.write_region(&p.tasks[w as usize]),
                    )
                }));
                if all_disjoint(&regions) {
                    continue;
                }
            }
            chain.clear();
            chain.extend_from_slice(ws);
            chain.sort_by_key(|&w| (reach.position(w), w));
            let links = chain.windows(2).map(|pr| reach.ask(pr[0], pr[1])).collect();
            multi.push(MultiWriter {
                buffer: b as BufferId,
                same_counter,
                links,
            });
        }
        multi
    }

    /// Check 7's questions: per page, the writer-bearing buffers sorted by their first writer
    /// must form a chain of "every use of one happens-before every write of the next".
    fn ask_page_chains(&self, uses: &Uses, reach: &mut Reach<'_>) -> PageChains {
        let (writers, readers) = (&uses.writers, &uses.readers);
        let page_chains = self.page_chains(writers, reach);
        let mut page_links: Vec<Vec<Ans>> = Vec::new();
        let mut uses: Vec<TaskId> = Vec::new();
        for chain in &page_chains {
            let mut links = Vec::new();
            for pair in chain.windows(2) {
                uses.clear();
                uses.extend(readers[pair[0] as usize].iter().copied());
                uses.extend(writers[pair[0] as usize].iter().copied());
                links.push(reach.ask_all(&uses, &writers[pair[1] as usize]));
            }
            page_links.push(links);
        }
        PageChains {
            chains: page_chains,
            links: page_links,
        }
    }

    /// Check 5's verdicts: a read of a buffer no task writes, a read not ordered after every
    /// other writer (its missing writers found by a second, finer pass), an in-place read of
    /// the task's own uninitialised output.
    fn report_reads(
        &mut self,
        order: &[TaskId],
        uses: &Uses,
        reads: &[(TaskId, BufferId, Ans)],
        reach: &Reach<'_>,
    ) {
        let (p, writers) = (self.p, &uses.writers);
        let failed_reads: Vec<(TaskId, BufferId)> = reads
            .iter()
            .filter(|(_, _, a)| !reach.answer(*a))
            .map(|&(t, b, _)| (t, b))
            .collect();
        let mut detail = Reach::new(p, self.idx, &[]);
        if !failed_reads.is_empty() {
            detail = Reach::new(p, self.idx, order);
        }
        let per_writer: Vec<Vec<(TaskId, Ans)>> = failed_reads
            .iter()
            .take(MAX_PER_KIND * 2)
            .map(|&(t, b)| {
                writers[b as usize]
                    .iter()
                    .filter(|&&w| w != t)
                    .map(|&w| (w, detail.ask(w, t)))
                    .collect()
            })
            .collect();
        detail.resolve();
        let mut failed = failed_reads.iter().zip(per_writer.iter());
        for &(t, b, a) in reads {
            let task = &p.tasks[t as usize];
            let buf = &p.buffers[b as usize];
            let ws = &writers[b as usize];
            let is_kv = buf.kind == BufferKind::KV_CACHE;
            if ws.is_empty() {
                if !buf.kind.persists() {
                    self.err(
                        ValidationError::new(
                            ErrorKind::NeverProduced,
                            format!(
                                "{} reads buffer #{b} ('{}'), which no task writes",
                                tag(task),
                                buf.name
                            ),
                        )
                        .task(t)
                        .buffer(b),
                    );
                }
                continue;
            }
            if !reach.answer(a) {
                let kind = if is_kv {
                    ErrorKind::RawRaceKv
                } else {
                    ErrorKind::RawRace
                };
                if self.listing_full(kind) {
                    let _ = failed.next();
                    self.count_only(kind);
                    continue;
                }
                let mut missing: Vec<TaskId> = match failed.next() {
                    Some((_, ws)) => ws
                        .iter()
                        .filter(|(_, a)| !detail.answer(*a))
                        .map(|(w, _)| *w)
                        .collect(),
                    None => ws.iter().copied().filter(|&w| w != t).collect(),
                };
                missing.sort_unstable();
                missing.dedup();
                let what = if is_kv { "KV cache" } else { "buffer" };
                self.err(
                    ValidationError::new(
                        kind,
                        format!(
                            "{} reads {what} #{b} ('{}') but writer task(s) {} are not ordered before it (data race)",
                            tag(task),
                            buf.name,
                            task_list(&missing)
                        ),
                    )
                    .task(t)
                    .buffer(b)
                    .others(first_others(missing)),
                );
            } else if !is_kv && ws.iter().all(|&w| w == t) {
                self.err(
                    ValidationError::new(
                        ErrorKind::InplaceUninitRead,
                        format!(
                            "{} reads buffer #{b} ('{}') that only it writes: it would read its own uninitialised output",
                            tag(task),
                            buf.name
                        ),
                    )
                    .task(t)
                    .buffer(b),
                );
            }
        }
    }

    /// Check 5a's verdicts: a multi-writer buffer whose writers are not totally ordered.
    fn report_multi_writers(
        &mut self,
        order: &[TaskId],
        uses: &Uses,
        multi: &[MultiWriter],
        reach: &Reach<'_>,
    ) {
        let p = self.p;
        for m in multi {
            if m.links.iter().all(|&a| reach.answer(a)) {
                continue;
            }
            let ws = &uses.writers[m.buffer as usize];
            let regions: Vec<Region> = ws
                .iter()
                .map(|&w| {
                    region(
                        &p.tasks[w as usize],
                        self.write_region(&p.tasks[w as usize]),
                    )
                })
                .collect();
            self.report_waw(m.buffer, ws, &regions, m.same_counter, order);
        }
    }

    /// Check 7's verdicts: the page table itself, and pages shared by buffers whose live
    /// ranges are not ordered.
    fn report_page_chains(&mut self, uses: &Uses, pages: &PageChains, reach: &Reach<'_>) {
        let writers = &uses.writers;
        self.check_page_table();
        for (chain, links) in pages.chains.iter().zip(&pages.links) {
            for (pair, &a) in chain.windows(2).zip(links) {
                if reach.answer(a) {
                    continue;
                }
                let (a, b2) = (pair[0], pair[1]);
                let page = self.page_of(a).unwrap_or(0);
                self.err(
                    ValidationError::new(
                        ErrorKind::PageClobber,
                        format!(
                            "page {page} is shared by buffers #{a} ('{}') and #{b2} ('{}') whose live ranges are not ordered: a write to one can clobber the other",
                            self.bname(a),
                            self.bname(b2)
                        ),
                    )
                    .buffer(a)
                    .others(first_others(writers[b2 as usize].to_vec())),
                );
            }
        }
    }

    /// Where task `t`'s op writes its output (the whole buffer for an unregistered op).
    fn write_region(&self, t: &Task) -> WriteRegion {
        self.reg
            .get(t.op)
            .map_or(WriteRegion::Whole, |s| s.write_region)
    }

    /// Whether `t` writes a column slice of an output it also takes as an input without
    /// reading it ([`WriteRegion::OverwrittenColumns`] with both `n_off` and `N_tile`): that
    /// input is then no read of check 5.
    fn overwrites_slice(&self, t: &Task) -> bool {
        let kind = self.write_region(t);
        kind == WriteRegion::OverwrittenColumns && region(t, kind).is_some()
    }

    /// Check 5 for STATE buffers: a read must be ordered with every other writer, either way
    /// (before them it reads the previous pass's value, after them this pass's). A read
    /// ordered before every other writer is a carried read (recorded: its value is final when
    /// the pass starts).
    fn check_state_reads(&mut self, reads: &[StateRead], reach: &Reach<'_>) {
        for r in reads {
            let unordered: Vec<TaskId> = (r.pairs.iter())
                .filter(|&&(_, before, after)| !reach.answer(before) && !reach.answer(after))
                .map(|&(w, _, _)| w)
                .collect();
            if unordered.is_empty() {
                if r.pairs.iter().all(|&(_, _, after)| reach.answer(after)) {
                    self.carried.push((r.task, r.buffer));
                }
                continue;
            }
            if self.listing_full(ErrorKind::RawRace) {
                self.count_only(ErrorKind::RawRace);
                continue;
            }
            let task = &self.p.tasks[r.task as usize];
            self.err(
                ValidationError::new(
                    ErrorKind::RawRace,
                    format!(
                        "{} reads state buffer #{} ('{}') but is ordered neither before nor after writer task(s) {} (data race)",
                        tag(task),
                        r.buffer,
                        self.bname(r.buffer),
                        task_list(&unordered)
                    ),
                )
                .task(r.task)
                .buffer(r.buffer)
                .others(first_others(unordered)),
            );
        }
    }

    pub(super) fn report_waw(
        &mut self,
        b: BufferId,
        ws: &[TaskId],
        regions: &[Region],
        same_counter: bool,
        order: &[TaskId],
    ) {
        // The witness is the first pair in writer order that is neither disjoint-with-a-shared-
        // counter nor ordered. Pairs are examined in batches (bounded for hostile inputs);
        // past the bound, the first unordered link of the topologically sorted writers is
        // reported instead (also a genuinely racing pair).
        const BUDGET: usize = 1 << 22;
        const BATCH: usize = 1 << 16;
        let mut reach = Reach::new(self.p, self.idx, order);
        let k = ws.len();
        // Candidate pairs, in writer order: with a shared counter only overlapping tiles can
        // race (found by a sweep over column starts); otherwise every pair must be ordered.
        let candidates: Vec<(usize, usize)> = if same_counter {
            overlapping_pairs(regions, BUDGET)
        } else {
            (0..k)
                .flat_map(|i| (i + 1..k).map(move |j| (i, j)))
                .take(BUDGET)
                .collect()
        };
        let mut culprit = None;
        for chunk in candidates.chunks(BATCH) {
            reach.clear();
            let asked: Vec<_> = chunk
                .iter()
                .map(|&(i, j)| (i, j, reach.ask(ws[i], ws[j]), reach.ask(ws[j], ws[i])))
                .collect();
            reach.resolve();
            culprit = asked
                .iter()
                .find(|&&(_, _, x, y)| !reach.answer(x) && !reach.answer(y))
                .map(|&(i, j, _, _)| (i, j));
            if culprit.is_some() {
                break;
            }
        }
        let culprit = culprit.unwrap_or_else(|| {
            reach.clear();
            let mut chain: Vec<usize> = (0..k).collect();
            chain.sort_by_key(|&i| (reach.position(ws[i]), ws[i]));
            let links: Vec<(usize, usize, Ans)> = chain
                .windows(2)
                .map(|w| (w[0], w[1], reach.ask(ws[w[0]], ws[w[1]])))
                .collect();
            reach.resolve();
            links
                .iter()
                .find(|&&(_, _, a)| !reach.answer(a))
                .map_or((0, 1), |&(i, j, _)| (i.min(j), i.max(j)))
        });
        let (wi, wj) = (ws[culprit.0], ws[culprit.1]);
        let why = if wi == wj {
            "lists the buffer twice among its outputs".to_string()
        } else if same_counter {
            "share a counter but their tiles overlap, and neither is ordered before the other"
                .to_string()
        } else {
            "signal different counters and neither is ordered before the other".to_string()
        };
        let (ti, tj) = (&self.p.tasks[wi as usize], &self.p.tasks[wj as usize]);
        let msg = if wi == wj {
            format!(
                "write-after-write race on buffer #{b} ('{}'): task {} ('{}') {why}",
                self.bname(b),
                wi,
                ti.display_label()
            )
        } else {
            format!(
                "write-after-write race on buffer #{b} ('{}'): writers {} ('{}') and {} ('{}') {why}",
                self.bname(b),
                wi,
                ti.display_label(),
                wj,
                tj.display_label()
            )
        };
        self.err(
            ValidationError::new(ErrorKind::WawRace, msg)
                .task(wi)
                .buffer(b)
                .others(vec![wj]),
        );
    }

    pub(super) fn page_of(&self, b: BufferId) -> Option<PageId> {
        self.p
            .pages
            .as_ref()?
            .buffer_to_page
            .iter()
            .find(|(x, _)| *x == b)
            .map(|(_, pg)| *pg)
    }

    /// Per page, the buffers that have writers, sorted by their earliest writer's position.
    pub(super) fn page_chains(&self, writers: &Incidence, reach: &Reach<'_>) -> Vec<Vec<BufferId>> {
        let Some(pa) = &self.p.pages else {
            return Vec::new();
        };
        let mut by_page: Vec<Vec<BufferId>> = vec![Vec::new(); pa.pages.len()];
        for &(b, pg) in &pa.buffer_to_page {
            if (b as usize) < self.p.buffers.len()
                && !writers[b as usize].is_empty()
                && let Some(list) = by_page.get_mut(pg as usize)
            {
                list.push(b);
            }
        }
        by_page
            .into_iter()
            .filter(|bs| bs.len() >= 2)
            .map(|mut bs| {
                bs.sort_by_key(|&b| {
                    let first = writers[b as usize]
                        .iter()
                        .map(|&w| reach.position(w))
                        .min()
                        .unwrap_or(u32::MAX);
                    (first, b)
                });
                bs
            })
            .collect()
    }

    pub(super) fn check_page_table(&mut self) {
        let Some(pa) = &self.p.pages else {
            return;
        };
        for &(b, pg) in &pa.buffer_to_page {
            let Some(buf) = self.buf(b) else {
                self.err(
                    ValidationError::new(
                        ErrorKind::PageTable,
                        format!("the page table binds buffer #{b}, which does not exist"),
                    )
                    .buffer(b),
                );
                continue;
            };
            let Some(page) = pa.pages.get(pg as usize) else {
                self.err(
                    ValidationError::new(
                        ErrorKind::PageTable,
                        format!(
                            "the page table binds buffer #{b} ('{}') to page {pg}, which does not exist",
                            buf.name
                        ),
                    )
                    .buffer(b),
                );
                continue;
            };
            if buf.kind != BufferKind::ACTIVATION {
                self.err(
                    ValidationError::new(
                        ErrorKind::PageTable,
                        format!(
                            "buffer #{b} ('{}') of kind {} is bound to page {pg}; only transient ACTIVATION buffers may live in shared scratch pages",
                            buf.name, buf.kind
                        ),
                    )
                    .buffer(b),
                );
            }
            if buf.nbytes() > page.nbytes {
                self.err(
                    ValidationError::new(
                        ErrorKind::PageTable,
                        format!(
                            "buffer #{b} ('{}') needs {} bytes but page {pg} holds only {}",
                            buf.name,
                            buf.nbytes(),
                            page.nbytes
                        ),
                    )
                    .buffer(b),
                );
            }
        }
    }
}

/// A write region: `(columns, rows)` half-open ranges, rows `None` = all rows; `None` = the
/// whole buffer.
pub(super) type Region = Option<((i64, i64), Option<(i64, i64)>)>;

pub(super) fn region(t: &Task, kind: WriteRegion) -> Region {
    if kind == WriteRegion::Whole {
        return None;
    }
    let n_off = t.param_i64("n_off")?;
    let n_tile = t.param_i64("N_tile")?;
    if n_off < 0 || n_tile <= 0 {
        return None;
    }
    let rows = if kind == WriteRegion::ColumnsAndRows {
        match (t.param_i64("m_off"), t.param_i64("M_tile")) {
            (Some(m), Some(mt)) if m >= 0 && mt > 0 => Some((m, m.saturating_add(mt))),
            _ => None,
        }
    } else {
        None
    };
    Some(((n_off, n_off.saturating_add(n_tile)), rows))
}

pub(super) fn disjoint(a: &Region, b: &Region) -> bool {
    let (Some((ca, ra)), Some((cb, rb))) = (a, b) else {
        return false;
    };
    let cols = ca.1 <= cb.0 || cb.1 <= ca.0;
    let rows = match (ra, rb) {
        (Some(x), Some(y)) => x.1 <= y.0 || y.1 <= x.0,
        _ => false,
    };
    cols || rows
}

/// Pairs `(i, j)`, `i < j`, of regions that overlap, sorted, at most `budget` of them.
pub(super) fn overlapping_pairs(regions: &[Region], budget: usize) -> Vec<(usize, usize)> {
    let span = |r: &Region| r.map_or((i64::MIN, i64::MAX), |(c, _)| c);
    let mut by_start: Vec<usize> = (0..regions.len()).collect();
    by_start.sort_by_key(|&i| (span(&regions[i]).0, i));
    let mut out = Vec::new();
    'outer: for (n, &a) in by_start.iter().enumerate() {
        let end_a = span(&regions[a]).1;
        for &b in &by_start[n + 1..] {
            if span(&regions[b]).0 >= end_a {
                break;
            }
            if !disjoint(&regions[a], &regions[b]) {
                out.push((a.min(b), a.max(b)));
                if out.len() >= budget {
                    break 'outer;
                }
            }
        }
    }
    out.sort_unstable();
    out
}

pub(super) fn all_disjoint(regions: &[Region]) -> bool {
    if regions.iter().any(Option::is_none) {
        return false;
    }
    let full_rows = regions
        .iter()
        .all(|r| r.is_some_and(|(_, rows)| rows.is_none()));
    if full_rows {
        // Only columns matter: sort intervals and check neighbours.
        let mut cols: Vec<(i64, i64)> = regions.iter().filter_map(|r| r.map(|(c, _)| c)).collect();
        cols.sort_unstable();
        return cols.windows(2).all(|w| w[0].1 <= w[1].0);
    }
    for i in 0..regions.len() {
        for j in i + 1..regions.len() {
            if !disjoint(&regions[i], &regions[j]) {
                return false;
            }
        }
    }
    true
}

/// Task ids a message lists before summarising the rest.
const LISTED_TASKS: usize = 8;
/// Task ids an error keeps in `others` (the machine-readable list).
const KEPT_OTHERS: usize = 64;

/// `1, 2, 3` — or, past [`LISTED_TASKS`], the first ones and how many more.
fn task_list(ids: &[TaskId]) -> String {
    let shown: Vec<String> = ids
        .iter()
        .take(LISTED_TASKS)
        .map(|w| w.to_string())
        .collect();
    match ids.len().saturating_sub(LISTED_TASKS) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// The first [`KEPT_OTHERS`] of `ids`.
fn first_others(mut ids: Vec<TaskId>) -> Vec<TaskId> {
    ids.truncate(KEPT_OTHERS);
    ids
}
