"""Null tier: keeps the slot accounting, moves no bytes (to measure the orchestrator itself).

As fio's null engine, it exists to test and benchmark the load generator:
every operation is still timed and recorded, but no data moves, so the
numbers are the program's own overhead. Its output is labelled ``null``.
"""

from __future__ import annotations

import numpy as np

from kv_cache.tiers.base import FAKE_IO, SlottedTier


class NullTier(SlottedTier):
    """A tier of any name that stores nothing."""

    flags = frozenset({FAKE_IO})

    def __init__(self, name: str, capacity_bytes: int, slot_bytes: int):
        super().__init__(max(1, capacity_bytes // slot_bytes), slot_bytes)
        self.name = name
        self.description = "null: no bytes move (orchestrator overhead only)"

    def batch_path(self) -> str:
        return "no I/O (the null tier)"

    def put(self, key: int, buf: np.ndarray) -> None:
        self.slots.alloc(key, buf.size)

    def get(self, key: int, out: np.ndarray) -> None:
        self.slots.lookup(key)

    def delete(self, key: int) -> None:
        self.slots.release(key)
