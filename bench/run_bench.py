#!/usr/bin/env python3
"""make bench: the benchmark's own tiers measured against the physical limit, in one run.

1. NVMe tier (direct engine, slab layout) vs fio with O_DIRECT (psync), on the same
   directory, at the same block size and concurrency (threads = fio numjobs), both
   time-based with a 1 s ramp excluded (short size-based fio runs mostly time start-up).
2. CPU tier vs numpy copy (np.copyto between pre-touched buffers), same sizes and threads.
3. The orchestrator's block-op rate with the null tier (the whole pipeline, no bytes).
4. The GPU tier vs a raw CuPy pinned copy (gpu_bench.py; skipped without a device).
5. Semantic donor lookup per request with 10,000 donors vs the 5 ms target (semantic_bench.py).
6. Block verification per mode (checksum, full, stamps) vs numpy memcpy (verify_bench.py).
7. Evictions per second per policy on a 100,000-slot tier vs a 1,000-slot one (policy_bench.py).
8. The whole program vs fio at 80 MiB, 2 MiB and 512 KiB blocks: device GB/s, per-block p50/p95/p99 vs
   fio's clat, CPU seconds per GiB (e2e_bench.py; --e2e-sizes '' skips it).

Every figure is a median over --rounds; ratios are ours / the limit, measured in the same
run. Results go to bench/out/bench.json and a Markdown table on stdout, with what the bench wrote to the
device under test in all (its block layer's counter, before and after: a bench rewrites tens of GB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from e2e_bench import defaults as e2e_defaults  # noqa: E402 - beside this file
from e2e_bench import e2e_round  # noqa: E402
from e2e_bench import tables as e2e_tables  # noqa: E402
from gpu_bench import gpu_round  # noqa: E402
from gpu_bench import lines as gpu_lines  # noqa: E402
from policy_bench import lines as policy_lines  # noqa: E402
from policy_bench import policy_round  # noqa: E402
from semantic_bench import lines as semantic_lines  # noqa: E402
from semantic_bench import semantic_round  # noqa: E402
from verify_bench import lines as verify_lines  # noqa: E402
from verify_bench import verify_round  # noqa: E402

from kv_cache.buffers import aligned_buffer  # noqa: E402
from kv_cache.lifecycle.payload import PayloadPool  # noqa: E402
from kv_cache.recorder.telemetry import disk_of  # noqa: E402
from kv_cache.tiers.cpu import CpuTier  # noqa: E402
from kv_cache.tiers.engines import DirectEngine  # noqa: E402
from kv_cache.tiers.fsinfo import mount_of, probe_direct  # noqa: E402
from kv_cache.tiers.nvme import NvmeTier  # noqa: E402

MiB, GiB = 2**20, 2**30


def parallel(threads: int, work) -> float:
    """Run work(i) on `threads` threads started together; return wall seconds."""
    barrier = threading.Barrier(threads + 1)
    errors = []

    def run(i):
        barrier.wait()
        try:
            work(i)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start


# ------------------------------------------------------------------------------ NVMe vs fio

def timed_loop(threads: int, op, keys_of, seconds: float, ramp: float, block: int) -> float:
    """Run op(key, thread) over each thread's keys again and again for ramp + seconds;
    return GB/s over the operations that completed after the ramp (fio's ramp_time)."""
    start = time.perf_counter()
    t_ramp, t_end = start + ramp, start + ramp + seconds
    done = [0] * threads
    last = [t_end] * threads

    def work(i):
        while True:
            for k in keys_of(i):
                op(k, i)
                now = time.perf_counter()
                if now > t_ramp:
                    done[i] += 1
                if now >= t_end:
                    last[i] = now
                    return

    parallel(threads, work)
    return sum(done) * block / (max(last) - t_ramp) / 1e9


def nvme_tier_round(directory: str, block: int, blocks: int, threads: int, seconds: float) -> dict:
    data_dir = tempfile.mkdtemp(prefix="bench-tier-", dir=directory)
    tier = NvmeTier(data_dir, blocks * block, block, DirectEngine())
    pool = PayloadPool(seed=1)
    bufs = [aligned_buffer(block) for _ in range(threads)]
    for i, b in enumerate(bufs):
        pool.fill(i, b)

    def keys_of(i):
        return range(i, blocks, threads)

    def write(k, i):
        if tier.contains(k):
            tier.delete(k)  # slab layout: frees the slot's bookkeeping only; the next put rewrites it
        tier.put(k, bufs[i])

    try:
        for k in range(blocks):  # untimed: slot k holds block k, the layout fio's pattern assumes
            tier.put(k, bufs[0])
        w = timed_loop(threads, write, keys_of, seconds, 1.0, block)
        r = timed_loop(threads, lambda k, i: tier.get(k, bufs[i]), keys_of, seconds, 1.0, block)
    finally:
        tier.close(remove=True)
    return {"write_gbps": w, "read_gbps": r}


def fio_round(directory: str, block: int, blocks: int, threads: int, seconds: float) -> dict | None:
    if shutil.which("fio") is None:
        return None
    work = tempfile.mkdtemp(prefix="bench-fio-", dir=directory)
    out = {}
    # The tier's access pattern: one file, thread i moves blocks i, i + threads, ... (fio: each job
    # starts one block further and skips threads - 1 blocks after every I/O).
    skip = (threads - 1) * block
    try:
        for rw in ("write", "read"):
            cmd = ["fio", "--name=kv", f"--filename={os.path.join(work, 'slab.kv')}", f"--rw={rw}:{skip}",
                   f"--bs={block}", "--direct=1", "--ioengine=psync", f"--numjobs={threads}",
                   f"--size={(blocks - threads + 1) * block}", f"--offset_increment={block}", "--group_reporting",
                   "--time_based", f"--runtime={seconds}", "--ramp_time=1", "--output-format=json"]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            job = json.loads(res.stdout[res.stdout.index("{"):])["jobs"][0]
            out[f"{rw}_gbps"] = job[rw]["bw_bytes"] / 1e9
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------ CPU vs memcpy

def cpu_round(block: int, blocks: int, threads: int) -> dict:
    tier = CpuTier(blocks * block, block)
    src = [aligned_buffer(block) for _ in range(threads)]
    dst = aligned_buffer(blocks * block)  # the memcpy baseline's destination, pre-touched like the arena

    def put(i):
        for k in range(i, blocks, threads):
            tier.put(k, src[i])

    def get(i):
        for k in range(i, blocks, threads):
            tier.get(k, src[i])

    def copy_in(i):
        import numpy as np

        for k in range(i, blocks, threads):
            np.copyto(dst[k * block:(k + 1) * block], src[i])

    def copy_out(i):
        import numpy as np

        for k in range(i, blocks, threads):
            np.copyto(src[i], dst[k * block:(k + 1) * block])

    total = blocks * block
    out = {"put_gbps": total / parallel(threads, put) / 1e9, "get_gbps": total / parallel(threads, get) / 1e9,
           "memcpy_in_gbps": total / parallel(threads, copy_in) / 1e9,
           "memcpy_out_gbps": total / parallel(threads, copy_out) / 1e9}
    tier.close()
    return out


# ------------------------------------------------------------------------------ orchestrator rate

def null_rate(workers: int, seconds: float) -> dict:
    out = tempfile.mkdtemp(prefix="bench-null-")
    think = [f"profiles.{p}.think_time_s=0,0" for p in ("chatbot", "coding", "document")]
    cmd = [sys.executable, str(REPO / "kv_cache_benchmark.py"), "--null-io", "--model", "llama8b",
           "--block-tokens", "16", "--users", "64", "--workers", str(workers), "--duration", str(seconds),
           "--warmup", "1", "--output-dir", out, "--run-id", "r", "--quiet", "--admission", "all"]
    for t in think:
        cmd += ["--set", t]
    try:
        subprocess.run(cmd, check=True)
        res = json.loads((Path(out) / "r" / "results.json").read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    ops = res["ops"]
    total = sum(sum(v.values()) for v in ops.values())
    direct = sum(v.get("read", 0) + v.get("write", 0) for v in ops.values())
    window = res["run"]["duration_s"]
    return {"block_ops_per_s": total / window, "read_write_ops_per_s": direct / window}


# ------------------------------------------------------------------------------ main

def written_bytes(disk: str | None) -> int | None:
    """The block layer's count of bytes written to disk so far (None where it cannot be read)."""
    counters = (psutil.disk_io_counters(perdisk=True) or {}).get(disk) if disk else None
    return counters.write_bytes if counters is not None else None


def median_of(rounds: list[dict]) -> dict:
    """Median of each figure, with its range over the rounds under '<name>_range'."""
    out = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    out.update({f"{k}_range": [min(r[k] for r in rounds), max(r[k] for r in rounds)] for k in rounds[0]})
    return out


def gbps(stats: dict, name: str) -> str:
    lo, hi = stats[f"{name}_range"]
    return f"{stats[name]:.2f} GB/s ({lo:.2f}-{hi:.2f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=str(REPO / "reports" / "bench"), help="directory on the device under test")
    p.add_argument("--block-mib", type=float, default=80.0, help="block size (default: llama3.1-70b, 256 tokens)")
    p.add_argument("--size-gib", type=float, default=4.0, help="bytes moved per round and direction")
    p.add_argument("--threads", type=int, default=4, help="concurrency: tier threads = fio numjobs")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per NVMe phase (after 1 s ramp)")
    p.add_argument("--null-seconds", type=float, default=5.0)
    p.add_argument("--e2e-sizes", default="80M,2M,512K", help="block sizes of the whole-program vs fio rows")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    block = int(a.block_mib * MiB) // 4096 * 4096
    blocks = max(a.threads, int(a.size_gib * GiB) // block // a.threads * a.threads)
    why = probe_direct(a.dir)
    if why:
        print(f"O_DIRECT unavailable in {a.dir}: {why}", file=sys.stderr)
        return 2
    mount = mount_of(a.dir)
    disk = disk_of(a.dir)
    before = written_bytes(disk)
    print(f"# make bench: {a.dir} ({mount.fs_type} on {mount.source}), block {block / MiB:.1f} MiB, "
          f"{blocks} blocks x {a.rounds} rounds, {a.threads} threads; it rewrites {blocks * block / GiB:.1f} GiB "
          f"there for seconds at a time, tens of GB in all (the total is printed at the end)", flush=True)
    ours, fio, cpu = [], [], []
    for _ in range(a.rounds):  # interleaved, so drift hits both sides alike
        ours.append(nvme_tier_round(a.dir, block, blocks, a.threads, a.seconds))
        f = fio_round(a.dir, block, blocks, a.threads, a.seconds)
        if f:
            fio.append(f)
        cpu.append(cpu_round(block, min(blocks, int(2 * GiB // block)), min(a.threads, os.cpu_count() or 1)))
    result = {"block_bytes": block, "blocks": blocks, "threads": a.threads, "rounds": a.rounds,
              "fs_type": mount.fs_type, "device": mount.source, "nvme_tier": median_of(ours),
              "fio": median_of(fio) if fio else None, "cpu": median_of(cpu),
              "null": {w: null_rate(w, a.null_seconds) for w in (1, 2, 4)},
              "gpu": gpu_round(block, max(8, min(blocks, int(8 * GiB // block)))),
              "semantic": semantic_round(), "verify": verify_round(block),
              "policies": policy_round(),
              "e2e": e2e_round(e2e_defaults(dir=a.dir, sizes=a.e2e_sizes, workers=a.threads))}
    after = written_bytes(disk)
    result["device_written_bytes"] = after - before if before is not None and after is not None else None
    n, f, c = result["nvme_tier"], result["fio"], result["cpu"]
    lines = ["| measure | ours | limit | ratio |", "|---|---|---|---|"]
    if f:
        lines += [f"| NVMe tier {d} (direct) vs fio psync O_DIRECT | {gbps(n, d + '_gbps')} | "
                  f"{gbps(f, d + '_gbps')} | {n[d + '_gbps'] / f[d + '_gbps']:.2f} |" for d in ("write", "read")]
    else:
        lines.append(f"| NVMe tier write / read (fio not installed) | {n['write_gbps']:.2f} / "
                     f"{n['read_gbps']:.2f} GB/s | - | - |")
    pairs = (("put", "memcpy_in"), ("get", "memcpy_out"))
    lines += [f"| CPU tier {op} vs numpy copy | {gbps(c, op + '_gbps')} | {gbps(c, base + '_gbps')} | "
              f"{c[op + '_gbps'] / c[base + '_gbps']:.2f} |" for op, base in pairs]
    for w, r in result["null"].items():
        lines.append(f"| null tier, {w} worker(s): block ops/s (all ops; reads+writes only) | "
                     f"{r['block_ops_per_s']:,.0f} ({r['read_write_ops_per_s']:,.0f}) | target 20,000 | "
                     f"{r['block_ops_per_s'] / 20000:.2f} |")
    lines += gpu_lines(result["gpu"])
    lines += semantic_lines(result["semantic"])
    lines += verify_lines(result["verify"])
    lines += policy_lines(result["policies"])
    lines.append("\n(median over rounds, min-max in brackets; ratio = ours / limit)")
    if result["e2e"]:
        lines += ["", "The whole program vs fio (same block size, read/write mix, concurrency; one run each):", "",
                  e2e_tables(result["e2e"])]
    total = result["device_written_bytes"]
    lines.append(f"\nWritten to {disk or a.dir} during the bench: " + (
        f"{total / 1e9:,.1f} GB (block layer, every process's writes to that device)" if total is not None else
        "unknown (no block-layer counter for this directory's device)"))
    print("\n".join(lines))
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    print(f"\n(written to {out / 'bench.json'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
