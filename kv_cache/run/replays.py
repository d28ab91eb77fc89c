"""The capacity curve's replays (cache/simulate.py) at several capacities, each independent of the others: one
after another in this process for a small log, side by side in child processes for a large one.

A replay runs the whole log through a cache on accounting tiers, about 85 us an access on one core: the README's
Mooncake analysis (290,000 accesses at 7 capacities) spent 73 of its 104 s in them, one core busy of two. Each
replay is deterministic and the children send back only its four numbers, so the curve is the same whichever way it
was computed; only the wall time differs.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from kv_cache.cache.simulate import Replayed, replay
from kv_cache.hostmemory import available_bytes
from kv_cache.tiers.catalog import accounting_stack

SIDE_BY_SIDE_ACCESSES = 500_000  # replays' accesses in all below which one process does them (a child's start and
# its copy of the log cost about a second: the tests' logs and a short run's stay in this process)
# A child's memory, with room: its interpreter with numpy and this package and its copy of the log took 66 MiB, 107
# at the end of its largest replay (`ps`, the README's Mooncake log of 290,000 accesses); per access, the bound
# run/budget.ACCESS_LOG_BYTES gives a log and the curve computed from it
CHILD_BYTES = 160 << 20
CHILD_BYTES_PER_ACCESS = 420
# The children's deadline: all the replays one after another at 1 ms an access (about 12x the 85 us measured on one
# core), and a minute for their start; past it they are stopped and this process replays
DEADLINE_S, DEADLINE_S_PER_ACCESS = 60.0, 1e-3


def replay_at(log: dict, meta: dict, slots: int, policy: type) -> Replayed:
    """The cache replayed with a bottom tier of slots under the run's tiers above it."""
    slot, bottom = meta["slot_bytes"], meta["tiers"][-1][0]
    tiers = accounting_stack([*[(name, cap) for name, cap in meta["tiers"][:-1]], (bottom, slots * slot)], slot)
    if not tiers:  # no tier holds a block: nothing is cached
        return Replayed(0.0, 0.0, 0, 0)
    return replay(log, tiers, policy, tuple(meta["window_ns"]), bottom)


def side_by_side(accesses: int, replays: int) -> int:
    """How many child processes replay at once (1: this process alone): the cores, at most one a replay, as many as
    the memory free now holds; one below SIDE_BY_SIDE_ACCESSES of work."""
    if replays < 2 or accesses * replays < SIDE_BY_SIDE_ACCESSES:
        return 1
    each = CHILD_BYTES + accesses * CHILD_BYTES_PER_ACCESS
    return max(1, min(replays, os.cpu_count() or 1, available_bytes() // each))


def replay_many(log: dict, meta: dict, slots: list[int], policy: type) -> list[Replayed]:
    """replay_at at each of slots, in their order. Side by side where side_by_side says so (how many never changes
    a figure); where no child can start, one dies (killed for memory) or they pass their deadline, the replays are
    done here one after another."""
    pool = _pool(side_by_side(len(log["keys"]), len(slots)), log, meta, policy)
    if pool is not None:
        deadline = DEADLINE_S + len(log["keys"]) * len(slots) * DEADLINE_S_PER_ACCESS
        try:
            return list(pool.map(_replay_held, [int(x) for x in slots], timeout=deadline))
        except BaseException as e:  # the children stop now, not once their replays are done
            _stop(pool)
            if not isinstance(e, (BrokenProcessPool, OSError)):  # interrupted where nothing defers it (a child
                raise  # killed, past the deadline: TimeoutError, or none started: this process replays)
        finally:
            pool.shutdown(cancel_futures=True)
    return [replay_at(log, meta, int(x), policy) for x in slots]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Its children ended now (shutdown would wait for a replay under way)."""
    for child in list((getattr(pool, "_processes", None) or {}).values()):  # private, present since Python 3.2
        child.terminate()


def _pool(n: int, log: dict, meta: dict, policy: type) -> ProcessPoolExecutor | None:
    """n children, spawned, not forked: the run's threads (telemetry, a signal watch) may hold locks a fork would
    copy. None for one, or where none can be made (no /dev/shm for its semaphores: this process replays)."""
    if n < 2:
        return None
    try:
        return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"), initializer=_hold,
                                   initargs=(log, meta, policy))
    except OSError:
        return None


_HELD: tuple = ()  # a child's (log, meta, policy): sent once a child, not once a replay


def _hold(log: dict, meta: dict, policy: type) -> None:
    """A child's start: what it replays kept; a terminal's Ctrl-C or hang-up (sent to the whole process group) left
    to the parent, which finishes the run's results first (signals.deferred) and stops its children; SIGTERM (the
    parent's terminate) ending it, not the handler the entry point's re-import installed (signals.install)."""
    global _HELD
    _HELD = (log, meta, policy)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _replay_held(slots: int) -> Replayed:
    log, meta, policy = _HELD
    return replay_at(log, meta, slots, policy)
