"""session: a conversation stays on the engine that served its first request (session affinity, as Dynamo's and
llm-d's sticky routing); a new conversation goes to the least-loaded engine."""

from __future__ import annotations

from kv_cache.fleet.routers.base import InFlight, Router


class Session(Router):
    name = "session"
    needs_conversations = True
    description = "a conversation stays on its first engine; new ones go to the least loaded"

    def __init__(self, engines: int, slack: float):
        super().__init__(engines, slack)
        self._home: dict[int, int] = {}

    def pick(self, request, engines, load: InFlight) -> int:
        home = self._home.get(request.conversation)
        if home is None:
            home = self._home[request.conversation] = load.least_loaded()
        return home


ROUTER = Session
