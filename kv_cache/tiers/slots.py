"""Slot bookkeeping shared by every tier: key -> slots, and the free list.

Vocabulary: a tier's space is cut into fixed-size *slots*; a block takes one
slot, a whole-request object (``--block-tokens 0``) takes as many as its size
needs. A *run* is a range of consecutive slots, moved with one copy or one
system call.
"""

from __future__ import annotations

import threading
from collections import deque


class TierFull(Exception):
    """No free slot: the cache's accounting should have prevented this."""


class SlotMap:
    """Thread-safe map of key -> slot list over a fixed number of slots."""

    def __init__(self, num_slots: int, slot_bytes: int):
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        # Slots never used yet are [_fresh, num_slots): handed out in order before any released one, so a huge
        # tier costs nothing until it is filled (a free list of every slot would be built before the run).
        self._fresh = 0
        self._free: deque[int] = deque()  # released slots, reused in the order they were released
        self._slots: dict[int, tuple[list[int], int]] = {}
        self._lock = threading.Lock()

    def slots_for(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.slot_bytes))

    def _free_count(self) -> int:
        return self.num_slots - self._fresh + len(self._free)

    def alloc(self, key: int, nbytes: int) -> list[int]:
        need = self.slots_for(nbytes)
        with self._lock:
            if key in self._slots:
                raise KeyError(f"block {key:016x} is already stored")
            if self._free_count() < need:
                raise TierFull(f"{need} slots wanted, {self._free_count()} free")
            if need == 1:  # a block (every write of block mode): a fresh slot while any is left, else a released one
                if self._fresh < self.num_slots:
                    slots = [self._fresh]
                    self._fresh += 1
                else:
                    slots = [self._free.popleft()]
            else:
                fresh = min(need, self.num_slots - self._fresh)
                slots = list(range(self._fresh, self._fresh + fresh))
                self._fresh += fresh
                slots += [self._free.popleft() for _ in range(need - fresh)]
            self._slots[key] = (slots, nbytes)
            return slots

    def lookup(self, key: int) -> tuple[list[int], int]:
        with self._lock:
            return self._slots[key]

    def release(self, key: int) -> tuple[list[int], int]:
        with self._lock:
            slots, nbytes = self._slots.pop(key)
            self._free.extend(slots)
            return slots, nbytes

    def __contains__(self, key: int) -> bool:
        return key in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def used_slots(self) -> int:
        return self.num_slots - self._free_count()

    def keys(self) -> list[int]:
        with self._lock:
            return list(self._slots)


def runs(slots: list[int], nbytes: int, slot_bytes: int, per_file: int = 0) -> list[tuple[int, int, int]]:
    """(first_slot, byte_offset_in_object, length) of each run of consecutive slots.

    With per_file > 0 a run never crosses a file boundary of per_file slots.
    """
    if len(slots) == 1:  # a block: one slot, one run (the hot path of every block operation)
        return [(slots[0], 0, nbytes)]
    out = []
    start = prev = slots[0]
    pos = 0
    for s in slots[1:] + [None]:
        crosses = per_file and s is not None and s % per_file == 0
        if s is not None and s == prev + 1 and not crosses:
            prev = s
            continue
        length = min((prev - start + 1) * slot_bytes, nbytes - pos)
        out.append((start, pos, length))
        pos += length
        if s is not None:
            start = prev = s
    return out
