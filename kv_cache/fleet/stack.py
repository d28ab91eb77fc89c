"""--engine-model stack: an engine's HBM and CPU tiers as the LRU waterfall itself, two ordered maps, for fleets
too large for the benchmark's cache (cache.py spends about 50 us a block on its moves, locks and bookkeeping;
this, a few).

The waterfall with promotion is exact for LRU: a hit in HBM becomes its most recent block, a hit in CPU or in the
shared tier is loaded into HBM, a new block is written into HBM, HBM's least recent block moves to the top of CPU and
CPU's least recent block leaves the engine (demoted into the shared tier with --shared-writes demote, dropped with
through). A request's blocks are touched deepest first, so a chain's head is more recent than its tail and the
least recent block is a leaf (vLLM frees a request's blocks tail first for the same reason): the cache's rule that a
block holding a cached child is not evicted, approximated as the capacity curve does (recorder/stack_distances.py).
The shared tier is one LRU pool here in both modes (through.LruPool; with demote, an engine that demotes a block the
pool holds writes it again: a rewrite). Only the LRU policy has this model; another policy runs the cache itself.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kv_cache.fleet.engines import CPU, HBM, SHARED_TIER, Engine
from kv_cache.fleet.through import LruPool


class StackEngine(Engine):
    def __init__(self, hbm_slots: int, cpu_slots: int, pool: LruPool, through: bool):
        super().__init__()
        self.hbm: OrderedDict = OrderedDict()
        self.cpu: OrderedDict = OrderedDict()
        self.levels = ((self.hbm, hbm_slots), (self.cpu, cpu_slots))  # the waterfall, fastest first
        self.pool, self.through = pool, through

    def cached_prefix(self, keys: tuple[int, ...], end: int) -> int:
        hbm, cpu = self.hbm, self.cpu
        n = 0
        for k in keys[:end]:
            if k not in hbm and k not in cpu:
                break
            n += 1
        return n

    def serve(self, p, buf: np.ndarray) -> dict[int, str]:
        """The request's lookups (own tiers, then the shared tier, each group to its first miss), then every block
        touched deepest first: block index -> the tier name each hit was read from."""
        hit: dict[int, str] = {}
        hbm, cpu, pool, keys = self.hbm, self.cpu, self.pool, p.keys
        for first, end, independent in p.groups:
            for i in range(first, end):
                k = keys[i]
                if k in hbm:
                    hit[i] = HBM
                elif k in cpu:
                    hit[i] = CPU
                elif pool.read(k):
                    hit[i] = SHARED_TIER
                elif not independent:
                    break
        for i in range(len(keys) - 1, -1, -1):
            self._touch(keys[i], i in hit)
        return hit

    def _touch(self, key: int, was_hit: bool) -> None:
        if key in self.hbm:
            self.hbm.move_to_end(key)
            return
        self.cpu.pop(key, None)  # a CPU hit moves up; anything else is loaded or written into HBM
        if not was_hit and self.through:
            self.pool.store(key)
        self._fall(key)

    def _fall(self, key: int) -> None:
        """key onto the top of HBM, each tier's least recent block onto the top of the next, CPU's out of the
        engine (demoted into the shared tier, or dropped with through); a tier of no slot is passed by."""
        for tier, slots in self.levels:
            if not slots:
                continue
            tier[key] = None
            if len(tier) <= slots:
                return
            key = tier.popitem(last=False)[0]
        if not self.through:
            self.pool.demote(key)
