"""--shared-writes through: the engines store every block they make in the shared tier as they make it (LMCache's
remote backend, Mooncake's store, vLLM's offloading to a shared file system), and the shared tier is one store that
evicts for itself (least recently used first, as Valkey's allkeys-lru or Mooncake's pool).

Each engine's own tiers are the benchmark's cache on accounting tiers (HBM, then CPU); what they evict is dropped
(the shared tier holds its copy). A lookup runs down the engine's own tiers, then goes on in the shared tier, chain
order, to its first miss there; a block found there is loaded into the engine's HBM. A block no tier held is
computed, written into the engine's tiers and stored in the shared tier unless it is there already (an engine asks
first, as LMCache's contains() does: no rewrite).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from kv_cache.cache.cache import BlockCache
from kv_cache.cache.simulate import read_prefix, write_block
from kv_cache.fleet.engines import CPU, HBM, SHARED_TIER, Engine
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.catalog import accounting_stack


@dataclass
class LruPool:
    """The shared tier: blocks in recency order, the least recent evicted past capacity (blocks; 0: unbounded)."""

    slot_bytes: int
    capacity: int
    blocks: OrderedDict = field(default_factory=OrderedDict)
    reads: int = 0
    writes: int = 0
    rewrites: int = 0    # demote() of a block the pool held (store() asks first: never)
    evictions: int = 0
    peak_blocks: int = 0
    written: list[int] = field(default_factory=list)  # the current request's writes (the access stream)

    def read(self, key: int) -> bool:
        """Whether the tier holds key; a hit is read (and becomes the most recent)."""
        if key not in self.blocks:
            return False
        self.blocks.move_to_end(key)
        self.reads += 1
        return True

    def store(self, key: int) -> None:
        """A block an engine made, stored unless the pool holds it (then it is only the most recent)."""
        if key in self.blocks:
            self.blocks.move_to_end(key)
            return
        self._write(key)

    def demote(self, key: int) -> None:
        """A block an engine evicted, written whether or not the pool holds it (the engine does not ask)."""
        self.rewrites += key in self.blocks
        self._write(key)

    def _write(self, key: int) -> None:
        """A write: the block becomes the most recent (inserted, the least recent evicted past capacity)."""
        self.writes += 1
        self.written.append(key)
        if key in self.blocks:
            self.blocks.move_to_end(key)
            return
        self.blocks[key] = None
        if self.capacity and len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
            self.evictions += 1
        self.peak_blocks = max(self.peak_blocks, len(self.blocks))


class ThroughEngine(Engine):
    def __init__(self, hbm_bytes: int, cpu_bytes: int, pool: LruPool, policy: type, recorder: Recorder, clock):
        super().__init__()
        self.pool = pool
        self.cache = BlockCache(accounting_stack([(HBM, hbm_bytes), (CPU, cpu_bytes)], pool.slot_bytes), policy, True,
                                recorder, clock=clock)

    def serve(self, p, buf: np.ndarray) -> dict[int, str]:
        """The request's lookups, loads and writes: block index -> the tier name each hit was read from."""
        hit: dict[int, str] = {}
        for first, end, independent in p.groups:
            spans = [(i, i + 1) for i in range(first, end)] if independent else [(first, end)]
            for a, b in spans:
                self._lookup(p, a, b, hit, buf)
        for i, key in enumerate(p.keys):
            if i not in hit:
                self._place(p, i, buf, "prefill" if i < p.prompt_blocks else "decode")
                self.pool.store(key)
        return hit

    def _lookup(self, p, first: int, end: int, hit: dict[int, str], buf: np.ndarray) -> None:
        """One lookup group: the engine's own tiers' prefix, then the shared tier's, each hit loaded up."""
        names = self.cache.names
        local = read_prefix(self.cache, p.keys[first:end], buf)
        for j, t in enumerate(local):
            hit[first + j] = names[t]
        i = first + len(local)
        while i < end and self.pool.read(p.keys[i]):
            hit[i] = SHARED_TIER
            self._place(p, i, buf, "load")
            i += 1

    def _place(self, p, i: int, buf: np.ndarray, phase: str) -> None:
        write_block(self.cache, p.keys[i], p.labels[i], p.parents[i], phase, buf)
