#!/usr/bin/env python3
"""Compares two `amk perplexity --logits-out` files position by position.

    scripts/compare_logits.py REFERENCE.json CANDIDATE.json [--tol 1e-5]

Both must have fed the same token ids. For each position both hold, prints the relative error
max|a - b| / max|b| (b: the reference) and whether the argmax agrees; exits 1 when any error
exceeds --tol, 2 on unusable input. Standard library only.
"""
import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reference")
    ap.add_argument("candidate")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    try:
        ref, cand = (json.load(open(p)) for p in (a.reference, a.candidate))
    except (OSError, ValueError) as e:
        print(f"compare_logits: {e}", file=sys.stderr)
        return 2
    n = min(len(ref["ids"]), len(cand["ids"]))
    if ref["ids"][:n] != cand["ids"][:n]:
        print("compare_logits: the two runs fed different token ids", file=sys.stderr)
        return 2
    theirs = dict(zip(cand["positions"], cand["logits"]))
    worst, rows = 0.0, 0
    print(f"reference {ref.get('backend')} {ref.get('dtype')}, candidate {cand.get('backend')} {cand.get('dtype')}")
    print("| position | relative error | argmax ref | argmax cand |")
    print("|---|---|---|---|")
    for pos, want in zip(ref["positions"], ref["logits"]):
        got = theirs.get(pos)
        if got is None or len(got) != len(want):
            continue
        scale = max(max(abs(x) for x in want), 1e-30)
        err = max(abs(x - y) for x, y in zip(got, want)) / scale
        am = lambda v: max(range(len(v)), key=v.__getitem__)
        print(f"| {pos} | {err:.3e} | {am(want)} | {am(got)} |")
        worst, rows = max(worst, err), rows + 1
    if rows == 0:
        print("compare_logits: no position in common", file=sys.stderr)
        return 2
    ok = worst <= a.tol
    print(f"worst {worst:.3e} over {rows} positions: {'within' if ok else 'EXCEEDS'} {a.tol:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
