"""Issue 16: --workers 0 steps the storage tier's concurrency until its bandwidth stops growing."""

import threading
import time

import pytest

from kv_cache.config import resolve
from kv_cache.errors import RunFault, UserError
from kv_cache.run.compose import choose_workers, geometry
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


class FullDevice(QueueDepthTier):
    def put(self, key, buf):
        raise RunFault("disk full while writing /x: No space left on device; free space or lower --nvme-gb.")


def test_a_device_fault_in_the_probe_is_one_sentence_before_the_run():
    with pytest.raises(RunFault, match="disk full"):  # not swallowed by a probe thread
        concurrency(FullDevice(4), 1 << 16, 8, seconds=0.05)
    s = resolve(None, [], {"model.name": "llama8b", "model.block_tokens": 4})
    with pytest.raises(UserError, match="--workers 0 .* failed: disk full.*--workers N"):
        choose_workers(s, [FullDevice(4)], geometry(s), 8, None)
