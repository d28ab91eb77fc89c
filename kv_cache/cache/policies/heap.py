"""The bookkeeping every priority-ordered policy shares: a lazy heap, and blocks held out of it.

A policy orders the blocks of one tier by a *priority* (lowest evicted first). Changing a
block's priority pushes a new heap entry; the old one becomes *stale* and is dropped when it
surfaces (each entry is checked against ``_live``), and the heap is rebuilt when stale entries
outnumber live ones: every verb is O(log n) amortised, whatever the tier's size.

*Held* blocks (``hold``) have a block that depends on them in the tier (a child in their
prefix chain): they keep their metadata but are no candidates until ``free``; this is what
keeps chains hit-able (tails leave before heads).

``candidates()`` pops entries in order while the cache examines them and pushes back, when
the cache closes it, those it did not remove: the policy's order is unchanged by looking.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator


class Holding:
    """hold / free over a policy's evictable map ``_live`` and its ``_held`` set; _repush(key) puts a freed
    key back in order."""

    _live: dict
    _held: set

    def hold(self, key: int) -> None:
        """key has a dependent block in this tier: not a candidate until free(key)."""
        if self._live.pop(key, None) is not None:
            self._held.add(key)

    def free(self, key: int) -> None:
        if key in self._held:
            self._held.discard(key)
            self._repush(key)

    def _repush(self, key: int) -> None:
        raise NotImplementedError

    def keys(self) -> set[int]:
        """Every block the policy orders, held ones included (for checks; no side effect)."""
        return set(self._live) | self._held

    def __len__(self) -> int:
        return len(self._live) + len(self._held)


class HeapPolicy(Holding):
    """Base of the priority policies: subclasses keep their metadata and define _priority(key)."""

    name, summary = "", ""
    stack_property = False  # policies/protocol.py: only LRU's order is a stack
    uses_clock = False

    def __init__(self) -> None:
        self._heap: list[tuple] = []           # (priority, tie, key), some stale
        self._live: dict[int, tuple] = {}      # key -> (priority, tie) of its current entry (evictable keys)
        self._held: set[int] = set()
        self._tie = itertools.count()

    # -- what a subclass defines
    def _priority(self, key: int):
        raise NotImplementedError

    def _meta_insert(self, key: int, label: str, nbytes: int) -> None:
        raise NotImplementedError

    def _meta_hit(self, key: int) -> bool:
        """Update key's metadata on a hit; True when its priority changed."""
        raise NotImplementedError

    def _meta_remove(self, key: int) -> None:
        raise NotImplementedError

    # -- the policy verbs
    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None:
        self._meta_insert(key, label, nbytes)
        self._held.discard(key)
        self._push(key)

    def on_hit(self, key: int) -> None:
        if (key in self._live or key in self._held) and self._meta_hit(key) and key in self._live:
            self._push(key)

    def on_remove(self, key: int) -> None:
        if key in self._live or key in self._held:
            self._meta_remove(key)
        self._live.pop(key, None)
        self._held.discard(key)

    def _repush(self, key: int) -> None:
        self._push(key)

    def candidates(self) -> Iterator[int]:
        """Evictable keys, lowest priority first; close() (or exhaustion) restores what was not removed."""
        taken = []
        try:
            while self._heap:
                item = heapq.heappop(self._heap)
                if self._live.get(item[2]) != item[:2]:
                    continue  # stale
                taken.append(item)
                yield item[2]
        finally:
            for item in taken:
                if self._live.get(item[2]) == item[:2]:
                    heapq.heappush(self._heap, item)

    def _push(self, key: int) -> None:
        entry = (self._priority(key), next(self._tie))
        self._live[key] = entry
        heapq.heappush(self._heap, (*entry, key))
        if len(self._heap) > 2 * len(self._live) + 64:  # mostly stale: rebuild, O(n) once per n pushes
            self._heap = [(*e, k) for k, e in self._live.items()]
            heapq.heapify(self._heap)
