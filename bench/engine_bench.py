#!/usr/bin/env python3
"""make bench, the NVMe tier's engines (issue 40): io_uring against the direct engine and fio's own io_uring engine.

On a RAM-backed loop device (ext4 on losetup over a file in /dev/shm, made and removed here as root; elsewhere the
folder given with --dir), at 512 KiB, 2 MiB and 80 MiB blocks, each block moved in 2 MiB I/O units (--io-unit's
shape: an 80 MiB block is 40 units): the p50 time to write, then to read, one block through our engine (its
read / write, as the tier calls them) against fio (ioengine io_uring, direct=1, the same block size, iodepth = the
block's units, one job, the same file; fio's per-block figure is derived: its per-I/O p50 x the block's units /
its depth). Rounds alternate ours and fio's; the figure is the median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_cache.buffers import aligned_buffer  # noqa: E402
from kv_cache.run.registry import discover  # noqa: E402
from kv_cache.tiers.engines import Target  # noqa: E402

ENGINES = discover().engines
UNIT = 2 << 20
SIZES = (512 << 10, 2 << 20, 80 << 20)


def ours(engine: str, path: str, size: int, n: int) -> tuple[float, float]:
    """(write p50, read p50) in ms of n blocks of size at distinct offsets of path."""
    e = ENGINES[engine]
    fd = os.open(path, os.O_RDWR | os.O_CREAT | e.open_flags, 0o600)
    os.posix_fallocate(fd, 0, size * n)
    t, buf = Target(path, fd), aligned_buffer(size)
    buf[:] = 7
    w, r = [], []
    for i in range(n):
        s = time.perf_counter()
        e.write(t, i * size, buf, UNIT, None)
        w.append(time.perf_counter() - s)
    for i in range(n):
        s = time.perf_counter()
        e.read(t, i * size, buf, UNIT, None)
        r.append(time.perf_counter() - s)
    os.close(fd)
    return float(np.median(w) * 1e3), float(np.median(r) * 1e3)


def fio(path: str, size: int, n: int) -> tuple[float, float]:
    """fio's io_uring engine on the same file: (write p50, read p50) per block in ms, as n blocks of size moved in
    units of UNIT with all of a block's units in flight (iodepth)."""
    depth, bs = max(1, size // UNIT), min(size, UNIT)
    out = []
    for rw in ("write", "read"):
        cmd = ["fio", "--name=kv", f"--filename={path}", "--ioengine=io_uring", "--direct=1", f"--rw={rw}",
               f"--bs={bs}", f"--iodepth={depth}", f"--iodepth_batch_submit={depth}",
               f"--iodepth_batch_complete_min={depth}", f"--size={size * n}", "--output-format=json"]
        res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        job = res["jobs"][0][rw]
        per_io_ms = job["lat_ns"]["percentile"]["50.000000"] / 1e6 if "percentile" in job["lat_ns"] else \
            job["clat_ns"]["percentile"]["50.000000"] / 1e6
        out.append(per_io_ms * (size / bs) / depth)  # a block's units in flight together: one I/O's time per batch
    return out[0], out[1]


def loop_dir(stack) -> str:
    """ext4 on a loop device over a file in /dev/shm (root), unmounted and removed at the end."""
    img = tempfile.mktemp(dir="/dev/shm", suffix=".img")
    mnt = tempfile.mkdtemp(prefix="kvbench-loop-")
    subprocess.run(["truncate", "-s", "2G", img], check=True)
    made = subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True, check=True)
    dev = made.stdout.strip()
    subprocess.run(["mkfs.ext4", "-q", dev], check=True)
    subprocess.run(["mount", dev, mnt], check=True)
    stack.append(lambda: (subprocess.run(["umount", mnt]), subprocess.run(["losetup", "-d", dev]), os.unlink(img),
                          os.rmdir(mnt)))
    return mnt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where the files go (default: a RAM-backed loop device as root, else /tmp)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if ENGINES["io_uring"].unavailable():
        print(f"engine bench: skipped: {ENGINES['io_uring'].unavailable()}")
        return
    stack: list = []
    try:
        where = a.dir or (loop_dir(stack) if os.geteuid() == 0 else "/tmp")
        print(f"Engines on {where}, {UNIT >> 20} MiB I/O units; p50 per block, ms (median of {a.rounds} rounds):")
        print(f"  {'block':>8} {'direct w/r':>16} {'io_uring w/r':>16} {'fio io_uring w/r':>18} "
              f"{'ours/fio read':>14}")
        for size in SIZES:
            n = max(4, min(64, (256 << 20) // size))  # three files of n blocks fit the 2 GiB loop
            rows = {"direct": [], "io_uring": [], "fio": []}
            for _ in range(a.rounds):
                for name in ("direct", "io_uring"):
                    rows[name].append(ours(name, f"{where}/{name}.bin", size, n))
                rows["fio"].append(fio(f"{where}/fio.bin", size, n))
            med = {k: tuple(np.median([x[i] for x in v]) for i in (0, 1)) for k, v in rows.items()}
            print(f"  {size / 2**20:7.2f}M {med['direct'][0]:7.2f}/{med['direct'][1]:<7.2f} "
                  f"{med['io_uring'][0]:7.2f}/{med['io_uring'][1]:<7.2f} {med['fio'][0]:8.2f}/{med['fio'][1]:<8.2f} "
                  f"{med['fio'][1] / med['io_uring'][1]:14.2f}")
            for name in ("direct", "io_uring", "fio"):
                os.unlink(f"{where}/{name}.bin")
    finally:
        for undo in reversed(stack):
            undo()


if __name__ == "__main__":
    main()
