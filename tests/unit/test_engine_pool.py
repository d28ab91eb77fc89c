"""A synchronous engine's batch over its worker's pool of threads (kv_cache/tiers/engines.py, issue 48)."""

import os
import threading
import time

import numpy as np
from found import ENGINES

from kv_cache.buffers import aligned_buffer
from kv_cache.tiers import engines
from kv_cache.tiers.base import in_flight_take
from kv_cache.tiers.engines import POOL_THREADS, Pools, Target


def test_a_batch_keeps_pool_threads_in_flight_with_a_task_a_thread_not_an_io(tmp_path, monkeypatch):
    """32 writes and reads of 64 KiB, each coming back with its own bytes and its own completion: the device sees up
    to POOL_THREADS of them at once, and the batch costs one pool task a thread (a future per I/O was a tenth of
    a 512 KiB block's CPU: 0.269 -> 0.240 CPU-s/GiB, bench/paired_bench.py)."""
    path = str(tmp_path / "slab")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    os.posix_fallocate(fd, 0, 4 << 20)
    t, size, n = Target(path, fd), 64 << 10, 32
    data = [aligned_buffer(size) for _ in range(n)]
    for i, d in enumerate(data):
        d[:] = np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8)
    engine = ENGINES["direct"]
    inside, most, calls, lock = [0], [0], [0], threading.Lock()
    write = engine.write

    first = threading.Barrier(POOL_THREADS, timeout=60)

    def counted(*args):
        with lock:
            calls[0] += 1
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            waits = calls[0] <= POOL_THREADS
        if waits:
            first.wait()  # the first I/Os meet: every pool thread holds one at once, however busy the machine
        try:
            write(*args)
        finally:
            with lock:
                inside[0] -= 1

    tasks = []
    run = engines.IoPool.run
    monkeypatch.setattr(engines.IoPool, "run", lambda pool, task, n: tasks.append(n) or run(pool, task, n))
    monkeypatch.setattr(engine, "write", counted)
    pools = Pools(POOL_THREADS)
    done = engine.write_many([(t, i * size, d) for i, d in enumerate(data)], size, pools)
    assert all(isinstance(x, int) for x in done), done[:2]
    assert most[0] == POOL_THREADS and tasks == [POOL_THREADS]
    outs = [aligned_buffer(size) for _ in range(n)]
    got = engine.read_many([(t, i * size, o) for i, o in enumerate(outs)], size, pools)
    assert all(isinstance(x, int) for x in got) and all(np.array_equal(o, d) for o, d in zip(outs, data))
    pools.close()
    os.close(fd)


def test_the_pools_start_before_the_clock_pass_from_an_ended_thread_and_end_with_the_tier(tmp_path):
    """A tier's pools: those of its lanes started when it is made (no thread started inside a timed batch), one
    for each thread that moves a batch; a thread that ended hands its pool to the next (a run's trials start new
    workers: pools must not pile up); every pool thread ends with the tier. An error the pool's task raised (not
    an I/O's own, which is that I/O's result) is raised in the worker, which never waits for a thread that died."""
    import gc

    def pool_threads() -> set:
        return {t for t in threading.enumerate() if t.name.startswith("kvbench-io")}

    before = pool_threads()
    path = str(tmp_path / "slab")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, 1 << 20)
    bufs = [np.zeros(4096, np.uint8) for _ in range(4)]
    pools = Pools(3, prepared=2)
    assert len(pool_threads() - before) == 6  # started with the tier, before any batch
    seen: list = []

    def worker() -> None:
        seen.append(ENGINES["buffered"].write_many([(Target(path, fd), i * 4096, b) for i, b in enumerate(bufs)],
                                                   4096, pools))
        seen.append(pools.mine())

    for _ in range(3):  # one trial's worker after another's
        w = threading.Thread(target=worker)
        w.start()
        w.join(60)
        del w
        gc.collect()
    assert all(isinstance(x, int) for x in seen[0]) and seen[1] is seen[3] is seen[5]  # passed on, not piled up
    assert len(pool_threads() - before) == 6
    pools.close()
    deadline = time.monotonic() + 30
    while pool_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pool_threads() - before

    pool = engines.IoPool(2)
    got: list = []

    def broken() -> None:
        raise MemoryError("a task that failed outside its I/Os")

    def batches() -> None:
        try:
            pool.run(broken, 2)
        except MemoryError as e:
            got.append(e)
        pool.run(lambda: got.append(1), 2)  # its threads still serve

    b = threading.Thread(target=batches, daemon=True)  # a pool that lost its threads would hold it for ever
    b.start()
    b.join(30)
    pool.close()
    os.close(fd)
    assert not b.is_alive() and isinstance(got[0], MemoryError) and got[1:] == [1, 1], got


def test_a_batch_s_depth_is_its_ios_time_in_flight_over_its_own(monkeypatch):
    """The queue depth results.json gives (queue_depth.*.in_flight_*) is Little's law over what the engine timed:
    24 I/Os of 50 ms each over a pool of 8 threads spent 1.2 s in flight in all, over a batch of about 150 ms:
    between one and the pool's 8 in flight, never the batch's 24 blocks (what results.json called its depth). One
    after another (the mmap engine's turn), at most one."""
    engine = ENGINES["direct"]

    def slow(t, off, buf, unit, times):
        time.sleep(0.05)

    monkeypatch.setattr(engine, "write", slow)
    in_flight_take()  # nothing an earlier test left
    start = time.monotonic_ns()
    pools = Pools(POOL_THREADS)
    done = engine.write_many([(None, 0, None)] * 24, 0, pools)
    pools.close()
    busy = in_flight_take()
    assert busy >= 24 * 50_000_000 and in_flight_take() is None  # taken once
    assert 2 < busy / (max(done) - start) <= POOL_THREADS
    start = time.monotonic_ns()
    done = engines.in_turn(slow, [(None, 0, None)] * 3, 0)
    assert 0.5 < in_flight_take() / (max(done) - start) <= 1  # counted from the batch's start each, it would be 2
