"""Live progress: one refreshed line on a terminal, a plain line every 10 s otherwise.

Shows elapsed / total, requests done, GB/s read and written in the last interval (all tiers of
the device under test: the bottom tier), the last second's p95 of that tier's reads, and the
token hit rate so far. Reads counters only (never merges histograms), so it costs nothing.
"""

from __future__ import annotations

import math
import shutil
import sys
import time

from kv_cache import counters as C
from kv_cache.report.table import WIDTH


class LiveLine:
    """Called by the scheduler's dispatcher whenever it wakes; prints at most once a second."""

    def __init__(self, recorder, total_s: float, tier: str, stream=None, refresh: bool = True):
        """refresh=False: plain lines even on a terminal (under mpirun a rank's terminal is a pty whose output the
        launcher forwards line by line: refreshed '\r' updates would arrive as one ever longer line)."""
        self.recorder, self.total_s, self.tier = recorder, total_s, tier
        self.stream = stream or sys.stdout
        self.tty = refresh and self.stream.isatty()
        self.every_s = 1.0 if self.tty else 10.0
        self.t0: float | None = None  # the load phase's start: the dispatcher's first tick, not the set-up's
        self.next = math.inf  # the first line is due every_s after the clock starts
        self.last = (0.0, 0, 0)

    def __call__(self, completed: int, draining: bool = False) -> None:
        now = time.monotonic()
        c = self.recorder.counters()
        read, written = c.get(C.BYTES(self.tier, "read"), 0), c.get(C.BYTES(self.tier, "write"), 0)
        if self.t0 is None:  # the clock starts here: the analysis and preconditioning before it are not the run's
            self.t0, self.last = now, (now, read, written)
            if self.next == math.inf:
                self.next = now + self.every_s
        if now < self.next:
            return
        self.next = now + self.every_s
        t_prev, r_prev, w_prev = self.last
        dt = max(now - t_prev, 1e-9)
        self.last = (now, read, written)
        hit = c.get(C.TOKENS_CACHED, 0) / c[C.TOKENS_PROMPT] if c.get(C.TOKENS_PROMPT) else 0.0
        p95 = self.recorder.recent_percentile(self.tier, "read", 95.0)
        phase = "draining" if draining else "measuring" if self.recorder.measure_start_ns else "warm-up"
        rd, wr, lat = (read - r_prev) / dt / 1e9, (written - w_prev) / dt / 1e9, "-" if p95 is None else f"{p95:.1f}"
        elapsed = f"{now - self.t0:4.0f}" if self.tty else f"{now - self.t0:.0f}"  # a log's lines are not redrawn
        text = (f"[{phase} {elapsed}/{self.total_s:.0f} s] {completed:,} requests, {self.tier} read "
                f"{rd:.2f} / write {wr:.2f} GB/s, read p95 {lat} ms, hit {hit:.1%}")
        width = self.columns() if self.tty else WIDTH - 2  # a logged line: 100 columns with its indent
        if len(text) > width:  # the short form, then cut: a line that wraps is redrawn badly by '\r'
            text = (f"[{phase[:4]} {now - self.t0:.0f}/{self.total_s:.0f}s] {completed:,} requests {self.tier} "
                    f"r {rd:.2f} w {wr:.2f} GB/s p95 {lat} ms hit {hit:.0%}")[:width]
        if self.tty:
            self.stream.write("\r" + text.ljust(width))
        else:
            self.stream.write("  " + text + "\n")
        self.stream.flush()

    @staticmethod
    def columns() -> int:
        """The terminal's width less one (a line filling the last column wraps on some terminals), 100 at most."""
        return min(shutil.get_terminal_size((100, 24)).columns, 101) - 1

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
