#!/usr/bin/env python3
"""Run llama.cpp's llama-bench on one GGUF file and normalise what it reports.

The command (flag names as in llama-bench's own --help):

  llama-bench -m FILE -ngl 99 -fa 1 -p P -n N -d D1,D2,... -r R -o json

-ngl 99 puts every layer on the GPU, -fa 1 turns flash attention on, -p P times a P-token
prompt (test "ppP", one batch), -n N times N single-token decode steps (test "tgN"), and
-d runs each test after a context of D tokens has been processed ("@ dD"; the context is
filled untimed). -r R repeats each test; llama-bench reports the mean and standard deviation
of the R throughputs (avg_ts, stddev_ts, in tokens per second) after one untimed warm-up
run. Its weights are used as stored in the file: a Q4_1 GGUF runs with 4-bit weights.

Each record of llama-bench's JSON (an array of objects with n_prompt, n_gen, n_depth, avg_ts,
stddev_ts, gpu_info, build_commit, ...) becomes one normalised row:

  {"engine": "llama.cpp", "test": "pp512" | "tg128", "depth": D, "tok_s": avg_ts,
   "stddev": stddev_ts, "ms": ..., "ms_stddev": null, "derived": false}

and each pp record also gives a "ttftP" row whose "ms" is P / avg_ts in milliseconds (the
prompt's processing time, marked "derived": true: llama-bench does not sample a token, so it
is the time to the first token's logits). For a tg row "ms" is the time per token.

Output: a markdown table on stdout, or with --json one object {"tool": "llama.cpp", "cmd",
"rows", "raw", ...}; llama-bench's own progress goes to stderr.
Exit status: 0 every test reported, 1 llama-bench failed or printed no results, 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENGINE = "llama.cpp"
DEFAULT_LLAMA_BENCH = Path(os.environ.get("LLAMA_BENCH", Path.home() / "llamacpp" / "llama-bench"))


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_ints(text: str, flag: str, minimum: int = 0) -> list[int]:
    """Comma-separated integers, each at least ``minimum``, repeats dropped (the other peers'
    scripts parse their ``--depth`` with it too)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} takes comma-separated integers, not {text!r}")
    if not values:
        raise argparse.ArgumentTypeError(f"{flag} needs at least one value")
    if min(values) < minimum:
        raise argparse.ArgumentTypeError(f"{flag} values must be at least {minimum}")
    return list(dict.fromkeys(values))


def command(args: argparse.Namespace) -> list[str]:
    """The llama-bench command line for these arguments."""
    return [
        str(args.llama_bench), "-m", str(args.model), "-ngl", str(args.ngl), "-fa", args.fa,
        "-p", str(args.prompt_tokens), "-n", str(args.gen),
        "-d", ",".join(map(str, args.depth)), "-r", str(args.reps), "-o", "json",
        *args.extra,
    ]


def parse_depths(text: str) -> list[int]:
    """``--depth``: comma-separated non-negative integers (every peer script's parser)."""
    return parse_ints(text, "--depth")


def parse_records(stdout: str) -> list[dict[str, Any]]:
    """llama-bench's JSON array (-o json), or its JSON lines (-o jsonl)."""
    text = stdout.strip()
    start, end = text.find("["), text.rfind("]")
    if start != -1 and end > start:
        try:
            value = json.loads(text[start:end + 1])
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list) and all(isinstance(r, dict) for r in value):
            return value
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
    if not records:
        raise ValueError("no llama-bench JSON results on stdout")
    return records


def normalise(records: list[dict[str, Any]], engine: str = ENGINE) -> list[dict[str, Any]]:
    """One row per record (plus a derived ttft row per pp record)."""
    rows = []
    for r in records:
        n_prompt, n_gen = int(r.get("n_prompt", 0)), int(r.get("n_gen", 0))
        depth = int(r.get("n_depth", 0))
        tok_s, stddev = r.get("avg_ts"), r.get("stddev_ts")
        tok_s = float(tok_s) if tok_s is not None else None
        stddev = float(stddev) if stddev is not None else None
        if n_prompt and not n_gen:
            test = f"pp{n_prompt}"
        elif n_gen and not n_prompt:
            test = f"tg{n_gen}"
        else:
            test = f"pp{n_prompt}+tg{n_gen}"
        per = n_prompt if test.startswith("pp") and not n_gen else 1
        ms = 1000.0 * per / tok_s if tok_s else None
        rows.append({"engine": engine, "test": test, "depth": depth, "tok_s": tok_s,
                     "stddev": stddev, "ms": ms, "ms_stddev": None, "derived": False})
        if n_prompt and not n_gen:
            rows.append({"engine": engine, "test": f"ttft{n_prompt}", "depth": depth,
                         "tok_s": None, "stddev": None, "ms": ms, "ms_stddev": None,
                         "derived": True})
    return rows


def describe_build(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Device, build and model facts from the first record."""
    if not records:
        return {}
    r = records[0]
    return {
        "device": r.get("gpu_info") or r.get("cpu_info"),
        "backends": r.get("backends"),
        "build": f"{r.get('build_commit', '?')} ({r.get('build_number', '?')})",
        "model_type": r.get("model_type"),
        "model_size": r.get("model_size"),
        "model_n_params": r.get("model_n_params"),
        "flash_attn": r.get("flash_attn"),
        "n_gpu_layers": r.get("n_gpu_layers"),
    }


def format_table(rows: list[dict[str, Any]], facts: dict[str, Any]) -> str:
    lines = [
        f"llama.cpp {facts.get('build', '?')} on {facts.get('device', '?')}, "
        f"model {facts.get('model_type', '?')}",
        "",
        "| test | depth | tok/s | stddev | ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        tok_s = "—" if row["tok_s"] is None else f"{row['tok_s']:.1f}"
        stddev = "—" if row["stddev"] is None else f"{row['stddev']:.1f}"
        ms = "—" if row["ms"] is None else f"{row['ms']:.3f}" + (" (derived)" if row["derived"] else "")
        lines.append(f"| {row['test']} | {row['depth']} | {tok_s} | {stddev} | {ms} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Run llama-bench (or read --from-raw); returns the report and the exit status."""
    if args.from_raw:
        cmd = None
        stdout = Path(args.from_raw).read_text()
        returncode, seconds = 0, 0.0
    else:
        cmd = command(args)
        log(f"==> {shlex.join(cmd)}")
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
        except OSError as exc:
            log(f"error: could not start llama-bench: {exc}")
            return {"tool": ENGINE, "engine": ENGINE, "cmd": cmd, "error": str(exc), "rows": []}, 1
        stdout, returncode = proc.stdout, proc.returncode
        seconds = time.monotonic() - started
    report: dict[str, Any] = {"tool": ENGINE, "engine": ENGINE, "model": str(args.model),
                              "cmd": cmd, "returncode": returncode, "seconds": round(seconds, 1)}
    try:
        records = parse_records(stdout)
    except ValueError as exc:
        report.update(error=f"{exc} (exit status {returncode})", rows=[])
        log(f"error: {report['error']}")
        return report, 1
    report.update(describe_build(records))
    report["rows"] = normalise(records)
    report["raw"] = records
    if returncode != 0:
        report["error"] = f"llama-bench exited with status {returncode}"
        log(f"error: {report['error']}")
        return report, 1
    return report, 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run llama.cpp's llama-bench on a GGUF file; print normalised rows.",
    )
    parser.add_argument("-m", "--model", type=Path, help="the GGUF file")
    parser.add_argument("--llama-bench", type=Path, default=DEFAULT_LLAMA_BENCH,
                        help=f"the llama-bench binary (default $LLAMA_BENCH or {DEFAULT_LLAMA_BENCH})")
    parser.add_argument("-p", "--prompt-tokens", type=int, default=512,
                        help="prompt length of the pp test (default 512)")
    parser.add_argument("-n", "--gen", type=int, default=128,
                        help="decode steps of the tg test (default 128)")
    parser.add_argument("-d", "--depth", default=[0, 512, 2048],
                        type=parse_depths,
                        help="comma-separated context depths (default 0,512,2048)")
    parser.add_argument("-r", "--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--ngl", type=int, default=99, help="GPU layers (default 99: all)")
    parser.add_argument("--fa", default="1", choices=("0", "1", "auto", "on", "off"),
                        help="flash attention (default 1)")
    parser.add_argument("--extra", action="append", default=[],
                        help="one more argument for llama-bench (repeatable, e.g. --extra=-ub "
                             "--extra=512)")
    parser.add_argument("--from-raw", metavar="FILE",
                        help="normalise a saved `llama-bench -o json` output instead of running")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--selftest", action="store_true",
                        help="check argument handling and normalisation on made-up data; exit")
    return parser


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.from_raw:
        if not Path(args.from_raw).is_file():
            parser.error(f"--from-raw {args.from_raw}: no such file")
        return
    if args.model is None:
        parser.error("-m/--model is required")
    if not args.model.is_file():
        parser.error(f"--model {args.model}: no such file")
    if not (args.llama_bench.is_file() and os.access(args.llama_bench, os.X_OK)):
        parser.error(f"--llama-bench {args.llama_bench}: not an executable file "
                     "(build it with bench/peers/build_llamacpp.sh)")
    if args.prompt_tokens < 1 or args.gen < 1:
        parser.error("--prompt-tokens and --gen must be positive")
    if args.reps < 1:
        parser.error("--reps must be at least 1")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.selftest:
        return selftest()
    validate(parser, args)
    report, status = run(args)
    if args.json:
        print(json.dumps(report, indent=1))
    elif report.get("rows"):
        print(format_table(report["rows"], report))
    return status


# --------------------------------------------------------------------------------------------
# Self-test on made-up llama-bench output
# --------------------------------------------------------------------------------------------


def _fake_record(n_prompt: int, n_gen: int, depth: int, ts: float) -> dict[str, Any]:
    """One record as llama-bench -o json prints it (the fields of its test::get_fields)."""
    samples_ts = [ts * 0.99, ts, ts * 1.01]
    return {
        "build_commit": "abc1234", "build_number": 4242, "cpu_info": "Fake CPU",
        "gpu_info": "Fake GPU H200", "backends": "CUDA",
        "model_filename": "m.gguf", "model_type": "llama ?B Q4_1", "model_size": 94300000,
        "model_n_params": 134515008, "n_batch": 2048, "n_ubatch": 512, "n_threads": 16,
        "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": "f16", "type_v": "f16",
        "n_gpu_layers": 99, "n_cpu_moe": 0, "split_mode": "layer", "main_gpu": 0,
        "no_kv_offload": False, "flash_attn": 1, "devices": "auto", "tensor_split": "0.00",
        "tensor_buft_overrides": "none", "load_mode": "mmap", "lazy_mode": "auto",
        "embeddings": False, "no_op_offload": 0, "no_host": False, "repack": True,
        "fit_target": 0, "fit_min_ctx": 4096,
        "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth,
        "test_time": "2026-01-01T00:00:00Z",
        "avg_ns": int(1e9 * (n_prompt + n_gen) / ts), "stddev_ns": 1000,
        "avg_ts": ts, "stddev_ts": ts * 0.01,
        "samples_ns": [int(1e9 * (n_prompt + n_gen) / s) for s in samples_ts],
        "samples_ts": samples_ts,
    }


def selftest() -> int:
    records = [_fake_record(512, 0, 0, 51200.0), _fake_record(0, 128, 0, 800.0),
               _fake_record(512, 0, 2048, 40960.0), _fake_record(0, 128, 2048, 640.0)]
    stdout = "\n".join([
        "[", ",\n".join("  " + json.dumps(r, indent=4) for r in records), "]"])
    jsonl = "\n".join(json.dumps(r) for r in records)
    checks: list[tuple[str, bool]] = []
    parsed = parse_records(stdout)
    checks.append(("parse json array", parsed == records))
    checks.append(("parse jsonl", parse_records("ggml_cuda_init: found 1 device\n" + jsonl)
                   == records))
    try:
        parse_records("error: failed to load model")
        checks.append(("no results", False))
    except ValueError:
        checks.append(("no results", True))
    rows = normalise(parsed)
    by = {(r["test"], r["depth"]): r for r in rows}
    checks.append(("tests", sorted(by) == sorted([
        ("pp512", 0), ("ttft512", 0), ("tg128", 0), ("pp512", 2048), ("ttft512", 2048),
        ("tg128", 2048)])))
    checks.append(("pp row", by[("pp512", 0)]["tok_s"] == 51200.0
                   and by[("pp512", 0)]["stddev"] == 512.0 and not by[("pp512", 0)]["derived"]))
    checks.append(("ttft derived", by[("ttft512", 0)]["derived"]
                   and abs(by[("ttft512", 0)]["ms"] - 10.0) < 1e-9
                   and by[("ttft512", 0)]["tok_s"] is None))
    checks.append(("tg row", by[("tg128", 2048)]["tok_s"] == 640.0
                   and abs(by[("tg128", 2048)]["ms"] - 1.5625) < 1e-9))
    checks.append(("pg row", normalise([_fake_record(512, 128, 0, 1000.0)])[0]["test"]
                   == "pp512+tg128"))
    facts = describe_build(parsed)
    table = format_table(rows, facts)
    print(table)
    checks.append(("table", "| tg128 | 2048 | 640.0 | 6.4 | 1.562 |" in table
                   and "10.000 (derived)" in table and "Fake GPU H200" in table))
    checks.append(("usage", _selftest_usage()))
    failed = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"selftest: {len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _selftest_usage() -> bool:
    parser = build_parser()
    for argv in ([], ["-m", "/nonexistent.gguf"], ["-m", __file__, "--llama-bench", "/nonexistent"],
                 ["-m", __file__, "-d", "0,x"], ["-m", __file__, "-d", "-1"]):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                validate(parser, parser.parse_args(argv))
        except SystemExit as exc:
            if exc.code != 2:
                return False
        else:
            return False
    args = parser.parse_args(["-m", "m.gguf", "--llama-bench", "/x/llama-bench", "-p", "256",
                              "-d", "0, 512,", "--extra=-ub", "--extra=256"])
    return command(args) == [
        "/x/llama-bench", "-m", "m.gguf", "-ngl", "99", "-fa", "1", "-p", "256", "-n", "128",
        "-d", "0,512", "-r", "5", "-o", "json", "-ub", "256"]


if __name__ == "__main__":
    sys.exit(main())
