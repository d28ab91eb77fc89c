"""Properties of the cache under arbitrary and concurrent operation sequences."""

import random
import threading

import numpy as np
from found import POLICIES
from helpers import assert_cache_consistent
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_cache.cache.cache import BlockCache
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.null import NullTier

SLOT = 4096
BUF = np.zeros(8 * SLOT, np.uint8)


def make(cpu, nvme, promote, gpu=0, policy="lru"):
    tiers = ([NullTier("gpu", gpu * SLOT, SLOT)] if gpu else []) + [NullTier("cpu", cpu * SLOT, SLOT),
                                                                     NullTier("nvme", nvme * SLOT, SLOT)]
    rec = Recorder()
    rec.start_measuring(0)
    return BlockCache(tiers, POLICIES[policy], promote, rec)


op = st.one_of(
    st.tuples(st.just("write"), st.integers(0, 30), st.integers(1, 3)),
    st.tuples(st.just("read"), st.lists(st.integers(0, 30), min_size=1, max_size=5), st.just(0)),
    st.tuples(st.just("pin"), st.lists(st.integers(0, 30), min_size=1, max_size=3), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=60), cpu=st.integers(1, 6), nvme=st.integers(3, 10), gpu=st.integers(0, 3),
       promote=st.booleans(), policy=st.sampled_from(sorted(POLICIES)))
def test_capacity_and_accounting_never_drift(ops, cpu, nvme, gpu, promote, policy):
    cache = make(cpu, nvme, promote, gpu, policy)
    held = []
    for kind, arg, size in ops:
        if kind == "write":
            res = cache.reserve_write(arg, size * SLOT, ("user", "system", "rag", "history")[arg % 4])
            if res is not None:
                cache.commit_write(res, BUF, "prefill", BUF)
        elif kind == "read":
            for e in cache.pin_prefix(arg):
                cache.read(e, BUF, "load")
                cache.release(e, BUF, BUF)
        else:
            held.extend(cache.pin_prefix(arg))
            if len(held) > 4:
                cache.unpin(held)
                held = []
        assert_cache_consistent(cache)
    cache.unpin(held)
    assert all(e.pins == 0 for e in cache.index.values())


def test_concurrent_workers_keep_accounting_exact():
    cache = make(cpu=8, nvme=24, promote=True, gpu=4)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        buf, scratch = np.zeros(3 * SLOT, np.uint8), np.zeros(3 * SLOT, np.uint8)
        try:
            for _ in range(3000):
                keys = [rng.randrange(60) for _ in range(rng.randrange(1, 5))]
                for e in cache.pin_prefix(keys):
                    cache.read(e, buf, "load")
                    cache.release(e, buf, scratch)
                res = cache.reserve_write(rng.randrange(60), rng.randrange(1, 4) * SLOT, "user")
                if res is not None:
                    cache.commit_write(res, buf, "prefill", scratch)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a worker deadlocked"
    assert not errors, errors
    assert_cache_consistent(cache)
    assert all(e.state == "ready" and e.pins == 0 for e in cache.index.values())


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.lists(st.tuples(st.booleans(), st.integers(0, 8), st.integers(1, 3)), max_size=60))
def test_slot_map_hands_out_slots_as_a_free_list_of_every_slot_would(num_slots, ops):
    """The lazy free list gives the same slots, in the same order, as a deque of every slot built up front."""
    from collections import deque

    from kv_cache.tiers.slots import SlotMap, TierFull

    m, free, held = SlotMap(num_slots, SLOT), deque(range(num_slots)), {}
    for alloc, key, n in ops:
        if alloc and key not in held:
            if len(free) < n:
                try:
                    m.alloc(key, n * SLOT)
                    raise AssertionError("a full map handed out slots")
                except TierFull:
                    continue
            held[key] = [free.popleft() for _ in range(n)]
            assert m.alloc(key, n * SLOT) == held[key]
        elif not alloc and key in held:
            free.extend(held.pop(key))
            m.release(key)
        assert m.used_slots == num_slots - len(free)


def test_a_huge_tier_costs_nothing_until_it_is_filled():
    from kv_cache.tiers.slots import SlotMap

    m = SlotMap(1 << 60, SLOT)  # a free list of every slot would never finish building
    assert m.alloc(1, SLOT) == [0] and m.used_slots == 1
