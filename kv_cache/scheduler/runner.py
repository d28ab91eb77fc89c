"""Scheduling: closed-loop users or open-loop arrivals, over one pool of workers.

Vocabulary: the *dispatcher* (the main thread) decides when each request is due and stamps its *intended
start*: every latency runs from there, so a late dispatcher or a full queue never hides queueing (no
coordinated omission). A pool of *workers* (sized for storage concurrency, not one per user) executes requests.

- closed loop: a heap of (time the user is ready, user); a finished request puts its user back after its think
  time; a user with nothing left leaves. Open loop: arrivals (offset, build) from a pacer; nothing waits.

Stopping: at the deadline, after max_requests, when the traffic runs out, on a run fault or on Ctrl-C the
dispatcher stops issuing, queued requests that have not started are dropped (and counted), and in-flight
requests drain for at most --drain-s (then each stops at its next block operation, counted as abandoned).
"""

from __future__ import annotations

import contextlib
import heapq
import queue
import threading
import time
import typing
from collections import deque
from dataclasses import dataclass

from kv_cache import counters as C
from kv_cache import runlog, signals
from kv_cache.errors import Abandoned, RunFault
from kv_cache.scheduler.clock import Clock
from kv_cache.scheduler.qos import PriorityRequests


@dataclass
class RunOutcome:
    """How the load phase ended."""

    stopped_reason: str = "duration"
    issued: int = 0
    completed: int = 0
    dropped_at_stop: int = 0
    users_started: int = 0   # closed loop: users whose first request was issued
    users_paced: int = 0     # of them, those whose first request waited for a short queue (pacing)
    users_waiting: int = 0   # users never started, still waiting for a short queue at the stop (pacing)
    held_for_turn: int = 0   # open loop: turns that arrived before their session's previous answer, held
    fault: str = ""
    abandoned: int = 0       # in flight when the drain's time ran out: stopped at their next block operation
    start_ns: int = 0
    end_ns: int = 0
    issuing_s: float = 0.0   # the window until issuing stopped: the measured time without the drain
    backlog_bytes: int = 0   # what the requests issued and not yet done held when issuing stopped

    @property
    def partial(self) -> bool:
        return self.stopped_reason in ("interrupted", "fault", "peer_fault")


REQUEST_BYTES = 2048  # a request besides its tokens: 1.4 KiB (tracemalloc over 3,000 synthetic requests)


def request_bytes(req) -> int:
    """What a request issued and not yet done holds in memory: its tokens, its text, its object."""
    return req.prompt_tokens.nbytes + req.output_tokens.nbytes + len(req.text) + REQUEST_BYTES


class Runner:
    """The worker pool, the measurement window and the drain; subclasses dispatch."""

    def __init__(self, num_workers: int, execute, make_worker_state, recorder, progress=None, peers=None,
                 qos=None, controller=None, clock: Clock | None = None):
        self.execute, self.make_worker_state = execute, make_worker_state
        self.recorder, self.progress, self.num_workers = recorder, progress, num_workers
        self.peers = peers  # other MPI ranks: poll_fault() / notify_fault(message), main thread only
        self.qos = qos      # a QosPolicy: classes requests and orders the queue by priority
        self.controller = controller  # called by the dispatcher: controller(runner, now) -> stop reason or None
        self.clock = clock or Clock()  # the dispatcher's time: every due time, the window, the deadline
        # stop_after: a StopAfter the lifecycle reads (set once issuing stops); draining: what is in flight finishes
        self.stop_after, self.drain_s, self.draining = None, 0.0, False
        # backlog_limit: the bytes the requests issued and not yet done may hold (--max-backlog-gb; 0: no bound)
        self.backlog_limit, self._backlog = 0, 0
        self._queue = PriorityRequests(qos.priority if qos is not None else None)
        self._cond = threading.Condition()
        self._in_flight = 0
        self._stop = threading.Event()
        self.outcome = RunOutcome()

    def levels(self) -> dict[str, int]:
        """The gauges sampled each tick: requests queued, in flight, users in a conversation, users waiting."""
        return {"queue_depth": self._queue.qsize(), "in_flight": self._in_flight, "users_active": self.active_users,
                "users_waiting": self.waiting_users}

    @property
    def active_users(self) -> int:
        return 0  # open loop: no closed-loop user is active

    @property
    def waiting_users(self) -> int:
        return 0

    def _tally(self) -> None:
        """Under the lock, at the stop: the outcome's user counts (closed loop)."""

    def _worker(self, state) -> None:
        while True:
            req = self._queue.get()
            if req is None:
                return
            req.dequeued_ns = self.clock.now_ns()
            abandoned = False
            try:
                self.execute(req, state)
            except Abandoned:
                abandoned = True
            except RunFault as e:
                self._fail(str(e))
            except Exception as e:  # a bug must stop the run loudly, not hang it; its traceback goes to the log
                self._fail(runlog.internal("internal error in a worker", e))
            done = self.clock.now_ns()
            with self._cond:
                self._in_flight -= 1
                self._backlog -= request_bytes(req)
                self.outcome.abandoned += abandoned
                self.outcome.completed += not abandoned
                if not self._stop.is_set():
                    self._after(req, done)
                self._cond.notify_all()

    def _after(self, req, done_ns: int) -> None:
        """Called under the lock when a request is done (closed loop: the user thinks)."""

    def _fail(self, message: str) -> None:
        with self._cond:
            if not self.outcome.fault:
                self.outcome.fault, self.outcome.stopped_reason = message, "fault"
            self._stop.set()
            self._cond.notify_all()

    def _issue(self, req, due_ns: int) -> None:
        req.intended_ns = due_ns
        if self.qos is not None:
            req.qos = self.qos.classify(req.user_id, req.seq)
        self.recorder.count(C.REQUESTS_ISSUED_IN_WINDOW, start_ns=due_ns)  # the offered load, window only
        with self._cond:
            self._in_flight += 1
            self.outcome.issued += 1
            self._backlog += request_bytes(req)
            if self.backlog_limit and self._backlog > self.backlog_limit and not self._stop.is_set():
                # an open loop offering more than the storage serves: its queue would grow until memory runs out
                self.outcome.stopped_reason, self.outcome.backlog_bytes = "backlog", self._backlog
                self._stop.set()
            if self._hold(req):
                return
        self._queue.put(req)

    def _hold(self, req) -> bool:
        """Under the lock: keep a request back (open loop: its session's previous turn is unanswered)."""
        return False

    def _held(self) -> int:
        """Under the lock: requests kept back at the stop (dropped with the queue)."""
        return 0

    def _stop_check(self, now: int, measure_at: int, deadline: int, max_requests: int, exhausted: bool) -> bool:
        """Under the lock: open the window when due; True (reason set) when issuing must stop."""
        if self.recorder.measure_start_ns is None and now >= measure_at:
            self.recorder.start_measuring(measure_at)
        if now >= deadline:
            self.outcome.stopped_reason = "duration"
            return True
        done_issuing = (max_requests and self.outcome.issued >= max_requests) or exhausted
        if done_issuing and self._in_flight == 0:
            self.outcome.stopped_reason = "max_requests" if not exhausted else "trace_end"
            return True
        return False

    def _wait(self, now: int, wake_ns: int, measure_at: int, deadline: int) -> None:
        """Under the lock: sleep until wake_ns, the window opening, the deadline or a completion."""
        if self.recorder.measure_start_ns is None:
            wake_ns = min(wake_ns, measure_at)
        if self.peers is not None:  # wake at least every 0.2 s to hear from the other ranks
            wake_ns = min(wake_ns, now + 200_000_000)
        if self.progress:  # and every 0.5 s to sample the time series' gauges
            wake_ns = min(wake_ns, now + 500_000_000)
        if self.controller is not None:
            wake_ns = min(wake_ns, self.controller.next_ns)
        self.clock.wait(self._cond, max(0.0, (min(wake_ns, deadline) - now) / 1e9) + 1e-4, self._in_flight > 0)
        if self.progress:
            self.progress(self)
        now = self.clock.now_ns()
        if self.controller is not None and not self._stop.is_set() and (reason := self.controller(self, now)):
            self.outcome.stopped_reason = reason
            self._stop.set()
        if self.peers is not None and (message := self.peers.poll_fault()):
            self.outcome.fault, self.outcome.stopped_reason = f"stopped by a peer: {message}", "peer_fault"
            self._stop.set()

    def run(self, warmup_s: float, duration_s: float, max_requests: int = 0,
            started: typing.Callable[[], None] | None = None) -> RunOutcome:
        """Run warm-up then measurement; return how it ended (results are in the recorder). started is called once
        the clock runs, when a signal stops the run with results. Signals are deferred when it returns (see
        signals.py): the caller calls signals.resume()."""
        states = [self.make_worker_state() for _ in range(self.num_workers)]  # touched before the clock starts
        start = self.clock.now_ns()
        self.outcome.start_ns = start
        measure_at = start + int(warmup_s * 1e9)
        deadline = measure_at + int(duration_s * 1e9)
        threads = [threading.Thread(target=self._worker, args=(st,), daemon=True, name=f"worker-{i}")
                   for i, st in enumerate(states)]
        for t in threads:
            t.start()
        if warmup_s == 0:
            self.recorder.start_measuring(start)
        if self.controller is not None:
            self.controller.start(self, start, measure_at)
        try:
            if started is not None:
                started()
            self._dispatch(start, measure_at, deadline, max_requests)
        except KeyboardInterrupt:
            self.outcome.stopped_reason = "interrupted"
            # NOTE: a signal's exception raised between the lock's acquire and its with-block (Condition.__enter__
            # returning) left the lock held by this thread, which alone can take it again (an RLock): every worker
            # then waited for it, and the drain for them, for ever (a SIGTERM in the warm-up hung a CI run)
            while self._cond._is_owned():
                self._cond.release()
        # NOTE: from here on a signal is remembered, not raised: the drain and the caller's writing of the
        # results must not be cut short by a second Ctrl-C. The caller resumes (signals.resume) once done.
        signals.defer()
        if self.outcome.stopped_reason != "interrupted" and signals.received() is not None:
            self.outcome.stopped_reason = "interrupted"  # arrived between the dispatch's end and defer()
        if self.peers is not None and self.outcome.stopped_reason == "fault":
            self.peers.notify_fault(self.outcome.fault)
        with self._cond:
            self._tally()
        self.outcome.issuing_s = max(0.0, (self.clock.now_ns() - measure_at) / 1e9)
        if self.stop_after is not None:  # what is in flight gets drain_s, then stops at its next block operation
            self.stop_after.at_ns = time.monotonic_ns() + int(self.drain_s * 1e9)  # the lifecycle's clock
        self._drain(threads)
        self.outcome.end_ns = self.clock.now_ns()
        if self.recorder.measure_start_ns is None:
            self.recorder.start_measuring(self.outcome.end_ns)
        self.recorder.stop_measuring(self.outcome.end_ns)
        return self.outcome

    def _dispatch(self, start: int, measure_at: int, deadline: int, max_requests: int) -> None:
        raise NotImplementedError

    def _drain(self, threads) -> None:
        self._stop.set()
        dropped = 0
        with contextlib.suppress(queue.Empty):
            while True:
                dropped += self._queue.get_nowait() is not None
        with self._cond:
            dropped += self._held()
            self._in_flight -= dropped
        self.outcome.dropped_at_stop = dropped
        for _ in threads:
            self._queue.put(None)
        self.draining = True
        for t in threads:
            while t.is_alive():
                try:
                    t.join(timeout=0.5)
                except KeyboardInterrupt:
                    self.outcome.stopped_reason = "interrupted"
                if self.progress and t.is_alive():  # the live line goes on through the drain, saying so
                    self.progress(self)


class ClosedLoopRunner(Runner):
    """Users that ask, wait for the answer, think and ask again.

    Only the first ``active`` users (in creation order) take part: a controller (the autoscaler)
    changes the count during the run. A user beyond it is *parked* when it next comes up (its
    in-flight request finishes normally) and rejoins at once when the count grows again.
    """

    def __init__(self, users, *args, pace: bool = False, **kw):
        super().__init__(*args, **kw)
        # pace: a user's first request enters only while the queue is shorter than the worker pool, so
        # that started conversations progress (their later turns are not stuck behind hundreds of first
        # turns); its latency counts from its admission. Said in the results (users_paced).
        self.pace = pace
        self._started: set[int] = set()
        self._paced: set[int] = set()
        self._held_first: deque[int] = deque()  # paced users waiting for room in the queue, first come first
        self.users = {u.user_id: u for u in users}
        self._order = list(self.users)
        self._active = set(self._order)
        self._parked: set[int] = set()
        self._heap: list[tuple[int, int]] = []
        self._left = len(self.users)
        self._gone: set[int] = set()  # users with nothing left to ask

    @property
    def active_users(self) -> int:
        """Users in a conversation now: started, among the active ones, not gone (the time series' users_active)."""
        return len((self._started & self._active) - self._gone)

    @property
    def waiting_users(self) -> int:
        return len(self._held_first)

    def _tally(self) -> None:
        self.outcome.users_started = len(self._started)
        self.outcome.users_paced = len(self._paced & self._started)
        self.outcome.users_waiting = len(self._held_first)

    def set_active(self, n: int, now: int) -> None:
        """Under the lock (or before the run): make the first n users the active ones."""
        self._active = set(self._order[:n])
        for uid in self._order[:n]:
            if uid in self._parked:
                self._parked.discard(uid)
                heapq.heappush(self._heap, (now, uid))

    def _after(self, req, done_ns: int) -> None:
        if req.user_id in self._active:
            heapq.heappush(self._heap, (done_ns + int(req.think_s * 1e9), req.user_id))
        else:
            self._parked.add(req.user_id)

    def _dispatch(self, start: int, measure_at: int, deadline: int, max_requests: int) -> None:
        with self._cond:
            self._parked = {uid for uid in self._order if uid not in self._active}
            self._heap = [(start + int(self.users[uid].first_delay_s * 1e9), uid) for uid in self._order
                          if uid in self._active]
            heapq.heapify(self._heap)
        while not self._stop.is_set():
            with self._cond:
                now = self.clock.now_ns()
                if self._stop_check(now, measure_at, deadline, max_requests, self._left == 0):
                    return
                capped = max_requests and self.outcome.issued >= max_requests
                room = not capped and self._queue.qsize() < self.num_workers
                if self._held_first and room:  # a paced user enters now: its latency counts from here
                    due, uid = now, self._held_first.popleft()
                else:
                    if capped or not self._heap or self._heap[0][0] > now:
                        self._wait(now, self._heap[0][0] if self._heap and not capped else deadline, measure_at,
                                   deadline)
                        continue
                    due, uid = heapq.heappop(self._heap)
                if uid not in self._active:
                    self._parked.add(uid)
                    continue
                if uid not in self._started:
                    if self.pace and not room:
                        # NOTE: held until a worker finishes (its completion wakes this loop), not retried on a
                        # timer: 200 users polling every 20 ms held the GIL the workers need (issue 16)
                        self._paced.add(uid)
                        self._held_first.append(uid)
                        continue
                    self._started.add(uid)
            req = self.users[uid].next_request()  # built outside the lock: workers keep finishing
            if req is None:
                with self._cond:
                    self._left -= 1
                    self._gone.add(uid)
                continue
            self._issue(req, due)
