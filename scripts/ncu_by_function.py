#!/usr/bin/env python3
"""Where the megakernel's warps spend their time: Nsight Compute's per-instruction warp-state
samples summed per source file, per source line and per device function.

Usage: ncu_by_function.py SOURCE.csv KERNEL.dis [TOP]

SOURCE.csv: `ncu -i REP --page source --csv --print-source sass` (one row per SASS instruction
of the kernel, in address order). KERNEL.dis: `nvdisasm -c -g` of the cubin that ran: its
labels name the device functions and its `//## File` comments the source line of every
instruction (the megakernel is compiled with -lineinfo, and the generated source names each
part's file with #line). Rows are matched to instructions by offset from the kernel's first
instruction; the opcode agreement printed first shows that the two listings line up.

A sample is one warp seen in one state, so samples add up warp-time: waiting warps (the
scheduler's barrier and spin) count as much as streaming ones.
"""
import bisect
import csv
import re
import sys
from collections import defaultdict

ALL = "Warp Stall Sampling (All Samples)"


def disassembly(path):
    """(function starts [(offset, name)], opcode by offset, (file, line) by offset) of the
    megakernel's text section."""
    loc = re.compile(r'//## File "([^"]+)", line (\d+)')
    ins = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
    label = re.compile(r"^\s*(\$?[A-Za-z_.$][\w.$]*):\s*$")
    starts, ops, lines = [], {}, {}
    where, pending, section = None, None, ""
    for line in open(path, errors="replace"):
        if line.lstrip().startswith(".section"):
            section = line.split()[1]
            continue
        m = loc.search(line)
        if m:
            where = (m.group(1), int(m.group(2)))
            continue
        m = label.match(line)
        if m and not m.group(1).startswith(".L"):
            pending = m.group(1)
            continue
        m = ins.search(line)
        if m and "amk_megakernel" in section:
            off = int(m.group(1), 16)
            ops[off] = m.group(3).split(".")[0]
            lines[off] = where or ("?", 0)
            if pending is not None:
                starts.append((off, pending))
                pending = None
    starts.sort()
    return starts, ops, lines


def short(name):
    """`ns::fn I<template args…>` from a mangled name: enough to tell functions apart."""
    name = name.strip("$").replace("amk_megakernel$", "")
    m = re.search(r"_Z(N?)", name)
    if not m:
        return name
    i, parts = m.end(), []
    while i < len(name) and name[i].isdigit():
        j = i
        while name[j].isdigit():
            j += 1
        n = int(name[i:j])
        parts.append(name[j : j + n])
        i = j + n
        if not m.group(1):
            break
    rest = name[i:]
    return "::".join(parts) + (f" {rest[:40]}" if rest.startswith("I") else "")


def table(title, groups, reasons, total, top):
    print(title)
    for key, d in sorted(groups.items(), key=lambda kv: -kv[1][ALL])[:top]:
        v = d[ALL]
        rs = sorted(reasons, key=lambda c: -d[c])[:3]
        mix = ", ".join(f"{c[6:]}={d[c] / max(v, 1) * 100:.0f}%" for c in rs)
        print(f"  {v / total * 100:6.2f}%  exec {d['exec']:11.0f}  {key[-64:]:64s} {mix}")
    print()


def main():
    src, dis = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    starts, ops, lines = disassembly(dis)
    rows = list(csv.reader(open(src, errors="replace")))
    hi = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, body = rows[hi], rows[hi + 1 :]
    ix = {c: i for i, c in enumerate(hdr)}
    reasons = [c for c in hdr if c.startswith("stall_") and "Not Issued" not in c]
    base = int(body[0][ix["Address"]], 16)
    keys = [s for s, _ in starts]

    def num(r, c):
        try:
            return float(r[ix[c]] or 0)
        except (ValueError, KeyError, IndexError):
            return 0.0

    per = {k: defaultdict(lambda: defaultdict(float)) for k in ("file", "line", "fn")}
    agree = total = 0
    for r in body:
        off = int(r[ix["Address"]], 16) - base
        words = [w for w in r[ix["Source"]].split() if not w.startswith("@")]
        agree += bool(words) and ops.get(off) == words[0].split(".")[0]
        f, ln = lines.get(off, ("?", 0))
        k = bisect.bisect_right(keys, off) - 1
        fn = short(starts[k][1]) if k >= 0 else "?"
        v = num(r, ALL)
        total += v
        for group, key in (("file", f), ("line", f"{f}:{ln}"), ("fn", fn)):
            d = per[group][key]
            d[ALL] += v
            d["exec"] += num(r, "Instructions Executed")
            for c in reasons:
                d[c] += num(r, c)
    print(f"{len(body)} instructions, {agree} opcodes agree with the disassembly; {total:.0f} samples")
    overall = defaultdict(float)
    for d in per["file"].values():
        for c in reasons:
            overall[c] += d[c]
    print("overall:", ", ".join(f"{c[6:]}={overall[c] / total * 100:.1f}%"
                                for c in sorted(reasons, key=lambda c: -overall[c])[:8]))
    print()
    table("per source file:", per["file"], reasons, total, top)
    table("per source line:", per["line"], reasons, total, top)
    table("per device function:", per["fn"], reasons, total, top)


if __name__ == "__main__":
    main()
