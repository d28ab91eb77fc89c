#!/usr/bin/env python3
"""One MPI rank of an mlpstorage kvcache run: what mlpstorage starts under mpirun beside kv-cache.py.

mlpstorage runs `mpirun ... python mlperf_wrapper.py --rank-output-base DIR --rank-cache-base DIR --seed-base N
--config FILE <the option's kv-cache.py flags>` for each option and trial, then reads DIR/rank_<r>/
kvcache_results_*.json of every rank. This wrapper takes the same arguments and writes the same names as the
reference's: the rank comes from the launcher's environment (Open MPI's OMPI_COMM_WORLD_RANK, MPICH's PMI_RANK),
the rank's seed is the base + rank, its results file and cache folder are its own, and every other argument
goes to kv-cache.py unchanged. Each rank is a run of its own, as in the reference (mlpstorage aggregates them):
the launcher's variables are removed from its environment so that it does not join the ranks itself.

--start-delay / --end-delay: the pause before and after the run (the reference's 90 s each, which mlpstorage
does not change); KV_CACHE_WRAPPER_DELAY_S sets both defaults (a test, or a quick trial of the harness).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

BASE_SEED = 42
DELAY_S = 90
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCALNRANKS", "SLURM_PROCID", "HYDRA_", "OPAL_", "PRTE_")


def rank_of(env) -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def standalone_env(env) -> dict:
    """The environment without the launcher's variables: the run is one process, not a rank of an MPI job."""
    return {k: v for k, v in env.items() if not k.startswith(LAUNCHER_PREFIXES)}


MOST_DELAY_S = 86400.0  # a pause longer than a day is a typo, not a harness setting
PROG = "mlperf_wrapper.py"


class Refused(Exception):
    """Bad input: one sentence on stderr, exit 2 (never a traceback)."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise Refused(f"{message}; see {PROG} --help.")


def seconds(text: str, where: str = "") -> float:
    """A pause in seconds: a finite number from 0 to a day."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= MOST_DELAY_S:
        msg = f"must be a number of seconds from 0 to {MOST_DELAY_S:g}, got {text!r}"
        if where:
            raise Refused(f"{where} {msg}.")
        raise argparse.ArgumentTypeError(msg)
    return value


def main(argv=None) -> int:
    try:
        return _main(argv)
    except Refused as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    default_delay = seconds(os.environ.get("KV_CACHE_WRAPPER_DELAY_S", str(DELAY_S)), "KV_CACHE_WRAPPER_DELAY_S")
    p = Parser(prog=PROG, description="One MPI rank of an mlpstorage kvcache run", allow_abbrev=False)
    p.add_argument("--rank-output-base", required=True, help="per-rank results go to <base>/rank_<N>/")
    p.add_argument("--rank-cache-base", required=True, help="per-rank cache folders are <base>/rank_<N>/")
    p.add_argument("--seed-base", type=int, default=BASE_SEED, help="the rank's seed is this + its rank")
    p.add_argument("--start-delay", type=seconds, default=default_delay, help="seconds before the run")
    p.add_argument("--end-delay", type=seconds, default=default_delay, help="seconds after the run")
    args, forwarded = p.parse_known_args(argv)
    rank = rank_of(os.environ)
    out_dir = Path(args.rank_output_base) / f"rank_{rank}"
    cache_dir = Path(args.rank_cache_base) / f"rank_{rank}"
    for flag, folder in (("--rank-output-base", out_dir), ("--rank-cache-base", cache_dir)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise Refused(f"{flag} {folder.parent}: cannot make the rank's folder {folder} ({e.strerror}); pass a "
                          f"writable folder.") from None
    output = out_dir / f"kvcache_results_{time.strftime('%Y%m%d_%H%M%S')}.json"
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "kv-cache.py"), *forwarded,
           "--seed", str(args.seed_base + rank), "--output", str(output), "--cache-dir", str(cache_dir),
           "--output-dir", str(out_dir / "reports")]
    print(f"kv-cache-bench wrapper (rank {rank}): start delay {args.start_delay:g} s", flush=True)
    time.sleep(args.start_delay)
    status = subprocess.run(cmd, env=standalone_env(os.environ)).returncode
    print(f"kv-cache-bench wrapper (rank {rank}): exit {status}; end delay {args.end_delay:g} s", flush=True)
    time.sleep(args.end_delay)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
