"""What the routers share: the least-loaded choice among candidates (ties: fewer requests so far, then the lowest
index, so a seeded run routes the same way every time)."""

from __future__ import annotations


def least_loaded(engines, candidates, now: float) -> int:
    return min(candidates, key=lambda i: (engines[i].load(now), engines[i].requests, i))


class Router:
    name = "?"
    needs_conversations = False
    description = ""

    def __init__(self, engines: int, slack: float):
        self.n, self.slack = engines, slack

    def pick(self, request, engines, now: float) -> int:
        raise NotImplementedError
