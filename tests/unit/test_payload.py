"""Payloads: unique per 4 KiB page, incompressible, and checked on read."""

import lzma
import random
import threading
import time
import zlib

import numpy as np
import pytest

from kv_cache.buffers import aligned_buffer
from kv_cache.lifecycle.payload import (
    MOST_COPIES,
    PAGE,
    PLACES,
    POOL_SPAN_BYTES,
    SEGMENT_BYTES,
    PayloadPool,
    block_digest,
    place_of,
    pool_copies,
)
from kv_cache.lifecycle.worker import WorkerBuffers


@pytest.fixture(scope="module")
def pool():
    return PayloadPool(seed=3, span_bytes=8 << 20)


def block(pool, key, nbytes=256 * 1024, place=0):
    buf = aligned_buffer(nbytes)
    pool.fill(key, buf, place=place)
    return buf


def test_every_page_of_every_block_is_unique(pool):
    pages = set()
    for key in (1, 2, 3, 0xFFFF_FFFF_FFFF_FFFF):
        b = block(pool, key)
        for i in range(b.size // PAGE):
            pages.add(bytes(b[i * PAGE:(i + 1) * PAGE]))
    assert len(pages) == 4 * (256 * 1024 // PAGE)


def test_payload_does_not_compress(pool):
    data = bytes(block(pool, 42, 1 << 20))
    assert len(zlib.compress(data, 9)) / len(data) > 0.99
    assert len(lzma.compress(data[: 256 * 1024])) / (256 * 1024) > 0.99


def test_same_key_gives_same_bytes(pool):
    assert np.array_equal(block(pool, 7), block(pool, 7))


@pytest.mark.parametrize("mode", ["stamps", "full"])
def test_intact_block_passes(pool, mode):
    assert pool.check(11, block(pool, 11), mode)


def test_flipped_stamp_byte_is_caught_by_stamps(pool):
    b = block(pool, 11)
    b[5 * PAGE + 3] ^= 0x01  # inside page 5's key stamp
    assert not pool.check(11, b, "stamps")


def test_flipped_data_byte_is_caught_by_full_only(pool):
    b = block(pool, 11)
    b[5 * PAGE + 100] ^= 0x80
    assert pool.check(11, b, "stamps")  # stamps cover 16 bytes of each page
    assert not pool.check(11, b, "full")


def test_foreign_torn_and_stale_blocks_are_caught(pool):
    assert not pool.check(12, block(pool, 11), "stamps")  # another block's bytes
    torn = block(pool, 11)
    torn[torn.size // 2:] = block(pool, 99)[torn.size // 2:]
    assert not pool.check(11, torn, "stamps")
    zeroed = block(pool, 11)
    zeroed[PAGE:2 * PAGE] = 0  # a page never written (stale / hole)
    assert not pool.check(11, zeroed, "stamps")


def test_blocks_larger_than_a_segment(pool):
    b = block(pool, 5, SEGMENT_BYTES + 8 * PAGE)
    assert pool.check(5, b, "full")
    b[SEGMENT_BYTES + PAGE + 64] ^= 1
    assert not pool.check(5, b, "full")


def test_off_checks_nothing(pool):
    assert pool.check(1, np.zeros(PAGE, np.uint8), "off")


def _corrupt_one(rng, data: np.ndarray) -> None:
    i = int(rng.integers(0, data.size))
    data[i] ^= np.uint8(int(rng.integers(1, 256)))  # a changed byte, never the same value


def test_checksum_catches_every_changed_byte_and_stamps_do_not(pool):
    """fio's verify=xxhash standard: any changed byte of a read block is caught by the default mode.
    The stamps mode (16 bytes of each 4 KiB page) misses almost all of them: this test fails for it."""

    rng = np.random.default_rng(5)
    caught = {"checksum": 0, "stamps": 0, "full": 0}
    trials = 300
    for t in range(trials):
        b = block(pool, 1000 + t, 64 * 1024)
        digest = block_digest(b)
        _corrupt_one(rng, b)
        caught["checksum"] += not pool.check(1000 + t, b, "checksum", digest)
        caught["stamps"] += not pool.check(1000 + t, b, "stamps")
        caught["full"] += not pool.check(1000 + t, b, "full")
    assert caught["checksum"] == caught["full"] == trials
    assert caught["stamps"] < trials * 0.05


def test_checksum_without_a_recorded_digest_compares_every_byte(pool):
    """A block written by another process (shared storage, a prefill node) has no digest here."""
    b = block(pool, 77)
    assert pool.check(77, b, "checksum", None)
    b[5000] ^= 1
    assert not pool.check(77, b, "checksum", None)


def test_a_lent_payload_is_the_filled_payload_without_a_copy(pool):
    out = aligned_buffer(256 * 1024)
    view, held = pool.lend(9, out)
    try:
        assert np.shares_memory(view, pool.pool) and not np.shares_memory(view, out)  # no copy was made
        assert view.ctypes.data % PAGE == 0  # O_DIRECT writes from it
        assert np.array_equal(view, block(pool, 9))
    finally:
        pool.give_back(held)
    big = aligned_buffer(SEGMENT_BYTES + PAGE)
    view, held = pool.lend(9, big)  # segments apart in the pool: filled into out, nothing held
    assert view is big and not held and np.array_equal(big, block(pool, 9, big.size))


def test_a_place_held_in_one_copy_of_the_pool_is_lent_from_the_next_not_copied():
    """A key's payload lent again and again, none given back: a pool of c copies lends it in place PLACES x c times
    (each place in each copy; one in a later copy the same bytes and stamps as fill() makes), the next is filled into
    the worker's buffer."""
    for copies in (1, 2):
        pool = PayloadPool(seed=3, span_bytes=8 << 20, copies=copies)
        assert pool.nbytes == copies * ((8 << 20) + SEGMENT_BYTES)
        held = [pool.lend(9, aligned_buffer(256 * 1024)) for _ in range(PLACES * copies)]
        try:
            assert all(r for _, r in held)  # every one lent in place, none copied
            later = [v for v, _ in held if not np.shares_memory(v, pool.pool)]
            assert len(later) == (PLACES if copies == 2 else 0)
            for v in later:
                assert np.array_equal(v, block(pool, 9, v.size, place=place_of(v)))
            out = aligned_buffer(256 * 1024)
            view, regions = pool.lend(9, out)
            assert view is out and not regions  # every place of every copy held: a copy into the buffer
        finally:
            for _, r in held:
                pool.give_back(r)


def test_the_pool_s_copies_keep_the_payloads_in_flight_within_half_of_it():
    one = POOL_SPAN_BYTES + SEGMENT_BYTES
    assert pool_copies(0) == 1 and pool_copies(one // 2) == 1
    assert pool_copies(4 * 32 * (2 << 20)) == 4  # 4 workers of 32 blocks of 2 MiB: 256 MiB in flight
    assert pool_copies(16 * 32 * (512 << 10)) == 4 and pool_copies(16 * 32 * (2 << 20)) == MOST_COPIES


def test_lent_payloads_that_overlap_in_the_pool_never_change_under_each_other():
    """Writers whose payloads share pool pages: each must see only its own stamps until it gives back. 40 MiB
    payloads in a pool of 64 MiB + 64 KiB: any two of their places overlap."""
    small = PayloadPool(seed=4, span_bytes=64 * 1024)
    nbytes = 40 << 20
    bad = []

    def writer(keys):
        out = aligned_buffer(nbytes)
        for k in keys:
            view, held = small.lend(k, out)
            try:
                time.sleep(0.0005)  # the write's I/O: another writer runs meanwhile
                if not small.check(k, view, "stamps"):
                    bad.append(k)
            finally:
                small.give_back(held)

    threads = [threading.Thread(target=writer, args=([t, t + 4] * 10,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_a_batch_holds_many_lent_payloads_and_a_lend_never_waits():
    """A batch of writes lends each block's payload and holds them all until the batch is written. Two of them on
    the same pool pages (or another worker's on them) must not wait for each other: the lend that finds a region
    held at every place makes its payload in its own buffer instead (a lend that waited hung a batch on its own
    first payload). 40 MiB payloads in a pool of 64 MiB + 64 KiB: any two of their places overlap."""
    small = PayloadPool(seed=5, span_bytes=64 * 1024)
    nbytes = 40 << 20
    outs = [aligned_buffer(nbytes) for _ in range(3)]
    got: list = []

    def batch():
        got.extend(small.lend(k, outs[k]) for k in range(3))

    t = threading.Thread(target=batch, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "a lend waited for a region its own batch held"
    try:
        assert np.shares_memory(got[0][0], small.pool) and got[0][1]  # the first lent in place
        assert all(view is outs[k] and not held for k, (view, held) in enumerate(got) if k)  # the others: made
        for k, (view, _) in enumerate(got):
            assert small.check(k, view, "full"), k  # every payload whole while all are held
    finally:
        for _, held in got:
            small.give_back(held)
    view, held = small.lend(0, outs[0])  # all given back: in place again
    assert np.shares_memory(view, small.pool)
    small.give_back(held)


def test_a_lend_whose_first_place_is_held_takes_another_place_in_the_pool_not_a_copy():
    """A batch of writes lends many payloads at once, 4 workers x 32 blocks over a 64 MiB pool: with one place a
    key, 45 % of 512 KiB lends found a page held and copied their payload (issue 48). A payload may lie at any of
    PLACES places: the lend takes the first that is free, and the bytes it gives are what every check accepts."""
    pool = PayloadPool(seed=6, span_bytes=4 << 20)
    nbytes = 512 * 1024
    first, first_held = pool.lend(21, aligned_buffer(nbytes))
    out = aligned_buffer(nbytes)
    try:
        second, held = pool.lend(21, out)  # the same key again: its first place is held by the first lend
        try:
            assert np.shares_memory(second, pool.pool) and not np.shares_memory(second, first), \
                "the lend copied its payload where another place in the pool was free"
            assert place_of(first) == 0 and place_of(second) > 0
            for mode in ("stamps", "full"):
                assert pool.check(21, second, mode), mode
            assert not pool.check(22, second, "stamps")  # still the key's own stamps
            remade = aligned_buffer(nbytes)
            pool.fill(21, remade, place=place_of(second))
            assert np.array_equal(remade, second)  # a place is rebuilt exactly (a simulated tier's reads)
            torn = second.copy()
            torn[nbytes // 2:] = first[nbytes // 2:]  # half from the other place: the same key, torn
            assert not pool.check(21, torn, "stamps")
            moved = second.copy()
            moved[PAGE:2 * PAGE] = first[PAGE:2 * PAGE]  # one page from the other place
            assert not pool.check(21, moved, "full")
        finally:
            pool.give_back(held)
    finally:
        pool.give_back(first_held)


def test_the_same_key_written_again_from_another_place_over_ours_passes_and_damage_still_fails():
    """Engines sharing a Valkey namespace (the fleet's export) may both write a key: the object read back is the
    other writer's, made from another of the key's places, whose checksum is not the one this engine took at
    its write (the fleet test read it back wrong). It is a whole payload of the key: compared byte for byte."""
    pool = PayloadPool(seed=7, span_bytes=4 << 20)
    nbytes = 256 * 1024
    ours, theirs = aligned_buffer(nbytes), aligned_buffer(nbytes)
    pool.fill(31, ours)
    pool.fill(31, theirs, place=5)
    digest = block_digest(ours)
    assert pool.check(31, theirs, "checksum", digest)
    theirs[3 * PAGE + 77] ^= 1
    assert not pool.check(31, theirs, "checksum", digest)
    other = aligned_buffer(nbytes)
    pool.fill(32, other, place=5)
    assert not pool.check(31, other, "checksum", digest)  # another key's block is no copy of ours


def test_a_payload_with_no_payload_tag_has_no_place():
    assert place_of(np.zeros(PAGE, np.uint8)) == -1
    assert not PayloadPool(seed=6, span_bytes=1 << 20).check(0, np.zeros(PAGE, np.uint8), "full")


@pytest.mark.parametrize("place", [0, 1, 7])
@pytest.mark.parametrize("first_page", [0, SEGMENT_BYTES // PAGE - 4, SEGMENT_BYTES // PAGE + 4])
def test_every_page_s_stamp_names_its_key_its_index_and_its_place(pool, place, first_page):
    """Each place's tags are kept for the pages of a segment and made past it: either way page i of the object
    (a part of it from first_page on too) carries (key, "KVBC" + place, i)."""
    from kv_cache.lifecycle.payload import MAGIC, PLACE_SHIFT, WORDS_PER_PAGE

    out = aligned_buffer(8 * PAGE)
    pool.fill(0xABC, out, offset=first_page * PAGE, place=place)
    words = out.view(np.uint64).reshape(-1, WORDS_PER_PAGE)
    assert (words[:, 0] == 0xABC).all()
    pages = np.arange(first_page, first_page + 8, dtype=np.uint64)
    assert np.array_equal(words[:, 1], (MAGIC | pages) + np.uint64(place << PLACE_SHIFT))
    assert place_of(out) == place and pool.check(0xABC, out, "full", offset=first_page * PAGE)


def test_stamp_templates_stay_one_set_whatever_the_number_of_object_sizes():
    """Whole-request mode gives nearly every object a size of its own: the stamps' tags are one set for the
    most pages seen (a template per size grew without bound: 24 MiB per distinct 4 GiB object)."""
    import tracemalloc

    from kv_cache.buffers import aligned_buffer

    pool = PayloadPool(seed=3, span_bytes=1 << 20)
    out = aligned_buffer(4 << 20)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for pages in range(600, 1024, 7):  # 61 distinct sizes, up to 4 MiB
            view = out[:pages * 4096]
            pool.fill(pages, view)
            assert pool.check(pages, view, "stamps")
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    largest = 1020
    # one set (and the one it replaced), not one per size: 8 bytes a page and each of 8 places' 8
    assert held <= 72 * largest * 2 + 64 * 1024, held


LARGE_BLOCK = SEGMENT_BYTES + 8 * PAGE


def test_a_large_payload_kept_in_its_buffer_is_made_again_by_its_stamps_alone(pool, monkeypatch):
    out = aligned_buffer(LARGE_BLOCK)
    data, held = pool.lend(5, out)
    assert data is out and not held
    fills = []
    monkeypatch.setattr(pool, "fill", lambda *a, **k: fills.append(a))
    data, held = pool.lend(6, out, kept=out.size)
    monkeypatch.undo()
    assert data is out and not held and not fills  # no copy from the pool: only the stamps written
    assert np.array_equal(out, block(pool, 6, LARGE_BLOCK)) and pool.check(6, out, "full")
    assert not pool.check(5, out, "stamps")
    data, _ = pool.lend(7, out, kept=out.size - PAGE)  # fewer bytes kept than it needs: made whole
    assert np.array_equal(out, block(pool, 7, LARGE_BLOCK))


def test_the_parts_of_a_large_payload_are_the_whole_payload(pool):
    whole = block(pool, 8, LARGE_BLOCK)
    part = aligned_buffer(16 << 20)
    for at in range(0, LARGE_BLOCK, part.size):  # the first parts lie within one segment
        n = min(part.size, LARGE_BLOCK - at)
        pool.fill(8, part[:n], at, whole=LARGE_BLOCK)
        assert np.array_equal(part[:n], whole[at:at + n]), at
        assert pool.check(8, part[:n], "full", None, at, LARGE_BLOCK)


@pytest.mark.parametrize("slot", [None, 1])
def test_a_worker_buffer_read_into_is_made_again_whole_not_only_stamped(pool, slot):
    bufs = WorkerBuffers(LARGE_BLOCK, fake_io=False, batch=2)
    data, _ = bufs.lend(pool, 5, LARGE_BLOCK, slot)
    data, _ = bufs.lend(pool, 6, LARGE_BLOCK, slot)  # kept: stamped again
    assert np.array_equal(data, block(pool, 6, LARGE_BLOCK))
    read = bufs.view(LARGE_BLOCK) if slot is None else bufs.batch_view(slot, LARGE_BLOCK)
    read[:] = block(pool, 9, 2 * PAGE)[0]  # a read landed there: another block's bytes
    data, _ = bufs.lend(pool, 7, LARGE_BLOCK, slot)
    assert np.array_equal(data, block(pool, 7, LARGE_BLOCK))


def test_a_large_payload_read_back_and_found_intact_makes_the_next_in_its_buffer_by_its_stamps(pool, monkeypatch):
    """A block read into a worker's buffer and checked by its bytes (checksum or every byte) leaves a LARGE payload
    there: the next write from that buffer stamps it again. One of a segment or less (its bytes the key's), or at
    another place, leaves nothing kept: the next is made whole."""
    bufs = WorkerBuffers(LARGE_BLOCK, fake_io=False, batch=2)
    fills = []
    real_fill = pool.fill
    monkeypatch.setattr(pool, "fill", lambda *a, **k: fills.append(a[0]) or real_fill(*a, **k))
    for read, key, place, kept in ((LARGE_BLOCK, 5, 0, True), (SEGMENT_BYTES, 6, 0, False),
                                   (LARGE_BLOCK, 7, 3, False)):
        view = bufs.batch_view(1, read)
        real_fill(key, view, place=place)  # the block read back
        bufs.verified(1, view)
        fills.clear()
        data, _ = bufs.lend(pool, 9, LARGE_BLOCK, 1)
        assert (not fills) == kept, (read, place)
        assert np.array_equal(data, block(pool, 9, LARGE_BLOCK)), (read, place)


def test_payloads_lent_in_place_at_once_never_share_a_byte_of_the_pool():
    """A lend takes a place only where no region of it is held: payloads of random sizes and keys lent and given back
    in random order over a small pool, every pair held at once lies apart (a lent payload's stamps are written in
    the pool, so two sharing a page would change each other's bytes)."""
    import random

    rng = random.Random(8)
    pool = PayloadPool(seed=6, span_bytes=2 << 20, copies=2)
    base = pool.host_memory.ctypes.data
    held: list = []
    lent = 0
    for step in range(3000):
        if held and (len(held) > 12 or rng.random() < 0.4):
            pool.give_back(held.pop(rng.randrange(len(held)))[2])
            continue
        out = aligned_buffer(rng.randrange(1, 160) * PAGE)
        view, regions = pool.lend(rng.getrandbits(63), out)
        if regions:
            lent += 1
            at = view.ctypes.data - base
            for a, n, _ in held:
                assert at + view.size <= a or a + n <= at, (step, at, view.size, a, n)
            held.append((at, view.size, regions))
    assert lent > 1500  # most lent in place: the pairs checked are many


def test_a_batch_s_lends_made_together_are_the_lends_made_one_after_another():
    """A write window lends its payloads together (one hold of the region map): each takes the place, the regions and
    the bytes that lend() one after another would have given it, the earlier ones of the batch holding theirs."""
    rng = random.Random(5)
    for copies, size in [(1, 512 << 10), (2, 512 << 10), (1, 2 << 20)]:
        one, many = (PayloadPool(1, span_bytes=8 << 20, copies=copies) for _ in range(2))
        held: list = []
        for _ in range(30):
            keys = [rng.getrandbits(64) for _ in range(rng.randrange(2, 40))]
            got = [one.lend(k, aligned_buffer(size)) for k in keys]
            lent = many.lend_many(keys, [aligned_buffer(size) for _ in keys], [0] * len(keys))
            for (a, ha), (b, hb), k in zip(got, lent, keys):
                assert ha == hb and np.array_equal(a, b) and many.check(k, b, "full")
                at = a.ctypes.data - one.host_memory.ctypes.data
                assert not ha or at == b.ctypes.data - many.host_memory.ctypes.data
            held += [h for _, h in got]
            while len(held) > 24:  # some given back, so that later batches meet a map partly held
                h = held.pop(rng.randrange(len(held)))
                one.give_back(h)
                many.give_back_many([h])


def test_a_null_tier_worker_makes_no_array_for_a_block():
    """Under --null-io every block's buffer was an array made for it and freed after: up to 64 MiB mapped and
    unmapped a block, 21 % of the one worker's time in the Mooncake trace's analysis (403 requests/s; 545 without,
    with a hash-id prompt's streams in one pass). Now each is a view of one allocation the null tier never
    touches."""
    bufs = WorkerBuffers(LARGE_BLOCK, fake_io=True, batch=4)
    views = [bufs.view(LARGE_BLOCK), *(bufs.batch_view(i, LARGE_BLOCK - i) for i in range(4))]
    assert [v.size for v in views] == [LARGE_BLOCK, *(LARGE_BLOCK - i for i in range(4))]
    assert all(v.base is bufs.null for v in views)
