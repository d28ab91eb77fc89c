"""prefix: the engine holding the longest cached prefix of the request in its own tiers, among the engines whose
load stays within a bound (llm-d's prefix scorer weighed with its load scorer; SGLang's cache-aware router): an
engine is a candidate while its requests in flight are at most (1 + slack) x the fleet's mean + 1, so a hot prefix
cannot pile every request onto one engine. Ties, and a request no engine holds any of: the least loaded.

Which engines to ask: a prefix is counted from its first block, and a block reaches an engine's own tiers only when
the engine serves a request holding it, where a chain's first block is a group's first (its key names its whole
chain). So the router keeps, for each group's first key it routed, the engines it sent it to (llm-d's indexer keeps
which pods hold which block hashes): only those are asked how much they still hold (they may have evicted it), not
the whole fleet; one found to hold none of it any more is dropped from the entry until it serves it again. Memory:
one entry per distinct group start routed, with its engines.
"""

from __future__ import annotations

from kv_cache.fleet.routers.base import InFlight, Router


class Prefix(Router):
    name = "prefix"
    description = "the longest cached prefix among engines within the load bound"

    def __init__(self, engines: int, slack: float):
        super().__init__(engines, slack)
        self._sent: dict[int, set[int]] = {}  # a group's first key -> the engines a request holding it went to

    def pick(self, request, engines, load: InFlight) -> int:
        bound, count = (1 + self.slack) * load.total / self.n + 1, load.count
        first, end, _ = request.groups[0] if request.groups else (0, 0, False)
        sent = self._sent.get(request.keys[first]) if end > first else None
        best, chosen, gone = 0, [], []
        for i in sent or ():
            if count[i] > bound:
                continue
            n = engines[i].cached_prefix(request.keys[first:end], end - first)
            if n > best:
                best, chosen = n, [i]
            elif n == best and n:
                chosen.append(i)
            elif not n:
                gone.append(i)  # it evicted the chain's head: asked again only once it serves it again
        if gone:
            sent.difference_update(gone)
        pick = load.least_loaded(sorted(chosen) if chosen else None)  # the least loaded of all is within the bound
        for start, stop, _ in request.groups:
            if stop > start:
                self._sent.setdefault(request.keys[start], set()).add(pick)
        return pick


ROUTER = Prefix
