"""Native code probed in a child process: a binding built for instructions this CPU lacks (an AVX-512 wheel on an
AVX2-only machine) dies by SIGILL, which no `try` catches. The probe runs the binding's first calls in a child
interpreter; the parent only ever reads its exit, so a crash there is a sentence ("unavailable: ...") and never
kills a run, a test session or `make install`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

PROBE_TIMEOUT_S = 60.0  # a first import of a large binding on a busy 2-core machine takes seconds, not minutes

_SIGNALS = {signal.SIGILL: "an illegal instruction: the binding was built for a CPU with instructions this one "
                           "lacks (AVX-512, say)",
            signal.SIGSEGV: "a segmentation fault in the binding",
            signal.SIGBUS: "a bus error in the binding",
            signal.SIGABRT: "an abort in the binding"}


def crashed(rc: int) -> bool:
    """The child was ended by a signal (a crash of native code), not by its own exit."""
    return rc < 0


def _finding_this_package() -> dict:
    """The environment with this package's own folder first on PYTHONPATH: the child imports the same kv_cache as
    its parent (run from a clone, or beside another install of it)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def probe_in_child(module: str, what: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, str]:
    """(exit status, why `what` cannot run here: "" when it can). The child runs `python -m MODULE --probe-here`,
    which prints the reason it found (empty when none) and exits 0; any other end is the reason."""
    try:
        r = subprocess.run([sys.executable, "-m", module, "--probe-here"], capture_output=True, text=True,
                           timeout=timeout_s, stdin=subprocess.DEVNULL, env=_finding_this_package())
    except subprocess.TimeoutExpired:
        return 1, f"its probe ({what}, in a child process) did not answer within {timeout_s:g} s"
    if crashed(r.returncode):
        sig = signal.Signals(-r.returncode)
        cause = _SIGNALS.get(sig, "a crash of native code")
        return r.returncode, f"its probe ({what}, in a child process) died by {sig.name}: {cause}"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return r.returncode, f"its probe ({what}, in a child process) failed: {last}"
    return 0, r.stdout.strip()


def child_main(module: str, what: str, probe_here, argv: list[str]) -> int:
    """A binding module's `__main__`: `--probe-here` runs probe_here() in this (child) process and prints its
    reason; `--check` (make install) probes in a child, prints the reason (nothing when it runs), and exits 3 when
    the child crashed (make install then removes the binding), 1 when it is otherwise unavailable, 0 when it runs."""
    if argv[1:2] == ["--probe-here"]:
        print(probe_here(), flush=True)
        return 0
    if argv[1:2] == ["--check"]:
        rc, why = probe_in_child(module, what)
        if why:
            print(why)
        return 3 if crashed(rc) else (1 if why else 0)
    print(f"usage: python -m {module} --check | --probe-here", file=sys.stderr)
    return 2
