//! The program families of the soundness suite, each a seeded composition of motifs and
//! post-passes.

use super::hb::Hb;
use super::motif::{Gen, Val};
use super::passes::{SmStrategy, assign_sms, colour_pages, pin_onchip};
use super::rng::seed_of;
use amk_core::Program;
use amk_core::json::Value;

/// The program families of the soundness suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// A chain of unary/binary ops.
    Chain,
    /// Fan-in joins on shared counters.
    FanIn,
    /// Tiled GEMV/GEMM groups.
    Tiled,
    /// KV_APPEND → ATTENTION_TILE blocks.
    KvAttention,
    /// Split-KV shards + ATTENTION_COMBINE.
    SplitKv,
    /// A mixture with every task placed on an SM (and some on-chip buffers).
    SmAssigned,
    /// A mixture with graph-coloured scratch pages.
    Paged,
    /// Random mixtures of every motif, sometimes with SMs and pages.
    Mixture,
}

impl Family {
    /// Every family.
    pub const ALL: &'static [Family] = &[
        Family::Chain,
        Family::FanIn,
        Family::Tiled,
        Family::KvAttention,
        Family::SplitKv,
        Family::SmAssigned,
        Family::Paged,
        Family::Mixture,
    ];
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Family::Chain => "chain",
            Family::FanIn => "fan_in",
            Family::Tiled => "tiled",
            Family::KvAttention => "kv_attention",
            Family::SplitKv => "split_kv",
            Family::SmAssigned => "sm_assigned",
            Family::Paged => "paged",
            Family::Mixture => "mixture",
        }
    }
}

fn pick_same_numel(g: &mut Gen, pool: &[Val], like: &Val) -> Option<Val> {
    let n = g.numel(like.buf);
    let cands: Vec<&Val> = pool
        .iter()
        .filter(|v| v.buf != like.buf && g.numel(v.buf) == n)
        .collect();
    g.rng.pick(&cands).map(|v| (*v).clone())
}

/// Random motifs over a pool of values; returns the pool (the last value is the newest).
fn mixture_body(g: &mut Gen, steps: u64, allowed: &[u8]) -> Vec<Val> {
    let d = *g.rng.pick(&[8u64, 16, 32, 64]).unwrap_or(&16);
    let x = g.root(d);
    let mut pool = vec![x];
    for _ in 0..steps {
        let motif = *g.rng.pick(allowed).unwrap_or(&0);
        // Prefer recent values (chains), sometimes an older one (branches).
        let i = if g.rng.chance(70) {
            pool.len() - 1
        } else {
            g.rng.index(pool.len())
        };
        let src = pool[i].clone();
        let is_row = g.numel(src.buf) == g.last_dim(src.buf);
        let v = match motif {
            0 => g.unary(&src),
            1 => match pick_same_numel(g, &pool, &src) {
                Some(o) => g.binary(&src, &o),
                None => {
                    let u = g.unary(&src);
                    g.binary(&src, &u)
                }
            },
            2 => {
                let k = g.rng.range(2, 8) as usize;
                g.fan_in(&src, k)
            }
            3 => {
                let n = *g.rng.pick(&[4u64, 8, 16, 24, 32]).unwrap_or(&16);
                if !is_row && g.rng.chance(50) {
                    g.tiled(&src, n)
                } else if g.rng.chance(25) {
                    let m = g.rng.range(2, 4);
                    let dd = g.last_dim(src.buf);
                    let rows = g.gather(m, dd);
                    g.tiled(&rows, n)
                } else {
                    g.tiled(&src, n)
                }
            }
            4 if is_row => g.attention(&src, false),
            5 if is_row => g.attention(&src, true),
            _ => g.unary(&src),
        };
        pool.push(v);
    }
    pool
}

fn finish_pool(g: &mut Gen, pool: &[Val]) {
    if let Some(last) = pool.last() {
        let last = last.clone();
        g.finish(&last);
    }
    if pool.len() > 2 && g.rng.chance(30) {
        let i = g.rng.range(1, pool.len() as u64 - 2) as usize;
        let v = pool[i].clone();
        g.finish(&v);
    }
}

/// One valid program of `family` for `seed` (small: about 3–100 tasks, most under 60).
pub fn generate(family: Family, seed: u64) -> Program {
    let mut g = Gen::new(seed_of(&[family as u64, seed]));
    g.p.meta
        .insert("family", Value::from(family.name().to_string()));
    match family {
        Family::Chain => {
            let steps = g.rng.range(2, 12);
            let pool = mixture_body(&mut g, steps, &[0, 0, 0, 1]);
            finish_pool(&mut g, &pool);
        }
        Family::FanIn => {
            let steps = g.rng.range(1, 5);
            let pool = mixture_body(&mut g, steps, &[2, 2, 0, 1]);
            finish_pool(&mut g, &pool);
        }
        Family::Tiled => {
            let steps = g.rng.range(1, 5);
            let pool = mixture_body(&mut g, steps, &[3, 3, 0]);
            finish_pool(&mut g, &pool);
        }
        Family::KvAttention | Family::SplitKv => {
            let d = *g.rng.pick(&[8u64, 16, 32]).unwrap_or(&16);
            let x = g.root(d);
            let mut h = x;
            let blocks = g.rng.range(1, 2);
            for _ in 0..blocks {
                let n = g.unary(&h);
                let a = g.attention(&n, family == Family::SplitKv);
                h = g.binary(&h, &a);
            }
            g.finish(&h);
        }
        Family::SmAssigned => {
            let steps = g.rng.range(2, 6);
            let pool = mixture_body(&mut g, steps, &[0, 1, 2, 3, 4, 5]);
            finish_pool(&mut g, &pool);
            let strat = match g.rng.below(3) {
                0 => SmStrategy::RoundRobin,
                1 => SmStrategy::Random,
                _ => SmStrategy::Few(g.rng.range(1, 4) as i32),
            };
            let mut rng = g.rng.fork();
            assign_sms(&mut g.p, strat, &mut rng);
            let k = rng.range(0, 2) as usize;
            pin_onchip(&mut g.p, k, &mut rng);
        }
        Family::Paged => {
            let steps = g.rng.range(2, 6);
            let pool = mixture_body(&mut g, steps, &[0, 1, 2, 3, 4, 5]);
            finish_pool(&mut g, &pool);
            let mut rng = g.rng.fork();
            if let Some(hb) = Hb::full(&g.p) {
                let pct = rng.range(50, 100);
                colour_pages(&mut g.p, &hb, pct, &mut rng);
            }
        }
        Family::Mixture => {
            let steps = g.rng.range(2, 6);
            let pool = mixture_body(&mut g, steps, &[0, 1, 2, 3, 4, 5]);
            finish_pool(&mut g, &pool);
            let mut rng = g.rng.fork();
            if rng.chance(40)
                && let Some(hb) = Hb::full(&g.p)
            {
                colour_pages(&mut g.p, &hb, 80, &mut rng);
            }
            if rng.chance(40) {
                let strat = if rng.chance(50) {
                    SmStrategy::Few(3)
                } else {
                    SmStrategy::RoundRobin
                };
                assign_sms(&mut g.p, strat, &mut rng);
                pin_onchip(&mut g.p, 1, &mut rng);
            }
        }
    }
    g.into_program()
}
