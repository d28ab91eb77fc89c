#!/usr/bin/env python3
"""The fleet sub-command's own speed (issue 53 asks 1,000 engines over 10 million requests in minutes on one core):
requests per second of planning and of one (engine count, router) point, on one pinned core, and what 10 million
requests would take at that rate.

The traffic: synthetic users (the fleet's own interleaving, Poisson arrivals), llama3.1-8b, --block-tokens 64 by
default; --requests of them planned once, then each engine count of --engines with the round-robin, least-loaded
and prefix routers (prefix asks the engines a request's chain head was sent to how much of it they still hold).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_cache.config import resolve  # noqa: E402
from kv_cache.fleet.simulate import EngineSpec, simulate  # noqa: E402
from kv_cache.fleet.stream import planned_stream  # noqa: E402
from kv_cache.model import GiB  # noqa: E402
from kv_cache.run.geometry import chain_id, geometry  # noqa: E402
from kv_cache.run.registry import discover  # noqa: E402

TARGET = 10_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--engines", default="1,64,1000")
    ap.add_argument("--block-tokens", type=int, default=64)
    ap.add_argument("--models", default="stack,cache", help="Engine models to time (--engine-model).")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core, as the issue asks
    reg = discover()
    sets = {"model.name": "llama3.1-8b", "model.block_tokens": args.block_tokens, "workload.users": 2000,
            "schedule.request_rate": 200.0, "run.max_requests": args.requests, "tiers.gpu_mem_gb": 2.0,
            "tiers.cpu_mem_gb": 8.0}
    s = resolve(None, [f"{k}={v}" for k, v in sets.items()], {}, media_sections=reg.sections())
    start = time.perf_counter()
    geo = geometry(s)
    stream = planned_stream(s, None, geo.slot_bytes, chain_id(s, geo), lambda *a: None)
    plan_s = time.perf_counter() - start
    blocks = len(stream.requests.keys)
    print(f"fleet bench: {len(stream.requests):,} synthetic requests ({blocks / len(stream.requests):.0f} blocks "
          f"each, {args.block_tokens}-token blocks), one core")
    print(f"  planning: {len(stream.requests) / plan_s:,.0f} requests/s")
    print(f"  {'model':<6}  {'engines':>8}  {'router':<12}  {'requests/s':>10}  {'10M requests':>12}")
    for model in args.models.split(","):
        spec = EngineSpec(int(2 * GiB), int(8 * GiB), 0, reg.policies["lru"], 0.08, 20.0, 0.25, "demote", model)
        for n in (int(x) for x in args.engines.split(",")):
            for router in ("round-robin", "least-loaded", "prefix"):
                sim = simulate(stream, n, reg.routers[router], spec, lambda *a: None)
                rate = len(stream.requests) / sim.seconds
                print(f"  {model:<6}  {n:>8}  {router:<12}  {rate:>10,.0f}  {TARGET / rate / 60:>8,.0f} min")


if __name__ == "__main__":
    main()
