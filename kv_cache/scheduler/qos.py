"""QoS classes: which class a request belongs to, and the order workers take queued requests in.

A class is drawn per user (every request of a user shares it) or per request,
from a hash of (seed, user, request): the same seed gives the same classes in
every run and on every MPI rank, whatever the dispatch order. Priority only
matters when every worker is busy: the queue hands out the highest priority
first, then the earliest intended start.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import queue

from kv_cache.config import QOS_CLASSES, QosSettings, parse_mix


class QosPolicy:
    def __init__(self, qos: QosSettings, seed: int):
        weights = parse_mix(qos.mix, QOS_CLASSES, "--qos-mix")
        self.names = [n for n in QOS_CLASSES if weights.get(n, 0) > 0]
        self._cum = list(itertools.accumulate(weights[n] for n in self.names))
        self.per_request = qos.assign == "request"
        self.priority = {n: getattr(qos, n).priority for n in QOS_CLASSES}
        self.seed = seed

    def classify(self, user_id: int, seq: int) -> str:
        tag = f"{self.seed}/{user_id}/{seq if self.per_request else '-'}".encode()
        u = int.from_bytes(hashlib.blake2b(tag, digest_size=8).digest(), "little") / 2**64
        return self.names[min(bisect.bisect_right(self._cum, u * self._cum[-1]), len(self.names) - 1)]


class PriorityRequests:
    """The request queue: highest priority first, then earliest intended start; None (stop) last."""

    def __init__(self, priority: dict[str, int] | None):
        self._q: queue.PriorityQueue = queue.PriorityQueue()
        self._priority = priority or {}
        self._tie = itertools.count()

    def put(self, req) -> None:
        if req is None:
            self._q.put((float("inf"), 0, next(self._tie), None))
        else:
            self._q.put((-self._priority.get(req.qos, 0), req.intended_ns, next(self._tie), req))

    def get(self):
        return self._q.get()[-1]

    def get_nowait(self):
        return self._q.get_nowait()[-1]

    def qsize(self) -> int:
        return self._q.qsize()
