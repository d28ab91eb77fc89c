"""LRU: evict the block least recently inserted or hit."""

from __future__ import annotations

import itertools

from kv_cache.cache.policies.heap import HeapPolicy


class LRUPolicy(HeapPolicy):
    """Least recently used first; a hit makes a block the youngest. Prefix-aware (see heap.py)."""

    name, summary = "lru", "least recently used first"
    stack_property = True  # a hit at capacity C is a hit at every larger one: exact stack distances

    def __init__(self) -> None:
        super().__init__()
        self._stamp: dict[int, int] = {}
        self._clock = itertools.count()

    def _priority(self, key: int):
        return self._stamp[key]

    def _meta_insert(self, key: int, label: str, nbytes: int) -> None:
        self._stamp[key] = next(self._clock)

    def _meta_hit(self, key: int) -> bool:
        self._stamp[key] = next(self._clock)
        return True

    def _meta_remove(self, key: int) -> None:
        self._stamp.pop(key, None)
