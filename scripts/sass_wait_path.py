#!/usr/bin/env python3
"""Counts, in a compiled megakernel, what each op runs from its dispatch to its wait.

The late tile of a decode phase runs this code between its previous task and the wait for its
producers, on the critical path (docs/perf-notes.md rounds 10 and 11). A verified task's path
should be straight-line: a handful of branches, two calls (the out-of-line checks, skipped,
and amk_task_wait). If a compiler change inlines an op's checked setup into the dispatcher,
the count of branches and calls jumps, and so does the path's time; this script shows it
without a GPU.

Input: a cubin from the cache (`amk ops compile --arch sm_90a --cache-dir DIR`), disassembled
with line information by `nvdisasm -g -c` (pip package nvidia-cuda-nvdisasm), or that
disassembly itself. For each op, the instructions of the dispatcher from the op's first line to
the first call of `amk_task_wait`, in address order. The dispatcher is inlined into the kernel's
entry (`amk_megakernel`) by default; with `AMK_DISPATCH_INLINE=0` it is `amk_dispatch`, out of
line:

    scripts/sass_wait_path.py DIR/HASH.sm_90a.cubin [--op GATE_UP_SILU ...] [--list]

Prints one row per op: instructions, loads, branches, calls. `--list` also prints the path.
"""

import argparse
import re
import shutil
import subprocess
import sys

DEFAULT_OPS = ["GATE_UP_SILU", "QKV_ROPE_APPEND", "RMSNORM_GEMV", "ATTENTION_TILE"]
# Where the dispatcher's code is: out of line, or inlined into the entry.
DISPATCH = ["$amk_megakernel$_Z12amk_dispatchRK12amk_task_ctx:", "amk_megakernel:"]
LINE = re.compile(r'File "([^"]*)", line (\d+)')


def disassemble(path):
    if not path.endswith(".cubin"):
        with open(path) as f:
            return f.read().split("\n")
    tool = shutil.which("nvdisasm")
    if tool is None:
        sys.exit("nvdisasm not found (pip install nvidia-cuda-nvdisasm, then put its bin/ on PATH)")
    out = subprocess.run([tool, "-g", "-c", path], check=True, capture_output=True, text=True)
    return out.stdout.split("\n")


def dispatch_body(lines):
    start = next((lines.index(d) for d in DISPATCH if d in lines), None)
    if start is None:
        sys.exit("no dispatcher in the disassembly (not a megakernel cubin?)")
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith("$") and lines[i].endswith(":")),
        len(lines),
    )
    return lines[start:end]


def wait_path(body, op):
    """(source location, instruction) from the op's first line to its amk_task_wait call."""
    first = next((i for i, l in enumerate(body) if (m := LINE.search(l)) and m.group(1).endswith("op " + op)), None)
    if first is None:
        return None
    where, path = "", []
    for l in body[first:]:
        m = LINE.search(l)
        if m:
            where = f"{m.group(1).split('/')[-1]}:{m.group(2)}"
            continue
        if "*/" not in l:
            continue
        ins = l.split("*/", 1)[1].strip().rstrip(";").strip()
        if not ins:
            continue
        path.append((where, ins))
        if "CALL" in ins and "amk_task_wait" in ins:
            break
    return path


def opcode(ins):
    words = ins.split()
    return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cubin", help="a megakernel cubin, or its `nvdisasm -g -c` text")
    ap.add_argument("--op", action="append", help="op name as registered (default: the decode ops)")
    ap.add_argument("--list", action="store_true", help="also print each path")
    args = ap.parse_args()
    body = dispatch_body(disassemble(args.cubin))
    print("| op | instructions | loads | branches | calls |")
    print("|---|---|---|---|---|")
    paths = []
    for op in args.op or DEFAULT_OPS:
        path = wait_path(body, op)
        if path is None:
            print(f"| {op} | not in the dispatcher | | | |")
            continue
        ops = [opcode(i) for _, i in path]
        loads = sum(o.split(".")[0] in ("LD", "LDL", "LDS", "LDG", "LDC") for o in ops)
        branches = sum(o.split(".")[0] in ("BRA", "BRX") for o in ops)
        calls = sum(o.split(".")[0] == "CALL" for o in ops)
        print(f"| {op} | {len(path)} | {loads} | {branches} | {calls} |")
        paths.append((op, path))
    if args.list:
        for op, path in paths:
            print(f"\n{op}:")
            for where, ins in path:
                print(f"  {where:32s} {ins}")


if __name__ == "__main__":
    main()
