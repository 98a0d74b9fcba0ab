#!/usr/bin/env python3
"""Compares two compiled megakernels function by function: what changed in code an edit did
not touch.

The megakernel is one module, compiled as a whole: a change to one op's device code can move
the register allocation and instruction schedule of every other function, the weight-streaming
GEMV loops included, and such moves have cost or gained 1-4 % of a decode token end to end
(docs/perf-notes.md round 53). Before reading an end-to-end difference as the edited op's, run
this on the two builds' kernels for the same program: it lists each function whose machine
code differs, with its instruction count, its local-memory instructions (STL/LDL: spills and
stack arguments) and how similar its opcode sequence is (1.000: the same opcodes in the same
order; register names and constants are ignored).

Input: two cubins from the cache (`amk ops compile --arch sm_90a --model F --cache-dir DIR`
with each build; `amk ops compile` prints each kernel's file), disassembled by `nvdisasm -c`
(pip package nvidia-cuda-nvdisasm), or those disassemblies themselves:

    scripts/sass_diff.py BEFORE.cubin AFTER.cubin [--only REGEX] [--all]

Prints the totals, then one row per function that differs (largest change first; `--all`
also lists the identical ones). `--selftest` checks the parsing and the table on a made-up
disassembly, with no nvdisasm.
"""

import argparse
import difflib
import re

from sass_wait_path import disassemble

FUNC = re.compile(r"\s*\.type\s+\$amk_megakernel\$(\S+),@function")
ENTRY = re.compile(r"\s*\.text\.(amk_megakernel|amk_apply_patches):")
INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def functions(lines):
    """{function name: [(opcode, operands)]}: the kernel's entries under their own names,
    device functions under their mangled names."""
    funcs, cur = {}, None
    for line in lines:
        m = FUNC.match(line)
        if m:
            cur = m.group(1)
            funcs.setdefault(cur, [])
            continue
        m = ENTRY.match(line)
        if m:
            cur = "<" + m.group(1) + ">"
            funcs.setdefault(cur, [])
            continue
        m = INSTR.search(line)
        if cur is not None and m:
            funcs[cur].append((m.group(2), m.group(3).strip()))
    return funcs


def local_ops(instrs):
    return sum(1 for op, _ in instrs if op.startswith(("STL", "LDL")))


def compare(before, after, only=None, show_all=False):
    """Rows (name, before count, before local, after count, after local, opcode similarity,
    identical) for the functions of either build, largest change first."""
    rows = []
    for name in sorted(set(before) | set(after)):
        if only and not re.search(only, name):
            continue
        a, b = before.get(name, []), after.get(name, [])
        same = a == b
        if same and not show_all:
            continue
        ratio = difflib.SequenceMatcher(None, [o for o, _ in a], [o for o, _ in b], autojunk=False).ratio()
        rows.append((name, len(a), local_ops(a), len(b), local_ops(b), ratio, same))
    rows.sort(key=lambda r: (-abs(r[3] - r[1]), r[5], r[0]))
    return rows


def table(before, after, rows):
    total = lambda fs: sum(len(v) for v in fs.values())
    loc = lambda fs: sum(local_ops(v) for v in fs.values())
    out = [
        f"total: {total(before)} -> {total(after)} instructions, "
        f"{loc(before)} -> {loc(after)} local-memory ones, "
        f"{len(before)} -> {len(after)} functions",
        "| function | instructions | local (STL/LDL) | opcode similarity |",
        "|---|---|---|---|",
    ]
    for name, n0, l0, n1, l1, ratio, same in rows:
        tag = " (identical)" if same else ""
        out.append(f"| {name[:90]}{tag} | {n0} -> {n1} | {l0} -> {l1} | {ratio:.3f} |")
    return "\n".join(out)


SAMPLE_A = """
        .text.amk_megakernel:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R2 ;
        .type           $amk_megakernel$_Z4gemvv,@function
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0030*/                   FFMA R8, R4, R5, R8 ;
        /*0040*/               @P0 BRA 0x20 ;
        .type           $amk_megakernel$_Z4tailv,@function
        /*0050*/                   EXIT ;
"""
SAMPLE_B = """
        .text.amk_megakernel:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R2 ;
        /*0018*/                   STL [R1+0x8], R3 ;
        .type           $amk_megakernel$_Z4gemvv,@function
        /*0020*/                   LDG.E.128 R6, desc[UR4][R2.64] ;
        /*0030*/                   FFMA R9, R6, R7, R9 ;
        /*0040*/               @P0 BRA 0x20 ;
        .type           $amk_megakernel$_Z4tailv,@function
        /*0050*/                   EXIT ;
"""


def selftest():
    a, b = functions(SAMPLE_A.split("\n")), functions(SAMPLE_B.split("\n"))
    assert set(a) == {"<amk_megakernel>", "_Z4gemvv", "_Z4tailv"}, a
    assert [o for o, _ in a["_Z4gemvv"]] == ["LDG.E.128", "FFMA", "BRA"], a["_Z4gemvv"]
    rows = compare(a, b)
    # The entry grew a spill; the GEMV changed registers only; the tail is identical.
    assert [r[0] for r in rows] == ["<amk_megakernel>", "_Z4gemvv"], rows
    assert rows[0][1:5] == (2, 1, 3, 2), rows[0]
    assert rows[1][5] == 1.0 and not rows[1][6], rows[1]
    assert len(compare(a, b, show_all=True)) == 3
    assert compare(a, b, only="gemv")[0][0] == "_Z4gemvv"
    text = table(a, b, rows)
    assert "total: 6 -> 7 instructions, 1 -> 2 local-memory ones" in text, text
    print("sass_diff.py selftest: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", nargs="?")
    ap.add_argument("after", nargs="?")
    ap.add_argument("--only", help="only functions whose name matches this regular expression")
    ap.add_argument("--all", action="store_true", help="also list the identical functions")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        selftest()
        return
    if not (args.before and args.after):
        ap.error("two cubins (or disassemblies) are needed")
    before = functions(disassemble(args.before))
    after = functions(disassemble(args.after))
    print(table(before, after, compare(before, after, args.only, args.all)))


if __name__ == "__main__":
    main()
