"""FIFO, LFU and size-aware LRU: the classic baselines, one class each."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from kv_cache.cache.policies.lru import LRUPolicy


class FIFOPolicy(LRUPolicy):
    """First in, first out: LRU's order without hits moving anything."""

    name = "fifo"

    def on_hit(self, key: int) -> None:
        """FIFO ignores hits."""


class LFUPolicy:
    """Least frequently used first (hits since insertion); ties: the oldest insertion first."""

    name = "lfu"

    def __init__(self) -> None:
        self._hits: dict[int, tuple[int, int]] = {}  # key -> (hits, insertion number)
        self._seq = itertools.count()

    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None:
        self._hits[key] = (0, next(self._seq))

    def on_hit(self, key: int) -> None:
        if key in self._hits:
            n, seq = self._hits[key]
            self._hits[key] = (n + 1, seq)

    def on_remove(self, key: int) -> None:
        self._hits.pop(key, None)

    def candidates(self) -> Iterator[int]:
        return iter(sorted(self._hits, key=self._hits.__getitem__))

    def __len__(self) -> int:
        return len(self._hits)


class SizeLRUPolicy:
    """Size-aware LRU (SemanticKV's): evict the smallest last_access / size first: of blocks touched
    about as recently, the bigger goes first (one eviction frees more room). All blocks of a run in
    block mode have one size, so it matters in whole-request mode (--block-tokens 0)."""

    name = "size-lru"

    def __init__(self) -> None:
        self._meta: dict[int, tuple[int, int]] = {}  # key -> (last access number, bytes)
        self._clock = itertools.count(1)

    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None:
        self._meta[key] = (next(self._clock), max(nbytes, 1))

    def on_hit(self, key: int) -> None:
        if key in self._meta:
            self._meta[key] = (next(self._clock), self._meta[key][1])

    def on_remove(self, key: int) -> None:
        self._meta.pop(key, None)

    def candidates(self) -> Iterator[int]:
        return iter(sorted(self._meta, key=lambda k: self._meta[k][0] / self._meta[k][1]))

    def __len__(self) -> int:
        return len(self._meta)
