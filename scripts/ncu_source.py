#!/usr/bin/env python3
"""Reads Nsight Compute's per-instruction source view of one kernel (a CSV) and says where its
warps stall and how many instructions it runs per unit of work, without the GUI.

On the GPU machine:

    ncu --section SourceCounters --section WarpStateStats --kernel-name regex:attn_bwd_sm90 \\
        --launch-skip 1 --launch-count 1 -o $OUT/r ./bench --backend nvidia --only "attn_bwd causal"
    ncu -i $OUT/r.ncu-rep --page source --print-source sass --csv > $OUT/r.csv

Here:

    python3 scripts/ncu_source.py r.csv                    # stalls by reason, the top 40 instructions
    python3 scripts/ncu_source.py r.csv --per LDG.E.CONSTANT --mix
    python3 scripts/ncu_source.py r.csv --range 440 500     # the SASS around an instruction

``--per PATTERN`` divides every executed count by that of the most executed instruction whose
text contains PATTERN (an instruction that runs once a warp per unit of work: a tile's load, its
first MMA), so ``--mix`` prints the instructions a warp runs per unit by opcode. How the
attention backward's mask selects and vector-register descriptors were found
(docs/performance-log.md, 2026-11-30 night: 876 instructions a warp a tile).
"""

import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    try:
        head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    except StopIteration:
        sys.exit(f"ncu_source.py: {path} has no 'Address' header row (expected `ncu -i ... --page source --csv`)")
    header = rows[head]
    col = {name: i for i, name in enumerate(header)}
    for name in ("Source", SAMPLES, EXECUTED):
        if name not in col:
            sys.exit(f"ncu_source.py: {path} has no '{name}' column (profile with --section SourceCounters)")
    data = [r for r in rows[head + 1 :] if len(r) == len(header)]
    return header, col, data


def opcode(source):
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0] if words else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="the CSV of `ncu -i REPORT --page source --print-source sass --csv`")
    ap.add_argument("--top", type=int, default=40, help="instructions with the most stall samples to list")
    ap.add_argument("--per", metavar="PATTERN", help="normalise executed counts by this instruction's")
    ap.add_argument("--mix", action="store_true", help="executed instructions by opcode (with --per: per unit)")
    ap.add_argument("--range", nargs=2, type=int, metavar=("FIRST", "END"), help="print rows FIRST..END-1")
    args = ap.parse_args()

    header, col, data = load(args.csv)
    stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(number(r[col[SAMPLES]]) for r in data) or 1.0

    unit = None
    if args.per:
        counts = [number(r[col[EXECUTED]]) for r in data if args.per in r[col["Source"]]]
        if not counts or max(counts) == 0:
            sys.exit(f"ncu_source.py: no executed instruction contains {args.per!r}")
        unit = max(counts)

    if args.range:
        first, end = args.range
        for i in range(max(first, 0), min(end, len(data))):
            r = data[i]
            ex = number(r[col[EXECUTED]])
            shown = f"{ex / unit:8.2f}" if unit else f"{ex:12.0f}"
            print(f"{i:5d} {100 * number(r[col[SAMPLES]]) / total:5.2f}% {shown} {r[col['Source']].strip()[:110]}")
        return

    by_reason = collections.Counter()
    for r in data:
        for h in stall_cols:
            by_reason[h] += number(r[col[h]])
    print(f"{int(total)} stall samples; by reason:")
    for h, v in by_reason.most_common(12):
        print(f"  {h[len('stall_'):]:20s} {100 * v / total:5.1f}%")

    if args.mix:
        executed = collections.Counter()
        for r in data:
            executed[opcode(r[col["Source"]])] += number(r[col[EXECUTED]])
        scale = unit or 1.0
        label = f"per {args.per}" if unit else "executed"
        print(f"instructions ({label}): {sum(executed.values()) / scale:.1f} in all")
        for op, v in executed.most_common(30):
            print(f"  {op:32s} {v / scale:10.1f}")

    top = sorted(range(len(data)), key=lambda i: -number(data[i][col[SAMPLES]]))[: args.top]
    print(f"the {len(top)} instructions with the most samples (row, share, the three largest reasons):")
    for i in sorted(top):
        r = data[i]
        reasons = sorted(((number(r[col[h]]), h[len("stall_") :]) for h in stall_cols), reverse=True)[:3]
        why = " ".join(f"{h}:{100 * v / total:.1f}" for v, h in reasons if v)
        print(f"{i:5d} {100 * number(r[col[SAMPLES]]) / total:5.2f}% {r[col['Source']].strip()[:70]:70s} {why}")


if __name__ == "__main__":
    main()
