//! `amk validate` end to end: exit codes, human and JSON output, gzip input, bad files.
#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should abort the test

mod limited;

use amk_core::json::Map;
use amk_core::{BufferKind, DType, Opcode, Program};
use std::path::{Path, PathBuf};
use std::process::Command;

fn amk() -> Command {
    Command::new(env!("CARGO_BIN_EXE_amk"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("amk-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn program(drop_wait: bool) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 8]);
    let w = p.new_weight("w", DType::F32, &[16, 8], "w");
    let h = p.new_buffer("h", BufferKind::ACTIVATION, DType::F32, &[1, 16]);
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[1, 16]);
    let c0 = p.new_counter("h");
    let c1 = p.new_counter("y");
    for i in 0..2i64 {
        let mut m = Map::new();
        m.insert("K", 8.into());
        m.insert("N_tile", 8.into());
        m.insert("n_off", (i * 8).into());
        p.push_task(
            Opcode::GEMV_TILE,
            &[x, w],
            &[h],
            c0,
            &[],
            m,
            format!("t{i}"),
        );
    }
    let waits: &[(u32, i64)] = if drop_wait { &[] } else { &[(c0, 2)] };
    p.push_task(Opcode::COPY, &[h], &[y], c1, waits, Map::new(), "copy");
    p
}

fn write(dir: &Path, name: &str, p: &Program) -> PathBuf {
    let reg = amk_ops::registry().unwrap();
    let path = dir.join(name);
    p.save(&path, &reg).unwrap();
    path
}

#[test]
fn exit_codes_follow_the_contract() {
    let d = scratch("exit");
    let good = write(&d, "good.json", &program(false));
    let bad = write(&d, "bad.json", &program(true));
    let broken = d.join("broken.json");
    std::fs::write(&broken, "{\"tasks\": [ {\"id\": true} ]}").unwrap();

    let ok = amk().arg("validate").arg(&good).output().unwrap();
    assert_eq!(ok.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("[VALID]"));

    let rej = amk().arg("validate").arg(&good).arg(&bad).output().unwrap();
    assert_eq!(rej.status.code(), Some(1));
    let text = String::from_utf8_lossy(&rej.stdout);
    assert!(
        text.contains("[REJECTED]") && text.contains("raw_race"),
        "{text}"
    );

    let load = amk()
        .arg("validate")
        .arg(&bad)
        .arg(&broken)
        .output()
        .unwrap();
    assert_eq!(load.status.code(), Some(2));
    let text = String::from_utf8_lossy(&load.stderr);
    assert!(
        text.starts_with("error: ")
            && text.contains("broken.json")
            && text.contains("$.tasks[0].id"),
        "{text}"
    );
    assert_eq!(
        text.matches("broken.json").count(),
        1,
        "the path once: {text}"
    );

    let missing = amk()
        .arg("validate")
        .arg(d.join("nope.json"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn json_output_is_one_object_or_an_array() {
    let d = scratch("json");
    let good = write(&d, "good.json.gz", &program(false));
    let bad = write(&d, "bad.json", &program(true));

    let one = amk()
        .args(["validate", "--json"])
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(one.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["stage"], "validate");
    for key in [
        "tasks",
        "buffers",
        "counters",
        "edges",
        "acyclic",
        "weight_MB",
        "sm_assigned",
    ] {
        assert!(v["stats"].get(key).is_some(), "stats lacks {key}: {v}");
    }
    assert_eq!(v["stats"]["tasks"], 3);
    assert_eq!(v["stats"]["edges"], 2);

    let broken = d.join("broken.json");
    std::fs::write(&broken, "[1, 2").unwrap();
    let many = amk()
        .args(["validate", "--json"])
        .arg(&good)
        .arg(&bad)
        .arg(&broken)
        .output()
        .unwrap();
    assert_eq!(many.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&many.stdout).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 3);
    assert_eq!(arr[1]["ok"], false);
    assert_eq!(arr[1]["errors"][0]["kind"], "raw_race");
    assert_eq!(arr[1]["errors"][0]["task"], 2);
    assert_eq!(arr[2]["stage"], "load");
    assert_eq!(arr[2]["errors"][0]["kind"], "load");
}

#[test]
fn help_explains_exit_codes() {
    let h = amk().args(["validate", "--help"]).output().unwrap();
    assert_eq!(h.status.code(), Some(0));
    let text = String::from_utf8_lossy(&h.stdout);
    assert!(
        text.contains("Exit status") && text.contains("2  at least one file"),
        "{text}"
    );
}

#[test]
fn no_files_is_a_usage_error() {
    let out = amk().arg("validate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// 40,000 tasks that all write one buffer unordered: every pair races, and the report stays
/// short (a few entries and a count), the run bounded in time and memory (under a 1 GiB
/// address-space limit). Listing every unordered writer took 36 s, 4.65 GB and 129 MB of text.
#[test]
fn a_program_of_40000_racing_writers_is_reported_briefly() {
    let d = scratch("races");
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 8]);
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[1, 8]);
    let c = p.new_counter("y");
    for i in 0..40_000 {
        p.push_task(
            Opcode::COPY,
            &[x],
            &[y],
            c,
            &[],
            Map::new(),
            format!("t{i}"),
        );
    }
    let path = write(&d, "races.json.gz", &p);
    let t0 = std::time::Instant::now();
    let o = limited::amk_limited()
        .arg("validate")
        .arg(&path)
        .output()
        .unwrap();
    let took = t0.elapsed();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{:?}: {out}", o.status);
    assert!(out.contains("[REJECTED]") && out.contains("race"), "{out}");
    assert!(
        o.stdout.len() < 64 << 10,
        "{} bytes of report",
        o.stdout.len()
    );
    assert!(took.as_secs() < 10, "{took:?}");
    let _ = std::fs::remove_dir_all(&d);
}

/// `--max-program-mib` bounds the parsed values too (four times the text): 400 KB of `0,` fit
/// 1 MiB of text but not 4 MiB of values, and are parsed with 16 MiB (then refused as a
/// program).
#[test]
fn the_program_limit_bounds_the_parsed_values() {
    let d = scratch("value-budget");
    let path = d.join("zeros.json");
    std::fs::write(&path, format!("[{}0]", "0,".repeat(200_000))).unwrap();
    let run = |mib: &str| {
        let o = amk()
            .args(["validate", "--max-program-mib", mib])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };
    assert!(run("1").contains("MiB of memory"));
    assert!(!run("16").contains("MiB of memory"));
    let _ = std::fs::remove_dir_all(&d);
}
