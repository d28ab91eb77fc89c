"""Page-aligned, pre-touched buffers.

NOTE: numpy allocations are not page-aligned, and O_DIRECT refuses misaligned
buffers with EINVAL; anonymous mmap memory is aligned. Every page is touched
at allocation so that first-touch page faults never land inside a timed
operation (they halve copy speed on fresh memory).
"""

from __future__ import annotations

import mmap

import numpy as np

PAGE = mmap.PAGESIZE


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of nbytes (rounded up to a page) on page-aligned memory, pre-faulted."""
    size = max(PAGE, -(-nbytes // PAGE) * PAGE)
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    arr = np.frombuffer(mm, dtype=np.uint8)
    arr[::PAGE] = 1  # fault every page in now, not during a timed copy
    arr[::PAGE] = 0
    return arr


def is_aligned(arr: np.ndarray, alignment: int = PAGE) -> bool:
    return arr.ctypes.data % alignment == 0
