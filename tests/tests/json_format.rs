//! On-disk JSON format conformance (docs/ir.md, "On-disk JSON").
//!
//! Round trips (our output re-reads and re-writes byte-identically), a fixture in the exact
//! layout Python's `json.dumps(indent=2)` writes (`tests/fixtures/reference_layout.json`,
//! generated with that call), forward compatibility, version gating, enum names, the strict
//! rejections (each naming the JSON path of the problem), hostile inputs (deep nesting, BOM,
//! trailing garbage) and transparent `.json.gz`.

// Helpers outside `#[test]` functions (which clippy.toml already exempts) fail loudly on
// broken test setup by design.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use amk_core::json::{self, Map, Value};
use amk_core::{
    BufferKind, DType, GpuTarget, IrError, MemSpace, Opcode, Page, PageAllocation, PageStrategy,
    Program, Registry, ScheduleConfig, SmAssignment, validate,
};
use rstest::rstest;
use std::path::{Path, PathBuf};

fn reg() -> Registry {
    amk_ops::registry().expect("built-in registry")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn read_fixture(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).expect("fixture")
}

/// A fresh scratch path for this test binary.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("json_format");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(format!("{}-{name}", std::process::id()))
}

fn m(kv: &[(&str, Value)]) -> Map {
    let mut out = Map::new();
    for (k, v) in kv {
        out.insert(*k, v.clone());
    }
    out
}

fn load_str(text: &str) -> Result<Program, IrError> {
    Program::from_json(text, &reg())
}

/// Loads `text`, expecting a load error whose message names `path`.
fn assert_rejected_at(text: &str, path: &str) -> String {
    match load_str(text) {
        Ok(_) => panic!("accepted, expected an error at {path}:\n{text}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(path),
                "error {msg:?} does not name the JSON path {path:?}"
            );
            msg
        }
    }
}

/// A program exercising every part of the format: pages, an explicit SM map, a target, nested
/// meta, float params and non-ASCII labels.
fn full_program() -> Program {
    let mut p = Program::new();
    p.meta = m(&[
        ("model", "toy".into()),
        ("gpu", "h100".into()),
        (
            "quant",
            json::parse(
                r#"{"group": 128, "symmetric": true, "keys": [1, 2.5, null, "a", []], "e": {}}"#,
            )
            .expect("literal"),
        ),
        ("ratio", 0.1.into()),
        ("tiny", 1.5e-7.into()),
        ("big", 1e16.into()),
        ("author", "Zoë — 中文 😀".into()),
    ]);
    p.target = GpuTarget::by_name("h100");
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 64]);
    let w = p.new_weight("norm.w", DType::F32, &[64], "model.norm.weight");
    let xn = p.new_buffer("xn", BufferKind::ACTIVATION, DType::F32, &[1, 64]);
    p.buffers[xn as usize].space = MemSpace::GLOBAL_SCRATCH;
    let wq = p.new_weight("q_proj", DType::BF16, &[64, 64], "q_proj.weight");
    let q = p.new_buffer("q", BufferKind::ACTIVATION, DType::F32, &[1, 64]);
    let pos = p.new_buffer("pos", BufferKind::IO_INPUT, DType::I32, &[1]);
    let qr = p.new_buffer("qr", BufferKind::IO_OUTPUT, DType::F32, &[4, 16]);
    let c0 = p.new_counter("xn ready");
    let c1 = p.new_counter("q ready");
    let c2 = p.new_counter("qr ready");
    let t0 = p.push_task(
        Opcode::RMSNORM,
        &[x, w],
        &[xn],
        c0,
        &[],
        m(&[("eps", 1e-6.into()), ("hidden", 64.into())]),
        "norm é",
    );
    for i in 0..2i64 {
        p.push_task(
            Opcode::GEMV_TILE,
            &[xn, wq],
            &[q],
            c1,
            &[(c0, 1)],
            m(&[
                ("K", 64.into()),
                ("N_tile", 32.into()),
                ("n_off", (32 * i).into()),
            ]),
            format!("q[{i}]"),
        );
    }
    let t3 = p.push_task(
        Opcode::ROPE,
        &[q, pos],
        &[qr],
        c2,
        &[(c1, 2)],
        m(&[("head_dim", 16.into()), ("theta", 10000.0.into())]),
        "rope 😀 → \"q\"\\n\t",
    );
    p.tasks[t0 as usize].est_bytes = 512;
    p.tasks[t0 as usize].est_flops = 256;
    p.tasks[t3 as usize].sm = Some(0);
    p.tasks[1].sm = Some(1);
    p.tasks[2].sm = Some(2);
    p.tasks[t0 as usize].sm = Some(0);
    p.pages = Some(PageAllocation {
        buffer_to_page: vec![(xn, 0), (q, 1)],
        pages: vec![
            Page {
                id: 0,
                space: MemSpace::GLOBAL_SCRATCH,
                nbytes: 256,
                live_start: 0,
                live_end: 2,
            },
            Page {
                id: 1,
                space: MemSpace::GLOBAL_SCRATCH,
                nbytes: 512,
                live_start: 1,
                live_end: 3,
            },
        ],
    });
    p.config = Some(ScheduleConfig {
        tiling: vec![("gemv".into(), vec![("N_tile".into(), 32)])],
        fusion_grouping: vec![vec!["rmsnorm".into(), "gemv_tile".into()]],
        sm_assignment: SmAssignment::Explicit(vec![(0, 0), (1, 1), (2, 2), (3, 0)]),
        pipelining_depth: 3,
        page_allocation: PageStrategy::Linear,
        threads_per_block: 128,
        smem_bytes_per_block: 4096,
    });
    p
}

// ---------------------------------------------------------------------------------------------
// Round trips and layout

#[test]
fn our_output_round_trips_byte_identically() {
    let reg = reg();
    let p = full_program();
    assert!(validate(&p, &reg).ok(), "{}", validate(&p, &reg).report());
    let text = p.to_json(&reg).expect("serialise");
    let back = Program::from_json(&text, &reg).expect("re-read");
    assert_eq!(back, p);
    assert_eq!(back.to_json(&reg).expect("re-serialise"), text);
}

#[test]
fn output_layout_is_python_json_dumps_indent_2() {
    let text = full_program().to_json(&reg()).expect("serialise");
    assert!(text.starts_with("{\n  \"ir_version\": \"0.2.0\",\n  \"abi_version\": \"0.2\",\n"));
    assert!(!text.ends_with('\n'), "no trailing newline");
    assert!(text.ends_with("\n  }\n}"));
    assert!(text.is_ascii(), "output must be ASCII (\\uXXXX escapes)");
    // Floats as Python's repr writes them.
    for needle in [
        "\"eps\": 1e-06",
        "\"theta\": 10000.0",
        "\"ratio\": 0.1",
        "\"tiny\": 1.5e-07",
        "\"big\": 1e+16",
        "\"hbm_bandwidth_gbs\": 3350.0",
        "\"clock_ghz\": 1.98",
    ] {
        assert!(text.contains(needle), "missing {needle:?}");
    }
    // Non-ASCII as \uXXXX (lower-case hex, surrogate pairs), like ensure_ascii.
    assert!(text.contains(r#""label": "norm \u00e9""#));
    assert!(text.contains(r#""label": "rope \ud83d\ude00 \u2192 \"q\"\\n\t""#));
    assert!(text.contains(r#""author": "Zo\u00eb \u2014 \u4e2d\u6587 \ud83d\ude00""#));
    // Empty containers inline; string keys for the page table and the SM map.
    assert!(text.contains("\"waits\": [],"));
    assert!(text.contains("\"e\": {}"));
    assert!(text.contains("\"buffer_to_page\": {\n      \"2\": 0,\n      \"4\": 1\n    },"));
    assert!(text.contains(
        "\"sm_assignment\": {\n      \"0\": 0,\n      \"1\": 1,\n      \"2\": 2,\n      \"3\": 0\n    },"
    ));
    // Shapes one element per line, like json.dumps with indent.
    assert!(text.contains("\"shape\": [\n        1,\n        64\n      ],"));
    // Top-level keys, in the order of docs/ir.md, "On-disk JSON".
    let top: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  \"") && !l.starts_with("   "))
        .map(|l| l.trim_start().split('"').nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        top,
        [
            "ir_version",
            "abi_version",
            "meta",
            "target",
            "buffers",
            "counters",
            "tasks",
            "pages",
            "config"
        ]
    );
}

/// The keys of every object under `v`'s array `key`, in order.
fn record_keys(v: &Value, key: &str) -> Vec<Vec<String>> {
    v.as_object()
        .and_then(|o| o.get(key))
        .and_then(Value::as_array)
        .unwrap_or(&[])
        .iter()
        .map(|r| {
            r.as_object()
                .map(|o| o.iter().map(|(k, _)| k.to_string()).collect())
                .unwrap_or_default()
        })
        .collect()
}

#[test]
fn record_keys_are_in_the_reference_order() {
    let text = full_program().to_json(&reg()).expect("serialise");
    let v = json::parse(&text).expect("our output parses");
    let words = |s: &str| -> Vec<String> { s.split(' ').map(str::to_string).collect() };
    for keys in record_keys(&v, "buffers") {
        assert_eq!(keys, words("id name kind dtype shape space source"));
    }
    for keys in record_keys(&v, "counters") {
        assert_eq!(keys, words("id init note"));
    }
    for keys in record_keys(&v, "tasks") {
        assert_eq!(
            keys,
            words("id op inputs outputs out_counter waits params sm est_bytes est_flops label")
        );
    }
    let obj = |path: &[&str]| -> Vec<String> {
        let mut cur = &v;
        for k in path {
            cur = cur.as_object().and_then(|o| o.get(k)).expect("path");
        }
        cur.as_object()
            .map(|o| o.iter().map(|(k, _)| k.to_string()).collect())
            .unwrap_or_default()
    };
    assert_eq!(obj(&["pages"]), words("buffer_to_page pages"));
    assert_eq!(
        record_keys(
            v.as_object().and_then(|o| o.get("pages")).expect("pages"),
            "pages"
        )[0],
        words("id space nbytes live_start live_end")
    );
    assert_eq!(
        obj(&["config"]),
        words(
            "tiling fusion_grouping sm_assignment pipelining_depth page_allocation \
             threads_per_block smem_bytes_per_block"
        )
    );
    assert_eq!(
        obj(&["target"]),
        words(
            "name sm_arch num_sms smem_bytes_per_sm smem_bytes_per_block_optin regs_per_sm \
             max_threads_per_sm max_regs_per_thread l2_bytes hbm_bytes hbm_bandwidth_gbs \
             fp16_tflops clock_ghz supports_cooperative wddm_tdr measured_bw_gbs note"
        )
    );
    let wait = json::parse(&text).expect("parse");
    let t1 = &record_keys(&wait, "tasks")[1];
    assert!(t1.contains(&"waits".to_string()));
}

/// A floating task (ours) writes `sm` -1 and `"floating": true` after it; the others keep the
/// reference's keys. It reads back equal and re-writes byte-identically; a floating task
/// with an SM of its own, or a non-boolean flag, is refused at load.
#[test]
fn floating_task_round_trips() {
    let reg = reg();
    let mut p = full_program();
    p.tasks[3].floating = true;
    p.tasks[3].sm = None;
    let text = p.to_json(&reg).expect("serialise");
    let v = json::parse(&text).expect("parse");
    let words = |s: &str| -> Vec<String> { s.split(' ').map(str::to_string).collect() };
    let keys = record_keys(&v, "tasks");
    assert_eq!(
        keys[3],
        words(
            "id op inputs outputs out_counter waits params sm floating est_bytes est_flops label"
        )
    );
    assert!(
        keys[..3]
            .iter()
            .all(|k| !k.contains(&"floating".to_string()))
    );
    let back = Program::from_json(&text, &reg).expect("load");
    assert_eq!(back, p);
    assert_eq!(back.to_json(&reg).expect("again"), text);
    let needle = "\"sm\": -1,\n      \"floating\": true";
    assert!(text.contains(needle), "{text}");
    let bad = text.replacen(needle, "\"sm\": 3,\n      \"floating\": true", 1);
    let e = Program::from_json(&bad, &reg)
        .expect_err("floating with an SM")
        .to_string();
    assert!(e.contains("no SM of its own"), "{e}");
    let bad = text.replacen("\"floating\": true", "\"floating\": 1", 1);
    assert!(Program::from_json(&bad, &reg).is_err());
}

#[test]
fn absent_pages_config_and_target_are_null() {
    let mut p = full_program();
    p.pages = None;
    p.config = None;
    p.target = None;
    let reg = reg();
    let text = p.to_json(&reg).expect("serialise");
    assert!(text.contains("\"target\": null,"));
    assert!(text.contains("\"pages\": null,"));
    assert!(text.ends_with("\"config\": null\n}"));
    let back = Program::from_json(&text, &reg).expect("re-read");
    assert_eq!(back, p);
    assert_eq!(back.to_json(&reg).expect("re-serialise"), text);
}

#[rstest]
#[case::round_robin(SmAssignment::RoundRobin, "\"round_robin\"")]
#[case::load_balance(SmAssignment::LoadBalance, "\"load_balance\"")]
#[case::explicit(SmAssignment::Explicit(vec![(3, 7), (0, 1)]), "{\n      \"3\": 7,\n      \"0\": 1\n    }")]
fn sm_assignment_forms_round_trip(#[case] sm: SmAssignment, #[case] written: &str) {
    let mut p = full_program();
    if let Some(c) = p.config.as_mut() {
        c.sm_assignment = sm.clone();
    }
    let reg = reg();
    let text = p.to_json(&reg).expect("serialise");
    assert!(
        text.contains(&format!("\"sm_assignment\": {written},")),
        "{text}"
    );
    let back = Program::from_json(&text, &reg).expect("re-read");
    assert_eq!(back.config.map(|c| c.sm_assignment), Some(sm));
    assert_eq!(back_text(&text), text);
}

fn back_text(text: &str) -> String {
    let reg = reg();
    Program::from_json(text, &reg)
        .and_then(|p| p.to_json(&reg))
        .expect("round trip")
}

#[rstest]
#[case::none(PageStrategy::None, "none")]
#[case::linear(PageStrategy::Linear, "linear")]
#[case::graph_color(PageStrategy::GraphColor, "graph_color")]
fn page_strategies_round_trip(#[case] s: PageStrategy, #[case] name: &str) {
    let mut p = full_program();
    if let Some(c) = p.config.as_mut() {
        c.page_allocation = s;
    }
    let text = p.to_json(&reg()).expect("serialise");
    assert!(text.contains(&format!("\"page_allocation\": \"{name}\"")));
    assert_eq!(back_text(&text), text);
}

#[test]
fn every_builtin_target_round_trips() {
    let reg = reg();
    for t in GpuTarget::builtin() {
        let mut p = full_program();
        p.meta.insert("gpu", t.name.clone().into());
        p.target = Some(t);
        let text = p.to_json(&reg).expect("serialise");
        let back = Program::from_json(&text, &reg).expect("re-read");
        assert_eq!(back, p);
        assert_eq!(back.to_json(&reg).expect("re-serialise"), text);
    }
}

#[rstest]
#[case(1e-6)]
#[case(1e-5)]
#[case(10000.0)]
#[case(500000.0)]
#[case(0.1)]
#[case(1.0 / 3.0)]
#[case(-2.5)]
#[case(1e16)]
#[case(1.5e-7)]
#[case(123456789.125)]
#[case(5e-324)]
#[case(f64::MAX)]
#[case(-0.0)]
fn float_params_survive_the_round_trip_exactly(#[case] f: f64) {
    let mut p = full_program();
    p.tasks[0].params.insert("eps", f.into());
    let reg = reg();
    let text = p.to_json(&reg).expect("serialise");
    let back = Program::from_json(&text, &reg).expect("re-read");
    let got = back.tasks[0].params.get("eps").and_then(Value::as_f64);
    assert_eq!(got.map(f64::to_bits), Some(f.to_bits()), "{f:e}");
    assert_eq!(back.to_json(&reg).expect("re-serialise"), text);
}

#[rstest]
#[case::plain("plain label")]
#[case::latin1("naïve café")]
#[case::cjk("中文标签")]
#[case::emoji("🚀🦀")]
#[case::escapes("quote \" backslash \\ newline \n tab \t cr \r")]
#[case::controls("\u{0}\u{1}\u{1f}\u{7f}")]
#[case::bmp_edge("\u{ffff}\u{e000}\u{fffd}")]
fn labels_of_any_text_round_trip(#[case] label: &str) {
    let mut p = full_program();
    p.tasks[1].label = label.to_string();
    p.buffers[2].name = label.to_string();
    p.counters[0].note = label.to_string();
    let reg = reg();
    let text = p.to_json(&reg).expect("serialise");
    assert!(text.is_ascii());
    let back = Program::from_json(&text, &reg).expect("re-read");
    assert_eq!(back.tasks[1].label, label);
    assert_eq!(back.buffers[2].name, label);
    assert_eq!(back, p);
    assert_eq!(back.to_json(&reg).expect("re-serialise"), text);
}

#[rstest]
#[case::page_bound_twice(true)]
#[case::sm_map_entry_twice(false)]
fn programs_with_repeated_map_keys_never_write_unreadable_files(#[case] pages: bool) {
    // `buffer_to_page` and an explicit `sm_assignment` are JSON objects keyed by id, but held
    // in memory as lists of pairs, so a key can repeat. Writing the repeat yields a document
    // with a duplicate key, which our own reader refuses. docs/ir.md, "On-disk JSON": our own
    // output re-reads.
    // Acceptable outcomes: `to_json` refuses (IrError::Serialize), or what it writes loads.
    let mut p = full_program();
    if pages {
        if let Some(pa) = p.pages.as_mut() {
            pa.buffer_to_page.push((2, 1));
        }
    } else if let Some(c) = p.config.as_mut() {
        c.sm_assignment = SmAssignment::Explicit(vec![(0, 0), (1, 1), (0, 2)]);
    }
    let reg = reg();
    match p.to_json(&reg) {
        Err(IrError::Serialize(_)) => {}
        Err(e) => panic!("unexpected error kind: {e:?}"),
        Ok(text) => {
            if let Err(e) = Program::from_json(&text, &reg) {
                panic!("our own output does not re-read: {e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A file in the reference's exact layout

#[test]
fn reference_layout_fixture_reserialises_byte_identically() {
    let reg = reg();
    let text = read_fixture("reference_layout.json");
    let p = Program::from_json(&text, &reg).expect("fixture loads");
    assert_eq!(p.to_json(&reg).expect("serialise"), text);
    let r = validate(&p, &reg);
    assert!(r.ok(), "{}", r.report());
    assert!(r.warnings.is_empty(), "{}", r.report());
}

#[test]
fn reference_layout_fixture_reads_back_the_same_values() {
    let p = Program::from_json(&read_fixture("reference_layout.json"), &reg()).expect("loads");
    assert_eq!(p.ir_version, "0.2.0");
    assert_eq!(p.abi_version, "0.2");
    assert_eq!(p.target, GpuTarget::by_name("h100"));
    assert_eq!(p.buffers.len(), 7);
    assert_eq!(p.buffers[1].kind, BufferKind::WEIGHT);
    assert_eq!(p.buffers[1].source.as_deref(), Some("model.norm.weight"));
    assert_eq!(p.buffers[2].space, MemSpace::GLOBAL_SCRATCH);
    assert_eq!(p.buffers[5].dtype, DType::I32);
    assert_eq!(p.buffers[6].shape, vec![4, 16]);
    assert_eq!(p.buffers[0].source, None);
    assert_eq!(p.counters[2].note, "qr ready");
    let t0 = &p.tasks[0];
    assert_eq!(t0.op, Opcode::RMSNORM);
    assert_eq!(t0.param_f64("eps"), Some(1e-6));
    assert_eq!(t0.param_i64("hidden"), Some(64));
    assert_eq!((t0.sm, t0.est_bytes, t0.est_flops), (Some(0), 512, 256));
    assert_eq!(t0.label, "norm é");
    assert_eq!(p.tasks[3].label, "rope 😀 → \"q\"\\n");
    assert_eq!(p.tasks[3].param_f64("theta"), Some(10000.0));
    assert_eq!(p.tasks[3].waits[0].counter, 1);
    assert_eq!(p.tasks[3].waits[0].threshold, 2);
    let pages = p.pages.as_ref().expect("pages");
    assert_eq!(pages.buffer_to_page, vec![(2, 0), (4, 1)]);
    assert_eq!(pages.pages[1].nbytes, 512);
    assert_eq!((pages.pages[1].live_start, pages.pages[1].live_end), (1, 3));
    let c = p.config.as_ref().expect("config");
    assert_eq!(
        c.sm_assignment,
        SmAssignment::Explicit(vec![(0, 0), (1, 1), (2, 2), (3, 0)])
    );
    assert_eq!(c.tile("gemv", "N_tile"), Some(32));
    assert_eq!(c.tile("attention", "n_partitions"), Some(1));
    assert_eq!(c.page_allocation, PageStrategy::GraphColor);
    assert_eq!(c.fusion_grouping, vec![vec!["rmsnorm", "gemv_tile"]]);
    let quant = p
        .meta
        .get("quant")
        .and_then(Value::as_object)
        .expect("meta.quant");
    assert_eq!(quant.get("symmetric"), Some(&Value::Bool(true)));
    assert_eq!(
        p.meta.get("author").and_then(Value::as_str),
        Some("José 中")
    );
    assert_eq!(p.meta.get("big").and_then(Value::as_f64), Some(1e16));
}

#[test]
fn integral_floats_written_as_integers_read_back_as_the_same_values() {
    // Python writes a float-typed field holding an int (`3350`) without a fraction.
    let text = read_fixture("reference_layout.json")
        .replace(
            "\"hbm_bandwidth_gbs\": 3350.0",
            "\"hbm_bandwidth_gbs\": 3350",
        )
        .replace("\"clock_ghz\": 1.98", "\"clock_ghz\": 2");
    let p = load_str(&text).expect("loads");
    let t = p.target.expect("target");
    assert_eq!(t.hbm_bandwidth_gbs, 3350.0);
    assert_eq!(t.clock_ghz, 2.0);
}

#[test]
fn optional_fields_may_be_absent() {
    // Only the required keys (docs/ir.md, "What the loader refuses"); everything else takes
    // its default.
    let text = r#"{
      "buffers": [
        {"id": 0, "name": "x", "kind": "IO_INPUT", "dtype": "F32", "shape": [1, 64], "space": "HBM"},
        {"id": 1, "name": "z", "kind": "IO_OUTPUT", "dtype": "F32", "shape": [1, 64], "space": "HBM"}
      ],
      "counters": [{"id": 0}],
      "tasks": [{"id": 0, "op": "COPY", "inputs": [0], "outputs": [1], "out_counter": 0}]
    }"#;
    let p = load_str(text).expect("minimal program loads");
    assert_eq!(p.ir_version, "0.2.0");
    assert_eq!(p.abi_version, "0.2");
    assert!(p.meta.is_empty() && p.target.is_none() && p.pages.is_none() && p.config.is_none());
    let t = &p.tasks[0];
    assert!(t.waits.is_empty() && t.params.is_empty());
    assert_eq!(
        (t.sm, t.est_bytes, t.est_flops, t.label.as_str()),
        (None, 0, 0, "")
    );
    assert_eq!((p.counters[0].init, p.counters[0].note.as_str()), (0, ""));
    assert!(validate(&p, &reg()).ok());
    // An empty object is an empty program.
    let p = load_str("{}").expect("empty program");
    assert!(p.tasks.is_empty() && p.buffers.is_empty() && p.counters.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Forward compatibility and versions

/// Applies `f` to the parsed fixture and renders it back.
fn edited(f: impl FnOnce(&mut Map)) -> String {
    let mut v = json::parse(&read_fixture("reference_layout.json")).expect("fixture parses");
    if let Value::Object(root) = &mut v {
        f(root);
    }
    json::to_pretty(&v)
}

fn obj_at<'a>(root: &'a mut Map, path: &[&str], index: Option<usize>) -> &'a mut Map {
    let mut cur: &mut Map = root;
    for k in path {
        let slot = cur
            .0
            .iter_mut()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v)
            .expect("key");
        cur = match slot {
            Value::Object(o) => o,
            Value::Array(a) => match &mut a[index.unwrap_or(0)] {
                Value::Object(o) => o,
                _ => panic!("not an object"),
            },
            _ => panic!("not a container"),
        };
    }
    cur
}

#[rstest]
#[case::top_level(&[])]
#[case::target(&["target"])]
#[case::config(&["config"])]
#[case::buffers(&["buffers"])]
#[case::tasks(&["tasks"])]
#[case::counters(&["counters"])]
#[case::pages(&["pages"])]
fn unknown_fields_are_ignored(#[case] path: &[&str]) {
    let text = edited(|root| {
        let o = obj_at(root, path, Some(1));
        o.insert(
            "future_field",
            json::parse(r#"{"x": [1, 2, {"y": null}]}"#).expect("lit"),
        );
        o.insert("another_one", Value::Float(1.5));
    });
    let p = load_str(&text).expect("unknown fields must be ignored");
    let base = Program::from_json(&read_fixture("reference_layout.json"), &reg()).expect("base");
    assert_eq!(p, base);
}

#[test]
fn unknown_fields_in_waits_are_ignored() {
    let text = edited(|root| {
        let t = obj_at(root, &["tasks"], Some(3));
        if let Some(Value::Array(ws)) = t.0.iter_mut().find(|(k, _)| k == "waits").map(|(_, v)| v)
            && let Value::Object(w) = &mut ws[0]
        {
            w.insert("kind", "acquire".into());
        }
    });
    load_str(&text).expect("unknown wait field ignored");
}

#[rstest]
#[case::ir_minor("ir_version", "0.3.0", true)]
#[case::ir_patch("ir_version", "0.2.7", true)]
#[case::ir_major("ir_version", "1.0.0", false)]
#[case::ir_major_2("ir_version", "2.2.0", false)]
#[case::abi_minor("abi_version", "0.3", true)]
#[case::abi_major("abi_version", "1.0", false)]
#[case::abi_major_9("abi_version", "9.2", false)]
fn versions_gate_on_the_major_only(#[case] key: &str, #[case] version: &str, #[case] ok: bool) {
    let text = edited(|root| root.insert(key, version.into()));
    match load_str(&text) {
        Ok(p) => {
            assert!(ok, "{key} {version} should be rejected");
            let got = if key == "ir_version" {
                &p.ir_version
            } else {
                &p.abi_version
            };
            assert_eq!(got, version);
        }
        Err(e) => {
            assert!(!ok, "{key} {version} should load: {e}");
            assert!(
                matches!(e, IrError::Version { .. }),
                "expected a version error, got {e:?}"
            );
            let msg = e.to_string();
            assert!(msg.contains(&format!("$.{key}")), "{msg}");
            assert!(msg.contains(version), "{msg}");
        }
    }
}

#[test]
fn a_minor_bump_round_trips_its_version_string() {
    let text = edited(|root| {
        root.insert("ir_version", "0.3.0".into());
        root.insert("abi_version", "0.3".into());
    });
    let reg = reg();
    let p = Program::from_json(&text, &reg).expect("minor bump");
    assert_eq!(p.to_json(&reg).expect("serialise"), text);
}

#[test]
fn a_null_version_is_rejected_and_a_missing_one_is_current() {
    let text = edited(|root| root.insert("ir_version", Value::Null));
    assert_rejected_at(&text, "$.ir_version");
    let text = edited(|root| root.0.retain(|(k, _)| k != "abi_version"));
    let p = load_str(&text).expect("missing version = current");
    assert_eq!(p.abi_version, "0.2");
}

// ---------------------------------------------------------------------------------------------
// Enum names

#[rstest]
#[case::kind_plural("\"kind\": \"WEIGHT\"", "\"kind\": \"WEIGHTS\"", "$.buffers[1].kind")]
#[case::kind_lower("\"kind\": \"WEIGHT\"", "\"kind\": \"weight\"", "$.buffers[1].kind")]
#[case::kind_code("\"kind\": \"WEIGHT\"", "\"kind\": 0", "$.buffers[1].kind")]
#[case::dtype_lower("\"dtype\": \"I32\"", "\"dtype\": \"i32\"", "$.buffers[5].dtype")]
#[case::dtype_f32_lower(
    "\"name\": \"x\",\n      \"kind\": \"IO_INPUT\",\n      \"dtype\": \"F32\"",
    "\"name\": \"x\",\n      \"kind\": \"IO_INPUT\",\n      \"dtype\": \"f32\"",
    "$.buffers[0].dtype"
)]
#[case::dtype_torch("\"dtype\": \"I32\"", "\"dtype\": \"int32\"", "$.buffers[5].dtype")]
#[case::space(
    "\"space\": \"GLOBAL_SCRATCH\",\n      \"source\"",
    "\"space\": \"SHARED\",\n      \"source\"",
    "$.buffers[2].space"
)]
#[case::op_short("\"op\": \"ROPE\"", "\"op\": \"GEMV\"", "$.tasks[3].op")]
#[case::op_lower("\"op\": \"ROPE\"", "\"op\": \"rope\"", "$.tasks[3].op")]
#[case::op_code("\"op\": \"ROPE\"", "\"op\": 8", "$.tasks[3].op")]
#[case::page_space(
    "\"space\": \"GLOBAL_SCRATCH\",\n        \"nbytes\": 256",
    "\"space\": \"L2\",\n        \"nbytes\": 256",
    "$.pages.pages[0].space"
)]
#[case::page_strategy(
    "\"page_allocation\": \"graph_color\"",
    "\"page_allocation\": \"greedy\"",
    "$.config.page_allocation"
)]
#[case::sm_strategy(
    "\"sm_assignment\": {",
    "\"sm_assignment\": \"random\", \"x\": {",
    "$.config.sm_assignment"
)]
fn unknown_enum_names_are_load_errors(#[case] from: &str, #[case] to: &str, #[case] path: &str) {
    let base = read_fixture("reference_layout.json");
    assert!(base.contains(from), "fixture lacks {from:?}");
    assert_rejected_at(&base.replacen(from, to, 1), path);
}

#[test]
fn every_enum_name_is_accepted() {
    let reg = reg();
    for (i, &kind) in BufferKind::ALL.iter().enumerate() {
        for &dtype in DType::ALL {
            for &space in MemSpace::ALL {
                let text = format!(
                    r#"{{"buffers": [{{"id": 0, "name": "b{i}", "kind": "{kind}", "dtype": "{dtype}", "shape": [2], "space": "{space}"}}]}}"#
                );
                let p = Program::from_json(&text, &reg).expect("every enum name loads");
                assert_eq!(
                    (p.buffers[0].kind, p.buffers[0].dtype, p.buffers[0].space),
                    (kind, dtype, space)
                );
            }
        }
    }
    for &op in Opcode::ABI_OPS {
        let name = op.abi_name().expect("ABI name");
        let text = format!(
            r#"{{"tasks": [{{"id": 0, "op": "{name}", "inputs": [], "outputs": [], "out_counter": 0}}]}}"#
        );
        let p = Program::from_json(&text, &reg).expect("every ABI opcode loads");
        assert_eq!(p.tasks[0].op, op);
        assert_eq!(
            op.0,
            Opcode::ABI_OPS.iter().position(|&o| o == op).unwrap_or(99) as u16
        );
    }
    assert_eq!(Opcode::FUSED.0, 19);
}

// ---------------------------------------------------------------------------------------------
// Strict rejections, each naming the JSON path

/// A small program whose task 0 waits on task 1 (so that `$.tasks[0].waits[0].threshold`
/// exists), as we write it.
fn strict_base() -> String {
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 64]);
    let y = p.new_buffer("y", BufferKind::ACTIVATION, DType::F32, &[1, 64]);
    let z = p.new_buffer("z", BufferKind::IO_OUTPUT, DType::F32, &[1, 64]);
    let c0 = p.new_counter("z");
    let c1 = p.new_counter("y");
    p.push_task(
        Opcode::MUL,
        &[y],
        &[z],
        c0,
        &[(c1, 1)],
        m(&[("scale", 0.5.into())]),
        "scale",
    );
    p.push_task(Opcode::COPY, &[x], &[y], c1, &[], Map::new(), "copy");
    p.meta.insert("model", "strict".into());
    let reg = reg();
    assert!(validate(&p, &reg).ok());
    p.to_json(&reg).expect("serialise")
}

fn strict(from: &str, to: &str) -> String {
    let base = strict_base();
    assert!(base.contains(from), "base lacks {from:?}:\n{base}");
    base.replacen(from, to, 1)
}

const THRESHOLD: &str = "\"threshold\": 1";
const T0_ID: &str = "\"id\": 0,\n      \"op\"";
const T1_ID: &str = "\"id\": 1,\n      \"op\"";

#[rstest]
#[case::nan_threshold(THRESHOLD, "\"threshold\": NaN", "$.tasks[0].waits[0].threshold")]
#[case::inf_threshold(THRESHOLD, "\"threshold\": Infinity", "$.tasks[0].waits[0].threshold")]
#[case::neg_inf_threshold(THRESHOLD, "\"threshold\": -Infinity", "$.tasks[0].waits[0].threshold")]
#[case::nan_param("\"scale\": 0.5", "\"scale\": NaN", "$.tasks[0].params.scale")]
#[case::inf_meta("\"model\": \"strict\"", "\"model\": Infinity", "$.meta.model")]
#[case::overflowing_float("\"scale\": 0.5", "\"scale\": 1e999", "$.tasks[0].params.scale")]
#[case::bool_threshold(THRESHOLD, "\"threshold\": true", "$.tasks[0].waits[0].threshold")]
#[case::float_threshold(THRESHOLD, "\"threshold\": 1.0", "$.tasks[0].waits[0].threshold")]
#[case::beyond_i64_threshold(
    THRESHOLD,
    "\"threshold\": 99999999999999999999",
    "$.tasks[0].waits[0].threshold"
)]
#[case::string_threshold(THRESHOLD, "\"threshold\": \"1\"", "$.tasks[0].waits[0].threshold")]
#[case::null_threshold(THRESHOLD, "\"threshold\": null", "$.tasks[0].waits[0].threshold")]
#[case::bool_dim(
    "\"shape\": [\n        1,",
    "\"shape\": [\n        true,",
    "$.buffers[0].shape[0]"
)]
#[case::float_dim(
    "\"shape\": [\n        1,",
    "\"shape\": [\n        1.0,",
    "$.buffers[0].shape[0]"
)]
#[case::zero_dim(
    "\"shape\": [\n        1,\n        64",
    "\"shape\": [\n        1,\n        0",
    "$.buffers[0].shape[1]"
)]
#[case::negative_dim(
    "\"shape\": [\n        1,",
    "\"shape\": [\n        -4,",
    "$.buffers[0].shape[0]"
)]
#[case::shape_not_array(
    "\"shape\": [\n        1,\n        64\n      ]",
    "\"shape\": 64",
    "$.buffers[0].shape"
)]
#[case::string_buffer_id(
    "\"id\": 0,\n      \"name\"",
    "\"id\": \"0\",\n      \"name\"",
    "$.buffers[0].id"
)]
#[case::float_buffer_id(
    "\"id\": 0,\n      \"name\"",
    "\"id\": 0.0,\n      \"name\"",
    "$.buffers[0].id"
)]
#[case::bool_task_id(T0_ID, "\"id\": false,\n      \"op\"", "$.tasks[0].id")]
#[case::float_input(
    "\"inputs\": [\n        1\n      ]",
    "\"inputs\": [\n        1.0\n      ]",
    "$.tasks[0].inputs[0]"
)]
#[case::string_input(
    "\"inputs\": [\n        1\n      ]",
    "\"inputs\": [\n        \"1\"\n      ]",
    "$.tasks[0].inputs[0]"
)]
#[case::negative_input(
    "\"inputs\": [\n        1\n      ]",
    "\"inputs\": [\n        -1\n      ]",
    "$.tasks[0].inputs[0]"
)]
#[case::huge_input(
    "\"inputs\": [\n        1\n      ]",
    "\"inputs\": [\n        4294967296\n      ]",
    "$.tasks[0].inputs[0]"
)]
#[case::beyond_i64_input(
    "\"inputs\": [\n        1\n      ]",
    "\"inputs\": [\n        99999999999999999999\n      ]",
    "$.tasks[0].inputs[0]"
)]
#[case::float_out_counter("\"out_counter\": 0", "\"out_counter\": 0.5", "$.tasks[0].out_counter")]
#[case::string_wait_counter("\"counter\": 1", "\"counter\": \"1\"", "$.tasks[0].waits[0].counter")]
#[case::string_sm("\"sm\": null", "\"sm\": \"0\"", "$.tasks[0].sm")]
#[case::float_sm("\"sm\": null", "\"sm\": 1.5", "$.tasks[0].sm")]
#[case::sm_beyond_i32("\"sm\": null", "\"sm\": 3000000000", "$.tasks[0].sm")]
#[case::float_est("\"est_bytes\": 0", "\"est_bytes\": 0.5", "$.tasks[0].est_bytes")]
#[case::params_list("\"params\": {", "\"params\": [], \"x\": {", "$.tasks[0].params")]
#[case::meta_list("\"meta\": {", "\"meta\": [], \"x\": {", "$.meta")]
#[case::label_number("\"label\": \"scale\"", "\"label\": 5", "$.tasks[0].label")]
#[case::inputs_not_array(
    "\"inputs\": [\n        1\n      ]",
    "\"inputs\": 1",
    "$.tasks[0].inputs"
)]
#[case::waits_not_array("\"waits\": [],", "\"waits\": {},", "$.tasks[1].waits")]
#[case::counter_init_float("\"init\": 0", "\"init\": 0.0", "$.counters[0].init")]
#[case::noncanonical_task_id(T1_ID, "\"id\": 5,\n      \"op\"", "$.tasks[1].id")]
#[case::noncanonical_swapped(T1_ID, "\"id\": 0,\n      \"op\"", "$.tasks[1].id")]
#[case::noncanonical_buffer(
    "\"id\": 2,\n      \"name\": \"z\"",
    "\"id\": 7,\n      \"name\": \"z\"",
    "$.buffers[2].id"
)]
#[case::noncanonical_counter(
    "\"id\": 1,\n      \"init\"",
    "\"id\": 0,\n      \"init\"",
    "$.counters[1].id"
)]
#[case::negative_counter_id(
    "\"id\": 1,\n      \"init\"",
    "\"id\": -1,\n      \"init\"",
    "$.counters[1].id"
)]
#[case::duplicate_task_key(T0_ID, "\"id\": 0,\n      \"id\": 0,\n      \"op\"", "$.tasks[0].id")]
#[case::duplicate_param_key(
    "\"scale\": 0.5",
    "\"scale\": 0.5, \"scale\": 0.25",
    "$.tasks[0].params.scale"
)]
#[case::duplicate_top_key("\"meta\": {", "\"meta\": {}, \"meta\": {", "$.meta")]
fn strict_json_rejections_name_the_path(#[case] from: &str, #[case] to: &str, #[case] path: &str) {
    assert_rejected_at(&strict(from, to), path);
}

#[rstest]
#[case::buffer_without_dtype(
    "\"dtype\": \"F32\",\n      \"shape\"",
    "\"shape\"",
    "$.buffers[0]",
    "dtype"
)]
#[case::buffer_without_space(
    "\"space\": \"HBM\",\n      \"source\": null\n    },\n    {\n      \"id\": 1",
    "\"source\": null\n    },\n    {\n      \"id\": 1",
    "$.buffers[0]",
    "space"
)]
#[case::buffer_without_id(
    "\"id\": 0,\n      \"name\": \"x\"",
    "\"name\": \"x\"",
    "$.buffers[0]",
    "id"
)]
#[case::task_without_out_counter("\"out_counter\": 0,\n", "", "$.tasks[0]", "out_counter")]
#[case::task_without_op("\"op\": \"MUL\",\n", "", "$.tasks[0]", "op")]
#[case::task_without_inputs("\"inputs\": [\n        1\n      ],\n", "", "$.tasks[0]", "inputs")]
#[case::wait_without_threshold(
    ",\n          \"threshold\": 1",
    "",
    "$.tasks[0].waits[0]",
    "threshold"
)]
#[case::counter_without_id("\"id\": 0,\n      \"init\": 0", "\"init\": 0", "$.counters[0]", "id")]
fn missing_required_fields_name_the_field(
    #[case] from: &str,
    #[case] to: &str,
    #[case] path: &str,
    #[case] field: &str,
) {
    let msg = assert_rejected_at(&strict(from, to), path);
    assert!(
        msg.contains(field),
        "{msg:?} should name the field {field:?}"
    );
}

#[test]
fn the_strict_base_itself_loads() {
    let text = strict_base();
    let p = load_str(&text).expect("base loads");
    assert_eq!(p.tasks[0].waits[0].threshold, 1);
    assert_eq!(back_text(&text), text);
}

#[test]
fn page_ids_must_be_canonical_and_page_values_ids() {
    let base = read_fixture("reference_layout.json");
    let from = "\"id\": 1,\n        \"space\": \"GLOBAL_SCRATCH\"";
    assert!(base.contains(from));
    let text = base.replacen(from, "\"id\": 0,\n        \"space\": \"GLOBAL_SCRATCH\"", 1);
    assert_rejected_at(&text, "$.pages.pages[1].id");
    let text = base.replacen("\"4\": 1", "\"4\": \"1\"", 1);
    assert_rejected_at(&text, "$.pages.buffer_to_page[\"4\"]");
    let text = base.replacen("\"nbytes\": 512", "\"nbytes\": -512", 1);
    assert_rejected_at(&text, "$.pages.pages[1].nbytes");
}

#[test]
fn the_json_path_for_odd_keys_is_quoted() {
    // A page-table key that is not a buffer id.
    let text = edited(|root| {
        let b2p = obj_at(root, &["pages", "buffer_to_page"], None);
        b2p.insert("x y", 0.into());
    });
    assert_rejected_at(&text, "$.pages.buffer_to_page[\"x y\"]");
    let text = edited(|root| {
        let sm = obj_at(root, &["config", "sm_assignment"], None);
        sm.insert("-1", 0.into());
    });
    assert_rejected_at(&text, "$.config.sm_assignment");
}

#[rstest]
#[case::trailing_word("garbage")]
#[case::trailing_brace("}")]
#[case::second_document("{}")]
#[case::trailing_comma(",")]
#[case::trailing_nul("\u{0}")]
fn trailing_garbage_is_a_syntax_error(#[case] tail: &str) {
    let text = format!("{}\n{tail}", strict_base());
    let e = load_str(&text).expect_err("trailing garbage accepted");
    assert!(matches!(e, IrError::Json(_)), "{e:?}");
    assert!(e.to_string().contains("line"), "{e}");
}

#[rstest]
#[case::comment("// comment\n{}")]
#[case::single_quotes("{'a': 1}")]
#[case::trailing_comma_in_object(r#"{"meta": {"a": 1,}}"#)]
#[case::trailing_comma_in_array(r#"{"buffers": [,]}"#)]
#[case::leading_zero(r#"{"meta": {"a": 01}}"#)]
#[case::plus_sign(r#"{"meta": {"a": +1}}"#)]
#[case::hex(r#"{"meta": {"a": 0x10}}"#)]
#[case::bare_dot(r#"{"meta": {"a": .5}}"#)]
#[case::unterminated_string(r#"{"meta": {"a": "x}}"#)]
#[case::raw_newline_in_string("{\"meta\": {\"a\": \"x\ny\"}}")]
#[case::bad_escape(r#"{"meta": {"a": "\q"}}"#)]
#[case::lone_surrogate(r#"{"meta": {"a": "\ud800"}}"#)]
#[case::lone_low_surrogate(r#"{"meta": {"a": "\udc00x"}}"#)]
#[case::truncated_unicode(r#"{"meta": {"a": "\u12"}}"#)]
#[case::empty("")]
#[case::whitespace_only(" \n\t ")]
#[case::not_an_object("[]")]
#[case::scalar("42")]
#[case::null("null")]
fn malformed_documents_are_errors(#[case] text: &str) {
    assert!(load_str(text).is_err(), "accepted {text:?}");
}

#[test]
fn a_byte_order_mark_is_refused() {
    let text = strict_base();
    let mut bytes = vec![0xEF, 0xBB, 0xBF];
    bytes.extend_from_slice(text.as_bytes());
    let reg = reg();
    assert!(amk_core::codec::from_json_bytes(&bytes, &reg).is_err());
    assert!(amk_core::codec::from_json_bytes(text.as_bytes(), &reg).is_ok());
    let path = scratch("bom.json");
    std::fs::write(&path, &bytes).expect("write");
    assert!(Program::load(&path, &reg).is_err());
    // And as text (the BOM decoded to U+FEFF).
    assert!(load_str(&format!("\u{feff}{text}")).is_err());
}

#[test]
fn invalid_utf8_is_an_encoding_error() {
    let mut bytes = strict_base().into_bytes();
    let at = bytes.len() / 2;
    bytes[at] = 0xFF;
    let e = amk_core::codec::from_json_bytes(&bytes, &reg()).expect_err("bad UTF-8");
    assert!(matches!(e, IrError::Encoding { .. }), "{e:?}");
}

#[rstest]
#[case::arrays("[", "]")]
#[case::objects("{\"a\":", "}")]
fn nesting_ten_thousand_deep_is_an_error_not_a_crash(#[case] open: &str, #[case] close: &str) {
    let depth = 10_000;
    let deep = format!("{}1{}", open.repeat(depth), close.repeat(depth));
    // As a whole document, under meta, and as a param value.
    for text in [
        deep.clone(),
        format!(r#"{{"meta": {{"x": {deep}}}}}"#),
        strict("\"scale\": 0.5", &format!("\"scale\": {deep}")),
        // Unbalanced: never closed.
        open.repeat(depth),
    ] {
        let e = load_str(&text).expect_err("10,000-deep nesting accepted");
        assert!(matches!(e, IrError::Json(_)), "{e:?}");
    }
    // Refusing must not need deep recursion: it fits on a thread with half the default
    // 2 MiB stack. (Observed in debug builds: object nesting costs ~3.5 KiB of stack per
    // level, so the 128-level cap needs ~450 KiB.)
    let handle = std::thread::Builder::new()
        .stack_size(1024 * 1024)
        .spawn(move || load_str(&deep).is_err())
        .expect("spawn");
    assert!(handle.join().unwrap_or(false));
}

#[test]
fn moderate_nesting_in_meta_is_fine() {
    let nested = format!("{}{}", "[".repeat(50), "]".repeat(50));
    let text = strict("\"model\": \"strict\"", &format!("\"model\": {nested}"));
    let ours = back_text(&text);
    assert_eq!(back_text(&ours), ours);
    // Just under the documented cap of 128 levels still loads.
    let nested = format!("{}{}", "[".repeat(120), "]".repeat(120));
    load_str(&strict(
        "\"model\": \"strict\"",
        &format!("\"model\": {nested}"),
    ))
    .expect("120 levels under meta");
}

// ---------------------------------------------------------------------------------------------
// Files and gzip

#[test]
fn json_files_save_and_load() {
    let reg = reg();
    let p = full_program();
    let path = scratch("plain.json");
    p.save(&path, &reg).expect("save");
    let text = std::fs::read_to_string(&path).expect("read back");
    assert_eq!(text, p.to_json(&reg).expect("serialise"));
    assert_eq!(Program::load(&path, &reg).expect("load"), p);
}

#[test]
fn gzipped_files_load_transparently() {
    let reg = reg();
    let p = full_program();
    let path = scratch("prog.json.gz");
    p.save(&path, &reg).expect("save gz");
    let raw = std::fs::read(&path).expect("read gz");
    assert_eq!(&raw[..2], &[0x1f, 0x8b], "saved .gz must be gzip");
    assert_ne!(raw, p.to_json(&reg).expect("serialise").into_bytes());
    assert_eq!(Program::load(&path, &reg).expect("load gz"), p);
    // Gzip content is recognised by its magic, whatever the file is called.
    let renamed = scratch("gz-content.json");
    std::fs::write(&renamed, &raw).expect("write");
    assert_eq!(Program::load(&renamed, &reg).expect("load by magic"), p);
    // The reference-layout fixture, gzipped, reads to the same program.
    let f = Program::load(&fixture("reference_layout.json"), &reg).expect("fixture");
    let gz = scratch("fixture.json.gz");
    f.save(&gz, &reg).expect("save");
    assert_eq!(Program::load(&gz, &reg).expect("load"), f);
}

#[test]
fn corrupt_gzip_is_a_gzip_error() {
    let reg = reg();
    let path = scratch("good.json.gz");
    full_program().save(&path, &reg).expect("save gz");
    let good = std::fs::read(&path).expect("read");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage.json.gz", {
            let mut b = vec![0x1f, 0x8b];
            b.extend_from_slice(b"this is not deflate data at all");
            b
        }),
        ("truncated.json.gz", good[..good.len() / 2].to_vec()),
        ("flipped.json.gz", {
            let mut b = good.clone();
            let mid = b.len() / 2;
            b[mid] ^= 0xFF;
            b[mid + 1] ^= 0xFF;
            b
        }),
        ("magic-only.json.gz", vec![0x1f, 0x8b]),
    ];
    for (name, bytes) in cases {
        let path = scratch(name);
        std::fs::write(&path, &bytes).expect("write");
        match Program::load(&path, &reg) {
            Err(IrError::Gzip { path: p, .. }) => assert_eq!(p, path),
            other => panic!("{name}: expected a Gzip error, got {other:?}"),
        }
    }
}

#[test]
fn a_missing_file_is_an_io_error() {
    let path = scratch("does-not-exist.json");
    match Program::load(&path, &reg()) {
        Err(IrError::Io { path: p, .. }) => assert_eq!(p, path),
        other => panic!("expected an Io error, got {other:?}"),
    }
}

#[test]
fn a_step_loop_round_trips_and_is_written_only_when_present() {
    let reg = reg();
    let mut p = full_program();
    let text = p.to_json(&reg).expect("serialise");
    assert!(!text.contains("step_loop"), "absent loops are not written");
    p.step_loop = Some(amk_core::StepLoop { gate: 1, halt: 0 });
    let text = p.to_json(&reg).expect("serialise");
    assert!(
        text.ends_with("\"step_loop\": {\n    \"gate\": 1,\n    \"halt\": 0\n  }\n}"),
        "{}",
        &text[text.len().saturating_sub(120)..]
    );
    let back = Program::from_json(&text, &reg).expect("re-read");
    assert_eq!(back, p);
    assert_eq!(back.to_json(&reg).expect("re-serialise"), text);
}

#[rstest]
#[case::not_an_object(r#""step_loop": 3"#, "step_loop")]
#[case::missing_halt(r#""step_loop": {"gate": 0}"#, "step_loop")]
#[case::negative_gate(r#""step_loop": {"gate": -1, "halt": 0}"#, "step_loop.gate")]
#[case::string_halt(r#""step_loop": {"gate": 0, "halt": "x"}"#, "step_loop.halt")]
fn malformed_step_loops_are_load_errors(#[case] field: &str, #[case] path: &str) {
    let text = format!(r#"{{"ir_version": "0.2.0", "abi_version": "0.2", {field}}}"#);
    assert_rejected_at(&text, path);
}

/// A JSON integer beyond 64 bits is a number (the nearest f64), not a parse error: the file
/// reads, and a field that needs an integer refuses it at its own path (above).
#[test]
fn integers_beyond_i64_are_numbers() {
    let v =
        amk_core::json::parse("{\"model_max_length\": 1000000000000000019884624838656}").unwrap();
    let map = v.as_object().unwrap();
    assert_eq!(map.get("model_max_length"), Some(&Value::Float(1e30)));
    let v = amk_core::json::parse("[-9223372036854775808, 9223372036854775808]").unwrap();
    assert_eq!(
        v,
        Value::Array(vec![
            Value::Int(i64::MIN),
            Value::Float(9223372036854775808.0)
        ])
    );
}

/// A program file past the size limit, a gzip file that inflates past it, a device that never
/// ends and a FIFO that would block are refused at once with typed errors, in bounded time and
/// memory (the limit here 1 MiB; `MAX_PROGRAM_BYTES` is 1 GiB).
#[test]
fn oversized_endless_and_blocking_inputs_are_refused_at_once() {
    use amk_core::codec::load_limited;
    use std::io::Write as _;
    let reg = reg();
    let limit = 1u64 << 20;
    let t0 = std::time::Instant::now();

    // 64 MiB of spaces, gzipped to some 64 KB.
    let bomb = scratch("bomb.json.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![b' '; 64 << 20]).unwrap();
    std::fs::write(&bomb, gz.finish().unwrap()).unwrap();
    match load_limited(&bomb, &reg, limit) {
        Err(IrError::TooLarge { what, .. }) => assert_eq!(what, "the decompressed program"),
        other => panic!("gzip bomb: {other:?}"),
    }

    let big = scratch("big.json");
    std::fs::write(&big, vec![b' '; (limit + 1) as usize]).unwrap();
    match load_limited(&big, &reg, limit) {
        Err(IrError::TooLarge { what, .. }) => assert_eq!(what, "the file"),
        other => panic!("big file: {other:?}"),
    }

    #[cfg(unix)]
    {
        match Program::load(Path::new("/dev/zero"), &reg) {
            Err(IrError::NotAFile { .. }) => {}
            other => panic!("/dev/zero: {other:?}"),
        }
        let fifo = scratch("fifo.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            match Program::load(&fifo, &reg) {
                Err(IrError::NotAFile { .. }) => {}
                other => panic!("FIFO: {other:?}"),
            }
        }
    }
    assert!(t0.elapsed().as_secs() < 10, "{:?}", t0.elapsed());
}

/// A page allocation must list its pages (an empty list when it has none): the format requires
/// the field and the reference refuses a program without it.
#[test]
fn a_page_allocation_without_its_pages_list_is_refused() {
    let reg = reg();
    let text = amk_core::codec::to_json_string(&full_program(), &reg).unwrap();
    let doc = json::parse(&text).unwrap();
    let root = doc.as_object().expect("a program is an object");
    let pages = root
        .get("pages")
        .and_then(Value::as_object)
        .expect("full_program has pages");
    // The same page allocation without its "pages" list.
    let mut cut = Map::new();
    for (k, v) in pages.iter().filter(|(k, _)| *k != "pages") {
        cut.insert(k, v.clone());
    }
    let mut program = Map::new();
    for (k, v) in root.iter() {
        let v = if k == "pages" {
            Value::Object(cut.clone())
        } else {
            v.clone()
        };
        program.insert(k, v);
    }
    let doc = Value::Object(program);
    let mut stripped = String::new();
    json::write::write_compact(&doc, &mut stripped);
    assert_rejected_at(&stripped, "$.pages");
}
