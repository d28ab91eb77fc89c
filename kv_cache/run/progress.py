"""The dispatcher's tick during a run: the time series' gauges, telemetry, and the live line. Part of the
composition root (run/)."""

from __future__ import annotations

import time

from kv_cache.cache.cache import BlockCache
from kv_cache.config import Settings
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.telemetry import Telemetry
from kv_cache.report.live import LiveLine
from kv_cache.run.distributed import launched_by_mpi
from kv_cache.run.stack import RunContext
from kv_cache.scheduler.openloop import OpenLoopRunner
from kv_cache.scheduler.runner import ClosedLoopRunner


class Progress:
    """The dispatcher's tick: sample the gauges of the time series (and telemetry), and draw the live line."""

    def __init__(self, s: Settings, recorder: Recorder, cache: BlockCache, b: RunContext, quiet: bool,
                 tele: Telemetry | None):
        self.recorder, self.cache, self.tele = recorder, cache, tele
        # a decode node's storage under test is the handoff it loads from (its own tiers take only decode blocks)
        shown = "handoff" if s.disagg.role == "decode" else b.tiers[-1].name
        self.live = None if quiet else LiveLine(recorder, s.run.warmup_s + s.run.duration_s, shown,
                                                refresh=not launched_by_mpi())
        self.slots = [(t.name, t.slot_bytes) for t in b.tiers]

    def __call__(self, runner: ClosedLoopRunner | OpenLoopRunner) -> None:
        levels = runner.levels()
        levels.update({f"{name}_used_bytes": used * size for (name, size), used in zip(self.slots, self.cache.used)})
        now = time.monotonic_ns()
        self.recorder.gauge(levels, now)
        row = self.tele.sample(self.recorder.measure_start_ns is not None) if self.tele is not None else None
        if row:
            self.recorder.gauge(row, now)
        if self.live is not None:
            self.live(runner.outcome.completed, runner.draining)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
