"""make device-check: everything that needs a GPU, in one pass (about 6 minutes), as one table.

1. the GPU tests (pytest -m gpu);
2. gpu_bench at 80, 32, 2 and 0.5 MiB: the tier's batches of 16 blocks (put_many, get_many, and the demotion
   batch into the CPU tier's arena) against the link, one copy of the same bytes each way measured in the same
   rounds (targets: >= 0.95 from 2 MiB, >= 0.85 at 0.5 MiB); one block at a time against a copy synchronised per
   block from the same registered buffer (reported: the tier's own cost per block);
2b. paged_bench (issue 49): a batch of 16 blocks of llama3.1-8b and -70b (16-token blocks: 64 and 160 pieces of
   32 KiB) gathered out of and scattered into the engine's per-layer tensors by each copy method, against one
   large copy of the same bytes: kernel >= 0.9 of it both ways, batch and per-piece reported;
3. full `--gpu real` runs (llama8b, 32 MiB blocks: 1,024 pieces a block when paged) with a CPU and an NVMe tier
   under them, one block at a time (--request-io serial), paged (zero-copy kernel), paged with the kernel through
   HBM staging, and contiguous: every block verified, no staged transfer, GPU write p50 and GPU -> CPU demote p50
   within 1.2x of a 32 MiB block over the raw copy bandwidth step 2 measured;
4. a `--gds` run (no CPU tier: demotions cross the link), saying which path ran and how deep its batches went;
5. the MLPerf reference's line with a GPU tier (`--model llama3.1-8b --num-users 20 --gpu-mem-gb 16
   --cpu-mem-gb 8`): it runs, or is refused with numbers (exit 2), never killed;
6. the NIXL handoff with the prefill node's region in GPU memory (`--disagg-handoff-memory gpu`, NIXL VRAM, its
   space auto) and a decode node on 127.0.0.1: every block read and verified, none missing (skipped without
   nixl-cu12);
7. the main job as the README types it (`--model llama70b --users 200`, 30 s): exit 0, every block verified, and
   its peak RSS under the memory budget checked before the run; the MLPerf line's peak RSS likewise
   (`--only main-contiguous`: the main job again in contiguous slots, to tell the layout's memory apart).

Without a GPU it says so in one line and exits 0. The table goes to stdout and, with --out DIR, to DIR/table.md
beside each step's log and results. Exit 1 when a step missed its target.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from gpu_bench import ROWS  # noqa: E402 - beside this file: the rows and their references

TARGET_LARGE, TARGET_SMALL, TARGET_RUN, TARGET_PAGED = 0.95, 0.85, 1.2, 0.9


def _run(cmd: list[str], log: Path, timeout: float) -> tuple[int, str, float]:
    """(exit status, output, seconds) of a step; its output kept in log."""
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"{e.stdout or ''}{e.stderr or ''}\n(stopped after {timeout:.0f} s)"
    log.write_text(" ".join(cmd) + "\n" + (out if isinstance(out, str) else out.decode(errors="replace")))
    return rc, out if isinstance(out, str) else "", time.monotonic() - start


def _tail(out: str) -> str:
    lines = [x for x in out.strip().splitlines() if x.strip()]
    return lines[-1][:110] if lines else ""


def _bench(rows: list, out: Path) -> dict | None:
    rc, text, secs = _run([sys.executable, str(HERE / "gpu_bench.py"), "--rounds", "3", "--json",
                           str(out / "gpu_bench.json")], out / "gpu_bench.log", 150)
    if rc or not (out / "gpu_bench.json").exists():
        rows.append(("gpu_bench", "FAIL", _tail(text), "ratios"))
        return None
    res = json.loads((out / "gpu_bench.json").read_text())
    rows += bench_rows(res)
    return res


def bench_rows(res: dict) -> list[tuple[str, str, str, str]]:
    """gpu_bench's figures as the table's rows: (check, verdict, measured, target)."""
    rows = []
    for r in res["sizes"]:
        target = TARGET_LARGE if r["block_mib"] >= 2 else TARGET_SMALL
        for op, ref, _ in ROWS:  # batches against the link (the targets); a block at a time, reported
            batched = op.endswith("_many")
            verdict = ("ok" if r[f"{op}_ratio"] >= target else "MISS") if batched else "reported"
            rows.append((f"gpu_bench {op} {r['block_mib']:g} MiB" + (f", batches of {r['batch']}" if batched else ""),
                         verdict, f"{r[op + '_ratio']:.2f} of " + (
                             f"the link ({r[op + '_gbps']:.1f} of {r[ref + '_gbps']:.1f} GB/s)" if batched else
                             f"a copy synchronised per block ({r[op + '_gbps']:.1f} GB/s)"),
                         f">= {target}" if batched else "reported"))
    return rows


def _paged(rows: list, out: Path) -> None:
    rc, text, _ = _run([sys.executable, str(HERE / "paged_bench.py"), "--json", str(out / "paged_bench.json")],
                       out / "paged_bench.log", 150)
    if rc or not (out / "paged_bench.json").exists():
        rows.append(("paged_bench", "FAIL", _tail(text), "ratios"))
        return
    for r in json.loads((out / "paged_bench.json").read_text())["rows"]:
        if "skipped" in r:
            rows.append((f"paged {r['model']} {r['copy']}", "skipped", r["skipped"][:100], "reported"))
            continue
        for d in ("d2h", "h2d"):
            ratio, target = r[f"{d}_ratio"], TARGET_PAGED if r["copy"] == "kernel" else None
            verdict = "reported" if target is None else ("ok" if ratio >= target else "MISS")
            rows.append((f"paged {r['model']} {r['copy']} {d.upper()} ({r['pieces']} pieces/block)", verdict,
                         f"{ratio:.2f} of one copy ({r[d + '_gbps']:.1f} of {r['raw_' + d + '_gbps']:.1f} GB/s)",
                         f">= {target}" if target else "reported"))


def _results(folder: Path) -> dict | None:
    found = sorted(folder.glob("*/results.json"))
    return json.loads(found[-1].read_text()) if found else None


def _our_run(name: str, args: list[str], out: Path, work: Path) -> tuple[int, str, dict | None]:
    """A --gpu real run of llama8b (32 MiB blocks) with its own cache folder: (status, output, its results)."""
    cache = work / f"cache-{name}"
    cache.mkdir()
    rc, text, _ = _run([sys.executable, "kv_cache_benchmark.py", "--model", "llama8b", "--gpu", "real", *args,
                        "--cache-dir", str(cache), "--output-dir", str(out / name), "--quiet"],
                       out / f"{name}_run.log", 150)
    return rc, text, _results(out / name)


FULL_RUNS = {  # the full run's variants: its label, its flags
    "paged": ["--gpu-layout", "paged"],
    "paged, kernel through HBM": ["--gpu-layout", "paged", "--gpu-kernel-path", "hbm"],
    "contiguous": ["--gpu-layout", "contiguous"],
}


def _full_run(rows: list, out: Path, work: Path, bench: dict | None, label: str) -> None:
    """One block at a time (--request-io serial): its write and demote latencies are one block's, compared with
    one block's bytes at the link's rate (a batched run's block completes with its batch)."""
    name, layout = f"full run ({label})", "contiguous" if label == "contiguous" else "paged"
    tag = "-".join(label.replace(",", "").split()[:2])
    rc, text, res = _our_run(f"full-{tag}", ["--gpu-mem-gb", "4", "--cpu-mem-gb", "4", "--nvme-gb", "16",
                                             "--users", "32", "--warmup", "3", "--duration", "20",
                                             "--request-io", "serial", *FULL_RUNS[label]], out, work)
    if rc or res is None:
        rows.append((name, "FAIL", f"exit {rc}: {_tail(text)}", "exit 0"))
        return
    failures, checked = res["verification"]["failures"], res["verification"]["blocks_checked"]
    got = res["run"]["tiers"]["gpu"].get("hbm_layout") or {}
    rows.append((f"{name}: HBM layout", "ok" if got.get("kind") == layout else "MISS",
                 f"{got.get('kind')}, {got.get('pieces_per_block') or 1} pieces a block, copy "
                 f"{got.get('copy') or '-'}" + (f" ({got['kernel_path']})" if got.get("kernel_path") else ""), layout))
    rows.append((f"{name}: blocks verified", "ok" if not failures and checked else "FAIL",
                 f"{checked:,} checked, {failures} failed", "0 failed"))
    moved = res["run"]["tiers"]["gpu"]["transfers"] or {}
    staged = sum(v["staged"] for v in moved.values())
    rows.append((f"{name}: staged transfers", "ok" if not staged else "MISS",
                 f"{staged} staged, {sum(v['direct'] for v in moved.values()):,} direct", "0 staged"))
    size = res["run"]["block_bytes"]
    r32 = next((r for r in (bench or {}).get("sizes", []) if r["block_mib"] == 32), None)
    for what, tier, op, raw in (("GPU write p50", "gpu", "write", "raw_h2d_gbps"),
                                ("GPU -> CPU demote p50", "cpu", "demote", "raw_d2h_pinned_gbps")):
        p50 = ((res["latency_ms"].get(tier) or {}).get(op) or {}).get("p50")
        if p50 is None or r32 is None:
            rows.append((f"{name}: {what}", "MISS", f"{p50} ms (no raw figure)" if p50 else "no samples", "<= 1.2x"))
            continue
        limit_ms = size / (r32[raw] * 1e9) * 1e3
        ratio = p50 / limit_ms
        rows.append((f"{name}: {what}", "ok" if ratio <= TARGET_RUN else "MISS",
                     f"{p50:.2f} ms = {ratio:.2f}x of {size / 2**20:.0f} MiB at {r32[raw]:.1f} GB/s", "<= 1.2x"))


def _gds_run(rows: list, out: Path, work: Path) -> None:
    rc, text, res = _our_run("gds", ["--gpu-mem-gb", "2", "--cpu-mem-gb", "0", "--nvme-gb", "8", "--gds", "--users",
                                     "16", "--warmup", "2", "--duration", "12"], out, work)
    if rc or res is None:
        rows.append(("--gds run", "FAIL", f"exit {rc}: {_tail(text)}", "exit 0"))
        return
    gds, ver = res["run"]["gds"], res["verification"]
    nvme = res.get("queue_depth", {}).get("nvme", {})  # batched request I/O: GDS's cuFile batches, each way
    deep = {op: nvme.get(op, {}).get("max", 0) for op in ("demotions", "load")}
    ok = gds["demoted_blocks"] > 0 and gds["loaded_blocks"] > 0 and not ver["failures"] and min(deep.values()) > 1
    rows.append(("--gds run", "ok" if ok else "FAIL", f"{gds['mode'][:60]}; {gds['demoted_blocks']} demoted, "
                 f"{gds['loaded_blocks']} loaded, {ver['failures']} failed; batches up to {deep['demotions']} "
                 f"demotions, {deep['load']} reads deep", "verified, batches > 1 deep"))


def _rss_row(rows: list, name: str, res: dict | None) -> None:
    """Peak RSS against the memory budget checked before the run: what users get must stay under what was
    promised (the H200 measured 11.15 of 11.95 GiB for the main job, 12.65 of 14.48 for the MLPerf line)."""
    if res is None:
        rows.append((f"{name}: peak RSS", "FAIL", "no results.json", "< budget"))
        return
    peak, budget = res["memory"]["peak_rss_bytes"], res["memory"]["budget_bytes"]
    parts = sorted(((v, k) for k, v in (res["memory"].get("budget") or {}).items() if k != "total" and v), reverse=True)
    rows.append((f"{name}: peak RSS", "ok" if peak < budget else "MISS",
                 f"{peak / 2**30:.2f} of {budget / 2**30:.2f} GiB budgeted ("
                 + ", ".join(f"{k} {v / 2**30:.2f}" for v, k in parts[:4]) + f"; {res['run']['workers']} workers)",
                 "< budget"))


def _main_job(rows: list, out: Path, work: Path, layout: str = "auto") -> None:
    """The README's first command (make run's job), on this GPU host as a user types it, shortened (layout: its
    --gpu-layout, auto as typed)."""
    tag = "" if layout == "auto" else f"-{layout}"
    name = "main job (llama70b, 200 users" + (f", {layout}" if tag else "") + ")"
    cache = work / f"cache-main{tag}"
    cache.mkdir()
    rc, text, _ = _run([sys.executable, "kv_cache_benchmark.py", "--model", "llama70b", "--users", "200",
                        "--duration", "30", "--warmup", "5", "--cache-dir", str(cache), "--output-dir",
                        str(out / f"main{tag}"), "--quiet", *(["--gpu-layout", layout] if tag else [])],
                       out / f"main_job{tag}.log", 150)
    res = _results(out / f"main{tag}")
    if res is None:
        rows.append((name, "FAIL", f"exit {rc}: {_tail(text)}", "exit 0, verified"))
    else:
        ver, load = res["verification"], res["load"] or {}
        rows.append((name, "ok" if rc == 0 and not ver["failures"] else "FAIL",
                     f"exit {rc}: {ver['blocks_checked']:,} blocks verified, {ver['failures']} failed; "
                     f"{load.get('kind', '-')} ({load.get('cause') or '-'})", "exit 0, verified"))
    _rss_row(rows, name, res)


def _mlperf_line(rows: list, out: Path, work: Path) -> None:
    cache = work / "cache-mlperf"
    cache.mkdir()
    rc, text, secs = _run([sys.executable, "kv_cache_benchmark.py", "--model", "llama3.1-8b", "--num-users", "20",
                           "--duration", "10", "--gpu-mem-gb", "16", "--cpu-mem-gb", "8", "--cache-dir", str(cache),
                           "--output", str(out / "mlperf.json"), "--output-dir", str(out / "mlperf")],
                          out / "mlperf_line.log", 150)
    ok = rc == 0 or (rc == 2 and "memory budget" in text)
    what = "ran" if rc == 0 else ("refused with numbers" if ok else f"exit {rc}")
    rows.append(("MLPerf line, GPU tier", "ok" if ok else "FAIL", f"{what}: {_tail(text)}", "runs or refused"))
    if rc == 0:
        _rss_row(rows, "MLPerf line", _results(out / "mlperf"))


def _vram_handoff(rows: list, out: Path, work: Path) -> None:
    import importlib.util

    from kv_cache.tiers.localserver import free_port

    if importlib.util.find_spec("nixl_cu12") is None:
        rows.append(("NIXL handoff, region in HBM", "skipped", "nixl-cu12 is not installed", "0 missing"))
        return
    url = f"nixl://127.0.0.1:{free_port()}"
    common = ["--model", "llama8b", "--handoff", url, "--disagg-wait-s", "30", "--warmup", "0", "--quiet",
              "--output-dir", str(out / "vram")]
    dec_cache, pre_cache = work / "cache-vram-dec", work / "cache-vram-pre"
    dec_cache.mkdir()
    pre_cache.mkdir()
    dec = subprocess.Popen([sys.executable, "kv_cache_benchmark.py", *common, "--role", "decode", "--run-id", "dec",
                            "--gpu", "off", "--duration", "600", "--cache-dir", str(dec_cache)], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rc, text, _ = _run([sys.executable, "kv_cache_benchmark.py", *common, "--role", "prefill", "--run-id", "pre",
                        "--gpu", "real", "--gpu-mem-gb", "2", "--disagg-handoff-memory", "gpu",
                        "--max-requests", "40", "--duration", "60",
                        "--cache-dir", str(pre_cache)], out / "vram_prefill.log", 150)
    try:
        dec_text = dec.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
        dec.kill()
        dec_text = dec.communicate()[0] + "\n(stopped after 120 s)"
    (out / "vram_decode.log").write_text(dec_text)
    found = out / "vram" / "dec" / "results.json"
    d = json.loads(found.read_text()) if found.exists() else None
    if rc or dec.returncode or d is None:
        rows.append(("NIXL handoff, region in HBM", "FAIL", f"exit {rc}/{dec.returncode}: {_tail(text or dec_text)}",
                     "0 missing"))
        return
    read, missing, failed = d["blocks"]["handoff"]["read"], d["role"]["missing_blocks"], d["verification"]["failures"]
    p50 = d["latency_ms"]["handoff"]["read"]["p50"]
    rows.append(("NIXL handoff, region in HBM", "ok" if read and not missing and not failed else "FAIL",
                 f"{read} blocks read, {missing} missing, {failed} failed, read p50 {p50} ms", "0 missing"))


STEPS = ("tests", "bench", "paged", "full", "gds", "main", "main-contiguous", "mlperf", "vram")


def _tests(rows: list, out: Path) -> None:
    rc, text, _ = _run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests", "-p", "no:cacheprovider"],
                       out / "gpu_tests.log", 240)
    rows.append(("GPU tests (pytest -m gpu)", "ok" if rc == 0 else "FAIL", _tail(text), "all pass"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="keep the table, the logs and the results here (default: a temporary folder)")
    p.add_argument("--only", help=f"these steps alone, comma-separated, of: {', '.join(STEPS)} (default: all but "
                                  f"main-contiguous, the main job again in contiguous slots)")
    a = p.parse_args()
    only = set(a.only.split(",")) if a.only else set(STEPS) - {"main-contiguous"}
    if only - set(STEPS):
        p.error(f"--only {a.only}: unknown step {sorted(only - set(STEPS))[0]}; the steps are {', '.join(STEPS)}")
    from kv_cache.tiers.devices import open_cupy

    backend, why = open_cupy()
    if backend is None:
        print(f"device-check: no GPU here ({why}); nothing to check.")
        return 0
    model = backend.model(0)
    with tempfile.TemporaryDirectory(prefix="device-check-", dir=REPO / "reports") as tmp:
        work = Path(tmp)
        out = Path(a.out) if a.out else work / "out"
        out.mkdir(parents=True, exist_ok=True)
        rows: list[tuple[str, str, str, str]] = []
        start = time.monotonic()

        def table() -> str:  # written after every step: a run stopped part way keeps what it measured
            lines = [f"device-check on {model}, {time.monotonic() - start:.0f} s", "",
                     "| check | verdict | measured | target |", "|---|---|---|---|"]
            text = "\n".join(lines + [f"| {c} | {v} | {m} | {t} |" for c, v, m, t in rows])
            (out / "table.md").write_text(text + "\n")
            return text

        bench = None
        steps = {
            "tests": lambda: _tests(rows, out),
            "bench": lambda: _bench(rows, out),
            "paged": lambda: _paged(rows, out),
            "full": lambda: [_full_run(rows, out, work, bench, label) for label in FULL_RUNS],
            "gds": lambda: _gds_run(rows, out, work),
            "main": lambda: _main_job(rows, out, work),
            "main-contiguous": lambda: _main_job(rows, out, work, "contiguous"),
            "mlperf": lambda: _mlperf_line(rows, out, work),
            "vram": lambda: _vram_handoff(rows, out, work),
        }
        for name in STEPS:
            if name in only:
                got = steps[name]()
                bench = got if name == "bench" else bench
                table()
        print(table())
    return 0 if all(v in ("ok", "skipped") for _, v, _, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
