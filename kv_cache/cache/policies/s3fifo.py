"""S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO and a ghost list.

New blocks enter the small queue (about 10 % of the blocks); one seen again while in the
ghost list enters the main queue directly. Eviction, run lazily as the cache asks for
candidates: while the small queue holds at least 10 % of the blocks, its oldest block is
examined: one hit while there moves to main, one never hit is a candidate (its key goes to
the ghost list once removed). Otherwise main's oldest: a hit block gets another round (its
count decremented, moved to the young end), one with count 0 is a candidate. Every step is
O(1) amortised: each hit buys a block at most MAX_FREQ extra rounds.

Prefix-aware: a held block (a child of it is in the tier) leaves its queue and returns to
the young end of the same queue when freed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

SMALL_SHARE = 0.1
MAX_FREQ = 3


class S3FIFOPolicy:
    name, summary = "s3fifo", "S3-FIFO (a small probation FIFO, a main FIFO and a ghost list)"
    stack_property = uses_clock = False

    def __init__(self) -> None:
        self._small: OrderedDict[int, None] = OrderedDict()
        self._main: OrderedDict[int, None] = OrderedDict()
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self._freq: dict[int, int] = {}
        self._queue: dict[int, OrderedDict] = {}  # key -> the queue it belongs to (also while held)
        self._held: set[int] = set()

    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None:
        self._freq[key] = 0
        self._held.discard(key)
        q = self._main if self._ghost.pop(key, 0) is None else self._small
        q[key] = None
        self._queue[key] = q

    def on_hit(self, key: int) -> None:
        if key in self._freq:
            self._freq[key] = min(self._freq[key] + 1, MAX_FREQ)

    def on_remove(self, key: int) -> None:
        q = self._queue.pop(key, None)
        if q is None:
            return
        self._freq.pop(key, None)
        self._held.discard(key)
        q.pop(key, None)
        if q is self._small:  # evicted from probation: remember it
            self._ghost[key] = None
            while len(self._ghost) > max(len(self._freq), 1):
                self._ghost.popitem(last=False)

    def hold(self, key: int) -> None:
        q = self._queue.get(key)
        if q is not None and key not in self._held:
            q.pop(key, None)
            self._held.add(key)

    def free(self, key: int) -> None:
        if key in self._held:
            self._held.discard(key)
            self._queue[key][key] = None

    def _next(self) -> int | None:
        """One eviction step: the next candidate (popped from its queue), or None when both are empty."""
        while self._small or self._main:
            total = len(self._small) + len(self._main)
            if self._small and (len(self._small) >= SMALL_SHARE * total or not self._main):
                key, _ = self._small.popitem(last=False)
                if self._freq[key] > 0:  # reused while on probation: promoted to main
                    self._freq[key] = 0
                    self._main[key] = None
                    self._queue[key] = self._main
                    continue
                return key
            key, _ = self._main.popitem(last=False)
            if self._freq[key] > 0:
                self._freq[key] -= 1
                self._main[key] = None
                continue
            return key
        return None

    def candidates(self) -> Iterator[int]:
        taken = []
        try:
            while (key := self._next()) is not None:
                taken.append(key)
                yield key
        finally:  # candidates the cache did not remove go back to the old end of their queue, in order
            for key in reversed(taken):
                q = self._queue.get(key)
                if q is not None and key not in self._held:
                    q[key] = None
                    q.move_to_end(key, last=False)

    def keys(self) -> set[int]:
        return set(self._queue)

    def __len__(self) -> int:
        return len(self._queue)
