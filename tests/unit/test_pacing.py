"""Closed-loop pacing: a user's first turn waits for room in the queue without polling for it."""

import threading
import time

import numpy as np

from kv_cache.recorder.recorder import Recorder
from kv_cache.scheduler.clock import SkipIdleClock
from kv_cache.scheduler.runner import ClosedLoopRunner
from kv_cache.types import USER, Request


class _User:
    def __init__(self, uid: int, think_s: float = 0.0, first_delay_s: float = 0.0):
        self.user_id, self.first_delay_s, self.turns, self.think_s = uid, first_delay_s, 0, think_s

    def next_request(self):
        self.turns += 1
        return Request(self.user_id, self.turns, self.turns, np.zeros(4, dtype=np.int32),
                       np.zeros(1, dtype=np.int32), ((4, USER),), think_s=self.think_s)


def test_paced_first_turns_wait_for_a_completion_not_a_timer():
    """200 users, 2 workers each taking 5 ms a request: almost every first turn is paced. The dispatcher
    must wake on completions only: a few queue checks per completed request (a 20 ms retry per paced user
    made about 10,000 per second, ~500 per completion, and held the GIL the workers need). Bounded by a request
    count, not a window: the clock skips idle time, and under load it runs as in a run."""
    served: list[int] = []
    lock = threading.Lock()

    def execute(req, state):
        time.sleep(0.005)
        with lock:
            served.append(req.user_id)

    runner = ClosedLoopRunner([_User(u) for u in range(200)], 2, execute, lambda: None, Recorder(), pace=True,
                              clock=SkipIdleClock())
    checks = [0]
    qsize = runner._queue.qsize

    def counted():
        checks[0] += 1
        return qsize()

    runner._queue.qsize = counted
    outcome = runner.run(0.0, 3600.0, max_requests=60)
    assert outcome.stopped_reason == "max_requests" and outcome.completed == 60
    assert outcome.users_paced + outcome.users_waiting > 150  # held once: started after waiting, or still waiting
    assert outcome.users_started + outcome.users_waiting == 200
    assert checks[0] <= 10 * outcome.completed, f"{checks[0]} queue checks for {outcome.completed} requests"


def test_the_users_gauges_count_conversations_and_waiting_users_not_the_pool():
    """timeseries.csv showed users_active 200 every second while 184 users never started."""
    def execute(req, state):
        time.sleep(0.005)  # 2 workers, 24 requests: at most 24 users can start

    runner = ClosedLoopRunner([_User(u) for u in range(50)], 2, execute, lambda: None, Recorder(), pace=True,
                              clock=SkipIdleClock())
    seen: list[dict] = []
    runner.progress = lambda r: seen.append(r.levels())
    outcome = runner.run(0.0, 3600.0, max_requests=24)
    assert seen and all(g["users_active"] <= outcome.users_started for g in seen)
    assert max(g["users_waiting"] for g in seen) > 0 and max(g["users_active"] for g in seen) < 50
    last = runner.levels()
    assert last["users_waiting"] == outcome.users_waiting
    assert outcome.users_started + outcome.users_waiting <= 50


def test_the_workers_buffers_are_made_before_the_clock_starts():
    """16 workers' buffers of 2 x 64 MiB took seconds to touch inside a 3 s window, and the reference's 4-user
    line issued nothing: every worker's state exists before the run's clock starts."""
    made: list[int] = []

    def make_state():
        made.append(time.monotonic_ns())
        return None

    runner = ClosedLoopRunner([_User(u) for u in range(2)], 3, lambda req, state: None, make_state, Recorder())
    outcome = runner.run(0.0, 0.05, max_requests=2)
    assert len(made) == 3 and max(made) <= outcome.start_ns


def test_the_live_line_goes_on_through_the_drain_and_says_so():
    """Issue 39, item 2: the progress line went silent during the drain. The dispatcher's tick goes on while what
    is in flight finishes, and the live line names the phase."""
    from io import StringIO

    from kv_cache.report.live import LiveLine

    def execute(req, state):
        time.sleep(1.2)  # in flight when issuing stops at 0.2 s: the drain lasts about a second

    runner = ClosedLoopRunner([_User(0)], 1, execute, lambda: None, Recorder())
    phases: list[bool] = []
    runner.progress = lambda r: phases.append(r.draining)
    runner.run(0.0, 0.2)
    assert True in phases  # ticks during the drain
    out = StringIO()
    live = LiveLine(Recorder(), 10, "nvme", out)
    live.next = 0
    live(3, draining=True)
    assert out.getvalue().startswith("  [draining")


def test_think_times_and_the_window_pass_on_the_injected_clock_not_in_sleeps():
    """The dispatcher's time is injectable: with nothing in flight, a wait for a user's think time (10 s here) or the
    window's opening (a 15 s warm-up) passes on the clock at once, and each request is due exactly one think time
    after its user's previous answer."""
    clock = SkipIdleClock()
    recorder = Recorder()
    due: list[tuple[int, int]] = []
    runner = ClosedLoopRunner([_User(u, think_s=10.0, first_delay_s=u) for u in range(2)], 1,
                              lambda req, state: due.append((req.user_id, req.intended_ns)), lambda: None, recorder,
                              clock=clock)
    outcome = runner.run(15.0, 3600.0, max_requests=6)
    assert outcome.stopped_reason == "max_requests" and outcome.completed == 6
    assert clock.skipped_ns >= 20 * 10**9  # two think times of each user at least
    for uid in (0, 1):
        mine = [t for u, t in due if u == uid]
        gaps = [(b - a) / 1e9 for a, b in zip(mine, mine[1:])]
        assert len(mine) == 3 and all(10.0 <= g < 10.5 for g in gaps), gaps  # think time + the answer's time
    assert recorder.measure_start_ns == outcome.start_ns + 15 * 10**9  # the warm-up ended on the clock


def test_a_signal_that_leaves_the_dispatcher_holding_the_lock_still_ends_the_run():
    """A SIGTERM's exception raised between the lock's acquire and its with-block left the main thread holding it:
    the workers waited for it and the drain for them, for ever (a CI run hung in the warm-up)."""
    began = time.monotonic()

    class Leaky(ClosedLoopRunner):
        def _wait(self, *args):  # under the lock, requests in flight
            if time.monotonic() - began > 0.2:
                self._cond.acquire()  # one more hold than the with-block it is in gives back, as a signal leaves it
                raise KeyboardInterrupt
            super()._wait(*args)

    runner = Leaky([_User(u, think_s=0.001) for u in range(8)], 2, lambda req, state: time.sleep(0.02),
                   lambda: None, Recorder())
    runner.drain_s = 1.0
    done: list = []
    main = threading.Thread(target=lambda: done.append(runner.run(0.0, 3600.0)), daemon=True)
    main.start()
    main.join(timeout=60)
    assert done and done[0].stopped_reason == "interrupted", "the run never ended: its workers wait for the lock"
