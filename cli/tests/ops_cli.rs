//! `amk ops list`: one row per registered opcode, human and JSON.
#![allow(clippy::unwrap_used)] // test file

use std::process::{Command, Output};

/// `amk ARGS...`, run to completion.
fn amk(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_amk"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn ops_list_json_has_every_builtin_opcode() {
    let out = amk(&["ops", "list", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(
        rows.len(),
        32,
        "the 20 ABI opcodes, our fused 20-23, NEXT_TOKEN (24), ATTENTION_SPLIT and COMBINE_GEMV \
         (25, 26), LINEAR_TILE and ATTENTION_CAUSAL (27, 28), TOKEN_NLL (29), ATTENTION_MERGE (30), \
         LOGIT_STATS (31)"
    );
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["code"], i);
        assert_eq!(row["origin"], "built-in");
        assert_eq!(row["cpu"], true, "{} has a CPU reference", row["name"]);
        assert_eq!(
            row["cuda"], true,
            "{} has a CUDA device function",
            row["name"]
        );
        assert!(row["required_params"].is_array());
    }
    let gemv = &rows[5];
    assert_eq!(gemv["name"], "GEMV_TILE");
    assert_eq!(gemv["inputs"]["min"], 2);
    assert_eq!(gemv["inputs"]["max"], 4);
    assert_eq!(gemv["required_params"][0]["name"], "K");
    assert_eq!(gemv["required_params"][0]["type"], "int");
    assert_eq!(
        rows[19]["inputs"]["max"],
        serde_json::Value::Null,
        "FUSED is variadic"
    );
    let qkv = &rows[22];
    assert_eq!(qkv["name"], "QKV_ROPE_APPEND");
    assert_eq!(qkv["outputs"], 3);
    let att = &rows[23];
    assert_eq!(att["name"], "ATTENTION_GEMV");
    assert_eq!(att["inputs"]["min"], 4);
    assert_eq!(att["inputs"]["max"], 6);
    let next = &rows[24];
    assert_eq!(next["name"], "NEXT_TOKEN");
    assert_eq!(next["inputs"]["min"], 6);
    assert_eq!(next["outputs"], 4);
    let split = &rows[25];
    assert_eq!(split["name"], "ATTENTION_SPLIT");
    assert_eq!(
        (
            split["inputs"]["min"].clone(),
            split["inputs"]["max"].clone()
        ),
        (4.into(), 4.into())
    );
    let combine = &rows[26];
    assert_eq!(combine["name"], "COMBINE_GEMV");
    assert_eq!(combine["inputs"]["min"], 3);
}

#[test]
fn ops_list_prints_a_table() {
    let out = amk(&["ops", "list"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 33, "{text}");
    assert!(text.contains("LINEAR_TILE") && text.contains("ATTENTION_CAUSAL"));
    assert!(text.contains("TOKEN_NLL") && text.contains("ATTENTION_MERGE"));
    assert!(text.contains("LOGIT_STATS") && text.contains("cols:int"));
    assert!(text.contains("ATTENTION_COMBINE") && text.contains("recipe:object"));
    assert!(text.contains("GATE_UP_SILU") && text.contains("QKV_ROPE_APPEND"));
    assert!(text.contains("ATTENTION_GEMV") && text.contains("NEXT_TOKEN"));
    assert!(text.contains("ATTENTION_SPLIT") && text.contains("COMBINE_GEMV"));
}

#[test]
fn ops_compile_rejects_a_malformed_architecture() {
    let out = amk(&["ops", "compile", "--arch", "hopper"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'hopper' is not an architecture name"),
        "{err}"
    );
}

/// `--list` names every kernel of the default set without compiling (on any build): every
/// op's, and the Llama programs' by dtype, one per distinct kernel of the preset shapes
/// (SmolLM2's rows take a smaller pass; a long prompt chunk's kernel holds the widest tile).
#[test]
fn ops_compile_lists_the_default_kernels() {
    let dir = std::env::temp_dir().join(format!("amk-ops-compile-{}", std::process::id()));
    let out = amk(&[
        "ops",
        "compile",
        "--arch",
        "sm_90a",
        "--cache-dir",
        dir.to_str().unwrap(),
        "--list",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let listed = String::from_utf8_lossy(&out.stdout);
    for what in [
        "any",
        "f32 tuned, argmax, llama-3.2-1b",
        "f16 default, llama-3.2-1b",
        "bf16 tuned, llama-3.2-1b",
        "bf16 tuned, smollm2-135m",
        "bf16 tuned short-context, decode loop, llama-3.2-1b",
        // A short prompt chunk's kernel and a long one's (whose gate/up grid takes the
        // widest row block on sm_90); f32 prompts have one.
        "bf16 prefill of 16 rows (Last logits), llama-3.2-1b",
        "bf16 prefill of 2048 rows (Last logits), llama-3.2-1b",
        "f32 prefill of 16 rows (Last logits), llama-3.2-1b",
    ] {
        assert!(
            listed.lines().any(|l| l == format!("sm_90a ({what})")),
            "{what}: {listed}"
        );
    }
    assert!(
        !listed.contains("f32 prefill of 2048 rows"),
        "an f32 prompt has no widest tiles: {listed}"
    );
    assert!(!dir.exists(), "nothing is written");
}

#[test]
fn ops_compile_rejects_an_unknown_dtype() {
    let out = amk(&["ops", "compile", "--arch", "sm_90a", "--dtype", "int8"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'int8' is not one of any, f32, f16, bf16"),
        "{err}"
    );
}

#[test]
fn ops_compile_rejects_an_unknown_shape() {
    let out = amk(&["ops", "compile", "--arch", "sm_90a", "--shape", "llama-9b"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown model shape 'llama-9b' (known: ") && err.contains("smollm2-135m"),
        "{err}"
    );
}

/// `amk ops compile` of the bf16 SmolLM2 kernels for sm_90a into `cache`, with `extra` flags.
fn compile_smollm2_bf16(cache: &std::path::Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "ops",
        "compile",
        "--arch",
        "sm_90a",
        "--dtype",
        "bf16",
        "--shape",
        "smollm2-135m",
        "--cache-dir",
        cache.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    amk(&args)
}

#[test]
fn ops_compile_takes_only_the_shapes_named() {
    let dir = std::env::temp_dir().join(format!("amk-ops-shape-{}", std::process::id()));
    let out = compile_smollm2_bf16(&dir, &["--list"]);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stdout);
    assert!(err.contains("sm_90a (bf16 tuned, smollm2-135m)"), "{err}");
    assert!(
        !err.contains("llama-3.2-1b") && !err.contains("f32 "),
        "{err}"
    );
    assert!(!dir.exists(), "nothing is written");
}

#[test]
fn ops_compile_takes_the_schedules_named_and_their_traced_kernels() {
    let dir = std::env::temp_dir().join(format!("amk-ops-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A schedule of fused tiles with the attention fused into the output projection.
    let cfg = dir.join("fused.json");
    std::fs::write(
        &cfg,
        r#"{"tiling": {"gemv": {"sm_multiple": 1}},
            "fusion_grouping": [["gemv", "add"], ["rmsnorm", "gemv"], ["attention", "gemv"]]}"#,
    )
    .unwrap();
    let cache = dir.join("cubin");
    let out = compile_smollm2_bf16(
        &cache,
        &["--config", cfg.to_str().unwrap(), "--traced", "--list"],
    );
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stdout);
    let name = cfg.display().to_string();
    for what in [
        format!("bf16 {name}, smollm2-135m"),
        format!("bf16 {name}, smollm2-135m, traced"),
        format!("bf16 {name}, argmax, smollm2-135m, traced"),
    ] {
        assert!(err.contains(&format!("sm_90a ({what})\n")), "{what}: {err}");
    }
    // The schedule replaces the tuned and the reference one.
    assert!(
        !err.contains("bf16 tuned") && !err.contains("bf16 default"),
        "{err}"
    );
    assert!(!cache.exists(), "nothing is written");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn ops_compile_rejects_an_unreadable_schedule() {
    let out = amk(&[
        "ops",
        "compile",
        "--arch",
        "sm_90a",
        "--config",
        "/nonexistent/cfg.json",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/cfg.json"), "{err}");
}

/// Without the cuda feature `ops compile` refuses once, up front, with exit status 2 (not one
/// error per kernel and exit 1).
#[test]
fn ops_compile_without_cuda_refuses_once() {
    if cfg!(feature = "cuda") {
        return; // this build has the backend: the compile itself is a GPU-machine test
    }
    let out = amk(&["ops", "compile", "--arch", "sm_90a"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--features cuda"), "{err}");
}

/// `--version` names the commit and the build's features.
#[test]
fn version_names_the_commit_and_the_features() {
    let out = amk(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(v.starts_with("amk 0."), "{v}");
    assert!(v.contains("(commit ") && v.contains(", features: "), "{v}");
    assert_eq!(v.contains("features: cuda"), cfg!(feature = "cuda"), "{v}");
}

/// `completions SHELL` prints a completion script that knows the subcommands; an unknown shell
/// is a usage error.
#[test]
fn completions_know_the_subcommands() {
    let out = amk(&["completions", "bash"]);
    assert_eq!(out.status.code(), Some(0));
    let script = String::from_utf8_lossy(&out.stdout);
    for word in ["generate", "perplexity", "bench", "--max-tokens"] {
        assert!(script.contains(word), "{word}");
    }
    let out = amk(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
}

/// docs/cli.md is the reference `--help` agrees with: every flag a command's `--help` lists
/// (but `--help` and the global `--plugin`, `--verbose` and `--quiet`, described once with the
/// conventions, which must name them) appears in that command's section.
#[test]
fn cli_reference_lists_every_flag() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md"),
    )
    .unwrap();
    let section = |title: &str| -> String {
        let start = doc
            .find(&format!("## `amk {title}"))
            .unwrap_or_else(|| panic!("docs/cli.md has no section for {title}"));
        let rest = &doc[start + 3..];
        assert!(doc.contains("`-v`, `--verbose`") && doc.contains("`--plugin PATH`"));
        assert!(doc.contains("`-q`, `--quiet`"));
        rest[..rest.find("\n## ").unwrap_or(rest.len())].to_string()
    };
    for (args, title) in [
        (&["generate"][..], "generate"),
        (&["perplexity"][..], "perplexity"),
        (&["bench"][..], "bench"),
        (&["lower"][..], "lower"),
        (&["validate"][..], "validate"),
        (&["run"][..], "run"),
        (&["ops", "list"][..], "ops list"),
        (&["ops", "compile"][..], "ops list"),
        (&["completions"][..], "completions"),
    ] {
        let mut a = args.to_vec();
        a.push("--help");
        let out = amk(&a);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        let text = section(title);
        for flag in help
            .lines()
            // option lines only (`  -n, --max-tokens <N>`, `      --json`), not descriptions
            .filter(|l| l.trim_start().starts_with('-'))
            .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("--")))
            .map(|w| w.trim_end_matches([',', '.']).to_string())
            .filter(|f| !["--help", "--plugin", "--verbose", "--quiet"].contains(&f.as_str()))
        {
            assert!(
                text.contains(&format!("`{flag}"))
                    || text.contains(&format!(", `{flag}"))
                    || text.contains(&format!("{flag} ")),
                "docs/cli.md `amk {title}` does not list {flag}"
            );
        }
    }
}

/// Every `--seed` of amk has one default, 0: the sampler's (`generate`) and the synthetic
/// weights' (`bench`) alike.
#[test]
fn every_seed_defaults_to_zero() {
    for cmd in ["generate", "bench"] {
        let out = amk(&[cmd, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{cmd}");
        let help = String::from_utf8_lossy(&out.stdout);
        let start = help
            .find("--seed")
            .unwrap_or_else(|| panic!("{cmd} --help has no --seed"));
        let entry = &help[start..];
        let entry = &entry[..entry.find("\n  -").unwrap_or(entry.len())];
        assert!(entry.contains("[default: 0]"), "{cmd}: {entry}");
    }
}

/// A tuning variable with a value it does not take stops `amk ops compile` with its name,
/// instead of compiling a kernel without the knob the user meant.
#[test]
fn ops_compile_refuses_a_knob_value_by_name() {
    let dir = std::env::temp_dir().join(format!("amk-ops-env-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_amk"))
        .args(["ops", "compile", "--arch", "sm_90a", "--dtype", "bf16"])
        .args(["--shape", "smollm2-135m", "--list", "--cache-dir"])
        .arg(&dir)
        .env("AMK_CUDA_SMEM_KB", "lots")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("AMK_CUDA_SMEM_KB") && err.contains("lots"),
        "{err}"
    );
    assert!(!dir.exists(), "nothing is written");
}

/// A committed tiny checkpoint (GGUF).
fn tiny_gguf() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/reference/gguf/tiny-llama3.gguf"
    )
    .to_string()
}

/// `--model` names the kernels of the programs an engine loads for that file, lowered from
/// it: its decode loop and short-context loop in bf16 and f32 (the default dtypes: the
/// engine's and `amk bench`'s gate), and no preset's; a prompt chunk longer than the cache
/// has no program, so this model of 256 positions lists none.
#[test]
fn ops_compile_lists_a_model_files_programs() {
    let model = tiny_gguf();
    let out = amk(&[
        "ops",
        "compile",
        "--arch",
        "sm_90a",
        "--model",
        &model,
        "--max-seq",
        "256",
        "--list",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8_lossy(&out.stdout);
    for what in [
        "bf16 tuned decode loop",
        "bf16 tuned short-context decode loop",
        "f32 tuned decode loop",
        "f32 tuned short-context decode loop",
    ] {
        assert!(
            listed
                .lines()
                .any(|l| l == format!("sm_90a ({what}, {model})")),
            "{what}: {listed}"
        );
    }
    assert_eq!(listed.lines().count(), 4, "{listed}");
    let only = amk(&[
        "ops", "compile", "--arch", "sm_90a", "--model", &model, "--dtype", "bf16", "--regime",
        "decode", "--list",
    ]);
    assert_eq!(only.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&only.stdout).lines().count(), 2);
}

/// `--model` refuses what names no model program, a missing file, a preset shape beside it,
/// and a selection that leaves none of the model's programs (this model's 256 positions take
/// no 512-row prompt chunk); `--max-seq` needs `--model`; a cache longer than the model's
/// positions is a lowering error (exit 1) that says so.
#[rstest::rstest]
#[case::any(&["--model", "M", "--dtype", "any"], 2, "--dtype any names no model program")]
#[case::missing(&["--model", "/nonexistent/m.gguf"], 2, "no such file or directory")]
#[case::shape(&["--model", "M", "--shape", "smollm2-135m"], 2, "cannot be used with")]
#[case::max_seq_alone(&["--max-seq", "16"], 2, "--model <PATH>")]
#[case::too_long(&["--model", "M", "--max-seq", "600"], 1, "max_position_embeddings (256)")]
#[case::nothing_selected(&["--model", "M", "--regime", "prefill"], 2, "no program of the engine's")]
fn ops_compile_model_refusals(#[case] extra: &[&str], #[case] code: i32, #[case] says: &str) {
    let model = tiny_gguf();
    let mut args = vec!["ops", "compile", "--arch", "sm_90a", "--list"];
    args.extend(
        extra
            .iter()
            .map(|a| if *a == "M" { model.as_str() } else { a }),
    );
    let out = amk(&args);
    assert_eq!(out.status.code(), Some(code), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(says), "{args:?}: {err}");
}
