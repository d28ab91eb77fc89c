"""prefix: the engine holding the longest cached prefix of the request in its own tiers, among the engines whose
load stays within a bound (llm-d's prefix scorer weighed with its load scorer; SGLang's cache-aware router): an
engine is a candidate while its requests in flight are at most (1 + slack) x the fleet's mean + 1, so a hot prefix
cannot pile every request onto one engine. Ties, and a request no engine holds any of: the least loaded."""

from __future__ import annotations

from kv_cache.fleet.routers.base import Router, least_loaded, loads


class Prefix(Router):
    name = "prefix"
    description = "the longest cached prefix among engines within the load bound"

    def pick(self, request, engines, now: float) -> int:
        load = loads(engines, now)
        bound = (1 + self.slack) * sum(load) / self.n + 1
        candidates = [i for i in range(self.n) if load[i] <= bound]
        first, end, _ = request.groups[0] if request.groups else (0, 0, False)
        best, chosen = 0, []
        for i in candidates:
            n = engines[i].cached_prefix(request.keys[first:end], end - first)
            if n > best:
                best, chosen = n, [i]
            elif n == best and n:
                chosen.append(i)
        return least_loaded(engines, chosen or candidates, load)


ROUTER = Prefix
