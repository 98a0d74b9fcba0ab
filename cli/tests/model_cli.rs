//! `amk lower`, `amk generate`, `amk perplexity` end to end on the committed tiny HF
//! checkpoints (plus a byte-level tokenizer.json written here) and, through the default-model
//! path, on SmolLM2-135M against HuggingFace's greedy continuation; every kind of bad input is
//! a typed message with exit status 2, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

mod common;
use amk_core::WeightStore;
use common::{backend_line, gpu};
use std::path::Path;
use std::process::{Command, Output};

mod tiny;
use tiny::{reference, scratch, tiny_with_tokenizer};

fn amk() -> Command {
    Command::new(env!("CARGO_BIN_EXE_amk"))
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}\n{}", text(o)))
}

#[test]
fn lower_writes_a_program_that_validates() {
    let d = scratch("lower");
    let prog = d.join("prog.json");
    let cfg = d.join("cfg.json");
    std::fs::write(
        &cfg,
        r#"{"tiling": {"gemv": {"N_tile": 16}, "attention": {"n_partitions": 4}},
            "fusion_grouping": [["embed", "rope"]], "sm_assignment": "round_robin",
            "page_allocation": "graph_color"}"#,
    )
    .unwrap();
    let o = amk()
        .args(["lower", "--model"])
        .arg(reference("tiny-mqa"))
        .args(["--config"])
        .arg(&cfg)
        .args([
            "--decode-loop",
            "--dtype",
            "bf16",
            "--max-seq",
            "32",
            "--json",
            "-o",
        ])
        .arg(&prog)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v = json(&o);
    assert!(v["tasks"].as_u64().unwrap() > 50, "{v}");
    assert!(v["pages"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["sm_assigned"], serde_json::Value::Bool(true));
    let o = amk().arg("validate").arg(&prog).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let body = std::fs::read_to_string(&prog).unwrap();
    assert!(
        body.contains("\"bfloat16\"") || body.contains("BF16"),
        "dtype recorded"
    );
    assert!(
        body.contains("\"step_loop\"") && body.contains("NEXT_TOKEN"),
        "a decode loop"
    );
}

#[test]
fn generate_and_perplexity_on_an_hf_directory() {
    let d = tiny_with_tokenizer("tiny-gqa", "gen");
    let run = |extra: &[&str]| {
        amk()
            .args(["generate", "--model"])
            .arg(&d)
            .args([
                "--prompt",
                "hello world",
                "-n",
                "6",
                "--ignore-eos",
                "--json",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let a = run(&[]);
    assert!(a.status.success(), "{}", text(&a));
    let v = json(&a);
    let prompt: Vec<u64> = v["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    // "he" "ll" " o"... merged by the tokenizer written above.
    assert_eq!(prompt[..2], [256, 257], "{v}");
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 6, "{v}");
    assert!(v["text"].is_string());
    // Deterministic, and independent of the schedule.
    let cfg = d.join("cfg.json");
    std::fs::write(&cfg, r#"{"tiling": {"gemv": {"N_tile": 8}, "attention": {"n_partitions": 3}}, "sm_assignment": "round_robin"}"#).unwrap();
    let b = run(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(
        json(&b)["generated_ids"],
        v["generated_ids"],
        "{}",
        text(&b)
    );
    // The named schedules too (`tuned` is what the CUDA backend runs by default).
    for name in ["tuned", "default"] {
        let c = run(&["--backend", "cpu", "--config", name]);
        assert_eq!(
            json(&c)["generated_ids"],
            v["generated_ids"],
            "{name}: {}",
            text(&c)
        );
    }

    let t = d.join("text.txt");
    std::fs::write(&t, "hello hello world, hello!").unwrap();
    let o = amk()
        .args(["perplexity", "--model"])
        .arg(&d)
        .arg("--text-file")
        .arg(&t)
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let p = json(&o);
    let nll = p["nll"].as_f64().unwrap();
    assert!(nll > 0.0 && nll.is_finite(), "{p}");
    assert!((p["perplexity"].as_f64().unwrap() - nll.exp()).abs() < 1e-9 * nll.exp());
    assert!(p["tokens"].as_u64().unwrap() > 5);
    // The same text inline (`--text`) and piped on standard input scores the same.
    let inline = amk()
        .args(["perplexity", "--json", "--model"])
        .arg(&d)
        .args(["--text", "hello hello world, hello!"])
        .output()
        .unwrap();
    assert!(inline.status.success(), "{}", text(&inline));
    let piped = with_stdin(
        amk().args(["perplexity", "--json", "--model"]).arg(&d),
        b"hello hello world, hello!",
    );
    assert!(piped.status.success(), "{}", text(&piped));
    for other in [&inline, &piped] {
        assert_eq!(json(other)["nll"], p["nll"], "{}", text(other));
    }

    // Plain output streams the prompt and continuation, with a tokens/s line on stderr.
    let o = amk()
        .args(["generate", "--model"])
        .arg(&d)
        .args(["--prompt", "hello", "-n", "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("hello"));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("tok/s"),
        "{}",
        text(&o)
    );
}

fn expect_usage_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(2), "{}", text(o));
    let all = text(o);
    assert!(all.contains(needle), "expected {needle:?} in\n{all}");
    assert!(!all.contains("panicked"), "{all}");
}

#[test]
fn bad_models_are_typed_errors_with_exit_2() {
    let d = scratch("bad");
    let generate = |model: &Path| {
        amk()
            .args(["generate", "--model"])
            .arg(model)
            .args(["--prompt", "hi", "-n", "2"])
            .output()
            .unwrap()
    };
    // Not a model at all; missing path.
    let junk = d.join("junk.bin");
    std::fs::write(&junk, b"hello, not a model").unwrap();
    expect_usage_error(&generate(&junk), "not a model");
    expect_usage_error(&generate(&d.join("absent.gguf")), "no such file");
    // A GGUF cut short.
    let gguf = d.join("cut.gguf");
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(5u64.to_le_bytes()); // 5 tensors announced, nothing follows
    std::fs::write(&gguf, &bytes).unwrap();
    expect_usage_error(&generate(&gguf), "GGUF");
    // A truncated safetensors file.
    let t = tiny_with_tokenizer("tiny-gqa", "trunc");
    let st = t.join("model.safetensors");
    let all = std::fs::read(&st).unwrap();
    std::fs::write(&st, &all[..all.len() / 2]).unwrap();
    expect_usage_error(&generate(&t), "safetensors");
    // A missing tensor.
    let t = tiny_with_tokenizer("tiny-gqa", "missing");
    let st = t.join("model.safetensors");
    let mut w = WeightStore::load_safetensors(&st).unwrap();
    w.remove("model.layers.1.mlp.up_proj.weight").unwrap();
    w.save_safetensors(&st).unwrap();
    expect_usage_error(
        &generate(&t),
        "missing tensor 'model.layers.1.mlp.up_proj.weight'",
    );
    // Shapes that disagree with the config.
    let t = tiny_with_tokenizer("tiny-gqa", "shape");
    let cfg = std::fs::read_to_string(t.join("config.json"))
        .unwrap()
        .replace("\"intermediate_size\": 160", "\"intermediate_size\": 176");
    assert!(cfg.contains("176"));
    std::fs::write(t.join("config.json"), cfg).unwrap();
    expect_usage_error(&generate(&t), "expected [176, 64]");
    // An unsupported architecture: every reason listed.
    let t = tiny_with_tokenizer("tiny-gqa", "arch");
    let cfg = std::fs::read_to_string(t.join("config.json"))
        .unwrap()
        .replace(
            "\"model_type\": \"llama\"",
            "\"model_type\": \"mixtral\", \"num_local_experts\": 8",
        )
        .replace("\"mlp_bias\": false", "\"mlp_bias\": true");
    std::fs::write(t.join("config.json"), cfg).unwrap();
    let o = generate(&t);
    expect_usage_error(&o, "mixtral");
    let msg = text(&o);
    assert!(msg.contains("expert") && msg.contains("bias"), "{msg}");
    // No tokenizer.
    expect_usage_error(&generate(&reference("tiny-gqa")), "tokenizer");
}

/// Runs `cmd` with `input` piped on its standard input.
fn with_stdin(cmd: &mut Command, input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn bad_arguments_are_typed_errors_with_exit_2() {
    let d = tiny_with_tokenizer("tiny-gqa", "args");
    let base = || {
        let mut c = amk();
        c.args(["generate", "--model"]).arg(&d);
        c
    };
    // A prompt longer than the KV cache.
    let o = base()
        .args([
            "--prompt",
            "hello hello hello hello hello",
            "--max-seq",
            "4",
            "-n",
            "1",
        ])
        .output()
        .unwrap();
    expect_usage_error(&o, "KV cache");
    assert!(
        o.stdout.is_empty(),
        "nothing printed before the refusal: {}",
        text(&o)
    );
    // A budget beyond the cache generates until the cache is full, and says so.
    let o = base()
        .args([
            "--prompt",
            "hi",
            "-n",
            "100000",
            "--max-seq",
            "8",
            "--ignore-eos",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(json(&o)["finish"], "context_full", "{}", text(&o));
    // Each bad argument: its usage error; those checked before the import (no backend line
    // yet) marked so. Negative numbers are values, not flags: the range checks answer.
    let cfg = d.join("bad.json");
    std::fs::write(&cfg, r#"{"tiling": {"gemv": {"N_tiles": 8}}}"#).unwrap();
    let cfg = cfg.to_str().unwrap();
    let cases: [(&[&str], &str, bool); 9] = [
        (
            &["--prompt", "hi", "--max-seq", "4000"],
            "max_position_embeddings",
            false,
        ),
        (&["--prompt", "hi", "--dtype", "int3"], "--dtype", true),
        (&["--prompt", "hi", "--target", "tpu"], "unknown GPU", false),
        (
            &["--prompt", "hi", "--backend", "metal"],
            "invalid value 'metal'",
            false,
        ),
        (&["--prompt", "hi", "--config", cfg], "N_tiles", false),
        (
            &["--prompt-file", "/nonexistent/prompt.txt"],
            "prompt.txt",
            false,
        ),
        (
            &["--prompt", "hi", "--temperature", "-1"],
            "temperature -1 must be a finite number >= 0",
            true,
        ),
        (&["--prompt", "hi", "-n", "-1"], "invalid value '-1'", false),
        (
            &["--prompt", "hi", "--threads", "0"],
            "must be at least 1",
            false,
        ),
    ];
    for (args, needle, before_backend) in cases {
        let o = base().args(args).output().unwrap();
        expect_usage_error(&o, needle);
        assert!(
            !before_backend || !String::from_utf8_lossy(&o.stderr).contains("backend:"),
            "{args:?}: an argument error comes before the backend line: {}",
            text(&o)
        );
    }
    // No prompt: none is made up. Standard input holds it, or the error says what to give.
    let o = base()
        .args(["-n", "1"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    expect_usage_error(
        &o,
        "no prompt: standard input was empty; give --prompt TEXT",
    );
    // perplexity's text likewise: inline, a file or standard input, never two of them.
    let ppl = || {
        let mut c = amk();
        c.args(["perplexity", "--model"]).arg(&d);
        c
    };
    let o = ppl().stdin(std::process::Stdio::null()).output().unwrap();
    expect_usage_error(
        &o,
        "no text: standard input was empty; give --text TEXT or --text-file FILE",
    );
    let o = ppl()
        .args(["--text", "hi there", "--text-file", "x.txt"])
        .output()
        .unwrap();
    expect_usage_error(&o, "cannot be used with");
    let o = ppl().args(["--text", ""]).output().unwrap();
    expect_usage_error(&o, "--text: ");
    let piped = with_stdin(
        base().args(["-n", "2", "--ignore-eos", "--json", "--backend", "cpu"]),
        b"hello world",
    );
    assert!(piped.status.success(), "{}", text(&piped));
    let given = base()
        .args([
            "--prompt",
            "hello world",
            "-n",
            "2",
            "--ignore-eos",
            "--json",
            "--backend",
            "cpu",
        ])
        .output()
        .unwrap();
    assert_eq!(
        json(&piped)["prompt_ids"],
        json(&given)["prompt_ids"],
        "{}",
        text(&piped)
    );
    // --json failures are one JSON object.
    let o = base()
        .args(["--prompt", "hi", "--dtype", "int3", "--json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(json(&o)["error"]["kind"], "usage");
}

#[test]
fn backend_choice_on_generate_and_perplexity() {
    let d = tiny_with_tokenizer("tiny-mqa", "backend");
    let t = d.join("text.txt");
    std::fs::write(&t, "hello world, hello").unwrap();
    let ppl = |extra: &[&str]| {
        amk()
            .args(["perplexity", "--model"])
            .arg(&d)
            .arg("--text-file")
            .arg(&t)
            .args(["--max-seq", "64", "--json"])
            .args(extra)
            .output()
            .unwrap()
    };
    // --backend cpu: the CPU VM as before, in every dtype; stdout is pure JSON.
    let mut cpu = None;
    for dtype in ["f32", "f16", "bf16"] {
        let o = ppl(&["--backend", "cpu", "--dtype", dtype]);
        assert!(o.status.success(), "{dtype}: {}", text(&o));
        assert_eq!(backend_line(&o), "backend: cpu");
        let v = json(&o);
        assert_eq!(v["backend"], "cpu", "{v}");
        assert!(v["nll"].as_f64().unwrap().is_finite(), "{v}");
        if dtype == "f32" {
            cpu = Some(v);
        }
    }
    let cpu = cpu.unwrap();
    // The default (auto): the GPU if there is one, else the CPU with the reason.
    let o = ppl(&[]);
    assert!(o.status.success(), "{}", text(&o));
    let line = backend_line(&o);
    let v = json(&o);
    match gpu() {
        Ok(info) => {
            assert_eq!(line, format!("backend: cuda ({info})"));
            assert_eq!(v["backend"], "cuda");
            let (a, b) = (v["nll"].as_f64().unwrap(), cpu["nll"].as_f64().unwrap());
            assert!(
                (a - b).abs() < 1e-3 * b.abs().max(1.0),
                "cuda {a} vs cpu {b}"
            );
        }
        Err(why) => {
            common::assert_cpu_fallback(&line, &why);
            // The same result; the timings differ run to run.
            let untimed = |mut v: serde_json::Value| {
                for k in ["score_s", "tokens_per_s"] {
                    assert!(v[k].as_f64().is_some_and(|t| t > 0.0), "{k} in {v}");
                    v.as_object_mut().unwrap().remove(k);
                }
                v
            };
            assert_eq!(untimed(v), untimed(cpu));
        }
    }

    // generate --backend cpu / auto: the summary names the backend that ran.
    let gen_args = ["--prompt", "hello", "-n", "2", "--ignore-eos"];
    let o = amk()
        .args(["generate", "--model"])
        .arg(&d)
        .args(gen_args)
        .args(["--backend", "cpu", "--dtype", "bf16"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(backend_line(&o), "backend: cpu");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("backend cpu]"),
        "{}",
        text(&o)
    );
    let o = amk()
        .args(["generate", "--model"])
        .arg(&d)
        .args(gen_args)
        .args(["--backend", "auto", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let want = if gpu().is_ok() { "cuda" } else { "cpu" };
    assert_eq!(json(&o)["backend"], want);
    assert!(backend_line(&o).starts_with(&format!("backend: {want}")));

    // --backend cuda without a usable GPU: exit 2 with the reason (plain and --json).
    if let Err(why) = gpu() {
        let why = why.lines().next().unwrap().to_string();
        let needle = if cfg!(feature = "cuda") {
            why.as_str()
        } else {
            "built without the `cuda` feature"
        };
        let o = amk()
            .args(["generate", "--model"])
            .arg(&d)
            .args(gen_args)
            .args(["--backend", "cuda"])
            .output()
            .unwrap();
        expect_usage_error(&o, needle);
        expect_usage_error(&o, "--backend cuda: the CUDA backend is unavailable");
        let o = ppl(&["--backend", "cuda"]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let v = json(&o);
        assert_eq!(v["error"]["kind"], "backend", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle) && msg.contains("cuda"), "{msg}");
    }
}

/// README's first command's path: no `--model` → the default SmolLM2-135M (fetched and cached
/// on first use, or `$AMK_TEST_GGUF`), reproducing HuggingFace's greedy continuation.
#[test]
fn default_model_reproduces_the_hf_continuation() {
    let refdoc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reference("smollm2_hf.json")).unwrap())
            .unwrap();
    let p = refdoc["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "python_function")
        .unwrap();
    let mut c = amk();
    c.args([
        "generate",
        "--prompt",
        p["text"].as_str().unwrap(),
        "-n",
        "16",
        "--ignore-eos",
        "--max-seq",
        "64",
        "--json",
    ]);
    if let Some(g) = std::env::var_os("AMK_TEST_GGUF") {
        c.arg("--model").arg(g);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v = json(&o);
    assert_eq!(v["prompt_ids"], p["prompt_ids"]);
    let want: Vec<_> = p["generated_ids"].as_array().unwrap()[..16].to_vec();
    assert_eq!(v["generated_ids"].as_array().unwrap(), &want);
}

/// `--chat` shows turns as turns: the user's prompt on its own line, marked `> `, the reply on
/// the next line (never glued onto the prompt), the summary saying why it stopped.
#[test]
fn chat_shows_the_user_turn_and_the_reply_apart() {
    let mut c = amk();
    c.args([
        "generate",
        "--chat",
        "--prompt",
        "What is the capital of France? Answer in one sentence.",
        "-n",
        "24",
        "--max-seq",
        "128",
    ]);
    if let Some(g) = std::env::var_os("AMK_TEST_GGUF") {
        c.arg("--model").arg(g);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("> What is the capital of France? Answer in one sentence."),
        "{out}"
    );
    let reply = lines.next().unwrap_or_default();
    assert!(reply.contains("Paris"), "{out}");
    assert!(!reply.contains("<|im_end|>"), "{out}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("stopped at an end token"),
        "{}",
        text(&o)
    );
}

#[test]
fn sampling_is_seeded_and_checked() {
    let d = tiny_with_tokenizer("tiny-mqa", "sample");
    let run = |extra: &[&str]| {
        amk()
            .args(["generate", "--model"])
            .arg(&d)
            .args(["--prompt", "hello", "-n", "12", "--ignore-eos", "--json"])
            .args(extra)
            .output()
            .unwrap()
    };
    let greedy = json(&run(&[]))["generated_ids"].clone();
    let a = json(&run(&["--temperature", "1.5", "--seed", "7"]))["generated_ids"].clone();
    let b = json(&run(&["--temperature", "1.5", "--seed", "7"]))["generated_ids"].clone();
    let c = json(&run(&["--temperature", "1.5", "--seed", "8"]))["generated_ids"].clone();
    assert_eq!(a, b, "same seed, same tokens");
    assert!(
        a != greedy || c != greedy,
        "sampling at T=1.5 never left the greedy path"
    );
    // top-p so small that only the most likely token survives = greedy.
    let nucleus = json(&run(&[
        "--temperature",
        "1.0",
        "--top-p",
        "1e-9",
        "--seed",
        "3",
    ]))["generated_ids"]
        .clone();
    assert_eq!(nucleus, greedy);
    expect_usage_error(&run(&["--temperature=-1"]), "temperature");
    expect_usage_error(&run(&["--top-p", "1.5"]), "top-p");
}

/// `--config tuned` and `--config default` name the two built-in schedules: `default` is what
/// `amk lower` uses without `--config`, and `tuned` lays the projections out over the target's
/// SMs (more, smaller GEMV tiles than the reference tiling on this tiny model).
#[test]
fn lower_takes_the_named_schedules() {
    let d = scratch("lower-named");
    let tasks = |extra: &[&str]| {
        let o = amk()
            .args(["lower", "--model"])
            .arg(reference("tiny-gqa"))
            .args(["--json", "-o"])
            .arg(d.join("p.json"))
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{extra:?}: {}", text(&o));
        json(&o)["tasks"].as_u64().unwrap()
    };
    let (plain, default, tuned) = (
        tasks(&[]),
        tasks(&["--config", "default"]),
        tasks(&["--config", "tuned"]),
    );
    assert_eq!(plain, default);
    assert_ne!(
        tuned, default,
        "the tuned schedule should change the tiling"
    );
}

/// A long prompt on the CPU VM reports its progress on stderr, launch by launch (decode passes)
/// or chunk by chunk (the prefill program); `-q` leaves stderr empty (no backend line,
/// progress or summary) and the text the same, and so does the prefill program.
#[test]
fn cpu_prompt_progress_and_quiet() {
    let d = tiny_with_tokenizer("tiny-gqa", "progress");
    let run = |extra: &[&str]| {
        let mut c = amk();
        c.args(["generate", "--model"]).arg(&d).args([
            "--prompt",
            &"abcdefgh".repeat(8),
            "-n",
            "2",
            "--ignore-eos",
            "--backend",
            "cpu",
        ]);
        c.args(extra).output().unwrap()
    };
    let steps = |o: &std::process::Output| -> Vec<String> {
        (String::from_utf8_lossy(&o.stderr).lines())
            .filter(|l| l.starts_with("[prompt: "))
            .map(|l| l.split(',').next().unwrap_or("").to_string())
            .collect()
    };
    let o = run(&["--prefill-rows", "0"]);
    assert!(o.status.success(), "{}", text(&o));
    let s = steps(&o);
    assert!(s.len() >= 3, "{}", text(&o));
    assert!(s[0].starts_with("[prompt: 16/"), "{}", text(&o));
    let chunked = run(&["--prefill-rows", "16"]);
    assert!(chunked.status.success(), "{}", text(&chunked));
    let s = steps(&chunked);
    assert_eq!(s.len(), 4, "{}", text(&chunked));
    // The prompt programs write every prompt row (their logits of the last choose the first
    // token).
    assert!(
        s[0].starts_with("[prompt: 16/") && s[3].starts_with("[prompt: 64/"),
        "{s:?}"
    );
    assert_eq!(chunked.stdout, o.stdout, "the prefill program's text");
    let q = run(&["-q"]);
    assert!(q.status.success(), "{}", text(&q));
    assert!(q.stderr.is_empty(), "{}", text(&q));
    assert_eq!(q.stdout, o.stdout);
}

/// A model file that fails to import is named in the error (text and `--json`), exit 2.
#[test]
fn a_broken_model_file_is_named() {
    let d = scratch("broken-gguf");
    let f = d.join("half.gguf");
    // The GGUF magic and a version, then nothing: a truncated file.
    std::fs::write(&f, b"GGUF\x03\x00\x00\x00").unwrap();
    let o = amk()
        .args(["generate", "--prompt", "hi", "-n", "1", "--model"])
        .arg(&f)
        .output()
        .unwrap();
    expect_usage_error(&o, &format!("{}: ", f.display()));
    let o = amk()
        .args(["generate", "--prompt", "hi", "-n", "1", "--json", "--model"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let v = json(&o);
    assert_eq!(v["error"]["kind"], "model");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with(&f.display().to_string()),
        "{v}"
    );
}

/// The keys of `generate --json` and `perplexity --json` are the ones README.md documents.
#[test]
fn json_outputs_match_the_readme() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    // The documented object: from its first key to the closing brace.
    let keys_in = |start: &str, end: &str| -> Vec<String> {
        let from = readme
            .find(start)
            .unwrap_or_else(|| panic!("README lacks {start}"));
        let doc = &readme[from..];
        let doc = &doc[..doc.find(end).map_or(doc.len(), |i| i + end.len())];
        let mut keys: Vec<String> = doc
            .split('"')
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| {
                let after = w.get(1).copied().unwrap_or_default();
                !w[0].is_empty()
                    && (after.starts_with(':') || after.starts_with(',') || after.starts_with('}'))
            })
            .map(|w| w[0].to_string())
            .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    };
    let d = tiny_with_tokenizer("tiny-gqa", "readme");
    let keys_of = |o: &Output| -> Vec<String> {
        let mut k: Vec<String> = json(o).as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let generated = amk()
        .args([
            "generate",
            "--prompt",
            "hi",
            "-n",
            "2",
            "--json",
            "--backend",
            "cpu",
            "--model",
        ])
        .arg(&d)
        .output()
        .unwrap();
    assert!(generated.status.success(), "{}", text(&generated));
    let mut want = keys_in("{\"prompt_ids\"", "}`");
    want.retain(|k| !["stop", "length", "context_full", "cpu", "cuda"].contains(&k.as_str()));
    assert_eq!(keys_of(&generated), want);
    let f = d.join("ppl.txt");
    std::fs::write(&f, "hello world, hello again").unwrap();
    let ppl = amk()
        .args(["perplexity", "--json", "--backend", "cpu", "--text-file"])
        .arg(&f)
        .arg("--model")
        .arg(&d)
        .output()
        .unwrap();
    assert!(ppl.status.success(), "{}", text(&ppl));
    assert_eq!(keys_of(&ppl), keys_in("{\"tokens\"", "}"));
}

/// `-v` logs what the command does (import, lowering and loading) on stderr; without it
/// nothing but warnings is logged, and `RUST_LOG` overrides the flag.
#[test]
fn verbose_logs_the_steps() {
    let d = tiny_with_tokenizer("tiny-gqa", "verbose");
    let run = |pre: &[&str], env: Option<&str>| {
        let mut c = amk();
        c.args(pre)
            .args([
                "generate",
                "--prompt",
                "hi",
                "-n",
                "1",
                "--backend",
                "cpu",
                "--model",
            ])
            .arg(&d);
        match env {
            Some(v) => c.env("RUST_LOG", v),
            None => c.env_remove("RUST_LOG"),
        };
        c.output().unwrap()
    };
    let o = run(&["-v"], None);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("INFO imported") && err.contains(&d.display().to_string()),
        "{err}"
    );
    assert!(err.contains("INFO lowered, validated and loaded"), "{err}");
    let quiet = run(&[], None);
    assert!(
        !String::from_utf8_lossy(&quiet.stderr).contains("INFO"),
        "{}",
        text(&quiet)
    );
    let off = run(&["-v"], Some("off"));
    assert!(
        !String::from_utf8_lossy(&off.stderr).contains("INFO"),
        "{}",
        text(&off)
    );
    assert_eq!(o.stdout, quiet.stdout, "logging changes no output");
}

/// Every command, with its stdout (and then also its stderr) on `/dev/full`, and with its
/// stdout a pipe its reader closed at once: never a panic (exit 101). A full device is exit 2
/// with the reason on stderr when stderr works; a closed pipe ends the command with its own
/// code (0 for these, which succeed otherwise), as `cat` does.
#[cfg(target_os = "linux")]
#[test]
fn every_command_survives_a_full_device_and_a_closed_pipe() {
    use std::process::Stdio;
    let d = scratch("output");
    let model = tiny_with_tokenizer("tiny-mqa", "output-model");
    let prog = d.join("prog.json");
    let o = amk()
        .args(["lower", "--max-seq", "16", "-q", "--model"])
        .arg(reference("tiny-mqa"))
        .arg("-o")
        .arg(&prog)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let text_file = d.join("text.txt");
    std::fs::write(&text_file, "hello world, hello world").unwrap();
    let p = |x: &Path| x.display().to_string();
    let weights = p(&reference("tiny-mqa").join("model.safetensors"));
    let prog_s = p(&prog);
    let run = vec![
        "run",
        &prog_s,
        "--weights",
        &weights,
        "--set",
        "token_id=1",
        "--set",
        "pos=0",
    ];
    let (model_s, text_s) = (p(&model), p(&text_file));
    let generate = vec![
        "generate", "--model", &model_s, "--prompt", "hello", "-n", "3",
    ];
    let ppl = vec!["perplexity", "--model", &model_s, "--text-file", &text_s];
    let commands: Vec<Vec<String>> = [
        vec!["--help"],
        vec!["--version"],
        vec!["ops", "list"],
        vec!["ops", "list", "--json"],
        vec![
            "ops",
            "compile",
            "--list",
            "--arch",
            "sm_90a",
            "--shape",
            "smollm2-135m",
        ],
        vec!["completions", "bash"],
        vec!["validate", &p(&prog)],
        vec!["validate", "--json", &p(&prog)],
        run.clone(),
        [run.as_slice(), &["--json"]].concat(),
        vec![
            "lower",
            "--max-seq",
            "16",
            "--model",
            &p(&reference("tiny-mqa")),
            "-o",
            &p(&d.join("p2.json")),
        ],
        [generate.as_slice(), &["--ignore-eos"]].concat(),
        [generate.as_slice(), &["--json"]].concat(),
        ppl.clone(),
        [ppl.as_slice(), &["--json"]].concat(),
        // A server that cannot say where it listens stops instead of serving unseen.
        vec!["serve", "--json", "--port", "0", "--model", &model_s],
    ]
    .iter()
    .map(|c| c.iter().map(|s| s.to_string()).collect())
    .collect();
    for args in &commands {
        let what = args.join(" ");
        // stdout full: exit 2, the reason on stderr.
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = amk().args(args).stdout(full).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{what} >/dev/full: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("error: writing to standard output"),
            "{what} >/dev/full: {err}"
        );
        // stdout and stderr full: exit 2, nothing to say it with.
        let (f1, f2) = (
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        );
        let s = amk().args(args).stdout(f1).stderr(f2).status().unwrap();
        assert_eq!(s.code(), Some(2), "{what} >/dev/full 2>/dev/full");
        // stdout a pipe nobody reads: the command's own exit code.
        let mut child = amk()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let s = child.wait().unwrap();
        assert_eq!(s.code(), Some(0), "{what} | (closed)");
    }
}

/// A FIFO (which would block whoever opens it) or a device given as a model, a plugin or a
/// program is refused at once, exit 2.
#[cfg(unix)]
#[test]
fn fifos_and_devices_are_refused_without_blocking() {
    let d = scratch("fifo");
    let fifo = d.join("model.gguf");
    if !Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        return; // no mkfifo here: nothing to test with
    }
    let f = fifo.display().to_string();
    let t0 = std::time::Instant::now();
    for args in [
        vec!["generate", "--model", &f, "--prompt", "hi", "-n", "1"],
        vec!["--plugin", &f, "ops", "list"],
        vec!["validate", &f],
        vec!["validate", "/dev/zero"],
        vec![
            "generate",
            "--model",
            "/dev/zero",
            "--prompt",
            "hi",
            "-n",
            "1",
        ],
    ] {
        let o = amk().args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("regular file"), "{args:?}: {}", text(&o));
    }
    assert!(t0.elapsed().as_secs() < 10);
}

/// `--max-program-mib` bounds what `validate` and `run` read: a program over the bound is a
/// load error naming the flag (exit 2), and raising the bound loads it.
#[test]
fn the_program_size_bound_is_a_flag() {
    let d = scratch("maxprog");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/toy-llama-2l.json");
    let mut program = std::fs::read_to_string(&example).unwrap();
    // Padded past 1 MiB with whitespace (still the same program).
    program.push_str(&" ".repeat(1 << 20));
    let big = d.join("big.json");
    std::fs::write(&big, program).unwrap();
    let b = big.display().to_string();
    for args in [
        vec!["validate", "--max-program-mib", "1", &b],
        vec!["run", "--max-program-mib", "1", &b],
    ] {
        let o = amk().args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("--max-program-mib"),
            "{args:?}: {}",
            text(&o)
        );
    }
    let o = amk()
        .args(["validate", "--max-program-mib", "2", &b])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// A program the validator accepts whose buffers do not fit in memory (two 4 TiB
/// buffers, one COPY) is refused by `amk run` with an error naming them (exit 3, a backend
/// error) instead of aborting in the allocator.
#[test]
fn a_program_too_large_for_memory_is_refused_by_name() {
    let d = scratch("hugebufs");
    let huge = 1u64 << 40; // 4 TiB of F32
    let program = format!(
        r#"{{"ir_version": "0.2.0", "abi_version": "0.2",
  "buffers": [
    {{"id": 0, "name": "huge_in", "kind": "KV_CACHE", "dtype": "F32", "shape": [{huge}], "space": "HBM", "source": null}},
    {{"id": 1, "name": "huge_out", "kind": "IO_OUTPUT", "dtype": "F32", "shape": [{huge}], "space": "HBM", "source": null}}
  ],
  "counters": [{{"id": 0, "init": 0, "note": "done"}}],
  "tasks": [{{"id": 0, "op": "COPY", "inputs": [0], "outputs": [1], "out_counter": 0, "waits": [], "params": {{}}}}]
}}"#
    );
    let f = d.join("huge.json");
    std::fs::write(&f, program).unwrap();
    let f = f.display().to_string();
    let v = amk().args(["validate", &f]).output().unwrap();
    assert_eq!(
        v.status.code(),
        Some(0),
        "the program is valid: {}",
        text(&v)
    );
    let o = amk().args(["run", &f]).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("huge_in") && t.contains("huge_out"), "{t}");
    assert!(!t.contains("panicked"), "{t}");
}

/// An error that quotes its input (here a 4 MB version string) shows at most 16 KiB of it,
/// saying how much it left out, on stderr and in `--json`.
#[test]
fn errors_quoting_huge_input_are_bounded() {
    let d = scratch("hugeerr");
    let f = d.join("p.json");
    std::fs::write(
        &f,
        format!("{{\"ir_version\": \"{}\"}}", "9".repeat(4 << 20)),
    )
    .unwrap();
    let f = f.display().to_string();
    let o = amk().args(["validate", &f]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        o.stderr.len() < 20 << 10,
        "{} bytes of stderr",
        o.stderr.len()
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("more bytes not shown"));
    let j = amk().args(["validate", "--json", &f]).output().unwrap();
    assert!(
        j.stdout.len() < 20 << 10,
        "{} bytes of JSON",
        j.stdout.len()
    );
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    assert!(
        v["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("more bytes not shown")
    );
}
