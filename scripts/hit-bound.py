#!/usr/bin/env python3
"""The best hit ratio any hot tier of S rows can reach on synthetic traffic.

The load generator draws each table's ids from a Zipf(s) law over its rows
(prism loadgen --zipf, default 1.05), one id per table per sample. A cache
of S rows shared by all tables hits at most the S most probable rows'
share of all draws (a static oracle keeping the top S; no admission policy
beats it on independent draws). This prints that bound for each S, to
compare with a run's prism_store_hot_hits_total / (hits + misses).

  scripts/hit-bound.py PLAN_DIR_OR_ROWS [--zipf 1.05] [--slots 1100000,2000000]

PLAN_DIR_OR_ROWS: a partition folder (its plan.json's tables) or rows as a
comma-separated list. Every table is counted once per sample.
"""
import argparse
import heapq
import json
import os
import sys


def table_rows(arg):
    if os.path.isdir(arg):
        with open(os.path.join(arg, "plan.json")) as f:
            return [t["rows"] for t in json.load(f)["tables"]]
    return [int(x) for x in arg.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tables")
    ap.add_argument("--zipf", type=float, default=1.05)
    ap.add_argument("--slots", default="500000,1100000,1450000,1900000,4000000")
    a = ap.parse_args()
    rows = table_rows(a.tables)
    slots = sorted(int(x) for x in a.slots.split(","))
    s = a.zipf
    # Each table's probabilities fall with rank, so the top S rows overall
    # are a merge of the tables' rank orders: walk it with a heap.
    norm = []
    for n in rows:
        h = 0.0
        for k in range(1, n + 1):
            h += k ** -s
        norm.append(h * len(rows))
    heap = [(-(1.0 / norm[t]), t, 1) for t in range(len(rows))]
    heapq.heapify(heap)
    total, taken, out = 0.0, 0, []
    for want in slots:
        while taken < want and heap:
            p, t, k = heapq.heappop(heap)
            total -= p
            taken += 1
            if k < rows[t]:
                heapq.heappush(heap, (-((k + 1) ** -s / norm[t]), t, k + 1))
        out.append((want, total))
    print(f"{len(rows)} tables, {sum(rows)} rows, Zipf {s}")
    for want, hit in out:
        print(f"  {want:>10} rows held: hit ratio at most {hit:.4f}")


if __name__ == "__main__":
    sys.exit(main())
