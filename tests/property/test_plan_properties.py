"""A plan's keys and labels and the ceiling's lookups are exactly what one step per block gives.

Each is a shortcut taken for speed (a request of 4-token blocks has thousands of blocks, planned on every request and
for the pre-run analysis): the chain memo hashes only what a user's last sequence lacks, labels_at() searches the
spans' ends once for every block, and the ceiling finds a chained prefix's first miss by bisection, which holds only
because a chained key is never present without its parent."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_cache.cache.hashing import ChainMemo, block_keys, chain_root
from kv_cache.lifecycle.ceiling import Ceiling
from kv_cache.lifecycle.plan import Planner
from kv_cache.types import HISTORY, SYSTEM, USER, Request

LABELS = (SYSTEM, HISTORY, USER)


def _spans(rng, n: int) -> tuple[tuple[int, str], ...]:
    ends = sorted(set(rng.integers(0, n + 1, size=int(rng.integers(0, 4))).tolist()) | {n})
    return tuple((end, LABELS[i % 3]) for i, end in enumerate(ends))


def _requests(seed: int, count: int) -> list[Request]:
    """Requests that share prefixes of a few conversations (cut anywhere, not only at block edges), some with
    retrieved documents (RAG chunks, looked up one by one), some with nothing in common."""
    rng = np.random.default_rng(seed)
    bases = [rng.integers(0, 50, size=400, dtype=np.int32) for _ in range(3)]
    docs = [rng.integers(0, 50, size=64, dtype=np.int32) for _ in range(2)]
    out = []
    for i in range(count):
        base = bases[int(rng.integers(0, 3))]
        head = base[: int(rng.integers(0, base.size))]
        tail = rng.integers(0, 50, size=int(rng.integers(0, 40)), dtype=np.int32)
        placed = []
        if rng.random() < 0.3:  # a document in the middle: [head][doc][tail]
            d = int(rng.integers(0, 2))
            placed = [(head.size, head.size + docs[d].size, d)]
            head = np.concatenate([head, docs[d]])
        prompt = np.concatenate([head, tail])
        out.append(Request(0, i, 1, prompt, rng.integers(0, 50, size=int(rng.integers(0, 20)), dtype=np.int32),
                           _spans(rng, prompt.size), docs=tuple(placed)))
    return out


def _linear(plan, seen: set) -> list[int]:
    """The lookup of every block in turn: a prefix group up to its first miss, an independent block alone."""
    hits = []
    for first, end, independent in plan.groups:
        for i in range(first, end):
            if plan.keys[i] in seen:
                hits.append(i)
            elif not independent:
                break
    return hits


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), block_tokens=st.sampled_from([1, 4, 16]), rag=st.booleans())
def test_the_ceiling_s_bisected_lookup_hits_what_a_lookup_of_every_block_hits(seed, block_tokens, rag):
    planner = Planner(block_tokens, chain_root("m"), rag_chunk=rag)
    ceiling, seen = Ceiling(), set()
    hit_any = False
    for req in _requests(seed, 30):
        plan = planner.plan(req)
        assert ceiling.hits(plan) == _linear(plan, seen)
        hit_any = hit_any or bool(_linear(plan, seen))
        seen.update(plan.keys)
    assert hit_any  # the traffic shares prefixes: the comparison saw hits, not only misses


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 300))
def test_labels_at_is_the_label_of_the_span_each_index_falls_in(seed, n):
    rng = np.random.default_rng(seed)
    req = Request(0, 0, 1, np.zeros(n, np.int32), np.zeros(0, np.int32), _spans(rng, n) if n else ())
    indices = np.arange(0, n + 40)  # past the last span too: the last span's label
    assert req.labels_at(indices) == [_label_of(req.spans, int(i)) for i in indices]


def _label_of(spans, i: int) -> str:
    """The span token i falls in, walked one span at a time (the last one's past them all; USER without spans)."""
    for end, label in spans:
        if i < end:
            return label
    return spans[-1][1] if spans else USER


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), block_tokens=st.sampled_from([1, 3, 16]),
       room=st.sampled_from([0, 4_000, 1 << 30]))
def test_the_chain_memo_s_keys_are_the_chain_s_keys_hashed_from_the_root(seed, block_tokens, room):
    """Users' follow-ups extend or cut their last sequence anywhere (within a block too), or start over, one user's
    sequence follows another's; a memo too small for every user evicts (room 4,000 B), or holds nothing (0)."""
    rng = np.random.default_rng(seed)
    root = chain_root("m")
    memo = ChainMemo(root, block_tokens, max_bytes=room)
    last: dict[int, np.ndarray] = {}
    for _ in range(60):
        user = int(rng.integers(0, 4))
        seq = last.get(user, np.zeros(0, np.int32))
        move = rng.random()
        if move < 0.5:  # a follow-up: the history and a new turn
            seq = np.concatenate([seq, rng.integers(0, 9, size=int(rng.integers(0, 50)), dtype=np.int32)])
        elif move < 0.7 and seq.size:  # the history changed at one token (an edited turn), in the array it was in
            seq[int(rng.integers(0, seq.size))] += 1
        elif move < 0.85:  # another user's sequence, cut anywhere
            other = last.get(int(rng.integers(0, 4)), seq)
            seq = other[: int(rng.integers(0, other.size + 1))]
        else:  # a new conversation
            seq = rng.integers(0, 9, size=int(rng.integers(0, 80)), dtype=np.int32)
        assert memo.keys(user, seq) == block_keys(seq, block_tokens, root)
        assert memo.nbytes <= room
        last[user] = seq
