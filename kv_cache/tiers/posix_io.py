"""Whole-buffer positional I/O: loop on short reads and writes.

NOTE: one write() moves at most 2,147,479,552 bytes on Linux (MAX_RW_COUNT),
so GB-sized blocks come back short; we also cut every call at 1 GiB.
``os.pwritev``/``os.preadv`` release the GIL during the system call.
"""

from __future__ import annotations

import errno
import os
import time

import numpy as np

from kv_cache.errors import RunFault

CHUNK = 1 << 30


def _fault(what: str, path: str, e: OSError) -> RunFault:
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return RunFault(f"disk full while writing {path}: {e.strerror}; free space or lower --nvme-gb.")
    return RunFault(f"{what} of {path} failed: {e.strerror} (errno {e.errno}).")


def _transfer_all(syscall, what: str, fd: int, buf: np.ndarray, offset: int, path: str, unit: int = CHUNK,
                  times: list | None = None) -> None:
    """unit: the most one call moves (an engine's I/O unit); times: gets (ns, bytes) of every call."""
    total, done = buf.nbytes, 0
    try:
        if times is None and total <= min(unit, CHUNK):  # one call, the hot path of every block: no view to cut
            done = syscall(fd, [buf], offset)
            if done == total:
                return
        view = memoryview(buf).cast("B")  # a short first call (rare) or several: the loop moves the rest
        while done < total:
            piece = [view[done:done + min(unit, CHUNK, total - done)]]
            if times is None:  # the common case: no clock reads around the system call
                n = syscall(fd, piece, offset + done)
            else:
                start = time.monotonic_ns()
                n = syscall(fd, piece, offset + done)
                times.append((time.monotonic_ns() - start, n))
            if n <= 0:
                raise OSError(errno.EIO, f"unexpected end of file at byte {offset + done}" if what == "read"
                              else "write moved no byte")
            done += n
    except OSError as e:
        raise _fault(what, path, e) from None


def pwrite_all(fd: int, buf: np.ndarray, offset: int, path: str = "", unit: int = CHUNK,
               times: list | None = None) -> None:
    """Write all of buf at offset, however many calls it takes (at most unit bytes each)."""
    _transfer_all(os.pwritev, "write", fd, buf, offset, path, unit, times)


def pread_all(fd: int, out: np.ndarray, offset: int, path: str = "", unit: int = CHUNK,
              times: list | None = None) -> None:
    """Fill all of out from offset, however many calls it takes (at most unit bytes each)."""
    _transfer_all(os.preadv, "read", fd, out, offset, path, unit, times)


def drop_cached(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to drop the page cache of a (clean) range, so the next read hits the device."""
    os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_DONTNEED)
