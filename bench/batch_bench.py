#!/usr/bin/env python3
"""make bench, batched request I/O (issue 48): a request's blocks in flight together against one at a time, and
against fio at the same queue depth.

On a RAM-backed loop device (ext4 on losetup over a file in /dev/shm, made and removed here as root; elsewhere the
folder given with --dir): the NVMe tier (slab layout, a file a block, and the slab with --io-unit layer's 32 layer
groups a block, llama3.1-8b's layers) holds 64 blocks; a prefix load of those 64 blocks is timed one block at a time
(get, the serial path) and as batches of --max-inflight (get_many, the batched path), with the io_uring and the
direct engine. Beside it, fio's io_uring engine reads the same number of
blocks of the same size at iodepth = --max-inflight (one job, direct=1, randread): GB/s and CPU seconds per GiB
(fio's usr + sys; ours: this process's CPU time over the batched loads), and at iodepth 1: fio's own time at depth
over its time one at a time is what a deeper queue can buy on this device at all, the bound beside ours (batched /
serial). Each figure is the
median of --rounds rounds. This times the tier and its engine, the path a batch takes below the cache; the whole
program's own cost is e2e_bench's.

Then the demotions a batch triggers, through the cache: an upper tier full of 64 blocks takes 64 new blocks, each
pushing one block down. Serial: each new block reserved, its victim demoted, then written (commit_write); batched:
place_writes and commit_batch in windows of --max-inflight (the demotions land together before the new blocks'
put_many). Two stacks: the CPU tier over the NVMe tier (its slots straight into the engine's batch), and the NVMe
tier over a Valkey server on 127.0.0.1 (tests/servers.py: a read batch off the disk into the scratch, one pipeline
out of it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # servers.py: the tests' Valkey server

from engine_bench import loop_dir  # noqa: E402
from servers import start  # noqa: E402

from kv_cache.buffers import aligned_buffer, direct_aligned  # noqa: E402
from kv_cache.cache.cache import BlockCache  # noqa: E402
from kv_cache.cache.policies.lru import LRUPolicy  # noqa: E402
from kv_cache.recorder.recorder import Recorder  # noqa: E402
from kv_cache.run.registry import discover  # noqa: E402
from kv_cache.tiers import valkey as valkey_medium  # noqa: E402
from kv_cache.tiers.cpu import CpuTier  # noqa: E402
from kv_cache.tiers.nvme import NvmeTier  # noqa: E402
from kv_cache.tiers.remote import RemoteTier  # noqa: E402

BLOCKS = 64
SIZES = (512 << 10, 2 << 20)


LAYOUTS = (("slab", 0), ("file-per-block", 0), ("slab", 32))  # (layout, layer-group I/Os a block: --io-unit layer)


def ours(engine, where: str, size: int, depth: int, layout: str = "slab", units: int = 0) -> dict:
    """Serial and batched load times of BLOCKS blocks (s), and the batched loads' GB/s and CPU s per GiB."""
    folder = os.path.join(where, f"tier-{engine.name}-{layout}-{units}")
    os.makedirs(folder, exist_ok=True)
    tier = NvmeTier(folder, BLOCKS * size, size, engine, slab_file_bytes=BLOCKS * size, layout=layout,
                    io_unit_bytes=size // units if units else 0, batch=depth, lanes=1)  # a run's pool: batch deep
    try:
        bufs = [aligned_buffer(size) for _ in range(BLOCKS)]
        for k, b in enumerate(bufs):
            b[:] = k % 251
        tier.put_many(list(enumerate(bufs)))
        start = time.perf_counter()
        for k, b in enumerate(bufs):
            tier.get(k, b)
        serial = time.perf_counter() - start
        cpu0, start = time.process_time(), time.perf_counter()
        for w in range(0, BLOCKS, depth):
            done = tier.get_many([(k, bufs[k]) for k in range(w, min(BLOCKS, w + depth))])
            assert not any(isinstance(d, BaseException) for d in done), done
        batched, cpu = time.perf_counter() - start, time.process_time() - cpu0
    finally:
        tier.close()
    gib = BLOCKS * size / 2**30
    return {"serial": serial, "batched": batched, "gbps": BLOCKS * size / batched / 1e9, "cpu_per_gib": cpu / gib}


def demotions(upper, lower, size: int, depth: int, batched: bool) -> float:
    """Seconds to write BLOCKS new blocks into a full upper tier of BLOCKS over lower (each demotes one)."""
    cache = BlockCache([upper, lower], LRUPolicy, False, Recorder())
    bufs = [aligned_buffer(size) for _ in range(depth)]
    scratch = aligned_buffer(depth * direct_aligned(size))  # a window of demotions through it (no host copy above)
    for k in range(BLOCKS):  # the upper tier full
        cache.commit_write(cache.reserve_write(k, size, "user"), bufs[0], "prefill", scratch)
    start = time.perf_counter()
    for w in range(BLOCKS, 2 * BLOCKS, depth):
        keys = range(w, min(2 * BLOCKS, w + depth))
        if not batched:
            for k in keys:
                cache.commit_write(cache.reserve_write(k, size, "user"), bufs[0], "prefill", scratch)
            continue
        placed = cache.place_writes([(k, size, "user", None) for k in keys], bufs, "prefill", scratch)
        cache.commit_batch(placed, bufs, "prefill")
    return time.perf_counter() - start


def nvme(engine, where: str, name: str, size: int, blocks: int, depth: int) -> NvmeTier:
    """An NVMe tier of blocks slots in a folder of its own, its extents written once (no file system allocation
    inside the timing); a synchronous engine's pool as a run's, a thread for each block of a batch of depth."""
    folder = os.path.join(where, f"{name}-{engine.name}")
    os.makedirs(folder, exist_ok=True)
    tier = NvmeTier(folder, blocks * size, size, engine, slab_file_bytes=blocks * size, batch=depth, lanes=1)
    tier.precondition(1)
    return tier


def cpu_over_nvme(engine, where: str, size: int, depth: int, batched: bool) -> float:
    """The CPU tier's slots into the engine's batch."""
    lower = nvme(engine, where, "demote", size, 2 * BLOCKS, depth)
    try:
        return demotions(CpuTier(BLOCKS * size, size), lower, size, depth, batched)
    finally:
        lower.close()


def nvme_over_valkey(url: str, engine, where: str, size: int, depth: int, batched: bool) -> float:
    """The disk's blocks into one pipeline through the scratch (a read batch into it, a write batch out of it)."""
    store = valkey_medium.open_store(url, valkey_medium.ValkeySettings(), 1)
    store.check()  # the server's value limit read, as a run does before its clock
    upper, lower = nvme(engine, where, "over", size, BLOCKS, depth), None
    try:
        lower = RemoteTier("valkey", store, f"bench-{os.getpid()}", 2 * BLOCKS * size, size, "bench")
        return demotions(upper, lower, size, depth, batched)
    finally:
        upper.close()
        if lower is not None:
            lower.close()


def fio(where: str, size: int, depth: int) -> dict:
    """fio's io_uring randread of the blocks at iodepth depth: GB/s and CPU s per GiB; and its GB/s at iodepth 1."""
    path = os.path.join(where, "fio.bin")
    common = ["fio", "--name=kv", f"--filename={path}", "--ioengine=io_uring", "--direct=1", f"--bs={size}",
              f"--size={BLOCKS * size}", "--output-format=json"]
    subprocess.run([*common, "--rw=write", "--iodepth=1"], capture_output=True, check=True)
    out = {}
    for qd in (1, depth):
        res = json.loads(subprocess.run([*common, "--rw=randread", f"--iodepth={qd}",
                                         f"--io_size={BLOCKS * size * 8}"],
                                        capture_output=True, text=True, check=True).stdout)
        job = res["jobs"][0]
        read, gib = job["read"], job["read"]["io_bytes"] / 2**30
        out["gbps_qd1" if qd == 1 else "gbps"] = read["bw_bytes"] / 1e9
        out["cpu_per_gib"] = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000 / gib
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where the files go (default: a RAM-backed loop device as root, else /tmp)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-inflight", type=int, default=32)
    a = ap.parse_args()
    engines = discover().engines
    stack: list = []
    try:
        where = a.dir or (loop_dir(stack) if os.geteuid() == 0 else "/tmp")
        print(f"Batched request I/O on {where}: a load of {BLOCKS} blocks, batches of {a.max_inflight} (median of "
              f"{a.rounds} rounds)")
        print(f"  {'block':>7} {'engine':>9} {'layout':>14} {'serial ms':>10} {'batched ms':>11} "
              f"{'batched/serial':>15} {'fio QD' + str(a.max_inflight) + '/QD1':>14} {'GB/s':>6} {'fio GB/s':>9} "
              f"{'ours/fio':>9} {'CPU s/GiB ours/fio':>19}")
        for size in SIZES:
            f = [fio(where, size, a.max_inflight) for _ in range(a.rounds)]
            fio_gbps, fio_cpu = np.median([x["gbps"] for x in f]), np.median([x["cpu_per_gib"] for x in f])
            fio_gain = float(np.median([x["gbps_qd1"] / x["gbps"] for x in f]))  # its time at depth / one by one
            for name, (layout, units) in itertools.product(("io_uring", "direct"), LAYOUTS):
                if engines[name].unavailable():
                    print(f"  {name}: skipped: {engines[name].unavailable()}")
                    continue
                r = [ours(engines[name], where, size, a.max_inflight, layout, units) for _ in range(a.rounds)]
                m = {k: float(np.median([x[k] for x in r])) for k in r[0]}
                shape = f"{layout}, {units} units" if units else layout
                print(f"  {size / 2**20:6.2f}M {name:>9} {shape:>14} {m['serial'] * 1e3:10.2f} "
                      f"{m['batched'] * 1e3:11.2f} {m['batched'] / m['serial']:15.2f} {fio_gain:14.2f} "
                      f"{m['gbps']:6.2f} {fio_gbps:9.2f} {m['gbps'] / fio_gbps:9.2f} "
                      f"{m['cpu_per_gib']:9.3f}/{fio_cpu:<9.3f}")
            os.unlink(os.path.join(where, "fio.bin"))
        print(f"A batch's demotions through the cache: {BLOCKS} new blocks into a full upper tier of {BLOCKS}, each "
              f"demoting one (batches of {a.max_inflight})")
        print(f"  {'block':>7} {'engine':>9} {'tiers':>16} {'serial ms':>10} {'batched ms':>11} {'batched/serial':>15}")
        server = start("valkey", Path(where) / "valkey")
        stack.append(server.stop)
        stacks = {"cpu over nvme": cpu_over_nvme,
                  "nvme over valkey": lambda *x: nvme_over_valkey(server.url, *x)}
        for size in SIZES:
            for name in ("io_uring", "direct"):
                if engines[name].unavailable():
                    continue
                for tiers, run in stacks.items():
                    t = {b: float(np.median([run(engines[name], where, size, a.max_inflight, b)
                                             for _ in range(a.rounds)])) for b in (False, True)}
                    print(f"  {size / 2**20:6.2f}M {name:>9} {tiers:>16} {t[False] * 1e3:10.2f} "
                          f"{t[True] * 1e3:11.2f} {t[True] / t[False]:15.2f}")
    finally:
        for undo in reversed(stack):
            undo()


if __name__ == "__main__":
    main()
