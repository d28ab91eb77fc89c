"""least-loaded: the engine with the fewest requests in flight (modelled service times), blind to the cache."""

from __future__ import annotations

from kv_cache.fleet.routers.base import InFlight, Router


class LeastLoaded(Router):
    name = "least-loaded"
    description = "the fewest requests in flight, blind to the cache"

    def pick(self, request, engines, load: InFlight) -> int:
        return load.least_loaded()


ROUTER = LeastLoaded
