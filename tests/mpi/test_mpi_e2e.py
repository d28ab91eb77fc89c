"""Two MPI ranks on localhost: partitioned users, one merged result, exact sums, clean failure."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import REPO, SMALL

MPIRUN = shutil.which("mpirun")


def _mpi_ready() -> str | None:
    if MPIRUN is None:
        return "mpirun not found (pip install -e '.[mpi]')"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py not installed (pip install -e '.[mpi]')"
    return None


pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(_mpi_ready() is not None, reason=_mpi_ready() or "")]


def mpirun(args, n=2, timeout=120):
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = [MPIRUN, *root, "--oversubscribe", "-np", str(n), sys.executable, str(REPO / "kv_cache_benchmark.py"),
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_two_ranks_merge_exactly(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    r = mpirun(["--config", str(SMALL), "--output-dir", str(tmp_path), "--cache-dir", str(cache), "--run-id", "m",
                "--duration", "1.5", "--quiet"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    ranks = [json.loads((tmp_path / "m" / f"rank-{i}.json").read_text()) for i in (0, 1)]
    assert merged["run"]["ranks"] == 2 and [x["run"]["rank"] for x in ranks] == [0, 1]
    for tier, ops in merged["ops"].items():
        for op, n in ops.items():
            assert n == sum(x["ops"][tier].get(op, 0) for x in ranks), (tier, op)
            assert merged["latency_ms"][tier][op]["count"] == n
    for key in ("completed",):
        assert merged["requests"][key] == sum(x["requests"][key] for x in ranks) > 0
    for tier in merged["bytes"]:
        for d in ("read", "write"):
            assert merged["bytes"][tier][d] == sum(x["bytes"][tier][d] for x in ranks)
    assert merged["tokens"]["prompt"] == sum(x["tokens"]["prompt"] for x in ranks)
    starts = [x["snapshot"]["window_ns"][0] + x["run"]["wall_offset_ns"] for x in ranks]
    assert abs(starts[0] - starts[1]) < 1e9, "ranks did not start together"
    assert set(merged["rank_spread"]["nvme"]["write"]) == {"min", "max", "spread"}
    assert os.listdir(cache) == []


def test_a_failing_rank_stops_every_rank_with_its_name(tmp_path):
    cache = tmp_path / "cache"
    (cache / "kvbench-f-r1").mkdir(parents=True)  # rank 1 cannot make its data directory
    r = mpirun(["--config", str(SMALL), "--output-dir", str(tmp_path), "--cache-dir", str(cache), "--run-id", "f",
                "--duration", "1", "--quiet"], timeout=60)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    said = " ".join(r.stderr.split())  # the sentence is wrapped at 100 columns where a long tmp path falls
    assert "rank 1 on" in said and "already exists" in said and "Traceback" not in said
    assert sorted(os.listdir(cache)) == ["kvbench-f-r1"], "rank 0 left its data behind"
    assert not (tmp_path / "f").exists()


def test_shared_storage_lets_a_rank_read_blocks_another_wrote(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    r = mpirun(["--config", str(SMALL), "--output-dir", str(tmp_path), "--cache-dir", str(cache), "--run-id", "s",
                "--duration", "3", "--shared-storage", "--cpu-mem-gb", "0", "--verify", "full", "--quiet",
                # a small tier churns: a rank misses blocks it evicted and finds them again as the other
                # rank rewrote them (shared system-prompt heads stay cached now, so they no longer do)
                "--nvme-gb", "0.02"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    merged = json.loads((tmp_path / "s" / "results.json").read_text())
    ranks = [json.loads((tmp_path / "s" / f"rank-{i}.json").read_text()) for i in (0, 1)]
    assert merged["shared_storage"]["enabled"] is True
    assert merged["shared_storage"]["adopted_blocks"] == sum(x["shared_storage"]["adopted_blocks"] for x in ranks) > 0
    assert merged["verification"]["failures"] == 0 and merged["verification"]["blocks_checked"] > 0
    assert "file-per-block" in merged["run"]["tiers"]["nvme"]["description"]
    assert os.listdir(cache) == [], "the shared namespace was left behind"


def test_a_fault_during_the_run_stops_every_rank(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = [MPIRUN, *root, "--oversubscribe", "-np", "2", sys.executable, str(REPO / "kv_cache_benchmark.py"),
           "--config", str(SMALL), "--output-dir", str(tmp_path), "--cache-dir", str(cache), "--run-id", "f",
           "--duration", "60", "--warmup", "0", "--nvme-layout", "file-per-block", "--cpu-mem-gb", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = cache / "kvbench-f-r1"
    for _ in range(300):  # wait until rank 1 is writing blocks
        if victim.is_dir() and len(os.listdir(victim)) > 3:
            break
        time.sleep(0.1)
    victim.rename(tmp_path / "gone")  # its storage disappears under it (atomically): the next write fails
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    merged = json.loads((tmp_path / "f" / "results.json").read_text())
    assert merged["run"]["partial"] is True and merged["run"]["duration_s"] < 30
    assert "rank 1 on" in merged["run"]["fault"]
    ranks = [json.loads((tmp_path / "f" / f"rank-{i}.json").read_text()) for i in (0, 1)]
    assert ranks[1]["run"]["stopped_reason"] == "fault"
    assert ranks[0]["run"]["stopped_reason"] == "peer_fault" and "rank 1 on" in ranks[0]["run"]["fault"]


def test_processes_launches_the_ranks_for_the_user(tmp_path):
    """--processes 2: the same command as two ranks on this host, no mpirun to type; one merged result."""
    from conftest import run_cli

    cache = tmp_path / "cache"
    cache.mkdir()
    r = run_cli(["--config", str(SMALL), "--output-dir", str(tmp_path), "--cache-dir", str(cache), "--run-id", "p",
                 "--processes", "2", "--duration", "1.5", "--warmup", "0.3", "--device-latency", "auto"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert "running as 2 processes" in r.stdout
    res = json.loads((tmp_path / "p" / "results.json").read_text())
    assert res["run"]["ranks"] == 2 and res["requests"]["completed"] > 0
    # one trace of the host's disk (every request of it), not one a rank taking the CPU the ranks share
    traced = [t["device_latency"]["unavailable"] for t in res["telemetry_per_rank"]]
    assert traced[1] == "rank 0 traces this host's disk, every rank's requests" and "rank 0" not in traced[0]
    assert len(res["ranks_detail"]) == 2 and res["cpu"]["process_s"] > 0
    assert os.listdir(cache) == []


def test_ranks_run_the_automatic_sizes_rank_0_chose(tmp_path, small_tmpfs):
    """Deciding alone, the second rank saw the first one's slabs and chose less (17.50 vs 13.12 GiB): rank 0 now
    chooses one size for all, a quarter of the free space split over the ranks, and says so."""
    cache = small_tmpfs(256)
    r = mpirun(["--config", str(SMALL), "--output-dir", str(tmp_path), "--cache-dir", str(cache), "--allow-tmpfs",
                "--nvme-gb", "0", "--run-id", "a", "--max-requests", "8", "--warmup", "0", "--duration", "600"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.loads((tmp_path / "a" / f"rank-{i}.json").read_text()) for i in (0, 1)]
    sizes = [x["run"]["tiers"]["nvme"]["capacity_bytes"] for x in ranks]
    assert sizes[0] == sizes[1] and 0 < sizes[0] <= 256 * 2**20 // 4 // 2, sizes
    assert all(any("chosen by rank 0 for every rank" in n for n in x["run"]["notes"]) for x in ranks)
    merged = json.loads((tmp_path / "a" / "results.json").read_text())
    assert merged["settings"]["tiers"]["nvme_gb"] * 2**30 >= sizes[0]  # settings.yaml repeats the per-rank size


def test_the_ranks_on_one_host_share_its_memory(tmp_path):
    """Each rank checked its budget against the whole host's available memory: every rank fitted, and together they
    did not (the README's mpirun -np 4 on a 24 GiB host was killed by the OOM killer). A CPU tier of 0.7 of what is
    available fits one process and cannot fit each of two: both ranks are refused, with the share in the sentence,
    before either allocates."""
    import psutil

    mem = psutil.virtual_memory()
    # Above half the host's memory where that still fits one process: then no memory freed by a test beside this one
    # (pytest-xdist) can make the host's share of each rank hold it; 0.7 of what is available otherwise.
    cpu_gb = max(0.7 * mem.available, min(0.55 * mem.total, 0.9 * mem.available)) / 2**30
    r = mpirun(["--config", str(SMALL), "--output-dir", str(tmp_path), "--cache-dir", str(tmp_path), "--run-id", "h",
                "--cpu-mem-gb", f"{cpu_gb:.2f}", "--max-requests", "2", "--quiet"], timeout=120)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "memory budget" in said and "to each of the 2 ranks on this host" in said, said[-2000:]
    assert "Traceback" not in said and not (tmp_path / "h").exists()


def test_rank_zero_reserves_room_for_every_rank_s_results(tmp_path, small_tmpfs):
    """Rank 0 writes each rank's results beside the merged ones, each with the whole time series: a folder that holds
    one process's files of a 15-minute window on three tiers (21 MiB) but not those of two ranks and their merge
    (32 MiB) is refused up front, not found full at the end."""
    out, cache = small_tmpfs(24), tmp_path / "cache"
    cache.mkdir()
    args = ["--config", str(SMALL), "--output-dir", str(out), "--cache-dir", str(cache), "--duration", "900",
            "--max-requests", "4", "--warmup", "0", "--quiet"]
    r = mpirun([*args, "--run-id", "m"])
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "cannot hold the run's results (less than 32 MiB free)" in said, said[-2000:]
    assert os.listdir(out) == [] and os.listdir(cache) == []
    one = subprocess.run([sys.executable, str(REPO / "kv_cache_benchmark.py"), *args, "--run-id", "s"],
                         capture_output=True, text=True, timeout=120)
    assert one.returncode == 0 and (out / "s" / "results.json").exists(), one.stderr[-2000:]
