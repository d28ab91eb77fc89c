"""Eviction cost per policy on a large tier: evictions per second with 100,000 slots.

A NullTier of 100,000 small slots is filled with chains of 8 blocks (every 16th chain shares a
head), then new chained blocks are written for a fixed time: each write evicts one block (a
chain's tail, see cache.py). The figure is the cache's own bookkeeping (reserve, policy, index)
per eviction under its lock, no bytes moved: it must not grow with the tier (O(log n) per verb).
"""

from __future__ import annotations

import time

import numpy as np

from kv_cache.cache.cache import BlockCache
from kv_cache.cache.policies import POLICIES
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.null import NullTier

SLOT = 4096
BUF = np.zeros(SLOT, np.uint8)


def _write(cache: BlockCache, key: int, parent: int | None) -> bool:
    res = cache.reserve_write(key, SLOT, "user", parent)
    if res is None:
        return False
    cache.commit_write(res, BUF, "prefill", BUF)
    return True


def evictions_per_s(policy: str, slots: int, seconds: float) -> float:
    rec = Recorder()
    rec.start_measuring(0)
    cache = BlockCache([NullTier("nvme", slots * SLOT, SLOT)], POLICIES[policy], False, rec)
    key = 0
    while key < slots:  # fill: chains of 8, a hit on every third block to give LFU/S3-FIFO something
        parent = None
        for _ in range(8):
            _write(cache, key, parent)
            if key % 3 == 0:
                cache.unpin(cache.pin_prefix([key]))
            parent, key = key, key + 1
    start, done, parent = time.perf_counter(), 0, None
    while time.perf_counter() - start < seconds:
        for _ in range(256):
            parent = key - 1 if key % 8 else None
            done += _write(cache, key, parent)
            key += 1
    return done / (time.perf_counter() - start)


def policy_round(slots: int = 100_000, seconds: float = 1.0) -> dict:
    return {"slots": slots, "evictions_per_s": {p: evictions_per_s(p, slots, seconds) for p in sorted(POLICIES)},
            "small_tier_evictions_per_s": {p: evictions_per_s(p, 1_000, seconds) for p in sorted(POLICIES)}}


def lines(r: dict) -> list[str]:
    return [f"| evictions/s, {p}, {r['slots']:,} slots (1,000 slots: {r['small_tier_evictions_per_s'][p]:,.0f}) | "
            f"{v:,.0f} | 1,000-slot tier | {v / r['small_tier_evictions_per_s'][p]:.2f} |"
            for p, v in r["evictions_per_s"].items()]


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    print("\n".join(lines(policy_round())))
