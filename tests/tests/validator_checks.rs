//! Per-check conformance tests of the static validator.
//!
//! For every error kind of `ErrorKind::ALL` and every warning kind of `WarningKind::ALL` there
//! is a negative program (exhibiting exactly that defect: the result has the kind, and its
//! message and structured fields name the ids concerned) and a positive program (the closest
//! valid one: the kind is absent and the program is accepted). The reference semantics the
//! contract calls out (transitive RAW provenance, "every other writer happens-before every
//! reader", KV-cache exemptions, WAW tiles, on-chip placement, SM queues, pages, cycles with
//! witnesses, each op's shape rule, FUSED recipes) have their own tests, and so do the result
//! API (`report`, `stats`, `validate_owned`) and the dynamic cross-checks.
//!
//! Expected values come from the rules of docs/ir.md ("Validator rules, in check order"), not
//! from the implementation.

// Helpers outside `#[test]` functions (which clippy.toml already exempts) fail loudly on
// broken test setup by design.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use amk_core::json::{self, Map, Value};
use amk_core::{
    BufferId, BufferKind, CounterId, DType, ErrorKind, GpuTarget, MemSpace, OpSpec, Opcode, Origin,
    Page, PageAllocation, Program, Registry, ScheduleConfig, TaskId, ValidationResult, WarningKind,
    validate, validate_owned,
};
use rstest::rstest;
use std::borrow::Cow;
use std::collections::BTreeSet;

use BufferKind::{ACTIVATION, CONST, IO_INPUT, IO_OUTPUT, KV_CACHE, WEIGHT};
use DType::{F16, F32, I4, I8, I32, U8};

// ---------------------------------------------------------------------------------------------
// Helpers

/// A test op with a variable number of outputs (no built-in op writes more than one buffer).
const SPLIT: Opcode = Opcode(900);

/// Built-in ops plus `test.SPLIT` (1 input, any number of outputs, no shape rule).
fn registry() -> Registry {
    let mut reg = amk_ops::registry().expect("built-in registry");
    reg.register(
        OpSpec {
            code: SPLIT,
            name: Cow::Borrowed("test.SPLIT"),
            min_inputs: 1,
            max_inputs: Some(1),
            n_outputs: None,
            params: Cow::Borrowed(&[]),
            write_region: amk_core::WriteRegion::Whole,
            check: None,
            summary: Cow::Borrowed("test op: one input, any number of outputs"),
        },
        Origin::Builtin,
    )
    .expect("register test.SPLIT");
    reg
}

fn check(p: &Program) -> ValidationResult {
    validate(p, &registry())
}

fn m(kv: &[(&str, Value)]) -> Map {
    let mut out = Map::new();
    for (k, v) in kv {
        out.insert(*k, v.clone());
    }
    out
}

fn jv(text: &str) -> Value {
    json::parse(text).expect("test JSON literal")
}

fn gemv(k: i64, n_tile: i64, n_off: i64) -> Map {
    m(&[
        ("K", k.into()),
        ("N_tile", n_tile.into()),
        ("n_off", n_off.into()),
    ])
}

fn assert_ok(r: &ValidationResult) {
    assert!(
        r.ok(),
        "expected the program to be accepted:\n{}",
        r.report()
    );
}

fn assert_only(r: &ValidationResult, kind: ErrorKind) {
    assert_eq!(
        r.error_kinds(),
        vec![kind],
        "expected exactly {kind}:\n{}",
        r.report()
    );
}

fn first(r: &ValidationResult, kind: ErrorKind) -> &amk_core::ValidationError {
    r.errors
        .iter()
        .find(|e| e.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} error:\n{}", r.report()))
}

fn assert_mentions(msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} should mention {n:?}");
    }
}

/// A shape-rule case's outcome: accepted (`want` None), or exactly the error `want`, whose
/// message names every one of `names` (e.g. the task).
fn assert_outcome(r: &ValidationResult, want: Option<ErrorKind>, names: &[&str]) {
    match want {
        None => assert_ok(r),
        Some(k) => {
            assert_only(r, k);
            assert_mentions(&first(r, k).message, names);
        }
    }
}

fn h100() -> GpuTarget {
    GpuTarget::by_name("h100").expect("built-in h100 target")
}

// ---------------------------------------------------------------------------------------------
// Base programs

/// `x (IO_INPUT) -COPY-> y (ACTIVATION) -COPY-> z (IO_OUTPUT)`; buffers 0,1,2, counters 0,1,
/// tasks 0 ("make y"), 1 ("make z", waits (0, 1)).
fn chain2() -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 64]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let c0 = p.new_counter("y ready");
    let c1 = p.new_counter("z ready");
    p.push_task(Opcode::COPY, &[x], &[y], c0, &[], Map::new(), "make y");
    p.push_task(
        Opcode::COPY,
        &[y],
        &[z],
        c1,
        &[(c0, 1)],
        Map::new(),
        "make z",
    );
    p
}

/// A loop body: t0 reads STATE `s` (the previous pass's), t1 and t2 follow it, t2 writes `s`,
/// t3 writes STATE `halt` and signals the gate (counter 3). Buffers: 0 s, 1 y, 2 out, 3 halt.
/// `extra`: also a task 4 that reaches no gate producer (its own input to its own output).
fn looped(extra: bool) -> Program {
    let mut p = Program::new();
    let s = p.new_buffer("s", BufferKind::STATE, I32, &[1]);
    let y = p.new_buffer("y", ACTIVATION, I32, &[1]);
    let out = p.new_buffer("out", IO_OUTPUT, I32, &[1]);
    let halt = p.new_buffer("halt", BufferKind::STATE, I32, &[1]);
    let c: Vec<CounterId> = (0..4).map(|i| p.new_counter(format!("c{i}"))).collect();
    p.push_task(Opcode::COPY, &[s], &[y], c[0], &[], Map::new(), "read s");
    p.push_task(
        Opcode::COPY,
        &[y],
        &[out],
        c[1],
        &[(c[0], 1)],
        Map::new(),
        "out",
    );
    p.push_task(
        Opcode::COPY,
        &[y],
        &[s],
        c[2],
        &[(c[1], 1)],
        Map::new(),
        "write s",
    );
    p.push_task(
        Opcode::COPY,
        &[y],
        &[halt],
        c[3],
        &[(c[2], 1)],
        Map::new(),
        "halt",
    );
    if extra {
        let i = p.new_buffer("i", IO_INPUT, I32, &[1]);
        let o = p.new_buffer("o", IO_OUTPUT, I32, &[1]);
        let c4 = p.new_counter("c4");
        p.push_task(Opcode::COPY, &[i], &[o], c4, &[], Map::new(), "stray");
    }
    p.step_loop = Some(amk_core::StepLoop { gate: c[3], halt });
    p
}

/// Four disjoint GEMV tiles of `y = x @ W^T` sharing counter 0, then `z = y + y` waiting
/// (0, 4). Buffers: 0 x [1,64], 1 W [128,64], 2 y [1,128], 3 z [1,128]; tasks 0..3 tiles,
/// 4 the ADD.
fn tiled() -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let w = p.new_weight("w", F32, &[128, 64], "w");
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 128]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 128]);
    let c0 = p.new_counter("y ready");
    let c1 = p.new_counter("z ready");
    for i in 0..4 {
        p.push_task(
            Opcode::GEMV_TILE,
            &[x, w],
            &[y],
            c0,
            &[],
            gemv(64, 32, i * 32),
            format!("tile{i}"),
        );
    }
    p.push_task(
        Opcode::ADD,
        &[y, y],
        &[z],
        c1,
        &[(c0, 4)],
        Map::new(),
        "add",
    );
    p
}

/// Decode attention over caches of 8 rows (2 kv heads x 16), 4 query heads:
/// buffers 0 q [4,16], 1 k_new [1,32], 2 v_new [1,32], 3 kcache [8,2,16], 4 vcache [8,2,16],
/// 5 out [1,64]; task 0 KV_APPEND k (counter 0), 1 KV_APPEND v (counter 1), 2 ATTENTION_TILE
/// waiting on both (counter 2).
fn attention() -> Program {
    let mut p = Program::new();
    let q = p.new_buffer("q", IO_INPUT, F32, &[4, 16]);
    let kn = p.new_buffer("k_new", IO_INPUT, F32, &[1, 32]);
    let vn = p.new_buffer("v_new", IO_INPUT, F32, &[1, 32]);
    let kc = p.new_buffer("kcache", KV_CACHE, F32, &[8, 2, 16]);
    let vc = p.new_buffer("vcache", KV_CACHE, F32, &[8, 2, 16]);
    let out = p.new_buffer("out", IO_OUTPUT, F32, &[1, 64]);
    let ck = p.new_counter("k appended");
    let cv = p.new_counter("v appended");
    let ca = p.new_counter("attn done");
    p.push_task(
        Opcode::KV_APPEND,
        &[kn, kc],
        &[kc],
        ck,
        &[],
        m(&[("pos", 3.into())]),
        "append k",
    );
    p.push_task(
        Opcode::KV_APPEND,
        &[vn, vc],
        &[vc],
        cv,
        &[],
        m(&[("pos", 3.into())]),
        "append v",
    );
    p.push_task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc],
        &[out],
        ca,
        &[(ck, 1), (cv, 1)],
        attn_params(0, 4),
        "attention",
    );
    p
}

fn attn_params(kv_start: i64, kv_len: i64) -> Map {
    m(&[
        ("head_dim", 16.into()),
        ("kv_start", kv_start.into()),
        ("kv_len", kv_len.into()),
        ("scale", 0.25.into()),
        ("n_heads", 4.into()),
        ("n_kv_heads", 2.into()),
    ])
}

/// One FUSED task over `n_inputs` IO_INPUT buffers `[1,64]` writing the IO_OUTPUT buffer
/// `n_inputs`, with the given recipe.
fn fused(n_inputs: usize, recipe: &str) -> Program {
    let mut p = Program::new();
    let ins: Vec<BufferId> = (0..n_inputs)
        .map(|i| p.new_buffer(format!("in{i}"), IO_INPUT, F32, &[1, 64]))
        .collect();
    let out = p.new_buffer("out", IO_OUTPUT, F32, &[1, 64]);
    let c = p.new_counter("done");
    p.push_task(
        Opcode::FUSED,
        &ins,
        &[out],
        c,
        &[],
        m(&[("recipe", jv(recipe))]),
        "fused",
    );
    p
}

const RECIPE_OK: &str = r#"{"steps": [
    {"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0, "params": {}},
    {"op": 12, "args": [{"s": 0}, {"in": 0}], "out": "final", "params": {}}
]}"#;

/// Two activations `a` (1) and `b` (2) on one scratch page, with producers and consumers:
/// task 0 x->a, 1 a->z1 (waits 0), 2 x->b (optionally waits counter 1), 3 b->z2 (waits 2).
fn paged(separated: bool) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let a = p.new_buffer("a", ACTIVATION, F32, &[1, 64]);
    let b = p.new_buffer("b", ACTIVATION, F32, &[1, 64]);
    let z1 = p.new_buffer("z1", IO_OUTPUT, F32, &[1, 64]);
    let z2 = p.new_buffer("z2", IO_OUTPUT, F32, &[1, 64]);
    let c: Vec<CounterId> = (0..4).map(|i| p.new_counter(format!("c{i}"))).collect();
    p.push_task(Opcode::COPY, &[x], &[a], c[0], &[], Map::new(), "make a");
    p.push_task(
        Opcode::COPY,
        &[a],
        &[z1],
        c[1],
        &[(c[0], 1)],
        Map::new(),
        "use a",
    );
    let w: &[(CounterId, i64)] = if separated { &[(c[1], 1)] } else { &[] };
    p.push_task(Opcode::COPY, &[x], &[b], c[2], w, Map::new(), "make b");
    p.push_task(
        Opcode::COPY,
        &[b],
        &[z2],
        c[3],
        &[(c[2], 1)],
        Map::new(),
        "use b",
    );
    p.pages = Some(PageAllocation {
        buffer_to_page: vec![(a, 0), (b, 0)],
        pages: vec![Page {
            id: 0,
            space: MemSpace::GLOBAL_SCRATCH,
            nbytes: 256,
            live_start: -1,
            live_end: -1,
        }],
    });
    p
}

/// Nine (or `n`) producers `x -> y_i` on their own counters and a NOP waiting on all of them.
fn fan_in(n: usize) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let mut waits = Vec::new();
    for i in 0..n {
        let y = p.new_buffer(format!("y{i}"), ACTIVATION, F32, &[1, 64]);
        let c = p.new_counter(format!("c{i}"));
        p.push_task(
            Opcode::COPY,
            &[x],
            &[y],
            c,
            &[],
            Map::new(),
            format!("p{i}"),
        );
        waits.push((c, 1));
    }
    let done = p.new_counter("join");
    p.push_task(Opcode::NOP, &[], &[], done, &waits, Map::new(), "join");
    p
}

/// Two producers `x -> a`, `x -> b` signal `parts ready`; `ADD a, b -> z` waits for both and
/// signals `merged`; listed last, or first with `merge_first`. No SM, nothing floating.
/// Returns the program and the merge's task index.
fn merge_of_two(merge_first: bool) -> (Program, usize) {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let a = p.new_buffer("a", ACTIVATION, F32, &[1, 64]);
    let b = p.new_buffer("b", ACTIVATION, F32, &[1, 64]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let parts = p.new_counter("parts ready");
    let merged = p.new_counter("merged");
    let merge = |p: &mut Program| {
        p.push_task(
            Opcode::ADD,
            &[a, b],
            &[z],
            merged,
            &[(parts, 2)],
            Map::new(),
            "merge",
        ) as usize
    };
    let first = merge_first.then(|| merge(&mut p));
    p.push_task(Opcode::COPY, &[x], &[a], parts, &[], Map::new(), "part a");
    p.push_task(Opcode::COPY, &[x], &[b], parts, &[], Map::new(), "part b");
    let m = first.unwrap_or_else(|| merge(&mut p));
    (p, m)
}

/// [`merge_of_two`], its producers on SMs 0 and 1, the merge (task 2) floating.
fn floating_merge() -> Program {
    let (mut p, m) = merge_of_two(false);
    p.tasks[0].sm = Some(0);
    p.tasks[1].sm = Some(1);
    p.tasks[m].floating = true;
    p
}

/// `test.SPLIT` of x into `n` distinct activations.
fn split(n: usize) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let outs: Vec<BufferId> = (0..n)
        .map(|i| p.new_buffer(format!("o{i}"), ACTIVATION, F32, &[1, 64]))
        .collect();
    let c = p.new_counter("split");
    p.push_task(SPLIT, &[x], &outs, c, &[], Map::new(), "split");
    p
}

/// `RMSNORM [x, w] -> z` with the given params.
fn rmsnorm(params: Map) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let w = p.new_weight("norm", F32, &[64], "norm.weight");
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let c = p.new_counter("z ready");
    p.push_task(Opcode::RMSNORM, &[x, w], &[z], c, &[], params, "norm");
    p
}

fn rms_params() -> Map {
    m(&[("eps", 1e-6.into()), ("hidden", 64.into())])
}

// ---------------------------------------------------------------------------------------------
// One defect per error kind, and its closest valid program

/// A program exhibiting `kind`: the program, error kinds that necessarily come with it, and
/// substrings its message must contain.
struct Defect {
    prog: Program,
    also: &'static [ErrorKind],
    mentions: Vec<String>,
    task: Option<TaskId>,
    buffer: Option<BufferId>,
    counter: Option<CounterId>,
}

impl Defect {
    fn new(prog: Program, mentions: &[&str]) -> Self {
        Defect {
            prog,
            also: &[],
            mentions: mentions.iter().map(|s| s.to_string()).collect(),
            task: None,
            buffer: None,
            counter: None,
        }
    }
    fn task(mut self, t: TaskId) -> Self {
        self.task = Some(t);
        self
    }
    fn buffer(mut self, b: BufferId) -> Self {
        self.buffer = Some(b);
        self
    }
    fn counter(mut self, c: CounterId) -> Self {
        self.counter = Some(c);
        self
    }
    fn also(mut self, k: &'static [ErrorKind]) -> Self {
        self.also = k;
        self
    }
}

/// Exhaustive over `ErrorKind`: adding a kind without a test fails to compile.
fn defect(kind: ErrorKind) -> Defect {
    use ErrorKind as K;
    match kind {
        K::MissingBuffer => {
            let mut p = chain2();
            p.tasks[1].inputs = vec![7];
            Defect::new(p, &["task 1", "#7"]).task(1).buffer(7)
        }
        K::MissingCounter => {
            let mut p = chain2();
            p.tasks[1].out_counter = 5;
            Defect::new(p, &["task 1", "#5"]).task(1).counter(5)
        }
        K::CapInputs => Defect::new(
            fused(
                9,
                r#"{"steps": [{"op": 11, "args": [{"in": 0}, {"in": 8}], "out": "final"}]}"#,
            ),
            &["task 0", "9"],
        )
        .task(0),
        K::CapOutputs => Defect::new(split(5), &["task 0", "5"]).task(0),
        K::CapWaits => Defect::new(fan_in(9), &["task 9", "9"]).task(9),
        K::CapRank => {
            let mut p = Program::new();
            let x = p.new_buffer("x5", IO_INPUT, F32, &[1, 1, 1, 2, 32]);
            let z = p.new_buffer("z", IO_OUTPUT, F32, &[64]);
            let c = p.new_counter("z ready");
            p.push_task(Opcode::COPY, &[x], &[z], c, &[], Map::new(), "copy");
            Defect::new(p, &["task 0", "#0", "5"]).task(0).buffer(0)
        }
        K::BadThreshold => {
            let mut p = chain2();
            p.tasks[1].waits[0].threshold = 0;
            Defect::new(p, &["task 1", "#0"]).task(1).counter(0)
        }
        K::SelfWait => {
            let mut p = chain2();
            p.tasks[1].waits.push(amk_core::Wait {
                counter: 1,
                threshold: 1,
            });
            Defect::new(p, &["task 1", "#1"])
                .task(1)
                .counter(1)
                .also(&[K::Cycle])
        }
        K::UnregisteredOp => {
            let mut p = chain2();
            p.tasks[1].op = Opcode(999);
            Defect::new(p, &["task 1", "999"]).task(1)
        }
        K::ArityInputs => {
            let mut p = chain2();
            p.tasks[1].op = Opcode::ADD;
            Defect::new(p, &["task 1", "ADD"]).task(1)
        }
        K::ArityOutputs => {
            let mut p = chain2();
            let w = p.new_buffer("w", ACTIVATION, F32, &[1, 64]);
            p.tasks[1].outputs.push(w);
            Defect::new(p, &["task 1", "COPY"]).task(1)
        }
        K::MissingParam => {
            Defect::new(rmsnorm(m(&[("hidden", 64.into())])), &["task 0", "eps"]).task(0)
        }
        K::ParamType => Defect::new(
            rmsnorm(m(&[("eps", "tiny".into()), ("hidden", 64.into())])),
            &["task 0", "eps"],
        )
        .task(0),
        K::NoProducer => {
            let mut p = chain2();
            let c2 = p.new_counter("orphan");
            p.tasks[1].waits.push(amk_core::Wait {
                counter: c2,
                threshold: 1,
            });
            Defect::new(p, &["task 1", "#2"]).task(1).counter(2)
        }
        K::ThresholdExceeds => {
            let mut p = chain2();
            p.tasks[1].waits[0].threshold = 2;
            Defect::new(p, &["task 1", "#0"]).task(1).counter(0)
        }
        K::PartialSharedWait => {
            let mut p = tiled();
            p.tasks[4].waits[0].threshold = 2;
            Defect::new(p, &["task 4", "#0"]).task(4).counter(0)
        }
        K::Cycle => {
            let mut p = chain2();
            p.tasks[0].waits.push(amk_core::Wait {
                counter: 1,
                threshold: 1,
            });
            Defect::new(p, &["0", "1", "->"])
        }
        K::NeverProduced => {
            let mut p = chain2();
            let u = p.new_buffer("unwritten", ACTIVATION, F32, &[1, 64]);
            p.tasks[1].op = Opcode::ADD;
            p.tasks[1].inputs.push(u);
            Defect::new(p, &["task 1", "#3", "unwritten"])
                .task(1)
                .buffer(3)
        }
        K::RawRace => {
            let mut p = chain2();
            p.tasks[1].waits.clear();
            Defect::new(p, &["task 1", "#1", "0"]).task(1).buffer(1)
        }
        K::RawRaceKv => {
            let mut p = attention();
            p.tasks[2].waits.retain(|w| w.counter != 0);
            Defect::new(p, &["task 2", "#3", "kcache", "0"])
                .task(2)
                .buffer(3)
        }
        K::WawRace => {
            let mut p = tiled();
            p.tasks[1].params = gemv(64, 32, 16); // [16, 48) overlaps tile 0's [0, 32)
            Defect::new(p, &["#2", "0", "1"]).buffer(2)
        }
        K::OnchipCrossSm => {
            let mut p = chain2();
            p.buffers[1].space = MemSpace::SMEM;
            p.tasks[0].sm = Some(0);
            p.tasks[1].sm = Some(1);
            Defect::new(p, &["#1", "y", "0", "1"]).buffer(1)
        }
        K::SmQueueOrder => Defect::new(reversed_chain(Some(0), Some(0)), &["0", "1"]).task(0),
        K::SmOutOfRange => {
            let mut p = chain2();
            p.target = Some(h100());
            p.tasks[0].sm = Some(0);
            p.tasks[1].sm = Some(132);
            Defect::new(p, &["task 1", "132"]).task(1)
        }
        K::PageClobber => Defect::new(paged(false), &["page 0", "#1", "#2"]),
        K::OutputUnproduced => {
            let mut p = chain2();
            p.new_buffer("unused_out", IO_OUTPUT, F32, &[1, 64]);
            Defect::new(p, &["#3", "unused_out"]).buffer(3)
        }
        K::WriteReadonly => {
            let mut p = chain2();
            p.buffers[2].kind = WEIGHT;
            Defect::new(p, &["task 1", "#2"]).task(1).buffer(2)
        }
        K::TileOutOfBounds => {
            let mut p = tiled();
            p.tasks[3].params = gemv(64, 32, 112); // [112, 144) beyond N = 128
            Defect::new(p, &["task 3", "144", "128"]).task(3)
        }
        K::ShapeMismatch => {
            let mut p = tiled();
            p.tasks[2].params = gemv(32, 32, 64); // K = 32, but x and W have 64 columns
            Defect::new(p, &["task 2", "K"]).task(2)
        }
        K::CounterInit => {
            let mut p = chain2();
            p.counters[0].init = 1;
            Defect::new(p, &["#0"]).counter(0)
        }
        K::InplaceUninitRead => Defect::new(inplace(false), &["task 0", "#1"])
            .task(0)
            .buffer(1),
        K::FusedRecipe => Defect::new(
            fused(
                2,
                r#"{"steps": [{"op": 19, "args": [{"in": 0}], "out": "final", "params": {}}]}"#,
            ),
            &["task 0", "FUSED"],
        )
        .task(0),
        K::StepLoop => Defect::new(looped(true), &["1 task(s)", "4:stray", "#3"])
            .task(4)
            .counter(3),
        K::BadConfig => {
            let mut p = chain2();
            p.target = Some(h100());
            p.config = Some(ScheduleConfig {
                threads_per_block: 7,
                ..ScheduleConfig::default()
            });
            Defect::new(p, &["threads_per_block = 7", "multiple of 32"])
        }
        K::FloatingTask => {
            // A second task waits on the floating merge's counter: the count no longer names
            // one runner that alone acts on it.
            let mut p = floating_merge();
            let done = p.new_counter("also waiting");
            p.push_task(Opcode::NOP, &[], &[], done, &[(0, 2)], Map::new(), "also");
            Defect::new(p, &["task 2", "#0", "task 3 waits on too"])
                .task(2)
                .counter(0)
        }
        K::PageTable => {
            let mut p = chain2();
            p.pages = Some(PageAllocation {
                buffer_to_page: vec![(1, 3)],
                pages: vec![Page {
                    id: 0,
                    space: MemSpace::GLOBAL_SCRATCH,
                    nbytes: 256,
                    live_start: -1,
                    live_end: -1,
                }],
            });
            Defect::new(p, &["#1", "3"]).buffer(1)
        }
    }
}

/// The closest valid program to `defect(kind)`.
fn fixed(kind: ErrorKind) -> Program {
    use ErrorKind as K;
    match kind {
        K::MissingBuffer
        | K::MissingCounter
        | K::BadThreshold
        | K::SelfWait
        | K::UnregisteredOp
        | K::NoProducer
        | K::ThresholdExceeds
        | K::Cycle
        | K::RawRace
        | K::CounterInit
        | K::WriteReadonly
        | K::OutputUnproduced
        | K::ArityOutputs => chain2(),
        K::CapInputs => fused(
            8,
            r#"{"steps": [{"op": 11, "args": [{"in": 0}, {"in": 7}], "out": "final"}]}"#,
        ),
        K::CapOutputs => split(4),
        K::CapWaits => fan_in(8),
        K::CapRank => {
            let mut p = Program::new();
            let x = p.new_buffer("x4", IO_INPUT, F32, &[1, 1, 2, 32]);
            let z = p.new_buffer("z", IO_OUTPUT, F32, &[64]);
            let c = p.new_counter("z ready");
            p.push_task(Opcode::COPY, &[x], &[z], c, &[], Map::new(), "copy");
            p
        }
        K::ArityInputs => {
            let mut p = chain2();
            p.tasks[1].op = Opcode::ADD;
            p.tasks[1].inputs = vec![1, 1];
            p
        }
        K::MissingParam | K::ParamType => rmsnorm(rms_params()),
        K::PartialSharedWait | K::WawRace | K::TileOutOfBounds | K::ShapeMismatch => tiled(),
        K::NeverProduced => {
            let mut p = chain2();
            let u = p.new_buffer("external", IO_INPUT, F32, &[1, 64]);
            p.tasks[1].op = Opcode::ADD;
            p.tasks[1].inputs.push(u);
            p
        }
        K::RawRaceKv => attention(),
        K::OnchipCrossSm => {
            let mut p = chain2();
            p.buffers[1].space = MemSpace::SMEM;
            p.tasks[0].sm = Some(1);
            p.tasks[1].sm = Some(1);
            p
        }
        K::SmQueueOrder => reversed_chain(Some(0), Some(1)),
        K::SmOutOfRange => {
            let mut p = chain2();
            p.target = Some(h100());
            p.tasks[0].sm = Some(0);
            p.tasks[1].sm = Some(131);
            p
        }
        K::PageClobber => paged(true),
        K::InplaceUninitRead => inplace(true),
        K::FusedRecipe => fused(2, RECIPE_OK),
        K::StepLoop => looped(false),
        K::BadConfig => {
            let mut p = chain2();
            p.target = Some(h100());
            p.config = Some(ScheduleConfig::default());
            p
        }
        K::FloatingTask => floating_merge(),
        K::PageTable => {
            let mut p = chain2();
            p.pages = Some(PageAllocation {
                buffer_to_page: vec![(1, 0)],
                pages: vec![Page {
                    id: 0,
                    space: MemSpace::GLOBAL_SCRATCH,
                    nbytes: 256,
                    live_start: -1,
                    live_end: -1,
                }],
            });
            p
        }
    }
}

/// Task 0 `y -> z` waits on task 1 `x -> y`: the consumer is listed first.
fn reversed_chain(sm0: Option<i32>, sm1: Option<i32>) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 64]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let c0 = p.new_counter("z ready");
    let c1 = p.new_counter("y ready");
    p.push_task(
        Opcode::COPY,
        &[y],
        &[z],
        c0,
        &[(c1, 1)],
        Map::new(),
        "consumer",
    );
    p.push_task(Opcode::COPY, &[x], &[y], c1, &[], Map::new(), "producer");
    p.tasks[0].sm = sm0;
    p.tasks[1].sm = sm1;
    p
}

/// `y += x` in place. Without a prior writer the ADD reads its own uninitialised output;
/// with one (`COPY x -> y` first) it is a legitimate in-place update.
fn inplace(with_init: bool) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 64]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let mut waits = Vec::new();
    if with_init {
        let c = p.new_counter("y init");
        p.push_task(Opcode::COPY, &[x], &[y], c, &[], Map::new(), "init y");
        waits.push((c, 1));
    }
    let ca = p.new_counter("y updated");
    p.push_task(Opcode::ADD, &[y, x], &[y], ca, &waits, Map::new(), "y += x");
    let cz = p.new_counter("z ready");
    p.push_task(Opcode::COPY, &[y], &[z], cz, &[(ca, 1)], Map::new(), "emit");
    p
}

#[rstest]
#[case::missing_buffer(ErrorKind::MissingBuffer)]
#[case::missing_counter(ErrorKind::MissingCounter)]
#[case::cap_inputs(ErrorKind::CapInputs)]
#[case::cap_outputs(ErrorKind::CapOutputs)]
#[case::cap_waits(ErrorKind::CapWaits)]
#[case::cap_rank(ErrorKind::CapRank)]
#[case::bad_threshold(ErrorKind::BadThreshold)]
#[case::self_wait(ErrorKind::SelfWait)]
#[case::unregistered_op(ErrorKind::UnregisteredOp)]
#[case::arity_inputs(ErrorKind::ArityInputs)]
#[case::arity_outputs(ErrorKind::ArityOutputs)]
#[case::missing_param(ErrorKind::MissingParam)]
#[case::param_type(ErrorKind::ParamType)]
#[case::no_producer(ErrorKind::NoProducer)]
#[case::threshold_exceeds(ErrorKind::ThresholdExceeds)]
#[case::partial_shared_wait(ErrorKind::PartialSharedWait)]
#[case::cycle(ErrorKind::Cycle)]
#[case::never_produced(ErrorKind::NeverProduced)]
#[case::raw_race(ErrorKind::RawRace)]
#[case::raw_race_kv(ErrorKind::RawRaceKv)]
#[case::waw_race(ErrorKind::WawRace)]
#[case::onchip_cross_sm(ErrorKind::OnchipCrossSm)]
#[case::sm_queue_order(ErrorKind::SmQueueOrder)]
#[case::sm_out_of_range(ErrorKind::SmOutOfRange)]
#[case::page_clobber(ErrorKind::PageClobber)]
#[case::output_unproduced(ErrorKind::OutputUnproduced)]
#[case::write_readonly(ErrorKind::WriteReadonly)]
#[case::tile_out_of_bounds(ErrorKind::TileOutOfBounds)]
#[case::shape_mismatch(ErrorKind::ShapeMismatch)]
#[case::counter_init(ErrorKind::CounterInit)]
#[case::inplace_uninit_read(ErrorKind::InplaceUninitRead)]
#[case::fused_recipe(ErrorKind::FusedRecipe)]
#[case::page_table(ErrorKind::PageTable)]
#[case::step_loop(ErrorKind::StepLoop)]
#[case::bad_config(ErrorKind::BadConfig)]
#[case::floating_task(ErrorKind::FloatingTask)]
fn error_kind_negative_and_positive(#[case] kind: ErrorKind) {
    let d = defect(kind);
    let r = check(&d.prog);
    assert!(!r.ok(), "{kind}: defect accepted:\n{}", r.report());
    let mut want: BTreeSet<ErrorKind> = d.also.iter().copied().collect();
    want.insert(kind);
    let got: BTreeSet<ErrorKind> = r.error_kinds().into_iter().collect();
    assert_eq!(got, want, "{kind}: wrong error kinds:\n{}", r.report());
    let e = first(&r, kind);
    let needles: Vec<&str> = d.mentions.iter().map(String::as_str).collect();
    assert_mentions(&e.message, &needles);
    if d.task.is_some() {
        assert_eq!(e.task, d.task, "{kind}: task field of {e:?}");
    }
    if d.buffer.is_some() {
        assert_eq!(e.buffer, d.buffer, "{kind}: buffer field of {e:?}");
    }
    if d.counter.is_some() {
        assert_eq!(e.counter, d.counter, "{kind}: counter field of {e:?}");
    }
    assert_eq!(ErrorKind::from_str_opt(kind.as_str()), Some(kind));

    let fix = fixed(kind);
    let r = check(&fix);
    assert!(!r.has(kind), "{kind}: closest valid program still has it");
    assert_ok(&r);
    assert!(
        r.warnings.is_empty(),
        "{kind}: fixed program has warnings:\n{}",
        r.report()
    );
}

#[test]
fn vocabulary_is_the_contracts() {
    // docs/ir.md, "Error vocabulary": the reference tooling's classes in order, then ours.
    let errors = "missing_buffer, missing_counter, cap_inputs, cap_outputs, cap_waits, cap_rank, \
        bad_threshold, self_wait, unregistered_op, arity_inputs, arity_outputs, missing_param, \
        param_type, no_producer, threshold_exceeds, partial_shared_wait, cycle, never_produced, \
        raw_race, raw_race_kv, waw_race, onchip_cross_sm, sm_queue_order, sm_out_of_range, \
        page_clobber, output_unproduced, write_readonly, tile_out_of_bounds, shape_mismatch, \
        counter_init, inplace_uninit_read, fused_recipe, page_table, step_loop, bad_config, \
        floating_task";
    let got: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
    let want: Vec<&str> = errors.split(", ").collect();
    assert_eq!(got, want);
    assert_eq!(ErrorKind::ALL.len(), 36);
    let warnings: Vec<&str> = WarningKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(
        warnings,
        ["unknown_param", "onchip_unverified", "gpu_label_mismatch"]
    );
}

// ---------------------------------------------------------------------------------------------
// Variants of the structural checks

#[test]
fn missing_output_buffer_is_reported_with_its_id() {
    let mut p = chain2();
    p.tasks[0].outputs = vec![42];
    let r = check(&p);
    let e = first(&r, ErrorKind::MissingBuffer);
    assert_mentions(&e.message, &["task 0", "#42"]);
    assert_eq!(e.buffer, Some(42));
}

#[test]
fn wait_on_missing_counter_is_missing_counter() {
    let mut p = chain2();
    p.tasks[1].waits.push(amk_core::Wait {
        counter: 9,
        threshold: 1,
    });
    let r = check(&p);
    assert_only(&r, ErrorKind::MissingCounter);
    let e = first(&r, ErrorKind::MissingCounter);
    assert_mentions(&e.message, &["task 1", "#9"]);
    assert_eq!(e.counter, Some(9));
}

#[rstest]
#[case(0)]
#[case(-1)]
#[case(i64::MIN)]
fn non_positive_thresholds_are_bad(#[case] thr: i64) {
    let mut p = chain2();
    p.tasks[1].waits[0].threshold = thr;
    let r = check(&p);
    assert_only(&r, ErrorKind::BadThreshold);
    assert_mentions(&first(&r, ErrorKind::BadThreshold).message, &["task 1"]);
}

#[test]
fn threshold_far_above_producers_is_exceeds_not_a_crash() {
    let mut p = chain2();
    p.tasks[1].waits[0].threshold = i64::MAX;
    assert_only(&check(&p), ErrorKind::ThresholdExceeds);
}

#[rstest]
#[case::string_eps("eps", Value::from("tiny"))]
#[case::bool_eps("eps", Value::Bool(true))]
#[case::null_eps("eps", Value::Null)]
#[case::array_eps("eps", jv("[1e-6]"))]
#[case::float_hidden("hidden", Value::Float(64.5))]
#[case::integral_float_hidden("hidden", Value::Float(64.0))]
#[case::bool_hidden("hidden", Value::Bool(true))]
#[case::string_hidden("hidden", Value::from("64"))]
#[case::hidden_beyond_int32("hidden", Value::Int(1 << 40))]
#[case::object_hidden("hidden", jv(r#"{"v": 64}"#))]
fn param_of_wrong_type_is_param_type(#[case] key: &str, #[case] v: Value) {
    let mut params = rms_params();
    params.insert(key, v);
    let r = check(&rmsnorm(params));
    assert_only(&r, ErrorKind::ParamType);
    assert_mentions(&first(&r, ErrorKind::ParamType).message, &["task 0", key]);
}

#[rstest]
#[case::int_eps(m(&[("eps", 0.into()), ("hidden", 64.into())]))]
#[case::float_eps(m(&[("eps", 1e-5.into()), ("hidden", 64.into())]))]
#[case::params_in_any_order(m(&[("hidden", 64.into()), ("eps", 1e-6.into())]))]
fn well_typed_params_are_accepted(#[case] params: Map) {
    assert_ok(&check(&rmsnorm(params)));
}

#[test]
fn missing_params_are_each_named() {
    let r = check(&rmsnorm(Map::new()));
    assert_only(&r, ErrorKind::MissingParam);
    let all: Vec<&str> = r.errors.iter().map(|e| e.message.as_str()).collect();
    assert!(all.iter().any(|m| m.contains("eps")), "{all:?}");
    assert!(all.iter().any(|m| m.contains("hidden")), "{all:?}");
}

#[rstest]
#[case::weight(WEIGHT)]
#[case::constant(CONST)]
#[case::io_input(IO_INPUT)]
fn writing_a_read_only_kind_is_rejected(#[case] kind: BufferKind) {
    let mut p = chain2();
    p.buffers[1].kind = kind; // y, written by task 0 and read by task 1
    let r = check(&p);
    assert_only(&r, ErrorKind::WriteReadonly);
    let e = first(&r, ErrorKind::WriteReadonly);
    assert_mentions(&e.message, &["task 0", "#1"]);
    assert_eq!((e.task, e.buffer), (Some(0), Some(1)));
}

#[rstest]
#[case::activation(ACTIVATION)]
#[case::kv_cache(KV_CACHE)]
fn writing_a_transient_kind_is_fine(#[case] kind: BufferKind) {
    let mut p = chain2();
    p.buffers[1].kind = kind;
    assert_ok(&check(&p));
}

#[test]
fn arity_outputs_for_a_missing_output() {
    let mut p = chain2();
    p.buffers[2].kind = ACTIVATION; // so that no output_unproduced comes with it
    p.tasks[1].outputs.clear();
    let r = check(&p);
    assert_only(&r, ErrorKind::ArityOutputs);
}

#[test]
fn too_many_inputs_is_arity_for_a_bounded_op() {
    let mut p = chain2();
    p.tasks[1].inputs = vec![1, 1];
    let r = check(&p);
    assert_only(&r, ErrorKind::ArityInputs);
    assert_mentions(&first(&r, ErrorKind::ArityInputs).message, &["task 1", "2"]);
}

#[test]
fn a_rank_five_output_is_also_cap_rank() {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[64]);
    let z = p.new_buffer("z5", IO_OUTPUT, F32, &[2, 1, 1, 1, 32]);
    let c = p.new_counter("z");
    p.push_task(Opcode::COPY, &[x], &[z], c, &[], Map::new(), "copy");
    let r = check(&p);
    assert_only(&r, ErrorKind::CapRank);
    assert_eq!(first(&r, ErrorKind::CapRank).buffer, Some(1));
}

// ---------------------------------------------------------------------------------------------
// RAW provenance (transitive), "every other writer before every reader", KV caches

/// Writer `x -> y` (task 0), then `hops` relay tasks each waiting only on the previous one,
/// then the reader `y (+ last relay) -> z` waiting only on the last relay.
fn relay(hops: usize, broken_at: Option<usize>) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 64]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let mut prev = p.new_counter("y ready");
    p.push_task(Opcode::COPY, &[x], &[y], prev, &[], Map::new(), "writer");
    let mut last = y;
    for i in 0..hops {
        let r = p.new_buffer(format!("r{i}"), ACTIVATION, F32, &[1, 64]);
        let c = p.new_counter(format!("relay {i}"));
        let waits: Vec<(CounterId, i64)> = if broken_at == Some(i) {
            vec![]
        } else {
            vec![(prev, 1)]
        };
        // Relay 0 reads x (external) so it carries no data dependency on y; later relays
        // read the previous relay's buffer.
        let input = if i == 0 { x } else { last };
        p.push_task(
            Opcode::COPY,
            &[input],
            &[r],
            c,
            &waits,
            Map::new(),
            format!("relay{i}"),
        );
        prev = c;
        last = r;
    }
    let c = p.new_counter("z ready");
    p.push_task(
        Opcode::ADD,
        &[y, last],
        &[z],
        c,
        &[(prev, 1)],
        Map::new(),
        "reader",
    );
    p
}

#[test]
fn raw_provenance_is_transitive_three_hops() {
    // writer -> relay0 -> relay1 -> reader: the reader waits only on relay1 (not on the
    // writer), and relay1 itself did not wait on the writer either.
    let p = relay(2, None);
    assert_eq!(p.tasks[3].waits.len(), 1);
    assert_ne!(p.tasks[3].waits[0].counter, p.tasks[0].out_counter);
    assert_ok(&check(&p));
}

#[rstest]
#[case(1)]
#[case(63)]
#[case(64)]
#[case(65)]
#[case(200)]
fn raw_provenance_is_transitive_over_long_chains(#[case] hops: usize) {
    assert_ok(&check(&relay(hops, None)));
}

#[rstest]
#[case(2, 0)]
#[case(2, 1)]
#[case(130, 0)]
#[case(130, 70)]
fn a_broken_relay_chain_is_a_raw_race(#[case] hops: usize, #[case] broken: usize) {
    let p = relay(hops, Some(broken));
    let reader = (p.tasks.len() - 1) as TaskId;
    let r = check(&p);
    assert_only(&r, ErrorKind::RawRace);
    let e = r
        .errors
        .iter()
        .find(|e| e.task == Some(reader))
        .unwrap_or_else(|| panic!("no race reported for the reader:\n{}", r.report()));
    assert_eq!(e.buffer, Some(1));
    assert_eq!(e.others, vec![0]);
    assert_mentions(&e.message, &[&format!("task {reader}"), "#1", "'y'"]);
}

#[test]
fn a_rewrite_after_the_read_is_a_race_even_when_ordered() {
    // task 0 writes y; task 1 reads y (waits 0); task 2 rewrites y after task 1 (waits 1).
    // Every other writer must happen-before every reader: task 2 does not precede task 1.
    let mut p = chain2();
    let c2 = p.new_counter("y rewritten");
    p.push_task(
        Opcode::COPY,
        &[0],
        &[1],
        c2,
        &[(1, 1)],
        Map::new(),
        "rewrite y",
    );
    let r = check(&p);
    assert_only(&r, ErrorKind::RawRace);
    let e = first(&r, ErrorKind::RawRace);
    assert_eq!((e.task, e.buffer), (Some(1), Some(1)));
    assert_eq!(e.others, vec![2]);
    assert_mentions(&e.message, &["task 1", "#1", "2"]);
}

#[test]
fn ordered_rewrite_before_the_read_is_fine() {
    // task 0 writes y, task 1 rewrites y after it, task 2 reads y after task 1.
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 64]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let c: Vec<CounterId> = (0..3).map(|i| p.new_counter(format!("c{i}"))).collect();
    p.push_task(Opcode::COPY, &[x], &[y], c[0], &[], Map::new(), "w1");
    p.push_task(
        Opcode::COPY,
        &[x],
        &[y],
        c[1],
        &[(c[0], 1)],
        Map::new(),
        "w2",
    );
    p.push_task(
        Opcode::COPY,
        &[y],
        &[z],
        c[2],
        &[(c[1], 1)],
        Map::new(),
        "read",
    );
    assert_ok(&check(&p));
}

#[test]
fn a_reader_must_follow_every_writer_not_just_one() {
    // Two ordered writers of y; the reader waits only on the first.
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 64]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let c: Vec<CounterId> = (0..3).map(|i| p.new_counter(format!("c{i}"))).collect();
    p.push_task(Opcode::COPY, &[x], &[y], c[0], &[], Map::new(), "w1");
    p.push_task(
        Opcode::COPY,
        &[x],
        &[y],
        c[1],
        &[(c[0], 1)],
        Map::new(),
        "w2",
    );
    p.push_task(
        Opcode::COPY,
        &[y],
        &[z],
        c[2],
        &[(c[0], 1)],
        Map::new(),
        "read",
    );
    let r = check(&p);
    assert_only(&r, ErrorKind::RawRace);
    let e = first(&r, ErrorKind::RawRace);
    assert_eq!((e.task, e.others.clone()), (Some(2), vec![1]));
}

#[test]
fn a_kv_cache_no_task_writes_holds_prior_state_and_is_readable() {
    // No append this pass: the attention reads the caches as the previous steps left them.
    let mut p = Program::new();
    let q = p.new_buffer("q", IO_INPUT, F32, &[4, 16]);
    let kc = p.new_buffer("kcache", KV_CACHE, F32, &[8, 2, 16]);
    let vc = p.new_buffer("vcache", KV_CACHE, F32, &[8, 2, 16]);
    let out = p.new_buffer("out", IO_OUTPUT, F32, &[1, 64]);
    let c = p.new_counter("attn");
    p.push_task(
        Opcode::ATTENTION_TILE,
        &[q, kc, vc],
        &[out],
        c,
        &[],
        attn_params(0, 8),
        "attention",
    );
    let r = check(&p);
    assert_ok(&r);
    assert!(!r.has(ErrorKind::NeverProduced));
    assert_eq!(p.simulate_adversarial(8), vec![]);
    // The same read of an ACTIVATION buffer is never_produced.
    p.buffers[kc as usize].kind = ACTIVATION;
    let r = check(&p);
    assert_only(&r, ErrorKind::NeverProduced);
    assert_eq!(first(&r, ErrorKind::NeverProduced).buffer, Some(kc));
}

#[test]
fn kv_append_reading_its_own_cache_is_fine() {
    let p = attention();
    let r = check(&p);
    assert_ok(&r);
    assert!(r.warnings.is_empty(), "{}", r.report());
    // The append lists the cache as input and output.
    assert_eq!(p.tasks[0].inputs[1], p.tasks[0].outputs[0]);
}

#[test]
fn reading_a_kv_cache_before_the_append_is_raw_race_kv() {
    let mut p = attention();
    p.tasks[2].waits.retain(|w| w.counter != 1); // forget the v append
    let r = check(&p);
    assert_only(&r, ErrorKind::RawRaceKv);
    let e = first(&r, ErrorKind::RawRaceKv);
    assert_eq!(
        (e.task, e.buffer, e.others.clone()),
        (Some(2), Some(4), vec![1])
    );
    assert_mentions(&e.message, &["task 2", "#4", "vcache", "1"]);
}

#[test]
fn a_second_append_into_a_cache_the_first_reads_is_rejected_like_the_reference() {
    // docs/ir.md, "Validator rules", check 5 (`raw_race`): the KV exemption only holds when
    // the reader is the sole writer. Two ordered appends: the first "reads" the cache, and the
    // second writer does not precede it.
    let mut p = Program::new();
    let k0 = p.new_buffer("k0", IO_INPUT, F32, &[1, 32]);
    let k1 = p.new_buffer("k1", IO_INPUT, F32, &[1, 32]);
    let kc = p.new_buffer("kcache", KV_CACHE, F32, &[8, 2, 16]);
    let c0 = p.new_counter("a0");
    let c1 = p.new_counter("a1");
    p.push_task(
        Opcode::KV_APPEND,
        &[k0, kc],
        &[kc],
        c0,
        &[],
        m(&[("pos", 0.into())]),
        "append 0",
    );
    p.push_task(
        Opcode::KV_APPEND,
        &[k1, kc],
        &[kc],
        c1,
        &[(c0, 1)],
        m(&[("pos", 1.into())]),
        "append 1",
    );
    let r = check(&p);
    assert_only(&r, ErrorKind::RawRaceKv);
    let e = first(&r, ErrorKind::RawRaceKv);
    assert_eq!(
        (e.task, e.buffer, e.others.clone()),
        (Some(0), Some(2), vec![1])
    );
}

/// A chunk's append split into column slices (`n_off`, `N_tile`) on one counter: `cuts` give
/// the slices of a row of 32; then, when `reader_waits`, an attention-like COPY of the cache
/// waits for all of them.
fn sliced_appends(cuts: &[(i64, i64)], reader_waits: bool) -> Program {
    let mut p = Program::new();
    let k = p.new_buffer("k", IO_INPUT, F32, &[4, 32]);
    let pos = p.new_buffer("pos", IO_INPUT, I32, &[1]);
    let kc = p.new_buffer("kcache", KV_CACHE, F32, &[8, 2, 16]);
    let out = p.new_buffer("out", IO_OUTPUT, F32, &[8, 32]);
    let c = p.new_counter("appended");
    for (i, &(off, tile)) in cuts.iter().enumerate() {
        p.push_task(
            Opcode::KV_APPEND,
            &[k, kc, pos],
            &[kc],
            c,
            &[],
            m(&[("n_off", off.into()), ("N_tile", tile.into())]),
            format!("append[{i}]"),
        );
    }
    let waits = if reader_waits {
        vec![(c, cuts.len() as i64)]
    } else {
        Vec::new()
    };
    let c2 = p.new_counter("read");
    p.push_task(Opcode::COPY, &[kc], &[out], c2, &waits, Map::new(), "read");
    p
}

#[test]
fn appends_of_disjoint_column_slices_on_one_counter_are_one_append() {
    // A slice overwrites its columns without reading the cache (KV_APPEND's
    // `OverwrittenColumns`): its cache input is no read, and disjoint slices share a counter
    // as GEMV tiles do. A reader after all of them is ordered after every writer.
    let p = sliced_appends(&[(0, 8), (8, 16), (24, 8)], true);
    let r = check(&p);
    assert!(r.ok(), "{:?}", r.errors);
    assert_eq!(p.simulate_adversarial(16), vec![]);
}

#[test]
fn overlapping_append_slices_race() {
    let r = check(&sliced_appends(&[(0, 16), (8, 24)], true));
    assert_only(&r, ErrorKind::WawRace);
}

#[test]
fn a_reader_of_the_cache_before_the_slices_races() {
    let r = check(&sliced_appends(&[(0, 16), (16, 16)], false));
    assert_only(&r, ErrorKind::RawRaceKv);
    assert_eq!(first(&r, ErrorKind::RawRaceKv).task, Some(2));
}

#[test]
fn a_whole_append_beside_a_slice_still_reads_the_cache() {
    // Without `n_off`/`N_tile` an append reads its cache in place (the reference's rule): a
    // slice on its counter is another writer not ordered before that read.
    let mut p = sliced_appends(&[(0, 16), (16, 16)], true);
    p.tasks[1].params = Map::new();
    let r = check(&p);
    assert!(
        r.error_kinds().contains(&ErrorKind::RawRaceKv),
        "{:?}",
        r.errors
    );
    assert_eq!(first(&r, ErrorKind::RawRaceKv).task, Some(1));
}

#[test]
fn never_produced_io_output_read_back() {
    // An IO_OUTPUT that is read but never written: never_produced and output_unproduced.
    let mut p = chain2();
    p.tasks[0].outputs = vec![1];
    let out2 = p.new_buffer("out2", IO_OUTPUT, F32, &[1, 64]);
    p.tasks[1].op = Opcode::ADD;
    p.tasks[1].inputs = vec![1, out2];
    let r = check(&p);
    let kinds: BTreeSet<ErrorKind> = r.error_kinds().into_iter().collect();
    assert_eq!(
        kinds,
        [ErrorKind::NeverProduced, ErrorKind::OutputUnproduced]
            .into_iter()
            .collect()
    );
    assert_eq!(first(&r, ErrorKind::NeverProduced).buffer, Some(out2));
}

#[test]
fn in_place_update_after_a_real_producer_is_fine() {
    let r = check(&inplace(true));
    assert_ok(&r);
    assert!(r.warnings.is_empty(), "{}", r.report());
}

// ---------------------------------------------------------------------------------------------
// WAW

#[test]
fn disjoint_tiles_sharing_a_counter_are_fine() {
    assert_ok(&check(&tiled()));
}

#[rstest]
#[case::partial_overlap(16)]
#[case::same_tile(0)]
#[case::contained(8)]
fn overlapping_tiles_sharing_a_counter_are_a_waw_race(#[case] n_off: i64) {
    let mut p = tiled();
    p.tasks[1].params = gemv(64, 32, n_off);
    let r = check(&p);
    assert_only(&r, ErrorKind::WawRace);
    let e = first(&r, ErrorKind::WawRace);
    assert_eq!(e.buffer, Some(2));
    let mut pair = vec![e.task.unwrap_or(u32::MAX)];
    pair.extend(&e.others);
    pair.sort_unstable();
    assert_eq!(pair, vec![0, 1], "{e:?}");
    assert_mentions(&e.message, &["#2", "'y'"]);
}

#[test]
fn unordered_writers_on_different_counters_are_a_waw_race() {
    // Tiles 2 and 3 move to their own counter: still disjoint, but no longer one join.
    let mut p = tiled();
    let c2 = p.new_counter("y hi ready");
    p.tasks[2].out_counter = c2;
    p.tasks[3].out_counter = c2;
    p.tasks[4].waits = vec![
        amk_core::Wait {
            counter: 0,
            threshold: 2,
        },
        amk_core::Wait {
            counter: c2,
            threshold: 2,
        },
    ];
    let r = check(&p);
    assert_only(&r, ErrorKind::WawRace);
    let e = first(&r, ErrorKind::WawRace);
    assert_eq!(e.buffer, Some(2));
    assert_mentions(&e.message, &["#2"]);
}

#[test]
fn ordered_writers_of_one_buffer_are_fine() {
    // The four tiles of `tiled()` on their own counters, chained: each waits on the previous.
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let w = p.new_weight("w", F32, &[128, 64], "w");
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 128]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 128]);
    let mut prev: Option<CounterId> = None;
    for i in 0..4 {
        let c = p.new_counter(format!("tile {i}"));
        let waits: Vec<(CounterId, i64)> = prev.map(|c| (c, 1)).into_iter().collect();
        p.push_task(
            Opcode::GEMV_TILE,
            &[x, w],
            &[y],
            c,
            &waits,
            gemv(64, 32, i * 32),
            format!("tile{i}"),
        );
        prev = Some(c);
    }
    let cz = p.new_counter("z");
    let last = prev.unwrap_or_default();
    p.push_task(
        Opcode::ADD,
        &[y, y],
        &[z],
        cz,
        &[(last, 1)],
        Map::new(),
        "add",
    );
    assert_ok(&check(&p));
    // Unchained, they are a race (different counters, no order).
    for t in &mut p.tasks[1..4] {
        t.waits.clear();
    }
    assert!(check(&p).has(ErrorKind::WawRace));
}

#[test]
fn ordered_overlapping_writers_are_fine() {
    // Whole-buffer writers in sequence: w1, then w2 (waits w1), then the reader.
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 64]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let c: Vec<CounterId> = (0..3).map(|i| p.new_counter(format!("c{i}"))).collect();
    p.push_task(Opcode::COPY, &[x], &[y], c[0], &[], Map::new(), "w1");
    p.push_task(
        Opcode::GELU,
        &[x],
        &[y],
        c[1],
        &[(c[0], 1)],
        Map::new(),
        "w2",
    );
    p.push_task(
        Opcode::COPY,
        &[y],
        &[z],
        c[2],
        &[(c[1], 1)],
        Map::new(),
        "r",
    );
    assert_ok(&check(&p));
}

#[test]
fn unordered_whole_buffer_writers_sharing_a_counter_are_a_waw_race() {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 64]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, 64]);
    let c0 = p.new_counter("y");
    let c1 = p.new_counter("z");
    p.push_task(Opcode::COPY, &[x], &[y], c0, &[], Map::new(), "w1");
    p.push_task(Opcode::GELU, &[x], &[y], c0, &[], Map::new(), "w2");
    p.push_task(Opcode::COPY, &[y], &[z], c1, &[(c0, 2)], Map::new(), "r");
    let r = check(&p);
    assert_only(&r, ErrorKind::WawRace);
    assert_mentions(&first(&r, ErrorKind::WawRace).message, &["#1", "0", "1"]);
}

#[test]
fn gemm_tiles_disjoint_by_rows_are_fine_and_overlapping_rows_are_not() {
    let build = |m_offs: [i64; 2]| {
        let mut p = Program::new();
        let x = p.new_buffer("x", IO_INPUT, F32, &[2, 64]);
        let w = p.new_weight("w", F32, &[128, 64], "w");
        let y = p.new_buffer("y", IO_OUTPUT, F32, &[2, 128]);
        let c = p.new_counter("y");
        for (i, mo) in m_offs.into_iter().enumerate() {
            p.push_task(
                Opcode::GEMM_TILE,
                &[x, w],
                &[y],
                c,
                &[],
                m(&[
                    ("M_tile", 1.into()),
                    ("m_off", mo.into()),
                    ("K", 64.into()),
                    ("N_tile", 128.into()),
                    ("n_off", 0.into()),
                ]),
                format!("row{i}"),
            );
        }
        p
    };
    assert_ok(&check(&build([0, 1])));
    assert_only(&check(&build([1, 1])), ErrorKind::WawRace);
    // Rows beyond the input's M = 2.
    assert_only(&check(&build([0, 2])), ErrorKind::TileOutOfBounds);
}

/// `n` disjoint single-column tiles of one buffer sharing a counter, the last one moved onto
/// column `overlap_with`; a reader joins them.
fn many_tiles(n: u64, overlap_with: i64) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 8]);
    let w = p.new_weight("w", F32, &[n, 8], "w");
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, n]);
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[1, n]);
    let c = p.new_counter("y");
    let cz = p.new_counter("z");
    for i in 0..n as i64 {
        let off = if i + 1 == n as i64 { overlap_with } else { i };
        p.push_task(
            Opcode::GEMV_TILE,
            &[x, w],
            &[y],
            c,
            &[],
            gemv(8, 1, off),
            format!("t{i}"),
        );
    }
    p.push_task(
        Opcode::COPY,
        &[y],
        &[z],
        cz,
        &[(c, n as i64)],
        Map::new(),
        "join",
    );
    p
}

#[rstest]
#[case::few_writers(100)]
#[case::many_writers(600)]
fn waw_race_names_the_overlapping_pair_among_many_writers(#[case] n: u64) {
    // docs/ir.md, "Validator rules", check 5a (`waw_race`): the culprit is the first pair that
    // is neither disjoint nor ordered.
    let r = check(&many_tiles(n, 5));
    assert_only(&r, ErrorKind::WawRace);
    let e = first(&r, ErrorKind::WawRace);
    let last = (n - 1) as TaskId;
    let mut pair: Vec<TaskId> = e.task.into_iter().chain(e.others.iter().copied()).collect();
    pair.sort_unstable();
    assert_eq!(pair, vec![5, last], "wrong pair named: {}", e.message);
    assert_mentions(&e.message, &["5", &last.to_string()]);
}

#[test]
fn a_task_listing_the_same_output_twice_is_a_waw_race() {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, 64]);
    let c = p.new_counter("y");
    p.push_task(SPLIT, &[x], &[y, y], c, &[], Map::new(), "twice");
    let r = check(&p);
    assert_only(&r, ErrorKind::WawRace);
    let e = first(&r, ErrorKind::WawRace);
    assert_eq!((e.task, e.buffer), (Some(0), Some(1)));
    assert_mentions(&e.message, &["#1", "0"]);
    // The same op with distinct outputs is fine.
    assert_ok(&check(&split(2)));
}

// ---------------------------------------------------------------------------------------------
// On-chip buffers, SM queues

#[rstest]
#[case::smem(MemSpace::SMEM)]
#[case::register(MemSpace::REGISTER)]
fn on_chip_buffer_across_sms_is_rejected(#[case] space: MemSpace) {
    let mut p = chain2();
    p.buffers[1].space = space;
    p.tasks[0].sm = Some(3);
    p.tasks[1].sm = Some(5);
    let r = check(&p);
    assert_only(&r, ErrorKind::OnchipCrossSm);
    let e = first(&r, ErrorKind::OnchipCrossSm);
    assert_eq!(e.buffer, Some(1));
    assert_mentions(&e.message, &["#1", "'y'", "3", "5"]);
}

#[rstest]
#[case::hbm(MemSpace::HBM)]
#[case::global_scratch(MemSpace::GLOBAL_SCRATCH)]
fn off_chip_buffer_across_sms_is_fine(#[case] space: MemSpace) {
    let mut p = chain2();
    p.buffers[1].space = space;
    p.tasks[0].sm = Some(3);
    p.tasks[1].sm = Some(5);
    assert_ok(&check(&p));
}

#[test]
fn on_chip_buffer_with_unassigned_users_is_a_warning() {
    let mut p = chain2();
    p.buffers[1].space = MemSpace::SMEM;
    let r = check(&p);
    assert_ok(&r);
    let w: Vec<_> = r
        .warnings
        .iter()
        .filter(|w| w.kind == WarningKind::OnchipUnverified)
        .collect();
    assert_eq!(w.len(), 1, "{}", r.report());
    assert_eq!(w[0].buffer, Some(1));
    assert_mentions(&w[0].message, &["#1", "'y'"]);
    // Partly placed: still unverified, still a warning.
    p.tasks[0].sm = Some(0);
    let r = check(&p);
    assert_ok(&r);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.kind == WarningKind::OnchipUnverified),
        "{}",
        r.report()
    );
    // Fully placed on one SM: verified, no warning.
    p.tasks[1].sm = Some(0);
    let r = check(&p);
    assert_ok(&r);
    assert!(r.warnings.is_empty(), "{}", r.report());
}

#[test]
fn sm_queue_order_is_per_sm_and_names_both_tasks() {
    let r = check(&reversed_chain(Some(2), Some(2)));
    assert_only(&r, ErrorKind::SmQueueOrder);
    let e = first(&r, ErrorKind::SmQueueOrder);
    assert_eq!((e.task, e.others.clone()), (Some(0), vec![1]));
    assert_mentions(&e.message, &["SM 2", "0", "1"]);
    // Different SMs: counters order them, no queue problem.
    assert_ok(&check(&reversed_chain(Some(2), Some(3))));
    // Unassigned: nothing to check.
    assert_ok(&check(&reversed_chain(None, None)));
    // Producer listed first on one SM: fine.
    let mut p = chain2();
    p.tasks[0].sm = Some(7);
    p.tasks[1].sm = Some(7);
    assert_ok(&check(&p));
}

#[rstest]
#[case::last_sm(131, true)]
#[case::first_sm(0, true)]
#[case::one_past(132, false)]
#[case::far(100_000, false)]
#[case::negative(-1, false)]
fn sm_range_is_checked_against_the_target(#[case] sm: i32, #[case] ok: bool) {
    let mut p = chain2();
    p.target = Some(h100());
    p.tasks[1].sm = Some(sm);
    let r = check(&p);
    if ok {
        assert_ok(&r);
    } else {
        assert_only(&r, ErrorKind::SmOutOfRange);
        let e = first(&r, ErrorKind::SmOutOfRange);
        assert_eq!(e.task, Some(1));
        assert_mentions(&e.message, &["task 1", &sm.to_string(), "132"]);
    }
}

#[test]
fn without_a_target_a_large_sm_cannot_be_out_of_range() {
    // docs/ir.md, "Validator rules", check 6 (`sm_out_of_range`): with no target the upper
    // bound is unknown.
    let mut p = chain2();
    p.tasks[0].sm = Some(100_000);
    p.tasks[1].sm = Some(5);
    assert_ok(&check(&p));
}

#[test]
fn without_a_target_a_negative_sm_is_out_of_range() {
    // docs/ir.md: `sm ≥ 0` without a target.
    let mut p = chain2();
    p.tasks[1].sm = Some(-3);
    let r = check(&p);
    assert_only(&r, ErrorKind::SmOutOfRange);
    assert_mentions(
        &first(&r, ErrorKind::SmOutOfRange).message,
        &["task 1", "-3"],
    );
}

// ---------------------------------------------------------------------------------------------
// Pages

#[test]
fn page_reuse_without_ordering_is_a_clobber() {
    let r = check(&paged(false));
    assert_only(&r, ErrorKind::PageClobber);
    let e = first(&r, ErrorKind::PageClobber);
    assert_mentions(&e.message, &["page 0", "#1", "'a'", "#2", "'b'"]);
}

#[test]
fn page_reuse_separated_by_happens_before_is_fine() {
    let r = check(&paged(true));
    assert_ok(&r);
    assert_eq!(r.stats.pages, 1);
}

#[test]
fn page_reuse_where_the_second_writer_only_follows_the_first_writer_is_a_clobber() {
    // "make b" waits on "make a" but not on "use a": a's reader may still be running.
    let mut p = paged(false);
    p.tasks[2].waits = vec![amk_core::Wait {
        counter: 0,
        threshold: 1,
    }];
    assert_only(&check(&p), ErrorKind::PageClobber);
}

#[rstest]
#[case::missing_page(vec![(1, 5)], 256, "page 5")]
#[case::missing_buffer(vec![(9, 0)], 256, "#9")]
#[case::page_too_small(vec![(1, 0)], 255, "255")]
#[case::io_output_on_a_page(vec![(2, 0)], 256, "#2")]
#[case::io_input_on_a_page(vec![(0, 0)], 256, "#0")]
fn bad_page_tables_are_rejected(
    #[case] b2p: Vec<(BufferId, u32)>,
    #[case] nbytes: u64,
    #[case] mention: &str,
) {
    let mut p = chain2();
    p.pages = Some(PageAllocation {
        buffer_to_page: b2p,
        pages: vec![Page {
            id: 0,
            space: MemSpace::GLOBAL_SCRATCH,
            nbytes,
            live_start: -1,
            live_end: -1,
        }],
    });
    let r = check(&p);
    assert_only(&r, ErrorKind::PageTable);
    let msg = &first(&r, ErrorKind::PageTable).message;
    assert_mentions(msg, &[mention]);
}

#[test]
fn page_table_is_checked_even_when_the_graph_has_a_cycle() {
    let mut p = defect(ErrorKind::PageTable).prog;
    p.tasks[0].waits.push(amk_core::Wait {
        counter: 1,
        threshold: 1,
    });
    let kinds: BTreeSet<ErrorKind> = check(&p).error_kinds().into_iter().collect();
    assert!(kinds.contains(&ErrorKind::PageTable), "{kinds:?}");
    assert!(kinds.contains(&ErrorKind::Cycle), "{kinds:?}");
}

// ---------------------------------------------------------------------------------------------
// Cycles

/// Checks a cycle witness: non-empty, closed, and every step a real dependency edge.
fn assert_witness(p: &Program, path: &[TaskId]) {
    assert!(path.len() >= 2, "witness too short: {path:?}");
    assert_eq!(path.first(), path.last(), "witness not closed: {path:?}");
    let edges: BTreeSet<(TaskId, TaskId)> = p.dependency_edges().into_iter().collect();
    for w in path.windows(2) {
        assert!(
            edges.contains(&(w[0], w[1])),
            "witness step {} -> {} is not a dependency edge",
            w[0],
            w[1]
        );
    }
}

#[test]
fn two_task_cycle_has_a_witness() {
    let p = defect(ErrorKind::Cycle).prog;
    let r = check(&p);
    assert_only(&r, ErrorKind::Cycle);
    assert!(!r.stats.acyclic);
    let e = first(&r, ErrorKind::Cycle);
    assert_witness(&p, &e.path);
    let inner: BTreeSet<TaskId> = e.path.iter().copied().collect();
    assert_eq!(inner, [0, 1].into_iter().collect());
    for t in &e.path {
        assert!(e.message.contains(&t.to_string()), "{}", e.message);
    }
}

#[test]
fn cycle_away_from_the_first_task_has_a_witness_of_its_members_only() {
    // Task 0 is a harmless source; tasks 1 -> 2 -> 3 -> 1 form the cycle, and task 4
    // hangs off it.
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 64]);
    let bufs: Vec<BufferId> = (0..5)
        .map(|i| p.new_buffer(format!("b{i}"), ACTIVATION, F32, &[1, 64]))
        .collect();
    let cs: Vec<CounterId> = (0..5).map(|i| p.new_counter(format!("c{i}"))).collect();
    p.push_task(
        Opcode::COPY,
        &[x],
        &[bufs[0]],
        cs[0],
        &[],
        Map::new(),
        "src",
    );
    p.push_task(
        Opcode::COPY,
        &[bufs[3]],
        &[bufs[1]],
        cs[1],
        &[(cs[3], 1)],
        Map::new(),
        "a",
    );
    p.push_task(
        Opcode::COPY,
        &[bufs[1]],
        &[bufs[2]],
        cs[2],
        &[(cs[1], 1)],
        Map::new(),
        "b",
    );
    p.push_task(
        Opcode::ADD,
        &[bufs[2], bufs[0]],
        &[bufs[3]],
        cs[3],
        &[(cs[2], 1), (cs[0], 1)],
        Map::new(),
        "c",
    );
    p.push_task(
        Opcode::COPY,
        &[bufs[3]],
        &[bufs[4]],
        cs[4],
        &[(cs[3], 1)],
        Map::new(),
        "tail",
    );
    let r = check(&p);
    assert_only(&r, ErrorKind::Cycle);
    let e = first(&r, ErrorKind::Cycle);
    assert_witness(&p, &e.path);
    let members: BTreeSet<TaskId> = e.path.iter().copied().collect();
    assert_eq!(members, [1, 2, 3].into_iter().collect());
    assert_mentions(&e.message, &["a", "b", "c"]);
}

#[test]
fn cycle_through_a_shared_counter_has_a_witness() {
    // Tiles 0..3 share counter 0; the ADD (4) waits on it and tile 2 waits on the ADD.
    let mut p = tiled();
    p.tasks[2].waits.push(amk_core::Wait {
        counter: 1,
        threshold: 1,
    });
    let r = check(&p);
    assert!(r.has(ErrorKind::Cycle), "{}", r.report());
    let e = first(&r, ErrorKind::Cycle);
    assert_witness(&p, &e.path);
    let members: BTreeSet<TaskId> = e.path.iter().copied().collect();
    assert_eq!(members, [2, 4].into_iter().collect());
}

// ---------------------------------------------------------------------------------------------
// Op shape rules

/// `GEMV_TILE [x [1,K], W [N,K]] -> y [1,N]` (IO_OUTPUT) with the given params.
fn one_gemv(k_x: u64, k_w: u64, n: u64, params: Map) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, k_x]);
    let w = p.new_weight("w", F32, &[n, k_w], "w");
    let y = p.new_buffer("y", IO_OUTPUT, F32, &[1, n]);
    let c = p.new_counter("y");
    p.push_task(Opcode::GEMV_TILE, &[x, w], &[y], c, &[], params, "gemv");
    p
}

#[rstest]
#[case::whole(64, 64, 128, gemv(64, 128, 0), None)]
#[case::last_tile(64, 64, 128, gemv(64, 32, 96), None)]
#[case::k_vs_weight(64, 64, 128, gemv(32, 128, 0), Some(ErrorKind::ShapeMismatch))]
#[case::k_vs_input(32, 64, 128, gemv(64, 128, 0), Some(ErrorKind::ShapeMismatch))]
#[case::tile_past_n(64, 64, 128, gemv(64, 32, 112), Some(ErrorKind::TileOutOfBounds))]
#[case::tile_wider_than_n(64, 64, 128, gemv(64, 129, 0), Some(ErrorKind::TileOutOfBounds))]
#[case::zero_tile(64, 64, 128, gemv(64, 0, 0), Some(ErrorKind::TileOutOfBounds))]
#[case::negative_tile(64, 64, 128, gemv(64, -32, 0), Some(ErrorKind::TileOutOfBounds))]
#[case::negative_offset(64, 64, 128, gemv(64, 32, -32), Some(ErrorKind::TileOutOfBounds))]
#[case::zero_k(64, 64, 128, gemv(0, 32, 0), Some(ErrorKind::TileOutOfBounds))]
fn gemv_shape_rule(
    #[case] k_x: u64,
    #[case] k_w: u64,
    #[case] n: u64,
    #[case] params: Map,
    #[case] want: Option<ErrorKind>,
) {
    let r = check(&one_gemv(k_x, k_w, n, params));
    assert_outcome(&r, want, &["task 0"]);
}

/// GEMV with 3 or 4 inputs: bias, or quantised weights (docs/ir.md, "Opcodes and params":
/// 2–4 inputs).
#[rstest]
#[case::bias("bias", F32, None, None)]
#[case::int8_symmetric("q8", I8, Some(6), None)]
#[case::int4_symmetric("q4", I4, Some(7), None)]
#[case::int8_asymmetric("q8a", U8, Some(6), Some(F16))]
#[case::int4_asymmetric("q4a", I4, Some(7), Some(F16))]
fn gemv_takes_bias_or_quantised_weights(
    #[case] label: &str,
    #[case] wdtype: DType,
    #[case] qdtype: Option<i64>,
    #[case] zeros: Option<DType>,
) {
    let (n, k, group) = (128u64, 64u64, 32u64);
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, k]);
    let w = p.new_weight("w", wdtype, &[n, k], "w");
    let y = p.new_buffer("y", IO_OUTPUT, F32, &[1, n]);
    let mut inputs = vec![x, w];
    let mut params = gemv(k as i64, n as i64, 0);
    if let Some(q) = qdtype {
        inputs.push(p.new_weight("scales", F16, &[n, k / group], "w.scales"));
        if let Some(zd) = zeros {
            inputs.push(p.new_weight("zeros", zd, &[n, k / group], "w.zeros"));
        }
        params.insert("qdtype", q.into());
        params.insert("group", (group as i64).into());
    } else {
        inputs.push(p.new_weight("bias", F32, &[n], "b"));
    }
    let c = p.new_counter("y");
    p.push_task(Opcode::GEMV_TILE, &inputs, &[y], c, &[], params, label);
    assert_ok(&check(&p));
}

#[rstest]
#[case::pos_zero(0, None)]
#[case::last_row(7, None)]
#[case::pos_at_end(8, Some(ErrorKind::TileOutOfBounds))]
#[case::pos_far(1000, Some(ErrorKind::TileOutOfBounds))]
#[case::pos_negative(-1, Some(ErrorKind::TileOutOfBounds))]
fn kv_append_pos_must_fit_the_cache(#[case] pos: i64, #[case] want: Option<ErrorKind>) {
    let mut p = attention();
    p.tasks[0].params = m(&[("pos", pos.into())]);
    let r = check(&p);
    assert_outcome(&r, want, &["task 0"]);
}

#[rstest]
#[case::flat_rows([1, 32].as_slice())]
#[case::head_shaped([1, 2, 16].as_slice())]
#[case::heads_only([2, 16].as_slice())]
fn kv_append_accepts_flat_or_head_shaped_rows(#[case] shape: &[u64]) {
    let mut p = attention();
    p.buffers[1].shape = shape.to_vec();
    assert_ok(&check(&p));
}

#[rstest]
#[case::first_slot(0, None)]
#[case::last_slot(7, None)]
#[case::past_end(8, Some(ErrorKind::TileOutOfBounds))]
fn batched_kv_append_pos_must_fit(#[case] pos: i64, #[case] want: Option<ErrorKind>) {
    // Batched cache [B, max_seq, n_kv, head_dim] = [2, 8, 2, 16]; one new row per batch.
    let mut p = Program::new();
    let new = p.new_buffer("new", IO_INPUT, F32, &[2, 2, 16]);
    let kc = p.new_buffer("kcache", KV_CACHE, F32, &[2, 8, 2, 16]);
    let c = p.new_counter("appended");
    p.push_task(
        Opcode::KV_APPEND,
        &[new, kc],
        &[kc],
        c,
        &[],
        m(&[("pos", pos.into())]),
        "append",
    );
    let r = check(&p);
    assert_outcome(&r, want, &[]);
}

#[test]
fn kv_append_must_write_in_place() {
    let mut p = attention();
    let other = p.new_buffer("other", KV_CACHE, F32, &[8, 2, 16]);
    p.tasks[0].outputs = vec![other];
    let r = check(&p);
    assert!(r.has(ErrorKind::ShapeMismatch), "{}", r.report());
}

/// [`attention`] with a position buffer `pos` (IO_INPUT, `dtype` `[1]`, buffer 6) as the
/// last input of KV_APPEND k (task 0, which keeps its param `pos` when `keep_param`) and of
/// the attention (task 2, over the whole cache: the position clips it).
fn attention_with_position(dtype: DType, keep_param: bool) -> Program {
    let mut p = attention();
    let pos = p.new_buffer("pos", IO_INPUT, dtype, &[1]);
    p.tasks[0].inputs.push(pos);
    if !keep_param {
        p.tasks[0].params = Map::new();
    }
    p.tasks[2].inputs.push(pos);
    p.tasks[2].params = attn_params(0, 8);
    p
}

#[test]
fn a_position_input_replaces_the_params_of_kv_append_and_attention() {
    assert_ok(&check(&attention_with_position(I32, false)));
    assert_ok(&check(&attention_with_position(U8, false)));
    // A split-KV shard the position may leave empty.
    let mut p = attention_with_position(I32, false);
    p.buffers[5].shape = vec![4, 18];
    p.tasks[2].params = attn_params(4, 4);
    p.tasks[2].params.insert("flags", 2.into());
    assert_ok(&check(&p));
}

#[test]
fn kv_append_takes_the_param_or_the_input_not_both() {
    let r = check(&attention_with_position(I32, true));
    assert_only(&r, ErrorKind::ShapeMismatch);
    assert_mentions(
        &first(&r, ErrorKind::ShapeMismatch).message,
        &["task 0", "pos"],
    );
    let mut p = attention();
    p.tasks[0].params = Map::new();
    let r = check(&p);
    assert_only(&r, ErrorKind::MissingParam);
    assert_mentions(
        &first(&r, ErrorKind::MissingParam).message,
        &["task 0", "pos"],
    );
}

#[test]
fn a_float_position_buffer_is_a_shape_mismatch() {
    let r = check(&attention_with_position(F32, false));
    assert_eq!(
        r.error_kinds(),
        vec![ErrorKind::ShapeMismatch],
        "{}",
        r.report()
    );
    for t in ["task 0", "task 2"] {
        assert!(
            r.errors
                .iter()
                .any(|e| e.message.contains(t) && e.message.contains("integer")),
            "{t}: {}",
            r.report()
        );
    }
}

#[test]
fn position_inputs_count_against_the_arity() {
    let mut p = attention_with_position(I32, false);
    let pos = p.tasks[2].inputs[3];
    p.tasks[2].inputs.push(pos);
    p.tasks[0].inputs.push(pos);
    let r = check(&p);
    assert_only(&r, ErrorKind::ArityInputs);
    assert_eq!(r.errors.len(), 2, "{}", r.report());
}

#[rstest]
#[case::full(0, 8, None)]
#[case::window(4, 4, None)]
#[case::past_end(4, 5, Some(ErrorKind::TileOutOfBounds))]
#[case::start_past_end(8, 1, Some(ErrorKind::TileOutOfBounds))]
#[case::empty_non_shard(0, 0, Some(ErrorKind::TileOutOfBounds))]
#[case::negative_start(-1, 2, Some(ErrorKind::TileOutOfBounds))]
fn attention_range_must_fit_the_cache(
    #[case] start: i64,
    #[case] len: i64,
    #[case] want: Option<ErrorKind>,
) {
    let mut p = attention();
    p.tasks[2].params = attn_params(start, len);
    let r = check(&p);
    assert_outcome(&r, want, &["task 2"]);
}

#[rstest]
#[case::heads_query([4, 16].as_slice())]
#[case::flat_query([1, 64].as_slice())]
#[case::rank3_query([1, 4, 16].as_slice())]
fn attention_accepts_flat_or_head_shaped_queries(#[case] shape: &[u64]) {
    let mut p = attention();
    p.buffers[0].shape = shape.to_vec();
    assert_ok(&check(&p));
}

#[test]
fn attention_heads_must_divide() {
    let mut p = attention();
    p.tasks[2].params.insert("n_kv_heads", 3.into());
    assert!(check(&p).has(ErrorKind::ShapeMismatch));
}

/// `EMBED [ids, table] -> out` with the shapes given.
fn embed(ids: &[u64], ids_dtype: DType, table: &[u64], out: &[u64]) -> Program {
    let mut p = Program::new();
    let i = p.new_buffer("ids", IO_INPUT, ids_dtype, ids);
    let t = p.new_buffer("table", ACTIVATION, F32, table);
    let o = p.new_buffer("out", IO_OUTPUT, F32, out);
    let x = p.new_buffer("x", IO_INPUT, F32, table);
    let c0 = p.new_counter("table");
    let c1 = p.new_counter("out");
    p.push_task(Opcode::COPY, &[x], &[t], c0, &[], Map::new(), "make table");
    p.push_task(
        Opcode::EMBED,
        &[i, t],
        &[o],
        c1,
        &[(c0, 1)],
        m(&[("hidden", 16.into())]),
        "embed",
    );
    p
}

#[rstest]
#[case::reshape_bridge_to_heads(&[1], &[1, 64], &[4, 16], None)]
#[case::reshape_bridge_to_kv_heads(&[1], &[1, 32], &[1, 2, 16], None)]
#[case::gather_rows(&[3], &[10, 64], &[3, 64], None)]
#[case::gather_flat(&[3], &[10, 64], &[192], None)]
#[case::too_small(&[3], &[10, 64], &[2, 64], Some(ErrorKind::ShapeMismatch))]
#[case::too_large(&[1], &[1, 64], &[8, 16], Some(ErrorKind::ShapeMismatch))]
fn embed_compares_element_counts(
    #[case] ids: &[u64],
    #[case] table: &[u64],
    #[case] out: &[u64],
    #[case] want: Option<ErrorKind>,
) {
    let r = check(&embed(ids, I32, table, out));
    assert_outcome(&r, want, &[]);
}

#[test]
fn embed_ids_must_be_integers() {
    let r = check(&embed(&[1], F32, &[1, 64], &[4, 16]));
    assert_only(&r, ErrorKind::ShapeMismatch);
}

/// `ROPE [x, pos] -> out` with `x` and `out` of the given shape.
fn rope(shape: &[u64], head_dim: i64) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, shape);
    let pos = p.new_buffer("pos", IO_INPUT, I32, &[1]);
    let out = p.new_buffer("out", IO_OUTPUT, F32, shape);
    let c = p.new_counter("out");
    p.push_task(
        Opcode::ROPE,
        &[x, pos],
        &[out],
        c,
        &[],
        m(&[("head_dim", head_dim.into()), ("theta", 10000.0.into())]),
        "rope",
    );
    p
}

#[rstest]
#[case::flat(&[1, 64], 16, None)]
#[case::heads(&[4, 16], 16, None)]
#[case::rank3(&[1, 4, 16], 16, None)]
#[case::odd_head_dim(&[4, 15], 15, Some(ErrorKind::ShapeMismatch))]
#[case::not_whole_heads(&[1, 40], 16, Some(ErrorKind::ShapeMismatch))]
#[case::zero_head_dim(&[1, 64], 0, Some(ErrorKind::TileOutOfBounds))]
#[case::rank3_needs_one_position_per_row(&[2, 4, 16], 16, Some(ErrorKind::ShapeMismatch))]
fn rope_accepts_flat_or_head_shaped(
    #[case] shape: &[u64],
    #[case] hd: i64,
    #[case] want: Option<ErrorKind>,
) {
    let r = check(&rope(shape, hd));
    assert_outcome(&r, want, &[]);
}

#[test]
fn sample_argmax_writes_i32() {
    let build = |dt: DType| {
        let mut p = Program::new();
        let x = p.new_buffer("logits", IO_INPUT, F32, &[1, 256]);
        let o = p.new_buffer("token", IO_OUTPUT, dt, &[1]);
        let c = p.new_counter("token");
        p.push_task(
            Opcode::SAMPLE_ARGMAX,
            &[x],
            &[o],
            c,
            &[],
            Map::new(),
            "argmax",
        );
        p
    };
    assert_ok(&check(&build(I32)));
    assert_only(&check(&build(F32)), ErrorKind::ShapeMismatch);
}

/// NEXT_TOKEN `[logits, pos, prompt, stop, limits, sampling] -> [pos, token, halt, emitted]`:
/// the decode layout is accepted (the position a KV_CACHE buffer advanced in place); a
/// separate position output, a flat `emitted`, short limits or I32 logits are
/// `shape_mismatch`.
#[rstest]
#[case::decode_layout(None)]
#[case::pos_not_in_place(Some("pos_out"))]
#[case::flat_emitted(Some("emitted"))]
#[case::short_limits(Some("limits"))]
#[case::integer_logits(Some("logits"))]
fn next_token_advances_pos_in_place(#[case] broken: Option<&str>) {
    let bad = |name: &str| broken == Some(name);
    let mut p = Program::new();
    let logits_dt = if bad("logits") { I32 } else { DType::BF16 };
    let logits = p.new_buffer("logits", IO_INPUT, logits_dt, &[1, 49152]);
    let pos = p.new_buffer("pos", KV_CACHE, I32, &[1]);
    let prompt = p.new_buffer("prompt", IO_INPUT, I32, &[32]);
    let stop = p.new_buffer("stop", IO_INPUT, I32, &[2]);
    let limits = p.new_buffer(
        "limits",
        IO_INPUT,
        I32,
        &[if bad("limits") { 5 } else { 6 }],
    );
    let sampling = p.new_buffer("sampling", IO_INPUT, F32, &[2]);
    let pos_out = if bad("pos_out") {
        p.new_buffer("pos_out", IO_OUTPUT, I32, &[1])
    } else {
        pos
    };
    let token = p.new_buffer("token", IO_OUTPUT, I32, &[1]);
    let halt = p.new_buffer("halt", IO_OUTPUT, I32, &[1]);
    let emitted_shape: &[u64] = if bad("emitted") { &[512] } else { &[256, 2] };
    let emitted = p.new_buffer("emitted", IO_OUTPUT, I32, emitted_shape);
    let c = p.new_counter("next");
    p.push_task(
        Opcode::NEXT_TOKEN,
        &[logits, pos, prompt, stop, limits, sampling],
        &[pos_out, token, halt, emitted],
        c,
        &[],
        Map::new(),
        "next_token",
    );
    let r = check(&p);
    match broken {
        None => assert_ok(&r),
        Some(name) => {
            assert_only(&r, ErrorKind::ShapeMismatch);
            assert_mentions(&first(&r, ErrorKind::ShapeMismatch).message, &[name]);
        }
    }
}

#[rstest]
#[case::add(Opcode::ADD, 2)]
#[case::silu_mul(Opcode::SILU_MUL, 2)]
#[case::gelu(Opcode::GELU, 1)]
#[case::copy(Opcode::COPY, 1)]
fn elementwise_ops_compare_element_counts(#[case] op: Opcode, #[case] n_in: usize) {
    let build = |out_shape: &[u64]| {
        let mut p = Program::new();
        let ins: Vec<BufferId> = (0..n_in)
            .map(|i| p.new_buffer(format!("x{i}"), IO_INPUT, F32, &[1, 64]))
            .collect();
        let o = p.new_buffer("out", IO_OUTPUT, F32, out_shape);
        let c = p.new_counter("out");
        p.push_task(op, &ins, &[o], c, &[], Map::new(), "op");
        p
    };
    assert_ok(&check(&build(&[4, 16])));
    assert_only(&check(&build(&[1, 65])), ErrorKind::ShapeMismatch);
}

/// Two RMSNORM tasks writing row tiles of one `[4, 64]` output, `a` and `b` as
/// `(m_off, M_tile)`, neither waiting for the other.
fn rmsnorm_row_tiles(a: (i64, i64), b: (i64, i64)) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[4, 64]);
    let w = p.new_weight("norm", F32, &[64], "norm.weight");
    let z = p.new_buffer("z", IO_OUTPUT, F32, &[4, 64]);
    let c = p.new_counter("z ready");
    for (i, (m_off, m_tile)) in [a, b].into_iter().enumerate() {
        let pr = m(&[
            ("eps", 1e-6.into()),
            ("hidden", 64.into()),
            ("m_off", m_off.into()),
            ("M_tile", m_tile.into()),
            ("n_off", 0.into()),
            ("N_tile", 64.into()),
        ]);
        p.push_task(
            Opcode::RMSNORM,
            &[x, w],
            &[z],
            c,
            &[],
            pr,
            format!("norm{i}"),
        );
    }
    p
}

#[test]
fn rmsnorm_row_tiles_write_disjoint_rows() {
    let r = check(&rmsnorm_row_tiles((0, 2), (2, 2)));
    assert!(r.ok(), "{}", r.report());
}

#[test]
fn rmsnorm_row_tiles_that_overlap_race() {
    assert_only(
        &check(&rmsnorm_row_tiles((0, 3), (2, 2))),
        ErrorKind::WawRace,
    );
}

#[rstest]
#[case::past_the_rows((3, 2), ErrorKind::TileOutOfBounds)]
#[case::empty_tile((0, 0), ErrorKind::TileOutOfBounds)]
fn rmsnorm_row_tiles_must_fit(#[case] b: (i64, i64), #[case] kind: ErrorKind) {
    assert!(
        check(&rmsnorm_row_tiles((0, 2), b))
            .error_kinds()
            .contains(&kind)
    );
}

#[test]
fn rmsnorm_row_tile_params_come_together() {
    let mut pr = rms_params();
    pr.insert("m_off", 0.into());
    pr.insert("M_tile", 1.into());
    assert_only(&check(&rmsnorm(pr)), ErrorKind::TileOutOfBounds);
}

#[test]
fn rmsnorm_hidden_must_match() {
    let r = check(&rmsnorm(m(&[("eps", 1e-6.into()), ("hidden", 32.into())])));
    assert_only(&r, ErrorKind::ShapeMismatch);
}

// ---------------------------------------------------------------------------------------------
// FUSED recipes

#[rstest]
#[case::two_steps_with_a_slot(RECIPE_OK, true)]
#[case::single_final_step(
    r#"{"steps": [{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": "final"}]}"#,
    true
)]
#[case::final_as_minus_one(
    r#"{"steps": [{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": -1, "params": {}}]}"#,
    true
)]
#[case::nested_fused(
    r#"{"steps": [{"op": 19, "args": [{"in": 0}], "out": "final", "params": {}}]}"#,
    false
)]
#[case::reads_unwritten_slot(
    r#"{"steps": [
        {"op": 11, "args": [{"in": 0}, {"s": 3}], "out": 0},
        {"op": 1, "args": [{"s": 0}], "out": "final"}]}"#,
    false
)]
#[case::reads_slot_written_later(
    r#"{"steps": [
        {"op": 1, "args": [{"s": 0}], "out": 1},
        {"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0},
        {"op": 11, "args": [{"s": 0}, {"s": 1}], "out": "final"}]}"#,
    false
)]
#[case::input_index_too_large(
    r#"{"steps": [{"op": 11, "args": [{"in": 0}, {"in": 2}], "out": "final"}]}"#,
    false
)]
#[case::input_index_negative(
    r#"{"steps": [{"op": 11, "args": [{"in": -1}, {"in": 0}], "out": "final"}]}"#,
    false
)]
#[case::missing_final(
    r#"{"steps": [{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0}]}"#,
    false
)]
#[case::final_not_last(
    r#"{"steps": [
        {"op": 11, "args": [{"in": 0}, {"in": 1}], "out": "final"},
        {"op": 1, "args": [{"in": 0}], "out": 0}]}"#,
    false
)]
#[case::two_finals(
    r#"{"steps": [
        {"op": 11, "args": [{"in": 0}, {"in": 1}], "out": "final"},
        {"op": 1, "args": [{"in": 0}], "out": "final"}]}"#,
    false
)]
#[case::no_steps(r#"{"steps": []}"#, false)]
#[case::steps_missing(r#"{"recipe": 1}"#, false)]
#[case::unregistered_step_op(
    r#"{"steps": [{"op": 999, "args": [{"in": 0}], "out": "final"}]}"#,
    false
)]
#[case::step_arity(
    r#"{"steps": [{"op": 11, "args": [{"in": 0}], "out": "final"}]}"#,
    false
)]
#[case::step_missing_param(
    r#"{"steps": [{"op": 3, "args": [{"in": 0}, {"in": 1}], "out": "final"}]}"#,
    false
)]
#[case::bad_arg_shape(
    r#"{"steps": [{"op": 11, "args": [{"in": 0, "s": 0}, {"in": 1}], "out": "final"}]}"#,
    false
)]
fn fused_recipe_rule(#[case] recipe: &str, #[case] ok: bool) {
    let r = check(&fused(2, recipe));
    if ok {
        assert_ok(&r);
    } else {
        assert_only(&r, ErrorKind::FusedRecipe);
        assert_mentions(&first(&r, ErrorKind::FusedRecipe).message, &["task 0"]);
    }
}

#[test]
fn fused_recipe_must_be_an_object() {
    let mut p = fused(2, RECIPE_OK);
    p.tasks[0].params = m(&[("recipe", Value::from("ADD then MUL"))]);
    assert_only(&check(&p), ErrorKind::ParamType);
    p.tasks[0].params = Map::new();
    assert_only(&check(&p), ErrorKind::MissingParam);
}

// ---------------------------------------------------------------------------------------------
// Counters, outputs, labels

#[rstest]
#[case(1)]
#[case(-1)]
#[case(i64::MAX)]
fn nonzero_counter_init_is_rejected(#[case] init: i64) {
    let mut p = chain2();
    p.counters[1].init = init;
    let r = check(&p);
    assert_only(&r, ErrorKind::CounterInit);
    let e = first(&r, ErrorKind::CounterInit);
    assert_eq!(e.counter, Some(1));
    assert_mentions(&e.message, &["#1", &init.to_string()]);
}

#[test]
fn unknown_param_is_a_warning_naming_task_and_key() {
    let mut p = chain2();
    p.tasks[1].params.insert("flavour", "vanilla".into());
    let r = check(&p);
    assert_ok(&r);
    assert_eq!(r.warnings.len(), 1, "{}", r.report());
    let w = &r.warnings[0];
    assert_eq!(w.kind, WarningKind::UnknownParam);
    assert_eq!(w.task, Some(1));
    assert_mentions(&w.message, &["task 1", "flavour"]);
    // A device param field, or one the op declares, is not unknown.
    let mut p = chain2();
    p.tasks[1].params.insert("flags", 0.into());
    let r = check(&p);
    assert_ok(&r);
    assert!(r.warnings.is_empty(), "{}", r.report());
    let mut p = attention();
    p.tasks[2].params.insert("flags", 0.into());
    let r = check(&p);
    assert_ok(&r);
    assert!(r.warnings.is_empty(), "{}", r.report());
}

#[test]
fn gpu_label_mismatch_is_a_warning() {
    let mut p = chain2();
    p.target = Some(h100());
    p.meta.insert("gpu", "a100".into());
    let r = check(&p);
    assert_ok(&r);
    let kinds: Vec<WarningKind> = r.warnings.iter().map(|w| w.kind).collect();
    assert_eq!(kinds, vec![WarningKind::GpuLabelMismatch]);
    assert_mentions(&r.warnings[0].message, &["a100", "h100"]);
    // Agreeing label, no label, or no target: no warning.
    p.meta.insert("gpu", "h100".into());
    assert!(check(&p).warnings.is_empty());
    p.meta = Map::new();
    assert!(check(&p).warnings.is_empty());
    p.meta.insert("gpu", "a100".into());
    p.target = None;
    assert!(check(&p).warnings.is_empty());
}

#[rstest]
#[case::unknown_param(WarningKind::UnknownParam)]
#[case::onchip_unverified(WarningKind::OnchipUnverified)]
#[case::gpu_label_mismatch(WarningKind::GpuLabelMismatch)]
fn warning_kind_negative_and_positive(#[case] kind: WarningKind) {
    let (bad, good) = match kind {
        WarningKind::UnknownParam => {
            let mut bad = chain2();
            bad.tasks[0].params.insert("colour", 1.into());
            (bad, chain2())
        }
        WarningKind::OnchipUnverified => {
            let mut bad = chain2();
            bad.buffers[1].space = MemSpace::SMEM;
            let mut good = bad.clone();
            good.tasks[0].sm = Some(4);
            good.tasks[1].sm = Some(4);
            (bad, good)
        }
        WarningKind::GpuLabelMismatch => {
            let mut bad = chain2();
            bad.target = Some(h100());
            bad.meta.insert("gpu", "rtx5090".into());
            let mut good = bad.clone();
            good.meta.insert("gpu", "h100".into());
            (bad, good)
        }
    };
    let r = check(&bad);
    assert_ok(&r); // warnings never reject
    assert!(
        r.warnings.iter().any(|w| w.kind == kind),
        "{kind}: missing:\n{}",
        r.report()
    );
    assert_eq!(WarningKind::from_str_opt(kind.as_str()), Some(kind));
    let r = check(&good);
    assert_ok(&r);
    assert!(r.warnings.is_empty(), "{kind}:\n{}", r.report());
}

// ---------------------------------------------------------------------------------------------
// The result API

#[test]
fn report_starts_with_the_verdict() {
    let r = check(&tiled());
    assert!(r.report().starts_with("[VALID]"), "{}", r.report());
    let r = check(&defect(ErrorKind::RawRace).prog);
    let rep = r.report();
    assert!(rep.starts_with("[REJECTED]"), "{rep}");
    assert!(rep.contains("raw_race"), "{rep}");
    for e in &r.errors {
        assert!(rep.contains(&e.message), "{rep}");
    }
}

#[test]
fn stats_of_a_small_program() {
    let p = tiled();
    let r = check(&p);
    let s = &r.stats;
    assert_eq!(s.tasks, 5);
    assert_eq!(s.buffers, 4);
    assert_eq!(s.counters, 2);
    assert_eq!(s.edges, 4); // each tile -> the ADD
    assert!(s.acyclic);
    // 128 x 64 F32 = 32768 bytes = 0.032768 MB, rounded to 2 decimals.
    assert_eq!(s.weight_mb, 0.03);
    assert!(!s.sm_assigned);
    assert_eq!(s.pages, 0);

    let mut p = p;
    p.tasks[4].sm = Some(0);
    p.buffers[1].shape = vec![1000, 1250]; // 5,000,000 bytes of weights
    p.buffers[1].dtype = F32;
    let r = check(&p);
    assert!(r.stats.sm_assigned);
    assert_eq!(r.stats.weight_mb, 5.0);

    let r = check(&defect(ErrorKind::Cycle).prog);
    assert!(!r.stats.acyclic);
    assert_eq!(r.stats.edges, 2);
}

#[test]
fn edges_count_distinct_producer_consumer_pairs() {
    // The ADD waits twice on the same counter: still 4 edges.
    let mut p = tiled();
    p.tasks[4].waits.push(amk_core::Wait {
        counter: 0,
        threshold: 4,
    });
    let r = check(&p);
    assert_eq!(r.stats.edges, 4);
    assert_eq!(p.dependency_edges().len(), 4);
}

#[test]
fn validated_program_only_through_validate_owned() {
    let reg = registry();
    let p = tiled();
    let v = validate_owned(p.clone(), &reg).expect("valid program");
    assert_eq!(v.program(), &p);
    assert!(v.result().ok());
    assert_eq!(v.result().stats.tasks, 5);
    assert_eq!(v.into_inner(), p);

    let bad = defect(ErrorKind::RawRace).prog;
    let r = validate_owned(bad, &reg).expect_err("rejected program");
    assert!(r.has(ErrorKind::RawRace));
    assert!(r.report().starts_with("[REJECTED]"));
}

#[test]
fn validate_is_deterministic() {
    let p = defect(ErrorKind::WawRace).prog;
    assert_eq!(check(&p), check(&p));
}

// ---------------------------------------------------------------------------------------------
// Dynamic cross-checks

#[test]
fn simulate_counters_fires_everything_in_a_valid_program() {
    let sim = tiled().simulate_counters();
    assert_eq!(sim.order, vec![0, 1, 2, 3, 4]);
    assert!(sim.stuck.is_empty());
    // Consumer listed before its producer: fired in a later sweep.
    let sim = reversed_chain(None, None).simulate_counters();
    assert_eq!(sim.order, vec![1, 0]);
    assert!(sim.stuck.is_empty());
}

#[test]
fn simulate_counters_reports_stuck_tasks() {
    let mut p = chain2();
    let c = p.new_counter("tail");
    p.push_task(Opcode::NOP, &[], &[], c, &[(1, 1)], Map::new(), "after z");
    p.tasks[1].waits[0].threshold = 2; // unsatisfiable: one producer
    let sim = p.simulate_counters();
    assert_eq!(sim.order, vec![0]);
    assert_eq!(sim.stuck, vec![1, 2]);
    // A cycle is stuck too.
    let sim = defect(ErrorKind::Cycle).prog.simulate_counters();
    assert!(sim.order.is_empty());
    assert_eq!(sim.stuck, vec![0, 1]);
}

#[test]
fn simulate_adversarial_flags_a_dropped_wait() {
    let mut p = tiled();
    p.tasks[4].waits.clear();
    let v = p.simulate_adversarial(16);
    assert!(!v.is_empty(), "no seed exposed the dropped wait");
    assert!(v.iter().all(|x| x.task == 4 && x.buffer == 2), "{v:?}");
    // The static validator agrees.
    assert!(check(&p).has(ErrorKind::RawRace));
}

#[test]
fn simulate_adversarial_is_clean_on_valid_programs() {
    for p in [
        tiled(),
        chain2(),
        relay(70, None),
        inplace(true),
        paged(true),
    ] {
        assert!(check(&p).ok());
        assert_eq!(p.simulate_adversarial(16), vec![]);
    }
    // KV_APPEND reading its own cache and attention over prior state are not violations.
    assert_eq!(attention().simulate_adversarial(16), vec![]);
}

// ---------------------------------------------------------------------------------------------
// Reference lowerings (docs/models.md, "The reference lowering") must stay valid

/// Shape of a toy decoder, lowered as the reference lowering does (docs/models.md, "The
/// reference lowering").
#[derive(Clone, Copy)]
struct Toy {
    hidden: u64,
    n_heads: u64,
    n_kv: u64,
    head_dim: u64,
    inter: u64,
    vocab: u64,
    layers: usize,
    max_seq: u64,
    pos: i64,
    n_tile: Option<u64>,
    partitions: u64,
}

impl Toy {
    fn toy2() -> Self {
        Toy {
            hidden: 64,
            n_heads: 4,
            n_kv: 2,
            head_dim: 16,
            inter: 128,
            vocab: 256,
            layers: 2,
            max_seq: 32,
            pos: 5,
            n_tile: None,
            partitions: 1,
        }
    }
}

/// `_gemv_n_tile` then the tile list `(n_off, N_tile)`.
fn tiles(n: u64, n_tile: Option<u64>) -> Vec<(u64, u64)> {
    let mut w = match n_tile {
        Some(t) => t.min(n).max(1),
        // max(16, base_width = 32), then capped by N.
        None => 32u64.min(n).max(1),
    };
    if n.div_ceil(w) > 64 {
        w = n.div_ceil(64);
    }
    (0..n.div_ceil(w))
        .map(|i| (i * w, w.min(n - i * w)))
        .collect()
}

struct Lowering<'a> {
    p: Program,
    cfg: &'a Toy,
}

impl Lowering<'_> {
    fn act(&mut self, name: &str, shape: &[u64]) -> (BufferId, CounterId) {
        let b = self.p.new_buffer(name, ACTIVATION, F32, shape);
        let c = self.p.new_counter(format!("{name} ready"));
        (b, c)
    }

    /// Tiled `y = x @ W^T`; returns `(y, counter, #tiles)`.
    fn linear(
        &mut self,
        x: BufferId,
        wname: &str,
        k: u64,
        n: u64,
        out: (BufferId, CounterId),
        waits: &[(CounterId, i64)],
    ) -> (BufferId, CounterId, i64) {
        let w = self
            .p
            .new_weight(wname, F32, &[n, k], format!("{wname}.weight"));
        let ts = tiles(n, self.cfg.n_tile);
        for (i, &(off, nt)) in ts.iter().enumerate() {
            let t = self.p.push_task(
                Opcode::GEMV_TILE,
                &[x, w],
                &[out.0],
                out.1,
                waits,
                gemv(k as i64, nt as i64, off as i64),
                format!("{wname}[{i}]"),
            );
            self.p.tasks[t as usize].est_bytes = (k * nt * 4) as i64;
            self.p.tasks[t as usize].est_flops = (2 * k * nt) as i64;
        }
        (out.0, out.1, ts.len() as i64)
    }
}

/// The reference's B = 1 decode lowering of `cfg` (docs/models.md, "The reference
/// lowering"), F32, untied lm_head.
fn lower(cfg: &Toy) -> Program {
    let (h, nh, nkv, hd) = (cfg.hidden, cfg.n_heads, cfg.n_kv, cfg.head_dim);
    let (qd, kvd) = (nh * hd, nkv * hd);
    let kv_len = cfg.pos + 1;
    let mut l = Lowering {
        p: Program::new(),
        cfg,
    };
    let target = h100();
    l.p.meta = m(&[
        ("model", "toy".into()),
        ("gpu", "h100".into()),
        ("regime", "decode".into()),
        ("pos", cfg.pos.into()),
        ("kv_len", kv_len.into()),
        ("dtype", "F32".into()),
        ("n_layers", (cfg.layers as i64).into()),
    ]);
    let tok = l.p.new_buffer("token_id", IO_INPUT, I32, &[1]);
    let pos = l.p.new_buffer("pos", IO_INPUT, I32, &[1]);
    let rid = l.p.new_buffer("reshape_id0", IO_INPUT, I32, &[1]);
    let table =
        l.p.new_weight("embed", F32, &[cfg.vocab, h], "embed.weight");
    let (h0, c_h0) = l.act("h0", &[1, h]);
    l.p.push_task(
        Opcode::EMBED,
        &[tok, table],
        &[h0],
        c_h0,
        &[],
        m(&[("hidden", (h as i64).into())]),
        "embed",
    );
    let norm = |eps: f64| m(&[("eps", eps.into()), ("hidden", (h as i64).into())]);
    let (mut resid, mut c_resid) = (h0, c_h0);
    for li in 0..cfg.layers {
        let pre = format!("layers.{li}");
        let w_in = l.p.new_weight(
            format!("{pre}.input_norm"),
            F32,
            &[h],
            format!("{pre}.input_norm"),
        );
        let an = l.act(&format!("{pre}.an"), &[1, h]);
        l.p.push_task(
            Opcode::RMSNORM,
            &[resid, w_in],
            &[an.0],
            an.1,
            &[(c_resid, 1)],
            norm(1e-6),
            format!("{pre}.rmsnorm_attn"),
        );
        let wa = [(an.1, 1)];
        let q_out = l.act(&format!("{pre}.q"), &[1, qd]);
        let q = l.linear(an.0, &format!("{pre}.attn.q_proj"), h, qd, q_out, &wa);
        let k_out = l.act(&format!("{pre}.k"), &[1, kvd]);
        let k = l.linear(an.0, &format!("{pre}.attn.k_proj"), h, kvd, k_out, &wa);
        let v_out = l.act(&format!("{pre}.v"), &[1, kvd]);
        let v = l.linear(an.0, &format!("{pre}.attn.v_proj"), h, kvd, v_out, &wa);
        let head_params = m(&[("hidden", (hd as i64).into())]);
        let rope_params = m(&[("head_dim", (hd as i64).into()), ("theta", 10000.0.into())]);
        let qh = l.act(&format!("{pre}.q_heads"), &[nh, hd]);
        l.p.push_task(
            Opcode::EMBED,
            &[rid, q.0],
            &[qh.0],
            qh.1,
            &[(q.1, q.2)],
            head_params.clone(),
            format!("{pre}.reshape_q"),
        );
        let qr = l.act(&format!("{pre}.qr"), &[nh, hd]);
        l.p.push_task(
            Opcode::ROPE,
            &[qh.0, pos],
            &[qr.0],
            qr.1,
            &[(qh.1, 1)],
            rope_params.clone(),
            format!("{pre}.rope_q"),
        );
        let kh = l.act(&format!("{pre}.k_heads"), &[1, nkv, hd]);
        l.p.push_task(
            Opcode::EMBED,
            &[rid, k.0],
            &[kh.0],
            kh.1,
            &[(k.1, k.2)],
            head_params,
            format!("{pre}.reshape_k"),
        );
        let kr = l.act(&format!("{pre}.kr"), &[1, nkv, hd]);
        l.p.push_task(
            Opcode::ROPE,
            &[kh.0, pos],
            &[kr.0],
            kr.1,
            &[(kh.1, 1)],
            rope_params,
            format!("{pre}.rope_k"),
        );
        let kc = l.p.new_buffer(
            format!("{pre}.kcache"),
            KV_CACHE,
            F32,
            &[cfg.max_seq, nkv, hd],
        );
        let vc = l.p.new_buffer(
            format!("{pre}.vcache"),
            KV_CACHE,
            F32,
            &[cfg.max_seq, nkv, hd],
        );
        let c_ka = l.p.new_counter(format!("{pre}.k appended"));
        let c_va = l.p.new_counter(format!("{pre}.v appended"));
        let pos_p = m(&[("pos", cfg.pos.into())]);
        l.p.push_task(
            Opcode::KV_APPEND,
            &[kr.0, kc],
            &[kc],
            c_ka,
            &[(kr.1, 1)],
            pos_p.clone(),
            format!("{pre}.kv_append_k"),
        );
        l.p.push_task(
            Opcode::KV_APPEND,
            &[v.0, vc],
            &[vc],
            c_va,
            &[(v.1, v.2)],
            pos_p,
            format!("{pre}.kv_append_v"),
        );
        let attn = l.act(&format!("{pre}.attn"), &[1, qd]);
        let scale = (hd as f64).powf(-0.5);
        let attn_waits = [(qr.1, 1), (c_ka, 1), (c_va, 1)];
        let base = m(&[
            ("head_dim", (hd as i64).into()),
            ("scale", scale.into()),
            ("n_heads", (nh as i64).into()),
            ("n_kv_heads", (nkv as i64).into()),
        ]);
        if cfg.partitions <= 1 {
            let mut params = base.clone();
            params.insert("kv_start", 0.into());
            params.insert("kv_len", kv_len.into());
            l.p.push_task(
                Opcode::ATTENTION_TILE,
                &[qr.0, kc, vc],
                &[attn.0],
                attn.1,
                &attn_waits,
                params,
                format!("{pre}.attention"),
            );
        } else {
            let p_eff = cfg
                .partitions
                .min(8)
                .min(target.num_sms as u64)
                .min((kv_len as u64).div_ceil(16));
            let shard = (kv_len as u64).div_ceil(p_eff.max(1));
            let mut parts = Vec::new();
            let mut waits = Vec::new();
            for s in 0..p_eff {
                let start = s * shard;
                let len = shard.min(kv_len as u64 - start.min(kv_len as u64));
                if len == 0 {
                    continue;
                }
                let part = l.act(&format!("{pre}.attn_part{s}"), &[nh, hd + 2]);
                let mut params = base.clone();
                params.insert("kv_start", (start as i64).into());
                params.insert("kv_len", (len as i64).into());
                params.insert("flags", 2.into());
                let t = l.p.push_task(
                    Opcode::ATTENTION_TILE,
                    &[qr.0, kc, vc],
                    &[part.0],
                    part.1,
                    &attn_waits,
                    params,
                    format!("{pre}.attention_shard{s}"),
                );
                l.p.tasks[t as usize].sm = Some((s % target.num_sms as u64) as i32);
                parts.push(part.0);
                waits.push((part.1, 1));
            }
            let cparams = m(&[
                ("head_dim", (hd as i64).into()),
                ("n_heads", (nh as i64).into()),
                ("n_kv_heads", (nkv as i64).into()),
            ]);
            l.p.push_task(
                Opcode::ATTENTION_COMBINE,
                &parts,
                &[attn.0],
                attn.1,
                &waits,
                cparams,
                format!("{pre}.attention_combine"),
            );
        }
        let o_out = l.act(&format!("{pre}.o"), &[1, h]);
        let o = l.linear(
            attn.0,
            &format!("{pre}.attn.o_proj"),
            qd,
            h,
            o_out,
            &[(attn.1, 1)],
        );
        let h1 = l.act(&format!("{pre}.h1"), &[1, h]);
        l.p.push_task(
            Opcode::ADD,
            &[resid, o.0],
            &[h1.0],
            h1.1,
            &[(c_resid, 1), (o.1, o.2)],
            Map::new(),
            format!("{pre}.residual_attn"),
        );
        let w_post = l.p.new_weight(
            format!("{pre}.post_norm"),
            F32,
            &[h],
            format!("{pre}.post_norm"),
        );
        let mn = l.act(&format!("{pre}.mn"), &[1, h]);
        l.p.push_task(
            Opcode::RMSNORM,
            &[h1.0, w_post],
            &[mn.0],
            mn.1,
            &[(h1.1, 1)],
            norm(1e-6),
            format!("{pre}.rmsnorm_mlp"),
        );
        let g_out = l.act(&format!("{pre}.gate"), &[1, cfg.inter]);
        let g = l.linear(
            mn.0,
            &format!("{pre}.mlp.gate_proj"),
            h,
            cfg.inter,
            g_out,
            &[(mn.1, 1)],
        );
        let u_out = l.act(&format!("{pre}.up"), &[1, cfg.inter]);
        let u = l.linear(
            mn.0,
            &format!("{pre}.mlp.up_proj"),
            h,
            cfg.inter,
            u_out,
            &[(mn.1, 1)],
        );
        let a = l.act(&format!("{pre}.act"), &[1, cfg.inter]);
        l.p.push_task(
            Opcode::SILU_MUL,
            &[g.0, u.0],
            &[a.0],
            a.1,
            &[(g.1, g.2), (u.1, u.2)],
            Map::new(),
            format!("{pre}.swiglu"),
        );
        let d_out = l.act(&format!("{pre}.down"), &[1, h]);
        let d = l.linear(
            a.0,
            &format!("{pre}.mlp.down_proj"),
            cfg.inter,
            h,
            d_out,
            &[(a.1, 1)],
        );
        let h2 = l.act(&format!("{pre}.h2"), &[1, h]);
        l.p.push_task(
            Opcode::ADD,
            &[h1.0, d.0],
            &[h2.0],
            h2.1,
            &[(h1.1, 1), (d.1, d.2)],
            Map::new(),
            format!("{pre}.residual_mlp"),
        );
        resid = h2.0;
        c_resid = h2.1;
    }
    let wf = l.p.new_weight("final_norm", F32, &[h], "final_norm");
    let hf = l.act("hf", &[1, h]);
    l.p.push_task(
        Opcode::RMSNORM,
        &[resid, wf],
        &[hf.0],
        hf.1,
        &[(c_resid, 1)],
        norm(1e-6),
        "final_norm",
    );
    let logits = l.p.new_buffer("logits", IO_OUTPUT, F32, &[1, cfg.vocab]);
    let c_logits = l.p.new_counter("logits ready");
    l.linear(
        hf.0,
        "lm_head",
        h,
        cfg.vocab,
        (logits, c_logits),
        &[(hf.1, 1)],
    );
    l.p.target = Some(target);
    l.p
}

#[rstest]
#[case::auto_tiles(None, 66, 65, 41)]
#[case::n_tile_64(Some(64), 48, 65, 41)]
#[case::n_tile_128(Some(128), 42, 65, 41)]
fn toy_lowering_matches_the_reference_counts_and_validates(
    #[case] n_tile: Option<u64>,
    #[case] tasks: usize,
    #[case] buffers: usize,
    #[case] counters: usize,
) {
    // docs/models.md, "The reference lowering": toy 2L has 66 tasks (auto), 48 (N_tile 64),
    // 42 (N_tile 128), 65 buffers, 41 counters.
    let p = lower(&Toy {
        n_tile,
        ..Toy::toy2()
    });
    assert_eq!(
        (p.tasks.len(), p.buffers.len(), p.counters.len()),
        (tasks, buffers, counters)
    );
    let r = check(&p);
    assert_ok(&r);
    assert!(r.warnings.is_empty(), "{}", r.report());
    assert!(p.simulate_counters().stuck.is_empty());
    assert_eq!(p.simulate_adversarial(8), vec![]);
}

#[test]
fn llama_shaped_lowering_validates() {
    // Llama h512 L2 (8/2 x 64, I2048, V32000): 182 tasks at N_tile 128 (docs/models.md, "The
    // reference lowering").
    let cfg = Toy {
        hidden: 512,
        n_heads: 8,
        n_kv: 2,
        head_dim: 64,
        inter: 2048,
        vocab: 32000,
        layers: 2,
        max_seq: 64,
        pos: 0,
        n_tile: Some(128),
        partitions: 1,
    };
    let p = lower(&cfg);
    assert_eq!(p.tasks.len(), 182);
    assert_ok(&check(&p));
    let p = lower(&Toy {
        n_tile: None,
        ..cfg
    });
    assert_eq!(p.tasks.len(), 458);
    assert_ok(&check(&p));
}

#[test]
fn split_kv_lowering_validates() {
    let cfg = Toy {
        pos: 40,
        max_seq: 64,
        partitions: 3,
        ..Toy::toy2()
    };
    let p = lower(&cfg);
    assert!(p.sm_assigned());
    assert!(p.tasks.iter().any(|t| t.op == Opcode::ATTENTION_COMBINE));
    let r = check(&p);
    assert_ok(&r);
    assert!(r.warnings.is_empty(), "{}", r.report());
    // Dropping one shard's wait in the combine is a race on that shard's partial.
    let mut bad = p.clone();
    let comb = bad
        .tasks
        .iter()
        .position(|t| t.op == Opcode::ATTENTION_COMBINE)
        .expect("combine task");
    bad.tasks[comb].waits.pop();
    assert_only(&check(&bad), ErrorKind::RawRace);
}

#[test]
fn lowering_with_sms_in_list_order_validates() {
    let mut p = lower(&Toy::toy2());
    for (i, t) in p.tasks.iter_mut().enumerate() {
        t.sm = Some((i % 7) as i32);
    }
    let r = check(&p);
    assert_ok(&r);
    assert!(r.stats.sm_assigned);
}

/// A lowering above the reference's 8000-task cutoff: every proof still runs.
fn big_lowering() -> Program {
    lower(&Toy {
        layers: 21,
        n_tile: Some(1),
        ..Toy::toy2()
    })
}

#[test]
fn lowering_above_8000_tasks_is_fully_proven() {
    let p = big_lowering();
    assert!(p.tasks.len() > 8000, "{} tasks", p.tasks.len());
    let r = check(&p);
    assert_ok(&r);
    assert!(r.warnings.is_empty(), "{}", r.report());

    // A dropped wait deep inside: the residual ADD of the last layer forgets the o tiles.
    let mut bad = p.clone();
    let add = bad
        .tasks
        .iter()
        .rposition(|t| t.label.ends_with("residual_attn"))
        .expect("residual add");
    let o_counter = bad.tasks[add].waits[1].counter;
    bad.tasks[add].waits.retain(|w| w.counter != o_counter);
    let r = check(&bad);
    assert_only(&r, ErrorKind::RawRace);
    assert_eq!(first(&r, ErrorKind::RawRace).task, Some(add as TaskId));

    // Attention reading a KV cache before its append, in the last layer.
    let mut bad = p.clone();
    let at = bad
        .tasks
        .iter()
        .rposition(|t| t.op == Opcode::ATTENTION_TILE)
        .expect("attention");
    bad.tasks[at].waits.remove(1);
    let r = check(&bad);
    assert_only(&r, ErrorKind::RawRaceKv);

    // Overlapping tiles in the first layer.
    let mut bad = p;
    let t = bad
        .tasks
        .iter()
        .position(|t| t.op == Opcode::GEMV_TILE && t.param_i64("n_off") == Some(1))
        .expect("second tile");
    bad.tasks[t].params.insert("n_off", 0.into());
    let r = check(&bad);
    assert_only(&r, ErrorKind::WawRace);
}

#[test]
fn lowering_fixture_is_current() {
    // tests/fixtures/toy_decode_2l.json is this lowering as we write it (the robustness
    // suite mutates it). Regenerate with AMK_BLESS=1.
    let reg = registry();
    let text = lower(&Toy::toy2()).to_json(&reg).expect("serialise");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/toy_decode_2l.json");
    if std::env::var_os("AMK_BLESS").is_some() {
        std::fs::write(&path, &text).expect("write fixture");
    }
    let on_disk = std::fs::read_to_string(&path).expect("read fixture");
    assert_eq!(on_disk, text);
    let back = Program::from_json(&on_disk, &reg).expect("fixture loads");
    assert_ok(&check(&back));
}

// ---------------------------------------------------------------------------------------------
// The fused decode ops' shape rules (opcheck::fused_row and each op's own)

/// One fused task over x `[1, k_x]`; `kind`: 0 RMSNORM_GEMV `[x, norm, W]`, 1 GATE_UP_SILU
/// `[x, Wg, Wu, norm]`, 2 QKV_ROPE_APPEND `[x, Wq, Wk, Wv, pos, norm]` (2 Q heads, 1 KV head of
/// head_dim 8, caches of 4 rows). `wdt` is the weights' dtype.
fn one_fused(kind: u8, k_x: u64, wdt: DType, params: Map) -> Program {
    let k = 16u64;
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, k_x]);
    let nw = p.new_weight("norm", F32, &[k], "norm");
    let c = p.new_counter("done");
    match kind {
        0 => {
            let w = p.new_weight("w", wdt, &[24, k], "w");
            let y = p.new_buffer("y", IO_OUTPUT, F32, &[1, 24]);
            p.push_task(Opcode::RMSNORM_GEMV, &[x, nw, w], &[y], c, &[], params, "t");
        }
        1 => {
            let wg = p.new_weight("wg", wdt, &[24, k], "wg");
            let wu = p.new_weight("wu", wdt, &[24, k], "wu");
            let y = p.new_buffer("y", IO_OUTPUT, F32, &[1, 24]);
            p.push_task(
                Opcode::GATE_UP_SILU,
                &[x, wg, wu, nw],
                &[y],
                c,
                &[],
                params,
                "t",
            );
        }
        _ => {
            let wq = p.new_weight("wq", wdt, &[16, k], "wq");
            let wk = p.new_weight("wk", wdt, &[8, k], "wk");
            let wv = p.new_weight("wv", wdt, &[8, k], "wv");
            let pos = p.new_buffer("pos", IO_INPUT, I32, &[1]);
            let q = p.new_buffer("q", IO_OUTPUT, F32, &[2, 8]);
            let kc = p.new_buffer("kc", KV_CACHE, F32, &[4, 1, 8]);
            let vc = p.new_buffer("vc", KV_CACHE, F32, &[4, 1, 8]);
            p.push_task(
                Opcode::QKV_ROPE_APPEND,
                &[x, wq, wk, wv, pos, nw],
                &[q, kc, vc],
                c,
                &[],
                params,
                "t",
            );
        }
    }
    p
}

fn fused_params(kind: u8, n_tile: i64, n_off: i64) -> Map {
    let mut p = gemv(16, n_tile, n_off);
    p.insert("eps", 1e-5.into());
    if kind == 2 {
        for (key, v) in [("head_dim", 8), ("n_heads", 2), ("n_kv_heads", 1)] {
            p.insert(key, v.into());
        }
        p.insert("theta", 10000.0.into());
    }
    p
}

#[rstest]
#[case::rmsnorm_gemv_ok(0, 16, F32, fused_params(0, 24, 0), None)]
#[case::rmsnorm_gemv_past_n(0, 16, F32, fused_params(0, 16, 16), Some(ErrorKind::TileOutOfBounds))]
#[case::rmsnorm_gemv_two_rows(0, 32, F32, fused_params(0, 24, 0), Some(ErrorKind::ShapeMismatch))]
#[case::rmsnorm_gemv_int8(0, 16, I8, fused_params(0, 24, 0), Some(ErrorKind::ShapeMismatch))]
#[case::gate_up_ok(1, 16, F16, fused_params(1, 8, 16), None)]
#[case::gate_up_past_n(1, 16, F32, fused_params(1, 9, 16), Some(ErrorKind::TileOutOfBounds))]
#[case::qkv_ok(2, 16, F32, fused_params(2, 32, 0), None)]
#[case::qkv_odd_offset(2, 16, F32, fused_params(2, 4, 3), Some(ErrorKind::TileOutOfBounds))]
#[case::qkv_past_units(2, 16, F32, fused_params(2, 8, 28), Some(ErrorKind::TileOutOfBounds))]
fn fused_op_shape_rules(
    #[case] kind: u8,
    #[case] k_x: u64,
    #[case] wdt: DType,
    #[case] params: Map,
    #[case] want: Option<ErrorKind>,
) {
    let r = check(&one_fused(kind, k_x, wdt, params));
    assert_outcome(&r, want, &["task 0"]);
}

/// A norm input without `eps`, and a Q/K/V task whose position buffer is a float.
#[test]
fn fused_ops_need_eps_with_a_norm_and_an_integer_position() {
    let no_eps = gemv(16, 8, 0);
    assert_only(
        &check(&one_fused(1, 16, F32, no_eps)),
        ErrorKind::ShapeMismatch,
    );
    let mut p = one_fused(2, 16, F32, fused_params(2, 32, 0));
    let pos = p.buffers.iter().position(|b| b.name == "pos").unwrap();
    p.buffers[pos].dtype = F32;
    assert_only(&check(&p), ErrorKind::ShapeMismatch);
}

// ---------------------------------------------------------------------------------------------
// STATE buffers and step loops

#[test]
fn a_state_read_ordered_before_every_writer_is_a_carried_read() {
    let r = check(&looped(false));
    assert_ok(&r);
    // t0 reads `s` before t2 writes it: the previous pass's value, final when the pass starts.
    assert_eq!(*r.carried_reads, [(0, 0)]);
}

#[test]
fn a_state_read_after_its_writer_is_accepted_but_not_carried() {
    let mut p = looped(false);
    // t1 also reads `s`, which t2 writes after it; t3 reads it after t2: ordered both ways.
    p.tasks[3].inputs = vec![0];
    let r = check(&p);
    assert_ok(&r);
    assert_eq!(*r.carried_reads, [(0, 0)]);
}

#[test]
fn a_state_read_unordered_with_a_writer_is_a_race() {
    let mut p = looped(false);
    // t1 reads `s` and t2 (its writer) no longer waits for t1: both follow t0 only, so t1's
    // read is neither before nor after t2's write. t3 still ends the pass after both.
    p.tasks[1].inputs = vec![0];
    p.tasks[2].waits = vec![amk_core::Wait {
        counter: 0,
        threshold: 1,
    }];
    p.tasks[3].waits.push(amk_core::Wait {
        counter: 1,
        threshold: 1,
    });
    let r = check(&p);
    assert_only(&r, ErrorKind::RawRace);
    let e = first(&r, ErrorKind::RawRace);
    assert_mentions(&e.message, &["state buffer #0", "'s'", "2"]);
    assert_eq!(e.task, Some(1));
    assert_eq!(e.others, vec![2]);
}

#[rstest]
#[case::not_state(BufferKind::ACTIVATION, I32)]
#[case::not_integer(BufferKind::STATE, F32)]
fn the_halt_word_must_be_an_integer_state_buffer(#[case] kind: BufferKind, #[case] dtype: DType) {
    let mut p = looped(false);
    p.buffers[3].kind = kind;
    p.buffers[3].dtype = dtype;
    let r = check(&p);
    let e = first(&r, ErrorKind::StepLoop);
    assert_mentions(&e.message, &["halt", "#3", "integer STATE"]);
    assert_eq!(e.buffer, Some(3));
}

#[test]
fn the_gate_must_exist_and_be_signalled() {
    let mut p = looped(false);
    p.step_loop = Some(amk_core::StepLoop { gate: 9, halt: 3 });
    assert_mentions(
        &first(&check(&p), ErrorKind::StepLoop).message,
        &["#9", "does not exist"],
    );
    let mut p = looped(false);
    let spare = p.new_counter("nobody signals it");
    p.step_loop = Some(amk_core::StepLoop {
        gate: spare,
        halt: 3,
    });
    assert_mentions(
        &first(&check(&p), ErrorKind::StepLoop).message,
        &["no task signals"],
    );
}

#[test]
fn a_gate_that_ends_mid_pass_is_not_a_barrier() {
    // Gate on t1's counter: t2 and t3 run after it, so the next pass could overlap them.
    let mut p = looped(false);
    p.step_loop = Some(amk_core::StepLoop { gate: 1, halt: 3 });
    let r = check(&p);
    let e = first(&r, ErrorKind::StepLoop);
    assert_mentions(&e.message, &["2 task(s)", "2:write s", "3:halt"]);
    assert_eq!(e.others, vec![2, 3]);
}

#[test]
fn state_buffers_cannot_live_in_scratch_pages() {
    let mut p = looped(false);
    p.pages = Some(PageAllocation {
        buffer_to_page: vec![(0, 0)],
        pages: vec![Page {
            id: 0,
            space: MemSpace::GLOBAL_SCRATCH,
            nbytes: 256,
            live_start: -1,
            live_end: -1,
        }],
    });
    let r = check(&p);
    assert_mentions(&first(&r, ErrorKind::PageTable).message, &["STATE", "#0"]);
}

/// A program whose every reader races every writer (2,000 tile writers of one buffer, 2,000
/// readers that wait for none): the report lists at most `MAX_PER_KIND` errors, each naming a
/// few writers and how many more, in bounded time and text — not one message a reader with
/// every writer in it (quadratic: a 40k-task program took 36 s and printed 129 MB).
#[test]
fn races_with_thousands_of_writers_are_summarised() {
    let (writers, readers, tile) = (2000i64, 2000usize, 8i64);
    let mut p = Program::new();
    let x = p.new_buffer("x", IO_INPUT, F32, &[1, 4]);
    let w = p.new_buffer("w", WEIGHT, F32, &[(writers * tile) as u64, 4]);
    let y = p.new_buffer("y", ACTIVATION, F32, &[1, (writers * tile) as u64]);
    let c = p.new_counter("y tiles");
    for i in 0..writers {
        p.push_task(
            Opcode::GEMV_TILE,
            &[x, w],
            &[y],
            c,
            &[],
            gemv(4, tile, i * tile),
            format!("tile {i}"),
        );
    }
    for i in 0..readers {
        let out = p.new_buffer(
            format!("o{i}"),
            IO_OUTPUT,
            F32,
            &[1, (writers * tile) as u64],
        );
        let ci = p.new_counter(format!("c{i}"));
        p.push_task(
            Opcode::COPY,
            &[y],
            &[out],
            ci,
            &[],
            Map::new(),
            format!("read {i}"),
        );
    }
    let t0 = std::time::Instant::now();
    let r = check(&p);
    let races: Vec<_> = r
        .errors
        .iter()
        .filter(|e| e.kind == ErrorKind::RawRace)
        .collect();
    assert!(
        // the listed ones, plus the "... and N more" summary
        !races.is_empty() && races.len() <= amk_core::validate::MAX_PER_KIND + 1,
        "{} raw_race errors listed",
        races.len()
    );
    let text: usize = r.errors.iter().map(|e| e.message.len()).sum();
    assert!(text < 1 << 20, "{text} bytes of messages");
    assert!(races[0].message.contains("more"), "{}", races[0].message);
    assert!(races.iter().all(|e| e.others.len() <= 64));
    let report = r.report();
    assert!(
        report.contains("more raw_race errors not listed"),
        "{}",
        &report[..400.min(report.len())]
    );
    assert!(t0.elapsed().as_secs() < 30, "{:?}", t0.elapsed());
}

/// Every kernel knob and target field out of range is refused, each with its own message, and
/// the reference's limits themselves are accepted.
#[test]
fn bad_config_covers_every_knob_and_target_field() {
    let with = |f: &dyn Fn(&mut ScheduleConfig, &mut GpuTarget)| {
        let mut p = chain2();
        let (mut c, mut t) = (ScheduleConfig::default(), h100());
        f(&mut c, &mut t);
        p.config = Some(c);
        p.target = Some(t);
        check(&p)
    };
    type Edit = fn(&mut ScheduleConfig, &mut GpuTarget);
    let bad: [(Edit, &str); 8] = [
        (
            |c, _| c.threads_per_block = 2048,
            "threads_per_block = 2048",
        ),
        (|c, _| c.threads_per_block = 0, "threads_per_block = 0"),
        (
            |c, _| c.smem_bytes_per_block = -1,
            "smem_bytes_per_block = -1",
        ),
        (
            |c, t| c.smem_bytes_per_block = t.smem_bytes_per_block_optin + 1,
            "smem_bytes_per_block",
        ),
        (|c, _| c.pipelining_depth = -1, "pipelining_depth = -1"),
        (|_, t| t.regs_per_sm = -7, "target.regs_per_sm = -7"),
        (|_, t| t.clock_ghz = f64::NAN, "target.clock_ghz = NaN"),
        (|_, t| t.hbm_bytes = 0, "target.hbm_bytes = 0"),
    ];
    for (edit, needle) in bad {
        let r = with(&edit);
        assert!(r.has(ErrorKind::BadConfig), "{needle}: accepted");
        assert_mentions(&first(&r, ErrorKind::BadConfig).message, &[needle]);
    }
    let r = with(&|c, t| {
        c.threads_per_block = 1024;
        c.smem_bytes_per_block = t.smem_bytes_per_block_optin;
        c.pipelining_depth = 0;
    });
    assert_ok(&r);
}

/// TOKEN_NLL `[logits, targets] -> nll`: row tiles of one F32 output sharing a counter are
/// accepted; float targets, an integer output, a target count that is not the rows, a tile
/// past the rows and overlapping tiles are refused.
#[rstest]
#[case::two_tiles("", None)]
#[case::float_targets("float targets", Some(ErrorKind::ShapeMismatch))]
#[case::integer_output("integer output", Some(ErrorKind::ShapeMismatch))]
#[case::three_targets("three targets", Some(ErrorKind::ShapeMismatch))]
#[case::tile_past_the_rows("tile past", Some(ErrorKind::TileOutOfBounds))]
#[case::overlapping_tiles("overlap", Some(ErrorKind::WawRace))]
fn token_nll_rows(#[case] bad: &str, #[case] want: Option<ErrorKind>) {
    let mut p = Program::new();
    let x = p.new_buffer("logits", IO_INPUT, DType::BF16, &[4, 256]);
    let (tdt, tn) = match bad {
        "float targets" => (F32, 4),
        "three targets" => (I32, 3),
        _ => (I32, 4),
    };
    let t = p.new_buffer("targets", IO_INPUT, tdt, &[tn]);
    let odt = if bad == "integer output" { I32 } else { F32 };
    let o = p.new_buffer("nll", IO_OUTPUT, odt, &[4]);
    let c = p.new_counter("nll");
    let second = match bad {
        "tile past" => (2, 3),
        "overlap" => (1, 3),
        _ => (2, 2),
    };
    for (m_off, m_tile) in [(0, 2), second] {
        let pr = m(&[
            ("m_off", m_off.into()),
            ("M_tile", m_tile.into()),
            ("n_off", 0.into()),
            ("N_tile", 1.into()),
        ]);
        p.push_task(Opcode::TOKEN_NLL, &[x, t], &[o], c, &[], pr, "nll");
    }
    let r = check(&p);
    match want {
        None => assert_ok(&r),
        Some(kind) => assert!(
            r.error_kinds().contains(&kind),
            "{bad}: {:?}",
            r.error_kinds()
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Floating tasks (docs/ir.md, check 3a): each rule on its own

/// The merge listed first, its producers after it on SM 0: as a queued task on SM 0 it
/// would wait forever ahead of them; floating, it is in no queue.
fn merge_listed_first(floating: bool) -> Program {
    let (mut p, m) = merge_of_two(true);
    p.tasks[1].sm = Some(0);
    p.tasks[2].sm = Some(0);
    if floating {
        p.tasks[m].floating = true;
    } else {
        p.tasks[m].sm = Some(0);
    }
    p
}

#[test]
fn floating_task_is_in_no_queue() {
    assert_ok(&check(&floating_merge()));
    assert_ok(&check(&merge_listed_first(true)));
    let r = check(&merge_listed_first(false));
    assert!(r.has(ErrorKind::SmQueueOrder), "{}", r.report());
}

#[rstest]
#[case::two_waits("2 waits")]
#[case::no_wait("0 waits")]
#[case::partial("waits for 1 of the 2 signals")]
#[case::floating_producer("floating task 0 signals")]
#[case::own_sm("has SM 3")]
#[case::on_chip("on-chip buffer #1 (a)")]
fn each_floating_rule_breaks_it(#[case] needle: &str) {
    let mut p = floating_merge();
    let mut also: Vec<ErrorKind> = Vec::new();
    match needle {
        "2 waits" => {
            let c = p.new_counter("extra");
            p.push_task(Opcode::NOP, &[], &[], c, &[], Map::new(), "extra");
            p.tasks[2].waits.push(amk_core::Wait {
                counter: c,
                threshold: 1,
            });
        }
        "0 waits" => p.tasks[2].waits.clear(),
        "waits for 1 of the 2 signals" => {
            p.tasks[2].waits[0].threshold = 1;
            also.push(ErrorKind::PartialSharedWait);
        }
        "floating task 0 signals" => {
            p.tasks[0].floating = true;
            p.tasks[0].sm = None;
            // task 0 now has no wait at all, which is its own finding
        }
        "has SM 3" => p.tasks[2].sm = Some(3),
        // (check 5b only warns: one of the buffer's users has no SM to compare)
        _ => p.buffers[1].space = MemSpace::SMEM,
    }
    let r = check(&p);
    let kinds: BTreeSet<ErrorKind> = r.error_kinds().into_iter().collect();
    assert!(
        kinds.contains(&ErrorKind::FloatingTask),
        "{needle}: accepted: {kinds:?}"
    );
    for k in also {
        assert!(kinds.contains(&k), "{needle}: {k} missing: {kinds:?}");
    }
    let messages: Vec<&str> = (r.errors.iter())
        .filter(|e| e.kind == ErrorKind::FloatingTask)
        .map(|e| e.message.as_str())
        .collect();
    assert!(
        messages.iter().any(|m| m.contains(needle)),
        "{needle}: not among {messages:?}"
    );
}
