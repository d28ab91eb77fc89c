"""The NVMe tier's I/O engines, as fio's ioengines: how bytes move between a buffer and a file. One table, ENGINES:
the --io-engine setting's choices, --help, the fio job an --io-trace writes and the submission rules read it. An
engine is one class (here, or in a module of its own that registers it, as uring.py does)."""

from __future__ import annotations

import mmap
import os

import numpy as np

from kv_cache.tiers.base import DIRECT_IO
from kv_cache.tiers.posix_io import drop_cached, pread_all, pwrite_all


class Target:
    """An open file an engine moves bytes to and from (a slab, or one block's file)."""

    def __init__(self, path: str, fd: int):
        self.path, self.fd = path, fd
        self.mm: mmap.mmap | None = None
        self.view: np.ndarray | None = None


class Engine:
    """How bytes move between a buffer and a file (fio's ioengine): the ops every layout calls."""

    name = ""
    open_flags = 0           # added to os.open's flags
    tier_flags: frozenset = frozenset()
    maps = False             # moves bytes through a mapping of the whole file (slab layout only)
    fio = ("psync", 0, False)  # what fio runs for it: (ioengine, direct, fsync after each write)
    summary = ""             # one line for --help

    @property
    def direct(self) -> bool:
        """It bypasses the page cache with O_DIRECT (aligned buffers; the submission rules ask for one)."""
        return bool(self.open_flags & os.O_DIRECT)

    def unavailable(self) -> str:
        """Why this host cannot run it ("" when it can)."""
        return ""

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        pwrite_all(t.fd, data, off, t.path, unit, times)

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        pread_all(t.fd, out, off, t.path, unit, times)


class DirectEngine(Engine):
    name, open_flags, tier_flags = "direct", os.O_DIRECT, frozenset({DIRECT_IO})
    fio, summary = ("psync", 1, False), "O_DIRECT pread / pwrite"


class BufferedEngine(Engine):
    name = "buffered"
    fio, summary = ("psync", 0, True), "write + fdatasync, the page cache dropped before reads"

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        pwrite_all(t.fd, data, off, t.path, unit, times)
        os.fdatasync(t.fd)
        drop_cached(t.fd, off, data.size)

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        drop_cached(t.fd, off, out.size)
        pread_all(t.fd, out, off, t.path, unit, times)


class MmapEngine(Engine):
    name, maps = "mmap", True
    fio, summary = ("mmap", 0, False), "a mapping of the slab, msync after writes"

    def write(self, t: Target, off: int, data: np.ndarray, unit: int, times: list | None) -> None:
        np.copyto(t.view[off:off + data.size], data)
        t.mm.flush(off, data.size)  # msync: the write is on the device when put returns

    def read(self, t: Target, off: int, out: np.ndarray, unit: int, times: list | None) -> None:
        t.mm.madvise(mmap.MADV_DONTNEED, off, out.size)
        drop_cached(t.fd, off, out.size)
        np.copyto(out, t.view[off:off + out.size])


ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    """An engine's module adds it here on import (the tiers package is imported whole before a stack is built): the
    one table the setting's choices, --help, the fio job and the submission rules read."""
    ENGINES[engine.name] = engine
    return engine


for _e in (DirectEngine(), BufferedEngine(), MmapEngine()):
    register_engine(_e)


def engines() -> dict[str, Engine]:
    """Every engine, the other modules of the tiers package imported first (an engine of its own registers then)."""
    from kv_cache.tiers.registry import kinds_by_name

    kinds_by_name()
    return ENGINES


def usable_engines() -> dict[str, Engine]:
    """The engines this host can run (io_uring may be refused by the kernel or a container's seccomp)."""
    return {n: e for n, e in engines().items() if not e.unavailable()}
