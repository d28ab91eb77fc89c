#!/usr/bin/env python3
"""The whole program against fio on the same directory: does the storage, or the generator, decide?

For each block size, one run of kv_cache_benchmark.py (cache tier off, so every block goes to the
storage tier) and one fio job with the same I/O size (the block, or with --io-unit layer the tier's layer unit:
results' run.tiers.<tier>.io_unit_bytes), the run's read/write mix, the same
concurrency (numjobs = workers x processes) and the same I/O shape, O_DIRECT, time-based: psync when the run
moves a request's blocks one at a time (--request-io serial), io_uring at iodepth = the most I/Os the run's engine
keeps in flight per worker when it moves them in batches (the default in block mode: --max-inflight, or fewer where
the engine holds fewer: io_uring's ring holds 64, a pool 64 threads; the same total queue depth, that x workers,
that the issue's target names). Both write their space before the clock: fio lays its files out, the run
preconditions its slabs once (--precondition-passes 1). Reported side by side:

- device GB/s as the block layer saw it (/proc/diskstats of the directory's device; the run's
  telemetry for ours, a diskstats delta around fio's timed part for fio);
- per-block p50 / p95 / p99 of reads and writes (ours) against fio's completion latency (clat); none of ours with
  layer units (a unit is timed from its batch's submission, fio's clat from its own: UNITS_NOTE);
- the I/O shape, workers (fio: jobs) x depth: ours with the mean depth its storage tier's batches achieved
  (the I/Os its engine had in flight, measured; loads and stores weighted by their batches), fio's as set;
- CPU seconds per GiB moved: the run's process CPU time in its window (every thread) against
  fio's usr + sys time of its jobs. Kernel threads (a loop device's worker) are in neither.
- with --verify checksum (the program's default), a second CPU ratio against fio's CPU plus the check's own:
  fio moves bytes and checks none, where the run hashes every byte it moves once (XXH3 at write, again at read),
  so no program that checks them can reach fio's CPU. The check's CPU per GiB is measured in the same round:
  the program's own block_digest over a buffer larger than the caches, in blocks of the run's size (the bytes a
  worker hashes come from memory, not from its cache). The limit fio + check is the least CPU per GiB any
  generator checking every byte could spend; the ratio against it is the generator's own cost.
- where the run's engine keeps its depth with a thread an O_DIRECT I/O (the direct engine's pool), a second
  table against the same I/O model in fio, from the same rounds: psync, a job for each I/O the run keeps in flight
  (workers x the pool's threads). fio's io_uring is the cheapest way to that depth; fio's threads say what a thread
  an I/O costs in C, so the ratio to them is what Python adds to that model.

Point it at the device under test with --dir. To see the generator's own ceiling, use a fast and
steady device: a RAM-backed loop device (as root):

    truncate -s 8G /dev/shm/kv.img && LOOP=$(losetup -f --show /dev/shm/kv.img)
    mkfs.ext4 -q $LOOP && mkdir -p /mnt/kvloop && mount $LOOP /mnt/kvloop
    python bench/e2e_bench.py --dir /mnt/kvloop --rounds 3
    umount /mnt/kvloop && losetup -d $LOOP && rm /dev/shm/kv.img
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kv_cache.lifecycle.payload import block_digest  # noqa: E402
from kv_cache.recorder.telemetry import disk_of  # noqa: E402
from kv_cache.run.registry import discover  # noqa: E402

ENGINES = discover().engines

GiB = 2**30
# (label, model, block tokens): 80 MiB (llama70b, 256 tokens), 2 MiB (llama8b, 16), 512 KiB (llama8b, 4)
SIZES = {"80M": ("llama70b", 256, 80 << 20), "2M": ("llama8b", 16, 2 << 20), "512K": ("llama8b", 4, 512 << 10)}


def diskstats(device: str | None) -> tuple[int, int] | None:
    """(read bytes, written bytes) of a block device so far."""
    if device is None:
        return None
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] == device:
            return int(f[5]) * 512, int(f[9]) * 512
    return None


def ours(args, label: str, out: Path, repo: Path = REPO) -> dict:
    """One run of the program in checkout repo (this one unless told) at block size label: its figures."""
    model, tokens, block = SIZES[label]
    run_id = f"e2e-{label}-{int(time.time())}"
    cmd = [sys.executable, str(repo / "kv_cache_benchmark.py"), "--model", model, "--block-tokens", str(tokens),
           "--cpu-mem-gb", "0", "--gpu", "off", "--cache-dir", args.dir,
           "--nvme-gb", f"{args.nvme_gb / args.processes:g}",  # per rank: the same bytes in all as with one
           "--workers", str(args.workers), "--duration", str(args.duration), "--warmup", str(args.warmup),
           "--users", str(args.users), "--output-dir", str(out), "--run-id", run_id, "--quiet",
           # its slabs written once before the clock, as fio lays its files out: on a RAM loop made just before, the
           # first writes into never-written space ran at 0.77-0.88 of fio's GB/s, 1.12-1.23 once written (80 MiB)
           "--precondition", "--precondition-passes", "1",
           *(["--processes", str(args.processes)] if args.processes > 1 else []), *args.extra]
    subprocess.run(cmd, check=True)
    return figures(json.loads((out / run_id / "results.json").read_text()))


def figures(r: dict) -> dict:
    """A run's figures for the table, read from its results.json (r): its storage tier's."""
    bottom = r["run"]["bottom_tier"]
    lat = r["latency_ms"].get(bottom, {})
    disk = (r.get("telemetry") or {}).get("disk") or {}
    window = r["run"]["duration_s"]
    moved = r["bytes"][bottom]["read"] + r["bytes"][bottom]["write"]
    dev = disk.get("read_bytes", 0) + disk.get("write_bytes", 0)
    depths = (r.get("queue_depth") or {}).get(bottom, {})
    batches = sum(d["batches"] for d in depths.values())
    tier = r["run"]["tiers"].get(bottom) or {}
    unit = tier.get("io_unit_bytes")  # --io-unit layer: a block moves as I/Os of this size, each timed as <op>_io
    return {"gbps": (dev or moved) / window / 1e9, "device_observed": bool(dev),
            "request_io": r["run"].get("request_io", "serial"), "max_inflight": r["run"].get("max_inflight", 1),
            "engine": r["run"]["io_engine"], "depth": achieved(depths, batches),
            # the most I/Os a worker's batch keeps in flight on the storage tier, as the tier set it up (null: an
            # older checkout's results, or a medium with no queue of its own)
            "io_depth": tier.get("io_depth"),
            "io_bytes": unit or r["run"]["block_bytes"], "io_unit": bool(unit),  # the bytes an I/O moves: fio's --bs
            "read_fraction": r["bytes"][bottom]["read"] / moved if moved else 0.0,
            "read": {k: lat.get("read", {}).get(k) for k in ("p50", "p95", "p99")},
            "write": {k: lat.get("write", {}).get(k) for k in ("p50", "p95", "p99")},
            "cpu_s_per_gib": r["cpu"]["process_s"] / (dev or moved) * GiB if (dev or moved) else None,
            "workers": r["run"]["workers"], "ranks": r["run"]["ranks"],
            "verify": (r.get("verification") or {}).get("mode")}


def achieved(depths: dict, batches: int) -> float:
    """The mean queue depth the storage tier's batches gave it, weighted by their count: the I/Os its engine had in
    flight where it measured them (a pool of threads keeps fewer than a batch's blocks), else the blocks a batch."""
    if not batches:
        return 1.0
    return sum((d["in_flight_mean"] if d.get("in_flight_mean") is not None else d["mean"]) * d["batches"]
               for d in depths.values()) / batches


COLD_BYTES = 1 << 30  # larger than any cache a worker's hash could find its bytes in


def check_cost(block: int, passes: int = 2) -> float | None:
    """CPU seconds per GiB of the program's own block checksum (block_digest, XXH3-64) over blocks of this size
    in memory no cache holds: a 1 GiB buffer (touched by its fill first) hashed block by block, the quickest of
    `passes` passes, on this thread's CPU clock. None where 1 GiB cannot be had."""
    try:
        buf = np.full(COLD_BYTES // block * block, 0x5A, dtype=np.uint8)
    except MemoryError:
        return None
    best = None
    for _ in range(passes):
        t0 = time.thread_time()
        for at in range(0, buf.size, block):
            block_digest(buf[at:at + block])
        took = time.thread_time() - t0
        best = took if best is None else min(best, took)
    return best / (buf.size / GiB)


def fio_shape(o: dict) -> tuple[str, int, int]:
    """fio's engine, per-job depth and I/O size for the I/O shape of run o: io_uring at the most I/Os its storage
    tier keeps in flight per worker when it batched (results' run.tiers.<tier>.io_depth: --max-inflight blocks or
    their layer units, fewer where the engine's ring or pool holds fewer), each I/O a block or, with --io-unit layer,
    a layer unit (run.tiers.<tier>.io_unit_bytes)."""
    if o["request_io"] != "batched":
        return "psync", 1, o["io_bytes"]
    return "io_uring", max(1, o["io_depth"] or 1), o["io_bytes"]


def threads_shape(o: dict) -> int | None:
    """For a run whose engine keeps its depth with a thread an O_DIRECT I/O (the direct engine's pool), the same I/O
    model in fio: psync with as many jobs per worker as the pool keeps I/Os in flight. None otherwise (the buffered
    engine's fsync and dropped pages have no fio job of the same shape)."""
    engine = ENGINES[o["engine"]]
    if o["request_io"] != "batched" or not engine.pooled or engine.fio[:2] != ("psync", 1):
        return None
    return max(1, o["io_depth"] or 1)


def fio(args, read_fraction: float, jobs: int, shape: tuple[str, int, int]) -> dict | None:
    if shutil.which("fio") is None:
        return None
    engine, depth, block = shape
    work = tempfile.mkdtemp(prefix="e2e-fio-", dir=args.dir)
    size = max(block, int(args.nvme_gb * GiB) // jobs // block * block)
    base = ["fio", "--name=kv", f"--directory={work}", f"--bs={block}", "--direct=1", f"--ioengine={engine}",
            f"--iodepth={depth}", f"--numjobs={jobs}", f"--size={size}", "--rw=randrw",
            f"--rwmixread={round(100 * read_fraction)}"]
    device = disk_of(args.dir)
    try:
        subprocess.run(base + ["--create_only=1"], check=True, capture_output=True)  # layout: not timed
        before, t0 = diskstats(device), time.monotonic()
        res = subprocess.run(base + ["--time_based", f"--runtime={args.duration}", "--output-format=json"],
                             check=True, capture_output=True, text=True)
        elapsed, after = time.monotonic() - t0, diskstats(device)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    jobs_out = json.loads(res.stdout)["jobs"]
    moved = sum(j[d]["io_bytes"] for j in jobs_out for d in ("read", "write"))
    runtime = max(j["job_runtime"] for j in jobs_out) / 1e3
    cpu_s = sum((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1e3 for j in jobs_out)
    dev = (after[0] - before[0] + after[1] - before[1]) if before and after else 0

    def clat(d: str) -> dict:
        pcts = {}
        for j in jobs_out:  # the worst job's percentile: fio's per-job clat (jobs see the same device)
            p = j[d]["clat_ns"].get("percentile", {})
            for k, key in (("p50", "50.000000"), ("p95", "95.000000"), ("p99", "99.000000")):
                if key in p:
                    pcts[k] = max(pcts.get(k, 0.0), p[key] / 1e6)
        return pcts

    return {"gbps": (dev / elapsed if dev else moved / runtime) / 1e9, "device_observed": bool(dev),
            "engine": engine, "jobs": jobs, "depth": depth, "bs": block, "read": clat("read"), "write": clat("write"),
            "cpu_s_per_gib": cpu_s / (moved / GiB) if moved else None}


def shown(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(rows: list[dict]) -> str:
    """One line per block size: the round with the median bandwidth ratio, and the ratios' range over rounds."""
    head = ("| block | I/O, workers x depth: ours (mean) / fio | ours GB/s | fio GB/s | ratio | "
            "read p95 ours / fio ms | write p95 ours / fio ms | "
            "p95 ratio (worse) | CPU-s/GiB ours / fio | CPU ratio | CPU-s/GiB of the check | "
            "CPU ratio to fio + check | rounds: ratio, p95 ratio, CPU ratio, to fio + check |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        o, f = r["ours"], r["fio"] or {}
        lines.append(f"| {r['label']} | {shape(r)} | {o['gbps']:.2f} | {f.get('gbps', 0):.2f} | "
                     f"{shown(bandwidth_ratio(r))} | "
                     f"{shown(p95(o, 'read'))} / {f.get('read', {}).get('p95', 0):.2f} | "
                     f"{shown(p95(o, 'write'))} / {f.get('write', {}).get('p95', 0):.2f} | "
                     f"{shown(p95_ratio(r))} | {o['cpu_s_per_gib'] or 0:.3f} / "
                     f"{f.get('cpu_s_per_gib') or 0:.3f} | {shown(cpu_ratio(r))} | {check_shown(r)} | "
                     f"{shown(checked_cpu_ratio(r))} | {spread(r.get('rounds') or [r])} |")
    return "\n".join(lines)


UNITS_NOTE = ("With --io-unit layer fio moves I/Os of a layer unit's size, and ours p95 is '-': a unit's latency runs "
              "from its batch's submission (most of a batch's units wait behind the ring's depth), fio's clat from its "
              "own submission.")


def tables(rows: list[dict]) -> str:
    """The table against fio's io_uring, and where ours kept its depth with threads, the one against fio's threads."""
    threads = threads_table(rows)
    note = f"\n\n{UNITS_NOTE}" if any(r["ours"].get("io_unit") for r in rows) else ""
    return table(rows) + note + (f"\n\nThe same I/O model in fio (a synchronous I/O a thread, as many threads as "
                                 f"ours keeps I/Os in flight):\n\n{threads}" if threads else "")


def threads_table(rows: list[dict]) -> str:
    """Where our engine keeps its depth with a thread an I/O: the same model in fio (psync, a job an I/O in flight),
    from the same rounds: what threads at that depth cost in C, beside what they cost in ours."""
    kept = [r for r in rows if r.get("fio_threads")]
    if not kept:
        return ""
    lines = ["| block | fio psync jobs | ours GB/s / fio psync | ratio | p95 ratio (worse) | CPU-s/GiB ours / fio "
             "psync | CPU ratio | rounds: ratio, p95 ratio, CPU ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in kept:
        t = _as_fio(r, "fio_threads")
        f = t["fio"]
        lines.append(f"| {r['label']} | {f['jobs']} | {r['ours']['gbps']:.2f} / {f['gbps']:.2f} | "
                     f"{shown(bandwidth_ratio(t))} | {shown(p95_ratio(t))} | {r['ours']['cpu_s_per_gib'] or 0:.3f} / "
                     f"{f.get('cpu_s_per_gib') or 0:.3f} | {shown(cpu_ratio(t))} | "
                     f"{spread([_as_fio(x, 'fio_threads') for x in r.get('rounds') or [r]], 3)} |")
    return "\n".join(lines)


def _as_fio(r: dict, key: str) -> dict:
    """Round r with its fio figures of another fio job (key) in fio's place: the same ratios over them."""
    return {**r, "fio": r.get(key)}


def shape(r: dict) -> str:
    """The I/O shape of a row, workers (or jobs) x depth: ours as run with its batches' mean depth, fio's as set."""
    o, f = r["ours"], r["fio"] or {}
    mine = f"{o.get('request_io', 'serial')} {o['workers'] * o['ranks']} x {o.get('depth', 1.0):.1f}"
    if o.get("io_unit"):  # the I/Os are layer units, not blocks: their size said
        mine += f" of {o['io_bytes'] >> 10} KiB"
    return f"{mine} / {f['engine']} {f['jobs']} x {f['depth']}" if f else f"{mine} / -"


def bandwidth_ratio(r: dict) -> float | None:
    return r["ours"]["gbps"] / r["fio"]["gbps"] if r["fio"] and r["fio"]["gbps"] else None


def p95(o: dict, d: str) -> float | None:
    """Our p95 of an I/O in direction d (read, write) beside fio's clat: a block's, from its batch's submission to
    its completion. None where a block is cut into layer units: fio's I/O is then a unit, and a unit's latency runs
    from its batch's submission too (a batch of 32 blocks is ~1,000 units, most queued behind the ring's 64), not
    from its own as fio's clat does: no figure of ours is that one (UNITS_NOTE)."""
    return None if o.get("io_unit") else o[d].get("p95")


def p95_ratio(r: dict) -> float | None:
    f = r["fio"] or {}
    got = [p95(r["ours"], d) / f[d]["p95"] for d in ("read", "write") if p95(r["ours"], d) and f.get(d, {}).get("p95")]
    return max(got) if got else None


def cpu_ratio(r: dict) -> float | None:
    o, f = r["ours"]["cpu_s_per_gib"], (r["fio"] or {}).get("cpu_s_per_gib")
    return o / f if o and f else None


def checked_cpu_ratio(r: dict) -> float | None:
    """Ours against fio's CPU plus the check's, per GiB: only where the run checksummed every byte it moved."""
    o, f, c = r["ours"]["cpu_s_per_gib"], (r["fio"] or {}).get("cpu_s_per_gib"), r.get("check_s_per_gib")
    return o / (f + c) if o and f and c and r["ours"].get("verify") == "checksum" else None


def check_shown(r: dict) -> str:
    if r["ours"].get("verify") != "checksum":
        return f"- (--verify {r['ours'].get('verify') or '?'}: no checksum)"
    return "- (not measured: no 1 GiB to hash)" if r.get("check_s_per_gib") is None else f"{r['check_s_per_gib']:.3f}"


def spread(rounds: list[dict], ratios: int = 4) -> str:
    """min-max of each ratio over the rounds (a single round: its value): the first `ratios` of bandwidth, p95,
    CPU and CPU against fio + the check."""
    parts = []
    for fn in (bandwidth_ratio, p95_ratio, cpu_ratio, checked_cpu_ratio)[:ratios]:
        got = [v for v in map(fn, rounds) if v is not None]
        parts.append("-" if not got else f"{min(got):.2f}" if len(got) == 1 else f"{min(got):.2f}-{max(got):.2f}")
    return f"{len(rounds)}: " + ", ".join(parts)


def run_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ours(): where the program runs and how (shared with paired_bench.py)."""
    p.add_argument("--dir", default=str(REPO / "reports" / "cache"), help="The directory under test.")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--users", type=int, default=200)
    p.add_argument("--duration", type=float, default=12.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--nvme-gb", type=float, default=4.0)
    p.add_argument("extra", nargs="*", help="More flags for kv_cache_benchmark.py (after --).")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    run_arguments(p)
    p.add_argument("--sizes", default="80M,2M,512K", help=f"Block sizes among {', '.join(SIZES)}.")
    p.add_argument("--rounds", type=int, default=1, help="Runs of ours and fio per size, alternating (the VM is "
                                                           "noisy: the table shows the median round and the range).")
    p.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = p.parse_args()
    print(tables(e2e_round(args)))
    return 0


def e2e_round(args) -> list[dict]:
    """One run of ours and one of fio per block size; rows also written to <out>/e2e.json."""
    os.makedirs(args.dir, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for label in [s for s in args.sizes.split(",") if s]:
        rounds = []
        for _ in range(max(1, args.rounds)):
            o = ours(args, label, out / "e2e-runs")
            workers, threads = o["workers"] * o["ranks"], threads_shape(o)
            rounds.append({"ours": o, "fio": fio(args, o["read_fraction"], workers, fio_shape(o)),
                           "fio_threads": fio(args, o["read_fraction"], workers * threads, ("psync", 1, o["io_bytes"]))
                           if threads else None,
                           "check_s_per_gib": check_cost(SIZES[label][2]) if o["verify"] == "checksum" else None})
            shutil.rmtree(out / "e2e-runs", ignore_errors=True)  # the report folders: only the figures are kept
        # the median round is a real round, not a mix of rounds' figures
        median = sorted(rounds, key=lambda r: bandwidth_ratio(r) or 0.0)[(len(rounds) - 1) // 2]
        rows.append({"label": label, **median, "rounds": rounds})
    (out / "e2e.json").write_text(json.dumps(rows, indent=1))
    return rows


def defaults(**over) -> argparse.Namespace:
    """The command line's defaults, for make bench (run_bench.py)."""
    ns = argparse.Namespace(dir=str(REPO / "reports" / "cache"), sizes="80M,2M,512K", workers=4, processes=1,
                            users=200, duration=12.0, warmup=3.0, nvme_gb=4.0, out=str(REPO / "bench" / "out"),
                            extra=[], rounds=1)
    vars(ns).update(over)
    return ns


if __name__ == "__main__":
    raise SystemExit(main())
