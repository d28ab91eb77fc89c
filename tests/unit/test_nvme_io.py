"""Honest NVMe I/O: O_DIRECT alignment, short-write loops, and reads that skip the page cache."""

import os
import random
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from found import ENGINES

from kv_cache.buffers import aligned_buffer, is_aligned
from kv_cache.errors import RunFault
from kv_cache.lifecycle.payload import PayloadPool
from kv_cache.tiers import posix_io
from kv_cache.tiers.fsinfo import mount_of, probe_direct
from kv_cache.tiers.nvme import NvmeTier

SLOT = 1 << 20


def resident_bytes(path) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


needs_fincore = pytest.mark.skipif(shutil.which("fincore") is None, reason="fincore (util-linux) not installed")


@pytest.fixture
def direct_ok(tmp_path):
    why = probe_direct(str(tmp_path))
    if why:
        pytest.skip(f"O_DIRECT unavailable here: {why}")


def test_aligned_buffers_are_page_aligned():
    for n in (1, 4096, 5000, 3 << 20):
        b = aligned_buffer(n)
        assert is_aligned(b) and b.size >= n


def _huge_kib(addr: int) -> int:
    """AnonHugePages of the mapping holding addr (from /proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


def test_large_buffers_sit_on_huge_pages():
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[never]" in mode.read_text():
        pytest.skip("transparent huge pages are off on this machine")
    b = aligned_buffer(8 << 20)
    assert b.ctypes.data % (2 << 20) == 0 and b.size == 8 << 20 and not b.any()
    assert _huge_kib(b.ctypes.data) >= 4096  # most of it: the kernel may fall back for a page or two


def test_misaligned_buffer_fails_clearly_under_o_direct(tmp_path, direct_ok):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT | os.O_DIRECT)
    try:
        buf = aligned_buffer(2 * 4096)[16:16 + 4096]  # 16 bytes off a page, as numpy gives
        with pytest.raises(RunFault, match="write of .* failed: Invalid argument"):
            posix_io.pwrite_all(fd, buf, 0, str(tmp_path / "f"))
    finally:
        os.close(fd)


def test_writes_and_reads_loop_over_short_transfers(tmp_path, monkeypatch, direct_ok):
    monkeypatch.setattr(posix_io, "CHUNK", 4096)  # every call moves one page: many iterations
    data = aligned_buffer(64 * 4096)
    data[:] = np.random.default_rng(1).integers(0, 256, data.size, dtype=np.uint8)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT | os.O_DIRECT)
    try:
        posix_io.pwrite_all(fd, data, 4096)
        out = aligned_buffer(data.size)
        posix_io.pread_all(fd, out, 4096)
    finally:
        os.close(fd)
    assert np.array_equal(out, data)


def test_a_block_moved_short_by_the_kernel_is_finished_where_it_stopped(tmp_path, monkeypatch):
    """The one-call path of a block: a transfer the kernel cuts short goes on from its end, once."""
    real_write, real_read, calls = os.pwritev, os.preadv, []

    def short(real):
        def call(fd, bufs, offset):
            view = memoryview(bufs[0]).cast("B")[: 3 * 4096]  # at most 3 pages per call
            calls.append(offset)
            return real(fd, [view], offset)
        return call

    data = aligned_buffer(8 * 4096)
    data[:] = np.random.default_rng(2).integers(0, 256, data.size, dtype=np.uint8)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        monkeypatch.setattr(os, "pwritev", short(real_write))
        posix_io.pwrite_all(fd, data, 4096)
        monkeypatch.setattr(os, "preadv", short(real_read))
        out = aligned_buffer(data.size)
        posix_io.pread_all(fd, out, 4096)
    finally:
        os.close(fd)
    assert np.array_equal(out, data)
    assert calls == [4096, 4 * 4096, 7 * 4096] * 2  # 3 + 3 + 2 pages each way: nothing moved twice


def test_reading_past_the_end_is_a_fault(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 4096)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        with pytest.raises(RunFault, match="unexpected end of file"):
            posix_io.pread_all(fd, aligned_buffer(8192), 0)
    finally:
        os.close(fd)


def _mapped_rss_kib(path) -> int:
    """Rss of this process's mappings of path (from /proc/self/smaps)."""
    inside, kib = False, 0
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            inside = line.rstrip("\n").endswith(str(path))
        elif inside and head == "Rss:":
            kib += int(line.split()[1])
    return kib


@needs_fincore
@pytest.mark.parametrize("engine", ["direct", "buffered", "mmap"])
def test_blocks_do_not_stay_in_the_page_cache(tmp_path, engine):
    """mmap: written and read blocks stayed mapped; over a run the whole slab became the process's resident memory
    (peak RSS 7.4 GiB against a 5.6 GiB budget with a 2 GiB slab). Its page cache is the kernel's: a read drops its
    range first."""
    if engine == "direct" and probe_direct(str(tmp_path)):
        pytest.skip("O_DIRECT unavailable")
    pool = PayloadPool(seed=2, span_bytes=1 << 20)
    t = NvmeTier(str(tmp_path / "d"), 8 * SLOT, SLOT, ENGINES[engine]) if os.makedirs(tmp_path / "d") is None else None
    buf = aligned_buffer(SLOT)
    for k in range(4):
        pool.fill(k, buf)
        t.put(k, buf)
    slab = t.slabs[0].path
    assert engine == "mmap" or resident_bytes(slab) == 0, "written blocks were left in the page cache"
    assert _mapped_rss_kib(slab) == 0, "written blocks were left mapped"
    if engine != "buffered":
        for k in range(4):
            t.get(k, buf)
            assert pool.check(k, buf, "full")
        assert engine == "mmap" or resident_bytes(slab) == 0, "direct reads went through the page cache"
        assert _mapped_rss_kib(slab) == 0, "read blocks were left mapped"
    t.close()


def _device_read_bytes(what: str = "read_bytes") -> int:
    """Bytes this process had the block layer read (its threads' page faults and reads included); what=
    "write_bytes": the bytes it dirtied for the block layer to write."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith(what + ":")).split()[1])


@pytest.mark.parametrize("engine", ["buffered", "mmap"])
def test_two_workers_reading_one_block_each_read_it_from_the_device(tmp_path, engine):
    """Two workers loading one block at once shared its pages: the second's drop cannot evict what the first is
    faulting in, so the device read it once for two counted reads (mmap, 4 workers: the disk read 0.71x the bytes
    the run counted). Each read of the block is the device's now."""
    os.makedirs(tmp_path / "d")
    t = NvmeTier(str(tmp_path / "d"), 4 * SLOT, SLOT, ENGINES[engine])
    pool, rounds = PayloadPool(seed=3, span_bytes=SLOT), 24
    buf = aligned_buffer(SLOT)
    pool.fill(7, buf)
    t.put(7, buf)
    before = _device_read_bytes()
    t.get(7, buf)
    if _device_read_bytes() == before:
        t.close()
        pytest.skip(f"{tmp_path} is not on a block device (no read reaches one)")
    meet, outs, bad = threading.Barrier(2, timeout=60), [aligned_buffer(SLOT) for _ in range(2)], []

    def load(out):
        for _ in range(rounds):
            meet.wait()  # both read the block at once
            t.get(7, out)
            bad.extend([] if pool.check(7, out, "full") else ["wrong bytes"])

    before = _device_read_bytes()
    readers = [threading.Thread(target=load, args=(o,)) for o in outs]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    read = _device_read_bytes() - before
    t.close()
    assert not bad
    assert read >= 2 * rounds * SLOT, f"the device read {read / (2 * rounds * SLOT):.2f}x the bytes of the reads"


def _reaches_a_device(folder) -> bool:
    """Whether a read of a file in folder, once out of the page cache, reaches a block device."""
    path = folder / "probe"
    path.write_bytes(os.urandom(1 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        posix_io.drop_cached(fd, 0, 1 << 20)
        before = _device_read_bytes()
        os.pread(fd, 1 << 20, 0)
        return _device_read_bytes() > before
    finally:
        os.close(fd)
        path.unlink()


@pytest.mark.slow  # seconds of real I/O: make test-all (CI)
@pytest.mark.parametrize("precondition", [False, True])
@pytest.mark.parametrize("engine", ["buffered", "mmap"])
def test_a_block_read_in_units_reads_each_unit_from_the_device(tmp_path, engine, precondition):
    """--io-unit layer through the page cache: the kernel's readahead (an 8 MiB window on a VM here) and a
    preconditioning pass left large folios reaching past a unit's range, which the unit's drop could not evict and
    its msync wrote whole: blocks were read from the cache, and a put wrote up to 32x its bytes (in runs: the disk
    read 0.38x and wrote 13.7x the bytes counted with mmap; buffered after --precondition read 0.12x)."""
    if not _reaches_a_device(tmp_path):
        pytest.skip(f"{tmp_path} is not on a block device (no read reaches one)")
    os.makedirs(tmp_path / "d")
    tier = NvmeTier(str(tmp_path / "d"), 64 * SLOT, SLOT, ENGINES[engine], io_unit_bytes=64 << 10, batch=1)
    if precondition:
        tier.precondition(1)
    pool, buf = PayloadPool(seed=5, span_bytes=SLOT), aligned_buffer(SLOT)
    read, wrote = [], []  # each block's get and put: the device's bytes over the block's (a total could hide one
    for seed in (1, 4):  # block's for another); a run's pattern: blocks read, evicted and replaced at random
        rng, held = random.Random(seed), {}
        for n in range(300):
            k = rng.randrange(96)
            if k in held and rng.random() < 0.6:
                before = _device_read_bytes()
                assert isinstance(tier.get_many([(k, buf)])[0], int) and pool.check(held[k], buf, "full")
                read.append((_device_read_bytes() - before) / SLOT)
                continue
            for gone in ([k] if k in held else []) + ([rng.choice(list(held))] if len(held) >= 64 else []):
                tier.delete(gone)
                del held[gone]
            held[k] = k + 1000 * n
            pool.fill(held[k], buf)
            before = _device_read_bytes("write_bytes")
            assert tier.put_many([(k, buf)]) != [None]  # a batch's path: each unit one I/O
            wrote.append((_device_read_bytes("write_bytes") - before) / SLOT)
        for k in held:
            tier.delete(k)
    tier.close()
    assert min(read) >= 0.99, f"the device read {', '.join(f'{x:.2f}' for x in read)}x each block's bytes"
    assert max(wrote) <= 2, f"a put dirtied {', '.join(f'{x:.2f}' for x in wrote)}x its block's bytes"


@needs_fincore
def test_drop_cached_empties_a_cached_range(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(os.urandom(1 << 20))
    os.sync()
    with open(p, "rb") as f:
        f.read()
    assert resident_bytes(p) > 0
    fd = os.open(p, os.O_RDONLY)
    posix_io.drop_cached(fd, 0, 1 << 20)
    os.close(fd)
    assert resident_bytes(p) == 0


def test_mount_of_knows_tmpfs_and_the_root_filesystem():
    assert mount_of("/").mount_point == "/"
    if os.path.isdir("/dev/shm"):
        assert mount_of("/dev/shm").fs_type == "tmpfs"


def test_preallocation_failure_is_a_clear_error_and_leaves_no_file(small_tmpfs):
    from kv_cache.errors import UserError

    d = small_tmpfs(8)  # an 8 MiB filesystem: asking for 32 MiB must fail
    with pytest.raises(UserError, match="cannot preallocate"):
        NvmeTier(str(d), 32 * SLOT, SLOT, ENGINES["buffered"], slab_file_bytes=32 * SLOT)
    assert os.listdir(d) == [], "a failed preallocation left its file behind"


@pytest.mark.parametrize("engine, layout", [("direct", "slab"), ("buffered", "slab"), ("direct", "file-per-block"),
                                            ("io_uring", "slab")])
def test_io_unit_layer_moves_a_block_as_timed_layer_ios(tmp_path, direct_ok, engine, layout):
    """--io-unit layer: a block is one put/get of several I/Os of the unit's size, each timed (io_uring: each unit
    from the block's one submission; it timed the submission as one before); the bytes are the same as moved
    whole."""
    if ENGINES[engine].unavailable():
        pytest.skip(f"{engine}: {ENGINES[engine].unavailable()}")
    unit = 64 << 10
    (tmp_path / "d").mkdir()
    (tmp_path / "w").mkdir()
    tier = NvmeTier(str(tmp_path / "d"), 8 * SLOT, SLOT, ENGINES[engine], layout, io_unit_bytes=unit)
    whole = NvmeTier(str(tmp_path / "w"), 8 * SLOT, SLOT, ENGINES[engine], layout)
    data = aligned_buffer(SLOT + SLOT // 2)  # a block over two slots: runs cut at slot boundaries too
    PayloadPool(seed=3).fill(11, data)
    tier.put(11, data)
    writes = tier.io_times()
    assert len(writes) == data.size // unit and all(n == unit for _, n in writes) and all(ns > 0 for ns, _ in writes)
    out = aligned_buffer(data.size)
    tier.get(11, out)
    assert (out == data).all() and len(tier.io_times()) == data.size // unit
    whole.put(11, data)
    assert whole.io_times() == [] and "one I/O per 64 KiB" in tier.description
    tier.close()
    whole.close()


@pytest.mark.parametrize("engine, layout", [("direct", "slab"), ("io_uring", "slab"), ("direct", "file-per-block")])
def test_io_unit_layer_batches_hand_every_unit_to_the_engine_each_timed(tmp_path, direct_ok, engine, layout):
    """--io-unit layer in a batch: every unit of every block goes to the engine at once, and the batch says when each
    of a block's units completed (its bytes the unit's); a missing block fails alone with no units."""
    if ENGINES[engine].unavailable():
        pytest.skip(f"{engine}: {ENGINES[engine].unavailable()}")
    unit = 64 << 10
    tier = NvmeTier(str(tmp_path), 8 * SLOT, SLOT, ENGINES[engine], layout, io_unit_bytes=unit)
    pool = PayloadPool(seed=3)
    datas = [aligned_buffer(n) for n in (SLOT, SLOT + SLOT // 2, unit)]
    for k, d in enumerate(datas):
        pool.fill(k, d)
    assert all(isinstance(t, int) for t in tier.put_many(list(enumerate(datas))))
    wrote = tier.batch_io_times()
    assert [len(u) for u in wrote] == [d.size // unit for d in datas]
    assert all(n == unit and c > 0 for u in wrote for c, n in u)
    outs = [aligned_buffer(d.size) for d in datas] + [aligned_buffer(unit)]
    done = tier.get_many([*enumerate(outs[:3]), (99, outs[3])])
    assert isinstance(done[3], KeyError) and all(isinstance(t, int) for t in done[:3])
    read = tier.batch_io_times()
    assert [len(u) for u in read] == [d.size // unit for d in datas] + [0]
    assert all((o == d).all() for o, d in zip(outs, datas))
    assert all(max(c for c, _ in u) == t for u, t in zip(read, done[:3]))  # a block ends with its last unit
    tier.close()


def test_io_unit_bytes_follow_the_model_layers():
    from found import SECTIONS

    from kv_cache.config import resolve
    from kv_cache.run.geometry import geometry, io_unit_bytes

    s = resolve(None, [], {"model.name": "llama70b", "tiers.io_unit": "layer"},
                media_sections=SECTIONS)  # 80 MiB blocks, 80 layers
    assert io_unit_bytes(s, geometry(s)) == 1 << 20
    s = resolve(None, [], {"model.name": "llama70b", "tiers.io_unit": "layer", "tiers.layers_per_io": 8},
                media_sections=SECTIONS)
    assert io_unit_bytes(s, geometry(s)) == 8 << 20
    assert io_unit_bytes(resolve(None, [], {"model.name": "llama70b"},
                                 media_sections=SECTIONS), geometry(s)) == 0
