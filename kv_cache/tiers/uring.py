"""The io_uring engine (--io-engine io_uring): O_DIRECT reads and writes submitted through a ring, as fio's io_uring
engine does (liburing's Python binding, the `uring` extra). Each worker thread has a ring of its own; a block moved
in several I/O units (--io-unit layer, or a block past one call's limit) is submitted as one batch of vectored
operations and waited for together: one system call for the batch, where the direct engine makes one per unit.

Registered on import (the tiers package is imported whole before a stack is built): nothing else names it. A host
whose kernel or container refuses io_uring (Docker's default seccomp profile does) makes it unavailable, said in
one sentence when asked for.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref

import numpy as np

from kv_cache.errors import RunFault
from kv_cache.tiers.base import DIRECT_IO
from kv_cache.tiers.engines import Engine, Target, register_engine
from kv_cache.tiers.native import child_main, probe_in_child
from kv_cache.tiers.posix_io import CHUNK

DEPTH = 64  # submission queue entries per ring: the most I/O units one batch holds


class UringEngine(Engine):
    name, open_flags, tier_flags = "io_uring", os.O_DIRECT, frozenset({DIRECT_IO})
    fio, summary = ("io_uring", 1, False), "O_DIRECT through an io_uring, a block's I/O units in one batch"

    def __init__(self) -> None:
        self._local = threading.local()
        self._why: str | None = None

    def unavailable(self) -> str:
        """Asked once per process, in a child process: the binding may die by SIGILL on this CPU (see native.py)."""
        if self._why is None:
            self._why = probe_in_child(MODULE, "a ring and a no-op")[1]
        return self._why

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        self._batch("write", t, off, data, unit, times)

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        self._batch("read", t, off, out, unit, times)

    def _ring(self):
        ring = getattr(self._local, "ring", None)
        if ring is None:
            import liburing

            ring = liburing.Ring()
            if liburing.io_uring_queue_init(DEPTH, ring, 0) < 0:
                raise RunFault("io_uring_queue_init failed: the kernel refused a ring.")
            self._local.ring, self._local.cqe = ring, liburing.Cqe()
            # the ring (its fd and mapped queues) goes with its thread: trials and `policies` start new workers
            weakref.finalize(threading.current_thread(), liburing.io_uring_queue_exit, ring)
        return ring

    def _batch(self, what: str, t: Target, off: int, buf: np.ndarray, unit: int, times: list | None) -> None:
        """Every I/O unit of buf submitted at once (DEPTH at a time), then each completion checked; a short one is
        finished by the next round."""
        import liburing

        ring, cqe = self._ring(), self._local.cqe
        prep = liburing.io_uring_prep_writev if what == "write" else liburing.io_uring_prep_readv
        step = min(unit or CHUNK, CHUNK)
        view, done, total = memoryview(buf).cast("B"), 0, buf.nbytes
        while done < total:
            pieces = [(o, min(step, total - o)) for o in range(done, total, step)][:DEPTH]
            keep = []  # each Iovec lives until its completion
            for k, (o, n) in enumerate(pieces):
                iov = liburing.Iovec([view[o:o + n]])
                keep.append(iov)
                sqe = liburing.io_uring_get_sqe(ring)
                prep(sqe, t.fd, iov, off + o)
                liburing.io_uring_sqe_set_data64(sqe, k)
            start = time.monotonic_ns() if times is not None else 0
            liburing.io_uring_submit_and_wait(ring, len(pieces))
            got = [0] * len(pieces)
            for _ in pieces:
                liburing.io_uring_wait_cqe(ring, cqe)
                k, res = cqe[0].user_data, cqe[0].res
                liburing.io_uring_cqe_seen(ring, cqe[0])
                if res < 0:
                    raise RunFault(f"io_uring {what} of {t.path} failed: {os.strerror(-res)} (errno {-res}).")
                got[k] = res
            if times is not None:
                times.append((time.monotonic_ns() - start, sum(got)))
            whole = next((k for k, (_, n) in enumerate(pieces) if got[k] < n), len(pieces))
            if whole == 0 and got[0] == 0:
                raise RunFault(f"io_uring {what} of {t.path} moved no byte at {off + done}.")
            # a short piece: what follows it is done again from its end (moving bytes twice is harmless)
            done = pieces[whole][0] + got[whole] if whole < len(pieces) else pieces[-1][0] + pieces[-1][1]


def _probe_here() -> str:
    """Why this host cannot run io_uring ("" when it can): a ring is made and a no-op completes. Runs in the
    probe's child process only (UringEngine.unavailable)."""
    try:
        import liburing
    except ImportError:
        return "liburing's Python binding is not installed (pip install liburing: the uring extra)"
    try:
        ring, cqe = liburing.Ring(), liburing.Cqe()
        if liburing.io_uring_queue_init(2, ring, 0) < 0:
            return "the kernel refused an io_uring"
        liburing.io_uring_prep_nop(liburing.io_uring_get_sqe(ring))
        liburing.io_uring_submit_and_wait(ring, 1)
        liburing.io_uring_wait_cqe(ring, cqe)
        liburing.io_uring_cqe_seen(ring, cqe[0])
        liburing.io_uring_queue_exit(ring)
    except Exception as e:  # noqa: BLE001 - the binding raises OSError, or its own classes, for a refused syscall
        return f"io_uring is refused here ({type(e).__name__}: {e}; a container's seccomp profile blocks it)"
    return ""


MODULE = "kv_cache.tiers.uring"

if __name__ == "__main__":  # the probe's child, and make install's check of the installed binding
    sys.exit(child_main(MODULE, "a ring and a no-op", _probe_here, sys.argv))
register_engine(UringEngine())
