#!/usr/bin/env python3
"""Do two runs have the same schedule? (the proof a refactoring changed no behaviour)

    python bench/same_schedule.py A/results.json A.csv B/results.json B.csv
    python bench/same_schedule.py record DIR [-- more flags]   # the four standard sequences into DIR
    python bench/same_schedule.py compare DIR_A DIR_B           # each sequence of A against B's
    python bench/same_schedule.py compare DIR_A DIR_B --batched # B ran --request-io batched, A serial

A and B are two runs of the same command with --seed, one worker (so the order of operations is the
schedule's, not the threads') and --io-trace: their block operations (op, tier, bytes, key) must be the
same sequence, and every integer count of results.json (requests, blocks, bytes, tokens; latencies,
time series, gauges and telemetry aside) the same. ``record`` runs the four sequences a change is proven on
(synthetic users, a Mooncake trace, RAG chunks, semantic transforms), one request at a time in the
schedule's order (--arrival sequence: no think time or arrival clock decides what runs), each ended by its
--max-requests, small tiers so that blocks are evicted and demoted; the Mooncake trace is read from
../shared/traces beside the clone (skipped when absent).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOONCAKE = os.path.join(os.path.dirname(REPO), "shared", "traces", "mooncake", "conversation_trace.jsonl")
COMMON = ["--model", "llama3.1-8b", "--workers", "1", "--seed", "7", "--gpu", "off", "--cpu-mem-gb", "0.25",
          "--nvme-gb", "1", "--no-telemetry", "--warmup", "0", "--arrival", "sequence", "--duration", "3600"]
SEQUENCES = {
    "synthetic": ["--users", "1", "--max-requests", "200"],
    "mooncake": ["--trace", MOONCAKE, "--max-requests", "300"],
    "rag": ["--users", "1", "--rag", "--rag-reuse", "chunk", "--request-probability", "1", "--num-documents", "20",
            "--max-requests", "150"],
    "semantic": ["--users", "1", "--semantic", "--max-requests", "120"],
}

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


def record(folder: str, more: list[str]) -> int:
    """Run each sequence once into folder/<name>/ (results.json, ops.csv); 0 when every run exited 0."""
    failed = 0
    for name, flags in SEQUENCES.items():
        if name == "mooncake" and not os.path.exists(MOONCAKE):
            print(f"{name}: skipped: the trace is read from {MOONCAKE}, absent here")
            continue
        out = os.path.join(folder, name)
        if os.path.exists(out):
            print(f"{folder} holds a {name} run already; record into a new folder.")
            return 1
        os.makedirs(out)
        with tempfile.TemporaryDirectory() as cache:
            cmd = [sys.executable, os.path.join(REPO, "kv_cache_benchmark.py"), *COMMON, *flags, *more,
                   "--cache-dir", cache, "--output-dir", out, "--io-trace", os.path.join(out, "ops.csv")]
            r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            failed += 1
            print(f"{name}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
            continue
        found = sorted(glob.glob(os.path.join(out, "*", "results.json")))
        os.replace(found[-1], os.path.join(out, "results.json"))
        res = json.load(open(os.path.join(out, "results.json")))
        if res["run"]["stopped_reason"] != "max_requests":  # a clock ended it: not the same schedule twice
            failed += 1
            print(f"{name}: ended by {res['run']['stopped_reason']}, not --max-requests: not a schedule to compare")
        print(f"{name}: {sum(1 for _ in operations(os.path.join(out, 'ops.csv'))):,} block operations")
    return 1 if failed else 0


# a batch's shape, not the schedule's
BATCH_COUNTS = ("ops.", "latency", "queue_depth", "request_latency", "max_inflight")


def same_cache(res_a: str, ops_a: str, res_b: str, ops_b: str) -> int:
    """A batched run against a serial one: the same cache decisions in the same order (every eviction, demotion
    and promotion into each tier, as a (tier, key) sequence), the same multiset of block operations (a batch groups a
    request's reads by tier: their order within a request differs) and every integer count equal but the batches'
    own (how many load / store batches, their depth)."""
    oa, ob = operations(ops_a), operations(ops_b)
    moves = {o[:2] for o in oa + ob if o[0] in ("evict", "demote", "promote")}  # each (op, tier): a batch's
    same_moves = all([o for o in oa if o[:2] == m] == [o for o in ob if o[:2] == m] for m in moves)  # demotions
    # land deepest tier first, so only their order into each tier is serial mode's
    same_ops = sorted(oa) == sorted(ob)
    ca, cb = counts(res_a), counts(res_b)
    both = (set(ca) & set(cb)) - {".schema_version"}
    differ = sorted(k for k in both if ca[k] != cb[k] and not any(b in k for b in BATCH_COUNTS))
    print(f"block operations: {len(oa):,} vs {len(ob):,}, " + ("the same multiset" if same_ops else "DIFFERENT"))
    print("evictions, demotions, promotions: " + ("the same sequences" if same_moves else "DIFFERENT"))
    print(f"integer counts in both: {len(both)} compared, " + ("all equal" if not differ else
                                                               f"{len(differ)} differ: {differ[:10]}"))
    return 0 if same_ops and same_moves and not differ else 1


def compare(folder_a: str, folder_b: str, batched: bool = False) -> int:
    worst = 0
    for name in SEQUENCES:
        a, b = os.path.join(folder_a, name), os.path.join(folder_b, name)
        if not (os.path.exists(os.path.join(a, "results.json")) and os.path.exists(os.path.join(b, "results.json"))):
            print(f"{name}: not in both folders")
            continue
        print(f"{name}:")
        files = [os.path.join(a, "results.json"), os.path.join(a, "ops.csv"), os.path.join(b, "results.json"),
                 os.path.join(b, "ops.csv")]
        worst = max(worst, same_cache(*files) if batched else main(files))
    return worst


def main(argv: list[str]) -> int:
    if argv[:1] == ["record"] and len(argv) >= 2:
        return record(argv[1], [a for a in argv[2:] if a != "--"])
    if argv[:1] == ["compare"] and len(argv) in (3, 4) and argv[3:] in ([], ["--batched"]):
        return compare(argv[1], argv[2], argv[3:] == ["--batched"])
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
