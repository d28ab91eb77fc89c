"""SemanticKV's semantic-aware eviction: blocks carry a type from their source, types carry weights.

Types: a block's source label mapped to SemanticKV's vocabulary (system,
template, code, rag, tool, history, other, user). Scores (the lowest is
evicted first), with a = hits, size in MiB standing for tokens (blocks of one
run have one token count, so only ratios matter):

- static:   w_type x max(1, ln(1 + a)) x saved / max(1, sqrt(size))
- adaptive: w_type x max(1, 1 + ln(1 + a) + 0.25 a) x max(0.05, exp(-age / 60 s)) x saved
            / max(1, size^0.15)
  where saved (the recompute time a hit saves) is taken proportional to size: max(1, size).

Bookkeeping (O(log n) per verb, whatever the tier's size): static scores change only with a
block's own hits, so one lazy heap orders them. Adaptive scores are w_type x f(block) x
exp(-(now - born) / 60 s): within one type, and while the freshness term has not reached its
0.05 floor, their order does not change with time (compare f x exp(born / 60 s)); past the
floor it is f alone. So each type keeps two heaps (fresh, floored) and the candidates are a
merge of the sixteen heads at the current weights and time: the same order as sorting every
block by its score, without doing so.

Adaptive feedback: a *regret* — a block inserted again shortly (< 60 s) after
this tier removed it — raises its type's weight by 0.18 + min(0.12, size/1000);
a hit by 0.01 + min(0.04, size/4000); types of blocks never hit and older than
60 s decay x 0.995 each time candidates are asked for; weights stay within
[0.2, 5.0].
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Iterator

from kv_cache.cache.policies.heap import HeapPolicy, Holding
from kv_cache.types import GENERATED, HISTORY, INJECTED, RAG, RAG_CHUNK, SYSTEM, TEMPLATE, USER

WEIGHTS = {"system": 2.4, "template": 2.0, "code": 1.6, "rag": 1.4, "tool": 1.1, "history": 1.0, "other": 0.8,
           "user": 0.7}
# our plan labels (types.py) -> the paper's content types (its code and tool types have no label of ours)
LABEL_TYPE = {SYSTEM: "system", INJECTED: "system", TEMPLATE: "template", RAG: "rag", RAG_CHUNK: "rag",
              HISTORY: "history", GENERATED: "history", USER: "user"}
W_MIN, W_MAX, HORIZON_S = 0.2, 5.0, 60.0


def semantic_type(label: str) -> str:
    return LABEL_TYPE.get(label, "other")


class _Block:
    __slots__ = ("type", "size", "hits", "born")

    def __init__(self, kind: str, size: float, now: float):
        self.type, self.size, self.hits, self.born = kind, size, 0, now


class SemanticStaticPolicy(HeapPolicy):
    name, summary = "semantic-static", "SemanticKV's type-weighted score"
    uses_clock = True

    def __init__(self, clock=time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.weights = dict(WEIGHTS)
        self._blocks: dict[int, _Block] = {}

    def _meta_insert(self, key: int, label: str, nbytes: int) -> None:
        self._blocks[key] = _Block(semantic_type(label), max(nbytes / 2**20, 1e-3), self.clock())

    def _meta_hit(self, key: int) -> bool:
        self._blocks[key].hits += 1
        return True

    def _meta_remove(self, key: int) -> None:
        self._blocks.pop(key, None)

    def _priority(self, key: int):
        return self.score(self._blocks[key], 0.0)

    def score(self, b: _Block, now: float) -> float:
        saved = max(1.0, b.size)
        return self.weights[b.type] * max(1.0, math.log1p(b.hits)) * saved / max(1.0, math.sqrt(b.size))


FLOOR = 0.05
FLOOR_AGE_S = HORIZON_S * math.log(1 / FLOOR)  # age at which exp(-age / H) reaches the floor


class SemanticAdaptivePolicy(Holding):
    """Adaptive weights and freshness; per-type fresh and floored heaps merged at ask time."""

    name, summary = "semantic-adaptive", "SemanticKV's score with weights learnt from regrets"
    stack_property, uses_clock = False, True

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.weights = dict(WEIGHTS)
        self._blocks: dict[int, _Block] = {}
        self._removed: dict[int, tuple[float, str, float]] = {}  # key -> (when, type, size)
        self.regrets = 0
        self._heaps: dict[tuple[str, bool], list] = {(t, f): [] for t in WEIGHTS for f in (True, False)}
        self._live: dict[int, tuple] = {}        # key -> (bucket, prio, tie) of its current entry
        self._held: set[int] = set()
        self._by_birth: dict[str, deque] = {t: deque() for t in WEIGHTS}  # (born, key): fresh -> floored
        self._unhit: dict[str, deque] = {t: deque() for t in WEIGHTS}     # (born, key) never hit: decay
        self._tie = itertools.count()

    # -- scores
    def _use(self, b: _Block) -> float:
        size_term = max(1.0, b.size) / max(1.0, b.size ** 0.15)
        return max(1.0, 1.0 + math.log1p(b.hits) + 0.25 * b.hits) * size_term

    def score(self, b: _Block, now: float) -> float:
        fresh = max(FLOOR, math.exp(-(now - b.born) / HORIZON_S))
        return self.weights[b.type] * self._use(b) * fresh

    def _push(self, key: int, now: float) -> None:
        b = self._blocks[key]
        fresh = now - b.born < FLOOR_AGE_S
        prio = math.log(self._use(b)) + (b.born / HORIZON_S if fresh else 0.0)
        entry = ((b.type, fresh), prio, next(self._tie))
        self._live[key] = entry
        heap = self._heaps[entry[0]]
        heapq.heappush(heap, (prio, entry[2], key))
        if len(heap) > 64 and len(heap) > 2 * len(self._live) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        for heap in self._heaps.values():
            heap.clear()
        for key, (bucket, prio, tie) in self._live.items():
            self._heaps[bucket].append((prio, tie, key))
        for heap in self._heaps.values():
            heapq.heapify(heap)

    # -- verbs
    def _bump(self, kind: str, by: float) -> None:
        self.weights[kind] = min(W_MAX, max(W_MIN, self.weights[kind] + by))

    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None:
        now = self.clock()
        gone = self._removed.pop(key, None)
        if gone is not None and now - gone[0] < HORIZON_S:  # needed again soon after we let it go
            self.regrets += 1
            self._bump(gone[1], 0.18 + min(0.12, gone[2] / 1000))
        b = self._blocks[key] = _Block(semantic_type(label), max(nbytes / 2**20, 1e-3), now)
        self._held.discard(key)
        self._by_birth[b.type].append((now, key))
        self._unhit[b.type].append((now, key))
        self._push(key, now)

    def on_hit(self, key: int) -> None:
        b = self._blocks.get(key)
        if b is not None:
            b.hits += 1
            self._bump(b.type, 0.01 + min(0.04, b.size / 4000))
            if key in self._live:
                self._push(key, self.clock())

    def on_remove(self, key: int) -> None:
        b = self._blocks.pop(key, None)
        self._live.pop(key, None)
        self._held.discard(key)
        if b is not None:
            self._removed[key] = (self.clock(), b.type, b.size)
            if len(self._removed) > 4 * max(len(self._blocks), 1024):  # forget the oldest removals
                for k in list(self._removed)[: len(self._removed) // 2]:
                    del self._removed[k]

    def _repush(self, key: int) -> None:
        self._push(key, self.clock())

    # -- asking
    def _age(self, now: float) -> None:
        """Move blocks whose freshness reached its floor to their type's floored heap; decay the weight of
        types holding a block never hit and older than the horizon."""
        for kind in WEIGHTS:
            births = self._by_birth[kind]
            while births and now - births[0][0] >= FLOOR_AGE_S:
                born, key = births.popleft()
                b = self._blocks.get(key)
                if b is not None and b.born == born and key in self._live:
                    self._push(key, now)
            unhit = self._unhit[kind]
            while unhit and (self._blocks.get(unhit[0][1]) is None or self._blocks[unhit[0][1]].hits
                             or self._blocks[unhit[0][1]].born != unhit[0][0]):
                unhit.popleft()
            if unhit and now - unhit[0][0] > HORIZON_S:
                self.weights[kind] = max(W_MIN, self.weights[kind] * 0.995)

    def candidates(self) -> Iterator[int]:
        now = self.clock()
        self._age(now)
        shift = {True: -now / HORIZON_S, False: math.log(FLOOR)}
        heads: list[tuple] = []  # (global log score, prio, tie, key, bucket)
        taken: list[tuple] = []

        def advance(bucket) -> None:
            heap = self._heaps[bucket]
            while heap:
                prio, tie, key = heapq.heappop(heap)
                if self._live.get(key) == (bucket, prio, tie):
                    heapq.heappush(heads, (math.log(self.weights[bucket[0]]) + prio + shift[bucket[1]], prio, tie,
                                           key, bucket))
                    return
        try:
            for bucket in self._heaps:
                advance(bucket)
            while heads:
                _, prio, tie, key, bucket = heapq.heappop(heads)
                taken.append((bucket, prio, tie, key))
                yield key
                advance(bucket)
        finally:
            for _, prio, tie, key, bucket in heads:
                taken.append((bucket, prio, tie, key))
            for bucket, prio, tie, key in taken:
                if self._live.get(key) == (bucket, prio, tie):
                    heapq.heappush(self._heaps[bucket], (prio, tie, key))

