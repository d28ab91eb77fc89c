"""The io_uring engine (kv_cache/tiers/uring.py), the proof that an engine is one module and its test (issue 40):
it declares itself in its module's ENGINES; the registry finds it, and the setting's choices, --help, the fio job,
the contract cases and the submission rules read it from there."""

import os
import time

import numpy as np
import pytest
from conftest import bounded, run_cli
from found import ENGINES, REGISTRY

from kv_cache.buffers import aligned_buffer
from kv_cache.tiers.engines import Target

ENGINE = ENGINES["io_uring"]
pytestmark = pytest.mark.skipif(bool(ENGINE.unavailable()), reason=ENGINE.unavailable() or "io_uring runs here")


def test_a_block_in_several_units_goes_through_one_batch_and_comes_back_whole(tmp_path):
    path = str(tmp_path / "slab")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    os.posix_fallocate(fd, 0, 16 << 20)
    t = Target(path, fd)
    data = aligned_buffer(5 << 20)
    data[:] = np.random.default_rng(3).integers(0, 256, data.size, dtype=np.uint8)
    for unit in (512 << 10, 2 << 20, 0):  # ten units, three (a short last one), one call's limit
        ENGINE.write(t, 4096, data, unit, None)
        out, times = aligned_buffer(5 << 20), []
        ENGINE.read(t, 4096, out, unit, times)
        assert np.array_equal(out, data) and sum(n for _, n in times) == data.nbytes, unit
    os.close(fd)


def test_a_batch_s_short_unit_sends_its_own_io_and_only_it_to_the_one_by_one_path(tmp_path, monkeypatch):
    """write_many/read_many: each I/O's units through the ring (one I/O of three units, others of one); an I/O is
    done when its last unit is, and one whose unit came back short is finished alone by the one-by-one path (here
    the kernel's answer for the third I/O's only unit is cut by 512 bytes). Asked for them, each I/O's units come
    back in order, (completion, bytes) each: the finished one's done when it was."""
    from kv_cache.tiers import io_uring_sys

    path = str(tmp_path / "slab")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    os.posix_fallocate(fd, 0, 1 << 20)
    t, unit = Target(path, fd), 64 << 10
    data = [aligned_buffer(n) for n in (3 * unit, unit, unit, unit)]
    for k, d in enumerate(data):
        d[:] = k + 1
    offs = [0, 3 * unit, 4 * unit, 5 * unit]
    stream, finished = io_uring_sys.Ring.stream, []

    def cut_fourth_unit(ring, ops, completed):  # the third I/O's unit: the fourth after the first I/O's three
        got, submitted = stream(ring, ops, completed)
        return [g - 512 if k == 4 else g for k, g in enumerate(got)], submitted

    monkeypatch.setattr(io_uring_sys.Ring, "stream", cut_fourth_unit)
    for verb, one in (("write_many", "write"), ("read_many", "read")):
        real = getattr(ENGINE, one)
        monkeypatch.setattr(ENGINE, one, lambda t_, off, buf, u, times, real=real: finished.append(off) or
                            real(t_, off, buf, u, times))
        bufs = data if verb == "write_many" else [aligned_buffer(d.nbytes) for d in data]
        units: list = []  # each I/O's units, cut and timed by the engine (--io-unit layer)
        done = getattr(ENGINE, verb)([(t, o, b) for o, b in zip(offs, bufs)], unit, None, units)
        assert all(isinstance(x, int) and x > 0 for x in done) and finished == [offs[2]], (verb, finished)
        assert [[n for _, n in u] for u in units] == [[unit] * 3, [unit], [unit], [unit]], verb
        assert [max(w for w, _ in u) for u in units] == done and units[2] == [(done[2], unit)], verb
        finished.clear()
    assert all(np.array_equal(b, d) for b, d in zip(bufs, data))
    os.close(fd)


def test_a_batch_of_more_units_than_the_ring_holds_keeps_it_full_and_comes_back_whole(tmp_path):
    """150 I/Os through a ring of 8 entries (submit() takes at most 8): each submitted as a slot frees, each one's
    result and completion time its own, the bytes whole either way; batches the ring holds, their slots wrapping
    round it from one batch to the next, the same."""
    from kv_cache.tiers.io_uring_sys import OP_READ, OP_WRITE, Ring

    path = str(tmp_path / "slab")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    os.posix_fallocate(fd, 0, 150 * 4096)
    data = aligned_buffer(150 * 4096)
    data[:] = np.random.default_rng(5).integers(0, 256, data.size, dtype=np.uint8)
    ring = Ring(8)
    try:
        when = [0] * 150
        start = time.monotonic_ns()
        got, submitted = ring.stream([(OP_WRITE, fd, k * 4096, data.ctypes.data + k * 4096, 4096)
                                      for k in range(150)], when)
        assert got == [4096] * 150 and min(when) > 0
        # the time its ops were in flight, over its window, is the depth the ring kept: never above its 8 entries
        depth = (sum(when) - submitted) / (max(when) - start)
        assert 0 < depth <= 8, depth
        out = aligned_buffer(data.size)
        got, _ = ring.stream([(OP_READ, fd, k * 4096, out.ctypes.data + k * 4096, 4096) for k in range(150)], when)
        assert got == [4096] * 150 and np.array_equal(out, data)
        out[:], when = 0, [0] * 150
        for at in range(0, 150, 6):  # 6 at a time: the slots wrap round the ring of 8 between batches
            got, _ = ring.stream([(OP_READ, fd, k * 4096, out.ctypes.data + k * 4096, 4096)
                                  for k in range(at, min(at + 6, 150))], when[at:at + 6])
            assert got == [4096] * min(6, 150 - at)
        assert np.array_equal(out, data)
    finally:
        ring.close()
        os.close(fd)


def test_an_entry_packed_in_one_call_is_the_kernel_s_layout_field_by_field():
    """The entries are written and read with struct formats (one call each); the ctypes structures spell the
    kernel's layout (include/uapi/linux/io_uring.h) field by field: the two must agree on every field's place."""
    from kv_cache.tiers.io_uring_sys import CQE_FORMAT, SQE_FORMAT, _Cqe, _Sqe

    sqe_values = dict(opcode=0x17, flags=0x2, ioprio=0x3344, fd=-7, off=0x1122334455667788,
                      addr=0x7F00AABBCCDD0000, len=0x80000, rw_flags=0x55, user_data=0x0102030405060708)
    raw = bytearray(b"\xff" * SQE_FORMAT.size)  # padding left over from an earlier entry: written zero again
    SQE_FORMAT.pack_into(raw, 0, *sqe_values.values())
    sqe = _Sqe.from_buffer_copy(raw)
    assert {k: getattr(sqe, k) for k in sqe_values} == sqe_values and list(sqe.pad) == [0, 0, 0]
    cqe = _Cqe(user_data=0x0A0B0C0D0E0F1011, res=-5, flags=9)
    assert CQE_FORMAT.unpack_from(bytes(cqe)) == (cqe.user_data, -5, 9)


def test_a_kernel_whose_rings_move_no_bytes_makes_the_engine_unavailable(monkeypatch):
    """Linux 5.1-5.5 have rings and no read or write operation: a no-op completes, every I/O is refused. The probe
    moves bytes through the ring too; here an opcode no kernel knows stands for the missing one."""
    from kv_cache.tiers import io_uring_sys

    assert io_uring_sys.probe() == ""
    monkeypatch.setattr(io_uring_sys, "OP_READ", 250)
    why = io_uring_sys.probe()
    assert why.startswith("the kernel's io_uring does not read and write files (") and "5.6" in why, why


def test_the_table_is_the_one_source(small_run, tmp_path):
    """A run with --io-engine io_uring: the choices and --help name it, its fio job is fio's io_uring engine, and the
    submission rules take it as an O_DIRECT engine."""
    from kv_cache.run.submission import _directs

    trace = tmp_path / "io.csv"
    r = run_cli(small_run("u", "--io-engine", "io_uring", *bounded(10), "--verify", "full", "--io-trace", str(trace)))
    assert r.returncode == 0, r.stderr
    res = small_run.results("u")
    assert res["run"]["io_engine"] == "io_uring" and res["verification"]["failures"] == 0
    assert res["verification"]["blocks_checked"] > 0 and res["bytes"]["nvme"]["read"] > 0
    assert "ioengine=io_uring\ndirect=1\n" in (tmp_path / "io.fio").read_text()
    assert "io_uring: O_DIRECT through an io_uring" in " ".join(run_cli(["--help"]).stdout.split())
    assert "io_uring" in _directs(ENGINES)


def test_the_contract_covers_io_uring():
    """Issue 47: nvme's contract cases were computed when nvme.py was imported, before uring.py registered (the
    package goes alphabetically): io_uring had none. They are computed from the engines found."""
    assert {"nvme/io_uring/slab", "nvme/io_uring/file-per-block"} <= set(REGISTRY.media.contract_cases())


def test_a_worker_thread_s_ring_goes_with_it(tmp_path):
    """Each worker thread has a ring of its own; trials and `policies` start new workers every run: a thread that
    ended must not keep its ring's file descriptor (50 threads kept 50 before)."""
    import gc
    import threading

    path = str(tmp_path / "f")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    os.posix_fallocate(fd, 0, 1 << 20)
    t, buf = Target(path, fd), aligned_buffer(1 << 20)
    ENGINE.read(t, 0, buf, 0, None)  # this thread's ring, for the count below to start from
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        worker = threading.Thread(target=ENGINE.read, args=(t, 0, buf, 0, None))
        worker.start()
        worker.join()
        del worker
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before
    os.close(fd)
