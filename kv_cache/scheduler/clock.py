"""The dispatcher's clock, injectable: what "now" is and how the dispatcher waits for its next due time.

``Clock`` is the real one (the monotonic clock, a condition's timed wait). ``SkipIdleClock`` skips the time in
which nothing can happen: when no request is in flight, a wait for the next due time (a think time, an arrival, the
window's opening or end) returns at once with that time passed, so a test of pacing, think times or the window
does not sleep through them; while requests are in flight it waits in real time (a completion, or a timer the
dispatcher set, wakes it), so what the dispatcher does under load is what it does in a run. Its "now" is the real
monotonic clock plus the time skipped: never behind the lifecycle's own clock (the drain's deadline stays honest).
For tests of the scheduler: a run's block latencies are timed on the real clock, whatever the dispatcher's.
"""

from __future__ import annotations

import threading
import time


class Clock:
    """Real time."""

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def wait(self, cond: threading.Condition, timeout_s: float, busy: bool) -> None:
        """Under cond's lock: wait for a notify or timeout_s; busy: requests are in flight (unused here)."""
        cond.wait(timeout=timeout_s)


class SkipIdleClock(Clock):
    """Real time, less the waits in which no request was in flight (see the module docstring)."""

    def __init__(self) -> None:
        self.skipped_ns = 0

    def now_ns(self) -> int:
        return time.monotonic_ns() + self.skipped_ns

    def wait(self, cond: threading.Condition, timeout_s: float, busy: bool) -> None:
        if busy:
            cond.wait(timeout=timeout_s)
        else:  # nothing in flight: no completion can come before the due time, which is now
            self.skipped_ns += int(timeout_s * 1e9)
