#!/usr/bin/env python3
"""Do two runs have the same schedule? (the proof a refactoring changed no behaviour)

    python bench/same_schedule.py A/results.json A.csv B/results.json B.csv

A and B are two runs of the same command with --seed, one worker (so the order of operations is the
schedule's, not the threads') and --io-trace: their block operations (op, tier, bytes, key) must be the
same sequence, and every integer count of results.json (requests, blocks, bytes, tokens; latencies,
time series, gauges and telemetry aside) the same.
"""

from __future__ import annotations

import csv
import json
import sys

TIMED = ("series", "gauges", "histogram", "telemetry", "memory", "ns", "rss", "cpu", "timeseries", "_s")


def operations(path: str) -> list[tuple]:
    with open(path, newline="") as f:
        return [(r["op"], r["tier"], r["bytes"], r["key"]) for r in csv.DictReader(f)]


def counts(path: str) -> dict[str, int]:
    out: dict[str, int] = {}

    def walk(x, where: str) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}.{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")
        elif isinstance(x, int) and not isinstance(x, bool) and not any(t in where for t in TIMED):
            out[where] = x
    walk(json.load(open(path)), "")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    res_a, ops_a, res_b, ops_b = argv
    oa, ob = operations(ops_a), operations(ops_b)
    ca, cb = counts(res_a), counts(res_b)
    both = (set(ca) & set(cb)) - {".schema_version"}
    differ = sorted(k for k in both if ca[k] != cb[k])
    print(f"block operations: {len(oa):,} vs {len(ob):,}, " + ("the same sequence" if oa == ob else "DIFFERENT"))
    print(f"integer counts in both: {len(both)} compared, " + ("all equal" if not differ else
                                                               f"{len(differ)} differ: {differ[:10]}"))
    added = sorted(set(cb) - set(ca))
    if added:
        print(f"only in the second (new keys, not compared): {', '.join(added[:10])}")
    return 0 if oa == ob and not differ else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
