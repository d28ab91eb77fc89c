"""Simulated tier: capacity accounting and a bandwidth model, for a GPU that is not there.

Every transfer waits nbytes / bandwidth (plus a fixed launch latency) so that
concurrency and capacity behave as with a device; no byte moves. The output
labels this tier's numbers "simulated" wherever they appear.
"""

from __future__ import annotations

import time

import numpy as np

from kv_cache.tiers.base import DEVICE_MEMORY, SIMULATED, SlottedTier

LAUNCH_S = 10e-6  # fixed per-transfer cost of a cudaMemcpyAsync + stream sync, roughly


class SimulatedTier(SlottedTier):
    """A modelled device-memory tier."""

    flags = frozenset({SIMULATED, DEVICE_MEMORY})

    def __init__(self, name: str, capacity_bytes: int, slot_bytes: int, gbps: float):
        super().__init__(capacity_bytes // slot_bytes, slot_bytes)
        self.name = name
        self.bytes_per_s = gbps * 1e9
        self.description = (f"SIMULATED: capacity accounting + {gbps:g} GB/s bandwidth model, "
                            f"{self.num_slots} slots (no device)")

    def _transfer(self, nbytes: int) -> None:
        time.sleep(LAUNCH_S + nbytes / self.bytes_per_s)

    def put(self, key: int, buf: np.ndarray) -> None:
        self.slots.alloc(key, buf.size)
        self._transfer(buf.size)

    def get(self, key: int, out: np.ndarray) -> None:
        _, nbytes = self.slots.lookup(key)
        self._transfer(nbytes)

    def delete(self, key: int) -> None:
        self.slots.release(key)
