//! Post-passes over a finished program: SM assignment, on-chip buffers and page sharing, each
//! kept valid by construction (queues follow the topological task order, pages are shared
//! only between happens-before separated live ranges).

use super::hb::{Hb, all_before, users_of, writers_of};
use super::rng::Rng;
use amk_core::json::Value;
use amk_core::{BufferId, BufferKind, GpuTarget, MemSpace, Page, Program, TaskId};

/// How [`assign_sms`] places tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmStrategy {
    /// Task `i` of the (topological) task list → SM `(i + offset) % num_sms`.
    RoundRobin,
    /// Uniformly random SMs.
    Random,
    /// Random SMs among the first few (queues hold many tasks each).
    Few(i32),
}

/// Sets `target` to the H100 record and gives every task an SM. The task list must be in a
/// topological order (all generators here emit one), so each SM's queue is a linear extension.
pub fn assign_sms(p: &mut Program, strategy: SmStrategy, rng: &mut Rng) {
    let target = GpuTarget::by_name("h100");
    let num_sms = target.as_ref().map_or(132, |t| t.num_sms.max(1)) as u64;
    p.target = target;
    p.meta.insert("gpu", Value::from("h100"));
    let offset = rng.below(num_sms);
    for (i, t) in p.tasks.iter_mut().enumerate() {
        let s = match strategy {
            SmStrategy::RoundRobin => (i as u64 + offset) % num_sms,
            SmStrategy::Random => rng.below(num_sms),
            SmStrategy::Few(k) => rng.below((k.max(1) as u64).min(num_sms)),
        };
        t.sm = Some(s as i32);
    }
}

/// Moves up to `max` ACTIVATION buffers (not paged) on chip (SMEM or REGISTER) and places all
/// their users on one SM. Requires every task to carry an SM already.
pub fn pin_onchip(p: &mut Program, max: usize, rng: &mut Rng) {
    let users = users_of(p);
    let paged: Vec<BufferId> = p
        .pages
        .as_ref()
        .map(|pa| pa.buffer_to_page.iter().map(|&(b, _)| b).collect())
        .unwrap_or_default();
    let mut pinned: Vec<Option<i32>> = vec![None; p.tasks.len()];
    let mut cands: Vec<BufferId> = p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::ACTIVATION && !paged.contains(&b.id))
        .map(|b| b.id)
        .filter(|&b| users[b as usize].len() >= 2)
        .collect();
    rng.shuffle(&mut cands);
    let mut done = 0;
    for b in cands {
        if done >= max {
            break;
        }
        let us = &users[b as usize];
        let Some(&first) = us.first() else { continue };
        let target_sm = pinned[first as usize]
            .or(p.tasks[first as usize].sm)
            .unwrap_or(0);
        if us
            .iter()
            .any(|&u| pinned[u as usize].is_some_and(|s| s != target_sm))
        {
            continue;
        }
        for &u in us {
            pinned[u as usize] = Some(target_sm);
            p.tasks[u as usize].sm = Some(target_sm);
        }
        p.buffers[b as usize].space = if rng.chance(70) {
            MemSpace::SMEM
        } else {
            MemSpace::REGISTER
        };
        done += 1;
    }
}

/// Graph-colour page sharing: walks the ACTIVATION buffers that have writers (a `share_pct`
/// percent subset of them) in order of their first writer and puts each on the first page whose
/// most recent member's uses all happen-before its writers (transitively, then, every earlier
/// member's); otherwise opens a new page. Pages are at least as large as each member.
pub fn colour_pages(p: &mut Program, hb: &Hb, share_pct: u64, rng: &mut Rng) {
    let writers = writers_of(p);
    let users = users_of(p);
    let mut bufs: Vec<(TaskId, BufferId)> = p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::ACTIVATION)
        .filter_map(|b| writers[b.id as usize].first().map(|&w| (w, b.id)))
        .collect();
    bufs.sort_unstable();
    let mut pa = p.pages.take().unwrap_or_default();
    // Per page: members in chain order.
    let mut members: Vec<Vec<BufferId>> = vec![Vec::new(); pa.pages.len()];
    for &(b, pg) in &pa.buffer_to_page {
        if let Some(m) = members.get_mut(pg as usize) {
            m.push(b);
        }
    }
    let space = if rng.chance(50) {
        MemSpace::GLOBAL_SCRATCH
    } else {
        MemSpace::HBM
    };
    for (_, b) in bufs {
        if !rng.chance(share_pct) {
            continue;
        }
        let need = p.buffers[b as usize].nbytes();
        let mut chosen = None;
        for (pg, m) in members.iter().enumerate() {
            let Some(&last) = m.last() else { continue };
            if all_before(hb, &users[last as usize], &writers[b as usize]) {
                chosen = Some(pg);
                break;
            }
        }
        let pg = match chosen {
            Some(pg) => pg,
            None => {
                let id = pa.pages.len();
                pa.pages.push(Page {
                    id: id as u32,
                    space,
                    nbytes: 0,
                    live_start: -1,
                    live_end: -1,
                });
                members.push(Vec::new());
                id
            }
        };
        members[pg].push(b);
        let page = &mut pa.pages[pg];
        page.nbytes = page.nbytes.max(need + rng.below(3) * 64);
        let (lo, hi) = users[b as usize]
            .iter()
            .fold((i64::MAX, -1i64), |(lo, hi), &u| {
                (lo.min(u as i64), hi.max(u as i64))
            });
        page.live_start = if page.live_start < 0 {
            lo
        } else {
            page.live_start.min(lo)
        };
        page.live_end = page.live_end.max(hi);
        pa.buffer_to_page.push((b, pg as u32));
    }
    p.pages = Some(pa);
}
