#!/usr/bin/env python3
"""Summarises one layer of a traced decode step, as docs/perf-notes.md quotes it.

Input: the CSV that `amk bench ... --trace --trace-out FILE.csv` writes (one row per task:
reached, ready, prologue, returned, done, dispatched and waiting times in us from the step's
start). For one layer it prints two tables, phase by phase (a phase is the tasks whose label
is `L<layer>.<name>[...]` or `L<layer>.<name>`), with times from the layer's first ready task:

1. when the phase's tasks were ready (first, median, last), the median prologue (ready -> row
   prepared) and body (row prepared, or ready, -> returned), and when the last one returned and
   signalled;
2. where a task's fixed time goes, medians over the tasks that reached their task less than
   `--late-us` before it was ready (the ones that started as their previous task ended):
   reached -> dispatched (the scheduler's step), dispatched -> wait (the op's own checks),
   wait -> ready, ready -> row, row -> returned, returned -> signalled.

    scripts/trace_phases.py t.csv --layer 5 [--model llama-3.2-1b] [--pos 0]
    scripts/trace_phases.py t.csv --imbalance   # what each phase lost to its tiles' spread
    scripts/trace_phases.py t.csv --probe       # a build with AMK_PROBE=N (docs/gpu-testing.md)
    scripts/trace_phases.py t.csv --tail --model "F decode" --pos 512   # after the last layer
    scripts/trace_phases.py t.csv --op ATTENTION_SPLIT --pos 4095   # an op's own probes
    scripts/trace_phases.py t.csv --pass   # each point's whole pass, layer by layer
"""

import argparse
import csv
import re
import signal
import statistics
import sys


def number(row, col):
    v = row.get(col, "")
    return float(v) if v not in ("", None) else None


def load_rows(path, model, pos):
    """The CSV's rows, of one model and one position when given."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if model is not None:
        rows = [r for r in rows if r["model"] == model]
    if pos is not None:
        rows = [r for r in rows if r["pos"] == str(pos)]
    return rows


def load_layers(path, model, pos):
    """Rows by (layer, phase name)."""
    phases = {}
    for r in load_rows(path, model, pos):
        m = re.match(r"L(\d+)\.([A-Za-z_]+)", r["label"])
        if m:
            phases.setdefault((int(m.group(1)), m.group(2)), []).append(r)
    return phases


def load(path, model, pos, layer):
    return {name: g for (L, name), g in load_layers(path, model, pos).items() if L == layer}


def imbalance(path, model, pos):
    """Per phase, means over layers 1.. (layer 0 starts the step): the time the phase lost to
    its tiles not ending together (last signal - (median ready + median ready -> signal)), the
    latest tile's ready time after the median one's, and the longest ready -> signal after the
    median one (docs/perf-notes.md round 15 section 3)."""
    per = {}
    for (layer, name), g in load_layers(path, model, pos).items():
        if layer == 0 or len(g) < 2:
            continue
        ready = [number(r, "ready_us") for r in g]
        dur = [number(r, "done_us") - number(r, "ready_us") for r in g]
        last = max(number(r, "done_us") for r in g)
        per.setdefault(name, []).append((last - (median(ready) + median(dur)),
                                         max(ready) - median(ready), max(dur) - median(dur)))
    print("time lost to imbalance, us, means over layers 1..")
    print("| phase | layers | lost | ready: latest - p50 | ready -> signalled: max - p50 |")
    print("|---|---|---|---|---|")
    total = 0.0
    for name, v in per.items():
        cols = [statistics.mean(x) for x in zip(*v)]
        total += cols[0]
        print(f"| {name} | {len(v)} | " + " | ".join(f"{c:.2f}" for c in cols) + " |")
    print(f"| a layer | | {total:.2f} | | |")


def probe(path, model, pos):
    """The AMK_PROBE points (a traced build with AMK_CUDA_DEFINES="AMK_PROBE=N"), medians per
    phase over layers 3..26: the probes write `probe6_us` (point 6) and `probe7_us` (point 7)
    after the task's wait, so only rows whose two points follow `ready_us` count. Levels 1
    and 3: ready -> P6 -> P7 -> the row prepared (or returned); level 2 also: the row -> P6 (the
    first unit's sums) -> P7 (its epilogue) -> returned. Level 4: the SM clock, cycles a ns."""
    steady, body, clock = {}, {}, []
    for (layer, name), g in load_layers(path, model, pos).items():
        for r in g:
            rd, p6, p7 = number(r, "ready_us"), number(r, "probe6_us"), number(r, "probe7_us")
            pro, ret, done = (number(r, "prologue_us"), number(r, "returned_us"),
                              number(r, "done_us"))
            disp = number(r, "dispatched_us")
            if disp is not None and p7 is not None and ret > disp + 1.0 and p7 > disp:
                clock.append((p7 - disp) / (ret - disp))
            if not 3 <= layer <= 26 or None in (rd, p6, p7) or p6 < rd or p7 < rd:
                continue
            end = pro if pro is not None and pro >= p7 else ret
            steady.setdefault(name, []).append((p6 - rd, p7 - p6, end - p7, ret - end, done - ret))
            if pro is not None and pro <= p6:
                body.setdefault(name, []).append((pro - rd, p6 - pro, p7 - p6, ret - p7))
    print("| phase | tasks | ready -> P6 | P6 -> P7 | P7 -> row (or returned) | row -> returned "
          "| returned -> signalled |")
    print("|---|---|---|---|---|---|---|")
    for name, v in steady.items():
        cells = " | ".join(f"{statistics.median(x):.2f}" for x in zip(*v))
        print(f"| {name} | {len(v)} | {cells} |")
    if body:
        print()
        print("| phase | tasks | ready -> row | row -> P6 | P6 -> P7 | P7 -> returned |")
        print("|---|---|---|---|---|---|")
        for name, v in body.items():
            cells = " | ".join(f"{statistics.median(x):.2f}" for x in zip(*v))
            print(f"| {name} | {len(v)} | {cells} |")
    if clock:
        print(f"\nlevel 4: {statistics.median(clock):.3f} cycles a ns (median of {len(clock)} tasks; "
              "meaningful only for an AMK_PROBE=4 build)")


def tail(path, model, pos):
    """The pass after its last layer, phase by phase (a phase is the tasks whose label starts
    with the same name: lm_head, logit_stats, next_token, ...), in us from the last layer task's
    signal: when the phase's tasks were ready (first, last), their median body (ready ->
    returned) and when the last one signalled; the tail's op probes (probe0..) where stamped."""
    rows = load_rows(path, model, pos)
    if len({r["model"] for r in rows}) > 1:
        sys.exit(f"{path}: several models: pass --model")
    layered = [r for r in rows if re.match(r"L\d+\.", r["label"])]
    if not layered:
        sys.exit(f"{path}: no layer tasks")
    t0 = max(number(r, "done_us") for r in layered)
    last_layer = max(int(re.match(r"L(\d+)", r["label"]).group(1)) for r in layered)
    phases = {}
    for r in rows:
        if not re.match(r"L\d+\.", r["label"]) and number(r, "ready_us") >= t0 - 50.0:
            phases.setdefault(re.match(r"[A-Za-z_]+", r["label"]).group(0), []).append(r)
    print(f"after layer {last_layer} (its last task signalled at {t0:.1f} us), us from then")
    print("| phase | tasks | ready first / last | body (median) | last signalled | probes (first task) |")
    print("|---|---|---|---|---|---|")
    for name, g in sorted(phases.items(), key=lambda kv: min(number(r, "ready_us") for r in kv[1])):
        ready = [number(r, "ready_us") - t0 for r in g]
        body = [span(r, "ready_us", "returned_us") for r in g]
        probes = [number(g[0], f"probe{k}_us") for k in range(8)]
        stamped = ", ".join(f"{k}: {v - t0:.1f}" for k, v in enumerate(probes) if v is not None)
        print(f"| {name} | {len(g)} | {min(ready):.1f} / {max(ready):.1f} | {median(body):.2f} "
              f"| {max(number(r, 'done_us') for r in g) - t0:.1f} | {stamped or '-'} |")


def op_probes(path, model, pos, op):
    """An op's own probe points (docs/gpu-testing.md lists each op's), over every task of that
    opcode in layers 3..(last - 2) that stamped at least one: each point's time from the task's
    wait passing (ready), median and 10th / 90th percentiles, in the order of the medians, then
    ready -> returned. Points before the wait come out negative."""
    rows = [r for r in load_rows(path, model, pos) if r["op"] == op]
    layer = lambda r: int(m.group(1)) if (m := re.match(r"L(\d+)\.", r["label"])) else -1  # noqa: E731
    last = max((layer(r) for r in rows), default=-1)
    rows = [r for r in rows if 3 <= layer(r) <= last - 2
            and any(number(r, f"probe{k}_us") is not None for k in range(8))]
    if not rows:
        sys.exit(f"{path}: no {op} task with a probe in layers 3..{last - 2}")
    points = {f"probe{k}": [span(r, "ready_us", f"probe{k}_us") for r in rows] for k in range(8)}
    points["returned"] = [span(r, "ready_us", "returned_us") for r in rows]
    print(f"{op}: {len(rows)} tasks, us from the wait passing")
    print("| point | tasks | median | p10 | p90 |")
    print("|---|---|---|---|---|")
    for name, v in sorted(((n, sorted(x for x in v if x is not None)) for n, v in points.items()),
                          key=lambda kv: median(kv[1])):
        if v:
            p10, p90 = v[len(v) // 10], v[len(v) * 9 // 10]
            print(f"| {name} | {len(v)} | {median(v):.2f} | {p10:.2f} | {p90:.2f} |")


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def span(row, a, b):
    x, y = number(row, a), number(row, b)
    return None if x is None or y is None else y - x


def whole_pass(path, model, pos):
    """Each (model, position) point's pass: its end, layer 0 (the embedding's signal to layer
    0's last signal), a layer (its last signal minus the previous layer's: median, min, max
    over layers 1 to the last, and their sum) and the tail (the last layer's signal to the
    pass's end), in us."""
    points = {}
    for r in load_rows(path, model, pos):
        points.setdefault((r["model"], r["pos"]), []).append(r)
    print("| model | pos | pass | layer 0 | a layer: median / min / max | layers 1-last | tail |")
    print("|---|---|---|---|---|---|---|")
    for (m, p), g in sorted(points.items()):
        end = max(number(r, "done_us") or 0.0 for r in g)
        done = {}
        for r in g:
            lm = re.match(r"L(\d+)\.", r["label"])
            if lm:
                L = int(lm.group(1))
                done[L] = max(done.get(L, 0.0), number(r, "done_us") or 0.0)
        embed = max((number(r, "done_us") or 0.0 for r in g if r["label"] == "embed"), default=0.0)
        layers = sorted(done)
        if len(layers) < 2:
            continue
        steps = [done[b] - done[a] for a, b in zip(layers, layers[1:])]
        print(f"| {m} | {p} | {end:.1f} | {done[layers[0]] - embed:.1f} "
              f"| {median(steps):.2f} / {min(steps):.2f} / {max(steps):.2f} | {sum(steps):.1f} "
              f"| {end - done[layers[-1]]:.1f} |")


def main():
    # piped into head: stop quietly when the reader goes away
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--layer", type=int, default=5)
    ap.add_argument("--model", help="only rows of this model (a CSV may hold several points)")
    ap.add_argument("--pos", type=int, help="only rows of this position")
    ap.add_argument("--late-us", type=float, default=6.0)
    ap.add_argument("--imbalance", action="store_true",
                    help="instead: what each phase lost to its tiles not ending together")
    ap.add_argument("--probe", action="store_true",
                    help="instead: the AMK_PROBE points of a diagnostic build")
    ap.add_argument("--tail", action="store_true",
                    help="instead: the pass after its last layer (LM head, logit stats, next token)")
    ap.add_argument("--op", help="instead: this opcode's own probe points (e.g. ATTENTION_SPLIT)")
    ap.add_argument("--pass", dest="whole", action="store_true",
                    help="instead: each point's whole pass, layer by layer")
    a = ap.parse_args()
    if a.whole:
        whole_pass(a.csv, a.model, a.pos)
        return
    if a.op:
        op_probes(a.csv, a.model, a.pos, a.op)
        return
    if a.tail:
        tail(a.csv, a.model, a.pos)
        return
    if a.imbalance:
        imbalance(a.csv, a.model, a.pos)
        return
    if a.probe:
        probe(a.csv, a.model, a.pos)
        return
    phases = load(a.csv, a.model, a.pos, a.layer)
    if not phases:
        sys.exit(f"{a.csv}: no task of layer {a.layer}")
    models = {r["model"] for g in phases.values() for r in g}
    if len(models) > 1:
        sys.exit(f"{a.csv}: several models ({', '.join(sorted(models))}): pass --model")
    t0 = min(number(r, "ready_us") for g in phases.values() for r in g)
    rel = lambda r, c: number(r, c) - t0  # noqa: E731
    print(f"layer {a.layer}, us from its first ready task")
    print("| phase | tasks | ready first / p50 / last | prologue | body | last returned | last signalled |")
    print("|---|---|---|---|---|---|---|")
    for name, g in phases.items():
        ready = [rel(r, "ready_us") for r in g]
        prologue = [span(r, "ready_us", "prologue_us") for r in g]
        body = [number(r, "returned_us") - (number(r, "prologue_us") or number(r, "ready_us"))
                for r in g]
        print(f"| {name} | {len(g)} | {min(ready):.1f} / {median(ready):.1f} / {max(ready):.1f} "
              f"| {median(prologue):.2f} | {median(body):.2f} "
              f"| {max(rel(r, 'returned_us') for r in g):.1f} "
              f"| {max(rel(r, 'done_us') for r in g):.1f} |")
    print()
    print(f"fixed time per task, medians over tasks reached < {a.late_us} us before ready")
    print("| phase | tasks | reached -> dispatched | dispatched -> wait | wait -> ready "
          "| ready -> row | row -> returned | returned -> signalled |")
    print("|---|---|---|---|---|---|---|---|")
    for name, g in phases.items():
        late = [r for r in g if span(r, "reached_us", "ready_us") < a.late_us] or g
        cols = [("reached_us", "dispatched_us"), ("dispatched_us", "waiting_us"),
                ("waiting_us", "ready_us"), ("ready_us", "prologue_us"),
                ("prologue_us", "returned_us"), ("returned_us", "done_us")]
        cells = " | ".join(f"{median(span(r, x, y) for r in late):.2f}" for x, y in cols)
        print(f"| {name} | {len(late)} of {len(g)} | {cells} |")


if __name__ == "__main__":
    main()
