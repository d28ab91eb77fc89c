"""What decided the numbers: the storage, the load generator's queue, or the users' pace; and for a queue, whether
its workers were busy in storage (a storage result at that concurrency) or the generator ran out of CPU.

A benchmark whose queue is saturated measures its own queue: request latencies grow with the backlog
while the storage's per-block latencies stay flat. The verdict compares what was offered with what was
served and the time requests spent waiting for a worker with the time they spent in storage.
"""

from __future__ import annotations

QUEUE_OVER_STORAGE = 1.0  # queue wait above the storage time per request (p50, or p95): the queue dominates
OFFERED_OVER_SERVED = 1.1  # offered load 10 % above the served rate: a backlog grew
DROPPED_OVER_SERVED = 0.1  # a backlog of a tenth of the window's requests left queued at the stop
P95_SAMPLES = 20  # the requests a p95 needs to be more than the largest (the tables print '-' below)
IDLE_WORKERS = 0.5         # fewer than half the workers busy on average: the users' pace limits the load
CPU_BOUND = 0.85           # the process used this share of every core's time: the generator ran out of CPU
STORAGE_BUSY = 0.6         # the workers spent this share of their time in block I/O: the storage set the pace


# What raises the load a run offers, by its arrival (workload.arrival): one source for the verdict's advice and the
# console's warnings. A sequence keeps one request in flight, whatever the flags.
LOAD_KNOB = {"closed": "raise --users", "trace": "raise --trace-speedup", "poisson": "raise --request-rate",
             "handoff": "load the prefill nodes harder (their --users)"}
PACE = {"closed": "the users' pace", "trace": "the trace's timestamps", "poisson": "the arrival rate",
        "handoff": "the prefill nodes' pace", "sequence": "one request at a time"}


def workers_said(n: int) -> str:
    """'1 worker', '4 workers': a --null-io run has one by default."""
    return f"{n:,} worker{'' if n == 1 else 's'}"


def load_knob(arrival: str) -> str:
    """How to offer more load under this arrival, said as an instruction."""
    return LOAD_KNOB.get(arrival, "use --arrival closed or poisson (a sequence keeps one request in flight)")


def pace(arrival: str) -> str:
    """What sets the load a run offers under this arrival (the console's 'bound by ...')."""
    return PACE.get(arrival, f"the {arrival} arrivals")


def arrival_of(results) -> str:
    """A Results' arrival: a decode node's is 'handoff' (its load is what its prefill nodes hand over)."""
    decode = results.role is not None and results.role.role == "decode"
    return "handoff" if decode else results.workload.arrival


def null_bottom(results) -> bool:
    """A Results' storage is a null tier (--null-io): its operations move no byte, their time is the generator's."""
    tier = results.run.tiers.get(results.bottom)
    return tier is not None and tier.null


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def _shares(storage_ms: dict, served: int, workers: int, window_s: float, cpu_s: float | None,
            cores: int | None) -> tuple[float | None, float | None]:
    """(share of the workers' time spent in block I/O, share of the cores' time the process used): what tells a
    queue of storage (workers busy in I/O) from a queue of the generator (its CPU ran out)."""
    mean = storage_ms.get("mean")
    busy = None if mean is None else min(1.0, mean * served / 1e3 / (workers * window_s))
    cpu = None if cpu_s is None or not cores else min(1.0, cpu_s / (window_s * cores))
    return busy, cpu


def _cause(busy: float | None, cpu: float | None, cores: int | None, workers: int, null: bool) -> tuple[str, str]:
    """Why requests queued: (cause, its sentence). storage: the workers were busy in block I/O, so the figures are
    the storage's at that concurrency; cpu: the process used (nearly) every core; generator: neither, or the
    storage is a null tier (its operations move no byte: their time is the generator's own)."""
    if busy is None and cpu is None:
        return "", ("the numbers describe the load generator's queue; raise --workers or lower the load (--users, "
                    "--request-rate, --trace-speedup)")
    in_io = "-" if busy is None else f"{busy:.0%}"
    used = "-" if cpu is None else f"{cpu:.0%} of {cores} cores' time"
    if cpu is not None and cpu >= CPU_BOUND:
        return "cpu", (f"the generator ran out of CPU (it used {used}; its workers spent {in_io} of their time in "
                       f"block I/O): the figures describe this machine's CPU, not the storage; use more cores or "
                       f"offer less load")
    if busy is not None and busy >= STORAGE_BUSY and null:
        return "generator", (f"the workers spent {in_io} of their time in the null tier's operations, which move no "
                             f"byte (the process used {used}): the generator's own per-block work (the cache's "
                             f"bookkeeping and its lock), not a storage's")
    if busy is not None and busy >= STORAGE_BUSY:
        return "storage", (f"the workers spent {in_io} of their time in block I/O (the process used {used}): a "
                           f"storage result at the concurrency of {workers_said(workers)}; --workers N offers more")
    return "generator", (f"the workers spent {in_io} of their time in block I/O and the process used {used}: the "
                         f"rest went to the generator's own work (payloads, checksums, bookkeeping) or to waits")


def load_verdict(requests: dict, window_s: float, queue_ms: dict, storage_ms: dict, workers: int,
                 rows: list[dict], arrival: str = "closed", cpu_s: float | None = None,
                 cores: int | None = None, null: bool = False) -> dict | None:
    """{kind: storage | queue | users, cause, the rates, waits, shares and backlog it rests on, advice}; None without
    a request. requests: the Results' request counts; queue_ms / storage_ms: the per-request latency summaries;
    cpu_s: the process's CPU seconds in the window, over cores (None where not one process's: an MPI merge); null:
    the storage is a null tier (--null-io: no byte moves)."""
    offered, served, dropped = requests["issued_in_window"], requests["completed"], requests.get("dropped_at_stop", 0)
    if not served or window_s <= 0:
        return None
    offered_s, served_s = offered / window_s, served / window_s
    busy = _mean(rows, "in_flight")
    busy = None if busy is None else min(busy, workers)
    q50, q95, st50, st95 = (queue_ms.get("p50"), queue_ms.get("p95"), storage_ms.get("p50"), storage_ms.get("p95"))
    if queue_ms.get("count", P95_SAMPLES) < P95_SAMPLES:  # a p95 of fewer requests is their max: not judged
        q95 = st95 = None
    in_io, cpu = _shares(storage_ms, served, workers, window_s, cpu_s, cores)
    cause, said = _cause(in_io, cpu, cores, workers, null)
    out = {"offered_per_s": offered_s, "served_per_s": served_s, "queue_wait_p50_ms": q50, "queue_wait_p95_ms": q95,
           "storage_p50_ms": st50, "dropped_at_stop": dropped, "workers": workers, "workers_busy_mean": busy,
           "workers_in_io_share": in_io, "process_cpu_share": cpu, "cause": cause}
    waited = [f"queue wait {p} {q:.1f} ms > storage time {p} {st:.1f} ms per request"
              for p, q, st in (("p50", q50, st50), ("p95", q95, st95))
              if q is not None and st and q > QUEUE_OVER_STORAGE * st]
    backlog = dropped > DROPPED_OVER_SERVED * served
    if offered_s > OFFERED_OVER_SERVED * served_s or waited or backlog:
        why = "; ".join(waited + ([f"{dropped:,} requests still queued at the stop"] if backlog else [])
                        + ([f"offered {offered_s:.2f} req/s > served {served_s:.2f}"]
                           if offered_s > OFFERED_OVER_SERVED * served_s else []))
        waited_for = "the one worker" if workers == 1 else f"one of the {workers} workers"
        return {**out, "kind": "queue", "advice": f"requests waited for {waited_for} ({why}); {said}"}
    if busy is not None and busy < IDLE_WORKERS * workers:
        # a decode node's requests are what prefill nodes hand over: their pace is its load
        not_this = (" (a decode node loads what they hand over), not this node's transfer or storage"
                    if arrival == "handoff" else ", not the storage")
        return {**out, "kind": "users",
                "advice": f"on average {busy:.1f} of {workers_said(workers)} {'was' if workers == 1 else 'were'} busy: "
                          f"{pace(arrival)} set the load{not_this}; {load_knob(arrival)} to load it"}
    backlog_note = (f"{dropped:,} left queued at the stop, under a tenth of the {served:,} served" if dropped else
                    "none left queued at the stop")
    held = requests.get("users_waiting_at_stop", 0)
    held_note = (f"; {held:,} users still waited to start (--admission paced): the storage served no more"
                 if held else "")
    return {**out, "kind": "storage",
            "advice": f"workers were busy with block I/O and requests waited less for a worker than they spent in "
                      f"storage (p50 and p95), {backlog_note}{held_note}: the numbers are "
                      + ("the generator's own per-block work (a null tier moves no byte)" if null else
                         "the storage's")}
