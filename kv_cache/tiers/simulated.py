"""Simulated tier: capacity accounting and a bandwidth model, for a GPU that is not there.

Every transfer takes nbytes / bandwidth (plus a fixed launch latency) so that
concurrency and capacity behave as with a device; no byte is stored. A get
hands back the block's deterministic payload (rebuilt by the payload pool,
at the place in the pool its write came from), so a block demoted to a real
tier below carries its real bytes; the rebuild is
counted inside the modelled time. The output labels this tier's numbers
"simulated" wherever they appear, and its reads are not counted as verified.
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from kv_cache.tiers.base import SIMULATED, SlottedTier

LAUNCH_S = 10e-6  # fixed per-transfer cost of a cudaMemcpyAsync + stream sync, roughly


class Payloads(Protocol):
    """What rebuilds a block's bytes (the lifecycle's payload pool)."""

    def fill(self, key: int, out: np.ndarray, offset: int = 0, place: int = 0) -> None: ...
    def place_of(self, data: np.ndarray) -> int: ...  # which place in the pool a payload came from


class SimulatedTier(SlottedTier):
    """A modelled device-memory tier."""

    flags = frozenset({SIMULATED})

    def __init__(self, name: str, capacity_bytes: int, slot_bytes: int, gbps: float,
                 payloads: Payloads | None = None):
        super().__init__(capacity_bytes // slot_bytes, slot_bytes)
        self.name = name
        self.bytes_per_s = gbps * 1e9
        self.payloads = payloads
        self._places: dict[int, int] = {}  # a held block's place in the payload pool, where not the first
        self.description = (f"SIMULATED: capacity accounting + {gbps:g} GB/s bandwidth model, "
                            f"{self.num_slots} slots (no device)")

    def _transfer(self, nbytes: int, started: float) -> None:
        left = LAUNCH_S + nbytes / self.bytes_per_s - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)

    def put(self, key: int, buf: np.ndarray) -> None:
        started = time.perf_counter()
        self.slots.alloc(key, buf.size)
        place = self.payloads.place_of(buf) if self.payloads is not None else 0
        if place > 0:
            self._places[key] = place
        else:
            self._places.pop(key, None)
        self._transfer(buf.size, started)

    def get(self, key: int, out: np.ndarray) -> None:
        started = time.perf_counter()
        _, nbytes = self.slots.lookup(key)
        if self.payloads is not None:
            self.payloads.fill(key, out[:nbytes], place=self._places.get(key, 0))
        self._transfer(nbytes, started)

    def delete(self, key: int) -> None:
        self.slots.release(key)
        self._places.pop(key, None)
