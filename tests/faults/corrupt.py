"""Corrupt a running benchmark's slab files: random 4-byte writes at random offsets, until told to stop.

    python tests/faults/corrupt.py CACHE_DIR SECONDS [WRITES_PER_S]

Used by the fault tests; it writes only into kvbench-*/slab-*.kv files under CACHE_DIR.
"""

from __future__ import annotations

import glob
import os
import random
import sys
import time


def corrupt(cache_dir: str, seconds: float, per_s: float = 200.0, seed: int = 1) -> int:
    rng = random.Random(seed)
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        slabs = glob.glob(os.path.join(cache_dir, "kvbench-*", "slab-*.kv"))
        for path in slabs:
            try:
                size = os.path.getsize(path)
                if size < 8:
                    continue
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(fd, rng.randbytes(4), rng.randrange(0, size - 4))
                    n += 1
                finally:
                    os.close(fd)
            except OSError:
                pass  # the run removed its files meanwhile
        time.sleep(1.0 / per_s)
    return n


if __name__ == "__main__":
    print(corrupt(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 200.0))
