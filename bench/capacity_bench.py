#!/usr/bin/env python3
"""make bench, the capacity curve (issue 41): how long one million block accesses take, and the error of SHARDS
sampling against the exact curve.

A synthetic access stream of requests sharing Zipf-popular prefixes (the shape of conversation traffic: a few hot
system prompts, long tails), --accesses of them (1,000,000 by default), 256 slots above the bottom tier:
1. the exact stack distances and curve (recorder/stack_distances.py), timed on one core (the process is pinned);
2. the same curve sampled at rates 0.1 and 0.01: the largest absolute difference in token hit rate from the exact
   curve over its capacity grid, in percentage points.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_cache.recorder.access_log import AccessLog  # noqa: E402
from kv_cache.recorder.stack_distances import COLUMNS, capacity_grid, curve  # noqa: E402


def synthetic(accesses: int, seed: int = 1) -> dict:
    """Requests of a chain: a system prompt (one of 20, Zipf), a conversation's history (one of 20,000, Zipf),
    new blocks; 16 tokens a block."""
    rng = np.random.default_rng(seed)
    log, n, fresh = AccessLog(), 0, 1 << 40
    tok = (16,) + (0,) * (len(COLUMNS) - 1)
    while n < accesses:
        system = int(rng.zipf(1.5)) % 20
        convo = int(rng.zipf(1.2)) % 20_000
        chain = [system * 1000 + i + 1 for i in range(8)]
        chain += [10**7 + convo * 100 + i for i in range(int(rng.integers(4, 40)))]
        chain += [fresh + n + i for i in range(int(rng.integers(2, 20)))]
        log.request([(k, tok, p, "system") for k, p in zip(chain, [0, *chain[:-1]])], ((0, len(chain), False),), [],
                    16 * len(chain), 1)
        n += len(chain)
    return log.arrays()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", type=int, default=1_000_000)
    a = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core, as the issue asks
    log = synthetic(a.accesses)
    upper = 256
    grid = capacity_grid(log, upper, 40)
    start = time.perf_counter()
    exact = curve(log, upper, grid, rate=1.0)
    took = time.perf_counter() - start
    print(f"capacity curve: {len(log['keys']):,} accesses, {len(np.unique(log['keys'])):,} distinct blocks, "
          f"{len(grid)} capacities: {took:.2f} s on one core (target < 10 s); infinite-cache hit rate "
          f"{exact.infinite:.1%}")
    for rate in (0.1, 0.01):
        start = time.perf_counter()
        sampled = curve(log, upper, grid, rate=rate)
        err = np.abs(sampled.hit_rate - exact.hit_rate).max() * 100
        print(f"  sampled at {rate:g}: {time.perf_counter() - start:.2f} s, largest error {err:.2f} percentage "
              f"points over the grid")


if __name__ == "__main__":
    main()
