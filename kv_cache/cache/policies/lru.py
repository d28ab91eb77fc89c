"""LRU: evict the block least recently inserted or hit."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator


class LRUPolicy:
    """Least recently used first; a hit moves a block to the young end."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None:
        self._order[key] = None

    def on_hit(self, key: int) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def on_remove(self, key: int) -> None:
        self._order.pop(key, None)

    def candidates(self) -> Iterator[int]:
        """Keys in eviction order (the cache skips pinned ones); do not mutate while iterating."""
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)
