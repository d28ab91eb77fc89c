"""Tiny-pool scenarios: exact keys, tiers and eviction order after each step (vLLM-style)."""

import threading

import numpy as np
import pytest
from helpers import assert_cache_consistent

from kv_cache.cache.cache import BlockCache
from kv_cache.cache.policies.lru import LRUPolicy
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.null import NullTier

SLOT = 4096


def make_cache(cpu_slots=2, nvme_slots=3, promote=True, gpu_slots=0):
    tiers = ([NullTier("gpu", gpu_slots * SLOT, SLOT)] if gpu_slots else []) + [
        NullTier("cpu", cpu_slots * SLOT, SLOT), NullTier("nvme", nvme_slots * SLOT, SLOT)]
    rec = Recorder()
    rec.start_measuring(0)
    return BlockCache(tiers, LRUPolicy, promote, rec), rec


BUF = np.zeros(SLOT, np.uint8)


def write(cache, key):
    res = cache.reserve_write(key, SLOT, "user")
    assert res is not None, f"no room for {key}"
    cache.commit_write(res, BUF, "prefill", BUF)


def read(cache, keys):
    hits = cache.pin_prefix(keys)
    for e in hits:
        cache.read(e, BUF, "load")
        cache.release(e, BUF, BUF)
    return len(hits)


def where(cache):
    out = {}
    for k, e in cache.index.items():
        out.setdefault(cache.names[e.tier], []).append(k)
    return {t: sorted(v) for t, v in out.items()}


assert_consistent = assert_cache_consistent


def test_new_blocks_fill_the_top_tier_then_demote_lru_first():
    cache, rec = make_cache()
    write(cache, 1)
    write(cache, 2)
    assert where(cache) == {"cpu": [1, 2]}
    write(cache, 3)
    assert where(cache) == {"cpu": [2, 3], "nvme": [1]}
    write(cache, 4)
    assert where(cache) == {"cpu": [3, 4], "nvme": [1, 2]}
    assert_consistent(cache)
    assert rec.counters()["ops.nvme.demote"] == 2


def test_bottom_tier_evicts_for_good_in_lru_order():
    cache, rec = make_cache()
    for k in range(1, 7):
        write(cache, k)
    # cpu holds the two newest, nvme the three before; block 1 is gone.
    assert where(cache) == {"cpu": [5, 6], "nvme": [2, 3, 4]}
    assert rec.counters()["ops.nvme.evict"] == 1
    assert_consistent(cache)


def test_a_hit_refreshes_lru_order():
    cache, _ = make_cache()
    write(cache, 1)
    write(cache, 2)
    assert read(cache, [1]) == 1  # 1 is now the most recent
    write(cache, 3)
    assert where(cache) == {"cpu": [1, 3], "nvme": [2]}


def test_promotion_brings_a_lower_hit_back_to_the_top():
    cache, rec = make_cache()
    for k in (1, 2, 3):
        write(cache, k)
    assert where(cache)["nvme"] == [1]
    assert read(cache, [1]) == 1
    assert where(cache) == {"cpu": [1, 3], "nvme": [2]}
    assert rec.counters()["ops.cpu.promote"] == 1
    assert_consistent(cache)


def test_no_promote_keeps_the_block_where_it_was_found():
    cache, rec = make_cache(promote=False)
    for k in (1, 2, 3):
        write(cache, k)
    assert read(cache, [1]) == 1
    assert where(cache) == {"cpu": [2, 3], "nvme": [1]}
    assert "ops.cpu.promote" not in rec.counters()


def test_longest_prefix_stops_at_the_first_miss():
    cache, _ = make_cache(cpu_slots=4)
    for k in (1, 2, 4):
        write(cache, k)
    assert read(cache, [1, 2, 3, 4]) == 2


def test_pinned_blocks_are_never_victims():
    cache, _ = make_cache(cpu_slots=2, nvme_slots=1)
    write(cache, 1)
    write(cache, 2)
    pinned = cache.pin_prefix([1, 2])
    assert len(pinned) == 2
    # cpu is full of pinned blocks: the new block goes to nvme instead.
    write(cache, 3)
    assert where(cache) == {"cpu": [1, 2], "nvme": [3]}
    # Everything pinned or full: no tier can take block 4 until the pins drop.
    pinned += cache.pin_prefix([3])
    assert cache.reserve_write(4, SLOT, "user") is None
    cache.unpin(pinned)
    write(cache, 4)
    assert where(cache) == {"cpu": [2, 4], "nvme": [1]}
    assert_consistent(cache)


def test_an_existing_block_is_not_written_twice():
    cache, _ = make_cache()
    write(cache, 1)
    assert cache.reserve_write(1, SLOT, "user") is None


def test_a_block_being_written_is_a_miss_for_readers():
    cache, _ = make_cache()
    res = cache.reserve_write(9, SLOT, "user")
    assert cache.pin_prefix([9]) == []
    cache.commit_write(res, BUF, "prefill", BUF)
    assert len(cache.pin_prefix([9])) == 1


def test_three_tier_waterfall():
    cache, _ = make_cache(cpu_slots=1, nvme_slots=1, gpu_slots=1)
    for k in (1, 2, 3, 4):
        write(cache, k)
    assert where(cache) == {"gpu": [4], "cpu": [3], "nvme": [2]}
    assert_consistent(cache)


def test_multi_slot_objects_make_room_for_their_whole_size():
    cache, _ = make_cache(cpu_slots=4, nvme_slots=8)
    for k in (1, 2, 3, 4):
        write(cache, k)
    res = cache.reserve_write(10, 3 * SLOT, "request")
    cache.commit_write(res, np.zeros(3 * SLOT, np.uint8), "prefill", np.zeros(3 * SLOT, np.uint8))
    assert where(cache) == {"cpu": [4, 10], "nvme": [1, 2, 3]}
    assert_consistent(cache)


@pytest.mark.parametrize("promote", [True, False])
def test_abort_gives_the_space_back(promote):
    cache, _ = make_cache(promote=promote)
    res = cache.reserve_write(1, SLOT, "user")
    cache.abort(res)
    assert cache.index == {} and cache.used == [0, 0]


def test_a_corrupt_block_is_discarded_never_served_again_and_rewritten():
    cache, rec = make_cache(cpu_slots=2, nvme_slots=3)
    for k in (1, 2, 3):
        write(cache, k)
    [e] = cache.pin_prefix([2])
    cache.read(e, BUF, "load")
    cache.discard(e)  # read back wrong
    assert 2 not in cache.index and read(cache, [2]) == 0
    assert_consistent(cache)
    write(cache, 2)  # the engine recomputes it: the key can be written again
    assert read(cache, [2]) == 1
    assert_consistent(cache)


def test_a_corrupt_block_held_by_another_reader_is_freed_by_the_last_one():
    cache, rec = make_cache(cpu_slots=2, nvme_slots=3, promote=False)
    write(cache, 1)
    [a] = cache.pin_prefix([1])
    [b] = cache.pin_prefix([1])
    cache.discard(a)
    assert cache.pin_prefix([1]) == []  # a miss for every new lookup at once
    assert cache.reserve_write(1, SLOT, "user") is None  # its slots are not free yet
    cache.release(b, BUF, BUF)  # the other reader lets go: now it is gone
    assert 1 not in cache.index
    assert_consistent(cache)
    write(cache, 1)
    assert read(cache, [1]) == 1


def test_an_evicted_block_leaves_no_stale_entry_in_its_policy():
    """A victim leaves the policy before the policy puts back what the cache looked at: after a thousand
    evictions the LRU heap holds exactly the tier's blocks (putting victims back first left one stale entry per
    eviction, up to twice the tier, walked past on every later eviction)."""
    cache, _ = make_cache(1, 100, False)
    for key in range(1, 1200):
        write(cache, key)
    for policy in cache.policies:
        assert len(policy._heap) == len(policy._live)
    assert_cache_consistent(cache)


def test_a_reader_that_meets_a_moving_block_waits_for_the_move_and_then_hits():
    cache, _ = make_cache()
    write(cache, 1)
    write(cache, 2)
    res = cache.reserve_write(3, SLOT, "user")  # block 1 is chosen to make room: MOVING until its demotion runs
    assert [m.entry.key for m in res.moves] == [1]
    got = []
    reader = threading.Thread(target=lambda: got.append(read(cache, [1])), daemon=True)
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not got  # waiting for the move, not served a half-moved block
    cache.commit_write(res, BUF, "prefill", BUF)  # runs the demotion: the reader must be woken
    reader.join(5)
    assert got == [1]
    assert_consistent(cache)
