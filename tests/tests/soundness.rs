//! Validator soundness suite.
//!
//! Generates more than 10,000 programs (seeded, deterministic): valid programs of every
//! generator family, small Llama-like lowerings, single-defect mutants of every error kind and
//! randomly perturbed programs; validates each with `amk_core::validate` and runs the
//! independent dynamic oracle (`amk_conformance::oracle`) on each. Asserts:
//! (a) every valid generated program is accepted;
//! (b) zero false accepts: nothing the oracle finds unsafe is accepted;
//! (c) every mutant is rejected with its intended kind among the errors;
//! (d) every rejection the oracle cannot explain carries only "static-only" kinds
//!     ([`STATIC_ONLY`], each justified by a rule of docs/ir.md).
//!
//! The suite also checks the Llama-like generator against the reference's counting formulas,
//! the benchmark presets' sizes, and keeps minimal reproducers of the validator bugs it found
//! (they fail until the validator is fixed): SM-queue deadlocks through other SMs, GEMV tiles
//! whose made-up row params hide a write-write race, and (fixed since) overflow panics in op
//! shape rules on huge dims.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // reason: test code: failures are assertions

use amk_conformance::r#gen::{self as g, Family, LlamaConfig, Rng, seed_of};
use amk_conformance::mutate;
use amk_conformance::oracle::{self, Config, Report};
use amk_core::json::Map;
use amk_core::{BufferKind, DType, ErrorKind, GpuTarget, Opcode, Program, Registry, validate};
use std::collections::BTreeMap;
use std::time::Instant;

/// Rules the dynamic oracle cannot observe, because they concern the program's *form* rather
/// than any interleaving of its tasks. A rejection the oracle calls safe must only carry these.
const STATIC_ONLY: &[(ErrorKind, &str)] = &[
    // Reference-integrity: a dangling buffer id names no memory the simulator could track
    // (docs/ir.md, "Validator rules", check 1, `missing_buffer`).
    (
        ErrorKind::MissingBuffer,
        "docs/ir.md check 1: ids must exist",
    ),
    // Device-instruction capacities (docs/ir.md, "Device capacities"; check 1, `cap_*`): a
    // program over them cannot be encoded at all, whatever its schedule.
    (ErrorKind::CapInputs, "docs/ir.md check 1: at most 8 inputs"),
    (
        ErrorKind::CapOutputs,
        "docs/ir.md check 1: at most 4 outputs",
    ),
    (ErrorKind::CapWaits, "docs/ir.md check 1: at most 8 waits"),
    (ErrorKind::CapRank, "docs/ir.md check 1: rank at most 4"),
    // Thresholds must be static positive ints (docs/ir.md check 1, `bad_threshold`): a
    // threshold ≤ 0 is malformed even when the wait it weakens happens to be redundant.
    (
        ErrorKind::BadThreshold,
        "docs/ir.md check 1: thresholds ≥ 1",
    ),
    // Waiting on one's own counter (docs/ir.md check 1, `self_wait`) is refused even when other
    // producers of a shared counter could satisfy a partial threshold.
    (
        ErrorKind::SelfWait,
        "docs/ir.md check 1: no wait on own out_counter",
    ),
    // Registry rules (docs/ir.md, "Opcodes and params"; check 1): opcode known, arity, params
    // present and typed. The simulator has no notion of what an op computes.
    (
        ErrorKind::UnregisteredOp,
        "docs/ir.md check 1: opcode registered",
    ),
    (ErrorKind::ArityInputs, "docs/ir.md check 1: input arity"),
    (ErrorKind::ArityOutputs, "docs/ir.md check 1: output arity"),
    (
        ErrorKind::MissingParam,
        "docs/ir.md check 1: required params",
    ),
    (
        ErrorKind::ParamType,
        "docs/ir.md check 1: int32 / real params",
    ),
    // A partial wait on a shared counter (docs/ir.md check 3) is ambiguous about *which*
    // producers finished; it is refused even when the consumer reads nothing those producers
    // write.
    (
        ErrorKind::PartialSharedWait,
        "docs/ir.md check 3: shared counters are all-joins",
    ),
    // Our stricter rules (docs/ir.md, "Where we are stricter than the reference tooling"):
    // tile/shape params must fit the buffers they index, the counters' init must be 0 (the
    // device zeroes them every launch), FUSED recipes must be well formed, page tables must
    // name existing pages/buffers of fitting kind and size.
    (
        ErrorKind::TileOutOfBounds,
        "docs/ir.md check 1: tile params fit their buffers",
    ),
    (
        ErrorKind::ShapeMismatch,
        "docs/ir.md check 1: operand shapes fit the op",
    ),
    (ErrorKind::CounterInit, "docs/ir.md: Counter.init must be 0"),
    (
        ErrorKind::FusedRecipe,
        "docs/ir.md check 1: FUSED recipes well formed",
    ),
    (
        ErrorKind::PageTable,
        "docs/ir.md check 7: page tables reference real pages/buffers",
    ),
    // A step loop's gate must end the pass (docs/ir.md check 10): the hazard is between two
    // passes of one launch, which a one-pass simulation never runs.
    (
        ErrorKind::StepLoop,
        "docs/ir.md check 10: the step loop's gate is a barrier of the pass",
    ),
    // The config's kernel knobs and the target's sizes concern the build, not any
    // interleaving (docs/ir.md check 8, the reference's `_config_type_errors`).
    (
        ErrorKind::BadConfig,
        "docs/ir.md check 8: kernel knobs and target in range",
    ),
    // Who runs a floating task is decided by which signal completes its counter; the oracle
    // runs every task whose waits hold, floating or not, so the rules that make that runner
    // one well-defined block are about the program's form (docs/ir.md check 3a).
    (
        ErrorKind::FloatingTask,
        "docs/ir.md check 3a: a floating task's runner is the one completing signal",
    ),
];

fn static_only(k: ErrorKind) -> bool {
    STATIC_ONLY.iter().any(|(s, _)| *s == k)
}

const VALID_PER_FAMILY: u64 = 400;
const MUTANTS_PER_KIND: u64 = 200;
const PERTURBED: u64 = 2000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cat {
    Valid,
    Llama,
    Mutant,
    Perturbed,
}

#[derive(Debug, Clone)]
enum Job {
    Valid(Family, u64),
    Llama(usize),
    Mutant(ErrorKind, u64),
    Perturb(u64),
}

struct Outcome {
    cat: Cat,
    group: String,
    intended: Option<ErrorKind>,
    accepted: bool,
    kinds: Vec<ErrorKind>,
    oracle_unsafe: bool,
    hazards: Vec<oracle::Hazard>,
    /// Which [`FEATURES`] the program exercises (bit i = feature i).
    features: u32,
    tasks: usize,
    /// Microseconds spent validating / exploring.
    micros: (u64, u64),
    failure: Option<String>,
}

fn small_llamas() -> Vec<LlamaConfig> {
    let mut v = Vec::new();
    for (i, &(layers, h, nh, nkv, hd, inter, vocab, nt)) in [
        (1usize, 16u64, 2u64, 1u64, 8u64, 32u64, 24u64, 8u64),
        (2, 16, 2, 2, 8, 32, 32, 16),
        (2, 32, 4, 2, 8, 48, 40, 8),
        (1, 24, 3, 1, 8, 40, 50, 64),
        (3, 16, 4, 2, 4, 24, 20, 4),
        (2, 64, 4, 1, 16, 96, 64, 32),
    ]
    .iter()
    .enumerate()
    {
        for variant in 0..4u64 {
            let mut c = LlamaConfig::new(layers, h, nh, nkv, hd, inter, vocab, nt);
            c.max_seq = 16;
            c.pos = (i as u64 * 3 + variant) % 16;
            c.sm_round_robin = variant & 1 == 1;
            c.pages = variant >= 2;
            c.split_kv = if variant == 3 { 3 } else { 1 };
            v.push(c);
        }
    }
    v
}

fn oracle_cfg(seed: u64) -> Config {
    Config {
        seed,
        ..Config::default()
    }
}

/// Builds the program of one job (with its intended kind, for mutants).
fn build(job: &Job) -> Result<(Program, String, Option<ErrorKind>), String> {
    match job {
        Job::Valid(f, s) => Ok((g::generate(*f, *s), f.name().to_string(), None)),
        Job::Llama(i) => {
            let cfgs = small_llamas();
            let c = cfgs.get(*i).ok_or("no such llama config")?;
            Ok((g::llama_like_with(c), "llama_small".to_string(), None))
        }
        Job::Mutant(k, i) => {
            let mut rng = Rng::new(seed_of(&[0xB0B, *k as u64, *i]));
            for attempt in 0..64u64 {
                let f = Family::ALL[((i + attempt) % Family::ALL.len() as u64) as usize];
                let base = g::generate(f, seed_of(&[0x77, *k as u64, *i, attempt]));
                if let Some(m) = mutate::mutate(&base, *k, &mut rng) {
                    return Ok((m.program, format!("{} ({})", k.as_str(), m.note), Some(*k)));
                }
            }
            Err(format!("no base program admits a {} mutation", k.as_str()))
        }
        Job::Perturb(i) => {
            let mut rng = Rng::new(seed_of(&[0xD00D, *i]));
            let f = Family::ALL[(*i % Family::ALL.len() as u64) as usize];
            let base = g::generate(f, seed_of(&[0x99, *i]));
            let (p, notes) = mutate::perturb(&base, &mut rng);
            Ok((
                p,
                format!("perturbed {}: {}", f.name(), notes.join(", ")),
                None,
            ))
        }
    }
}

fn run_job(job: &Job, reg: &Registry) -> Outcome {
    let cat = match job {
        Job::Valid(..) => Cat::Valid,
        Job::Llama(_) => Cat::Llama,
        Job::Mutant(..) => Cat::Mutant,
        Job::Perturb(_) => Cat::Perturbed,
    };
    let (p, what, intended) = match build(job) {
        Ok(x) => x,
        Err(e) => {
            return Outcome {
                cat,
                group: format!("{job:?}"),
                intended: None,
                accepted: false,
                kinds: Vec::new(),
                oracle_unsafe: false,
                hazards: Vec::new(),
                features: 0,
                tasks: 0,
                micros: (0, 0),
                failure: Some(e),
            };
        }
    };
    let group = match (cat, intended) {
        (Cat::Mutant, Some(k)) => k.as_str().to_string(),
        (Cat::Valid, _) => what.clone(),
        _ => format!("{cat:?}"),
    };
    let t0 = Instant::now();
    let r = validate(&p, reg);
    let t1 = Instant::now();
    let rep: Report = oracle::explore(&p, &oracle_cfg(seed_of(&[p.tasks.len() as u64, 7])));
    let micros = (
        (t1 - t0).as_micros() as u64,
        t1.elapsed().as_micros() as u64,
    );
    let accepted = r.ok();
    let kinds = r.error_kinds();
    let mut failure = None;
    let ctx = || {
        format!(
            "[{job:?}] {what}\n  oracle: {}\n  validator: {}",
            rep.summary(),
            r.report()
        )
    };
    if matches!(cat, Cat::Valid | Cat::Llama) && !accepted {
        failure = Some(format!("(a) valid program rejected {}", ctx()));
    }
    if rep.is_unsafe() && accepted {
        let witness = oracle::sm_deadlock_witness(&p).map_or_else(String::new, |c| {
            let hops: Vec<String> = c
                .iter()
                .map(|&t| format!("{t}@SM{}", p.tasks[t as usize].sm.unwrap_or(-1)))
                .collect();
            format!("\n  SM-queue blocking cycle: {}", hops.join(" -> "))
        });
        failure = Some(format!("(b) FALSE ACCEPT {}{witness}", ctx()));
    }
    if let Some(k) = intended
        && (accepted || !kinds.contains(&k))
    {
        failure = Some(format!(
            "(c) mutant not rejected with {} {}",
            k.as_str(),
            ctx()
        ));
    }
    if !accepted && !rep.is_unsafe() && !kinds.iter().all(|&k| static_only(k)) {
        failure = Some(format!(
            "(d) rejection the oracle cannot explain has non-static kinds {:?} {}",
            kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
            ctx()
        ));
    }
    Outcome {
        cat,
        group,
        intended,
        accepted,
        kinds,
        oracle_unsafe: rep.is_unsafe(),
        hazards: rep.hazards(),
        features: features(&p),
        tasks: p.tasks.len(),
        micros,
        failure,
    }
}

/// Constructs counted over the valid programs, to show what the generators cover.
const FEATURES: &[&str] = &[
    "shared_page",
    "sm_assigned",
    "onchip",
    "kv_append",
    "kv_prior_state_only",
    "split_kv",
    "gemm_2d",
    "fused",
    "quantised_gemv",
    "dequant",
    "fan_in",
    "nop_barrier",
];

fn features(p: &Program) -> u32 {
    let has = |op: Opcode| p.tasks.iter().any(|t| t.op == op);
    let shared_page = p.pages.as_ref().is_some_and(|pa| {
        pa.pages.iter().any(|pg| {
            pa.buffer_to_page
                .iter()
                .filter(|(_, x)| *x == pg.id)
                .count()
                >= 2
        })
    });
    let kv_read_unwritten = p.buffers.iter().any(|b| {
        b.kind == BufferKind::KV_CACHE && !p.tasks.iter().any(|t| t.outputs.contains(&b.id))
    });
    let fan_in = {
        let mut n = vec![0usize; p.counters.len()];
        for t in &p.tasks {
            if let Some(x) = n.get_mut(t.out_counter as usize) {
                *x += 1;
            }
        }
        p.tasks.iter().any(|t| {
            t.waits.iter().any(|w| {
                n.get(w.counter as usize).is_some_and(|&k| k >= 2)
                    && !p.tasks.iter().any(|q| {
                        q.out_counter == w.counter
                            && matches!(q.op, Opcode::GEMV_TILE | Opcode::GEMM_TILE)
                    })
            })
        })
    };
    let bits = [
        shared_page,
        p.tasks.iter().any(|t| t.sm.is_some()),
        p.buffers.iter().any(|b| b.space.is_on_chip()),
        has(Opcode::KV_APPEND),
        kv_read_unwritten,
        has(Opcode::ATTENTION_COMBINE),
        p.tasks
            .iter()
            .any(|t| t.op == Opcode::GEMM_TILE && t.param_i64("m_off").is_some_and(|m| m > 0)),
        has(Opcode::FUSED),
        p.tasks
            .iter()
            .any(|t| t.params.contains_key("qdtype") && t.op != Opcode::DEQUANT),
        has(Opcode::DEQUANT),
        fan_in,
        has(Opcode::NOP),
    ];
    bits.iter()
        .enumerate()
        .fold(0, |acc, (i, &b)| if b { acc | 1 << i } else { acc })
}

fn jobs() -> Vec<Job> {
    let mut j = Vec::new();
    for &f in Family::ALL {
        for s in 0..VALID_PER_FAMILY {
            j.push(Job::Valid(f, s));
        }
    }
    for i in 0..small_llamas().len() {
        j.push(Job::Llama(i));
    }
    for &k in ErrorKind::ALL {
        for i in 0..MUTANTS_PER_KIND {
            j.push(Job::Mutant(k, i));
        }
    }
    for i in 0..PERTURBED {
        j.push(Job::Perturb(i));
    }
    j
}

fn run_all(jobs: &[Job], reg: &Registry) -> Vec<Outcome> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    let mut slots: Vec<Vec<(usize, Outcome)>> = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                s.spawn(move || {
                    jobs.iter()
                        .enumerate()
                        .filter(|(i, _)| i % threads == k)
                        .map(|(i, j)| (i, run_job(j, reg)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            slots.push(h.join().expect("worker panicked"));
        }
    });
    let mut all: Vec<(usize, Outcome)> = slots.into_iter().flatten().collect();
    all.sort_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, o)| o).collect()
}

#[test]
fn soundness_suite() {
    let t0 = Instant::now();
    let reg = amk_ops::registry().unwrap();
    let jobs = jobs();
    let outcomes = run_all(&jobs, &reg);
    let total = outcomes.len();
    let accepted = outcomes.iter().filter(|o| o.accepted).count();
    let unsafe_n = outcomes.iter().filter(|o| o.oracle_unsafe).count();
    let false_accepts = outcomes
        .iter()
        .filter(|o| o.oracle_unsafe && o.accepted)
        .count();
    let tasks: usize = outcomes.iter().map(|o| o.tasks).sum();
    let mut by_cat: BTreeMap<Cat, (usize, usize, usize, u64, u64)> = BTreeMap::new();
    for o in &outcomes {
        let e = by_cat.entry(o.cat).or_default();
        e.0 += 1;
        e.1 += usize::from(o.accepted);
        e.2 += usize::from(o.oracle_unsafe);
        e.3 += o.micros.0;
        e.4 += o.micros.1;
    }
    // Per intended kind: (mutants, rejected with the kind, oracle-unsafe).
    let mut per_kind: BTreeMap<ErrorKind, (usize, usize, usize)> = BTreeMap::new();
    // Per reported kind over every rejection.
    let mut reported: BTreeMap<ErrorKind, usize> = BTreeMap::new();
    let mut by_family: BTreeMap<String, usize> = BTreeMap::new();
    for o in &outcomes {
        if let Some(k) = o.intended {
            let e = per_kind.entry(k).or_default();
            e.0 += 1;
            e.1 += usize::from(!o.accepted && o.kinds.contains(&k));
            e.2 += usize::from(o.oracle_unsafe);
        }
        for &k in &o.kinds {
            *reported.entry(k).or_default() += 1;
        }
        if o.cat == Cat::Valid {
            *by_family.entry(o.group.clone()).or_default() += 1;
        }
    }
    println!(
        "soundness: programs={total} tasks={tasks} accepted={accepted} rejected={} oracle_unsafe={unsafe_n} false_accepts={false_accepts} time={:.1}s",
        total - accepted,
        t0.elapsed().as_secs_f64()
    );
    for (c, (n, a, u, tv, to)) in &by_cat {
        println!(
            "  {c:?}: {n} programs, {a} accepted, {u} oracle-unsafe (validate {:.1}s, oracle {:.1}s cpu)",
            *tv as f64 / 1e6,
            *to as f64 / 1e6
        );
    }
    println!(
        "  valid by family: {}",
        by_family
            .iter()
            .map(|(f, n)| format!("{f}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  valid programs exercising: {}",
        FEATURES
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let n = outcomes
                    .iter()
                    .filter(|o| {
                        matches!(o.cat, Cat::Valid | Cat::Llama) && o.features & (1 << i) != 0
                    })
                    .count();
                format!("{f}={n}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("  mutants per intended kind (mutants / rejected with kind / oracle-unsafe):");
    for (k, (n, hit, u)) in &per_kind {
        println!("    {:<22} {n:>4} {hit:>4} {u:>4}", k.as_str());
    }
    println!(
        "  error kinds reported: {}",
        reported
            .iter()
            .map(|(k, n)| format!("{}={n}", k.as_str()))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut fa_hazards: BTreeMap<&'static str, usize> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.oracle_unsafe && o.accepted) {
        for h in &o.hazards {
            *fa_hazards.entry(h.name()).or_default() += 1;
        }
    }
    if !fa_hazards.is_empty() {
        println!(
            "  false accepts by oracle hazard: {}",
            fa_hazards
                .iter()
                .map(|(h, n)| format!("{h}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.failure.as_ref()).collect();
    for f in failures.iter().take(12) {
        println!("FAILURE {f}");
    }
    assert!(total >= 10_000, "only {total} programs");
    for &k in ErrorKind::ALL {
        let n = per_kind.get(&k).map_or(0, |e| e.0);
        assert!(
            n >= MUTANTS_PER_KIND as usize,
            "kind {} has {n} mutants",
            k.as_str()
        );
    }
    assert_eq!(false_accepts, 0, "false accepts (see FAILURE lines)");
    assert!(
        failures.is_empty(),
        "{} failures; first: {}",
        failures.len(),
        failures[0]
    );
}

// ---- sizes for the benchmark ---------------------------------------------------------------

#[test]
fn llama_presets_have_the_documented_sizes_and_validate() {
    let reg = amk_ops::registry().unwrap();
    let c3 = g::preset_3k_config();
    assert_eq!(c3.task_count(), g::PRESET_3K_TASKS);
    let p3 = g::preset_3k();
    assert_eq!(p3.tasks.len(), g::PRESET_3K_TASKS);
    let t = Instant::now();
    let r = validate(&p3, &reg);
    println!(
        "preset_3k: {} tasks, {} buffers, {} counters, {} pages, validated in {:.2}s",
        p3.tasks.len(),
        p3.buffers.len(),
        p3.counters.len(),
        p3.pages.as_ref().map_or(0, |pa| pa.pages.len()),
        t.elapsed().as_secs_f64()
    );
    assert!(r.ok(), "{}", r.report());
    let c20 = g::preset_20k_config();
    assert_eq!(c20.task_count(), g::PRESET_20K_TASKS);
    let p20 = g::preset_20k();
    assert_eq!(p20.tasks.len(), g::PRESET_20K_TASKS);
    let t = Instant::now();
    let r = validate(&p20, &reg);
    println!(
        "preset_20k: {} tasks, {} buffers, {} counters, {} pages, validated in {:.2}s",
        p20.tasks.len(),
        p20.buffers.len(),
        p20.counters.len(),
        p20.pages.as_ref().map_or(0, |pa| pa.pages.len()),
        t.elapsed().as_secs_f64()
    );
    assert!(r.ok(), "{}", r.report());
}

#[test]
fn llama_like_matches_the_reference_counting_formulas() {
    // docs/models.md, "The reference lowering": toy 2L (H64, 4/2×16, I128, V256) has 66 tasks
    // at auto tiling (32), 48 at N_tile 64, 42 at N_tile 128; 65 buffers (9 + 28 L), 41
    // counters (3 + 19 L).
    for (nt, want) in [(32u64, 66usize), (64, 48), (128, 42)] {
        let p = g::llama_like(2, 64, 4, 2, 16, 128, 256, nt);
        assert_eq!(p.tasks.len(), want, "N_tile {nt}");
        assert_eq!(p.buffers.len(), 9 + 28 * 2);
        assert_eq!(p.counters.len(), 3 + 19 * 2);
    }
    // Llama h512 L2 (8/2×64, I2048, V32000): 182 tasks at N_tile 128; SmolLM2-135M shape
    // (H576, 9/3×64, I1536, V49152, 30 layers) at N_tile 128: 1716 tasks.
    assert_eq!(
        g::llama_like(2, 512, 8, 2, 64, 2048, 32000, 128)
            .tasks
            .len(),
        182
    );
    assert_eq!(
        g::llama_like(30, 576, 9, 3, 64, 1536, 49152, 128)
            .tasks
            .len(),
        1716
    );
}

#[test]
fn layered_happens_before_agrees_with_the_full_relation() {
    for c in small_llamas() {
        let (p, seg) = g::llama_like_segments(&c);
        let full = g::Hb::full(&p).unwrap();
        let layered = g::Hb::layered(&p, &seg).unwrap();
        let n = p.tasks.len() as u32;
        for u in 0..n {
            for v in 0..n {
                assert_eq!(
                    full.before(u, v),
                    layered.before(u, v),
                    "{u} -> {v} in {c:?}"
                );
            }
        }
    }
}

// ---- validator bugs found by this suite (minimal reproducers) -------------------------------

/// A per-SM queue deadlock through another SM. SM 0 runs task 0 then task 2; task 0 waits on
/// task 1 (SM 1), which waits on task 2 — stuck behind task 0 on SM 0. No *direct* edge joins
/// two tasks of one SM in the wrong order, which is all check 6 looks at.
#[test]
fn sm_queue_deadlock_through_another_sm_is_rejected() {
    let reg = amk_ops::registry().unwrap();
    let mut p = Program::new();
    p.target = GpuTarget::by_name("h100");
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 4]);
    let a = p.new_buffer("a", BufferKind::ACTIVATION, DType::F32, &[1, 4]);
    let b = p.new_buffer("b", BufferKind::ACTIVATION, DType::F32, &[1, 4]);
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[1, 4]);
    let (c0, c1, c2) = (p.new_counter("y"), p.new_counter("b"), p.new_counter("a"));
    // task 0, SM 0: y = copy(b), waits for task 1
    p.push_task(Opcode::COPY, &[b], &[y], c0, &[(c1, 1)], Map::new(), "t0");
    // task 1, SM 1: b = copy(a), waits for task 2
    p.push_task(Opcode::COPY, &[a], &[b], c1, &[(c2, 1)], Map::new(), "t1");
    // task 2, SM 0: a = copy(x)
    p.push_task(Opcode::COPY, &[x], &[a], c2, &[], Map::new(), "t2");
    p.tasks[0].sm = Some(0);
    p.tasks[1].sm = Some(1);
    p.tasks[2].sm = Some(0);
    let rep = oracle::explore(&p, &Config::default());
    assert!(
        rep.findings
            .iter()
            .any(|f| f.hazard == oracle::Hazard::SmQueueDeadlock),
        "the oracle sees the SM-queue deadlock: {}",
        rep.summary()
    );
    let r = validate(&p, &reg);
    assert!(
        r.has(ErrorKind::SmQueueOrder),
        "expected sm_queue_order (SM 0 would run task 0 before task 2, which task 0 needs \
         through task 1 on SM 1); got: {}",
        r.report()
    );
}

/// A cross-SM queue cycle with no dependency between tasks of one SM at all: SM 0 runs
/// [t0, t1], SM 1 runs [t2, t3]; t0 waits on t3 and t2 waits on t1. Each SM blocks on its first
/// task, which needs the other SM's second task.
#[test]
fn sm_queue_cycle_across_two_sms_is_rejected() {
    let reg = amk_ops::registry().unwrap();
    let mut p = Program::new();
    p.target = GpuTarget::by_name("h100");
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 4]);
    let a = p.new_buffer("a", BufferKind::ACTIVATION, DType::F32, &[1, 4]);
    let b = p.new_buffer("b", BufferKind::ACTIVATION, DType::F32, &[1, 4]);
    let y0 = p.new_buffer("y0", BufferKind::IO_OUTPUT, DType::F32, &[1, 4]);
    let y1 = p.new_buffer("y1", BufferKind::IO_OUTPUT, DType::F32, &[1, 4]);
    let c: Vec<_> = (0..4).map(|i| p.new_counter(format!("c{i}"))).collect();
    // t0 (SM 0): y0 = copy(b) after t3 · t1 (SM 0): a = copy(x)
    // t2 (SM 1): y1 = copy(a) after t1 · t3 (SM 1): b = copy(x)
    p.push_task(
        Opcode::COPY,
        &[b],
        &[y0],
        c[0],
        &[(c[3], 1)],
        Map::new(),
        "t0",
    );
    p.push_task(Opcode::COPY, &[x], &[a], c[1], &[], Map::new(), "t1");
    p.push_task(
        Opcode::COPY,
        &[a],
        &[y1],
        c[2],
        &[(c[1], 1)],
        Map::new(),
        "t2",
    );
    p.push_task(Opcode::COPY, &[x], &[b], c[3], &[], Map::new(), "t3");
    for (t, s) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
        p.tasks[t].sm = Some(s);
    }
    let w = oracle::sm_deadlock_witness(&p);
    assert!(w.is_some(), "the oracle sees the SM-queue deadlock");
    let r = validate(&p, &reg);
    assert!(
        r.has(ErrorKind::SmQueueOrder),
        "expected sm_queue_order (blocking cycle {w:?}); got: {}",
        r.report()
    );
}

/// GEMV_TILE writes every row of its output (its shape rule ignores `m_off`/`M_tile`, which
/// only GEMM_TILE honours), yet the WAW check reads row ranges from any tiled op. Two GEMV tiles
/// on one counter writing the same columns, with made-up row params `m_off` 0 and 1, race on
/// the same elements.
#[test]
fn gemv_tiles_with_row_params_on_the_same_columns_are_a_waw_race() {
    let reg = amk_ops::registry().unwrap();
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 8]);
    let w = p.new_weight("w", DType::F32, &[4, 8], "w");
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[1, 4]);
    let c = p.new_counter("y");
    for m_off in 0..2i64 {
        let pr = g::params(&[
            ("K", 8i64.into()),
            ("N_tile", 4i64.into()),
            ("n_off", 0i64.into()),
            ("M_tile", 1i64.into()),
            ("m_off", m_off.into()),
        ]);
        p.push_task(
            Opcode::GEMV_TILE,
            &[x, w],
            &[y],
            c,
            &[],
            pr,
            format!("tile{m_off}"),
        );
    }
    let rep = oracle::explore(&p, &Config::default());
    assert!(
        rep.findings
            .iter()
            .any(|f| f.hazard == oracle::Hazard::ConcurrentWrite),
        "the oracle sees the concurrent write: {}",
        rep.summary()
    );
    let r = validate(&p, &reg);
    assert!(
        r.has(ErrorKind::WawRace),
        "expected waw_race (both tiles write columns [0, 4) of the single row); got: {}",
        r.report()
    );
}

// ---- totality ----------------------------------------------------------------------------

static LAST_PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Validates under `catch_unwind`; returns the panic location and message, if any.
fn validate_catching(p: &Program, reg: &Registry) -> Option<String> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| validate(p, reg)));
    match r {
        Ok(_) => None,
        Err(e) => {
            let msg = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let loc = LAST_PANIC.lock().map(|l| l.clone()).ok().flatten();
            Some(format!("{} ({msg})", loc.unwrap_or_default()))
        }
    }
}

/// docs/ir.md, "Where we are stricter": the validator is total — it never panics, whatever the
/// (loadable) program. Shape dims up to 2^63 − 1 load from JSON; the op shape rules must not
/// overflow on them.
#[test]
fn validator_is_total_on_huge_shapes() {
    let reg = amk_ops::registry().unwrap();
    let big = 1u64 << 33;
    let mut cases: Vec<(String, Program)> = Vec::new();
    {
        // KV_APPEND: new rows [2^33, 2^33] (numel saturates) into a [4, 1] cache at pos 1.
        let mut p = Program::new();
        let new = p.new_buffer("new", BufferKind::IO_INPUT, DType::F32, &[big, big]);
        let kc = p.new_buffer("kc", BufferKind::KV_CACHE, DType::F32, &[4, 1]);
        let c = p.new_counter("c");
        let pr = g::params(&[("pos", 1i64.into())]);
        p.push_task(Opcode::KV_APPEND, &[new, kc], &[kc], c, &[], pr, "kv");
        cases.push(("KV_APPEND, rank-2 cache, huge new rows".into(), p));
    }
    {
        // KV_APPEND into a [2, 4, 2^33, 2^33] cache.
        let mut p = Program::new();
        let new = p.new_buffer("new", BufferKind::IO_INPUT, DType::F32, &[1]);
        let kc = p.new_buffer("kc", BufferKind::KV_CACHE, DType::F32, &[2, 4, big, big]);
        let c = p.new_counter("c");
        let pr = g::params(&[("pos", 1i64.into())]);
        p.push_task(Opcode::KV_APPEND, &[new, kc], &[kc], c, &[], pr, "kv");
        cases.push(("KV_APPEND, rank-4 cache with huge dims".into(), p));
    }
    {
        // ATTENTION_COMBINE writing a [2^33, 2^33] output with head_dim 1.
        let mut p = Program::new();
        let part = p.new_buffer("part", BufferKind::IO_INPUT, DType::F32, &[4]);
        let out = p.new_buffer("out", BufferKind::IO_OUTPUT, DType::F32, &[big, big]);
        let c = p.new_counter("c");
        let pr = g::params(&[("head_dim", 1i64.into())]);
        p.push_task(
            Opcode::ATTENTION_COMBINE,
            &[part, part],
            &[out],
            c,
            &[],
            pr,
            "combine",
        );
        cases.push(("ATTENTION_COMBINE with a huge output".into(), p));
    }
    // Fuzz: valid programs with a few buffers blown up to huge dims.
    let mut rng = Rng::new(0x70_7A1);
    for i in 0..300u64 {
        let mut p = g::generate(Family::ALL[(i % 8) as usize], 10_000 + i);
        for _ in 0..rng.range(1, 3) {
            let b = rng.index(p.buffers.len());
            for d in p.buffers[b].shape.iter_mut() {
                if rng.chance(60) {
                    *d = 1u64 << rng.range(20, 62);
                }
            }
        }
        cases.push((format!("fuzz {i}"), p));
    }
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut l) = LAST_PANIC.lock() {
            *l = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()));
        }
    }));
    let panics: Vec<String> = cases
        .iter()
        .filter_map(|(name, p)| validate_catching(p, &reg).map(|w| format!("{name}: panic at {w}")))
        .collect();
    std::panic::set_hook(prev);
    let mut sites: Vec<String> = panics
        .iter()
        .filter_map(|s| s.split(" at ").nth(1).map(str::to_string))
        .collect();
    sites.sort();
    sites.dedup();
    for s in panics.iter().take(10) {
        println!("{s}");
    }
    assert!(
        panics.is_empty(),
        "validate panicked on {} of {} programs; distinct sites: {sites:#?}",
        panics.len(),
        cases.len()
    );
}
