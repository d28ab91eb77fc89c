"""One point of a fleet sweep: the planned requests, in arrival order, through a router onto N engines over one
shared tier, each engine the benchmark's own cache on accounting tiers (--engine-model cache; the shared tier as
--shared-writes says: demote, engines.py; through, through.py) or its LRU waterfall alone (stack, stack.py).

What comes out: the prompt tokens each tier served (by source too), the shared tier's reads, writes and rewrites
(blocks), its peak distinct blocks, the requests and computed prefill tokens per engine, and the shared tier's access
stream (AccessLog's arrays: each request's lookups that reached it and the blocks written into it), whose LRU stack
distances give its capacity curve (recorder/stack_distances.curve: exact, or SHARDS-sampled past a few million
accesses with its rate said).

The engines' load is modelled: a request occupies its engine for its computed prefill tokens x --prefill-ms-per-token
plus its output tokens x --decode-ms-per-token after it arrives; the least-loaded, session and prefix routers read
it. Nothing else is modelled: hits, misses, demotions and evictions are the cache's own decisions.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from kv_cache.fleet.engines import CPU, HBM, SHARED_TIER, UNBOUNDED_SLOTS, DemoteEngine, SharedPool
from kv_cache.fleet.routers.base import InFlight
from kv_cache.fleet.shared_log import SharedLog, rate_for
from kv_cache.fleet.stack import StackEngine
from kv_cache.fleet.stream import Stream
from kv_cache.fleet.through import LruPool, ThroughEngine
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.stack_distances import COLUMNS

TIERS = (HBM, CPU, SHARED_TIER)  # where a hit can come from, fastest first
PROGRESS_S = 10.0  # seconds between two progress lines of one point


@dataclass(frozen=True)
class EngineSpec:
    """Each engine's tiers and the fleet's shared tier (bytes; shared 0: unbounded), the policy and the load model."""

    hbm_bytes: int
    cpu_bytes: int
    shared_bytes: int
    policy: type
    prefill_ms_per_token: float
    decode_ms_per_token: float
    slack: float
    writes: str  # demote | through: how blocks reach the shared tier
    model: str   # cache (the benchmark's cache per engine) | stack (the LRU waterfall as two ordered maps)

    def share_slots(self, n: int, slot: int) -> int:
        """Each of n engines' share of a bounded shared tier (--shared-writes demote, the cache: its own blocks'
        slots), at least one; UNBOUNDED_SLOTS for an unbounded one."""
        return max(self.shared_bytes // n // slot, 1) if self.shared_bytes else UNBOUNDED_SLOTS


@dataclass
class Simulated:
    """What one (engine count, router) did."""

    engines: int
    router: str
    hit_tokens: np.ndarray        # [tier, COLUMNS]: prompt tokens served by each tier of TIERS
    prompt_tokens: np.ndarray     # [COLUMNS]: every request's prompt tokens
    pool: SharedPool | LruPool
    requests_per_engine: np.ndarray
    prefill_per_engine: np.ndarray
    assignment: np.ndarray        # the engine of each request
    log: SharedLog                # the shared tier's access stream
    seconds: float                # the simulation's own wall time


def _reached(p, hit: dict[int, str]) -> list[int]:
    """The prompt blocks whose lookup went below the engine's own tiers: those served by the shared tier, and each
    lookup group's first miss (an independent chunk: each miss)."""
    out = []
    for first, end, independent in p.groups:
        for i in range(first, end):
            t = hit.get(i)
            if t is None or t == SHARED_TIER:
                out.append(i)
                if t is None and not independent:
                    break
    return out


def _summed(counts: Counter) -> np.ndarray:
    """Rows by COLUMNS, each times its count, summed."""
    out = np.zeros(len(COLUMNS), np.int64)
    for row, k in counts.items():
        out[: len(row)] += np.asarray(row, np.int64) * k
    return out


def _fleet(n: int, spec: EngineSpec, slot: int, clock) -> tuple[SharedPool | LruPool, list]:
    """The shared tier and n engines over it, as spec.writes says."""
    if spec.model == "stack":
        pool = LruPool(slot, spec.shared_bytes // slot)
        through = spec.writes == "through"
        return pool, [StackEngine(spec.hbm_bytes // slot, spec.cpu_bytes // slot, pool, through) for _ in range(n)]
    recorder = Recorder()  # the caches': never measuring (timings of accounting tiers mean nothing here)
    if spec.writes == "through":
        pool = LruPool(slot, spec.shared_bytes // slot)
        return pool, [ThroughEngine(spec.hbm_bytes, spec.cpu_bytes, pool, spec.policy, recorder, clock)
                      for _ in range(n)]
    pool = SharedPool(slot)
    share = spec.share_slots(n, slot)
    return pool, [DemoteEngine(spec.hbm_bytes, spec.cpu_bytes, pool, share, spec.policy, recorder, clock)
                  for _ in range(n)]


def simulate(stream: Stream, n: int, router_cls, spec: EngineSpec, say) -> Simulated:
    started = time.monotonic()
    now = [0.0]  # the arrival time of the request being served: the policies' clock
    pool, engines = _fleet(n, spec, stream.slot_bytes, lambda: now[0])
    router, load = router_cls(n, spec.slack), InFlight(n)
    buf = np.zeros(stream.slot_bytes, np.uint8)
    tally = {t: Counter() for t in TIERS}  # tier -> source row -> hit blocks (rows are interned: stream.py)
    prompts: Counter = Counter()
    sums: dict[tuple, int] = {}
    assignment = np.zeros(len(stream.requests), np.int32)
    shared = SharedLog(rate_for(len(stream.requests.keys)))
    last_said = started
    for r, p in enumerate(stream.requests):
        now[0] = p.at_s
        load.at(p.at_s)
        e = router.pick(p, engines, load)
        eng = engines[e]
        assignment[r] = e
        pool.written.clear()
        hit = eng.serve(p, buf)
        served = 0
        for i, t in hit.items():
            row = p.block_sources[i]
            tally[t][row] += 1
            served += sums[row] if row in sums else sums.setdefault(row, sum(row))
        prompts[p.prompt_sources] += 1
        shared.request(p, _reached(p, hit), list(pool.written))
        computed = p.prompt_tokens - served
        eng.requests += 1
        eng.prefill_tokens += computed
        service_ms = computed * spec.prefill_ms_per_token + p.output_tokens * spec.decode_ms_per_token
        load.start(e, p.at_s + service_ms / 1e3)
        if time.monotonic() - last_said > PROGRESS_S:
            last_said = time.monotonic()
            say(f"    {n} engines, {router.name}: {r + 1:,} of {len(stream.requests):,} requests")
    hit_tokens = np.array([_summed(tally[t]) for t in TIERS])
    return Simulated(n, router_cls.name, hit_tokens, _summed(prompts), pool,
                     np.array([x.requests for x in engines]), np.array([x.prefill_tokens for x in engines]),
                     assignment, shared, time.monotonic() - started)
