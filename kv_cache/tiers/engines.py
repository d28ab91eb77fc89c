"""The NVMe tier's I/O engines, as fio's ioengines: how bytes move between a buffer and a file. One table, ENGINES:
the --io-engine setting's choices, --help, the fio job an --io-trace writes and the submission rules read it. An
engine is one class, here or in a module of its own (uring.py): a module's ENGINES declares what it defines, and
tiers.catalog.find_media() collects them (nothing registers on import)."""

from __future__ import annotations

import itertools
import mmap
import os
import queue
import threading
import time
import weakref

import numpy as np

from kv_cache.tiers.base import device_call, in_flight
from kv_cache.tiers.posix_io import drop_cached, pread_all, pwrite_all


class Target:
    """An open file an engine moves bytes to and from (a slab, or one block's file)."""

    def __init__(self, path: str, fd: int):
        self.path, self.fd = path, fd
        self.mm: mmap.mmap | None = None
        self.view: np.ndarray | None = None


POOL_THREADS = 8  # a worker's own I/O threads for a batch on a synchronous engine: the depth the device sees from it


class Engine:
    """How bytes move between a buffer and a file (fio's ioengine): the ops every layout calls. A batch (read_many,
    write_many: (target, offset, buffer) each) goes over a small pool of this worker's own threads, so the device
    sees up to POOL_THREADS of its I/Os at once; an engine with a native batch (io_uring) overrides them."""

    name = ""
    open_flags = 0           # added to os.open's flags
    maps = False             # moves bytes through a mapping of the whole file (slab layout only)
    fio = ("psync", 0, False)  # what fio runs for it: (ioengine, direct, fsync after each write)
    depth = POOL_THREADS     # the most of a batch's I/Os it keeps in flight per worker
    summary = ""             # one line for --help

    @property
    def direct(self) -> bool:
        """It bypasses the page cache with O_DIRECT (aligned buffers; the submission rules ask for one)."""
        return bool(self.open_flags & os.O_DIRECT)

    def unavailable(self) -> str:
        """Why this host cannot run it ("" when it can)."""
        return ""

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        start = time.monotonic_ns()
        pwrite_all(t.fd, data, off, t.path, unit, times)
        device_call(start)  # with O_DIRECT the write reaches the device: all device time

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        start = time.monotonic_ns()
        pread_all(t.fd, out, off, t.path, unit, times)
        device_call(start)

    # how a batch reaches the device (the summary says it)
    batch = f"a pool of {POOL_THREADS} threads per worker (at most {POOL_THREADS} of its I/Os in flight)"

    def write_many(self, ios: list[tuple[Target, int, np.ndarray]], unit: int) -> list:
        """Each I/O's completion time (monotonic ns), or the exception it raised."""
        return _pooled(self.write, ios, unit)

    def read_many(self, ios: list[tuple[Target, int, np.ndarray]], unit: int) -> list:
        return _pooled(self.read, ios, unit)


_POOLS = threading.local()


class IoPool:
    """A worker's POOL_THREADS I/O threads: run(task, n) hands task to n of them and returns once each has run it.
    Two SimpleQueues, not a ThreadPoolExecutor: its submit() takes a lock that every executor of the process
    shares (the workers' pools all contended for it) and makes a future a task; with 4 workers of 8 threads, at
    512 KiB, submit() was 18 % of the interpreter's time (py-spy --gil, issue 48)."""

    def __init__(self, threads: int):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, name=f"kvbench-io-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except BaseException as e:  # noqa: BLE001 - handed to the worker that waits for it
                self._done.put(e)
            else:
                self._done.put(None)

    def run(self, task, n: int) -> None:
        """task on n of the pool's threads at once (n <= its threads); the first exception one raised, raised."""
        for _ in range(n):
            self._tasks.put(task)
        failed = [e for e in (self._done.get() for _ in range(n)) if e is not None]
        if failed:
            raise failed[0]

    def close(self) -> None:
        """Its threads end once the tasks handed to them are done (a sentinel each)."""
        for _ in self._threads:
            self._tasks.put(None)


def _pooled(verb, ios: list, unit: int) -> list:
    """ios over this thread's pool (made on its first batch; it goes with the thread): each of up to POOL_THREADS
    of its threads takes the batch's next I/O as it finishes one, so the device sees that many at once and a batch
    costs a task a thread, not one an I/O (at 512 KiB a future per I/O was a tenth of a block's CPU)."""
    if len(ios) == 1:
        return in_turn(verb, ios, unit)
    pool = getattr(_POOLS, "pool", None)
    if pool is None:
        pool = _POOLS.pool = IoPool(POOL_THREADS)
        weakref.finalize(threading.current_thread(), pool.close)
    out: list = [None] * len(ios)
    turns = itertools.count()  # next() on it is atomic under the GIL: each I/O is taken once
    spent: list[int] = []  # each pool thread's I/Os' time in flight (list.append is atomic under the GIL)
    pool.run(lambda: spent.append(_drain(verb, ios, unit, out, turns)), min(POOL_THREADS, len(ios)))
    in_flight(sum(spent))
    return out


def in_turn(verb, ios: list, unit: int) -> list:
    """ios one after another on this thread (one in flight at a time)."""
    out: list = [None] * len(ios)
    in_flight(_drain(verb, ios, unit, out, itertools.count()))
    return out


def _drain(verb, ios: list, unit: int, out: list, turns) -> int:
    """Take the next I/O from turns and run it until none is left: each one's result into out; returns the time they
    were in flight, from each one's call to its completion (or failure)."""
    spent = 0
    while (i := next(turns)) < len(ios):
        t, off, buf = ios[i]
        start = time.monotonic_ns()
        out[i] = done = _one(verb, t, off, buf, unit)
        spent += (done if done.__class__ is int else time.monotonic_ns()) - start
    return spent


def _one(verb, t: Target, off: int, buf: np.ndarray, unit: int):
    try:
        verb(t, off, buf, unit, None)
        return time.monotonic_ns()
    except Exception as e:  # noqa: BLE001 - handed back as this I/O's result
        return e


class DirectEngine(Engine):
    name, open_flags = "direct", os.O_DIRECT
    fio, summary = ("psync", 1, False), "O_DIRECT pread / pwrite"


class BufferedEngine(Engine):
    name = "buffered"
    fio, summary = ("psync", 0, True), "write + fdatasync, the page cache dropped before reads"

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        pwrite_all(t.fd, data, off, t.path, unit, times)  # into the page cache: host time, as the reference's save
        start = time.monotonic_ns()
        os.fdatasync(t.fd)
        device_call(start)
        drop_cached(t.fd, off, data.size)

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        drop_cached(t.fd, off, out.size)  # the advice call: host time, as the reference's
        start = time.monotonic_ns()
        pread_all(t.fd, out, off, t.path, unit, times)
        device_call(start)


class MmapEngine(Engine):
    name, maps, depth = "mmap", True, 1
    batch = "one copy after another (a mapping: no device queue to fill)"
    fio, summary = ("mmap", 0, False), "a mapping of the slab, msync after writes"

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        np.copyto(t.view[off:off + data.size], data)  # into the mapping's pages: host time
        start = time.monotonic_ns()
        t.mm.flush(off, data.size)  # msync: the write is on the device when put returns
        device_call(start)

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        t.mm.madvise(mmap.MADV_DONTNEED, off, out.size)
        drop_cached(t.fd, off, out.size)
        start = time.monotonic_ns()
        np.copyto(out, t.view[off:off + out.size])  # each page faulted in from the device
        device_call(start)

    def write_many(self, ios: list, unit: int) -> list:
        return in_turn(self.write, ios, unit)

    def read_many(self, ios: list, unit: int) -> list:
        return in_turn(self.read, ios, unit)


ENGINES = (DirectEngine(), BufferedEngine(), MmapEngine())  # this module's engines (catalog.find_media reads it)
