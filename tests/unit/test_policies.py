"""Each eviction policy's order on small, exact sequences; adaptive weights stay in bounds."""

from __future__ import annotations

import pytest

from kv_cache.cache.policies import POLICIES, Policy, make
from kv_cache.cache.policies.semantickv import W_MAX, W_MIN, SemanticAdaptivePolicy


def make_policy(name: str):
    return make(POLICIES[name])


def _fill(policy, keys, label="user", nbytes=1 << 20):
    for k in keys:
        policy.on_insert(k, label, nbytes)


def test_fifo_ignores_hits_and_lru_does_not():
    fifo, lru = make_policy("fifo"), make_policy("lru")
    for p in (fifo, lru):
        _fill(p, [1, 2, 3])
        p.on_hit(1)
    assert list(fifo.candidates()) == [1, 2, 3]
    assert list(lru.candidates()) == [2, 3, 1]


def test_lfu_evicts_the_least_hit_oldest_first():
    p = make_policy("lfu")
    _fill(p, [1, 2, 3])
    for k in (1, 1, 3):
        p.on_hit(k)
    assert list(p.candidates()) == [2, 3, 1]


def test_size_lru_evicts_the_bigger_of_two_blocks_touched_about_as_recently():
    p = make_policy("size-lru")
    p.on_insert(1, "user", 1 << 20)
    p.on_insert(2, "user", 64 << 20)   # newer, but 64 x bigger: evicting it frees more room
    p.on_insert(3, "user", 1 << 20)
    assert list(p.candidates()) == [2, 1, 3]


def test_s3fifo_evicts_one_hit_wonders_before_reused_blocks_and_remembers_ghosts():
    p = make_policy("s3fifo")
    _fill(p, range(10))
    for k in (0, 1, 2):
        p.on_hit(k)
    order = list(p.candidates())
    assert set(order[:7]) == set(range(3, 10))  # never hit: first out
    p.on_remove(3)
    p.on_insert(3, "user", 1 << 20)  # back from the ghost list: straight into main
    assert 3 in p._main


def test_semantic_static_keeps_system_blocks_over_user_blocks():
    p = make_policy("semantic-static")
    p.on_insert(1, "system", 1 << 20)
    p.on_insert(2, "user", 1 << 20)
    p.on_insert(3, "rag", 1 << 20)
    assert list(p.candidates()) == [2, 3, 1]


def test_semantic_adaptive_learns_from_regret_and_stays_in_bounds():
    now = [0.0]
    p = SemanticAdaptivePolicy(clock=lambda: now[0])
    before = p.weights["user"]
    p.on_insert(1, "user", 1 << 20)
    p.on_remove(1)
    now[0] = 1.0
    p.on_insert(1, "user", 1 << 20)  # needed again one second after it was let go: a regret
    assert p.regrets == 1 and p.weights["user"] > before
    for i in range(2000):  # hammer: weights never leave [W_MIN, W_MAX]
        p.on_insert(100 + i, ("system", "user")[i % 2], 1 << 20)
        p.on_hit(100 + i)
        p.on_remove(100 + i)
        now[0] += 0.01
        p.on_insert(100 + i, ("system", "user")[i % 2], 1 << 20)
    now[0] += 1000
    p.candidates()
    assert all(W_MIN <= w <= W_MAX for w in p.weights.values())
    assert p.weights["system"] > 0.99 * W_MAX  # pushed to the ceiling, then one decay of idle types


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_forgets_removed_keys(name):
    p = make_policy(name)
    _fill(p, [1, 2, 3])
    p.on_hit(2)
    p.on_remove(2)
    assert sorted(p.candidates()) == [1, 3] and len(p) == 2


def test_semantic_adaptive_merge_of_heaps_is_the_order_of_scores():
    """The per-type fresh / floored heaps, merged at ask time, give exactly the order of sorting every block
    by its score at that time (what the policy used to do, O(n log n) per eviction)."""
    import random

    now = [0.0]
    p = SemanticAdaptivePolicy(clock=lambda: now[0])
    rng = random.Random(1)
    labels = ["system", "user", "rag", "history", "code", "tool", "other", "template"]
    for k in range(300):
        now[0] += rng.random() * 2
        p.on_insert(k, rng.choice(labels), rng.randint(1, 100) << 20)
        if rng.random() < 0.5:
            p.on_hit(rng.randrange(k + 1))
        if rng.random() < 0.1:
            p.on_remove(rng.randrange(k + 1))
    now[0] += 100  # some blocks reach the freshness floor: they move heaps
    got = list(p.candidates())
    assert got == sorted(p._blocks, key=lambda k: p.score(p._blocks[k], now[0]))
    assert list(p.candidates()) == got  # looking changes nothing


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_held_block_is_no_candidate_until_freed(name):
    p = make_policy(name)
    _fill(p, [1, 2, 3])
    p.hold(1)
    assert 1 not in list(p.candidates()) and p.keys() == {1, 2, 3} and len(p) == 3
    p.on_hit(1)  # metadata still kept while held
    p.free(1)
    assert sorted(p.candidates()) == [1, 2, 3]
    p.hold(2)
    p.on_remove(2)
    assert p.keys() == {1, 3}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_is_the_declared_protocol_and_says_what_it_is(name):
    """Issue 47: the six verbs are a Protocol, and each policy declares its summary, stack property and clock."""
    cls = POLICIES[name]
    assert isinstance(make(cls), Policy) and cls.name == name and cls.summary
    assert cls.stack_property == (name == "lru")  # LRU's order alone is a stack (the capacity curve is exact)


@pytest.mark.parametrize("name", [n for n, c in POLICIES.items() if c.stack_property])
def test_a_policy_claiming_the_stack_property_has_it(name):
    """A block hit at capacity C is hit at C + 1 too (what lets one pass of stack distances give every capacity)."""
    import random

    rng = random.Random(5)
    seq = [rng.randrange(30) for _ in range(2000)]
    hits = []
    for cap in range(2, 20):
        p, held, got = make_policy(name), set(), set()
        for i, k in enumerate(seq):
            if k in held:
                p.on_hit(k)
                got.add(i)
                continue
            if len(held) == cap:
                victim = next(iter(p.candidates()))
                p.on_remove(victim)
                held.discard(victim)
            p.on_insert(k)
            held.add(k)
        hits.append(got)
    assert all(a <= b for a, b in zip(hits, hits[1:]))


def test_a_clock_reading_policy_reads_the_clock_it_is_given():
    now = [5.0]
    p = make(POLICIES["semantic-static"], clock=lambda: now[0])
    p.on_insert(1, "user", 1 << 20)
    assert p._blocks[1].born == 5.0
    assert not hasattr(make(POLICIES["lru"], clock=lambda: now[0]), "clock")  # LRU reads no clock
