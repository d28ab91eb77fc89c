"""The run's own ceiling: the prompt tokens an infinite cache would have served the requests this process ran.

Each request, as it starts, looks its plan up (KVPlan.lookup: prefix groups up to their first miss, independent
chunks each alone) against every block that any request of this process planned before it, then adds its own. The
real cache only ever holds blocks that such earlier requests wrote, so what it serves can never exceed this: a
ceiling that holds, measured on exactly the requests the achieved hit rate counts (the pre-run analysis is an
estimate from a sample of the traffic: a semantic run beat it, 7.9 % against 7.3 %). With --shared-storage other
processes' blocks are served too; this ceiling is this process's own.

Bounded: past MAX_BLOCKS distinct blocks (about 100 B each in a Python set) it stops, and the requests after that
are counted as untracked: the ceiling is then not reported ("-").
"""

from __future__ import annotations

import threading

from kv_cache.lifecycle.plan import KVPlan
from kv_cache.types import Request

MAX_BLOCKS = 500_000  # distinct blocks tracked at most (~50 MB, within the memory budget's fixed allowance)


class Ceiling:
    """A cache that never evicts and where every write has finished: the run's own (here) and the pre-run
    analysis's (analysis.py, bounded by the requests it reads)."""

    def __init__(self, max_blocks: int = MAX_BLOCKS):
        self._seen: set[int] = set()
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
            self._seen.update(plan.keys[len(hits):] if len(plan.groups) == 1 else plan.keys)
            if len(self._seen) > self._max:
                self.full, self._seen = True, set()
        return hits

    def tokens(self, req: Request, plan: KVPlan) -> int | None:
        """The prompt tokens of req an infinite cache would serve; None once the bound was passed."""
        hits = self.hits(plan)
        if hits is None:
            return None
        return sum(plan.hit_tokens(req, hits)[1].values()) if hits else 0
