"""What decided the numbers: the storage, the load generator's queue, or the users' pace.

A benchmark whose queue is saturated measures its own queue: request latencies grow with the backlog
while the storage's per-block latencies stay flat. The verdict compares what was offered with what was
served and the time requests spent waiting for a worker with the time they spent in storage.
"""

from __future__ import annotations

QUEUE_OVER_STORAGE = 1.0  # queue wait p50 above the storage time per request p50: the queue dominates
OFFERED_OVER_SERVED = 1.1  # offered load 10 % above the served rate: a backlog grew
IDLE_WORKERS = 0.5         # fewer than half the workers busy on average: the users' pace limits the load


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def load_verdict(offered: int, served: int, window_s: float, queue_p50_ms: float | None,
                 storage_p50_ms: float | None, workers: int, rows: list[dict]) -> dict | None:
    """{kind: storage | queue | users, the rates and waits it rests on, advice}; None without a request."""
    if not served or window_s <= 0:
        return None
    offered_s, served_s = offered / window_s, served / window_s
    busy = _mean(rows, "in_flight")
    busy = None if busy is None else min(busy, workers)
    q, st = queue_p50_ms or 0.0, storage_p50_ms or 0.0
    out = {"offered_per_s": offered_s, "served_per_s": served_s, "queue_wait_p50_ms": queue_p50_ms,
           "storage_p50_ms": storage_p50_ms, "workers": workers, "workers_busy_mean": busy}
    if offered_s > OFFERED_OVER_SERVED * served_s or (st and q > QUEUE_OVER_STORAGE * st):
        return {**out, "kind": "queue",
                "advice": f"requests waited longer for one of the {workers} workers than they spent in storage: "
                          f"the numbers describe the load generator's queue; raise --workers or lower the load "
                          f"(--users, --request-rate, --trace-speedup)"}
    if busy is not None and busy < IDLE_WORKERS * workers:
        return {**out, "kind": "users",
                "advice": f"on average {busy:.1f} of {workers} workers were busy: the users' think time or the "
                          f"arrival rate set the load, not the storage; raise --users (or --request-rate, "
                          f"--trace-speedup) to load it"}
    return {**out, "kind": "storage",
            "advice": "workers were busy with block I/O and requests did not wait long for them: the numbers "
                      "are the storage's"}
