//! `amk run` end to end: a small program built with the core API, random non-zero weights in
//! a safetensors file, outputs (JSON and text) checked against f64 formulas, and every kind of
//! bad input mapped to its exit code with a message naming the buffer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

mod common;
mod limited;
use amk_core::json::{Map, Value};
use amk_core::sim::SplitMix;
use amk_core::testkit::random_nonzero;
use amk_core::{BufferKind, DType, Opcode, Program, Tensor, WeightStore};
use common::{backend_line, gpu};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const H: u64 = 12;
const N: u64 = 6;
const VOCAB: u64 = 5;

fn amk() -> Command {
    Command::new(env!("CARGO_BIN_EXE_amk"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("amk-run-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn params(kv: &[(&str, Value)]) -> Map {
    let mut m = Map::new();
    for (k, v) in kv {
        m.insert(*k, v.clone());
    }
    m
}

/// `rows = EMBED(tok, table)`; `y = GEMV(RMSNORM(x, norm), proj)` in two tiles;
/// `best = SAMPLE_ARGMAX(y)`. With `drop_wait`, the argmax stops waiting for the tiles (a race
/// the validator rejects).
fn program(drop_wait: bool) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, H]);
    let tok = p.new_buffer("tok", BufferKind::IO_INPUT, DType::I32, &[2]);
    let table = p.new_weight("table", DType::F32, &[VOCAB, H], "embed.weight");
    let norm = p.new_weight("norm_w", DType::F32, &[H], "norm");
    let w = p.new_weight("w_proj", DType::F32, &[N, H], "proj");
    let rows = p.new_buffer("rows", BufferKind::IO_OUTPUT, DType::F32, &[2, H]);
    let xn = p.new_buffer("xn", BufferKind::ACTIVATION, DType::F32, &[1, H]);
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[1, N]);
    let best = p.new_buffer("best", BufferKind::IO_OUTPUT, DType::I32, &[1]);
    let (c_rows, c_xn, c_y, c_best) = (
        p.new_counter("rows"),
        p.new_counter("xn"),
        p.new_counter("y"),
        p.new_counter("best"),
    );
    let hi = Value::Int(H as i64);
    p.push_task(
        Opcode::EMBED,
        &[tok, table],
        &[rows],
        c_rows,
        &[],
        params(&[("hidden", hi.clone())]),
        "embed",
    );
    p.push_task(
        Opcode::RMSNORM,
        &[x, norm],
        &[xn],
        c_xn,
        &[],
        params(&[("eps", Value::Float(1e-5)), ("hidden", hi.clone())]),
        "norm",
    );
    for (off, width) in [(0, 4), (4, 2)] {
        p.push_task(
            Opcode::GEMV_TILE,
            &[xn, w],
            &[y],
            c_y,
            &[(c_xn, 1)],
            params(&[
                ("K", hi.clone()),
                ("N_tile", Value::Int(width)),
                ("n_off", Value::Int(off)),
            ]),
            format!("proj[{off}]"),
        );
    }
    let waits: &[(u32, i64)] = if drop_wait { &[] } else { &[(c_y, 2)] };
    p.push_task(
        Opcode::SAMPLE_ARGMAX,
        &[y],
        &[best],
        c_best,
        waits,
        Map::new(),
        "argmax",
    );
    p
}

struct Fixture {
    dir: PathBuf,
    program: PathBuf,
    weights: PathBuf,
    store: WeightStore,
}

fn weights() -> WeightStore {
    let mut rng = SplitMix(0xA3C_0001);
    let mut s = WeightStore::new();
    s.insert(
        "embed.weight",
        random_nonzero(DType::F32, &[VOCAB, H], &mut rng, -1.0, 1.0),
    );
    s.insert("norm", random_nonzero(DType::F32, &[H], &mut rng, 0.5, 1.5));
    s.insert(
        "proj",
        random_nonzero(DType::F32, &[N, H], &mut rng, -0.5, 0.5),
    );
    s
}

fn save_program(dir: &Path, name: &str, p: &Program) -> PathBuf {
    let reg = amk_ops::registry().unwrap();
    let path = dir.join(name);
    p.save(&path, &reg).unwrap();
    path
}

fn fixture(name: &str) -> Fixture {
    let dir = scratch(name);
    let program = save_program(&dir, "prog.json.gz", &program(false));
    let store = weights();
    let weights = dir.join("weights.safetensors");
    store.save_safetensors(&weights).unwrap();
    Fixture {
        dir,
        program,
        weights,
        store,
    }
}

const X: [f64; 12] = [
    0.5, -1.25, 2.0, 0.75, -0.5, 1.5, -2.0, 0.25, 1.0, -0.75, 3.0, -1.5,
];
const TOK: [i64; 2] = [3, 1];

fn x_arg() -> String {
    let v: Vec<String> = X.iter().map(|v| v.to_string()).collect();
    format!("x={}", v.join(","))
}

fn tok_arg() -> String {
    format!("tok={},{}", TOK[0], TOK[1])
}

fn run(f: &Fixture, extra: &[&str]) -> Output {
    amk()
        .arg("run")
        .arg(&f.program)
        .arg("--weights")
        .arg(&f.weights)
        .args(extra)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn vals(t: &Tensor) -> Vec<f64> {
    (0..t.numel()).map(|i| t.get_f32(i) as f64).collect()
}

/// The expected outputs in f64: `(rows, y, best)`.
fn expected(store: &WeightStore) -> (Vec<f64>, Vec<f64>, i64) {
    let table = vals(store.get("embed.weight").unwrap());
    let norm = vals(store.get("norm").unwrap());
    let proj = vals(store.get("proj").unwrap());
    let h = H as usize;
    let rows: Vec<f64> = TOK
        .iter()
        .flat_map(|&t| table[t as usize * h..(t as usize + 1) * h].to_vec())
        .collect();
    let ms = X.iter().map(|v| v * v).sum::<f64>() / H as f64;
    let inv = 1.0 / (ms + 1e-5f32 as f64).sqrt();
    let xn: Vec<f64> = X.iter().zip(&norm).map(|(x, w)| x * inv * w).collect();
    let y: Vec<f64> = (0..N as usize)
        .map(|n| (0..h).map(|k| xn[k] * proj[n * h + k]).sum())
        .collect();
    let best = (0..y.len()).fold(0, |b, j| if y[j] > y[b] { j } else { b }) as i64;
    (rows, y, best)
}

fn assert_close(what: &str, got: &serde_json::Value, want: &[f64]) {
    let got: Vec<f64> = got
        .as_array()
        .unwrap_or_else(|| panic!("{what}: data is not an array"))
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 + 1e-5 * w.abs(),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

#[test]
fn json_outputs_match_the_f64_formula() {
    let f = fixture("json");
    let out = run(&f, &["--set", &x_arg(), "--set", &tok_arg(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // compact, as every command's --json (no string here holds ": " or ", ")
    let text = stdout(&out);
    assert!(!text.contains(": ") && !text.contains(", "), "{text}");
    let top = doc.as_object().unwrap();
    let mut keys: Vec<&String> = top.keys().collect();
    keys.sort();
    assert_eq!(keys, vec!["backend", "outputs"]);
    let outs = doc["outputs"].as_object().unwrap();
    let mut names: Vec<&String> = outs.keys().collect();
    names.sort();
    assert_eq!(names, vec!["best", "rows", "y"]);
    for (name, o) in outs {
        let mut keys: Vec<&String> = o.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, vec!["data", "dtype", "shape"], "{name}");
    }
    let (rows, y, best) = expected(&f.store);
    assert_eq!(doc["outputs"]["rows"]["dtype"], "F32");
    assert_eq!(doc["outputs"]["rows"]["shape"], serde_json::json!([2, H]));
    assert_close("rows", &doc["outputs"]["rows"]["data"], &rows);
    assert_eq!(doc["outputs"]["y"]["shape"], serde_json::json!([1, N]));
    assert_close("y", &doc["outputs"]["y"]["data"], &y);
    assert_eq!(doc["outputs"]["best"]["dtype"], "I32");
    assert_eq!(doc["outputs"]["best"]["shape"], serde_json::json!([1]));
    assert_eq!(doc["outputs"]["best"]["data"], serde_json::json!([best]));
    // The text is exact f32 values: re-reading them gives the stored floats.
    let again = run(&f, &["--set", &x_arg(), "--set", &tok_arg(), "--json"]);
    assert_eq!(again.stdout, out.stdout, "deterministic");
}

#[test]
fn several_steps_and_human_output() {
    let f = fixture("human");
    let out = run(
        &f,
        &["--set", &tok_arg(), "--set", &x_arg(), "--steps", "3"],
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("ran 3 step(s) on the cpu backend"), "{text}");
    assert!(text.contains("y: F32 [1, 6] = ["), "{text}");
    assert!(text.contains("best: I32 [1] = ["), "{text}");
    // 24 values: abbreviated, with the count.
    let rows_line = text.lines().find(|l| l.starts_with("rows:")).unwrap();
    assert!(
        rows_line.contains("...") && rows_line.contains("(24 values"),
        "{rows_line}"
    );
    let (_, y, best) = expected(&f.store);
    assert!(
        text.contains(&format!("best: I32 [1] = [{best}]")),
        "{text}"
    );
    let y_line = text.lines().find(|l| l.starts_with("y:")).unwrap();
    let inner = y_line.split('[').nth(2).unwrap().trim_end_matches(']');
    let got: Vec<f64> = inner.split(", ").map(|v| v.parse().unwrap()).collect();
    for (g, w) in got.iter().zip(&y) {
        assert!((g - w).abs() <= 1e-6 + 1e-5 * w.abs(), "{g} vs {w}");
    }
    // Same result for one step and three.
    let one = run(&f, &["--set", &tok_arg(), "--set", &x_arg()]);
    assert_eq!(
        stdout(&one).lines().skip(1).collect::<Vec<_>>(),
        text.lines().skip(1).collect::<Vec<_>>()
    );
}

/// Runs with `extra` and asserts the exit code, that stderr names `needle`, and that `--json`
/// gives an error object of `kind` on stdout.
fn expect_error(f: &Fixture, extra: &[&str], code: i32, needle: &str, kind: &str) {
    let out = run(f, extra);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{extra:?}: stdout {} stderr {}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains(needle),
        "{extra:?}: stderr should name '{needle}': {}",
        stderr(&out)
    );
    let mut with_json = extra.to_vec();
    with_json.push("--json");
    let out = run(f, &with_json);
    assert_eq!(out.status.code(), Some(code), "{extra:?} --json");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{extra:?} --json: {e}: {}", stdout(&out)));
    assert_eq!(doc["error"]["kind"], kind, "{doc}");
    assert!(
        doc["error"]["message"].as_str().unwrap().contains(needle),
        "{doc}"
    );
}

#[test]
fn bad_inputs_are_typed_errors_naming_the_buffer() {
    let f = fixture("inputs");
    let (x, tok) = (x_arg(), tok_arg());
    // Unknown name, listing the real inputs.
    expect_error(
        &f,
        &["--set", &x, "--set", &tok, "--set", "nope=1"],
        2,
        "nope",
        "input",
    );
    // A buffer that is not an input.
    expect_error(
        &f,
        &["--set", &x, "--set", &tok, "--set", "y=1,2,3,4,5,6"],
        2,
        "not an IO_INPUT",
        "input",
    );
    // Not a number.
    let bad_x = x.replacen("0.5", "abc", 1);
    expect_error(&f, &["--set", &bad_x, "--set", &tok], 2, "'abc'", "input");
    // Wrong count.
    expect_error(
        &f,
        &["--set", "x=1,2,3", "--set", &tok],
        2,
        "holds 12 element",
        "input",
    );
    // A fraction for an integer buffer.
    expect_error(
        &f,
        &["--set", &x, "--set", "tok=1.5,2"],
        2,
        "an integer",
        "input",
    );
    // Out of the dtype's range.
    expect_error(
        &f,
        &["--set", &x, "--set", "tok=1,99999999999"],
        2,
        "tok",
        "input",
    );
    // Set twice.
    expect_error(
        &f,
        &["--set", &x, "--set", &tok, "--set", &tok],
        2,
        "more than once",
        "input",
    );
    // No '='.
    expect_error(&f, &["--set", &x, "--set", "tok"], 2, "NAME=", "input");
    // Missing input.
    expect_error(&f, &["--set", &x], 2, "tok", "input");
    // An unknown backend is refused by the parser.
    let out = run(&f, &["--set", &x, "--set", &tok, "--backend", "metal"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("'metal'"), "{}", stderr(&out));
    // A token id beyond the table fails in the op at run time.
    expect_error(
        &f,
        &["--set", &x, "--set", "tok=1,7"],
        3,
        "out of range",
        "run",
    );
    // --steps 0 is refused by the parser.
    let out = run(&f, &["--set", &x, "--set", &tok, "--steps", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bad_weights_name_the_buffer() {
    let f = fixture("weights");
    let (x, tok) = (x_arg(), tok_arg());
    let args = ["--set", x.as_str(), "--set", tok.as_str()];
    let mut rng = SplitMix(5);
    let variants: Vec<(&str, WeightStore, &str)> = vec![
        (
            "missing",
            {
                let mut s = WeightStore::new();
                s.insert(
                    "embed.weight",
                    (**f.store.get("embed.weight").unwrap()).clone(),
                );
                s.insert("norm", (**f.store.get("norm").unwrap()).clone());
                s
            },
            "'proj' is not in the weights",
        ),
        (
            "dtype",
            {
                let mut s = f.store.clone();
                s.insert(
                    "proj",
                    random_nonzero(DType::BF16, &[N, H], &mut rng, -1.0, 1.0),
                );
                s
            },
            "BF16",
        ),
        (
            "shape",
            {
                let mut s = f.store.clone();
                s.insert(
                    "proj",
                    random_nonzero(DType::F32, &[N, H + 1], &mut rng, -1.0, 1.0),
                );
                s
            },
            "[6, 13]",
        ),
    ];
    for (name, store, needle) in variants {
        let path = f.dir.join(format!("{name}.safetensors"));
        store.save_safetensors(&path).unwrap();
        let out = amk()
            .arg("run")
            .arg(&f.program)
            .arg("--weights")
            .arg(&path)
            .args(args)
            .arg("--json")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("w_proj") && err.contains(needle),
            "{name}: {err}"
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["error"]["kind"], "weights");
        assert_eq!(doc["error"]["buffer"], "w_proj");
    }
    // No weights file at all: the first weight buffer is named.
    let out = amk()
        .arg("run")
        .arg(&f.program)
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no --weights file"),
        "{}",
        stderr(&out)
    );
    // An unreadable or corrupt weights file.
    let junk = f.dir.join("junk.safetensors");
    std::fs::write(&junk, b"not safetensors").unwrap();
    for path in [junk, f.dir.join("absent.safetensors")] {
        let out = amk()
            .arg("run")
            .arg(&f.program)
            .arg("--weights")
            .arg(&path)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", path.display());
        assert!(stderr(&out).contains("safetensors"), "{}", stderr(&out));
    }
}

#[test]
fn rejected_and_unreadable_programs() {
    let f = fixture("programs");
    let (x, tok) = (x_arg(), tok_arg());
    let racy = save_program(&f.dir, "racy.json", &program(true));
    let out = amk()
        .arg("run")
        .arg(&racy)
        .arg("--weights")
        .arg(&f.weights)
        .args(["--set", &x, "--set", &tok])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("[REJECTED]"), "{}", stdout(&out));
    assert!(stdout(&out).contains("raw_race"), "{}", stdout(&out));
    let out = amk()
        .arg("run")
        .arg(&racy)
        .arg("--weights")
        .arg(&f.weights)
        .args(["--set", &x, "--set", &tok, "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["kind"], "rejected");
    let out = amk()
        .arg("run")
        .arg(f.dir.join("absent.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("absent.json"), "{}", stderr(&out));
}

#[test]
fn backend_choice_is_announced_on_stderr() {
    let f = fixture("backend");
    let (x, tok) = (x_arg(), tok_arg());
    let sets = ["--set", x.as_str(), "--set", tok.as_str()];
    let with = |extra: &[&str]| {
        let mut a = sets.to_vec();
        a.extend_from_slice(extra);
        run(&f, &a)
    };
    // --backend cpu: the CPU VM, as before; stdout stays pure JSON.
    let cpu = with(&["--backend", "cpu", "--json"]);
    assert_eq!(cpu.status.code(), Some(0), "stderr: {}", stderr(&cpu));
    assert_eq!(backend_line(&cpu), "backend: cpu");
    let cpu_doc: serde_json::Value = serde_json::from_slice(&cpu.stdout).unwrap();
    assert_eq!(cpu_doc["backend"], "cpu");
    let (_, _, best) = expected(&f.store);
    assert_eq!(
        cpu_doc["outputs"]["best"]["data"],
        serde_json::json!([best])
    );
    let text = with(&["--backend", "cpu"]);
    assert!(
        stdout(&text).contains("on the cpu backend"),
        "{}",
        stdout(&text)
    );

    // No --backend and --backend auto: the GPU when there is one, else the CPU and why.
    for extra in [&["--json"][..], &["--backend", "auto", "--json"]] {
        let out = with(extra);
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {}", stderr(&out));
        let line = backend_line(&out);
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{extra:?}: {e}: {}", stdout(&out)));
        match gpu() {
            Ok(info) => {
                assert_eq!(line, format!("backend: cuda ({info})"));
                assert_eq!(doc["backend"], "cuda");
                assert_eq!(doc["outputs"]["best"]["data"], serde_json::json!([best]));
            }
            Err(why) => {
                common::assert_cpu_fallback(&line, &why);
                assert_eq!(doc, cpu_doc, "{extra:?}");
            }
        }
    }

    // --backend cuda: the GPU, or exit 2 naming why not (before the program is loaded).
    match gpu() {
        Ok(info) => {
            let out = with(&["--backend", "cuda", "--json"]);
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            assert_eq!(backend_line(&out), format!("backend: cuda ({info})"));
        }
        Err(why) => {
            let why = why.lines().next().unwrap().to_string();
            let needle = if cfg!(feature = "cuda") {
                why.as_str()
            } else {
                "built without the `cuda` feature"
            };
            expect_error(
                &f,
                &[&sets[..], &["--backend", "cuda"]].concat(),
                2,
                needle,
                "backend",
            );
            let out = with(&["--backend", "cuda"]);
            assert!(
                stderr(&out).contains("--backend cuda: the CUDA backend is unavailable"),
                "{}",
                stderr(&out)
            );
            assert!(
                !stderr(&out).lines().any(|l| l.starts_with("backend:")),
                "{}",
                stderr(&out)
            );
            // An unreadable program is not even opened: the backend is checked first.
            let out = amk()
                .args(["run", "/nonexistent/prog.json", "--backend", "cuda"])
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2));
            assert!(stderr(&out).contains(needle), "{}", stderr(&out));
        }
    }
}

/// The decode interface's inputs by hand: `reshape_id0` (which every decode program of `amk
/// lower` carries) is 0 unless set, and a missing `pos` is named with what it holds. The
/// program embeds table rows `reshape_id0` and `pos`.
#[test]
fn decode_inputs_have_their_default_and_their_meaning() {
    let mut p = Program::new();
    let rid = p.new_buffer("reshape_id0", BufferKind::IO_INPUT, DType::I32, &[1]);
    let pos = p.new_buffer("pos", BufferKind::IO_INPUT, DType::I32, &[1]);
    let table = p.new_weight("table", DType::F32, &[VOCAB, H], "embed.weight");
    let hi = Value::Int(H as i64);
    for (name, input) in [("by_rid", rid), ("by_pos", pos)] {
        let out = p.new_buffer(name, BufferKind::IO_OUTPUT, DType::F32, &[1, H]);
        let c = p.new_counter(name);
        p.push_task(
            Opcode::EMBED,
            &[input, table],
            &[out],
            c,
            &[],
            params(&[("hidden", hi.clone())]),
            name,
        );
    }
    let mut f = fixture("decode-inputs");
    f.program = save_program(&f.dir, "decode.json", &p);
    let table = f.store.get("embed.weight").unwrap();
    let row = |r: usize| vals(table)[r * H as usize..(r + 1) * H as usize].to_vec();
    for (sets, rid_row) in [
        (&["--set", "pos=2"][..], 0),
        (&["--set", "pos=2", "--set", "reshape_id0=3"][..], 3),
    ] {
        let mut args = sets.to_vec();
        args.push("--json");
        let out = run(&f, &args);
        assert_eq!(out.status.code(), Some(0), "{sets:?}: {}", stderr(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_close("by_rid", &doc["outputs"]["by_rid"]["data"], &row(rid_row));
        assert_close("by_pos", &doc["outputs"]["by_pos"]["data"], &row(2));
    }
    expect_error(
        &f,
        &[],
        2,
        "pos (I32 [1]: this pass's position, from 0)",
        "input",
    );
    let out = run(&f, &[]);
    assert!(!stderr(&out).contains("reshape_id0"), "{}", stderr(&out));
}

/// `-q` (any command) keeps stderr to errors: the run's backend line goes, its outputs stay;
/// it excludes `-v`.
#[test]
fn quiet_keeps_stderr_to_errors() {
    let f = fixture("quiet");
    let (x, tok) = (x_arg(), tok_arg());
    let loud = run(&f, &["--set", &x, "--set", &tok]);
    let quiet = run(&f, &["-q", "--set", &x, "--set", &tok]);
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert!(stderr(&loud).contains("backend: "), "{}", stderr(&loud));
    assert!(quiet.stderr.is_empty(), "{}", stderr(&quiet));
    assert_eq!(quiet.stdout, loud.stdout);
    let failed = run(&f, &["-q", "--set", &x]);
    assert_eq!(failed.status.code(), Some(2));
    assert!(
        stderr(&failed).starts_with("error: "),
        "{}",
        stderr(&failed)
    );
    let both = run(&f, &["-q", "-v", "--set", &x, "--set", &tok]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
}

/// A program the validator accepts whose buffers cannot fit (two of 4 TiB) is a typed error
/// naming them, in bounded memory (under a 1 GiB address-space limit, `prlimit --as`), not an
/// abort; and a weights file whose tensors alias one byte range is refused as it is read.
#[test]
fn buffers_that_cannot_fit_and_aliased_weights_are_typed_errors() {
    let f = fixture("huge");
    let mut p = program(false);
    for name in ["huge_a", "huge_b"] {
        p.new_buffer(name, BufferKind::ACTIVATION, DType::F32, &[1 << 40]);
    }
    let huge = save_program(&f.dir, "huge.json", &p);
    let limited = |args: &[&std::ffi::OsStr]| {
        limited::amk_limited()
            .args(args)
            .args(["--set", &x_arg(), "--set", &tok_arg()])
            .output()
            .unwrap()
    };
    let o = limited(&[
        "run".as_ref(),
        huge.as_os_str(),
        "--weights".as_ref(),
        f.weights.as_os_str(),
    ]);
    let err = stderr(&o);
    // The backend's refusal (exit 3), never an abort by a signal.
    assert_eq!(o.status.code(), Some(3), "{:?}: {err}", o.status);
    assert!(
        err.contains("'huge_a'") && err.contains("GiB available"),
        "{err}"
    );

    // Two tensors over the same 4 MiB: each would be copied on its own (3,000 of them took
    // 12 GB); the reader refuses the overlap.
    let n: usize = 1 << 20;
    let entry = |i: usize| {
        format!(
            "\"t{i}\": {{\"dtype\": \"F32\", \"shape\": [{n}], \"data_offsets\": [0, {}]}}",
            4 * n
        )
    };
    let mut header = format!(
        "{{{}}}",
        (0..3000).map(entry).collect::<Vec<_>>().join(", ")
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + 4 * n, 0);
    let aliased = f.dir.join("aliased.safetensors");
    std::fs::write(&aliased, bytes).unwrap();
    let o = limited(&[
        "run".as_ref(),
        f.program.as_os_str(),
        "--weights".as_ref(),
        aliased.as_os_str(),
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{:?}: {err}", o.status);
    assert!(err.contains("overlap"), "{err}");
    let _ = std::fs::remove_dir_all(&f.dir);
}
