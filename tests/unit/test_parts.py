"""Objects larger than one I/O move as parts (cache/parts.py, --io-chunk-mb): written part by part from a
buffer of one part, read back part by part and verified incrementally, demoted and promoted part by part, each
part's I/O timed beside the object's; nothing of a half-written object stays; slots are counted as whole."""

from __future__ import annotations

import numpy as np
import pytest

from kv_cache.buffers import aligned_buffer
from kv_cache.cache.cache import BlockCache
from kv_cache.cache.parts import Parts, part_key
from kv_cache.cache.policies.lru import LRUPolicy
from kv_cache.lifecycle.payload import PayloadPool, block_digest
from kv_cache.lifecycle.worker import PartsCheck
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.cpu import CpuTier
from kv_cache.tiers.devices import FakeDevice
from kv_cache.tiers.gpu import GpuTier

SLOT = 64 * 1024
PART = 2 * SLOT
OBJECT = 5 * SLOT + 8192  # three parts: 2 + 2 + 1 slots (the last one short)


@pytest.fixture
def pool():
    return PayloadPool(seed=11, span_bytes=1 << 20)


def _stack():
    gpu = GpuTier(FakeDevice(), 6 * SLOT, SLOT, [0], lanes=2, staging_bytes=PART)
    cpu = CpuTier(24 * SLOT, SLOT)
    rec = Recorder()
    rec.start_measuring(0)
    return gpu, cpu, rec, BlockCache([gpu, cpu], LRUPolicy, True, rec, parts=Parts(PART))


def _write(cache, pool, key, buf, scratch):
    digest = __import__("xxhash").xxh3_64()

    def produce(at, out):
        pool.fill(key, out, at)
        digest.update(out)
        return out

    res = cache.reserve_write(key, OBJECT, "user")
    cache.commit_write(res, buf, "prefill", scratch, produce)
    res.entry.digest = digest.intdigest()
    return res.entry


def test_the_parts_of_a_payload_are_the_whole_payload(pool):
    whole = aligned_buffer(OBJECT)
    pool.fill(7, whole)
    part = aligned_buffer(PART)
    for _, at, n in Parts(PART).of(7, OBJECT):
        pool.fill(7, part[:n], at)
        assert np.array_equal(part[:n], whole[at:at + n]), at
        assert pool.check(7, part[:n], "full", None, at) and pool.check(7, part[:n], "stamps", None, at)
    assert [k for k, _, _ in Parts(PART).of(7, OBJECT)] == [7, part_key(7, 1), part_key(7, 2)]
    check = PartsCheck(pool, 7, "checksum", block_digest(whole), OBJECT)
    for _, at, n in Parts(PART).of(7, OBJECT):
        check(at, whole[at:at + n])
    assert check.intact()  # the incremental XXH3-64 is the whole object's


def test_an_object_moves_part_by_part_through_buffers_of_one_part(pool):
    gpu, cpu, rec, cache = _stack()
    buf, scratch = aligned_buffer(PART), aligned_buffer(PART)  # no buffer holds a whole object
    e1 = _write(cache, pool, 1, buf, scratch)
    assert gpu.slots.used_slots == 6 == gpu.slots_for(OBJECT) and len(gpu.slots) == 3  # 3 parts, the slots of 1
    _write(cache, pool, 2, buf, scratch)  # the first object is demoted to the CPU tier, part by part
    assert cache.names[e1.tier] == "cpu" and len(cpu.slots) == 3 and cpu.slots.used_slots == 6
    counters = rec.counters()
    assert counters["ops.gpu.write"] == 2 and counters["ops.cpu.demote"] == 1
    (e,) = cache.pin_prefix([1])
    check = PartsCheck(pool, 1, "checksum", e.digest, OBJECT)
    cache.read(e, buf, "load", "read", check)
    assert check.intact()
    cache.release(e, buf, scratch)  # promoted back, part by part
    assert cache.names[e.tier] == "gpu" and len(cpu.slots) == 3  # object 2 was demoted to make room
    snap = rec.snapshot()
    units = [k for k in snap.hists if k[1].endswith("_io")]
    assert ("cpu", "read_io", "load") in units and ("gpu", "write_io", "prefill") in units


def test_a_damaged_part_fails_the_objects_check(pool):
    gpu, cpu, rec, cache = _stack()
    buf, scratch = aligned_buffer(PART), aligned_buffer(PART)
    e = _write(cache, pool, 3, buf, scratch)
    slots, _ = gpu.slots.lookup(part_key(3, 2))
    gpu.slabs[0][slots[0] * SLOT + 5000] ^= 0xFF  # one byte of the last part
    (e,) = cache.pin_prefix([3])
    for mode, digest in (("checksum", e.digest), ("full", None)):
        check = PartsCheck(pool, 3, mode, digest, OBJECT)
        cache.read(e, buf, "load", "read", check)
        assert not check.intact(), mode


def test_a_part_that_fails_leaves_nothing_of_the_object(pool, monkeypatch):
    gpu, cpu, rec, cache = _stack()
    buf, scratch = aligned_buffer(PART), aligned_buffer(PART)
    real_put, calls = gpu.put, []

    def failing(key, data):
        calls.append(key)
        if len(calls) == 3:
            raise OSError("device gone")
        real_put(key, data)

    monkeypatch.setattr(gpu, "put", failing)
    with pytest.raises(OSError):
        _write(cache, pool, 4, buf, scratch)
    assert len(gpu.slots) == 0 and gpu.slots.used_slots == 0 and 4 not in cache.index
