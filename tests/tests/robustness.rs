//! Robustness: the loader and the validator are total (docs/ir.md, "Where we are stricter than
//! the reference tooling": "never panics and never aborts, on any input"), and every proof runs
//! at every size.
//!
//! Property-style tests with fixed seeds (`amk_core::sim::SplitMix`, no extra dependencies):
//! random bytes and JSON-ish token soups never panic the loader; randomly mutated valid
//! programs (ids in and out of range, deleted/duplicated tasks, params of every JSON type,
//! thresholds, SMs, page tables, shapes, counters, kinds) never panic `validate`,
//! `simulate_counters` or `simulate_adversarial`, and whatever loads re-serialises stably.
//! `catch_unwind` is used only to *report* a panic as a failure together with the offending
//! input. Scale: a 5,000+-task cycle has a witness and no stack overflow; 50,000-task chains
//! validate in reasonable time and still have their races found.

// Helpers outside `#[test]` functions (which clippy.toml already exempts) fail loudly on
// broken test setup by design.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use amk_core::json::{self, Map, Seg, Value};
use amk_core::sim::SplitMix;
use amk_core::{
    BufferKind, DType, ErrorKind, GpuTarget, MemSpace, Opcode, PARAM_FIELDS, Page, PageAllocation,
    Program, Registry, SmAssignment, TaskId, Wait, validate,
};
use rstest::rstest;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

fn reg() -> Registry {
    amk_ops::registry().expect("built-in registry")
}

// ---------------------------------------------------------------------------------------------
// Randomness

struct Rng(SplitMix);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(SplitMix(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next()
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    /// An integer that is often an edge case.
    fn int(&mut self) -> i64 {
        const EDGES: &[i64] = &[
            0,
            1,
            -1,
            2,
            3,
            4,
            7,
            8,
            9,
            15,
            16,
            31,
            32,
            63,
            64,
            65,
            127,
            128,
            255,
            256,
            1000,
            4096,
            i32::MAX as i64,
            i32::MIN as i64,
            i32::MAX as i64 + 1,
            u32::MAX as i64,
            u32::MAX as i64 + 1,
            1 << 40,
            i64::MAX,
            i64::MIN,
            i64::MAX - 1,
            i64::MIN + 1,
        ];
        match self.below(4) {
            0 => self.next() as i64,
            1 => (self.next() % 200) as i64 - 50,
            _ => *self.pick(EDGES),
        }
    }
    fn float(&mut self) -> f64 {
        const EDGES: &[f64] = &[
            0.0,
            -0.0,
            0.5,
            1.0,
            -1.0,
            1e-6,
            1e-5,
            10000.0,
            3.4e38,
            3.5e38,
            -3.5e38,
            1e300,
            f64::MAX,
            f64::MIN,
            5e-324,
            f64::EPSILON,
        ];
        if self.chance(50) {
            *self.pick(EDGES)
        } else {
            let f = f64::from_bits(self.next());
            if f.is_finite() { f } else { 1.5 }
        }
    }
    fn string(&mut self) -> String {
        const WORDS: &[&str] = &[
            "",
            "x",
            "GEMV_TILE",
            "FUSED",
            "WEIGHT",
            "KV_CACHE",
            "F32",
            "f32",
            "SMEM",
            "final",
            "é😀",
            "\u{0}",
            "\"\\",
            "0",
            "-1",
            "round_robin",
            "graph_color",
            "h100",
        ];
        self.pick(WORDS).to_string()
    }
    /// A JSON value of any type.
    fn value(&mut self, depth: u32) -> Value {
        match self.below(if depth >= 3 { 5 } else { 8 }) {
            0 => Value::Null,
            1 => Value::Bool(self.chance(50)),
            2 => Value::Int(self.int()),
            3 => Value::Float(self.float()),
            4 => Value::Str(self.string()),
            5 => Value::Array((0..self.below(4)).map(|_| self.value(depth + 1)).collect()),
            6 => {
                let mut m = Map::new();
                for _ in 0..self.below(4) {
                    let k = self.key();
                    let v = self.value(depth + 1);
                    m.insert(k, v);
                }
                Value::Object(m)
            }
            _ => json::parse(
                r#"{"steps": [{"op": 11, "args": [{"in": 0}, {"s": 0}], "out": "final"}]}"#,
            )
            .unwrap_or(Value::Null),
        }
    }
    fn key(&mut self) -> String {
        const KEYS: &[&str] = &[
            "id",
            "op",
            "inputs",
            "outputs",
            "out_counter",
            "waits",
            "counter",
            "threshold",
            "params",
            "sm",
            "floating",
            "shape",
            "kind",
            "dtype",
            "space",
            "steps",
            "args",
            "in",
            "s",
            "out",
            "recipe",
            "K",
            "N_tile",
            "n_off",
            "pos",
            "kv_len",
            "head_dim",
            "num_sms",
            "buffer_to_page",
            "pages",
            "nbytes",
            "init",
            "zzz",
        ];
        self.pick(KEYS).to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Panic capture

/// Runs `f`, turning a panic into its message.
fn no_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "<non-string panic>".into())
    })
}

/// Collected failures: stops the property after a few and reports them with their inputs.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    const MAX: usize = 3;
    fn add(&mut self, what: &str, msg: &str, input: &str) {
        let shown: String = input.chars().take(20_000).collect();
        self.0.push(format!(
            "{what} panicked: {msg}\n--- offending input ---\n{shown}\n"
        ));
    }
    fn full(&self) -> bool {
        self.0.len() >= Self::MAX
    }
    fn check(self, cases: usize) {
        assert!(
            self.0.is_empty(),
            "{} panic(s) in {cases} cases; first ones:\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

/// Everything a loaded program may be put through: validate, both simulations, and a
/// serialisation round trip. Returns the first panic, or a broken round trip.
fn exercise(p: &Program, reg: &Registry) -> Result<(), (String, String)> {
    no_panic(|| validate(p, reg)).map_err(|m| ("validate".to_string(), m))?;
    no_panic(|| p.simulate_counters()).map_err(|m| ("simulate_counters".to_string(), m))?;
    no_panic(|| p.simulate_adversarial(3)).map_err(|m| ("simulate_adversarial".to_string(), m))?;
    let text = no_panic(|| p.to_json(reg))
        .map_err(|m| ("to_json".to_string(), m))?
        .map_err(|e| ("to_json".to_string(), format!("error: {e}")))?;
    let back = no_panic(|| Program::from_json(&text, reg))
        .map_err(|m| ("from_json of our output".to_string(), m))?
        .map_err(|e| ("from_json of our output".to_string(), format!("error: {e}")))?;
    if back != *p {
        return Err(("round trip".into(), "re-read program differs".into()));
    }
    match back.to_json(reg) {
        Ok(again) if again == text => Ok(()),
        _ => Err(("round trip".into(), "re-written text differs".into())),
    }
}

fn describe(p: &Program, reg: &Registry) -> String {
    no_panic(|| p.to_json(reg))
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| format!("{p:#?}"))
}

// ---------------------------------------------------------------------------------------------
// Seed programs

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name),
    )
    .expect("fixture")
}

fn m(kv: &[(&str, Value)]) -> Map {
    let mut out = Map::new();
    for (k, v) in kv {
        out.insert(*k, v.clone());
    }
    out
}

/// Valid programs to mutate: the 2-layer toy lowering, the reference-layout fixture, and a
/// few small ones covering split-KV style partials, pages, on-chip buffers and FUSED.
fn seeds(reg: &Registry) -> Vec<Program> {
    let mut seeds = vec![
        Program::from_json(&fixture("toy_decode_2l.json"), reg).expect("toy fixture"),
        Program::from_json(&fixture("reference_layout.json"), reg).expect("layout fixture"),
    ];
    // Attention with appends, a combine of two partial shards, a page shared by separated
    // buffers, an SMEM buffer on one SM and a FUSED task.
    let mut p = Program::new();
    let q = p.new_buffer("q", BufferKind::IO_INPUT, DType::F32, &[4, 16]);
    let kn = p.new_buffer("k_new", BufferKind::IO_INPUT, DType::F32, &[1, 2, 16]);
    let vn = p.new_buffer("v_new", BufferKind::IO_INPUT, DType::F32, &[1, 32]);
    let kc = p.new_buffer("kc", BufferKind::KV_CACHE, DType::F32, &[8, 2, 16]);
    let vc = p.new_buffer("vc", BufferKind::KV_CACHE, DType::F32, &[8, 2, 16]);
    let p0 = p.new_buffer("part0", BufferKind::ACTIVATION, DType::F32, &[4, 18]);
    let p1 = p.new_buffer("part1", BufferKind::ACTIVATION, DType::F32, &[4, 18]);
    let attn = p.new_buffer("attn", BufferKind::ACTIVATION, DType::F32, &[1, 64]);
    let sm_buf = p.new_buffer("onchip", BufferKind::ACTIVATION, DType::F32, &[1, 64]);
    p.buffers[sm_buf as usize].space = MemSpace::SMEM;
    let out = p.new_buffer("out", BufferKind::IO_OUTPUT, DType::F32, &[1, 64]);
    let c: Vec<u32> = (0..7).map(|i| p.new_counter(format!("c{i}"))).collect();
    p.push_task(
        Opcode::KV_APPEND,
        &[kn, kc],
        &[kc],
        c[0],
        &[],
        m(&[("pos", 3.into())]),
        "ak",
    );
    p.push_task(
        Opcode::KV_APPEND,
        &[vn, vc],
        &[vc],
        c[1],
        &[],
        m(&[("pos", 3.into())]),
        "av",
    );
    for (s, part) in [(0i64, p0), (1, p1)] {
        let t = p.push_task(
            Opcode::ATTENTION_TILE,
            &[q, kc, vc],
            &[part],
            c[2 + s as usize],
            &[(c[0], 1), (c[1], 1)],
            m(&[
                ("head_dim", 16.into()),
                ("kv_start", (2 * s).into()),
                ("kv_len", 2.into()),
                ("scale", 0.25.into()),
                ("n_heads", 4.into()),
                ("n_kv_heads", 2.into()),
                ("flags", 2.into()),
            ]),
            format!("shard{s}"),
        );
        p.tasks[t as usize].sm = Some(s as i32);
    }
    p.push_task(
        Opcode::ATTENTION_COMBINE,
        &[p0, p1],
        &[attn],
        c[4],
        &[(c[2], 1), (c[3], 1)],
        m(&[("head_dim", 16.into()), ("n_heads", 4.into())]),
        "combine",
    );
    let t = p.push_task(
        Opcode::GELU,
        &[attn],
        &[sm_buf],
        c[5],
        &[(c[4], 1)],
        Map::new(),
        "gelu",
    );
    p.tasks[t as usize].sm = Some(3);
    let t = p.push_task(
        Opcode::FUSED,
        &[sm_buf, attn],
        &[out],
        c[6],
        &[(c[5], 1), (c[4], 1)],
        m(&[(
            "recipe",
            json::parse(
                r#"{"steps": [{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0},
                              {"op": 12, "args": [{"s": 0}], "out": "final", "params": {"scale": 0.5}}]}"#,
            )
            .expect("recipe"),
        )]),
        "fused",
    );
    p.tasks[t as usize].sm = Some(3);
    p.pages = Some(PageAllocation {
        buffer_to_page: vec![(p0, 0), (sm_buf, 0)],
        pages: vec![Page {
            id: 0,
            space: MemSpace::GLOBAL_SCRATCH,
            nbytes: 512,
            live_start: -1,
            live_end: -1,
        }],
    });
    p.target = GpuTarget::by_name("l4");
    let r = validate(&p, reg);
    assert!(r.ok(), "seed program must be valid:\n{}", r.report());
    seeds.push(p);
    for s in &seeds {
        assert!(validate(s, reg).ok());
    }
    seeds
}

// ---------------------------------------------------------------------------------------------
// Loader: random bytes and token soups

#[test]
fn random_bytes_never_panic_the_loader() {
    let reg = reg();
    let mut fails = Failures::default();
    let alphabet = b"{}[]:,\"\\ \n0123456789-+.eEtrufalsnNIy\xef\xbb\xbf\xff\xc3\xa9";
    let cases = 4000;
    for seed in 0..cases {
        let mut rng = Rng::new(0xB17E5 ^ seed);
        let len = rng.below(160);
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                if rng.chance(70) {
                    *rng.pick(alphabet)
                } else {
                    rng.next() as u8
                }
            })
            .collect();
        let res = no_panic(|| amk_core::codec::from_json_bytes(&bytes, &reg));
        match res {
            Err(msg) => fails.add("from_json_bytes", &msg, &format!("{bytes:?}")),
            Ok(Ok(p)) => {
                if let Err((what, msg)) = exercise(&p, &reg) {
                    fails.add(&what, &msg, &describe(&p, &reg));
                }
            }
            Ok(Err(_)) => {}
        }
        if fails.full() {
            break;
        }
    }
    fails.check(cases as usize);
}

#[test]
fn json_token_soups_never_panic_the_loader() {
    const TOKENS: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        " ",
        "\n",
        "\"",
        "\\",
        "\"ir_version\"",
        "\"0.2.0\"",
        "\"1.0\"",
        "\"buffers\"",
        "\"tasks\"",
        "\"counters\"",
        "\"pages\"",
        "\"config\"",
        "\"meta\"",
        "\"target\"",
        "\"id\"",
        "\"op\"",
        "\"GEMV_TILE\"",
        "\"FUSED\"",
        "\"kind\"",
        "\"WEIGHT\"",
        "\"dtype\"",
        "\"F32\"",
        "\"shape\"",
        "\"space\"",
        "\"HBM\"",
        "\"inputs\"",
        "\"outputs\"",
        "\"out_counter\"",
        "\"waits\"",
        "\"threshold\"",
        "\"params\"",
        "\"sm\"",
        "\"buffer_to_page\"",
        "\"sm_assignment\"",
        "0",
        "1",
        "-1",
        "64",
        "1.5",
        "1e999",
        "-0",
        "99999999999999999999",
        "4294967296",
        "true",
        "false",
        "null",
        "NaN",
        "Infinity",
        "-Infinity",
        "\"\\ud800\"",
        "\"\\u0041\"",
        "\"é\"",
        "\"\\n\"",
        "tru",
        "nul",
        "0x1",
        "\u{feff}",
        "\u{0}",
    ];
    let reg = reg();
    let mut fails = Failures::default();
    let cases = 4000;
    for seed in 0..cases {
        let mut rng = Rng::new(0x70CE ^ (seed << 8));
        let n = 1 + rng.below(80);
        let text: String = (0..n).map(|_| *rng.pick(TOKENS)).collect();
        match no_panic(|| Program::from_json(&text, &reg)) {
            Err(msg) => fails.add("from_json", &msg, &text),
            Ok(Ok(p)) => {
                if let Err((what, msg)) = exercise(&p, &reg) {
                    fails.add(&what, &msg, &text);
                }
            }
            Ok(Err(_)) => {}
        }
        if fails.full() {
            break;
        }
    }
    fails.check(cases as usize);
}

#[test]
fn random_json_documents_never_panic_the_loader() {
    // Well-formed JSON of random shape, at the top level and in place of each section.
    let reg = reg();
    let base = json::parse(&fixture("reference_layout.json")).expect("fixture");
    let sections = [
        "meta",
        "target",
        "buffers",
        "counters",
        "tasks",
        "pages",
        "config",
        "ir_version",
    ];
    let mut fails = Failures::default();
    let cases = 3000;
    for seed in 0..cases {
        let mut rng = Rng::new(0xD0C ^ (seed << 16));
        let doc = if rng.chance(20) {
            rng.value(0)
        } else {
            let mut d = base.clone();
            if let Value::Object(root) = &mut d {
                let k = *rng.pick(&sections);
                let v = rng.value(0);
                root.insert(k, v);
            }
            d
        };
        let text = json::to_pretty(&doc);
        match no_panic(|| Program::from_json(&text, &reg)) {
            Err(msg) => fails.add("from_json", &msg, &text),
            Ok(Ok(p)) => {
                if let Err((what, msg)) = exercise(&p, &reg) {
                    fails.add(&what, &msg, &text);
                }
            }
            Ok(Err(_)) => {}
        }
        if fails.full() {
            break;
        }
    }
    fails.check(cases as usize);
}

// ---------------------------------------------------------------------------------------------
// Mutated valid programs: JSON-level mutations

fn collect_paths(v: &Value, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    out.push(path.clone());
    match v {
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                path.push(Seg::Index(i));
                collect_paths(x, path, out);
                path.pop();
            }
        }
        Value::Object(o) => {
            for (k, x) in o.iter() {
                path.push(Seg::Key(k.to_string()));
                collect_paths(x, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn node_mut<'a>(v: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
    let mut cur = v;
    for s in path {
        cur = match (cur, s) {
            (Value::Array(a), Seg::Index(i)) => a.get_mut(*i)?,
            (Value::Object(o), Seg::Key(k)) => {
                o.0.iter_mut().find(|(kk, _)| kk == k).map(|(_, v)| v)?
            }
            _ => return None,
        };
    }
    Some(cur)
}

fn mutate_json(v: &mut Value, rng: &mut Rng) {
    let mut paths = Vec::new();
    collect_paths(v, &mut Vec::new(), &mut paths);
    // Prefer leaves under tasks/buffers/pages: that is where the ids are.
    let path = rng.pick(&paths).clone();
    let Some(node) = node_mut(v, &path) else {
        return;
    };
    match node {
        Value::Int(i) if rng.chance(60) => {
            *i = match rng.below(6) {
                0 => i.wrapping_add(1),
                1 => i.wrapping_sub(1),
                2 => i.wrapping_neg(),
                3 => i.wrapping_mul(64),
                _ => rng.int(),
            }
        }
        Value::Array(a) if !a.is_empty() && rng.chance(60) => match rng.below(4) {
            0 => {
                let i = rng.below(a.len());
                a.remove(i);
            }
            1 => {
                let i = rng.below(a.len());
                let x = a[i].clone();
                a.insert(rng.below(a.len() + 1), x);
            }
            2 => {
                let (i, j) = (rng.below(a.len()), rng.below(a.len()));
                a.swap(i, j);
            }
            _ => a.push(rng.value(1)),
        },
        Value::Object(o) if !o.is_empty() && rng.chance(60) => {
            if rng.chance(50) {
                let i = rng.below(o.len());
                o.0.remove(i);
            } else {
                let k = rng.key();
                let v = rng.value(1);
                o.insert(k, v);
            }
        }
        other => *other = rng.value(0),
    }
}

#[test]
fn json_mutants_of_valid_programs_never_panic() {
    let reg = reg();
    let docs: Vec<Value> = seeds(&reg)
        .iter()
        .map(|p| json::parse(&p.to_json(&reg).expect("serialise")).expect("parse"))
        .collect();
    let mut fails = Failures::default();
    let mut loaded = 0usize;
    let cases = 1200;
    for seed in 0..cases {
        let mut rng = Rng::new(0x5EED_0000 + seed);
        let mut doc = rng.pick(&docs).clone();
        for _ in 0..1 + rng.below(4) {
            mutate_json(&mut doc, &mut rng);
        }
        let text = json::to_pretty(&doc);
        match no_panic(|| Program::from_json(&text, &reg)) {
            Err(msg) => fails.add("from_json", &msg, &text),
            Ok(Ok(p)) => {
                loaded += 1;
                if let Err((what, msg)) = exercise(&p, &reg) {
                    fails.add(&what, &msg, &text);
                }
            }
            Ok(Err(e)) => {
                // Load errors name a JSON path (or a syntax position).
                let msg = e.to_string();
                assert!(
                    msg.contains('$') || msg.contains("line") || msg.contains("UTF-8"),
                    "load error without a location: {msg}"
                );
            }
        }
        if fails.full() {
            break;
        }
    }
    assert!(loaded > cases as usize / 10, "only {loaded} mutants loaded");
    fails.check(cases as usize);
}

// ---------------------------------------------------------------------------------------------
// Mutated valid programs: typed mutations (every mutant is loadable)

/// A buffer/counter/task id: usually in range, sometimes just past it or huge.
fn some_id(rng: &mut Rng, n: usize) -> u32 {
    match rng.below(10) {
        0 => n as u32,
        1 => (n as u32).wrapping_add(1),
        2 => u32::MAX,
        3 => rng.next() as u32,
        _ => rng.below(n.max(1)) as u32,
    }
}

fn renumber_tasks(p: &mut Program) {
    for (i, t) in p.tasks.iter_mut().enumerate() {
        t.id = i as TaskId;
    }
}

fn mutate_program(p: &mut Program, rng: &mut Rng) {
    let (nb, nc, nt) = (p.buffers.len(), p.counters.len(), p.tasks.len());
    let t = rng.below(nt.max(1));
    match rng.below(22) {
        0 if nt > 0 => {
            let k = rng.below(p.tasks[t].inputs.len() + 1);
            let id = some_id(rng, nb);
            if k < p.tasks[t].inputs.len() {
                p.tasks[t].inputs[k] = id;
            } else {
                p.tasks[t].inputs.push(id);
            }
        }
        1 if nt > 0 => {
            let id = some_id(rng, nb);
            if rng.chance(30) || p.tasks[t].outputs.is_empty() {
                p.tasks[t].outputs.push(id);
            } else {
                let k = rng.below(p.tasks[t].outputs.len());
                p.tasks[t].outputs[k] = id;
            }
        }
        2 if nt > 0 => p.tasks[t].out_counter = some_id(rng, nc),
        3 if nt > 0 => {
            let w = Wait {
                counter: some_id(rng, nc),
                threshold: rng.int(),
            };
            p.tasks[t].waits.push(w);
        }
        4 if nt > 0 && !p.tasks[t].waits.is_empty() => {
            let k = rng.below(p.tasks[t].waits.len());
            if rng.chance(50) {
                p.tasks[t].waits.remove(k);
            } else {
                p.tasks[t].waits[k].threshold = rng.int();
            }
        }
        5 if nt > 0 => {
            p.tasks.remove(t);
            renumber_tasks(p);
        }
        6 if nt > 0 => {
            let copy = p.tasks[t].clone();
            p.tasks.insert(rng.below(nt + 1), copy);
            renumber_tasks(p);
        }
        7 if nt > 0 => {
            let (key, _) = *rng.pick(PARAM_FIELDS);
            let key = if rng.chance(15) { "recipe" } else { key };
            let v = rng.value(0);
            p.tasks[t].params.insert(key, v);
        }
        8 if nt > 0 && !p.tasks[t].params.is_empty() => {
            let k = rng.below(p.tasks[t].params.len());
            if rng.chance(50) {
                p.tasks[t].params.0.remove(k);
            } else {
                p.tasks[t].params.0[k].1 = rng.value(0);
            }
        }
        9 if nt > 0 => {
            p.tasks[t].sm = match rng.below(6) {
                0 => None,
                1 => Some(-1),
                2 => Some(i32::MAX),
                3 => Some(i32::MIN),
                _ => Some(rng.below(200) as i32),
            }
        }
        10 if nt > 0 => p.tasks[t].op = *rng.pick(Opcode::ABI_OPS),
        11 if nb > 0 => {
            let b = rng.below(nb);
            let rank = rng.below(7);
            const DIMS: &[u64] = &[1, 2, 3, 4, 16, 32, 64, 1 << 31, 1 << 40, i64::MAX as u64];
            p.buffers[b].shape = (0..rank).map(|_| *rng.pick(DIMS)).collect();
        }
        12 if nb > 0 => {
            let b = rng.below(nb);
            p.buffers[b].kind = *rng.pick(BufferKind::ALL);
        }
        13 if nb > 0 => {
            let b = rng.below(nb);
            p.buffers[b].dtype = *rng.pick(DType::ALL);
            p.buffers[b].space = *rng.pick(MemSpace::ALL);
        }
        14 if nc > 0 => {
            let c = rng.below(nc);
            p.counters[c].init = rng.int();
        }
        15 => {
            let n_pages = rng.below(4);
            let pages = (0..n_pages)
                .map(|i| Page {
                    id: i as u32,
                    space: *rng.pick(MemSpace::ALL),
                    nbytes: match rng.below(4) {
                        0 => 0,
                        1 => i64::MAX as u64,
                        _ => rng.below(100_000) as u64,
                    },
                    live_start: rng.int(),
                    live_end: rng.int(),
                })
                .collect();
            let mut b2p: Vec<(u32, u32)> = Vec::new();
            for _ in 0..rng.below(6) {
                let b = some_id(rng, nb);
                // One binding per buffer (duplicates have their own test in json_format.rs).
                if !b2p.iter().any(|&(x, _)| x == b) {
                    b2p.push((b, some_id(rng, n_pages)));
                }
            }
            p.pages = Some(PageAllocation {
                buffer_to_page: b2p,
                pages,
            });
        }
        16 => {
            // Put two random buffers on one page.
            let a = some_id(rng, nb);
            let b = some_id(rng, nb);
            let b2p = if a == b {
                vec![(a, 0)]
            } else {
                vec![(a, 0), (b, 0)]
            };
            p.pages = Some(PageAllocation {
                buffer_to_page: b2p,
                pages: vec![Page {
                    id: 0,
                    space: MemSpace::GLOBAL_SCRATCH,
                    nbytes: 1 << 20,
                    live_start: -1,
                    live_end: -1,
                }],
            });
        }
        17 => {
            let mut tg = GpuTarget::by_name("t4").expect("t4");
            tg.num_sms = *rng.pick(&[0, -1, 1, 40, i64::MAX, i64::MIN]);
            p.target = if rng.chance(20) { None } else { Some(tg) };
        }
        18 => {
            if let Some(c) = p.config.as_mut() {
                let mut map: Vec<(u32, u32)> = Vec::new();
                for _ in 0..rng.below(5) {
                    let t = some_id(rng, nt);
                    if !map.iter().any(|&(x, _)| x == t) {
                        map.push((t, rng.next() as u32));
                    }
                }
                c.sm_assignment = SmAssignment::Explicit(map);
                c.pipelining_depth = rng.int();
            }
        }
        19 if nt > 1 => {
            // Make a task wait on a later task's counter (possibly a cycle).
            let u = rng.below(nt);
            let c = p.tasks[rng.below(nt)].out_counter;
            p.tasks[u].waits.push(Wait {
                counter: c,
                threshold: 1 + rng.below(3) as i64,
            });
        }
        20 if nc > 0 => {
            p.counters.remove(rng.below(nc));
            for (i, c) in p.counters.iter_mut().enumerate() {
                c.id = i as u32;
            }
        }
        21 if nb > 0 => {
            p.buffers.remove(rng.below(nb));
            for (i, b) in p.buffers.iter_mut().enumerate() {
                b.id = i as u32;
            }
        }
        _ => {
            if let Some(m) = p.meta.0.first_mut() {
                m.1 = rng.value(0);
            }
        }
    }
}

#[test]
fn typed_mutants_of_valid_programs_never_panic() {
    let reg = reg();
    let seeds = seeds(&reg);
    let mut fails = Failures::default();
    let mut rejected = 0usize;
    let cases = 2000;
    for seed in 0..cases {
        let mut rng = Rng::new(0x7E57_0000 + seed);
        let mut p = rng.pick(&seeds).clone();
        for _ in 0..1 + rng.below(5) {
            mutate_program(&mut p, &mut rng);
        }
        match exercise(&p, &reg) {
            Err((what, msg)) => fails.add(&what, &msg, &describe(&p, &reg)),
            Ok(()) => {
                if !validate(&p, &reg).ok() {
                    rejected += 1;
                }
            }
        }
        if fails.full() {
            break;
        }
    }
    fails.check(cases as usize);
    assert!(
        rejected > cases as usize / 3,
        "only {rejected} mutants rejected"
    );
}

#[test]
fn validate_is_total_on_in_memory_programs_the_loader_would_refuse() {
    // docs/ir.md, "Where we are stricter": total "on any input". A `Program` is plain data
    // with public fields, so a caller can build one with non-canonical ids or zero dims
    // without going through JSON.
    let reg = reg();
    let seeds = seeds(&reg);
    let mut fails = Failures::default();
    let cases = 1500;
    for seed in 0..cases {
        let mut rng = Rng::new(0x1DEA_0000 + seed);
        let mut p = rng.pick(&seeds).clone();
        for _ in 0..1 + rng.below(3) {
            match rng.below(5) {
                0 if !p.tasks.is_empty() => {
                    let t = rng.below(p.tasks.len());
                    p.tasks[t].id = some_id(&mut rng, p.tasks.len());
                }
                1 if !p.buffers.is_empty() => {
                    let b = rng.below(p.buffers.len());
                    p.buffers[b].id = some_id(&mut rng, p.buffers.len());
                }
                2 if !p.counters.is_empty() => {
                    let c = rng.below(p.counters.len());
                    p.counters[c].id = some_id(&mut rng, p.counters.len());
                }
                3 if !p.buffers.is_empty() => {
                    let b = rng.below(p.buffers.len());
                    let rank = p.buffers[b].shape.len();
                    if rank > 0 {
                        let d = rng.below(rank);
                        p.buffers[b].shape[d] = *rng.pick(&[0, u64::MAX, 1 << 63]);
                    }
                }
                _ => mutate_program(&mut p, &mut rng),
            }
        }
        if let Err(msg) = no_panic(|| validate(&p, &reg)) {
            fails.add("validate (in-memory program)", &msg, &format!("{p:#?}"));
        } else if let Err(msg) = no_panic(|| (p.simulate_counters(), p.simulate_adversarial(2))) {
            fails.add("simulate (in-memory program)", &msg, &format!("{p:#?}"));
        }
        if fails.full() {
            break;
        }
    }
    fails.check(cases as usize);
}

// ---------------------------------------------------------------------------------------------
// Deterministic reproducers of hostile inputs

fn params(kv: &[(&str, i64)]) -> Map {
    let mut out = Map::new();
    for (k, v) in kv {
        out.insert(*k, Value::Int(*v));
    }
    out
}

/// `KV_APPEND [new, cache] -> cache` at `pos`.
fn kv_append(new: &[u64], cache: &[u64], pos: i64) -> Program {
    let mut p = Program::new();
    let n = p.new_buffer("new", BufferKind::IO_INPUT, DType::F32, new);
    let c = p.new_buffer("cache", BufferKind::KV_CACHE, DType::F32, cache);
    let ctr = p.new_counter("appended");
    p.push_task(
        Opcode::KV_APPEND,
        &[n, c],
        &[c],
        ctr,
        &[],
        params(&[("pos", pos)]),
        "append",
    );
    p
}

/// `ATTENTION_TILE [q, k, v] -> out` over caches of the given shape.
fn attention_over(cache: &[u64], out: &[u64]) -> Program {
    let mut p = Program::new();
    let q = p.new_buffer("q", BufferKind::IO_INPUT, DType::F32, &[4, 16]);
    let k = p.new_buffer("k", BufferKind::KV_CACHE, DType::F32, cache);
    let v = p.new_buffer("v", BufferKind::KV_CACHE, DType::F32, cache);
    let o = p.new_buffer("o", BufferKind::IO_OUTPUT, DType::F32, out);
    let c = p.new_counter("attn");
    let mut pm = params(&[
        ("head_dim", 16),
        ("kv_start", 0),
        ("kv_len", 1),
        ("n_heads", 4),
        ("n_kv_heads", 2),
    ]);
    pm.insert("scale", Value::Float(0.25));
    p.push_task(Opcode::ATTENTION_TILE, &[q, k, v], &[o], c, &[], pm, "attn");
    p
}

/// `ATTENTION_COMBINE [a, b] -> out` with `head_dim`.
fn combine_into(out: &[u64], head_dim: i64) -> Program {
    let mut p = Program::new();
    let a = p.new_buffer("a", BufferKind::IO_INPUT, DType::F32, &[4, 18]);
    let b = p.new_buffer("b", BufferKind::IO_INPUT, DType::F32, &[4, 18]);
    let o = p.new_buffer("o", BufferKind::IO_OUTPUT, DType::F32, out);
    let c = p.new_counter("combined");
    p.push_task(
        Opcode::ATTENTION_COMBINE,
        &[a, b],
        &[o],
        c,
        &[],
        params(&[("head_dim", head_dim)]),
        "combine",
    );
    p
}

fn huge_weights(n: usize) -> Program {
    let mut p = Program::new();
    for i in 0..n {
        p.new_weight(format!("w{i}"), DType::F32, &[1 << 62, 4], format!("w{i}"));
    }
    p
}

fn init_at(init: i64) -> Program {
    let mut p = chain(3);
    p.counters[0].init = init;
    p
}

/// Loadable programs (every dim is a positive 64-bit JSON integer) with extreme shapes or
/// values: they must load, and `validate` and the simulations must return, not panic.
#[rstest]
#[case::kv_append_rank4_cache_with_huge_dims(kv_append(&[4], &[2, 2, 1 << 40, 1 << 40], 0))]
#[case::kv_append_huge_new_rows_at_pos_1(kv_append(&[1 << 32, 1 << 32], &[1, 1], 1))]
#[case::attention_rank4_cache_with_huge_batch(attention_over(&[1 << 62, 1, 2, 16], &[1, 64]))]
#[case::attention_huge_query_rows(attention_over(&[8, 2, 16], &[1 << 62, 64]))]
#[case::combine_with_huge_output(combine_into(&[1 << 40, 1 << 40], 1))]
#[case::nine_huge_weights(huge_weights(9))]
#[case::counter_init_at_i64_max(init_at(i64::MAX))]
#[case::counter_init_at_i64_min(init_at(i64::MIN))]
fn hostile_loadable_programs_do_not_panic(#[case] p: Program) {
    let reg = reg();
    let text = p.to_json(&reg).expect("serialise");
    let loaded = Program::from_json(&text, &reg).expect("the program is loadable");
    assert_eq!(loaded, p);
    if let Err((what, msg)) = exercise(&loaded, &reg) {
        panic!("{what} panicked: {msg}\n--- program ---\n{text}");
    }
}

/// Programs only constructible in memory (the loader refuses them: non-canonical ids, zero
/// dims). docs/ir.md ("Where we are stricter") still asks for a total validator "on any
/// input".
#[rstest]
#[case::task_id_beyond_the_list({ let mut p = chain(2); p.tasks[1].id = 5; p })]
#[case::task_ids_swapped({ let mut p = chain(2); p.tasks.swap(0, 1); p })]
#[case::buffer_id_beyond_the_list({ let mut p = chain(2); p.buffers[2].id = 9; p })]
#[case::counter_id_beyond_the_list({ let mut p = chain(2); p.counters[1].id = 9; p })]
#[case::kv_cache_with_zero_rows(kv_append(&[1, 32], &[0, 2, 16], 0))]
#[case::kv_cache_with_zero_row_width(kv_append(&[1, 32], &[4, 0, 16], 0))]
#[case::zero_dim_activation({ let mut p = chain(2); p.buffers[1].shape = vec![1, 0]; p })]
fn in_memory_programs_the_loader_refuses_do_not_panic_validate(#[case] p: Program) {
    let reg = reg();
    if let Err(msg) = no_panic(|| validate(&p, &reg)) {
        panic!("validate panicked: {msg}\n--- program ---\n{p:#?}");
    }
    if let Err(msg) = no_panic(|| (p.simulate_counters(), p.simulate_adversarial(2))) {
        panic!("simulation panicked: {msg}\n--- program ---\n{p:#?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Scale

/// `n` COPY tasks `a_i -> a_{i+1}`, each waiting on the previous one; `a_n` is the output.
fn chain(n: usize) -> Program {
    let mut p = Program::new();
    let mut prev = p.new_buffer("a0", BufferKind::IO_INPUT, DType::F32, &[1, 8]);
    let mut prev_c = None;
    for i in 0..n {
        let kind = if i + 1 == n {
            BufferKind::IO_OUTPUT
        } else {
            BufferKind::ACTIVATION
        };
        let b = p.new_buffer(format!("a{}", i + 1), kind, DType::F32, &[1, 8]);
        let c = p.new_counter(format!("c{i}"));
        let waits: Vec<(u32, i64)> = prev_c.map(|c| (c, 1)).into_iter().collect();
        p.push_task(Opcode::COPY, &[prev], &[b], c, &waits, Map::new(), "");
        prev = b;
        prev_c = Some(c);
    }
    p
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> (T, Duration) {
    let t0 = Instant::now();
    let out = f();
    let dt = t0.elapsed();
    eprintln!("{what}: {dt:?}");
    (out, dt)
}

#[test]
fn cycle_of_5001_tasks_has_a_witness_and_no_stack_overflow() {
    let n = 5001;
    let mut p = chain(n);
    // Close the loop: task 0 waits on the last task.
    p.tasks[0].waits.push(Wait {
        counter: (n - 1) as u32,
        threshold: 1,
    });
    let reg = reg();
    let (r, _) = timed("validate 5001-task cycle", || validate(&p, &reg));
    assert!(!r.stats.acyclic);
    let cycles: Vec<_> = r
        .errors
        .iter()
        .filter(|e| e.kind == ErrorKind::Cycle)
        .collect();
    assert_eq!(
        cycles.len(),
        1,
        "{}",
        r.report().lines().take(5).collect::<Vec<_>>().join("\n")
    );
    let path = &cycles[0].path;
    assert_eq!(path.len(), n + 1, "the witness is the whole ring");
    assert_eq!(path.first(), path.last());
    let edges: std::collections::HashSet<(TaskId, TaskId)> =
        p.dependency_edges().into_iter().collect();
    for w in path.windows(2) {
        assert!(
            edges.contains(&(w[0], w[1])),
            "{} -> {} is no edge",
            w[0],
            w[1]
        );
    }
    let sim = p.simulate_counters();
    assert!(sim.order.is_empty());
    assert_eq!(sim.stuck.len(), n);
    assert_eq!(p.simulate_adversarial(2), vec![]);
}

#[test]
fn cycle_of_20000_tasks_on_a_small_stack() {
    // The cycle search is iterative: it fits a 1 MiB stack however long the ring is.
    let mut p = chain(20_000);
    p.tasks[0].waits.push(Wait {
        counter: 19_999,
        threshold: 1,
    });
    let handle = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || {
            let r = validate(&p, &reg());
            r.errors
                .iter()
                .find(|e| e.kind == ErrorKind::Cycle)
                .map(|e| e.path.len())
        })
        .expect("spawn");
    assert_eq!(handle.join().ok().flatten(), Some(20_001));
}

#[test]
fn chain_of_50000_tasks_validates_ok_in_reasonable_time() {
    let p = chain(50_000);
    let reg = reg();
    let (r, dt) = timed("validate 50,000-task chain", || validate(&p, &reg));
    assert!(r.ok(), "{}", r.report());
    assert_eq!(r.stats.tasks, 50_000);
    assert_eq!(r.stats.edges, 49_999);
    assert!(r.stats.acyclic);
    assert!(dt < Duration::from_secs(30), "validate took {dt:?}");
    let (sim, dt) = timed("simulate_counters 50,000", || p.simulate_counters());
    assert!(sim.stuck.is_empty());
    assert_eq!(sim.order.len(), 50_000);
    assert!(dt < Duration::from_secs(30));
    let (v, dt) = timed("simulate_adversarial(2) 50,000", || {
        p.simulate_adversarial(2)
    });
    assert_eq!(v, vec![]);
    assert!(dt < Duration::from_secs(30));
}

#[test]
fn chain_of_50000_tasks_with_one_dropped_wait_is_a_race() {
    let mut p = chain(50_000);
    p.tasks[37_123].waits.clear();
    let reg = reg();
    let (r, dt) = timed("validate 50,000-task chain, dropped wait", || {
        validate(&p, &reg)
    });
    assert_eq!(r.error_kinds(), vec![ErrorKind::RawRace], "{}", r.report());
    let e = &r.errors[0];
    assert_eq!((e.task, e.others.clone()), (Some(37_123), vec![37_122]));
    assert!(dt < Duration::from_secs(30), "validate took {dt:?}");
}

/// 50,000 tasks in a chain where task `i` also reads the output of a task far back
/// (`i - 1 - back(i)`), so every read is proven through transitive ancestry, not a direct
/// edge; queries spread over every 64-task block.
fn chain_with_long_reads(n: usize, seed: u64) -> Program {
    let mut p = chain(n);
    let mut rng = Rng::new(seed);
    for i in 2..n {
        let back = 1 + rng.below(i - 1); // 1..=i-1
        let src = (i - back) as u32; // buffer a_{i-back}, written by task i-back-1
        p.tasks[i].op = Opcode::ADD;
        p.tasks[i].inputs.push(src);
    }
    p
}

#[test]
fn chain_of_50000_tasks_with_long_range_reads_validates_in_reasonable_time() {
    let p = chain_with_long_reads(50_000, 42);
    let reg = reg();
    let (r, dt) = timed("validate 50,000-task chain with long-range reads", || {
        validate(&p, &reg)
    });
    assert!(r.ok(), "{}", r.report());
    assert!(dt < Duration::from_secs(30), "validate took {dt:?}");
    // Break one far-back provenance: task 30,000 no longer waits, so its long read and its
    // direct read are both unordered.
    let mut bad = p;
    bad.tasks[30_000].waits.clear();
    let (r, dt) = timed("… with a dropped wait", || validate(&bad, &reg));
    assert_eq!(r.error_kinds(), vec![ErrorKind::RawRace]);
    // Task 30,000's own reads race; so do later long reads reaching back across the break.
    let race = r
        .errors
        .iter()
        .find(|e| e.task == Some(30_000))
        .expect("task 30,000 races");
    assert!(race.others.contains(&29_999), "{race:?}");
    assert!(
        r.errors.iter().filter_map(|e| e.task).all(|t| t >= 30_000),
        "no race before the break"
    );
    assert!(dt < Duration::from_secs(30), "validate took {dt:?}");
}

#[test]
fn wide_program_of_50000_tiles_validates() {
    // 50,000 disjoint single-column tiles sharing one counter, joined by one reader.
    let n = 50_000u64;
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 8]);
    let w = p.new_weight("w", DType::F32, &[n, 8], "w");
    let y = p.new_buffer("y", BufferKind::ACTIVATION, DType::F32, &[1, n]);
    let z = p.new_buffer("z", BufferKind::IO_OUTPUT, DType::F32, &[1, n]);
    let c = p.new_counter("y");
    let cz = p.new_counter("z");
    for i in 0..n as i64 {
        p.push_task(
            Opcode::GEMV_TILE,
            &[x, w],
            &[y],
            c,
            &[],
            m(&[("K", 8.into()), ("N_tile", 1.into()), ("n_off", i.into())]),
            "",
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
    let reg = reg();
    let (r, dt) = timed("validate 50,000 tiles", || validate(&p, &reg));
    assert!(r.ok(), "{}", r.report());
    assert_eq!(r.stats.edges, n);
    assert!(dt < Duration::from_secs(30), "validate took {dt:?}");
    // One overlapping tile among them.
    let mut bad = p;
    bad.tasks[49_000].params.insert("n_off", 123.into());
    let (r, _) = timed("… with one overlap", || validate(&bad, &reg));
    assert_eq!(r.error_kinds(), vec![ErrorKind::WawRace]);
    // The error names the overlapping pair (tasks 123 and 49,000), not some other writers.
    let e = &r.errors[0];
    let mut pair: Vec<TaskId> = e.task.into_iter().chain(e.others.iter().copied()).collect();
    pair.sort_unstable();
    assert_eq!(pair, vec![123, 49_000], "{}", e.message);
    assert!(
        e.message.contains("49000") && e.message.contains("123"),
        "{}",
        e.message
    );
}
