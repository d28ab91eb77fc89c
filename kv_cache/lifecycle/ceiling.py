"""The run's own ceiling: the prompt tokens an infinite cache would have served the requests this process ran.

Each request, as it starts, looks its plan up (KVPlan.lookup: prefix groups up to their first miss, independent
chunks each alone) against every block that any request of this process planned before it, then adds its own. The
real cache only ever holds blocks that such earlier requests wrote, so what it serves can never exceed this: a
ceiling that holds, measured on exactly the requests the achieved hit rate counts (the pre-run analysis is an
estimate from a sample of the traffic: a semantic run beat it, 7.9 % against 7.3 %). With --shared-storage other
processes' blocks are served too; this ceiling is this process's own.

Bounded: past MAX_BLOCKS distinct blocks (found as its keys merge, every MERGE_AT added) it stops, and the requests
after that are counted as untracked: the ceiling is then not reported ("-"). The pre-run analysis stops its sample
there too.
"""

from __future__ import annotations

import threading

import numpy as np

from kv_cache.lifecycle.plan import KVPlan
from kv_cache.types import Request

# NOTE: the keys are kept sorted in a numpy array, 8 bytes each, and 8 more while a merge copies them; a Python set
# of ints took about 100 (its bound was 500,000 blocks, which a run of 4-token blocks passed in a few hundred
# requests), and the pre-run analysis's, unbounded, took 1.3 GiB over 5,000 synthetic users' samples.
MAX_BLOCKS = 2_000_000  # distinct blocks tracked at most (checked at each merge: up to MERGE_AT more)
MERGE_AT = 1 << 16      # keys added since the last merge, in a Python set (about 100 B each), before the next
CEILING_BYTES = (MAX_BLOCKS + MERGE_AT) * 16 + MERGE_AT * 100  # a ceiling at most: in the budget's fixed allowance


class KeySet:
    """A set of 64-bit block keys that only grows: the keys merged so far, sorted, and a Python set of those added
    since (merged when it holds merge_at, and when the exact count is asked)."""

    def __init__(self, merge_at: int = MERGE_AT):
        self._sorted = np.empty(0, np.uint64)
        self._recent: set[int] = set()
        self._merge_at = merge_at

    def __len__(self) -> int:
        self._merge()
        return self._sorted.size

    def __contains__(self, key: int) -> bool:
        if key in self._recent:
            return True
        keys = self._sorted
        i = int(keys.searchsorted(np.uint64(key)))
        return i < keys.size and int(keys[i]) == key

    def update(self, keys) -> bool:
        """Add keys; True when that merged them (len() is then exact without another merge)."""
        self._recent.update(keys)
        if len(self._recent) < self._merge_at:
            return False
        self._merge()
        return True

    def _merge(self) -> None:
        if not self._recent:
            return
        new = np.fromiter(self._recent, np.uint64, len(self._recent))
        new.sort()  # sorted, the searches below walk the array once
        keys, self._recent = self._sorted, set()
        at = keys.searchsorted(new)
        if keys.size:  # those merged before (added again since) are not added twice
            fresh = keys[np.minimum(at, keys.size - 1)] != new
            new, at = new[fresh], at[fresh]
        self._sorted = np.insert(keys, at, new)


class Ceiling:
    """A cache that never evicts and where every write has finished: the run's own (here) and the pre-run
    analysis's (analysis.py), each bounded by max_blocks distinct blocks."""

    def __init__(self, max_blocks: int = MAX_BLOCKS):
        self._seen = KeySet(min(MERGE_AT, max_blocks))
        self._lock = threading.Lock()
        self._max = max_blocks
        self.full = False

    def hits(self, plan: KVPlan) -> list[int] | None:
        """The plan's prompt blocks that any plan before it named (then its own are added); None once the bound was
        passed."""
        with self._lock:
            if self.full:
                return None
            # NOTE: monotone: a chained key is here only with its parent (every plan adds all its keys, nothing
            # leaves), so a prefix's first miss is bisected: per block, this lookup was a quarter of the analysis
            hits = plan.lookup(self._seen.__contains__, monotone=True)
            # one prefix group: its hits are its first keys, here already; adding them again was a tenth of the analysis
            # NOTE: the bound is checked as the keys merge (a merge a call near it, where a plan's keys re-added
            # since the last merge counted twice, took a 16 MB copy a request)
            merged = self._seen.update(plan.keys[len(hits):] if len(plan.groups) == 1 else plan.keys)
            if merged and len(self._seen) > self._max:
                self.full, self._seen = True, KeySet()
        return hits

    def tokens(self, req: Request, plan: KVPlan) -> int | None:
        """The prompt tokens of req an infinite cache would serve; None once the bound was passed."""
        hits = self.hits(plan)
        if hits is None:
            return None
        return sum(plan.hit_tokens(req, hits)[1].values()) if hits else 0
