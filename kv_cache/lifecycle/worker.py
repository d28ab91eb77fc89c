"""A worker's own buffers (page-aligned, pre-touched, pinned with a GPU tier) and the check of an object read in
parts."""

from __future__ import annotations

import time

import numpy as np
import xxhash

from kv_cache.buffers import HUGE, aligned_buffer, direct_aligned
from kv_cache.lifecycle.payload import large_bytes


def buffer_bytes(max_object_bytes: int) -> int:
    """A worker buffer's size: its largest object, and at least a huge page (O_DIRECT pins one page, not 512)."""
    return max(max_object_bytes, HUGE)


class WorkerBuffers:
    """One worker's page-aligned, pre-touched buffers: one for its block, one for moves (`moves` blocks of it: a
    batch of demotions lands through it, run/sizing.demotion_depth), and (batched request I/O) one arena of `batch`
    slots, a block each, for the blocks it has in flight together."""

    def __init__(self, max_object_bytes: int, fake_io: bool, batch: int = 0, moves: int = 1):
        size = 4096 if fake_io else buffer_bytes(max_object_bytes)
        self.each = direct_aligned(max_object_bytes)
        self.block = aligned_buffer(size)
        self.scratch = aligned_buffer(size if fake_io else max(size, moves * self.each))
        self.arena = aligned_buffer(batch * self.each) if batch and not fake_io else None
        # fake I/O: one untouched allocation every block's buffer is a view of (a null tier reads or writes no byte
        # of it, so it takes no memory); an array made and freed for each block mapped and unmapped up to 64 MiB
        # each time, 21 % of a worker's time (the Mooncake trace's analysis, one worker: 403 requests/s; 545 without
        # it and with a hash-id prompt built in one pass)
        self.null = np.empty(max_object_bytes, dtype=np.uint8) if fake_io else None
        self._kept: dict[int | None, int] = {}  # buffer (None: the block's) -> bytes of a payload made there

    def _buffer(self, i: int | None, nbytes: int) -> np.ndarray:
        """The first nbytes of the i-th in-flight block's buffer (None: the block buffer); under fake I/O, of the
        null allocation (batched I/O without an arena: a new array)."""
        if self.null is not None:
            return self.null[:nbytes]
        if i is None:
            return self.block[:nbytes]
        if self.arena is None:
            return np.empty(nbytes, dtype=np.uint8)
        return self.arena[i * self.each:i * self.each + nbytes]

    def view(self, nbytes: int) -> np.ndarray:
        """The block buffer, to read into (what a payload made there left is forgotten)."""
        self._kept.pop(None, None)
        return self._buffer(None, nbytes)

    def batch_view(self, i: int, nbytes: int) -> np.ndarray:
        """The i-th in-flight block's buffer, to read into (what a payload made there left is forgotten)."""
        self._kept.pop(i, None)
        return self._buffer(i, nbytes)

    def lend(self, payloads, key: int, nbytes: int, i: int | None = None) -> tuple[np.ndarray, range]:
        """key's payload to write from, for the i-th in-flight block (None: the block buffer's): PayloadPool.lend
        into that buffer, told what of the payload last made there is still there (nothing read into it since:
        view and batch_view forget it), so that a large one is made again by its stamps alone."""
        buf = self._buffer(i, nbytes)
        data, held = payloads.lend(key, buf, self._kept.pop(i, 0))
        if data is buf:  # made there (a pool slice lent instead leaves the buffer as it was, but says nothing)
            self._kept[i] = nbytes
        return data, held

    def lend_many(self, payloads, items: list[tuple[int, int]]) -> list[tuple[np.ndarray, range]]:
        """lend() of each (key, nbytes) for the in-flight block of its index, the pool's lends made together
        (PayloadPool.lend_many)."""
        bufs = [self._buffer(i, nbytes) for i, (_, nbytes) in enumerate(items)]
        lent = payloads.lend_many([k for k, _ in items], bufs, [self._kept.pop(i, 0) for i in range(len(items))])
        for i, (data, _) in enumerate(lent):
            if data is bufs[i]:  # made there (see lend)
                self._kept[i] = bufs[i].size
        return lent

    def verified(self, i: int | None, data: np.ndarray) -> None:
        """A block read into the i-th in-flight block's buffer (None: the block buffer's) was found intact by its
        bytes (its checksum, or every byte): a LARGE payload there is kept as one made there (large_bytes)."""
        kept = large_bytes(data)
        if kept:
            self._kept[i] = kept

    def pinned(self) -> list[np.ndarray]:
        """Every buffer a GPU tier copies to or from directly (registered as pinned before the clock)."""
        return [self.block, self.scratch] + ([self.arena] if self.arena is not None else [])


class PartsCheck:
    """The verification of an object read part by part (parts.py): its XXH3-64 taken incrementally and compared at
    the end (the same digest as the whole object's), or each part's stamps or bytes checked as it arrives."""

    def __init__(self, payloads, key: int, mode: str, digest: int | None, whole: int):
        self.payloads, self.key, self.digest, self.whole = payloads, key, digest, whole
        self.mode = "full" if mode == "checksum" and digest is None else mode  # written elsewhere: every byte
        self.hash = xxhash.xxh3_64() if self.mode == "checksum" else None
        self.ok = True
        self.ns = 0  # the time spent checking (the reference split's host part)

    def __call__(self, offset: int, part: np.ndarray) -> None:
        start = time.monotonic_ns()
        if self.hash is not None:
            self.hash.update(part)
        elif self.ok:
            self.ok = self.payloads.check(self.key, part, self.mode, None, offset, self.whole)
        self.ns += time.monotonic_ns() - start

    def intact(self) -> bool:
        return self.ok if self.hash is None else self.hash.intdigest() == self.digest
