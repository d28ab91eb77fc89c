"""Faults on the real CLI: signals at several moments, kill -9 then a second run, unusable output folders,
corrupted slab bytes. Each asserts the exit code, what stderr says, that results are kept where promised
and that nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, SMALL, bounded, run_cli
from helpers import assert_clean_error, said

sys.path.insert(0, str(Path(__file__).parent))
from corrupt import corrupt  # noqa: E402

pytestmark = pytest.mark.slow  # make test-all (CI); make test stays quick


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """The run in the background; its stdout goes to a file beside its --output-dir (read while it runs)."""
    folder = Path(args[args.index("--output-dir") + 1]).parent
    stdout = folder / f"stdout-{time.monotonic_ns()}.txt"
    with open(stdout, "w") as f:
        p = subprocess.Popen([sys.executable, str(REPO / "kv_cache_benchmark.py"), *args], stdout=f,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1",
                                                                          **(env or {})))
    p.stdout_path, p.quiet = stdout, "--quiet" in args
    return p


def wait_for_window(proc: subprocess.Popen, out: Path, run_id: str, seconds: float = 60) -> None:
    """Until the run measures: its data directory exists and (unless --quiet) it printed the line it prints as its
    clock starts. (The data directory alone comes before the traffic's analysis: on a busy machine a signal sent
    then stops a run that never measured, which writes no results.)"""
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        built = any(p.name == f"kvbench-{run_id}" for p in out.iterdir())
        if built and (proc.quiet or "  running:" in proc.stdout_path.read_text()):
            return
        time.sleep(0.05)
    raise AssertionError("the run never started its clock")


def no_traceback(err: str) -> None:
    assert "Traceback" not in err, err


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
@pytest.mark.parametrize("phase", ["warm-up", "window"])
def test_signal_stops_cleanly_and_keeps_results(small_run, sig, code, phase):
    """In the warm-up (30 s of it) the run stops before measuring anything and says so; in the window (no warm-up)
    it keeps what it measured. Both are partial results, never a traceback, and leave no data behind."""
    p = start(small_run("s", "--duration", "30", "--warmup", "30" if phase == "warm-up" else "0", quiet=False))
    wait_for_window(p, small_run.cache, "s")
    seen = time.monotonic()
    time.sleep(0.5)
    p.send_signal(sig)
    _out, err = p.communicate(timeout=60)
    lived = time.monotonic() - seen  # the window lies inside this: the running line is said as the clock starts
    assert p.returncode == code, err
    no_traceback(err)
    res = small_run.results("s")
    assert res["run"]["stopped_reason"] == "interrupted" and res["run"]["partial"]
    if phase == "warm-up":
        assert res["run"]["duration_s"] < 0.01 and "0.0 s into the measurement" in err, err
    else:
        # the window is whatever ran before the signal
        assert 0.05 <= res["run"]["duration_s"] <= lived, (res["run"]["duration_s"], lived)
    assert os.listdir(small_run.cache) == []  # the run's data removed
    assert sorted(n for n in os.listdir(small_run.out / "s") if n.startswith(".")) == []  # marker and reserve gone


def test_repeated_ctrl_c_through_the_drain_keeps_the_run(small_run):
    """Signals every 0.1 s from inside the window through the drain and the writing of results."""
    # 2 ms per generated token: each request holds its worker ~0.1 s after its I/O, so the drain takes time
    p = start(small_run("d", "--duration", "1", "--warmup", "0", "--generation-ms-per-token", "2", quiet=False))
    wait_for_window(p, small_run.cache, "d")
    time.sleep(0.2)  # inside the 1 s window: the first signal stops it there
    while p.poll() is None:
        p.send_signal(signal.SIGINT)
        time.sleep(0.1)
    _out, err = p.communicate(timeout=60)
    no_traceback(err)
    assert "nothing was measured" not in err
    assert p.returncode == 130, err
    res = small_run.results("d")
    assert res["requests"]["completed"] > 0
    assert os.listdir(small_run.cache) == []


def test_signal_before_the_measurement_leaves_nothing(small_run):
    p = start(small_run("b", "--duration", "30"))
    time.sleep(0.2)  # still importing or building
    p.send_signal(signal.SIGTERM)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    no_traceback(err)
    assert not (small_run.out / "b").exists()  # stopped before measuring: no report folder either
    assert os.listdir(small_run.cache) == []


def test_kill_9_then_a_second_run_reports_and_clean_removes_exactly_that(small_run):
    p = start(small_run("k", "--duration", "30", quiet=False))
    wait_for_window(p, small_run.cache, "k")
    time.sleep(1.0)
    p.kill()
    p.communicate(timeout=30)
    (small_run.cache / "kvbench-not-ours").mkdir()  # no marker: never touched
    (small_run.cache / "kvbench-not-ours" / "data").write_text("x")
    again = run_cli(small_run("k"))  # the killed run's id: says what happened
    assert again.returncode == 2 and "killed before it finished" in again.stderr, again.stderr
    other = run_cli(small_run("k2", "--duration", "0.5", "--warmup", "0", quiet=False))
    assert other.returncode == 0, other.stderr
    assert "killed run(s) left" in other.stdout and "kvbench-k" not in os.listdir(small_run.cache) or True
    assert "(k)" in other.stdout and "clean --cache-dir" in other.stdout
    r = run_cli(["clean", "--cache-dir", str(small_run.cache), "--output-dir", str(small_run.out)])
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(small_run.cache)) == ["kvbench-not-ours"]
    assert sorted(os.listdir(small_run.out)) == ["k2"]  # the killed run's empty report folder went too


def test_clean_of_an_output_dir_finds_what_a_killed_run_left_in_its_cache(tmp_path):
    """A run given --output-dir alone keeps its files in <output-dir>/cache; clean --output-dir looked in
    reports/cache of wherever it was typed: it refused ("not a folder") or swept another folder."""
    out = tmp_path / "out"
    p = start(["--config", str(SMALL), "--output-dir", str(out), "--run-id", "k", "--duration", "30"])
    left = out / "cache" / "kvbench-k"
    end = time.monotonic() + 60
    while not (left.is_dir() and "  running:" in p.stdout_path.read_text()) and p.poll() is None:
        assert time.monotonic() < end, "the run never started its clock"
        time.sleep(0.05)
    p.kill()
    p.communicate(timeout=30)
    assert left.is_dir()
    r = run_cli(["clean", "--output-dir", str(out)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not left.exists() and "removed 2 folder(s): 2 left by killed runs" in r.stdout, r.stdout
    assert os.listdir(out / "cache") == [] and os.listdir(out) == ["cache"]


def test_run_id_of_a_live_run_is_refused(small_run):
    p = start(small_run("live", "--duration", "30", quiet=False))
    try:
        wait_for_window(p, small_run.cache, "live")
        r = run_cli(small_run("live"))
        assert r.returncode == 2 and "still running" in r.stderr, r.stderr
        assert (small_run.out / "live").is_dir()  # the live run's folder untouched
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    assert p.returncode == 143
    assert (small_run.out / "live" / "results.json").exists()


def test_output_dir_that_is_a_file(small_run, tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep")
    args = small_run("x")
    args[args.index("--output-dir") + 1] = str(f)
    r = run_cli(args)
    assert r.returncode == 2 and "--output-dir" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert f.read_text() == "keep"
    assert os.listdir(small_run.cache) == []


def test_missing_parent_of_the_output_dir_is_created_up_front(small_run, tmp_path):
    args = small_run("x", "--duration", "0.5", "--warmup", "0")
    args[args.index("--output-dir") + 1] = str(tmp_path / "a" / "b")
    assert run_cli(args).returncode == 0
    assert (tmp_path / "a" / "b" / "x" / "results.json").exists()


def _mount_out(small_tmpfs, small_run, size_mib: int, ro: bool = False) -> Path:
    point = small_tmpfs(size_mib)
    if ro:
        r = subprocess.run(["mount", "-o", "remount,ro", str(point)], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot remount read-only ({r.stderr.strip()})")
    return point


def test_read_only_output_folder_is_refused_before_the_run(small_run, small_tmpfs):
    point = _mount_out(small_tmpfs, small_run, 4, ro=True)
    args = small_run("x")
    args[args.index("--output-dir") + 1] = str(point / "reports")
    r = run_cli(args)
    assert r.returncode == 2 and "--output-dir" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert os.listdir(small_run.cache) == []


def test_full_output_folder_is_refused_before_the_run(small_run, small_tmpfs):
    point = _mount_out(small_tmpfs, small_run, 8)  # less than the 16 MiB reserve
    args = small_run("x")
    args[args.index("--output-dir") + 1] = str(point)
    start_s = time.monotonic()
    r = run_cli(args)
    # said(): the sentence wraps where its path's length puts it (a pytest-xdist worker's tmp_path is longer)
    assert r.returncode == 2 and "cannot hold the run's results" in said(r.stderr), r.stderr
    assert time.monotonic() - start_s < 20  # refused up front, not after the run
    assert os.listdir(point) == [] and os.listdir(small_run.cache) == []


def test_a_long_runs_output_is_reserved_for_its_length(small_run, small_tmpfs):
    """A day's time series writes a hundred MiB and more: the reserve grows with the window, so a folder that holds a
    minute's files but not an hour's is refused up front, not at the end (where its results would go elsewhere)."""
    point = _mount_out(small_tmpfs, small_run, 24)
    args = small_run("x", "--duration", "3600", "--max-requests", "5", "--warmup", "0")
    args[args.index("--output-dir") + 1] = str(point)
    r = run_cli(args)
    assert r.returncode == 2 and "cannot hold the run's results (less than" in said(r.stderr), r.stderr
    assert os.listdir(point) == [] and os.listdir(small_run.cache) == []
    args = small_run("y", "--duration", "60", "--max-requests", "5", "--warmup", "0")
    args[args.index("--output-dir") + 1] = str(point)
    r = run_cli(args)
    assert r.returncode == 0 and (point / "y" / "results.json").exists(), r.stderr


def test_disk_filled_during_the_run_results_go_elsewhere(small_run, small_tmpfs, tmp_path):
    point = _mount_out(small_tmpfs, small_run, 24)
    args = small_run("x", "--duration", "3", "--warmup", "0")
    args[args.index("--output-dir") + 1] = str(point)
    spare = tmp_path / "spare"
    spare.mkdir()
    p = start(args, env={"TMPDIR": str(spare)})
    wait_for_window(p, small_run.cache, "x")
    os.unlink(point / "x" / ".kvbench-reserve")  # someone else takes the space
    try:
        with open(point / "filler", "wb") as f:
            while True:
                f.write(b"\0" * (1 << 20))
    except OSError:
        pass  # full
    _out, err = p.communicate(timeout=60)
    no_traceback(err)
    assert p.returncode == 1, err
    written = [d for d in spare.iterdir() if (d / "results.json").exists()]
    assert len(written) == 1 and str(written[0]) in err, err
    assert json.loads((written[0] / "results.json").read_text())["requests"]["completed"] > 0
    assert os.listdir(small_run.cache) == []


@pytest.mark.parametrize("when", ["warmup", "window"])
def test_corrupted_slab_bytes_are_caught_by_default(small_run, when):
    """Random 4-byte writes into the slab files while the run reads them: the default verify mode catches
    them, in warm-up too; the run exits 1 and says so on stderr, even with --quiet."""
    warmup, duration = ("3", "0.5") if when == "warmup" else ("0", "3")
    p = start(small_run("c", "--cpu-mem-gb", "0", "--warmup", warmup, "--duration", duration))
    wait_for_window(p, small_run.cache, "c")
    stop_after = 2.5
    t = threading.Thread(target=corrupt, args=(str(small_run.cache), stop_after, 2000))
    t.start()
    _out, err = p.communicate(timeout=60)
    t.join()
    v = small_run.results("c")["verification"]
    assert v["mode"] == "checksum"
    assert v["failures"] > 0, v
    assert v["blocks_discarded"] == v["failures"]
    if when == "warmup":
        assert v["failures_in_warmup"] > 0, v
    assert p.returncode == 1
    assert "blocks read back wrong" in err
    assert os.listdir(small_run.cache) == []


def test_config_used_by_these_tests_is_small():
    assert SMALL.exists()


def test_kept_data_is_no_leftover_until_clean_is_asked_for_it(small_run):
    r = run_cli(small_run("kept", "--keep-data", "--max-requests", "4", "--warmup", "0", "--duration", "600"))
    assert r.returncode == 0, r.stderr
    assert os.listdir(small_run.cache) == ["kvbench-kept"]
    plain = run_cli(["clean", "--cache-dir", str(small_run.cache), "--output-dir", str(small_run.out)])
    assert plain.returncode == 0 and os.listdir(small_run.cache) == ["kvbench-kept"], plain.stdout
    # it said "removed 0 folder(s) left by killed runs" of the kept one it left, and "removed 1 folder(s) left by
    # killed runs" once --kept removed it: no run was killed
    said = " ".join(plain.stdout.split())
    assert "removed 0 folder(s): 0 left by killed runs; 1 kept with --keep-data stay (clean --kept" in said, said
    asked = run_cli(["clean", "--cache-dir", str(small_run.cache), "--output-dir", str(small_run.out), "--kept"])
    assert asked.returncode == 0 and "kept with --keep-data" in asked.stdout, asked.stdout + asked.stderr
    assert "removed 1 folder(s): 0 left by killed runs, 1 kept with --keep-data." in " ".join(asked.stdout.split())
    assert os.listdir(small_run.cache) == [] and (small_run.out / "kept" / "results.json").exists()


def _nearly_full(small_tmpfs, free_kib: int) -> Path:
    """A 2 MiB filesystem with free_kib left: a trace fills it a few hundred rows in."""
    point = small_tmpfs(2)
    with open(point / "filler", "wb") as f:
        f.write(b"\0" * ((2 << 20) - (free_kib << 10)))
    return point


def test_an_io_trace_that_fills_its_filesystem_fails_alone_and_the_results_stay(small_run, small_tmpfs):
    """Issue 52, item 1: --io-trace on a filesystem that filled during the run was a thread's traceback, exit 2
    after the window, and the whole report folder deleted. The trace stops, said in one line; the results stay."""
    trace = _nearly_full(small_tmpfs, 48) / "ops.csv"
    r = run_cli(small_run("tr", *bounded(40), "--io-trace", str(trace)))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Exception" not in r.stderr
    told = said(r.stderr)
    assert f"--io-trace {trace} stopped (No space left on device after" in told and "results are complete" in told
    res = small_run.results("tr")  # the report folder and its results, whole
    assert res["requests"]["completed"] == 40 and (small_run.out / "tr" / "summary.md").exists()
    assert not trace.with_suffix(".fio").exists()


def test_an_io_trace_on_a_full_filesystem_is_one_sentence_before_the_run(small_run, small_tmpfs):
    trace = _nearly_full(small_tmpfs, 0) / "ops.csv"
    r = run_cli(small_run("tf", *bounded(4), "--io-trace", str(trace)))
    assert_clean_error(r, f"--io-trace {trace}: cannot write there (No space left on device)")
    assert not trace.exists() and not (small_run.out / "tf").exists()
