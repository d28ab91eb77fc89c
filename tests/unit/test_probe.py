"""Issue 16: --workers 0 steps the storage tier's concurrency until its bandwidth stops growing."""

import threading
import time

from kv_cache.tiers.base import SlottedTier
from kv_cache.tiers.probe import concurrency


class QueueDepthTier(SlottedTier):
    """A device that serves `depth` I/Os at once, each taking `service_s`: its bandwidth grows with the threads
    up to depth, then stays flat."""

    name = "dev"

    def __init__(self, depth: int, service_s: float = 0.004):
        super().__init__(256, 1 << 16)
        self.lanes = threading.Semaphore(depth)
        self.service_s = service_s
        self.description = f"depth {depth}"

    def _io(self):
        with self.lanes:
            time.sleep(self.service_s)

    def put(self, key, buf):
        self.slots.alloc(key, buf.size)
        self._io()

    def get(self, key, out):
        self._io()

    def delete(self, key):
        self.slots.release(key)


def test_the_probe_finds_where_the_device_saturates():
    for depth in (2, 8):
        tier = QueueDepthTier(depth)
        chosen, steps = concurrency(tier, 1 << 16, 32, seconds=0.15)
        assert chosen == depth, (depth, steps)
        assert [k for k, _ in steps][:3] == [1, 2, 4]
        assert tier.slots.used_slots == 0  # the probe's objects are gone


def test_the_probe_stops_at_its_ceiling_and_within_the_tier():
    chosen, steps = concurrency(QueueDepthTier(64), 1 << 16, 8, seconds=0.1)
    assert steps[-1][0] == 8 and chosen <= 8
    small = QueueDepthTier(64)
    small.num_slots = 3  # room for 3 objects only
    chosen, steps = concurrency(small, 1 << 16, 32, seconds=0.1)
    assert max(k for k, _ in steps) == 3
