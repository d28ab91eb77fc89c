"""FIFO, LFU and size-aware LRU: the classic baselines, one class each (prefix-aware, see heap.py)."""

from __future__ import annotations

import itertools

from kv_cache.cache.policies.heap import HeapPolicy
from kv_cache.cache.policies.lru import LRUPolicy


class FIFOPolicy(LRUPolicy):
    """First in, first out: LRU's order without hits moving anything."""

    name, summary = "fifo", "first in, first out (a hit changes nothing)"
    stack_property = False  # not a stack algorithm in general (Belady's anomaly): replayed

    def _meta_hit(self, key: int) -> bool:
        return False  # FIFO ignores hits


class LFUPolicy(HeapPolicy):
    """Least frequently used first (hits since insertion); ties: the oldest insertion first."""

    name, summary = "lfu", "least frequently used first"

    def __init__(self) -> None:
        super().__init__()
        self._hits: dict[int, tuple[int, int]] = {}  # key -> (hits, insertion number)
        self._seq = itertools.count()

    def _priority(self, key: int):
        return self._hits[key]

    def _meta_insert(self, key: int, label: str, nbytes: int) -> None:
        self._hits[key] = (0, next(self._seq))

    def _meta_hit(self, key: int) -> bool:
        n, seq = self._hits[key]
        self._hits[key] = (n + 1, seq)
        return True

    def _meta_remove(self, key: int) -> None:
        self._hits.pop(key, None)


class SizeLRUPolicy(HeapPolicy):
    """Size-aware LRU (SemanticKV's): evict the smallest last_access / size first: of blocks touched
    about as recently, the bigger goes first (one eviction frees more room). All blocks of a run in
    block mode have one size, so it matters in whole-request mode (--block-tokens 0)."""

    name, summary = "size-lru", "size-aware LRU (SemanticKV's: last access / size)"

    def __init__(self) -> None:
        super().__init__()
        self._meta: dict[int, tuple[int, int]] = {}  # key -> (last access number, bytes)
        self._clock = itertools.count(1)

    def _priority(self, key: int):
        access, size = self._meta[key]
        return access / size

    def _meta_insert(self, key: int, label: str, nbytes: int) -> None:
        self._meta[key] = (next(self._clock), max(nbytes, 1))

    def _meta_hit(self, key: int) -> bool:
        self._meta[key] = (next(self._clock), self._meta[key][1])
        return True

    def _meta_remove(self, key: int) -> None:
        self._meta.pop(key, None)
