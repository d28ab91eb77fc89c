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
from contextlib import contextmanager

import numpy as np

from kv_cache.tiers.base import device_call, in_flight
from kv_cache.tiers.posix_io import drop_cached, pread_all, pwrite_all


class Target:
    """An open file an engine moves bytes to and from (a slab, or one block's file)."""

    def __init__(self, path: str, fd: int):
        self.path, self.fd = path, fd
        self.mm: mmap.mmap | None = None
        self.view: np.ndarray | None = None


POOL_THREADS = 8  # a pool's threads where no batch depth was given (a handoff folder's files, the contract tests)
POOL_MOST = 64    # a worker's pool threads at most (io_uring's ring holds as many I/Os)
POOL_ALL = 1024   # the prepared pools' threads in all at most (about 15 KiB each: within the budget's overhead),
# so 200 workers get POOL_THREADS each, not 64


class Engine:
    """How bytes move between a buffer and a file (fio's ioengine): the ops every layout calls. A batch (read_many,
    write_many: (target, offset, buffer) each) goes over the calling worker's pool of threads (pools: the tier's
    Pools), one thread for each I/O its batches hold (POOL_MOST at most), so the device sees the batch's depth; an
    engine with a native batch (io_uring) overrides them."""

    name = ""
    open_flags = 0           # added to os.open's flags
    maps = False             # moves bytes through a mapping of the whole file (slab layout only)
    fio = ("psync", 0, False)  # what fio runs for it: (ioengine, direct, fsync after each write)
    depth = POOL_MOST        # the most of a batch's I/Os it keeps in flight per worker
    pooled = True            # a batch goes over a worker's pool of threads (the tier makes them: Pools)
    cuts_units = False       # its batch verbs cut an I/O into units and time each (their `units`): the tier need not
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

    batch = "a pool of threads per worker, one for each I/O of its batch"  # how a batch reaches the device

    def write_many(self, ios: list[tuple[Target, int, np.ndarray]], unit: int, pools: Pools | None = None) -> list:
        """Each I/O's completion time (monotonic ns), or the exception it raised (pools: the tier's; without them,
        one after another)."""
        return _pooled(self.write, ios, unit, pools)

    def read_many(self, ios: list[tuple[Target, int, np.ndarray]], unit: int, pools: Pools | None = None) -> list:
        return _pooled(self.read, ios, unit, pools)


class _Run:
    """One run() of a pool: its task, how many threads run it, and the lock the last of them releases."""

    __slots__ = ("task", "n", "ended", "done", "failed")

    def __init__(self, task, n: int):
        self.task, self.n, self.failed = task, n, None
        self.ended = itertools.count(1)  # next() on it is atomic under the GIL: exactly one thread sees n
        self.done = threading.Lock()
        self.done.acquire()


class IoPool:
    """A worker's I/O threads: run(task, n) hands task to n of them and returns once each has run it.
    A SimpleQueue, not a ThreadPoolExecutor: its submit() takes a lock that every executor of the process shares
    (the workers' pools all contended for it) and makes a future a task; with 4 workers of 8 threads, at 512 KiB,
    submit() was 18 % of the interpreter's time (py-spy --gil, issue 48). The worker is woken once, by the last
    thread to finish, not by each (a wake is a system call, and on a VM an interrupt to another CPU)."""

    def __init__(self, threads: int):
        self.size = threads
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, name=f"kvbench-io-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def _serve(self) -> None:
        while (run := self._tasks.get()) is not None:
            try:
                run.task()
            except BaseException as e:  # noqa: BLE001 - handed to the worker that waits for it
                run.failed = run.failed or e
            if next(run.ended) == run.n:
                run.done.release()

    def run(self, task, n: int) -> None:
        """task on n of the pool's threads at once (n <= its threads); the first exception one raised, raised."""
        run = _Run(task, n)
        for _ in range(n):
            self._tasks.put(run)
        run.done.acquire()
        if run.failed is not None:
            raise run.failed

    def close(self) -> None:
        """Its threads end once the tasks handed to them are done (a sentinel each)."""
        for _ in self._threads:
            self._tasks.put(None)


class Pools:
    """A tier's I/O pools, one for each thread that moves a batch, of `threads` threads each: `prepared` of them
    started when the tier is made (before the clock: the workers and the demoter), a thread's own taken on its first
    batch; a pool whose thread ended goes to the next thread that asks (a trial's new workers), one made then only
    past them."""

    def __init__(self, threads: int, prepared: int = 0):
        self.threads = threads
        self._free = [IoPool(threads) for _ in range(prepared)]
        self._made = list(self._free)
        self._mine = threading.local()
        self._lock = threading.Lock()

    def mine(self) -> IoPool:
        pool = getattr(self._mine, "pool", None)
        if pool is None:
            with self._lock:
                pool = self._free.pop() if self._free else None
                if pool is None:
                    pool = IoPool(self.threads)
                    self._made.append(pool)
            self._mine.pool = pool
            weakref.finalize(threading.current_thread(), self._free.append, pool)  # list.append: atomic
        return pool

    def close(self) -> None:
        """Every pool's threads end once the tasks handed to them are done."""
        for pool in self._made:
            pool.close()
        self._made, self._free = [], []


def _pooled(verb, ios: list, unit: int, pools: Pools | None) -> list:
    """ios over this thread's pool: each of up to its threads takes the batch's next I/O as it finishes one, so the
    device sees that many at once and a batch costs a task a thread, not one an I/O (at 512 KiB a future per I/O was
    a tenth of a block's CPU)."""
    if pools is None or len(ios) == 1:
        return in_turn(verb, ios, unit)
    pool = pools.mine()
    out: list = [None] * len(ios)
    turns = itertools.count()  # next() on it is atomic under the GIL: each I/O is taken once
    spent: list[int] = []  # each pool thread's I/Os' time in flight (list.append is atomic under the GIL)
    pool.run(lambda: spent.append(_drain(verb, ios, unit, out, turns)), min(pool.size, len(ios)))
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


class Ranges:
    """The file ranges being read through the page cache, one read of a range at a time.
    NOTE: two workers reading one block at once shared its pages: the second's drop cannot evict the pages the first is
    faulting in or has mapped (and its unmap pulls them from under the first), so the device read them once for two
    counted reads (mmap, 4 workers, a preconditioned 0.25 GiB tier: the disk read 0.71x the bytes counted). The
    second waits for the first, then reads from the device; the wait is part of its block's latency."""

    def __init__(self) -> None:
        self._busy: set[tuple[str, int]] = set()
        self._free = threading.Condition(threading.Lock())

    @contextmanager
    def alone(self, t: Target, off: int):
        """Within: the only read of t's range at off."""
        key = (t.path, off)
        with self._free:
            while key in self._busy:
                self._free.wait()
            self._busy.add(key)
        try:
            yield
        finally:
            with self._free:
                self._busy.discard(key)
                self._free.notify_all()


class BufferedEngine(Engine):
    name = "buffered"
    fio, summary = ("psync", 0, True), "write + fdatasync, the page cache dropped before reads"
    reading = Ranges()

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        pwrite_all(t.fd, data, off, t.path, unit, times)  # into the page cache: host time, as the reference's save
        start = time.monotonic_ns()
        os.fdatasync(t.fd)
        device_call(start)
        drop_cached(t.fd, off, data.size)

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        with self.reading.alone(t, off):
            # NOTE: no readahead (fio's fadvise_hint on random I/O): the kernel's window (8 MiB on a VM here) filled
            # large folios reaching into the next units' and blocks' ranges, which their drops could not evict, so
            # they were read from the cache (--io-unit layer after --precondition: the disk read 0.12x the bytes)
            os.posix_fadvise(t.fd, 0, 0, os.POSIX_FADV_RANDOM)
            drop_cached(t.fd, off, out.size)  # the advice call: host time, as the reference's
            start = time.monotonic_ns()
            pread_all(t.fd, out, off, t.path, unit, times)
            device_call(start)


class MmapEngine(Engine):
    """NOTE: a block's range is unmapped after each move (MADV_DONTNEED), as fio's mmap engine does with direct=1:
    pages left mapped made the whole slab this process's resident memory over a run (peak RSS 7.4 GiB against a
    5.6 GiB budget with a 2 GiB slab). The page cache may keep them, clean after msync, as the kernel's to reclaim;
    a read drops its range first, so it comes from the device."""

    name, maps, depth, pooled = "mmap", True, 1, False
    batch = "one copy after another (a mapping: no device queue to fill)"
    fio, summary = ("mmap", 1, False), "a mapping of the slab, msync after writes, each range unmapped after its move"
    reading = Ranges()

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        np.copyto(t.view[off:off + data.size], data)  # into the mapping's pages: host time
        start = time.monotonic_ns()
        t.mm.flush(off, data.size)  # msync: the write is on the device when put returns
        device_call(start)
        t.mm.madvise(mmap.MADV_DONTNEED, off, data.size)

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        with self.reading.alone(t, off):
            t.mm.madvise(mmap.MADV_DONTNEED, off, out.size)
            drop_cached(t.fd, off, out.size)  # neither mapped nor cached: each page faults in from the device
            start = time.monotonic_ns()
            os.posix_fadvise(t.fd, off, out.size, os.POSIX_FADV_WILLNEED)  # the range read ahead, and only it
            np.copyto(out, t.view[off:off + out.size])  # each page faulted in from the device
            device_call(start)
            t.mm.madvise(mmap.MADV_DONTNEED, off, out.size)

    def write_many(self, ios: list, unit: int, pools: Pools | None = None) -> list:
        return in_turn(self.write, ios, unit)

    def read_many(self, ios: list, unit: int, pools: Pools | None = None) -> list:
        return in_turn(self.read, ios, unit)


ENGINES = (DirectEngine(), BufferedEngine(), MmapEngine())  # this module's engines (catalog.find_media reads it)
