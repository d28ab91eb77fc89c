"""Closed-loop scheduling: users ask, wait for the answer, think, ask again.

Vocabulary: the *dispatcher* (the main thread) keeps a heap of (time the
user is ready, user); when a user is due it takes the user's next request,
stamps its *intended start* (the due time, so a late dispatcher or a full
queue never hides latency) and queues it. A pool of *workers* (sized for
storage concurrency, not one per user) executes requests; a finished
request puts its user back on the heap after its think time.

Stopping: at the deadline, after max_requests, on a run fault or on Ctrl-C
the dispatcher stops issuing, queued requests that have not started are
dropped (and counted), and in-flight requests drain.
"""

from __future__ import annotations

import heapq
import queue
import threading
from dataclasses import dataclass
from time import monotonic_ns as now_ns

from kv_cache.errors import RunFault


@dataclass
class RunOutcome:
    """How the load phase ended."""

    stopped_reason: str = "duration"
    issued: int = 0
    completed: int = 0
    dropped_at_stop: int = 0
    fault: str = ""
    start_ns: int = 0
    end_ns: int = 0

    @property
    def partial(self) -> bool:
        return self.stopped_reason in ("interrupted", "fault")


class ClosedLoopRunner:
    """Drives users against an execute(request, worker_state) callable."""

    def __init__(self, users, num_workers: int, execute, make_worker_state, recorder, progress=None):
        self.users = users
        self.execute = execute
        self.make_worker_state = make_worker_state
        self.recorder = recorder
        self.progress = progress
        self.num_workers = num_workers
        self._queue: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int]] = []
        self._in_flight = 0
        self._stop = threading.Event()
        self.outcome = RunOutcome()

    # ------------------------------------------------------------------ workers

    def _worker(self, state) -> None:
        while True:
            req = self._queue.get()
            if req is None:
                return
            req.dequeued_ns = now_ns()
            try:
                self.execute(req, state)
            except RunFault as e:
                self._fail(str(e))
            except Exception as e:  # a bug must stop the run loudly, not hang it
                self._fail(f"internal error in a worker: {type(e).__name__}: {e}")
            done = now_ns()
            with self._cond:
                self._in_flight -= 1
                self.outcome.completed += 1
                if not self._stop.is_set():
                    heapq.heappush(self._heap, (done + int(req.think_s * 1e9), req.user_id))
                self._cond.notify_all()

    def _fail(self, message: str) -> None:
        with self._cond:
            if not self.outcome.fault:
                self.outcome.fault = message
                self.outcome.stopped_reason = "fault"
            self._stop.set()
            self._cond.notify_all()

    # ------------------------------------------------------------------ dispatcher

    def run(self, warmup_s: float, duration_s: float, max_requests: int = 0) -> RunOutcome:
        """Run warm-up then measurement; return how it ended (results are in the recorder)."""
        start = now_ns()
        self.outcome.start_ns = start
        measure_at = start + int(warmup_s * 1e9)
        deadline = measure_at + int(duration_s * 1e9)
        first = self.users[0].user_id
        for u in self.users:
            self._heap.append((start + int(u.first_delay_s * 1e9), u.user_id))
        heapq.heapify(self._heap)
        threads = [threading.Thread(target=self._worker, args=(self.make_worker_state(),), daemon=True,
                                    name=f"worker-{i}") for i in range(self.num_workers)]
        for t in threads:
            t.start()
        if warmup_s == 0:
            self.recorder.start_measuring(start)
        try:
            self._dispatch(first, measure_at, deadline, max_requests)
        except KeyboardInterrupt:
            self.outcome.stopped_reason = "interrupted"
        self._drain(threads)
        self.outcome.end_ns = now_ns()
        if self.recorder.measure_start_ns is None:
            self.recorder.start_measuring(self.outcome.end_ns)
        self.recorder.stop_measuring(self.outcome.end_ns)
        return self.outcome

    def _dispatch(self, first: int, measure_at: int, deadline: int, max_requests: int) -> None:
        with self._cond:
            while not self._stop.is_set():
                now = now_ns()
                if self.recorder.measure_start_ns is None and now >= measure_at:
                    self.recorder.start_measuring(measure_at)
                if now >= deadline:
                    self.outcome.stopped_reason = "duration"
                    return
                if max_requests and self.outcome.issued >= max_requests:
                    if self._in_flight == 0:
                        self.outcome.stopped_reason = "max_requests"
                        return
                    self._cond.wait(timeout=min(0.5, (deadline - now) / 1e9))
                    continue
                wake = min(deadline, measure_at if self.recorder.measure_start_ns is None else deadline)
                if self._heap and self._heap[0][0] <= now:
                    due, uid = heapq.heappop(self._heap)
                    req = self.users[uid - first].next_request()
                    req.intended_ns = due
                    self._in_flight += 1
                    self.outcome.issued += 1
                    self._queue.put(req)
                    continue
                if self._heap:
                    wake = min(wake, self._heap[0][0])
                self._cond.wait(timeout=max(0.0, (wake - now) / 1e9) + 1e-4)
                if self.progress:
                    self.progress(self)

    def _drain(self, threads) -> None:
        self._stop.set()
        dropped = 0
        while True:
            try:
                req = self._queue.get_nowait()
            except queue.Empty:
                break
            if req is not None:
                dropped += 1
        with self._cond:
            self._in_flight -= dropped
        self.outcome.dropped_at_stop = dropped
        for _ in threads:
            self._queue.put(None)
        for t in threads:
            while t.is_alive():
                try:
                    t.join(timeout=0.5)
                except KeyboardInterrupt:
                    self.outcome.stopped_reason = "interrupted"
