"""What the routers share: the least-loaded choice among candidates (ties: fewer requests so far, then the lowest
index, so a seeded run routes the same way every time)."""

from __future__ import annotations


def loads(engines, now: float) -> list[int]:
    """Each engine's requests in flight at now (read once a request: Engine.load drops what has ended)."""
    return [e.load(now) for e in engines]


def least_loaded(engines, candidates, load: list[int]) -> int:
    return min(candidates, key=lambda i: (load[i], engines[i].requests, i))


class Router:
    name = "?"
    needs_conversations = False
    description = ""

    def __init__(self, engines: int, slack: float):
        self.n, self.slack = engines, slack

    def pick(self, request, engines, now: float) -> int:
        raise NotImplementedError
