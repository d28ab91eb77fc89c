"""What an autoscaler step saw complete: the Recorder opens and closes one per step (open_step, close_step)."""

from __future__ import annotations

import threading
from collections import defaultdict

from kv_cache.recorder.histogram import new_histogram, record
from kv_cache.types import RequestOutcome


class StepMeter:
    """What completed during one autoscaler step: counts and per-class latency histograms."""

    def __init__(self, start_ns: int):
        self.start_ns, self.end_ns = start_ns, 0
        self.completed = self.prompt_tokens = self.generated_tokens = 0
        self.ttft: dict[str, object] = defaultdict(new_histogram)
        self.e2e: dict[str, object] = defaultdict(new_histogram)
        self._lock = threading.Lock()

    def add(self, qos: str, ttft_ns: int, e2e_ns: int, outcome: RequestOutcome) -> None:
        with self._lock:
            self.completed += 1
            self.prompt_tokens += outcome.prompt_tokens
            self.generated_tokens += outcome.generated_tokens
            record(self.ttft[qos], ttft_ns)
            record(self.e2e[qos], e2e_ns)

    @property
    def seconds(self) -> float:
        return max(self.end_ns - self.start_ns, 1) / 1e9
