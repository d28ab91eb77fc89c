"""round-robin: engine after engine, blind to the cache and the load (the baseline every router is held against)."""

from __future__ import annotations

from kv_cache.fleet.routers.base import Router


class RoundRobin(Router):
    name = "round-robin"
    description = "engine after engine, blind to cache and load"

    def __init__(self, engines: int, slack: float):
        super().__init__(engines, slack)
        self._next = 0

    def pick(self, request, engines, load) -> int:
        i = self._next
        self._next = (i + 1) % self.n
        return i


ROUTER = RoundRobin
