"""Issue 16: --workers 0 steps the storage tier's concurrency until its bandwidth stops growing.

The search is checked against a model of a device (its bandwidth a function of the threads), not a clock: the
answer must not depend on how busy the test machine is. The real step (threads doing I/O for a while) is
checked for what it leaves behind and what it raises, never for a speed.
"""

import pytest
from found import SECTIONS

from kv_cache.config import resolve
from kv_cache.errors import RunFault, UserError
from kv_cache.run.geometry import geometry
from kv_cache.run.sizing import probe_workers
from kv_cache.tiers.base import SlottedTier
from kv_cache.tiers.probe import PROBE_KEY, _step, concurrency


class QueueDepthTier(SlottedTier):
    """A device that serves `depth` I/Os at once: its bandwidth grows with the threads up to depth, then stays
    flat (see model_step)."""

    name = "dev"

    def __init__(self, depth: int):
        super().__init__(256, 1 << 16)
        self.depth = depth
        self.description = f"depth {depth}"
        self.stored: set[int] = set()

    def put(self, key, buf):
        self.slots.alloc(key, buf.size)
        self.stored.add(key)

    def get(self, key, out):
        assert key in self.stored

    def delete(self, key):
        self.slots.release(key)
        self.stored.discard(key)


def model_step(tier, bufs, seconds):
    """GB/s of len(bufs) threads on the modelled device: 1 GB/s per thread up to its depth, a little noise
    (2 %) above it, as a saturated device shows."""
    k = len(bufs)
    for i, buf in enumerate(bufs):  # each thread's object, as the real step writes it
        tier.put(PROBE_KEY + i, buf)
    for i in range(k):
        tier.delete(PROBE_KEY + i)
    return min(k, tier.depth) * (1.0 + (0.02 if k > tier.depth and k % 2 else 0.0))


def test_the_probe_finds_where_the_device_saturates():
    for depth in (1, 2, 8, 16):
        tier = QueueDepthTier(depth)
        chosen, steps = concurrency(tier, 1 << 16, 32, step=model_step)
        assert chosen == depth, (depth, steps)
        assert [k for k, _ in steps][:3] == [1, 2, 4]
        assert steps[-1][0] <= 4 * max(depth, 1)  # two flat doublings end the search
        assert tier.slots.used_slots == 0


def test_the_probe_stops_at_its_ceiling_and_within_the_tier():
    chosen, steps = concurrency(QueueDepthTier(64), 1 << 16, 8, step=model_step)
    assert [k for k, _ in steps] == [1, 2, 4, 8] and chosen == 8
    chosen, steps = concurrency(QueueDepthTier(64), 1 << 16, 6, step=model_step)
    assert [k for k, _ in steps] == [1, 2, 4, 6]  # the ceiling is the last step, even between doublings
    small = QueueDepthTier(64)
    small.num_slots = 3  # room for 3 objects only
    chosen, steps = concurrency(small, 1 << 16, 32, step=model_step)
    assert max(k for k, _ in steps) == 3 and chosen == 3


def test_one_noisy_step_does_not_end_the_search():
    gbps = {1: 1.0, 2: 2.0, 4: 2.1, 8: 6.0, 16: 6.1, 32: 6.0}  # 4 threads flat once, then it grows again

    def step(tier, bufs, seconds):
        return gbps[len(bufs)]
    chosen, steps = concurrency(QueueDepthTier(64), 1 << 16, 32, step=step)
    assert chosen == 8 and [k for k, _ in steps] == [1, 2, 4, 8, 16, 32]


def test_the_real_step_moves_bytes_and_leaves_no_object():
    tier = QueueDepthTier(4)
    bufs = [bytearray(1 << 16) for _ in range(3)]

    class Buf:  # what the step needs of a buffer: its size
        def __init__(self, b):
            self.size = len(b)
    gbps = _step(tier, [Buf(b) for b in bufs], 0.05)
    assert gbps > 0  # it moved something; how fast is the machine's business
    assert tier.slots.used_slots == 0 and not tier.stored


class FullDevice(QueueDepthTier):
    def put(self, key, buf):
        raise RunFault("disk full while writing /x: No space left on device; free space or lower --nvme-gb.")


def test_a_device_fault_in_the_probe_is_one_sentence_before_the_run():
    with pytest.raises(RunFault, match="disk full"):  # not swallowed by a probe thread
        concurrency(FullDevice(4), 1 << 16, 8, seconds=0.05)
    s = resolve(None, [], {"model.name": "llama8b", "model.block_tokens": 4}, media_sections=SECTIONS)
    with pytest.raises(UserError, match="--workers 0 .* failed: disk full.*--workers N"):
        probe_workers(s, [FullDevice(4)], geometry(s), 8, 8, None)
