"""Block payloads: incompressible bytes, unique per 4 KiB page, verifiable on read.

Vocabulary: the *pool* is random bytes prepared before the clock starts; a
block's payload is a pool slice at one of the *places* its key chooses
(the first whose pool pages no other payload in flight holds; fill() makes
the first), whose every 4 KiB *page* then gets a 16-byte *stamp* (block
key, page index and a magic tag that names the place). Stamps
make every page of every block unique, so storage-side dedup finds nothing
and a wrong, torn or stale block is detected on read. The random pool makes
the bytes incompressible within any compression window that a storage
array uses (its size is printed; a window larger than the pool could see
repeats across blocks, never within one page). A payload larger than a segment (64 MiB) is
the same pool bytes whatever its key, but for its stamps (LARGE): a buffer that held one is
made the next by stamping it again, as fio modifies its one buffer's words at each write.

Verification modes (``--verify``):
- ``checksum`` (default): an XXH3-64 hash of the whole block, taken just after
  it is written and kept in the cache's index, is checked on every read. A
  changed block passes with probability 2^-64 (fio's ``verify=xxhash``
  family). XXH3 runs at 30+ GB/s per core from memory and releases the GIL;
  it replaced CRC32C (~16 GB/s), whose cost at write and at read was the
  largest single share of the generator's CPU with small blocks (issue 16). A block written by another
  process (shared storage, hand-off) has no recorded checksum, and one that
  another process wrote again over ours (from another of the key's places)
  has another: either is compared byte for byte against its regenerated
  payload instead.
- ``full``: every byte compared against the regenerated payload (slower, exact).
- ``stamps``: only the 16-byte stamp of each 4 KiB page: catches a misplaced,
  stale or torn page, not bytes corrupted inside a page (0.4 % of the block).
- ``off``: nothing checked.
"""

from __future__ import annotations

import threading

import numpy as np
import xxhash

from kv_cache.buffers import aligned_buffer

PAGE = 4096
WORDS_PER_PAGE = PAGE // 8
MAGIC = np.uint64(0x4B56_4243_0000_0000)  # "KVBC" in the high half; page index in the low half
POOL_SPAN_BYTES = 64 << 20                # distinct start offsets: 16,384 pages
SEGMENT_BYTES = 64 << 20                  # a larger block is filled segment by segment
REGION_BYTES = 256 << 10                  # one lock per 256 KiB of pool: a payload lent in place holds those it spans
# NOTE: a block's payload may lie at any of PLACES places in the pool, the one taken said in its stamps' tag
# ("KVBC" + place: "KVBC" to "KVBR"). With one place, a batch of writes found the pool pages of 45 % of its
# payloads held by another payload in flight (4 workers x 32 blocks of 512 KiB over a 64 MiB pool) and copied
# each of those into its buffer: 21 % of the workers' CPU (issue 48). A lend tries the places in turn (3.2 %
# copied with 8 of them, 1.4 % with 16: the held regions come in bursts); fill() makes place 0.
PLACES = 16
PLACE_SHIFT = 32  # a place is added to the tag's high half: "KVBC" + place
PLACE_TAG_PAGES = SEGMENT_BYTES // PAGE  # each place's tags kept for payloads up to one segment: 1 MiB in all
# NOTE: a payload larger than a segment takes its segments' pool bytes from places that do not depend on its key
# (its stamps, in every page, name the key): every such payload of a place is the same bytes but for the stamps,
# as fio's buffer is the same but for its scrambled words. A buffer that held one is made the next by stamping it
# again (lend's `kept`): 0.006 CPU-s a GiB, against 0.15 for the copy of 80 MiB (llama70b's 256-token block)
# from the pool, which took the whole program to 1.6-1.9x fio's CPU a GiB at 80 MiB blocks (issue 48).
LARGE = 0
# NOTE: a pool may hold copies of its bytes (pool_copies): a lend whose place's regions are held in one copy takes the
# same place in the next, so the stamps, the offsets and what a check compares do not change with the count (another
# process, with more workers and more copies, makes and checks the same payloads). A batch's payloads in flight grow
# with workers x --max-inflight x block: with 4 workers of 32 blocks of 2 MiB (256 MiB) over one 128 MiB pool, 46 % of
# the lends found every place held and copied their payload (0.18 CPU-s a GiB; 0.13 with the bytes in flight at most
# half the pool); 16 workers of 512 KiB blocks, 53 % (issue 48).
MIX, SEGMENT_MIX, PLACE_MIX = 0x9E3779B97F4A7C15, 0x632BE59BD9B4E019, 0xD6E8FEB86659FD93  # a place's offset, mixed
MASK64 = 0xFFFF_FFFF_FFFF_FFFF
PLACE_ADDS = tuple(place * PLACE_MIX * MIX & MASK64 for place in range(PLACES))  # each place's term of the product
MOST_COPIES = 8  # 1 GiB at most, whatever the run: 16 workers of 32 blocks of 2 MiB (1 GiB in flight) still copy some


def pool_bytes(copies: int = 1, span_bytes: int = POOL_SPAN_BYTES) -> int:
    """The memory a pool of copies holds: each copy its span and a segment's reach beyond it."""
    return copies * (span_bytes + SEGMENT_BYTES)


def pool_copies(in_flight: int, span_bytes: int = POOL_SPAN_BYTES) -> int:
    """How many copies of a pool of span_bytes keep the payloads lent at once, in_flight bytes, within half of it:
    at least one, at most MOST_COPIES."""
    return max(1, min(MOST_COPIES, -(-2 * in_flight // pool_bytes(1, span_bytes))))


def stamp_bytes(largest: int, in_flight: int) -> int:
    """The most the stamps hold, for payloads up to largest bytes and in_flight bytes being checked at once: the
    tags (8 bytes a page of the largest), each place's (8 a page each, up to a segment) and a check's rows (24 a
    page in flight: the key's column, the place's tags made for a part past a segment, the comparison)."""
    pages = largest // PAGE
    return pages * 8 + min(pages, PLACE_TAG_PAGES) * 8 * PLACES + in_flight // PAGE * 24


def place_of(data: np.ndarray) -> int:
    """Which of its places in the pool a payload (or a part of one) was made from, as its first page's tag says;
    -1 when that word is no payload's tag."""
    if data.size < PAGE:
        return -1
    place = (int(data[:16].view(np.uint64)[1]) - int(MAGIC)) >> PLACE_SHIFT
    return place if 0 <= place < PLACES else -1


class PayloadPool:
    """Builds and checks block payloads; thread-safe (the pool changes after construction only in its stamp
    words, in the pool regions a lend() holds)."""

    def __init__(self, seed: int, span_bytes: int = POOL_SPAN_BYTES, copies: int = 1):
        span_bytes = max(PAGE, span_bytes // PAGE * PAGE)
        self.copy_bytes = pool_bytes(1, span_bytes)  # one copy: what fill() and check() read (the first)
        self._all = aligned_buffer(self.copy_bytes * copies)
        self.pool = self._all[:self.copy_bytes]
        rng = np.random.default_rng([seed, 0x9A7])
        words = self.pool.view(np.uint64)
        words[:] = rng.integers(0, np.iinfo(np.uint64).max, size=words.size, dtype=np.uint64, endpoint=True)
        for c in range(1, copies):
            np.copyto(self._all[c * self.copy_bytes:(c + 1) * self.copy_bytes], self.pool)
        self._copy_starts = tuple(range(0, self._all.size, self.copy_bytes))
        self.num_offsets = span_bytes // PAGE
        # NOTE: one array of tags, for the most pages seen, sliced for fewer. One per page count grew without
        # bound in whole-request mode, where nearly every object has a size of its own: 24 MiB for each distinct
        # 4 GiB object (the MLPerf reference's shape filled tens of GiB this way).
        self._page_tags = np.zeros(0, dtype=np.uint64)
        self._by_place = np.zeros((PLACES, 0), dtype=np.uint64)  # each place's tags, pages up to a segment's
        # NOTE: which pool regions a lent payload holds, one byte each, under one lock: a lend tries 2.7 places on
        # average where 4 workers write 32 blocks of 512 KiB at once, and a lock a region took 4.7 us a try (each
        # region acquired, and let go where a later one was held); a search of the map is one call (issue 48)
        self._held = bytearray(-(-self._all.size // REGION_BYTES))
        self._held_lock = threading.Lock()
        # NOTE: every pool page's two stamp words as two columns, made once: a lent payload's stamps are two slices
        # of them, where a view of each payload made per lend (view, reshape, column) was half its stamp's time
        pages = self._all.view(np.uint64).reshape(-1, WORDS_PER_PAGE)
        self._key_words, self._tag_words = pages[:, 0], pages[:, 1]

    @property
    def nbytes(self) -> int:
        return self._all.size

    @property
    def host_memory(self) -> np.ndarray:
        """Every copy: the memory a payload is lent from (a GPU registers it for its copies)."""
        return self._all

    def _offset(self, key: int, segment: int, place: int = 0, nbytes: int = SEGMENT_BYTES) -> int:
        """Pool offset of a segment of key's payload at one of its places. Place 0 starts in the span; another
        place of a payload of nbytes anywhere it fits in the whole pool (twice the span's room for a lend)."""
        mixed = ((int(key) + segment * SEGMENT_MIX + place * PLACE_MIX) * MIX) & MASK64
        starts = (self.copy_bytes - nbytes) // PAGE + 1 if place else self.num_offsets
        return (mixed >> 40) % starts * PAGE

    def _segments(self, key: int, nbytes: int, offset: int = 0, place: int = 0,
                  whole: int = 0) -> list[tuple[int, int, int]]:
        """(start in the range, pool offset, length) of each segment of key's payload over the range of nbytes
        from offset in the object (a part of a larger one, --io-chunk-mb, whole bytes in all)."""
        if max(whole, offset + nbytes) > SEGMENT_BYTES:
            key = LARGE
        if not offset and nbytes <= SEGMENT_BYTES:  # one segment: the hot path of every block written
            return [(0, self._offset(key, 0, place, nbytes), nbytes)]
        out, at = [], offset
        while at < offset + nbytes:
            i, within = divmod(at, SEGMENT_BYTES)
            n = min(SEGMENT_BYTES - within, offset + nbytes - at)
            out.append((at - offset, self._offset(key, i, place) + within, n))
            at += n
        return out

    def _tags(self, pages: int) -> np.ndarray:
        tags = self._page_tags
        if tags.size < pages:  # replaced whole, never changed in place: a reader keeps the one it took
            tags = self._page_tags = MAGIC | np.arange(pages, dtype=np.uint64)
        return tags[:pages]

    def _place_tags(self, first: int, pages: int, place: int) -> np.ndarray:
        """The tags of pages first.. of a payload at place: each place's row kept for payloads up to a segment
        (an add into a new array costs a 512 KiB block's stamp a third more); beyond, made for the call."""
        end = first + pages
        if end > PLACE_TAG_PAGES:
            return self._tags(end)[first:] + np.uint64(place << PLACE_SHIFT)
        rows = self._by_place
        if rows.shape[1] < end:  # replaced whole, never changed in place: a reader keeps the one it took
            places = np.arange(PLACES, dtype=np.uint64) << np.uint64(PLACE_SHIFT)
            rows = self._by_place = self._tags(end)[None, :] + places[:, None]
        return rows[place, first:end]

    @property
    def template_bytes(self) -> int:
        """What the tags hold: 8 bytes per page of the largest payload built or checked so far, and each place's
        8 a page up to a segment's."""
        return self._page_tags.nbytes + self._by_place.nbytes

    def fill(self, key: int, out: np.ndarray, offset: int = 0, place: int = 0, whole: int = 0) -> None:
        """Write key's payload into out (length a multiple of 4 KiB); offset: out is the part of the object that
        starts there (a multiple of 4 KiB), the same bytes as that range of the whole payload (of whole bytes,
        the object's size: whether it is LARGE); place: which of its places in the pool (place_of() of the
        payload as written)."""
        for at, off, n in self._segments(key, out.size, offset, place, whole):
            np.copyto(out[at:at + n], self.pool[off:off + n])
        self._stamp(key, out, offset // PAGE, place)

    def lend(self, key: int, out: np.ndarray, kept: int = 0) -> tuple[np.ndarray, range]:
        """key's payload to write from, without copying it where it can be: (the payload, the pool regions held).

        A one-segment payload is a pool slice itself, stamped in place, its pool regions held until
        give_back(held): the same bytes as fill(key, place=v) for the first of its places v whose regions are free,
        without its copy (at 512 KiB blocks on a fast device, the copy of every block written was ~15 % of the
        generator's CPU; issue 16). Only the stamp words change in the pool, and nothing reads them there: fill()
        overwrites them and the full check skips them. Where every place has a region held (other payloads lent
        from the same pool pages, by this thread's batch or another's), or the payload is larger (its segments lie
        apart in the pool), it is filled into out at place 0, which is returned with no region held: a lend never
        waits for a region, so a batch may hold many payloads while others lend theirs. kept: how many bytes of out
        still hold a payload larger than a segment (made there by a lend, or read there and found intact by its
        bytes: large_bytes) that has not been written over since; a larger payload that fits in them is made by
        stamping out again.
        """
        return self.lend_many([key], [out], [kept])[0]

    def lend_many(self, keys: list[int], outs: list[np.ndarray], kept: list[int]) -> list[tuple[np.ndarray, range]]:
        """lend() of each key into its out (kept: each out's), as the calls one after another would lend them (the
        same places, the same bytes), the places found under one hold of the region map (a lock a lend, and one a
        give_back, were a tenth of a batched write's Python at 512 KiB blocks, issue 48)."""
        with self._held_lock:
            taken = [self._take(k, o.size) if o.size <= SEGMENT_BYTES else None for k, o in zip(keys, outs)]
        lent = []
        for key, out, got, c in zip(keys, outs, taken, kept):
            if got is not None:
                at, place, held = got
                first, end = at // PAGE, (at + out.size) // PAGE
                self._put_stamps(self._key_words[first:end], self._tag_words[first:end], key, 0, place)
                lent.append((self._all[at:at + out.size], held))
                continue
            if out.size > SEGMENT_BYTES and c >= out.size:  # the same bytes (LARGE) but for the stamps
                self._stamp(key, out)
            else:
                self.fill(key, out)
            lent.append((out, range(0)))
        return lent

    def give_back_many(self, helds: list[range]) -> None:
        """give_back() of each, under one hold of the map."""
        with self._held_lock:
            for held in helds:
                if held:
                    self._held[held.start:held.stop] = bytes(len(held))

    place_of = staticmethod(place_of)  # what a simulated tier asks of a block it keeps no bytes of

    def _take(self, key: int, nbytes: int) -> tuple[int, int, range] | None:
        """The held lock taken: the first of key's places (each in every copy in turn) whose pool regions no lent
        payload holds, taken: (its pool offset, the place, the regions held); None when every one is held."""
        # _offset(key, 0, place, nbytes), key's product taken once: (a + b) * c == a*c + b*c
        mixed, starts, spans = int(key) * MIX, (self.copy_bytes - nbytes) // PAGE + 1, self.num_offsets
        held_map, free = self._held, self._held.find
        for place in range(PLACES):
            off = (((mixed + PLACE_ADDS[place]) & MASK64) >> 40) % (starts if place else spans) * PAGE
            for start in self._copy_starts:  # the place in each copy in turn
                at = start + off
                first, end = at // REGION_BYTES, (at + nbytes - 1) // REGION_BYTES + 1
                if free(1, first, end) < 0:  # no region of it held
                    held_map[first:end] = b"\x01" * (end - first)
                    return at, place, range(first, end)
        return None

    def give_back(self, held: range) -> None:
        """Let go of the pool regions a lend() held (once the payload is written)."""
        self.give_back_many([held])

    def _stamp(self, key: int, out: np.ndarray, first_page: int = 0, place: int = 0) -> None:
        words = out.view(np.uint64).reshape(-1, WORDS_PER_PAGE)
        self._put_stamps(words[:, 0], words[:, 1], key, first_page, place)

    def _put_stamps(self, key_words: np.ndarray, tag_words: np.ndarray, key: int, first_page: int,
                    place: int) -> None:
        """Each page's stamp into its first two words (given as columns: a payload's own, or the pool's)."""
        # Written into the page words themselves, no (pages, 2) rows made first: the first pass brings each
        # page's line in, the second finds it there (3.3 against 4.7 us a 512 KiB block from a cold pool, issue 48).
        tag_words[:] = self._place_tags(first_page, tag_words.size, place)
        key_words[:] = key

    def check(self, key: int, data: np.ndarray, mode: str, digest: int | None = None, offset: int = 0,
              whole: int = 0) -> bool:
        """True when data is what fill(key) wrote: by its checksum (digest: the XXH3-64 taken at write), its
        stamps only, or every byte. offset: data is the part of the object (of whole bytes) that starts there
        (checksum mode checks a whole object: a part's digest is taken by the caller, incrementally)."""
        if mode == "off":
            return True
        if mode == "checksum":
            if digest is not None and block_digest(data) == digest:
                return True
            # No digest: written elsewhere (another rank, a prefill node). Another digest: the same key written
            # again over ours in shared storage, from another of its places (the two writers' payloads differ).
            # Either way every byte is compared: a block damaged anywhere still fails.
            mode = "full"
        words = data.view(np.uint64).reshape(-1, WORDS_PER_PAGE)
        first, place = offset // PAGE, place_of(data)
        if place < 0:
            return False
        if not (np.array_equal(words[:, 0], np.full(words.shape[0], int(key), dtype=np.uint64))
                and np.array_equal(words[:, 1], self._place_tags(first, words.shape[0], place))):
            return False
        if mode == "stamps":
            return True
        return self._same_as_pool(key, data, words, offset, place, whole)

    def _same_as_pool(self, key: int, data: np.ndarray, words: np.ndarray, offset: int = 0,
                      place: int = 0, whole: int = 0) -> bool:
        for at, off, n in self._segments(key, data.size, offset, place, whole):
            got = words[at // PAGE:(at + n) // PAGE, 2:]
            expected = self.pool[off:off + n].view(np.uint64).reshape(-1, WORDS_PER_PAGE)[:, 2:]
            if not np.array_equal(got, expected):
                return False
        return True


def large_bytes(data: np.ndarray) -> int:
    """How many bytes of a LARGE payload data holds, its stamps aside, as lend's kept counts them: its size where it is
    one at place 0 (larger than a segment; the one place lend makes them at), else 0. Asked of a block read back and
    found intact by its bytes (its checksum, or every byte): the buffer it landed in makes the next by its stamps."""
    return data.size if data.size > SEGMENT_BYTES and place_of(data) == 0 else 0


def stamped_with(key: int, data: np.ndarray) -> bool:
    """True when every 4 KiB page of data carries key's stamp (the word at its start): a quick test, without the
    pool, that a block read from memory another process writes was not (partly) replaced by another block."""
    if data.size < PAGE or data.size % PAGE:
        return False
    return bool((data.view(np.uint64)[::WORDS_PER_PAGE] == np.uint64(key)).all())


def block_digest(data: np.ndarray) -> int:
    """XXH3-64 of a whole block (the GIL is released while it runs)."""
    return xxhash.xxh3_64_intdigest(data)
