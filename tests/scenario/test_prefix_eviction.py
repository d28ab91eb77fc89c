"""Prefix-correct eviction, vLLM style: exact eviction and demotion orders for chains, shared heads and
partial hits, for every policy. A chain's tail leaves a tier before its head; a head shared by several
chains lives while any of them needs it; no block is ever left that no lookup can reach."""

from __future__ import annotations

import random

import numpy as np
import pytest
from found import POLICIES
from helpers import assert_cache_consistent

from kv_cache import counters as C
from kv_cache.cache.cache import BlockCache
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.null import NullTier
from kv_cache.types import RequestOutcome

SLOT = 4096
BUF = np.zeros(SLOT, np.uint8)


def make(policy: str, *slots: int, promote: bool = True) -> BlockCache:
    names = ("gpu", "cpu", "nvme")[-len(slots):]
    rec = Recorder()
    rec.start_measuring(0)
    return BlockCache([NullTier(n, k * SLOT, SLOT) for n, k in zip(names, slots)], POLICIES[policy], promote, rec)


def write(cache: BlockCache, key: str, parent: str | None = None) -> list[str]:
    """Write one block; return the keys that left the cache to make room (in order)."""
    before = set(cache.index)
    res = cache.reserve_write(hash(key), SLOT, "user", hash(parent) if parent else None)
    assert res is not None, f"no room for {key}"
    evicted = [names[mv.entry.key] for mv in res.moves if mv.dst is None]
    cache.commit_write(res, BUF, "prefill", BUF)
    assert set(cache.index) - before == {hash(key)}
    return evicted


def chain(cache: BlockCache, *keys: str, after: str | None = None) -> list[str]:
    out, parent = [], after
    for k in keys:
        out += write(cache, k, parent)
        parent = k
    return out


def hits(cache: BlockCache, *keys: str) -> int:
    got = cache.pin_prefix([hash(k) for k in keys])
    for e in got:
        cache.read(e, BUF, "load")
        cache.release(e, BUF, BUF)
    return len(got)


def tier_of(cache: BlockCache, key: str) -> str:
    return cache.names[cache.index[hash(key)].tier]


def dead(cache: BlockCache) -> int:
    return sum(t["dead_blocks"] for t in cache.occupancy().values())


names = {hash(k): k for k in [f"{c}{i}" for c in "abcdsxyz" for i in range(10)] + ["s"]}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_chain_loses_its_tail_first(policy):
    cache = make(policy, 4)
    chain(cache, "a0", "a1", "a2", "a3")
    assert write(cache, "b0") == ["a3"]
    assert write(cache, "b1", "b0") == ["a2"]
    assert hits(cache, "a0", "a1", "a2", "a3") == 2  # what is left of A is still a prefix
    assert dead(cache) == 0
    assert_cache_consistent(cache)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_shared_head_outlives_every_chain_that_needs_it(policy):
    cache = make(policy, 4)
    chain(cache, "s", "x1", "x2")
    write(cache, "y1", "s")                      # s is shared by x and y
    evicted = []
    for z in ("z0", "z1", "z2", "z3"):
        evicted += write(cache, z, None if z == "z0" else f"z{int(z[1]) - 1}")
        assert dead(cache) == 0
    assert evicted[-1] == "s" and set(evicted) == {"s", "x1", "x2", "y1"}
    assert evicted.index("x2") < evicted.index("x1")  # within x: tail first
    assert_cache_consistent(cache)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_partial_hit_branching_off_keeps_the_common_prefix(policy):
    cache = make(policy, 4)
    chain(cache, "a0", "a1", "a2", "a3")
    assert hits(cache, "a0", "a1") == 2
    evicted = chain(cache, "c2", "c3", after="a1")  # same first two blocks, then a new continuation
    assert evicted == ["a3", "a2"]
    assert hits(cache, "a0", "a1", "c2", "c3") == 4
    assert dead(cache) == 0
    assert_cache_consistent(cache)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_demotion_moves_tails_down_and_heads_stay_up(policy):
    cache = make(policy, 3, 10)  # cpu, nvme
    chain(cache, "a0", "a1", "a2")
    write(cache, "b0")
    assert [tier_of(cache, k) for k in ("a0", "a1", "a2", "b0")] == ["cpu", "cpu", "nvme", "cpu"]
    write(cache, "b1", "b0")  # b0 holds its child now: of A, the new tail in cpu (a1) goes down
    assert [tier_of(cache, k) for k in ("a0", "a1", "a2", "b0", "b1")] == ["cpu", "nvme", "nvme", "cpu", "cpu"]
    assert hits(cache, "a0", "a1", "a2") == 3
    assert dead(cache) == 0
    assert_cache_consistent(cache)


def test_lru_exact_order_across_chains():
    cache = make("lru", 5)
    chain(cache, "a0", "a1", "a2")
    chain(cache, "b0", "b1")
    assert hits(cache, "a0", "a1", "a2") == 3  # A is now the most recent chain
    assert chain(cache, "c0", "c1", "c2") == ["b1", "b0", "a2"]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_dead_blocks_under_random_chained_traffic(policy):
    """Conversations growing turn by turn over shared system prompts, through two tiers, with hits and
    promotions: the cache never holds a block no lookup can reach."""
    rng = random.Random(11)
    cache = make(policy, 6, 14)
    convs: dict[int, list[int]] = {}
    next_key = iter(range(10**6, 2 * 10**6))
    for step in range(400):
        c = rng.randrange(12)
        blocks = convs.setdefault(c, [c % 3])  # three shared heads ("system prompts")
        if (c % 3) not in cache.index:
            cache_write(cache, c % 3, None)
        got = cache.pin_prefix(blocks)
        for e in got:
            cache.read(e, BUF, "load")
            cache.release(e, BUF, BUF)
        for i in range(len(got), len(blocks)):  # recompute and rewrite what missed
            cache_write(cache, blocks[i], blocks[i - 1] if i else None)
        for _ in range(rng.randrange(1, 3)):  # the turn's new blocks
            k = next(next_key)
            cache_write(cache, k, blocks[-1])
            blocks.append(k)
        assert dead(cache) == 0, step
    assert_cache_consistent(cache)


def cache_write(cache, key, parent):
    res = cache.reserve_write(key, SLOT, "user", parent)
    if res is not None:
        cache.commit_write(res, BUF, "prefill", BUF)


def test_a_parent_evicted_below_a_chain_thousands_long_drops_it_without_recursing():
    """4-token blocks make chains of thousands (a 12,000-token prompt: 3,000 blocks). A chain's head evicted from
    the bottom tier while its descendants sat in the tier above dropped them one call deeper each: the run stopped
    with "internal error in a worker: RecursionError" (`--block-tokens 4 --cpu-mem-gb 0.2`, 200 users)."""
    length = 1500
    cache = make("lru", length, length + 1)
    for k in ["a0"] + [f"f{i}" for i in range(length)] + [f"a{i}" for i in range(1, length + 1)] + ["z"]:
        names.setdefault(hash(k), k)
    write(cache, "a0")
    for i in range(length):  # a0 goes down to the bottom tier to make room for the last of these
        write(cache, f"f{i}")
    assert tier_of(cache, "a0") == "nvme"
    chain(cache, *(f"a{i}" for i in range(1, length + 1)), after="a0")  # the fillers go down, the chain stays up
    assert tier_of(cache, "a1") == tier_of(cache, f"a{length}") == "cpu"
    evicted = write(cache, "z")  # its room: the chain's tail goes down, and a0 leaves the bottom tier
    assert "a0" in evicted
    assert hits(cache, *(f"a{i}" for i in range(length + 1))) == 0
    assert cache.recorder.counters()["cache.cascade_drops"] >= length - 1
    assert_cache_consistent(cache)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_write_refused_says_why(policy):
    """A chain longer than the cache: its fifth block finds every slot held for the chain (no room), the sixth has
    no parent cached; a block written twice is cached already. The console and results.json count each reason
    (blocks_write_skipped_by); before, one count said nothing of why."""
    cache = make(policy, 4)
    chain(cache, "a0", "a1", "a2", "a3")
    why: list[str] = []
    assert cache.reserve_write(hash("a4"), SLOT, "user", hash("a3"), why) is None
    assert cache.reserve_write(hash("a5"), SLOT, "user", hash("a4"), why) is None
    assert cache.reserve_write(hash("a1"), SLOT, "user", hash("a0"), why) is None
    assert why == ["no_room", "parent_gone", "cached"]
    assert_cache_consistent(cache)


def test_a_request_counts_the_blocks_after_its_own_cut_apart():
    """The cache says parent_gone of every block past a chain's cut: the first cut by the cache (no room, or an
    ancestor evicted) and the blocks after it in the same request were one number, 1,009 of them in a run where 51
    parents had left the cache and 958 blocks only followed those cuts."""
    cache = make("lru", 4)
    chain(cache, "a0", "a1", "a2", "a3")
    out = RequestOutcome(0, 0)
    for key, parent in (("a4", "a3"), ("a5", "a4"), ("a6", "a5"), ("b1", "b0"), ("a1", "a0")):
        why: list[str] = []
        assert cache.reserve_write(hash(key), SLOT, "user", hash(parent), why) is None
        out.refused(hash(key), hash(parent), why[0])
    assert out.write_skipped == ["no_room", "after_cut", "after_cut", "parent_gone", "cached"]
    counts = dict(out.counts())
    assert counts[C.BLOCKS_WRITE_SKIPPED] == 5 and counts[C.BLOCKS_WRITE_SKIPPED_BY("after_cut")] == 2

