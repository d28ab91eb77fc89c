"""Open loop: requests at the times a pacer gives, whatever the service does (runner.py has the worker pool, the
window and the drain)."""

from __future__ import annotations

from collections import deque

from kv_cache.errors import RunFault
from kv_cache.scheduler.runner import Runner


class OpenLoopRunner(Runner):
    """Requests at the times a pacer gives, whatever the service does."""

    def __init__(self, arrivals, *args, **kw):
        super().__init__(*args, **kw)
        self.arrivals = arrivals
        # NOTE: a turn's prompt holds the previous answer, so no server can start it before that answer
        # exists: a turn that arrives while its session's previous turn is queued or running waits here,
        # and its intended start becomes the later of its arrival and that answer (the wait is recorded).
        self._answering: set[int] = set()                    # sessions with a turn queued or running
        self._waiting: dict[int, deque] = {}                  # session -> turns held, in arrival order

    def _hold(self, req) -> bool:
        if req.session < 0:
            return False
        if req.session not in self._answering:
            self._answering.add(req.session)
            return False
        self._waiting.setdefault(req.session, deque()).append(req)
        self.outcome.held_for_turn += 1
        return True

    def _after(self, req, done_ns: int) -> None:
        held = self._waiting.get(req.session)
        if not held:
            self._answering.discard(req.session)
            return
        nxt = held.popleft()
        if not held:
            del self._waiting[req.session]
        self.recorder.turn_wait(nxt.intended_ns, done_ns - nxt.intended_ns)
        nxt.intended_ns = max(nxt.intended_ns, done_ns)
        self._queue.put(nxt)

    def _held(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def _next_arrival(self):
        """The next arrival (None: the end); a live source that lost its producer (RunFault) is a fault stop."""
        try:
            return next(self.arrivals, None)
        except RunFault as e:
            self._fail(str(e))
            return None

    def _dispatch(self, start: int, measure_at: int, deadline: int, max_requests: int) -> None:
        if hasattr(self.arrivals, "start"):  # a live source stamps its offsets from our start
            self.arrivals.start(start)
        nxt = self._next_arrival()
        while not self._stop.is_set():
            with self._cond:
                now = self.clock.now_ns()
                if self._stop_check(now, measure_at, deadline, max_requests, nxt is None):
                    return
                capped = max_requests and self.outcome.issued >= max_requests
                idle = nxt is not None and nxt[1] is None  # a live source with nothing new yet
                due = start + int(nxt[0] * 1e9) if nxt is not None else deadline
                if capped or nxt is None or due > now or idle:
                    self._wait(now, now if idle else deadline if capped or nxt is None else due, measure_at,
                               deadline)
                    if not idle:
                        continue
            if idle:
                nxt = self._next_arrival()
                continue
            req = nxt[1]()
            self._issue(req, due)
            nxt = self._next_arrival()
