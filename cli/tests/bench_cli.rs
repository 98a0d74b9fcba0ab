//! `amk bench`: argument errors exit 2 with a message (JSON under `--json`), and without a
//! usable GPU it says why instead of timing anything. With a GPU it runs the smallest shape
//! end to end: a gated, timed point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

#[allow(dead_code)] // only `gpu` is used here
mod common;

use std::process::Command;

fn amk(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_amk"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    let o = amk(&["bench", "--shape", "llama-9b", "--json"]);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("unknown model shape 'llama-9b'") && msg.contains("smollm2-135m"),
        "{msg}"
    );
    let o = amk(&["bench", "--shape", "smollm2-135m", "--dtype", "f32"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("the benchmark's reference is f32"));
    let o = amk(&["bench", "--shape", "smollm2-135m", "--iters", "0"]);
    assert_eq!(o.status.code(), Some(2));
    // Neither or both of --shape / --model: clap's usage error.
    assert_eq!(amk(&["bench"]).status.code(), Some(2));
    let o = amk(&["bench", "--shape", "smollm2-135m", "--model", "x.gguf"]);
    assert_eq!(o.status.code(), Some(2));
    let o = amk(&["bench", "--model", "/no/such/model.gguf"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such file"));
    // End-to-end mode takes a list of prompt lengths, each at least 2 tokens.
    let o = amk(&["bench", "--model", "x.gguf", "--prompt-tokens", "128,1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--prompt-tokens and --gen must be at least 2"),
        "{o:?}"
    );
    let o = amk(&["bench", "--model", "x.gguf", "--prompt-tokens", "128,x"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "clap refuses a length that is no number"
    );
}

#[test]
fn bench_needs_the_gpu_or_times_a_gated_point() {
    let o = amk(&[
        "bench",
        "--shape",
        "smollm2-135m",
        "--pos",
        "0",
        "--iters",
        "5",
        "--warmup",
        "1",
        "--json",
    ]);
    match common::gpu() {
        Err(why) => {
            assert_eq!(o.status.code(), Some(2), "{o:?}");
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(msg.starts_with("amk bench needs the CUDA backend"), "{msg}");
            // the kind every command gives for a backend it cannot open (`--backend cuda`)
            assert_eq!(v["error"]["kind"], "backend", "{v}");
            assert!(
                msg.contains(why.lines().next().unwrap_or_default()),
                "{msg}"
            );
        }
        Ok(device) => {
            assert_eq!(o.status.code(), Some(0), "{o:?}");
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["device"].as_str().unwrap(), device);
            let p = &v["points"][0];
            assert_eq!(p["gate"]["passed"], true);
            assert!(p["median_ms"].as_f64().unwrap() > 0.0);
            assert!(p["p10_ms"].as_f64().unwrap() <= p["p90_ms"].as_f64().unwrap());
            assert!(p["bytes"].as_u64().unwrap() > 260_000_000, "{p}");
            assert!(v["read_bandwidth_gbs"].as_f64().unwrap() > 100.0);
        }
    }
}
