"""What the routers share: the fleet's load (each engine's requests in flight, modelled), and the least-loaded
choice among candidates (ties: fewer requests so far, then the lowest index, so a seeded run routes the same way
every time)."""

from __future__ import annotations

import heapq

import numpy as np

_SERVED_BITS = 40  # a tie on load goes to fewer requests served: one key, load above, served below (< 2**40)


class InFlight:
    """Each engine's requests in flight at the latest arrival (their modelled ends), kept up as arrivals come in
    time order: one heap of (end, engine) for the fleet, a count per engine, and what each served so far. A load-
    aware router reads it without visiting every engine (1,000 engines: the scan was most of a request's cost)."""

    def __init__(self, engines: int):
        self.count = np.zeros(engines, np.int64)
        self.served = np.zeros(engines, np.int64)
        self.total = 0
        self._ends: list[tuple[float, int]] = []

    def at(self, now: float) -> None:
        """What ended by now leaves for good (arrivals come in time order)."""
        ends, count = self._ends, self.count
        while ends and ends[0][0] <= now:
            count[heapq.heappop(ends)[1]] -= 1
            self.total -= 1

    def start(self, engine: int, end: float) -> None:
        heapq.heappush(self._ends, (end, engine))
        self.count[engine] += 1
        self.served[engine] += 1
        self.total += 1

    def least_loaded(self, candidates: list[int] | None = None) -> int:
        """The fewest in flight among candidates (ascending indices; None: every engine), then the fewest served,
        then the lowest index."""
        key = (self.count << _SERVED_BITS) | self.served
        if candidates is None:
            return int(np.argmin(key))
        return candidates[int(np.argmin(key[candidates]))]


class Router:
    name = "?"
    needs_conversations = False
    description = ""

    def __init__(self, engines: int, slack: float):
        self.n, self.slack = engines, slack

    def pick(self, request, engines, load: InFlight) -> int:
        """The engine for request; load: the fleet's requests in flight at its arrival."""
        raise NotImplementedError
