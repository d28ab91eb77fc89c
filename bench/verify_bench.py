"""Cost of verifying a block read back, per mode, against the memory copy that moving the block costs.

Each mode is timed on pre-filled blocks of the bench's block size: ``checksum`` (XXH3-64 of the whole
block, the default; a write also takes one), ``full`` (every byte compared with the regenerated
payload), ``stamps`` (16 bytes of each 4 KiB page). Figures: GB/s verified on 1 thread and on all
cores' threads at once (the generator's workers are threads: a mode that holds the GIL does not
scale), and the share of one core a tier at a given bandwidth would spend verifying.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from kv_cache.buffers import aligned_buffer
from kv_cache.lifecycle.payload import PayloadPool, block_digest

MODES = ("checksum", "full", "stamps")


def _rate(work, threads: int, seconds: float, nbytes: int) -> float:
    done = [0] * threads
    stop = time.perf_counter() + seconds

    def run(i: int) -> None:
        while time.perf_counter() < stop:
            work(i)
            done[i] += 1

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(done) * nbytes / (time.perf_counter() - start) / 1e9


def verify_round(block: int, seconds: float = 1.0) -> dict:
    block = min(block, 64 << 20)
    threads = os.cpu_count() or 1
    pool = PayloadPool(seed=1)
    bufs = [aligned_buffer(block) for _ in range(threads)]
    dst = [aligned_buffer(block) for _ in range(threads)]
    for i, b in enumerate(bufs):
        pool.fill(i, b)
    digests = [block_digest(b) for b in bufs]
    out = {"block_bytes": block, "threads": threads}
    for mode in MODES:
        def work(i: int, mode: str = mode) -> None:
            assert pool.check(i, bufs[i], mode, digests[i])
        out[mode] = {"1_thread_gbps": _rate(work, 1, seconds, block),
                     f"{threads}_threads_gbps": _rate(work, threads, seconds, block)}
    out["memcpy"] = {"1_thread_gbps": _rate(lambda i: np.copyto(dst[i], bufs[i]), 1, seconds, block),
                     f"{threads}_threads_gbps": _rate(lambda i: np.copyto(dst[i], bufs[i]), threads, seconds,
                                                      block)}
    return out


def lines(r: dict) -> list[str]:
    n = r["threads"]
    copy = r["memcpy"]["1_thread_gbps"]
    rows = []
    for mode in MODES:
        one, many = r[mode]["1_thread_gbps"], r[mode][f"{n}_threads_gbps"]
        rows.append(f"| verify {mode}, {r['block_bytes'] >> 20} MiB blocks: GB/s on 1 thread ({n} threads: "
                    f"{many:.1f}); a 10 GB/s tier would spend {10 / one:.2f} cores | {one:.1f} | memcpy "
                    f"{copy:.1f} | {one / copy:.2f} |")
    return rows


if __name__ == "__main__":
    print("\n".join(lines(verify_round(32 << 20))))
