#!/usr/bin/env python3
"""Two checkouts of the program, run alternately on one directory: did a change make it cheaper?

This VM's speed drifts by tens of percent within an hour, so two commits are compared only in
pairs of runs made back to back (base, this, base, this, ...) with the same command: the run of
the whole program that bench/e2e_bench.py makes (cache tier off, every block to the storage tier;
no fio). Each row: device GB/s, CPU seconds per GiB moved, read / write p95. Make the other
checkout with `git worktree add /tmp/base <commit>` (and `git worktree remove /tmp/base` after):

    python bench/paired_bench.py --base /tmp/base --dir /mnt/kvloop --size 512K --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_bench  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="The other checkout (a git worktree of the commit to compare).")
    e2e_bench.run_arguments(p)
    p.add_argument("--size", default="512K", choices=sorted(e2e_bench.SIZES))
    p.add_argument("--rounds", type=int, default=3, help="Pairs of runs (base then this).")
    p.add_argument("--out", default=str(e2e_bench.REPO / "bench" / "out" / "paired-runs"))
    args = p.parse_args()
    checkouts = {"base": Path(args.base).resolve(), "this": e2e_bench.REPO}
    for name, repo in checkouts.items():
        if not (repo / "kv_cache_benchmark.py").is_file():
            print(f"paired_bench: {repo} ({name}) holds no kv_cache_benchmark.py; give --base a checkout of this "
                  f"repository (git worktree add /tmp/base <commit>).", file=sys.stderr)
            return 2
    print(f"| round | checkout | GB/s | CPU-s/GiB | read / write p95 ms |  ({args.size}, {args.workers} workers)")
    print("|---|---|---|---|---|")
    os.makedirs(args.dir, exist_ok=True)
    out = Path(args.out)
    for i in range(max(1, args.rounds)):
        for name, repo in checkouts.items():
            try:
                o = e2e_bench.ours(args, args.size, out, repo)
            except subprocess.CalledProcessError as e:
                print(f"paired_bench: the run in {repo} ({name}) exited {e.returncode}; its own message is above.",
                      file=sys.stderr)
                return 1
            finally:
                shutil.rmtree(out, ignore_errors=True)  # the report folders: only the figures are kept
            print(f"| {i + 1} | {name} | {o['gbps']:.2f} | {o['cpu_s_per_gib']:.3f} | "
                  f"{o['read']['p95'] or 0:.2f} / {o['write']['p95'] or 0:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
