"""The NVMe tier's I/O engines, as fio's ioengines: how bytes move between a buffer and a file. One table, ENGINES:
the --io-engine setting's choices, --help, the fio job an --io-trace writes and the submission rules read it. An
engine is one class, here or in a module of its own (uring.py): a module's ENGINES declares what it defines, and
tiers.catalog.find_media() collects them (nothing registers on import)."""

from __future__ import annotations

import mmap
import os

import numpy as np

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
    name, open_flags = "direct", os.O_DIRECT
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


ENGINES = (DirectEngine(), BufferedEngine(), MmapEngine())  # this module's engines (catalog.find_media reads it)
