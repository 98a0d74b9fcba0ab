//! The generator families against the oracle.

use super::Ctx;
use super::compare::{MODEL_TOL, against_oracle};
use super::outcome::{CaseResult, fail};
use super::run::{random_inputs, random_weights};
use crate::r#gen::{self, Family};
use amk_core::sim::SplitMix;

/// Seeds per family (each a program of about 3–100 tasks).
const FAMILY_SEEDS: u64 = 6;

fn family(c: &Ctx<'_>, f: Family) -> CaseResult {
    for seed in 0..FAMILY_SEEDS {
        let p = r#gen::generate(f, seed);
        let w = random_weights(&p, seed);
        let mut rng = SplitMix(r#gen::seed_of(&[f as u64, seed, 0xF00D]));
        let steps = [random_inputs(&p, &mut rng), random_inputs(&p, &mut rng)];
        against_oracle(c, &p, &w, &steps, MODEL_TOL).map_err(|e| {
            fail(format!(
                "{} seed {seed} ({} tasks): {e}",
                f.name(),
                p.tasks.len()
            ))
        })?;
    }
    Ok(())
}

pub(super) fn family_chain(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::Chain)
}
pub(super) fn family_fan_in(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::FanIn)
}
pub(super) fn family_tiled(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::Tiled)
}
pub(super) fn family_kv_attention(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::KvAttention)
}
pub(super) fn family_split_kv(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::SplitKv)
}
pub(super) fn family_sm_assigned(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::SmAssigned)
}
pub(super) fn family_paged(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::Paged)
}
pub(super) fn family_mixture(c: &Ctx<'_>) -> CaseResult {
    family(c, Family::Mixture)
}
