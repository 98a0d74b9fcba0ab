#!/usr/bin/env python3
"""amk, llama.cpp and HF transformers side by side on one GGUF file: one markdown table.

One after the other on the same GPU, each engine's end-to-end benchmark runs on the file:

  AMK bench --model FILE --prompt-tokens P --gen N --depth D1,D2,... --dtype bf16 --json
  python3 bench/peers/llamacpp_bench.py -m FILE --llama-bench LLAMA_BENCH -p P -n N -d D... -r R --json
  python3 bench/peers/hf_generate.py --model FILE -p P -n N -d D... -r R --json

(or, with --from-json, their saved outputs are read instead), and the table has one row per
metric and one column per engine:

  prompt processing, tok/s (P tokens)
  time to first token, ms (P-token prompt)
  decode tok/s at depth D, for each depth

followed by a footer: the weight types stored in the file (llama.cpp computes with them as
stored; amk and transformers dequantise to the chosen dtype on load), each engine's device
and method, failures, and the exact commands.

--from-json takes comma-separated files, each any of: `amk bench ... --json` output (its
e2e object), `llamacpp_bench.py --json` output, raw `llama-bench -o json` output,
`hf_generate.py --json` output, or a --json-out file of this script.

Exit status: 0 when every engine that was asked for reported, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import llamacpp_bench  # noqa: E402  (same folder; standard library only)

DEFAULT_MODEL = Path.home() / ".cache" / "amk" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
ENGINES = ("amk", "llama.cpp", "hf")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# What the GGUF file holds (a small reader of its header; standard library only)
# --------------------------------------------------------------------------------------------

GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _read_value(f: BinaryIO, vtype: int, keep: bool) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        n = _read(f, "<Q")
        data = f.read(n)
        return data.decode("utf-8", "replace") if keep else None
    if vtype == _ARRAY:
        sub, n = _read(f, "<I"), _read(f, "<Q")
        if sub in _SCALARS and not keep:
            f.seek(n * struct.calcsize(_SCALARS[sub]), os.SEEK_CUR)
            return None
        items = [_read_value(f, sub, keep) for _ in range(n)]
        return items if keep else None
    raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_summary(path: Path) -> dict[str, Any]:
    """Architecture, name, dimensions and the tensor types of a GGUF file, from its header."""
    wanted = ("general.architecture", "general.name", "llama.block_count",
              "llama.embedding_length", "llama.vocab_size")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, n_tensors, n_kv = _read(f, "<I"), _read(f, "<Q"), _read(f, "<Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _read_value(f, _STRING, True)
            vtype = _read(f, "<I")
            value = _read_value(f, vtype, key in wanted)
            if key in wanted:
                meta[key] = value
        types: dict[str, int] = {}
        matrix_types: dict[str, int] = {}
        for _ in range(n_tensors):
            _read_value(f, _STRING, False)
            dims = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
            name = GGML_TYPES.get(_read(f, "<I"), "?")
            _read(f, "<Q")
            types[name] = types.get(name, 0) + 1
            if len(dims) > 1:
                matrix_types[name] = matrix_types.get(name, 0) + 1
    return {"version": version, "tensors": n_tensors, "types": types,
            "matrix_types": matrix_types, **{k.split(".", 1)[1]: v for k, v in meta.items()}}


def describe_file(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "(not read)"
    kinds = ", ".join(f"{t} ×{n}" for t, n in sorted(summary["types"].items(), key=lambda x: -x[1]))
    parts = [summary.get("architecture", "?")]
    if summary.get("name"):
        parts.append(f"“{summary['name']}”")
    if summary.get("block_count"):
        width = summary.get("embedding_length")
        parts.append(f"{summary['block_count']} layers" + (f", width {width}" if width else ""))
    return f"{', '.join(parts)}; {summary['tensors']} tensors: {kinds}"


def quantised(summary: dict[str, Any] | None) -> list[str]:
    """The matrix types that are neither F32, F16 nor BF16."""
    if not summary:
        return []
    return sorted(t for t in summary["matrix_types"] if t not in ("F32", "F16", "BF16"))


# --------------------------------------------------------------------------------------------
# Engine outputs -> normalised rows
# --------------------------------------------------------------------------------------------


def amk_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows from `amk bench --model ... --json` (its e2e object)."""
    engine = f"amk ({out.get('dtype', '?')})"
    p = out.get("prompt_tokens")
    n = out.get("gen_tokens")
    rows = []
    if p is not None:
        pp = out.get("prompt_tok_s")
        rows.append({"engine": engine, "test": f"pp{p}", "depth": 0, "tok_s": pp, "stddev": None,
                     "ms": 1000.0 * p / pp if pp else None, "ms_stddev": None, "derived": False})
        rows.append({"engine": engine, "test": f"ttft{p}", "depth": 0, "tok_s": None,
                     "stddev": None, "ms": out.get("ttft_ms"), "ms_stddev": None,
                     "derived": False})
    for d in out.get("depths", []):
        rows.append({"engine": engine, "test": f"tg{n if n is not None else d.get('tokens')}",
                     "depth": d.get("depth", 0), "tok_s": d.get("decode_tok_s"), "stddev": None,
                     "ms": d.get("wall_ms_per_token"), "ms_stddev": None, "derived": False,
                     "kernel_ms": d.get("kernel_ms_per_token")})
    return rows


def kind_of(out: Any) -> str | None:
    """Which tool printed this JSON value."""
    if isinstance(out, list) and out and all(isinstance(r, dict) and "avg_ts" in r for r in out):
        return "llama-bench-raw"
    if not isinstance(out, dict):
        return None
    tool = out.get("tool")
    if tool == "amk" and out.get("mode") == "e2e":
        return "amk"
    if tool in ("llama.cpp", "hf", "side_by_side"):
        return tool
    return None


@dataclass
class Run:
    """One engine's invocation (or saved output), and what came of it."""

    engine: str  # "amk", "llama.cpp" or "hf"
    cmd: list[str] | None = None
    source: str | None = None  # the --from-json file it was read from
    returncode: int | None = None
    output: Any = None
    error: str | None = None
    seconds: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.error is not None or (self.returncode not in (None, 0)) or not self.rows

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "cmd": self.cmd, "source": self.source,
                "returncode": self.returncode, "seconds": round(self.seconds, 1),
                "error": self.error, "output": self.output}


def rows_of(engine: str, out: Any) -> list[dict[str, Any]]:
    kind = kind_of(out)
    if kind == "amk":
        return amk_rows(out)
    if kind == "llama-bench-raw":
        return llamacpp_bench.normalise(out)
    if kind in ("llama.cpp", "hf"):
        return list(out.get("rows", []))
    return []


def runs_from_json(paths: list[Path]) -> list[Run]:
    """Runs from saved outputs (a --json-out file of this script expands to its runs)."""
    runs = []
    for path in paths:
        try:
            value = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            runs.append(Run("?", source=str(path), error=f"cannot read {path}: {exc}"))
            continue
        kind = kind_of(value)
        if kind == "side_by_side":
            for saved in value.get("runs", []):
                run = Run(saved.get("engine", "?"), cmd=saved.get("cmd"), source=str(path),
                          returncode=saved.get("returncode"), output=saved.get("output"),
                          error=saved.get("error"), seconds=saved.get("seconds") or 0.0)
                run.rows = rows_of(run.engine, run.output)
                runs.append(run)
            continue
        engine = {"amk": "amk", "llama-bench-raw": "llama.cpp", "llama.cpp": "llama.cpp",
                  "hf": "hf"}.get(kind or "", "?")
        run = Run(engine, source=str(path), output=value)
        if isinstance(value, dict):
            run.cmd = value.get("cmd")
            run.error = value.get("error")
        run.rows = rows_of(engine, value)
        if kind is None:
            run.error = f"{path}: not the JSON of amk bench, llama-bench, llamacpp_bench.py, " \
                        "hf_generate.py or side_by_side.py"
        runs.append(run)
    return runs


# --------------------------------------------------------------------------------------------
# Running the engines
# --------------------------------------------------------------------------------------------


def parse_json_value(stdout: str) -> Any:
    """The JSON a tool printed: all of stdout, else its last line that parses."""
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        pass
    for line in reversed(stdout.splitlines()):
        if line.lstrip().startswith(("{", "[")):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON on stdout")


def plan(args: argparse.Namespace) -> list[Run]:
    p, n, r = str(args.prompt_tokens), str(args.gen), str(args.reps)
    d = ",".join(map(str, args.depth))
    runs = []
    if not args.skip_amk:
        runs.append(Run("amk", [args.amk, "bench", "--model", str(args.model), "--prompt-tokens",
                                p, "--gen", n, "--depth", d, "--dtype", args.dtype, "--json",
                                *args.amk_arg]))
    if not args.skip_llamacpp:
        runs.append(Run("llama.cpp", [sys.executable, str(HERE / "llamacpp_bench.py"), "-m",
                                      str(args.model), "--llama-bench", args.llama_bench,
                                      "-p", p, "-n", n, "-d", d, "-r", r, "--json",
                                      *(f"--extra={a}" for a in args.llamacpp_arg)]))
    if not args.skip_hf:
        runs.append(Run("hf", [sys.executable, str(HERE / "hf_generate.py"), "--model",
                               str(args.model), "-p", p, "-n", n, "-d", d, "-r", r, "--json"]))
    return runs


def execute(run: Run) -> None:
    """Run the command (its stderr passes through, the last error line is kept), parse its
    stdout, record the outcome."""
    assert run.cmd is not None
    log(f"==> {run.engine}: {shlex.join(run.cmd)}")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(run.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace")
    except OSError as exc:
        run.error = f"could not start: {exc}"
        log(f"==> {run.engine}: {run.error}")
        return
    last_error: list[str] = []

    def forward() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if line.lower().startswith("error"):
                last_error[:] = [line.strip()]

    relay = threading.Thread(target=forward, daemon=True)
    relay.start()
    assert proc.stdout is not None
    stdout = proc.stdout.read()
    proc.wait()
    relay.join()
    run.seconds = time.monotonic() - start
    run.returncode = proc.returncode
    said = f": {last_error[0]}" if last_error else ""
    try:
        run.output = parse_json_value(stdout)
        run.rows = rows_of(run.engine, run.output)
        if not run.rows:
            run.error = f"its JSON has no results (exit status {proc.returncode}){said}"
    except ValueError as exc:
        run.error = f"{exc} (exit status {proc.returncode}){said}"
    if run.error is None and isinstance(run.output, dict) and run.output.get("error"):
        run.error = str(run.output["error"])
    log(f"==> {run.engine}: {run.error or f'exit status {proc.returncode}'}, {run.seconds:.0f} s")


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def _test_key(test: str, depth: int) -> tuple[int, int, int, str, int]:
    """Order: prompt processing, time to first token, then decode by depth."""
    for rank, prefix in enumerate(("pp", "ttft", "tg")):
        if test.startswith(prefix) and test[len(prefix):].isdigit():
            return (rank, int(test[len(prefix):]), depth, test, depth)
    return (3, 0, depth, test, depth)


def metric_label(test: str, depth: int) -> str:
    rank, size, *_ = _test_key(test, depth)
    if rank == 0:
        return f"prompt processing, tok/s ({size}-token prompt)" + (
            f" @ depth {depth}" if depth else "")
    if rank == 1:
        return f"time to first token, ms ({size}-token prompt)" + (
            f" @ depth {depth}" if depth else "")
    if rank == 2:
        return f"decode tok/s @ depth {depth} ({size} tokens)"
    return f"{test} @ depth {depth}"


def cell(row: dict[str, Any] | None, marks: dict[str, int]) -> str:
    if row is None:
        return "—"
    if row["test"].startswith("ttft"):
        if row.get("ms") is None:
            return "failed"
        text = f"{row['ms']:.2f}"
        if row.get("ms_stddev") is not None:
            text += f" ± {row['ms_stddev']:.2f}"
        if row.get("derived"):
            note = "prompt time P / (pp tok/s); llama-bench samples no token"
            marks.setdefault(note, len(marks) + 1)
            text = f"≈ {text} ({marks[note]})"
        return text
    if row.get("tok_s") is None:
        return "failed"
    text = f"{row['tok_s']:.1f}"
    if row.get("stddev") is not None:
        text += f" ± {row['stddev']:.1f}"
    return text


def engine_columns(runs: list[Run]) -> tuple[list[str], set[str]]:
    """Column names in run order, and those of runs that gave no rows (shown as failed)."""
    seen: dict[str, None] = {}
    empty = set()
    for run in runs:
        for row in run.rows:
            seen.setdefault(row["engine"], None)
        if not run.rows:
            seen.setdefault(run.engine, None)
            empty.add(run.engine)
    return list(seen), empty


def table(runs: list[Run], main_only: bool) -> tuple[list[str], dict[str, int]]:
    """The markdown table and the footnote marks it used.

    ``main_only`` keeps prompt processing and time to first token at depth 0 only (llama-bench
    also reports them after each depth).
    """
    columns, empty = engine_columns(runs)
    cells: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for run in runs:
        for row in run.rows:
            if main_only and not row["test"].startswith("tg") and row["depth"] != 0:
                continue
            cells.setdefault((row["test"], row["depth"]), {})[row["engine"]] = row
    marks: dict[str, int] = {}
    lines = ["| metric | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for test, depth in sorted(cells, key=lambda k: _test_key(*k)):
        values = ["failed" if c in empty else cell(cells[(test, depth)].get(c), marks)
                  for c in columns]
        lines.append(f"| {metric_label(test, depth)} | " + " | ".join(values) + " |")
    return lines, marks


def command_lines(run: Run) -> list[str]:
    out = []
    if run.cmd:
        out.append(f"- {run.engine}: `{shlex.join(run.cmd)}`")
    elif run.source:
        out.append(f"- {run.engine}: read from `{run.source}` (its command was not saved)")
    inner = run.output.get("cmd") if isinstance(run.output, dict) else None
    if run.engine == "llama.cpp" and inner and inner != run.cmd:
        out.append(f"  - which ran: `{shlex.join(inner)}`")
    return out


def footer(runs: list[Run], model: Path | None, summary: dict[str, Any] | None,
           marks: dict[str, int]) -> list[str]:
    out = [f"({n}) {note}." for note, n in marks.items()]
    if model is not None:
        out.append(f"Model: `{model}`: {describe_file(summary)}.")
    quant = quantised(summary)
    if quant:
        out.append(f"Weights: llama.cpp computes with the file's {', '.join(quant)} weights as "
                   "stored; amk and transformers dequantise them on load (to the dtype in "
                   "their column), so they stream more bytes per token.")
    for run in runs:
        o = run.output if isinstance(run.output, dict) else {}
        if kind_of(run.output) == "llama-bench-raw":  # raw llama-bench output: facts from it
            o = {**llamacpp_bench.describe_build(run.output), "raw": run.output}
        if run.engine == "amk" and o:
            out.append(f"amk: {o.get('device', '?')}, dtype {o.get('dtype', '?')}; time to first "
                       "token and prompt tok/s as amk reports them; decode tok/s over "
                       f"{o.get('gen_tokens', '?')} tokens at each depth (wall clock).")
        elif run.engine == "llama.cpp" and o:
            reps = o.get("raw", [{}])[0].get("samples_ts") if o.get("raw") else None
            out.append(f"llama.cpp: build {o.get('build', '?')}, {o.get('device', '?')}, "
                       f"flash attention {o.get('flash_attn', '?')}, {o.get('n_gpu_layers', '?')} "
                       f"GPU layers; mean ± stddev over {len(reps) if reps else '?'} runs after "
                       "a warm-up; pp is one P-token batch, decode one token per step after a "
                       "context of depth tokens.")
        elif run.engine == "hf" and o:
            out.append(f"hf: {o.get('device', '?')}, torch {o.get('torch', '?')}, transformers "
                       f"{o.get('transformers', '?')}, compile={o.get('compile', '?')}, bf16, "
                       "static cache, greedy; compilation excluded (warm-up runs first); "
                       f"medians ± stddev over {o.get('reps', '?')} runs; decode tok/s = (N - 1) "
                       "/ (time of N new tokens - time of 1).")
    for run in runs:
        if run.failed:
            reason = run.error or (f"exit status {run.returncode}" if run.returncode else
                                   "no results")
            out.append(f"FAILED: {run.engine}: {reason}")
    out.append("")
    out.append("Commands:")
    for run in runs:
        out += command_lines(run)
    return out


def report(runs: list[Run], model: Path | None, summary: dict[str, Any] | None,
           main_only: bool = True) -> str:
    lines, marks = table(runs, main_only)
    return "\n".join([*lines, "", *footer(runs, model, summary, marks)])


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run amk, llama.cpp and HF transformers on one GGUF file (or read their "
        "saved JSON) and print a side-by-side markdown table.",
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help=f"the GGUF file (default {DEFAULT_MODEL})")
    parser.add_argument("--amk", help="the amk binary (built with --features cuda)")
    parser.add_argument("--llama-bench", default=str(llamacpp_bench.DEFAULT_LLAMA_BENCH),
                        help="the llama-bench binary (default $LLAMA_BENCH or "
                             f"{llamacpp_bench.DEFAULT_LLAMA_BENCH})")
    parser.add_argument("--llamacpp-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for llama-bench (repeatable, e.g. "
                             "--llamacpp-arg=-ub --llamacpp-arg=256)")
    parser.add_argument("--amk-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for amk bench (repeatable, e.g. "
                             "--amk-arg=--tolerance=2.5e-2)")
    parser.add_argument("--skip-amk", action="store_true", help="do not run amk")
    parser.add_argument("--skip-llamacpp", action="store_true", help="do not run llama.cpp")
    parser.add_argument("--skip-hf", action="store_true", help="do not run HF transformers")
    parser.add_argument("-p", "--prompt-tokens", type=int, default=512,
                        help="prompt length (default 512)")
    parser.add_argument("-n", "--gen", type=int, default=128,
                        help="decoded tokens per depth (default 128)")
    parser.add_argument("-d", "--depth", type=llamacpp_bench.parse_depths, default=[0, 512, 2048],
                        help="comma-separated context depths (default 0,512,2048)")
    parser.add_argument("-r", "--reps", type=int, default=5,
                        help="repetitions for llama.cpp and HF (default 5)")
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="bf16",
                        help="amk's dtype (default bf16)")
    parser.add_argument("--all-depths", action="store_true",
                        help="also show prompt processing after each depth (llama-bench "
                             "measures it)")
    parser.add_argument("--from-json", metavar="A.json,B.json",
                        help="print the table from saved outputs instead of running anything")
    parser.add_argument("--json-out", metavar="FILE",
                        help="write every engine's raw output, commands and rows here")
    parser.add_argument("--selftest", action="store_true",
                        help="check argument handling and the table on made-up data; exit")
    return parser


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.from_json:
        args.from_json = [Path(p.strip()) for p in args.from_json.split(",") if p.strip()]
        missing = [str(p) for p in args.from_json if not p.is_file()]
        if not args.from_json or missing:
            parser.error(f"--from-json: no such file(s): {', '.join(missing) or '(none given)'}")
        return
    if not args.model.is_file():
        parser.error(f"--model {args.model}: no such file (run `amk generate --prompt hi -n 1` "
                     "once to fetch the default model)")
    if args.skip_amk and args.skip_llamacpp and args.skip_hf:
        parser.error("nothing to run: every engine is skipped")
    if not args.skip_amk:
        if not args.amk:
            parser.error("--amk PATH is required (or --skip-amk)")
        if not (os.path.isfile(args.amk) and os.access(args.amk, os.X_OK)):
            parser.error(f"--amk {args.amk}: not an executable file")
        args.amk = os.path.abspath(args.amk)
    if not args.skip_llamacpp:
        if not (os.path.isfile(args.llama_bench) and os.access(args.llama_bench, os.X_OK)):
            parser.error(f"--llama-bench {args.llama_bench}: not an executable file (build it "
                         "with bench/peers/build_llamacpp.sh, or pass --skip-llamacpp)")
        args.llama_bench = os.path.abspath(args.llama_bench)
    if args.prompt_tokens < 1 or args.gen < 2 or args.reps < 1:
        parser.error("--prompt-tokens and --reps must be positive, --gen at least 2")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.selftest:
        return selftest()
    validate(parser, args)
    if args.from_json:
        runs = runs_from_json(args.from_json)
        models = {o.get("model") for r in runs if isinstance(o := r.output, dict)} - {None}
        model = Path(next(iter(models))) if len(models) == 1 else None
    else:
        runs = plan(args)
        for run in runs:
            execute(run)
        model = args.model
    summary = None
    if model is not None and model.is_file():
        try:
            summary = gguf_summary(model)
        except (OSError, ValueError, struct.error) as exc:
            log(f"note: could not read {model}'s header: {exc}")
    print(report(runs, model, summary, main_only=not args.all_depths))
    if args.json_out:
        raw = {"tool": "side_by_side", "model": str(model) if model else None,
               "file": summary, "runs": [r.to_json() for r in runs],
               "rows": [row for r in runs for row in r.rows]}
        Path(args.json_out).write_text(json.dumps(raw, indent=1) + "\n")
        log(f"raw results written to {args.json_out}")
    return 1 if any(r.failed for r in runs) else 0


# --------------------------------------------------------------------------------------------
# Self-test on made-up outputs
# --------------------------------------------------------------------------------------------

FAKE_AMK = {
    "tool": "amk", "mode": "e2e", "device": "Fake GPU (sm_90, 132 SMs)",
    "model": "m.gguf", "dtype": "bf16", "prompt_tokens": 512, "gen_tokens": 128,
    "ttft_ms": 41.5, "prompt_tok_s": 12337.3,
    "depths": [
        {"depth": 0, "decode_tok_s": 1810.2, "wall_ms_per_token": 0.5524,
         "kernel_ms_per_token": 0.51, "tokens": 128},
        {"depth": 512, "decode_tok_s": 1702.9, "wall_ms_per_token": 0.5872,
         "kernel_ms_per_token": None, "tokens": 128},
        {"depth": 2048, "decode_tok_s": 1500.0, "wall_ms_per_token": 0.6667,
         "kernel_ms_per_token": 0.62, "tokens": 128},
    ],
}


def _fake_hf() -> dict[str, Any]:
    rows = [
        {"engine": "hf+torch.compile", "test": "pp512", "depth": 0, "tok_s": 20480.0,
         "stddev": 300.0, "ms": 25.0, "ms_stddev": 0.4, "derived": False},
        {"engine": "hf+torch.compile", "test": "ttft512", "depth": 0, "tok_s": None,
         "stddev": None, "ms": 25.0, "ms_stddev": 0.4, "derived": False},
        {"engine": "hf+torch.compile", "test": "tg128", "depth": 0, "tok_s": 310.5,
         "stddev": 2.0, "ms": 3.22, "ms_stddev": None, "derived": False},
        {"engine": "hf+torch.compile", "test": "tg128", "depth": 2048, "tok_s": None,
         "stddev": None, "ms": None, "ms_stddev": None, "derived": False},
    ]
    return {"tool": "hf", "engine": "hf+torch.compile", "model": "m.gguf", "device": "Fake GPU",
            "torch": "0.0", "transformers": "0.0", "compile": "manual", "reps": 5,
            "cmd": ["python3", "bench/peers/hf_generate.py", "--model", "m.gguf", "--json"],
            "rows": rows}


def _fake_gguf(path: Path) -> None:
    """A tiny GGUF header: two keys (one a string array), three tensors."""
    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    kv = (s("general.architecture") + struct.pack("<I", _STRING) + s("llama")
          + s("tokenizer.ggml.tokens") + struct.pack("<IIQ", _ARRAY, _STRING, 2) + s("a") + s("b")
          + s("llama.block_count") + struct.pack("<II", 4, 2))
    ti = b""
    for name, dims, t in (("token_embd.weight", (8, 2), 8), ("blk.0.attn_q.weight", (8, 8), 3),
                          ("output_norm.weight", (8,), 0)):
        ti += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        ti += struct.pack("<IQ", t, 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 3, 3) + kv + ti)


def selftest() -> int:
    raw_records = [llamacpp_bench._fake_record(512, 0, 0, 51200.0),
                   llamacpp_bench._fake_record(0, 128, 0, 800.0),
                   llamacpp_bench._fake_record(512, 0, 512, 45000.0),
                   llamacpp_bench._fake_record(0, 128, 512, 760.0),
                   llamacpp_bench._fake_record(0, 128, 2048, 640.0)]
    checks: list[tuple[str, bool]] = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "amk.json").write_text(json.dumps(FAKE_AMK))
        (t / "raw.json").write_text(json.dumps(raw_records, indent=2))
        (t / "hf.json").write_text(json.dumps(_fake_hf()))
        (t / "junk.json").write_text('{"hello": 1}')
        _fake_gguf(t / "m.gguf")
        summary = gguf_summary(t / "m.gguf")
        checks.append(("gguf header", summary["types"] == {"Q8_0": 1, "Q4_1": 1, "F32": 1}
                       and summary["architecture"] == "llama" and summary["block_count"] == 2
                       and quantised(summary) == ["Q4_1", "Q8_0"]))
        runs = runs_from_json([t / "amk.json", t / "raw.json", t / "hf.json"])
        text = report(runs, t / "m.gguf", summary)
        print(text)
        rows = [line for line in text.splitlines() if line.startswith("| ")]
        checks += [
            ("columns", rows[0] == "| metric | amk (bf16) | llama.cpp | hf+torch.compile |"),
            ("pp row", rows[1].startswith("| prompt processing, tok/s (512-token prompt) | "
                                          "12337.3 | 51200.0 ± 512.0 | 20480.0 ± 300.0 |")),
            ("ttft row", "| 41.50 | ≈ 10.00 (1) | 25.00 ± 0.40 |" in rows[2]),
            ("decode rows", "| decode tok/s @ depth 0 (128 tokens) | 1810.2 | 800.0 ± 8.0 "
                            "| 310.5 ± 2.0 |" in rows[3]
             and "| 1702.9 | 760.0 ± 7.6 | — |" in rows[4]
             and "| 1500.0 | 640.0 ± 6.4 | failed |" in rows[5]),
            ("depth-only pp hidden", len(rows) == 6),
            ("footer", "(1) prompt time P / (pp tok/s)" in text and "Q4_1, Q8_0" in text
             and "read from `" in text and "hf_generate.py --model m.gguf --json" in text
             and "llama.cpp: build abc1234 (4242), Fake GPU H200" in text),
        ]
        all_rows = [line for line in report(runs, None, None, main_only=False).splitlines()
                    if line.startswith("| ")]
        checks.append(("all depths", any("@ depth 512 | — | 45000.0" in r for r in all_rows)))
        junk = runs_from_json([t / "junk.json", t / "nope.json"])
        checks.append(("bad inputs", all(r.failed for r in junk)
                       and "not the JSON of" in (junk[0].error or "")))
        broken = runs[:2] + [Run("hf", ["hf_generate.py"], returncode=2, error="no JSON")]
        broken_rows = [line for line in report(broken, None, None).splitlines()
                       if line.startswith("| ")]
        checks.append(("failed column", broken_rows[0].endswith("| llama.cpp | hf |")
                       and all(r.endswith("| failed |") for r in broken_rows[1:])
                       and "FAILED: hf: no JSON" in report(broken, None, None)))
        # A --json-out file reads back to the same table.
        saved = {"tool": "side_by_side", "runs": [r.to_json() for r in runs]}
        (t / "all.json").write_text(json.dumps(saved))
        again = report(runs_from_json([t / "all.json"]), t / "m.gguf", summary)
        checks.append(("json-out round trip", again.splitlines()[:6] == text.splitlines()[:6]))
        checks.append(("usage", _selftest_usage(t)))
    checks.append(("parse noisy stdout", parse_json_value('compiling...\n{"tool": "amk"}\n')
                   == {"tool": "amk"}))
    failed = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"selftest: {len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _selftest_usage(tmp: Path) -> bool:
    parser = build_parser()
    model = str(tmp / "m.gguf")
    exe = str(tmp / "fake-exe")
    Path(exe).write_text("#!/bin/sh\n")
    os.chmod(exe, 0o755)
    bad = [
        ["--model", "/nonexistent.gguf", "--skip-amk", "--skip-llamacpp"],
        ["--model", model, "--skip-llamacpp", "--skip-hf"],  # amk without --amk
        ["--model", model, "--amk", "/nonexistent", "--skip-llamacpp"],
        ["--model", model, "--skip-amk", "--llama-bench", "/nonexistent"],
        ["--model", model, "--skip-amk", "--skip-llamacpp", "--skip-hf"],
        ["--from-json", str(tmp / "nope.json")],
        ["--model", model, "--skip-amk", "--skip-llamacpp", "-d", "0,-5"],
    ]
    for argv in bad:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                validate(parser, parser.parse_args(argv))
        except SystemExit as exc:
            if exc.code != 2:
                return False
        else:
            return False
    args = parser.parse_args(["--model", model, "--amk", exe, "--llama-bench", exe,
                              "-d", "0,2048", "-p", "256", "--llamacpp-arg=--repack",
                              "--llamacpp-arg", "0", "--amk-arg=--tolerance=2.5e-2"])
    validate(parser, args)
    cmds = [r.cmd for r in plan(args)]
    return (cmds[0] == [exe, "bench", "--model", model, "--prompt-tokens", "256", "--gen",
                        "128", "--depth", "0,2048", "--dtype", "bf16", "--json",
                        "--tolerance=2.5e-2"]
            and cmds[1][2:] == ["-m", model, "--llama-bench", exe, "-p", "256", "-n", "128",
                                "-d", "0,2048", "-r", "5", "--json", "--extra=--repack",
                                "--extra=0"]
            and cmds[2][1].endswith("hf_generate.py") and len(cmds) == 3)


if __name__ == "__main__":
    sys.exit(main())
