#!/usr/bin/env python3
"""Compare amk's decode megakernel with the PyTorch baselines on one GPU.

For each shape, one after the other on the same GPU in the same run:

  AMK bench --shape S --dtype bf16 --pos P,... --iters N --json
  python3 bench/torch_baseline.py --shape S --pos P,... --iters N --max-seq M --json
  python3 bench/torch_baseline.py --shape S --pos P,... --iters N --max-seq M --json --no-compile

The PyTorch graph attends over all M cache rows at every position (static shapes), so M is
the smallest that the positions allow: the largest position + 1. With --cache-per-position each
position gets a PyTorch run of its own with M = position + 1 (a compile each), so both engines
attend over the same rows at every point of a long-context sweep.

Each tool prints one JSON object on stdout (its progress goes to stderr, passed through here).
This script joins them by (shape, position) and prints a markdown table: amk's median time
per token with p10-p90, amk's time as a percentage of its floor (bytes / measured read
bandwidth), the two PyTorch medians, the speedup torch compile+graph / amk (above 1: amk is
faster) and both correctness gates. A point whose gate failed in either tool shows
"gate failed" instead of a time and no ratio.

Exit status: 0 when every tool ran and every gate passed, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TORCH_BASELINE = Path(__file__).resolve().parent / "torch_baseline.py"
DEFAULT_SHAPES = "llama-3.2-1b,smollm2-135m,llama-3.1-8b"
TORCH_VARIANTS = {"compile+graph": [], "eager+graph": ["--no-compile"]}


@dataclass
class Run:
    """One tool invocation for one shape, and what came of it."""

    tool: str  # "amk" or a torch variant
    shape: str
    cmd: list[str]
    returncode: int | None = None
    output: dict[str, Any] | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.error is not None or self.returncode != 0

    def points(self) -> dict[int, dict[str, Any]]:
        """The reported points by position."""
        if self.output is None:
            return {}
        return {p["pos"]: p for p in self.output.get("points", []) if "pos" in p}

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "shape": self.shape,
            "cmd": self.cmd,
            "returncode": self.returncode,
            "seconds": round(self.seconds, 1),
            "error": self.error,
            "output": self.output,
        }


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_json_object(stdout: str) -> dict[str, Any]:
    """The JSON object a tool printed: all of stdout, else its last line that is one."""
    try:
        value = json.loads(stdout)
    except json.JSONDecodeError:
        value = None
        for line in reversed(stdout.splitlines()):
            if line.lstrip().startswith("{"):
                try:
                    value = json.loads(line)
                    break
                except json.JSONDecodeError:
                    continue
    if not isinstance(value, dict):
        raise ValueError("no JSON object on stdout")
    return value


def execute(run: Run) -> None:
    """Run the command (stderr passes through), parse its stdout, record the outcome."""
    log(f"==> {run.tool} {run.shape}: {' '.join(run.cmd)}")
    start = time.monotonic()
    try:
        proc = subprocess.run(run.cmd, stdout=subprocess.PIPE, text=True, check=False)
    except OSError as exc:
        run.error = f"could not start: {exc}"
        log(f"==> {run.tool} {run.shape}: {run.error}")
        return
    run.seconds = time.monotonic() - start
    run.returncode = proc.returncode
    try:
        run.output = parse_json_object(proc.stdout)
    except ValueError as exc:
        run.error = f"{exc} (exit status {proc.returncode})"
    status = run.error or f"exit status {proc.returncode}"
    log(f"==> {run.tool} {run.shape}: {status}, {run.seconds:.0f} s")


def plan(args: argparse.Namespace) -> list[Run]:
    """Every invocation, in the order they run."""
    pos, iters = args.pos, str(args.iters)
    max_seq = str(max(args.positions) + 1)
    runs = []
    for shape in args.shapes:
        amk = [args.amk, "bench", "--shape", shape, "--dtype", "bf16", "--pos", pos,
               "--iters", iters, "--json"]
        runs.append(Run("amk", shape, amk))
        for variant, extra in TORCH_VARIANTS.items():
            points = ([(str(p), str(p + 1)) for p in args.positions]
                      if args.cache_per_position else [(pos, max_seq)])
            for at, rows in points:
                cmd = [sys.executable, str(TORCH_BASELINE), "--shape", shape, "--pos", at,
                       "--iters", iters, "--max-seq", rows, "--json", *extra]
                runs.append(Run(variant, shape, cmd))
    return runs


def point_of(runs: list[Run], pos: int) -> tuple[Run, dict[str, Any] | None]:
    """The run of `runs` (one tool and shape; one run, or one a position) holding `pos`, and
    its point there (the first run and None when none holds it)."""
    for run in runs:
        point = run.points().get(pos)
        if point is not None:
            return run, point
    return runs[0], None


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


def gate_passed(point: dict[str, Any] | None) -> bool:
    return bool(point and point.get("gate") and point["gate"].get("passed"))


def timed(point: dict[str, Any] | None) -> bool:
    """The point passed its gate and has a time."""
    return gate_passed(point) and point.get("median_ms") is not None


def time_cell(run: Run, point: dict[str, Any] | None, spread: bool) -> str:
    if point is None:
        return "failed" if run.failed else "missing"
    if point.get("gate") is not None and not point["gate"].get("passed"):
        return "gate failed"
    if not timed(point):
        return "failed"
    cell = f"{point['median_ms']:.3f}"
    if spread:
        cell += f" ({point['p10_ms']:.3f}–{point['p90_ms']:.3f})"
    return cell


def gate_cell(point: dict[str, Any] | None) -> str:
    if point is None or point.get("gate") is None:
        return "n/a"
    return "pass" if point["gate"].get("passed") else "FAIL"


def table(runs: list[Run], shapes: list[str], positions: list[int]) -> list[str]:
    """The markdown ratio table."""
    by_key: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        by_key.setdefault((r.tool, r.shape), []).append(r)
    lines = [
        "| model | pos | amk median ms (p10–p90) | amk % of floor | torch compile+graph ms "
        "| torch eager+graph ms | speedup vs compile (torch/amk) | gate amk / torch |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for shape in shapes:
        tools = [by_key[(t, shape)] for t in ("amk", *TORCH_VARIANTS)]
        for pos in positions:
            (amk, a), (comp, c), (eager, e) = (point_of(r, pos) for r in tools)
            floor = f"{a['pct_of_floor']:.1f} %" if timed(a) and a.get("pct_of_floor") else "—"
            speedup = f"{c['median_ms'] / a['median_ms']:.2f}×" if timed(a) and timed(c) else "—"
            gates = f"{gate_cell(a)} / {gate_cell(c)}, {gate_cell(e)}"
            lines.append(
                f"| {shape} | {pos} | {time_cell(amk, a, True)} | {floor} "
                f"| {time_cell(comp, c, False)} | {time_cell(eager, e, False)} | {speedup} "
                f"| {gates} |"
            )
    return lines


def notes(runs: list[Run]) -> list[str]:
    """Device, amk's measured bandwidth, compile-mode fallbacks and failures."""
    out = []
    amk_ok = [r for r in runs if r.tool == "amk" and r.output]
    torch_ok = [r for r in runs if r.tool != "amk" and r.output]
    if amk_ok:
        out.append(f"Device (amk): {amk_ok[0].output.get('device', '?')}")
    if torch_ok:
        first = torch_ok[0].output
        out.append(f"Device (torch): {first.get('device', '?')}, torch {first.get('torch', '?')}")
    measured = {r.shape: r.output["read_bandwidth_gbs"] for r in amk_ok
                if r.output.get("read_bandwidth_gbs") is not None}
    if len(set(measured.values())) == 1:
        out.append(f"Read bandwidth measured by amk: {next(iter(measured.values())):.1f} GB/s")
    elif measured:
        listed = ", ".join(f"{b:.1f} GB/s ({s})" for s, b in measured.items())
        out.append(f"Read bandwidth measured by amk: {listed}")
    out.append("Times are per token (one graph replay or one megakernel launch); the floor is "
               "bytes / measured read bandwidth; speedup above 1 means amk is faster.")
    rows = sorted({r.output.get("max_seq") for r in torch_ok} - {None})
    if len(rows) == 1:
        out.append(f"PyTorch attends over all {rows[0]} cache "
                   "rows at every position (one static graph); amk reads rows 0..pos.")
    elif rows:
        out.append("PyTorch ran once a position with a cache of position + 1 rows "
                   "(--cache-per-position); amk reads rows 0..pos.")
    for run in runs:
        modes = {p.get("compile_mode") for p in run.points().values()} - {None}
        fallback = modes - {"max-autotune-no-cudagraphs"}
        if run.tool == "compile+graph" and fallback:
            out.append(f"Note: {run.shape} compiled with torch.compile mode="
                       f"{', '.join(sorted(fallback))} (max-autotune failed).")
        if run.failed:
            out.append(f"FAILED: {run.tool} {run.shape}: {failure(run)}")
        for point in run.points().values():
            gate = point.get("gate")
            if gate and not gate.get("passed"):
                reason = gate.get("reason") or (
                    f"max rel err {gate.get('max_rel_err')}, argmax {gate.get('argmax')} "
                    f"vs {gate.get('argmax_ref')}")
                out.append(f"Gate failed: {run.tool} {run.shape} pos {point['pos']}: {reason}")
            if point.get("error"):
                out.append(f"Error: {run.tool} {run.shape} pos {point['pos']}: {point['error']}")
    return out


def failure(run: Run) -> str:
    if run.error:
        return run.error
    return f"exit status {run.returncode}"


def report(runs: list[Run], shapes: list[str], positions: list[int]) -> str:
    return "\n".join([*table(runs, shapes, positions), "", *notes(runs)])


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run amk bench and the PyTorch baselines on this GPU; print a ratio table.",
    )
    parser.add_argument("--amk", help="path to the amk binary (built with --features cuda)")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES,
                        help=f"comma-separated model shapes (default {DEFAULT_SHAPES})")
    parser.add_argument("--pos", default="0,511", help="comma-separated positions (default 0,511)")
    parser.add_argument("--iters", type=int, default=200, help="timed iterations per point")
    parser.add_argument("--json-out", metavar="FILE", help="write every tool's raw JSON here")
    parser.add_argument("--cache-per-position", action="store_true",
                        help="one PyTorch run a position, its cache position + 1 rows")
    parser.add_argument("--selftest", action="store_true",
                        help="check the report on made-up results and exit")
    args = parser.parse_args(argv)
    if args.selftest:
        return args
    if not args.amk:
        parser.error("--amk is required")
    if not (os.path.isfile(args.amk) and os.access(args.amk, os.X_OK)):
        parser.error(f"--amk {args.amk}: not an executable file")
    args.amk = os.path.abspath(args.amk)
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    try:
        args.positions = [int(p) for p in args.pos.split(",") if p.strip()]
    except ValueError:
        parser.error(f"--pos takes comma-separated integers, not {args.pos!r}")
    if not args.shapes or not args.positions:
        parser.error("--shapes and --pos need at least one value each")
    if min(args.positions) < 0:
        parser.error("--pos takes non-negative positions")
    args.pos = ",".join(map(str, args.positions))
    if args.iters < 2:
        parser.error("--iters must be at least 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.selftest:
        return selftest()
    runs = plan(args)
    for run in runs:
        execute(run)
    print(report(runs, args.shapes, args.positions))
    if args.json_out:
        raw = {"amk": args.amk, "shapes": args.shapes, "pos": args.positions,
               "iters": args.iters, "runs": [r.to_json() for r in runs]}
        Path(args.json_out).write_text(json.dumps(raw, indent=2) + "\n")
        log(f"raw results written to {args.json_out}")
    ok = not any(r.failed for r in runs) and all(
        timed(p) for r in runs for p in r.points().values())
    return 0 if ok else 1


# --------------------------------------------------------------------------------------------
# Self-test on made-up results
# --------------------------------------------------------------------------------------------


def _fake_point(pos: int, median: float | None, **extra: Any) -> dict[str, Any]:
    passed = median is not None
    gate = {"passed": passed, "max_rel_err": 3e-3 if passed else 0.4, "tolerance": 0.02,
            "argmax": 7, "argmax_ref": 7 if passed else 9}
    point = {"model": "llama-3.2-1b", "dtype": "bf16", "pos": pos, "iters": 200,
             "median_ms": median, "p10_ms": median and median * 0.98,
             "p90_ms": median and median * 1.05, "bytes": 2_471_628_800, "gate": gate}
    point.update(extra)
    return point


def selftest() -> int:
    """Render the report from made-up tool outputs and check what it says."""
    noisy = 'compiling...\n{"tool": "amk", "points": []}\n'
    checks = {"noisy stdout": parse_json_object(noisy)["tool"] == "amk"}
    try:
        parse_json_object("no json here")
        checks["no JSON"] = False
    except ValueError:
        checks["no JSON"] = True

    shape, other = "llama-3.2-1b", "llama-3.1-8b"
    amk = Run("amk", shape, [], 0, {
        "tool": "amk", "device": "Fake GPU (sm_90a, 132 SMs)", "read_bandwidth_gbs": 3070.5,
        "points": [_fake_point(0, 0.85, pct_of_floor=94.7),
                   _fake_point(511, 0.90, pct_of_floor=92.1)],
    })
    comp = Run("compile+graph", shape, [], 1, {
        "tool": "torch", "torch": "0.0", "device": "Fake GPU",
        "points": [_fake_point(0, 1.20, compile_mode="default"), _fake_point(511, None)],
    })
    eager = Run("eager+graph", shape, [], 0, {
        "tool": "torch", "torch": "0.0", "device": "Fake GPU",
        "points": [_fake_point(0, 1.50), _fake_point(511, 1.55)],
    })
    broken = [Run(tool, other, [], None, None, "could not start: no such file")
              for tool in ("amk", *TORCH_VARIANTS)]
    text = report([amk, comp, eager, *broken], [shape, other], [0, 511])
    print(text)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    checks.update({
        "ratio": "| 1.41× |" in rows[1],
        "amk cell": "0.850 (0.833–0.892)" in rows[1] and "94.7 %" in rows[1],
        "gate failed row": "gate failed" in rows[2] and "| — |" in rows[2],
        "gates": "pass / pass, pass" in rows[1] and "pass / FAIL, pass" in rows[2],
        "failed tool": "failed" in rows[3] and "n/a / n/a, n/a" in rows[3],
        "notes": "3070.5 GB/s" in text and "mode=default" in text and "FAILED: amk" in text,
    })
    # --cache-per-position: one torch run a position, joined by position.
    per_pos = [Run(tool, shape, [], 0, {
        "tool": "torch", "torch": "0.0", "device": "Fake GPU", "max_seq": pos + 1,
        "points": [_fake_point(pos, 1.0 + pos / 1000)]})
        for tool in TORCH_VARIANTS for pos in (0, 511)]
    text = report([amk, *per_pos], [shape], [0, 511])
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    checks.update({
        "per-position runs": "| 1.18× |" in rows[1] and "| 1.68× |" in rows[2],
        "per-position note": "position + 1 rows" in text,
    })
    failed = [name for name, ok in checks.items() if not ok]
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"selftest: {len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
