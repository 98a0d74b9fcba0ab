#!/usr/bin/env python3
"""HuggingFace transformers baseline for batch-1 generation from one GGUF file.

Method
------
The GGUF is loaded through transformers (``AutoModelForCausalLM.from_pretrained(dir,
gguf_file=name, dtype=torch.bfloat16)``; needs the ``gguf`` package): every tensor is
dequantised to bf16 (a Q4_1 file runs with bf16 weights here) and the model is moved to the
GPU. Generation follows transformers' documented recipe for fast decoding:

  model.generation_config.cache_implementation = "static"
  model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

(``--compile manual``: generate's own automatic compilation is switched off so that the
forward is compiled once; on transformers 5.17 with PyTorch 2.11 this fails at the second
call with "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
run". ``--compile auto``, the default, leaves compilation to generate, which compiles the
decode step when the cache is static; ``--compile none`` runs eagerly with the static cache.) Decoding is greedy; ``min_new_tokens = max_new_tokens`` so an
end-of-sequence token cannot stop a run early. Prompts are random token ids (seeded) drawn
from the vocabulary: what they say does not change the cost.

Measurements (wall clock around ``model.generate``, with ``torch.cuda.synchronize()`` before
and after):

- time to first token: ``generate`` of a P-token prompt with one new token (prefill, the
  first token's logits and its selection, and generate's own overhead); prompt tok/s is
  P / that time.
- decode tok/s at depth D: a prompt of D tokens (1 token for depth 0) is run once with one
  new token (t1) and once with N new tokens (tN); the N - 1 extra tokens are decode steps
  after the prompt, so decode tok/s = (N - 1) / (median tN - median t1).

Compilation and CUDA-graph capture are excluded: the static cache is first sized for the
longest run (transformers keeps that size for later calls, so the compiled graphs stay
valid), then every (prompt length, new tokens) configuration runs ``--warmup`` times untimed
before its ``--reps`` timed runs. The first warm-up call's time (compilation included) is
reported as ``first_call_s``. Medians are reported, with the standard deviation over reps.

Rows (the same normalised form as llamacpp_bench.py):

  {"engine": "hf+torch.compile", "test": "pp512" | "ttft512" | "tg128", "depth": D,
   "tok_s": ..., "stddev": ..., "ms": ..., "ms_stddev": ..., "derived": false}

Output: a table on stdout, or with --json one object {"tool": "hf", "rows", "runs", ...};
progress and library chatter go to stderr.
Exit status: 0 measured, 1 a run failed, 2 bad usage or a missing requirement (PyTorch,
CUDA, transformers, gguf), reported as one message.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_bench  # noqa: E402  (same folder; standard library only)

DEFAULT_MODEL = Path.home() / ".cache" / "amk" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPILE_MODES = ("manual", "auto", "none")
GGUF_MIN_VERSION = (0, 10, 0)
RECOMPILE_LIMIT = 64
FIRST_TOKEN_ID = 16  # random prompts avoid the lowest ids, where special tokens usually are


class BenchError(Exception):
    """An expected failure: reported as a message, never as a traceback."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send whatever is written to stdout (Python or native code) to stderr meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def engine_name(compile_mode: str) -> str:
    return {"manual": "hf+torch.compile", "auto": "hf+torch.compile (by generate)",
            "none": "hf eager (static cache)"}[compile_mode]


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading numeric parts of a version string ("4.56.0.dev0" -> (4, 56, 0))."""
    out = []
    for part in text.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def requirements() -> list[str]:
    """What is missing to run this benchmark (empty: everything is there)."""
    problems = []
    try:
        import torch
    except ModuleNotFoundError:
        return ["PyTorch is not installed"]
    if not torch.cuda.is_available():
        problems.append("no CUDA device is available to PyTorch")
    try:
        import transformers  # noqa: F401
    except ModuleNotFoundError:
        problems.append("transformers is not installed")
    try:
        import gguf
    except ModuleNotFoundError:
        problems.append("the gguf package is not installed (transformers needs it to read GGUF "
                        "files: pip install gguf, or run bench/peers/fetch.sh and put the carried "
                        "wheel on PYTHONPATH)")
    except Exception as exc:  # a dependency of gguf (numpy, pyyaml) is missing or broken
        problems.append(f"the gguf package does not import: {type(exc).__name__}: {exc}")
    else:
        from importlib.metadata import PackageNotFoundError, version
        try:
            found = version("gguf")
        except PackageNotFoundError:
            found = getattr(gguf, "__version__", "0")
        if version_tuple(found) < GGUF_MIN_VERSION:
            wanted = ".".join(map(str, GGUF_MIN_VERSION))
            problems.append(f"gguf {found} is too old: transformers needs gguf>={wanted}")
    return problems


# --------------------------------------------------------------------------------------------
# Statistics and rows (pure Python)
# --------------------------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def stdev(xs: list[float]) -> float | None:
    return statistics.stdev(xs) if len(xs) > 1 else None


def plan(prompt_tokens: int, gen: int, depths: list[int]) -> list[tuple[int, int]]:
    """Every (prompt length, new tokens) configuration, the longest total first."""
    configs = {(prompt_tokens, 1)}
    for d in depths:
        configs |= {(max(d, 1), 1), (max(d, 1), gen)}
    return sorted(configs, key=lambda c: (-(c[0] + c[1]), c))


def make_rows(engine: str, prompt_tokens: int, gen: int, depths: list[int],
              times: dict[tuple[int, int], list[float]]) -> list[dict[str, Any]]:
    """Normalised rows from the timed runs (seconds per generate call, per configuration)."""
    rows = []
    ttft = times[(prompt_tokens, 1)]
    pp = [prompt_tokens / t for t in ttft]
    rows.append({"engine": engine, "test": f"pp{prompt_tokens}", "depth": 0,
                 "tok_s": prompt_tokens / median(ttft), "stddev": stdev(pp),
                 "ms": 1000 * median(ttft), "ms_stddev": _scaled(stdev(ttft), 1000),
                 "derived": False})
    rows.append({"engine": engine, "test": f"ttft{prompt_tokens}", "depth": 0, "tok_s": None,
                 "stddev": None, "ms": 1000 * median(ttft), "ms_stddev": _scaled(stdev(ttft), 1000),
                 "derived": False})
    for d in depths:
        length = max(d, 1)
        t1, tn = median(times[(length, 1)]), times[(length, gen)]
        steps = gen - 1
        decode = median(tn) - t1
        if steps < 1 or decode <= 0:
            tok_s, spread, ms = None, None, None
        else:
            tok_s = steps / decode
            per_run = [steps / (t - t1) for t in tn if t > t1]
            spread = stdev(per_run)
            ms = 1000 * decode / steps
        rows.append({"engine": engine, "test": f"tg{gen}", "depth": d, "tok_s": tok_s,
                     "stddev": spread, "ms": ms, "ms_stddev": None, "derived": False})
    return rows


def _scaled(x: float | None, k: float) -> float | None:
    return None if x is None else x * k


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['engine']} on {report.get('device', '?')} (torch {report.get('torch', '?')}, "
        f"transformers {report.get('transformers', '?')}), {report.get('model', '?')}",
        "",
        "| test | depth | tok/s | stddev | ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        tok_s = "—" if row["tok_s"] is None else f"{row['tok_s']:.1f}"
        spread = "—" if row["stddev"] is None else f"{row['stddev']:.1f}"
        ms = "—" if row["ms"] is None else f"{row['ms']:.3f}"
        lines.append(f"| {row['test']} | {row['depth']} | {tok_s} | {spread} | {ms} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The benchmark (needs PyTorch, CUDA, transformers, gguf)
# --------------------------------------------------------------------------------------------


def load_model(path: Path, compile_mode: str) -> Any:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    # `dtype` replaced `torch_dtype` in transformers 4.56; older versions only know the latter.
    key = "dtype" if version_tuple(transformers.__version__) >= (4, 56) else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 **{key: torch.bfloat16})
    model = model.to("cuda").eval()
    gc = model.generation_config
    gc.cache_implementation = "static"
    gc.do_sample = False
    if compile_mode in ("manual", "none"):
        gc.disable_compile = True  # no compilation by generate itself (transformers >= 4.50)
    if compile_mode == "manual":
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    return model


def raise_recompile_limit() -> None:
    """Prefill and decode shapes each compile once; keep dynamo from giving up on them."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name),
                                                    RECOMPILE_LIMIT))


def timed_generate(model: Any, ids: Any, new: int) -> float:
    """Seconds for one greedy generate call of exactly ``new`` tokens."""
    import torch

    mask = torch.ones_like(ids)
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                         do_sample=False)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if out.shape[-1] != ids.shape[-1] + new:
        raise BenchError(f"generate returned {out.shape[-1] - ids.shape[-1]} new tokens, "
                         f"expected {new}")
    return elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    torch.set_grad_enabled(False)
    device = torch.cuda.get_device_name()
    log(f"device: {device}, torch {torch.__version__}, transformers {transformers.__version__}")
    raise_recompile_limit()
    started = time.monotonic()
    with stdout_to_stderr():
        model = load_model(args.model, args.compile)
    load_s = time.monotonic() - started
    vocab = int(model.config.vocab_size)
    log(f"loaded {args.model.name} in {load_s:.1f} s (vocab {vocab}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, bf16)")

    configs = plan(args.prompt_tokens, args.gen, args.depth)
    longest = max(length for length, _ in configs)
    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(FIRST_TOKEN_ID, vocab, (1, longest), generator=gen).to("cuda")
    if hasattr(model.generation_config, "max_cache_len"):
        model.generation_config.max_cache_len = max(l + n for l, n in configs)

    times: dict[tuple[int, int], list[float]] = {}
    first_call_s: dict[str, float] = {}
    with stdout_to_stderr():
        for length, new in configs:  # the longest first: it sizes the static cache
            ids = tokens[:, :length]
            for i in range(max(args.warmup, 1 if args.compile != "none" else 0)):
                t = timed_generate(model, ids, new)
                if i == 0:
                    first_call_s[f"{length}+{new}"] = round(t, 2)
            times[(length, new)] = [timed_generate(model, ids, new) for _ in range(args.reps)]
            log(f"  prompt {length:5d} + {new:4d} new: median {1000 * median(times[(length, new)]):.2f} "
                f"ms over {args.reps} runs (first call {first_call_s.get(f'{length}+{new}', 0):.1f} s)")
    engine = engine_name(args.compile)
    return {
        "tool": "hf", "engine": engine, "model": str(args.model), "device": device,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "compile": args.compile, "cmd": [sys.executable, *sys.argv],
        "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen, "depths": args.depth,
        "warmup": args.warmup, "reps": args.reps, "seed": args.seed,
        "load_s": round(load_s, 1), "first_call_s": first_call_s,
        "rows": make_rows(engine, args.prompt_tokens, args.gen, args.depth, times),
        "runs": [{"prompt": l, "new": n, "seconds": ts} for (l, n), ts in times.items()],
    }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Time HF transformers generation (static cache + torch.compile) from a "
        "GGUF file: time to first token and decode tok/s at several depths.",
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help=f"the GGUF file (default {DEFAULT_MODEL})")
    parser.add_argument("-p", "--prompt-tokens", type=int, default=512,
                        help="prompt length for time to first token (default 512)")
    parser.add_argument("-n", "--gen", type=int, default=128,
                        help="new tokens per decode run (default 128)")
    parser.add_argument("-d", "--depth", type=llamacpp_bench.parse_depths, default=[0, 512, 2048],
                        help="comma-separated context depths for decode (default 0,512,2048)")
    parser.add_argument("-r", "--reps", type=int, default=5, help="timed runs each (default 5)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed runs of each configuration first (default 2; at least 1 "
                             "when compiling)")
    parser.add_argument("--compile", choices=COMPILE_MODES, default="auto",
                        help="auto: generate's own compilation (default); manual: "
                             "torch.compile(model.forward, mode='reduce-overhead', "
                             "fullgraph=True); none: eager")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random prompt")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--selftest", action="store_true",
                        help="check argument handling and the report on made-up data; exit")
    return parser


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.model.is_file():
        parser.error(f"--model {args.model}: no such file")
    if args.prompt_tokens < 1:
        parser.error("--prompt-tokens must be positive")
    if args.gen < 2:
        parser.error("--gen must be at least 2 (decode tok/s needs steps after the first token)")
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.selftest:
        return selftest()
    validate(parser, args)
    problems = requirements()
    if problems:
        for p in problems:
            log(f"error: {p}")
        return 2
    try:
        report = run(args)
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    except Exception as exc:  # unexpected (a transformers or compile failure): say what
        log(traceback.format_exc())
        log(f"error: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
        return 1
    print(json.dumps(report, indent=1) if args.json else format_table(report))
    return 0


# --------------------------------------------------------------------------------------------
# Self-test on made-up timings
# --------------------------------------------------------------------------------------------


def selftest() -> int:
    checks: list[tuple[str, Callable[[], bool]]] = [
        ("versions", lambda: version_tuple("4.56.0.dev0") == (4, 56, 0)
         and version_tuple("2.11.0+cu130") == (2, 11, 0) and version_tuple("0.19.0") >= (0, 10)),
        ("plan", lambda: plan(512, 128, [0, 512, 2048]) == [
            (2048, 128), (2048, 1), (512, 128), (512, 1), (1, 128), (1, 1)]),
        ("rows", _selftest_rows),
        ("usage", _selftest_usage),
    ]
    failed = 0
    for name, check in checks:
        ok = check()
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"selftest: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _selftest_rows() -> bool:
    # Made-up: 512-token prompt in 20 ms; decode steps of 2 ms at depth 0, 2.5 ms at 2048.
    times = {
        (512, 1): [0.020, 0.021, 0.019],
        (1, 1): [0.004, 0.004, 0.004],
        (1, 128): [0.004 + 127 * 0.002] * 3,
        (2048, 1): [0.05, 0.05, 0.05],
        (2048, 128): [0.05 + 127 * 0.0025, 0.05 + 127 * 0.0025 + 0.001, 0.05 + 127 * 0.0025],
    }
    rows = make_rows("hf+torch.compile", 512, 128, [0, 2048], times)
    by = {(r["test"], r["depth"]): r for r in rows}
    report = {"engine": "hf+torch.compile", "device": "Fake GPU", "torch": "0.0",
              "transformers": "0.0", "model": "m.gguf", "rows": rows}
    table = format_table(report)
    print(table)
    json.loads(json.dumps(report, allow_nan=False))
    return (abs(by[("pp512", 0)]["tok_s"] - 25600.0) < 1e-6
            and abs(by[("ttft512", 0)]["ms"] - 20.0) < 1e-9
            and abs(by[("tg128", 0)]["tok_s"] - 500.0) < 1e-6
            and abs(by[("tg128", 2048)]["tok_s"] - 400.0) < 1e-6
            and by[("tg128", 2048)]["stddev"] is not None
            and "| tg128 | 2048 | 400.0 |" in table)


def _selftest_usage() -> bool:
    parser = build_parser()
    bad = [["--model", "/nonexistent.gguf"], ["--model", __file__, "-n", "1"],
           ["--model", __file__, "-d", "x"], ["--model", __file__, "--compile", "max"]]
    for argv in bad:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                validate(parser, parser.parse_args(argv))
        except SystemExit as exc:
            if exc.code != 2:
                return False
        else:
            return False
    args = parser.parse_args(["--model", __file__, "-d", "0,512,512,", "-p", "128"])
    validate(parser, args)
    return args.depth == [0, 512] and args.prompt_tokens == 128 and args.compile == "auto"


if __name__ == "__main__":
    sys.exit(main())
