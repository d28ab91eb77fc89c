"""SemanticKV's semantic-aware eviction: blocks carry a type from their source, types carry weights.

Types: a block's source label mapped to SemanticKV's vocabulary (system,
template, code, rag, tool, history, other, user). Scores (the lowest is
evicted first), with a = hits, size in MiB standing for tokens (blocks of one
run have one token count, so only ratios matter):

- static:   w_type x max(1, ln(1 + a)) x saved / max(1, sqrt(size))
- adaptive: w_type x max(1, 1 + ln(1 + a) + 0.25 a) x max(0.05, exp(-age / 60 s)) x saved
            / max(1, size^0.15)
  where saved (the recompute time a hit saves) is taken proportional to size: max(1, size).

Adaptive feedback: a *regret* — a block inserted again shortly (< 60 s) after
this tier removed it — raises its type's weight by 0.18 + min(0.12, size/1000);
a hit by 0.01 + min(0.04, size/4000); types of blocks never hit and older than
60 s decay x 0.995 each time candidates are asked for; weights stay within
[0.2, 5.0].
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

WEIGHTS = {"system": 2.4, "template": 2.0, "code": 1.6, "rag": 1.4, "tool": 1.1, "history": 1.0, "other": 0.8,
           "user": 0.7}
LABEL_TYPE = {"system": "system", "template": "template", "code": "code", "rag": "rag", "rag_chunk": "rag",
              "tool": "tool", "history": "history", "generated": "history", "user": "user"}
W_MIN, W_MAX, HORIZON_S = 0.2, 5.0, 60.0


def semantic_type(label: str) -> str:
    return LABEL_TYPE.get(label, "other")


class _Block:
    __slots__ = ("type", "size", "hits", "born")

    def __init__(self, kind: str, size: float, now: float):
        self.type, self.size, self.hits, self.born = kind, size, 0, now


class SemanticStaticPolicy:
    name = "semantic-static"

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.weights = dict(WEIGHTS)
        self._blocks: dict[int, _Block] = {}

    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None:
        self._blocks[key] = _Block(semantic_type(label), max(nbytes / 2**20, 1e-3), self.clock())

    def on_hit(self, key: int) -> None:
        b = self._blocks.get(key)
        if b is not None:
            b.hits += 1

    def on_remove(self, key: int) -> None:
        self._blocks.pop(key, None)

    def score(self, b: _Block, now: float) -> float:
        saved = max(1.0, b.size)
        return self.weights[b.type] * max(1.0, math.log1p(b.hits)) * saved / max(1.0, math.sqrt(b.size))

    def candidates(self) -> Iterator[int]:
        now = self.clock()
        return iter(sorted(self._blocks, key=lambda k: self.score(self._blocks[k], now)))

    def __len__(self) -> int:
        return len(self._blocks)


class SemanticAdaptivePolicy(SemanticStaticPolicy):
    name = "semantic-adaptive"

    def __init__(self, clock=time.monotonic) -> None:
        super().__init__(clock)
        self._removed: dict[int, tuple[float, str, float]] = {}  # key -> (when, type, size)
        self.regrets = 0

    def _bump(self, kind: str, by: float) -> None:
        self.weights[kind] = min(W_MAX, max(W_MIN, self.weights[kind] + by))

    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None:
        now = self.clock()
        gone = self._removed.pop(key, None)
        if gone is not None and now - gone[0] < HORIZON_S:  # needed again soon after we let it go
            self.regrets += 1
            self._bump(gone[1], 0.18 + min(0.12, gone[2] / 1000))
        super().on_insert(key, label, nbytes)

    def on_hit(self, key: int) -> None:
        b = self._blocks.get(key)
        if b is not None:
            b.hits += 1
            self._bump(b.type, 0.01 + min(0.04, b.size / 4000))

    def on_remove(self, key: int) -> None:
        b = self._blocks.pop(key, None)
        if b is not None:
            self._removed[key] = (self.clock(), b.type, b.size)
            if len(self._removed) > 4 * max(len(self._blocks), 1024):  # forget the oldest removals
                for k in list(self._removed)[: len(self._removed) // 2]:
                    del self._removed[k]

    def score(self, b: _Block, now: float) -> float:
        saved = max(1.0, b.size)
        fresh = max(0.05, math.exp(-(now - b.born) / HORIZON_S))
        use = max(1.0, 1.0 + math.log1p(b.hits) + 0.25 * b.hits)
        return self.weights[b.type] * use * fresh * saved / max(1.0, b.size ** 0.15)

    def candidates(self) -> Iterator[int]:
        now = self.clock()
        for kind in {b.type for b in self._blocks.values() if b.hits == 0 and now - b.born > HORIZON_S}:
            self.weights[kind] = max(W_MIN, self.weights[kind] * 0.995)
        return super().candidates()
