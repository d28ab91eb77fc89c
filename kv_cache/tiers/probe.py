"""How many threads does this device want? Step the concurrency until the bandwidth stops growing.

Before the clock (as preconditioning): k threads each write then read one block-sized object of the
storage tier again and again for a short step, at k = 1, 2, 4, ... up to a ceiling. The search stops
after ``patience`` steps in a row that add less than ``gain`` to the best bandwidth so far (one noisy
step does not end it); the answer is the smallest k within ``gain`` of the best. Nothing here enters
a statistic; the probe's objects are deleted before the run.
"""

from __future__ import annotations

import threading
import time

from kv_cache.buffers import aligned_buffer

PROBE_KEY = 1 << 63  # far above the run's keys (64-bit hashes are never this shape with low bits 0..k)


def _step(tier, bufs: list, seconds: float) -> float:
    """GB/s of len(bufs) threads, each writing and reading its own object for `seconds`."""
    moved = [0] * len(bufs)
    start = threading.Barrier(len(bufs) + 1)
    stop_at = [0.0]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        key, buf = PROBE_KEY + i, bufs[i]
        start.wait()
        try:
            while time.monotonic() < stop_at[0]:
                if tier.contains(key):
                    tier.delete(key)
                tier.put(key, buf)
                tier.get(key, buf)
                moved[i] += 2 * buf.size
        except BaseException as e:  # a device fault is the caller's to report, not a thread's traceback
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(bufs))]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    stop_at[0] = t0 + seconds
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    for i in range(len(bufs)):
        if tier.contains(PROBE_KEY + i):
            tier.delete(PROBE_KEY + i)
    if errors:
        raise errors[0]
    return sum(moved) / elapsed / 1e9


def concurrency(tier, nbytes: int, ceiling: int, seconds: float = 0.5, gain: float = 0.10, fill=None,
                patience: int = 2, step=_step) -> tuple[int, list[tuple[int, float]]]:
    """(threads chosen, [(threads, GB/s) per step]) for the tier at one object of nbytes per thread.

    step(tier, bufs, seconds) -> GB/s measures one step (the threads' real I/O; tests give a model of a device
    so that the search is checked without a clock)."""
    room = tier.num_slots // max(tier.slots_for(nbytes), 1)
    ceiling = max(1, min(ceiling, room))
    bufs: list = []  # made as the steps need them: a search that stops early never allocates the ceiling's
    counts, k = [], 1
    while k < ceiling:
        counts.append(k)
        k *= 2
    counts.append(ceiling)
    steps: list[tuple[int, float]] = []
    flat = 0
    for k in counts:
        best = max((g for _, g in steps), default=0.0)
        while len(bufs) < k:
            buf = aligned_buffer(nbytes)[:nbytes]
            if fill is not None:  # real payloads: a compressing device must not be flattered by zeros
                fill(PROBE_KEY + len(bufs), buf)
            bufs.append(buf)
        steps.append((k, step(tier, bufs[:k], seconds)))
        flat = flat + 1 if best and steps[-1][1] < best * (1 + gain) else 0
        if flat == patience:  # `patience` doublings in a row added less than `gain`: the device is saturated
            break
    top = max(g for _, g in steps)
    chosen = min(n for n, g in steps if g >= top / (1 + gain))
    return chosen, steps
