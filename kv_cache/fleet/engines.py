"""The fleet's engines on paper: each one the benchmark's own cache (cache/cache.py) on accounting tiers that move
no byte (its HBM and CPU tiers), over one shared bottom tier seen by all of them.

--shared-writes demote (this module): the shared tier follows the benchmark's --shared-storage semantics, the ones
a real run with a shared bottom tier has: a block reaches it when an engine's upper tiers demote it (or cannot take
a new block at all); each engine owns the blocks it wrote there (its share of the tier's capacity, evicted by its own
policy) and every engine sees them: a lookup that misses an engine's own tiers adopts a block another engine
published (cache.pin_prefix), and copies it up rather than moving it. An engine that writes a block another one
already published writes it again (its own copy): counted apart as a rewrite, the writes an engine checking the tier
first would save. (--shared-writes through: through.py.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kv_cache.cache.cache import BlockCache
from kv_cache.cache.simulate import serve
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.base import FAKE_IO, SHARED, SlottedTier
from kv_cache.tiers.catalog import accounting_stack

UNBOUNDED_SLOTS = 1 << 40  # a shared tier without a capacity: a slot map this large costs nothing until filled
HBM, CPU, SHARED_TIER = "hbm", "cpu", "shared"


@dataclass
class SharedPool:
    """The shared tier as a whole: who holds which block, and what moved in and out of it."""

    slot_bytes: int
    copies: dict[int, int] = field(default_factory=dict)  # key -> engines holding their own copy
    reads: int = 0      # blocks read from it (an engine's own or another's)
    writes: int = 0     # blocks written into it (demotions, new blocks the upper tiers could not take)
    rewrites: int = 0   # of the writes: blocks some engine had published already
    peak_blocks: int = 0  # distinct blocks held at once, at most
    written: list[int] = field(default_factory=list)  # the current request's writes, in order (the access stream)

    def publish(self, key: int) -> None:
        n = self.copies.get(key, 0)
        self.copies[key] = n + 1
        self.writes += 1
        self.rewrites += n > 0
        self.written.append(key)
        self.peak_blocks = max(self.peak_blocks, len(self.copies))

    def withdraw(self, key: int) -> None:
        n = self.copies[key] - 1
        if n:
            self.copies[key] = n
        else:
            del self.copies[key]


class SharedView(SlottedTier):
    """One engine's view of the shared tier: its own blocks' slots (its share of the capacity), everyone's blocks
    readable (adopt)."""

    flags = frozenset({FAKE_IO, SHARED})

    def __init__(self, pool: SharedPool, share_slots: int):
        super().__init__(share_slots, pool.slot_bytes)
        self.name, self.pool = SHARED_TIER, pool
        self.description = "accounting only: the fleet's shared tier"

    def adopt(self, key: int) -> int | None:
        return self.pool.slot_bytes if key in self.pool.copies else None

    def put(self, key: int, buf: np.ndarray) -> None:
        self.slots.alloc(key, buf.size)
        self.pool.publish(key)

    def get(self, key: int, out: np.ndarray) -> None:
        self.pool.reads += 1

    def delete(self, key: int) -> None:
        self.slots.release(key)
        self.pool.withdraw(key)

    def release(self, key: int) -> None:
        self.delete(key)


class Engine:
    """What every engine keeps beside its cache: its requests, what it computed (its load: routers/base.InFlight)."""

    def __init__(self) -> None:
        self.cache: BlockCache
        self.requests = 0
        self.prefill_tokens = 0  # prompt tokens no tier served: what this engine computed

    def cached_prefix(self, keys: tuple[int, ...], end: int) -> int:
        """How many of keys[:end] this engine holds in its own upper tiers, unbroken from the first (what llm-d's
        prefix scorer counts: consecutive blocks from the start; the shared tier's blocks are every engine's)."""
        index, shared = self.cache.index, self.cache.shared
        n = 0
        for k in keys[:end]:
            e = index.get(k)
            if e is None or e.tier == shared or e.remote:
                break
            n += 1
        return n

class DemoteEngine(Engine):
    """An engine whose cache's bottom tier is its view of the shared tier: blocks reach it as they are demoted."""

    def __init__(self, hbm_bytes: int, cpu_bytes: int, pool: SharedPool, share_slots: int, policy: type,
                 recorder: Recorder, clock):
        super().__init__()
        tiers = accounting_stack([(HBM, hbm_bytes), (CPU, cpu_bytes)], pool.slot_bytes)
        self.cache = BlockCache([*tiers, SharedView(pool, share_slots)], policy, True, recorder, clock=clock)

    def serve(self, p, buf: np.ndarray) -> dict[int, str]:
        """The request through the cache (cache/simulate.serve): block index -> the tier name it was read from."""
        looked = [True] * p.prompt_blocks + [False] * (len(p.keys) - p.prompt_blocks)
        hit = serve(self.cache, p.keys, p.parents, looked, p.labels, buf)
        return {i: self.cache.names[t] for i, t in hit.items()}
