"""The io_uring engine (--io-engine io_uring): O_DIRECT reads and writes submitted through a ring, as fio's io_uring
engine does, spoken through io_uring's own system calls (io_uring_sys.py: no native binding, so it runs on any
x86-64 CPU). Each worker thread has a ring of its own; a block moved in several I/O units (--io-unit layer, or a
block past one call's limit) is submitted as one batch and waited for together: one system call for the batch,
where the direct engine makes one per unit.

Declared in ENGINES (tiers.catalog.find_media() reads every module's): nothing else names it. A host
whose kernel or container refuses io_uring (Docker's default seccomp profile does) makes it unavailable, said in
one sentence when asked for; the probe runs in a child process, as every native engine's does (native.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from itertools import repeat

import numpy as np

from kv_cache.buffers import address
from kv_cache.errors import RunFault
from kv_cache.tiers.base import device_call, in_flight
from kv_cache.tiers.engines import Engine, Target, in_turn
from kv_cache.tiers.io_uring_sys import OP_READ, OP_WRITE, Ring, probe
from kv_cache.tiers.native import child_main, probe_in_child
from kv_cache.tiers.posix_io import CHUNK

DEPTH = 64  # submission queue entries per ring: the most I/O units one batch holds
MODULE = "kv_cache.tiers.uring"


class UringEngine(Engine):
    name, open_flags = "io_uring", os.O_DIRECT
    fio, summary = ("io_uring", 1, False), "O_DIRECT through an io_uring, a block's I/O units in one batch"
    depth, pooled = DEPTH, False

    def __init__(self) -> None:
        self._local = threading.local()
        self._why: str | None = None

    def unavailable(self) -> str:
        """Asked once per process, in a child process (native.py): a refusal, or a crash, is a sentence there."""
        if self._why is None:
            self._why = probe_in_child(MODULE, "a ring and a no-op")[1]
        return self._why

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        start = time.monotonic_ns()
        self._batch(OP_WRITE, t, off, data, unit, times)
        device_call(start)  # O_DIRECT through the ring: all device time

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        start = time.monotonic_ns()
        self._batch(OP_READ, t, off, out, unit, times)
        device_call(start)

    batch = "one io_uring per worker kept full (64 I/Os in flight), each I/O reaped as it completes"
    cuts_units = True

    def write_many(self, ios: list[tuple[Target, int, np.ndarray]], unit: int, pools=None,
                   units: list | None = None) -> list:
        return self._many(OP_WRITE, ios, unit, units)

    def read_many(self, ios: list[tuple[Target, int, np.ndarray]], unit: int, pools=None,
                  units: list | None = None) -> list:
        return self._many(OP_READ, ios, unit, units)

    def _many(self, op: int, ios: list, unit: int, units: list | None = None) -> list:
        """Every unit of every I/O through the ring, DEPTH in flight; an I/O's completion is its last unit's.
        units: a list given gets each I/O's units, (completion ns, bytes) each, as a tier's own cut would time them
        (a block's layer groups cut here from its buffer: no view, address or result a unit in Python). A unit
        that fails or comes back short leaves its I/O to the one-by-one path, which finishes or fails it (a
        sentence either way; each of its units then completes when it does)."""
        step = min(unit or CHUNK, CHUNK)
        sqes, spans = [], []  # (opcode, fd, offset, address, length) of each unit; each I/O's [first, end) of them
        for t, off, buf in ios:
            addr, size, first = address(buf), buf.nbytes, len(sqes)
            if size <= step:  # one unit: a block, or a layer unit the tier cut already
                sqes.append((op, t.fd, off, addr, size))
            else:
                sqes.extend([(op, t.fd, off + o, addr + o, min(step, size - o)) for o in range(0, size, step)])
            spans.append((first, len(sqes)))
        when = [0] * len(sqes)
        try:  # the ring kept full: DEPTH units in flight, the next submitted as each completes
            got, submitted = self._ring().stream(sqes, when)
            in_flight(sum(when) - submitted)
        except OSError:
            got = [-1] * len(sqes)
        out, fix, base = [0] * len(ios), [], len(units or ())
        for i, (a, b) in enumerate(spans):
            last = sqes[b - 1][4]
            if b - a == 1:
                whole, out[i] = got[a] == last, when[a]
            else:  # every unit but the last is a step long
                whole, out[i] = got[a:b - 1].count(step) == b - 1 - a and got[b - 1] == last, max(when[a:b])
            if not whole:
                fix.append(i)
            if units is not None:  # one finished below: its units filled in then
                units.append([*zip(when[a:b - 1], repeat(step)), (when[b - 1], last)] if whole else [])
        verb = self.write if op == OP_WRITE else self.read
        for i, res in zip(fix, in_turn(verb, [ios[i] for i in fix], unit) if fix else []):
            out[i] = res  # one after another, each timed in flight as the direct engine's are
            if units is not None and not isinstance(res, BaseException):  # each of its units done when it was
                units[base + i] = [(res, sqes[u][4]) for u in range(*spans[i])]
        return out

    def _ring(self) -> Ring:
        ring = getattr(self._local, "ring", None)
        if ring is None:
            try:
                ring = Ring(DEPTH)
            except OSError as e:
                raise RunFault(f"io_uring_setup failed: {e.strerror or e}: the kernel refused a ring.") from None
            self._local.ring = ring
            # the ring (its fd and mapped queues) goes with its thread: trials and `policies` start new workers
            weakref.finalize(threading.current_thread(), ring.close)
        return ring

    def _batch(self, op: int, t: Target, off: int, buf: np.ndarray, unit: int, times: list | None) -> None:
        """Every I/O unit of buf submitted at once (DEPTH at a time), then each completion checked; a short one is
        finished by the next round."""
        what = "write" if op == OP_WRITE else "read"
        ring, base = self._ring(), address(buf)
        step = min(unit or CHUNK, CHUNK)
        done, total = 0, buf.nbytes
        while done < total:
            pieces = [(o, min(step, total - o)) for o in range(done, total, step)][:DEPTH]
            start = time.monotonic_ns() if times is not None else 0
            when = [0] * len(pieces) if times is not None else None  # --io-unit layer: each unit's completion
            try:
                got = ring.submit([(op, t.fd, off + o, base + o, n) for o, n in pieces], when)
            except OSError as e:
                raise RunFault(f"io_uring {what} of {t.path} failed: {e.strerror or e}.") from None
            bad = next((r for r in got if r < 0), None)
            if bad is not None:
                raise RunFault(f"io_uring {what} of {t.path} failed: {os.strerror(-bad)} (errno {-bad}).")
            if when is not None:  # each unit timed from the submission, as a batch's units are
                times.extend((w - start, n) for w, n in zip(when, got))
            whole = next((k for k, (_, n) in enumerate(pieces) if got[k] < n), len(pieces))
            if whole == 0 and got[0] == 0:
                raise RunFault(f"io_uring {what} of {t.path} moved no byte at {off + done}.")
            # a short piece: what follows it is done again from its end (moving bytes twice is harmless)
            done = pieces[whole][0] + got[whole] if whole < len(pieces) else pieces[-1][0] + pieces[-1][1]


if __name__ == "__main__":  # the probe's child, and make install's check
    sys.exit(child_main(MODULE, "a ring and a no-op", probe, sys.argv))
ENGINES = (UringEngine(),)
