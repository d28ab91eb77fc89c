"""Block payloads: incompressible bytes, unique per 4 KiB page, verifiable on read.

Vocabulary: the *pool* is random bytes prepared before the clock starts; a
block's payload is a pool slice chosen by its key, whose every 4 KiB *page*
then gets a 16-byte *stamp* (block key, page index and a magic tag). Stamps
make every page of every block unique, so storage-side dedup finds nothing
and a wrong, torn or stale block is detected on read. The random pool makes
the bytes incompressible within any compression window that a storage
array uses (its size is printed; a window larger than the pool could see
repeats across blocks, never within one page).

Verification modes: ``stamps`` checks every page's stamp (cheap, strided);
``full`` also compares every other byte against the pool; ``off`` skips.
"""

from __future__ import annotations

import numpy as np

from kv_cache.tiers.aligned import aligned_buffer

PAGE = 4096
WORDS_PER_PAGE = PAGE // 8
MAGIC = np.uint64(0x4B56_4243_0000_0000)  # "KVBC" in the high half; page index in the low half
POOL_SPAN_BYTES = 64 << 20                # distinct start offsets: 16,384 pages
SEGMENT_BYTES = 64 << 20                  # a larger block is filled segment by segment


class PayloadPool:
    """Builds and checks block payloads; thread-safe (read-only after construction)."""

    def __init__(self, seed: int, span_bytes: int = POOL_SPAN_BYTES):
        span_bytes = max(PAGE, span_bytes // PAGE * PAGE)
        self.pool = aligned_buffer(span_bytes + SEGMENT_BYTES)
        rng = np.random.default_rng([seed, 0x9A7])
        words = self.pool.view(np.uint64)
        words[:] = rng.integers(0, np.iinfo(np.uint64).max, size=words.size, dtype=np.uint64, endpoint=True)
        self.num_offsets = span_bytes // PAGE
        self._page_tags: dict[int, np.ndarray] = {}

    @property
    def nbytes(self) -> int:
        return self.pool.size

    def _segments(self, key: int, nbytes: int):
        """(start in block, pool offset, length) of each segment of key's payload."""
        for i, at in enumerate(range(0, nbytes, SEGMENT_BYTES)):
            mixed = ((int(key) + i * 0x632BE59BD9B4E019) * 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF
            yield at, (mixed >> 40) % self.num_offsets * PAGE, min(SEGMENT_BYTES, nbytes - at)

    def _tags(self, pages: int) -> np.ndarray:
        tags = self._page_tags.get(pages)
        if tags is None:
            tags = self._page_tags[pages] = MAGIC | np.arange(pages, dtype=np.uint64)
        return tags

    def fill(self, key: int, out: np.ndarray) -> None:
        """Write key's payload into out (length a multiple of 4 KiB)."""
        for at, off, n in self._segments(key, out.size):
            np.copyto(out[at:at + n], self.pool[off:off + n])
        words = out.view(np.uint64).reshape(-1, WORDS_PER_PAGE)
        words[:, 0] = np.uint64(int(key))
        words[:, 1] = self._tags(words.shape[0])

    def check(self, key: int, data: np.ndarray, mode: str) -> bool:
        """True when data is exactly what fill(key) wrote (stamps only, or every byte)."""
        if mode == "off":
            return True
        words = data.view(np.uint64).reshape(-1, WORDS_PER_PAGE)
        if not (np.array_equal(words[:, 0], np.full(words.shape[0], int(key), dtype=np.uint64))
                and np.array_equal(words[:, 1], self._tags(words.shape[0]))):
            return False
        if mode == "stamps":
            return True
        for at, off, n in self._segments(key, data.size):
            got = words[at // PAGE:(at + n) // PAGE, 2:]
            expected = self.pool[off:off + n].view(np.uint64).reshape(-1, WORDS_PER_PAGE)[:, 2:]
            if not np.array_equal(got, expected):
                return False
        return True
