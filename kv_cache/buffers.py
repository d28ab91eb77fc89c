"""Page-aligned, pre-touched buffers.

NOTE: numpy allocations are not page-aligned, and O_DIRECT refuses misaligned
buffers with EINVAL; anonymous mmap memory is aligned. Every page is touched
at allocation so that first-touch page faults never land inside a timed
operation (they halve copy speed on fresh memory).
"""

from __future__ import annotations

import ctypes
import errno
import mmap

import numpy as np

from kv_cache.errors import UserError

PAGE = mmap.PAGESIZE
# NOTE: O_DIRECT pins a buffer's pages for every I/O (get_user_pages): one 2 MiB huge page instead of 512
# small ones makes that, and the TLB misses of copying and hashing through the payload pool, cheaper.
HUGE = 2 << 20


def direct_aligned(nbytes: int) -> int:
    """nbytes rounded up to 4 KiB, O_DIRECT's alignment: a block's stride in a buffer that holds several (a worker's
    arena and scratch, and the budget that counts them, agree on it)."""
    return -(-nbytes // 4096) * 4096


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of nbytes (rounded up to a page) on page-aligned memory, pre-faulted; from
    2 MiB up, on transparent huge pages where the kernel gives them."""
    size = max(PAGE, -(-nbytes // PAGE) * PAGE)
    huge = size >= HUGE and hasattr(mmap, "MADV_HUGEPAGE")
    try:
        mm = mmap.mmap(-1, size + (HUGE if huge else 0), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as e:
        if e.errno != errno.ENOMEM:
            raise
        # NOTE: the memory budget was checked against the host's (or the cgroup's) available memory; what refuses
        # here is a limit it cannot see: the process's address space (ulimit -v) or the kernel's overcommit rule
        raise UserError(f"could not map {size / 2**30:.2f} GiB of memory for a buffer: this process's address-space "
                        f"limit (ulimit -v) or the kernel's overcommit rule refused it; raise that limit, or lower "
                        f"--cpu-mem-gb or --workers.") from None
    arr = np.frombuffer(mm, dtype=np.uint8)
    if huge:
        mm.madvise(mmap.MADV_HUGEPAGE)  # asked for: THP's default mode is often "madvise" (this VM's)
        start = -arr.ctypes.data % HUGE
        arr = arr[start:start + size]
    arr[::PAGE] = 1  # fault every page in now, not during a timed copy
    arr[::PAGE] = 0
    return arr


def is_aligned(arr: np.ndarray, alignment: int = PAGE) -> bool:
    return arr.ctypes.data % alignment == 0


def address(arr: np.ndarray) -> int:
    """Where arr's first byte is: a third of the time of arr.ctypes.data (0.27 against 0.89 us, which makes an
    object each time), paid on every I/O a batch hands the kernel (issue 48); ctypes.data for an array that
    lends no writable contiguous buffer (read-only, empty or strided)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))
    except (TypeError, ValueError, BufferError):
        return arr.ctypes.data
