//! `--plugin PATH` / `AMK_PLUGINS` on the command line: the example plugin's op is listed
//! with its origin, and a program using it validates and runs on the CPU VM.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_core::json::Map;
use amk_core::{BufferKind, DType, Opcode, Program};
use amk_plugin_abi::PluginRegistry;
use std::path::PathBuf;
use std::process::{Command, Output};

fn amk() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_amk"));
    c.env_remove("AMK_PLUGINS");
    c
}

/// The example's cdylib, built by cargo because this crate dev-depends on the example.
fn example_so() -> PathBuf {
    amk_plugin_abi::find_built_cdylib("amk_plugin_example_gelu_tanh")
        .expect("the example plugin's shared library next to the test executable")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn plugin_row(out: &Output) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    // The 32 built-in opcodes (20 of the ABI, our fused 20-23, NEXT_TOKEN 24, the split-KV
    // pair 25-26, the prefill pair 27-28, TOKEN_NLL 29, ATTENTION_MERGE 30, LOGIT_STATS 31),
    // then the plugin's.
    assert_eq!(rows.len(), 33);
    rows[32].clone()
}

#[test]
fn ops_list_shows_the_plugin_op_with_its_origin() {
    let so = example_so();
    let so_text = so.display().to_string();
    let row = plugin_row(
        &amk()
            .arg("--plugin")
            .arg(&so)
            .args(["ops", "list", "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(row["name"], "example.gelu_tanh");
    assert_eq!(row["code"], 1001);
    assert_eq!(row["origin"], "plugin");
    assert_eq!(row["plugin"], so_text.as_str());
    assert_eq!(row["cpu"], true);
    assert_eq!(row["inputs"]["min"], 1);
    assert_eq!(row["outputs"], 1);
    // The option is global (after the subcommand too), and AMK_PLUGINS works alike.
    let after = amk()
        .args(["ops", "list", "--json", "--plugin"])
        .arg(&so)
        .output()
        .unwrap();
    assert_eq!(plugin_row(&after)["name"], "example.gelu_tanh");
    let env = amk()
        .env("AMK_PLUGINS", format!("::{so_text}"))
        .args(["ops", "list", "--json"])
        .output()
        .unwrap();
    assert_eq!(plugin_row(&env)["origin"], "plugin");
    // Human listing.
    let human = amk()
        .arg("--plugin")
        .arg(&so)
        .args(["ops", "list"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("example.gelu_tanh"))
        .unwrap();
    assert!(line.contains("plugin"), "{line}");
}

#[test]
fn bad_plugins_are_exit_2_with_the_reason() {
    let out = amk()
        .args(["--plugin", "/nonexistent/libx.so", "ops", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no such file"), "{}", stderr(&out));
    // The same plugin twice: the registry's duplicate message.
    let so = example_so();
    let out = amk()
        .arg("--plugin")
        .arg(&so)
        .arg("--plugin")
        .arg(&so)
        .args(["ops", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("already registered"),
        "{}",
        stderr(&out)
    );
}

fn gelu_tanh_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
fn a_program_using_the_plugin_op_validates_and_runs() {
    let so = example_so();
    let mut reg = amk_ops::registry().unwrap();
    reg.load_plugin(&so).unwrap();
    let code = reg.resolve_name("example.gelu_tanh").unwrap();
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 6]);
    let h = p.new_buffer("h", BufferKind::ACTIVATION, DType::F16, &[1, 6]);
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[1, 6]);
    let (ch, cy) = (p.new_counter("h"), p.new_counter("y"));
    p.push_task(code, &[x], &[h], ch, &[], Map::new(), "gelu");
    p.push_task(
        Opcode::ADD,
        &[h, x],
        &[y],
        cy,
        &[(ch, 1)],
        Map::new(),
        "residual",
    );
    let dir = std::env::temp_dir().join(format!("amk-plugin-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prog = dir.join("prog.json");
    p.save(&prog, &reg).unwrap();

    let validate = amk()
        .arg("--plugin")
        .arg(&so)
        .arg("validate")
        .arg(&prog)
        .output()
        .unwrap();
    assert_eq!(
        validate.status.code(),
        Some(0),
        "stderr: {}",
        stderr(&validate)
    );

    let xs = [-3.0f64, -1.25, -0.5, 0.0, 0.75, 2.5];
    let set: Vec<String> = xs.iter().map(|v| v.to_string()).collect();
    let out = amk()
        .arg("--plugin")
        .arg(&so)
        .arg("run")
        .arg(&prog)
        .args(["--set", &format!("x={}", set.join(",")), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got = doc["outputs"]["y"]["data"].as_array().unwrap();
    for (g, &x) in got.iter().zip(&xs) {
        let want = gelu_tanh_f64(x) + x;
        let g = g.as_f64().unwrap();
        // h is F16: rounding error of the activation.
        assert!(
            (g - want).abs() <= 2e-3 * (1.0 + want.abs()),
            "x={x}: {g} vs {want}"
        );
    }

    // Without the plugin the program names an unknown op.
    let out = amk().arg("run").arg(&prog).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("example.gelu_tanh"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
