"""The MLPerf reference and this benchmark on the same command lines, same machine, one table (docs/mlperf.md
"The MLPerf front door").

Each of the reference's four documented tests (shortened: fewer users, a shorter --duration; nothing else
changed) runs once with the reference's kv-cache.py and once with ours, one after the other on the same cache
directory's disk; both write the reference's --output schema, so one reader takes the same fields from both:
requests, tokens/s, storage GiB/s, storage p95s, hit rate, and the peak RSS of the process (its children
included). A run the kernel kills or the program refuses is a row that says so.

    python bench/mlperf_side_by_side.py --reference /path/to/storage/kv_cache_benchmark --cache-dir /mnt/nvme/x
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = {
    "1. storage baseline": ["--model", "llama3.1-8b", "--num-users", "20", "--duration", "10", "--gpu-mem-gb", "0",
                            "--cpu-mem-gb", "0", "--max-concurrent-allocs", "16", "--generation-mode", "none"],
    "2. production three-tier": ["--model", "llama3.1-8b", "--num-users", "20", "--duration", "10", "--gpu-mem-gb",
                                 "16", "--cpu-mem-gb", "4", "--generation-mode", "realistic"],
    "3. QoS autoscaler": ["--model", "llama3.1-8b", "--num-users", "10", "--duration", "20", "--gpu-mem-gb", "0",
                          "--cpu-mem-gb", "4", "--enable-autoscaling", "--autoscaler-mode", "qos"],
    "4. capacity autoscaler, 70B": ["--model", "llama3.1-70b-instruct", "--num-users", "10", "--duration", "20",
                                    "--gpu-mem-gb", "0", "--cpu-mem-gb", "4", "--enable-autoscaling",
                                    "--autoscaler-mode", "capacity", "--generation-mode", "none"],
}


def _peak_child_rss() -> int:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def one(entry: list[str], args: list[str], cache: Path, out: Path, timeout: float) -> dict:
    """Run one command line; its --output fields, exit status and peak RSS."""
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    # NOTE: ru_maxrss of RUSAGE_CHILDREN is the largest child so far: each run is measured in a fresh helper
    helper = [sys.executable, "-c", "import resource,subprocess,sys; r=subprocess.run(sys.argv[1:]).returncode; "
              "print('PEAK_RSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); sys.exit(r)"]
    start = time.monotonic()
    p = subprocess.run([*helper, *entry, *args, "--cache-dir", str(cache), "--seed", "42", "--output", str(out)],
                       capture_output=True, text=True, timeout=timeout, cwd=out.parent)
    peak = next((int(x.split()[1]) for x in p.stdout.splitlines() if x.startswith("PEAK_RSS")), 0)
    row = {"status": p.returncode, "peak_rss_gib": peak / 2**30, "wall_s": time.monotonic() - start}
    if p.returncode == 0 and out.exists():
        s = json.loads(out.read_text())["summary"]
        c = s["cache_stats"]
        row.update(requests=s["total_requests"], tokens_per_s=s["avg_throughput_tokens_per_sec"],
                   read_gibps=c.get("tier_storage_read_bandwidth_gbps"), write_gibps=c.get("tier_storage_write_"
                                                                                           "bandwidth_gbps"),
                   read_p95=c.get("storage_read_p95_ms"), write_p95=c.get("storage_write_p95_ms"),
                   hit_rate=c.get("cache_hit_rate"))
    else:
        row["why"] = "killed (out of memory?)" if p.returncode in (-9, 137) else (p.stderr.strip().splitlines()
                                                                                  or ["?"])[-1][:160]
    return row


def _cell(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(rows: list[tuple[str, str, dict]]) -> str:
    out = ["| test | run by | exit | requests | tokens/s | storage read / write GiB/s | storage read / write p95 "
           "ms | hit rate | peak RSS GiB |", "|---|---|---|---|---|---|---|---|---|"]
    for test, who, r in rows:
        if "why" in r:
            out.append(f"| {test} | {who} | {r['status']} | {r['why']} | | | | | {r['peak_rss_gib']:.2f} |")
            continue
        out.append(f"| {test} | {who} | 0 | {r['requests']} | {_cell(r['tokens_per_s'], ',.1f')} | "
                   f"{_cell(r['read_gibps'], '.3f')} / {_cell(r['write_gibps'], '.3f')} | "
                   f"{_cell(r['read_p95'], ',.1f')} / {_cell(r['write_p95'], ',.1f')} | "
                   f"{_cell(r['hit_rate'], '.3f')} | {r['peak_rss_gib']:.2f} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", default=os.environ.get("MLPERF_REFERENCE", ""),
                   help="the reference's kv_cache_benchmark/ folder (holding kv-cache.py)")
    p.add_argument("--cache-dir", default="", help="a folder on the disk under test (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--only", nargs="*", default=[], help="test numbers to run (default: all four)")
    a = p.parse_args()
    ref = Path(a.reference) / "kv-cache.py" if a.reference else None
    if ref is None or not ref.is_file():
        print("mlperf_side_by_side: no reference (--reference DIR with kv-cache.py); nothing measured.")
        return 0
    work = Path(tempfile.mkdtemp(prefix="side-by-side-", dir=a.cache_dir or None))
    rows = []
    try:
        for test, args in TESTS.items():
            if a.only and test.split(".")[0] not in a.only:
                continue
            for who, entry in (("reference", [sys.executable, str(ref)]),
                               ("kv-cache-bench", [sys.executable, str(REPO / "kv_cache_benchmark.py")])):
                r = one(entry, args, work / "cache", work / f"{who}.json", a.timeout)
                rows.append((test, who, r))
                print(f"  {test} / {who}: exit {r['status']}, {r.get('requests', '-')} requests, peak RSS "
                      f"{r['peak_rss_gib']:.2f} GiB, {r['wall_s']:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    print("commands: " + "; ".join(f"{t}: {' '.join(args)}" for t, args in TESTS.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
