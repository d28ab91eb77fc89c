"""SIGINT, SIGTERM and SIGHUP end a run the same way: stop issuing, drain, keep what was measured.

A scheduler's kill (SIGTERM), ``timeout``, a closed terminal (SIGHUP) and
Ctrl-C all raise ``Interrupted`` (a KeyboardInterrupt) in the main thread
while the run can still be stopped. Once the measurement has ended, the
signals are *deferred*: a signal that arrives while in-flight work drains and
results are written is remembered, not raised, so a second Ctrl-C cannot
throw away what was measured. The exit status is 128 + the first signal's
number (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP).
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by a handled signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _State:
    first: int | None = None   # the first signal received: it decides the exit status
    deferred = 0               # > 0: record signals, raise nothing
    quiet = 0                  # > 0: a deferred signal is not announced (nothing is being finished yet)


_state = _State()


def _handler(signum, _frame) -> None:
    if _state.first is None:
        _state.first = signum
    if _state.deferred:
        if signum != _state.first or getattr(_state, "told", False) or _state.quiet:
            return
        _state.told = True
        print(f"kv_cache_benchmark.py: {signal.Signals(signum).name} received: finishing, results are being "
              f"written", file=sys.stderr, flush=True)
        return
    raise Interrupted(signum)


def install() -> None:
    """Route the handled signals to _handler (main thread only; elsewhere a no-op). Called first thing by
    the entry point, before the heavy imports, and again by cli.main for callers that skip the script."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in HANDLED:
        signal.signal(sig, _handler)


@contextmanager
def deferred(quiet: bool = False):
    """Within: a handled signal is remembered, never raised (results are being finished; quiet: a step that must
    not be cut in half, such as reserving the report folder, said nothing about)."""
    _state.deferred += 1
    _state.quiet += quiet
    try:
        yield
    finally:
        _state.deferred -= 1
        _state.quiet -= quiet


def raise_pending() -> None:
    """Raise Interrupted now if a signal was remembered while nothing could be stopped."""
    if _state.first is not None and not _state.deferred:
        raise Interrupted(_state.first)


def defer() -> None:
    """Defer from now on (the run's measurement is over); undone by resume()."""
    _state.deferred += 1


def resume() -> None:
    """Raise on signals again, unless one was already received: then the program is finishing anyway,
    and a further signal must not cut that short either."""
    if _state.first is None:
        _state.deferred = max(0, _state.deferred - 1)


def ignore() -> None:
    """The command is done: a late signal must not turn its exit into a traceback or a kill."""
    if threading.current_thread() is threading.main_thread():
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_IGN)


def received() -> int | None:
    """The first handled signal received so far, or None."""
    return _state.first


def exit_status(default: int = 130) -> int:
    """128 + the first signal's number (default when none was received, e.g. a bare KeyboardInterrupt)."""
    return 128 + _state.first if _state.first is not None else default


def name() -> str:
    return signal.Signals(_state.first).name if _state.first is not None else "SIGINT"
