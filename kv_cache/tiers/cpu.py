"""CPU tier: a preallocated, pre-touched arena of slots in host RAM.

A put or get is one ``np.copyto`` per run of consecutive slots; numpy
releases the GIL during the copy, so workers copy in parallel.
"""

from __future__ import annotations

import numpy as np

from kv_cache.buffers import aligned_buffer
from kv_cache.errors import UserError
from kv_cache.tiers.base import HOST_SLOTS, SlottedTier, slots_of
from kv_cache.tiers.kinds import GiB, StackContext, TierKind, holds_no_slot
from kv_cache.tiers.null import NullTier
from kv_cache.tiers.slots import runs


class CpuTier(SlottedTier):
    """Host-memory tier over one aligned arena."""

    name = "cpu"
    flags = frozenset({HOST_SLOTS})

    def __init__(self, capacity_bytes: int, slot_bytes: int):
        super().__init__(capacity_bytes // slot_bytes, slot_bytes)
        self.arena = aligned_buffer(self.num_slots * slot_bytes)
        self.description = f"host RAM arena, {slots_of(self.num_slots, slot_bytes)}, pre-touched"

    def put(self, key: int, buf: np.ndarray) -> None:
        slots = self.slots.alloc(key, buf.size)
        for first, pos, length in runs(slots, buf.size, self.slot_bytes):
            at = first * self.slot_bytes
            np.copyto(self.arena[at:at + length], buf[pos:pos + length])

    def get(self, key: int, out: np.ndarray) -> None:
        slots, nbytes = self.slots.lookup(key)
        for first, pos, length in runs(slots, nbytes, self.slot_bytes):
            at = first * self.slot_bytes
            np.copyto(out[pos:pos + length], self.arena[at:at + length])

    def delete(self, key: int) -> None:
        self.slots.release(key)

    def host_memory(self) -> list[np.ndarray]:
        return [self.arena]

    def held_view(self, key: int) -> np.ndarray | None:
        slots, nbytes = self.slots.lookup(key)
        one = runs(slots, nbytes, self.slot_bytes)
        return self.arena[one[0][0] * self.slot_bytes:][:nbytes] if len(one) == 1 else None

    def alloc_views(self, key: int, nbytes: int) -> list[np.ndarray]:
        sb = self.slot_bytes
        return [self.arena[s * sb:s * sb + min(sb, nbytes - i * sb)]
                for i, s in enumerate(self.slots.alloc(key, nbytes))]


def _most_bytes(s) -> int:
    return int(s.cpu_mem_gb * GiB)


def make_for_test(variant: str, directory: str, capacity_bytes: int, slot_bytes: int, server=None,
                  engines=None) -> CpuTier:
    return CpuTier(capacity_bytes, slot_bytes)


def build(ctx: StackContext) -> tuple[SlottedTier | None, str]:
    """Host RAM: page-aligned slabs of fixed slots, or off with --cpu-mem-gb 0."""
    s, slot = ctx.settings, ctx.slot_bytes
    want = int(s.cpu_mem_gb * GiB)
    if not s.cpu_mem_gb:
        return None, ""
    if want < slot:
        raise UserError(holds_no_slot("--cpu-mem-gb", s.cpu_mem_gb, slot, "CPU"))
    return (NullTier("cpu", want, slot) if ctx.null_io else CpuTier(want, slot)), ""


MEDIUM = TierKind("cpu", 1, build, most_bytes=_most_bytes, contract=("arena",), make_for_test=make_for_test)
