"""The autoscaler: it changes how many closed-loop users are active, step by step, and watches what
the storage does.

Each step: set the user count, let it settle (cool-down, not measured), then
measure a window (the requests that complete in it: throughput, storage TTFT,
SLA attainment per QoS class, and the *offered* load, requests issued per
second). Then decide:

- ``capacity``: keep growing while a step raises throughput (prompt tokens/s)
  by at least ``min_gain``; stop after ``patience`` steps without gain. The
  peak step is the answer.
- ``qos``: grow while every class meets its SLAs; at the first failure,
  bisect between the last good and the first bad count (removing users on the
  way down) until they are ``resolution`` apart. The last good count is the
  answer (none if even the smallest count failed).

Both stop when the next count would exceed the pool (``--users``). Windows are
per step, never cumulative (MPLerf's capacity mode compared cumulative
averages, flaw 12).
"""

from __future__ import annotations

import dataclasses

from kv_cache.config import QOS_CLASSES, AutoscaleSettings, QosSettings
from kv_cache.recorder.slas import judge, overall


class Autoscaler:
    def __init__(self, cfg: AutoscaleSettings, qos: QosSettings, pool: int, recorder):
        self.cfg, self.pool, self.recorder = cfg, pool, recorder
        self.targets = {n: dataclasses.asdict(getattr(qos, n)) for n in QOS_CLASSES}
        self.goal = qos.attainment
        self.users = min(cfg.start_users, pool)
        self.curve: list[dict] = []
        self.next_ns = 0
        self._measuring = False
        self._issued0 = 0
        self._good: int | None = None
        self._bad: int | None = None
        self._no_gain = 0
        self.verdict = "stopped before the search ended (raise --duration)"

    # ------------------------------------------------------------------ runner hooks

    def start(self, runner, start_ns: int, measure_at_ns: int) -> None:
        runner.set_active(self.users, start_ns)
        self.next_ns = measure_at_ns + int(self.cfg.cooldown_s * 1e9)

    def __call__(self, runner, now: int) -> str | None:
        """Called by the dispatcher under its lock; a stop reason when the search is over."""
        if now < self.next_ns:
            return None
        if not self._measuring:
            self.recorder.open_step(now)
            self._issued0 = runner.outcome.issued
            self._measuring, self.next_ns = True, now + int(self.cfg.step_s * 1e9)
            return None
        step = self.recorder.close_step(now)
        self.curve.append(self._point(step, runner.outcome.issued - self._issued0))
        self._measuring = False
        nxt = self._decide(self.curve[-1])
        if nxt is None:
            return "autoscale_done"
        self.users = nxt
        runner.set_active(nxt, now)
        self.next_ns = now + int(self.cfg.cooldown_s * 1e9)
        return None

    # ------------------------------------------------------------------ one step

    def _point(self, step, issued: int) -> dict:
        classes = {n: judge(step.ttft[n], step.e2e[n], self.targets[n], self.goal)
                   for n in QOS_CLASSES if n in step.ttft}
        p95 = [c["ttft_ms"]["p95"] for c in classes.values() if c["ttft_ms"]["p95"] is not None]
        ok = sum(c["attainment"] * c["requests"] for c in classes.values() if c["requests"])
        return {"users": self.users, "window_s": step.seconds, "offered_per_s": issued / step.seconds,
                "requests_per_s": step.completed / step.seconds, "tokens_per_s": step.prompt_tokens / step.seconds,
                "generated_tokens_per_s": step.generated_tokens / step.seconds,
                "ttft_p95_ms": max(p95) if p95 else None,
                "attainment": ok / step.completed if step.completed else None,
                "sla_met": bool(overall(classes)) and step.completed > 0,
                "classes": {n: {"requests": c["requests"], "ttft_p95_ms": c["ttft_ms"]["p95"], "met": c["met"]}
                            for n, c in classes.items()}}

    def _grow(self, users: int) -> int:
        return users + self.cfg.step_users if self.cfg.growth == "add" else users * 2

    def _decide(self, point: dict) -> int | None:
        return self._decide_qos(point) if self.cfg.mode == "qos" else self._decide_capacity(point)

    def _decide_capacity(self, point: dict) -> int | None:
        best = self.best()
        if best is point:
            self._no_gain = 0
        else:
            self._no_gain += 1
            if self._no_gain >= self.cfg.patience:
                self.verdict = f"throughput did not grow by {self.cfg.min_gain:.0%} in {self._no_gain} steps"
                return None
        return self._next_or_stop(self._grow(point["users"]))

    def _decide_qos(self, point: dict) -> int | None:
        if point["sla_met"]:
            self._good = max(self._good or 0, point["users"])
        else:
            self._bad = min(self._bad or point["users"], point["users"])
        if self._bad is None:
            return self._next_or_stop(self._grow(point["users"]))
        low = self._good or 0
        if self._bad - low <= self.cfg.resolution:
            self.verdict = (f"SLAs hold up to {self._good} users and fail at {self._bad}" if self._good else
                            f"SLAs fail already at {self._bad} users")
            return None
        return max(1, (low + self._bad) // 2)

    def _next_or_stop(self, users: int) -> int | None:
        if users > self.pool:
            self.verdict = f"the pool of {self.pool} users is exhausted (raise --users to search further)"
            return None
        return users

    # ------------------------------------------------------------------ the answer

    def best(self) -> dict | None:
        """capacity: the first step within min_gain of the peak throughput; qos: the largest passing step."""
        if self.cfg.mode == "qos":
            good = [p for p in self.curve if p["sla_met"]]
            return max(good, key=lambda p: p["users"]) if good else None
        best = None
        for p in self.curve:
            if best is None or p["tokens_per_s"] > best["tokens_per_s"] * (1 + self.cfg.min_gain):
                best = p
        return best

    def to_dict(self) -> dict:
        return {"mode": self.cfg.mode, "pool_users": self.pool, "curve": self.curve, "best": self.best(),
                "verdict": self.verdict, "settings": dataclasses.asdict(self.cfg)}
