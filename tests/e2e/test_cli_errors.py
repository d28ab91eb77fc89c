"""Bad input: one clear sentence, a non-zero exit, no traceback, nothing left behind."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, bounded, run_cli
from helpers import assert_clean_error, sparse_trace


@pytest.mark.parametrize("extra,fragments", [
    (["--model", "llama-9000"], ["unknown model 'llama-9000'", "llama3.1-70b"]),
    (["--users", "0"], ["workload.users must be >= 1"]),
    (["--users", "lots"], ["workload.users must be an integer"]),
    (["--duration", "-1"], ["run.duration_s must be >= 0.1"]),
    (["--tp", "3"], ["--tp 3 does not divide"]),
    (["--profile-mix", "robots=1"], ["not name=weight"]),
    (["--nvme-gb", "10000"], ["--nvme-gb 10000 asks for"]),  # 10 TB: more than the disk, its bookkeeping fits
    (["--io-engine", "mmap", "--nvme-layout", "file-per-block"], ["mmap needs --nvme-layout slab"]),
    (["--set", "tiers.cpu_memgb=1"], ["unknown key 'tiers.cpu_memgb'"]),
    (["--cpu-mem-gb", "100000"], ["memory budget", "lower --cpu-mem-gb"]),
    (["--max-backlog-gb", "0"], ["--max-backlog-gb", ">= 0.001"]),
    (["--arrival", "poisson", "--request-rate", "5", "--max-backlog-gb", "100000"],
     ["memory budget", "request backlog 100000.00", "lower --max-backlog-gb"]),
    (["--nvme-gb", "100000"], ["memory budget", "bookkeeping", "--nvme-gb"]),  # 51 M blocks of 2 MiB to keep track of
    # 20,000 users of up to 16.7 M-token conversations (64 MiB each): their histories, 1.3 TB, refused before a user
    # is made (a million users took 167 s to make, then were refused)
    (["--users", "20000", "--set", "profiles.document.max_context_tokens=16777216"],
     ["20,000 users' conversations need 1250.", "KiB a user", "lower --users"]),
    # a NIXL prefill node's registered region: a part of the budget, refused before NIXL or a port is touched
    (["--role", "prefill", "--handoff", "nixl://127.0.0.1:1", "--disagg-handoff-gb", "100000"],
     ["memory budget", "NIXL handoff region 100000.00", "lower --disagg-handoff-gb"]),
    (["--start-at", "1000"], ["--start-at 1000.000 is already past"]),
    (["--start-at", str(time.time() + 3 * 86400)], ["is more than a day ahead"]),
    (["--start-at", str(time.time() + 600), "--trials", "2"], ["--start-at starts one run's window"]),
    (["--remote-url", "valkey://127.0.0.1:1", "--remote-namespace", "a b"], ["--remote-namespace 'a b'", "letters"]),
    # said after the tiers were built (4 GiB pre-touched, the NVMe slab): now with the other checks, before
    (["--io-trace", "/nonexistent-kvbench/ops.csv"], ["its folder /nonexistent-kvbench does not exist"]),
])
def test_bad_settings(small_run, extra, fragments):
    r = run_cli(small_run("x", *extra))
    assert_clean_error(r, *fragments)
    assert not (small_run.out / "x").exists()
    assert os.listdir(small_run.cache) == []


def test_missing_cache_dir(small_run, tmp_path):
    r = run_cli(small_run("x") + ["--cache-dir", str(tmp_path / "nope")])
    assert_clean_error(r, "does not exist")


def test_unwritable_cache_dir(small_run, tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    if os.access(d, os.W_OK):
        pytest.skip("running as root: permissions do not stop writes")
    assert_clean_error(run_cli(small_run("x") + ["--cache-dir", str(d)]), "is not writable")


@pytest.mark.slow
def test_tmpfs_cache_dir_is_refused_unless_allowed(small_run):
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    assert_clean_error(run_cli(small_run("x") + ["--cache-dir", "/dev/shm"]), "is on tmpfs", "--allow-tmpfs")
    r = run_cli(small_run("y", *bounded(4)) + ["--cache-dir", "/dev/shm", "--allow-tmpfs"])
    assert r.returncode == 0, r.stderr
    assert any("RAM, not a storage device" in n for n in small_run.results("y")["run"]["notes"])


def test_missing_config_file(small_run):
    assert_clean_error(run_cli(["--config", "/nonexistent.yaml"]), "does not exist")


def test_report_of_nothing(tmp_path):
    assert_clean_error(run_cli(["report", str(tmp_path)]), "does not exist")


def _start(args):
    return subprocess.Popen([sys.executable, str(REPO / "kv_cache_benchmark.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(proc, text, timeout=30):
    deadline = time.time() + timeout
    seen = ""
    while time.time() < deadline:
        line = proc.stdout.readline()
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"never printed {text!r}: {seen}")


@pytest.mark.slow
def test_ctrl_c_drains_writes_partial_results_and_cleans_up(small_run):
    args = small_run("i", "--duration", "60", quiet=False)
    proc = _start(args)
    _wait_for(proc, "running:")
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    res = small_run.results("i")
    assert res["run"]["partial"] is True and res["run"]["stopped_reason"] == "interrupted"
    assert res["run"]["duration_s"] < 30
    assert os.listdir(small_run.cache) == []


@pytest.mark.slow
def test_disk_full_stops_cleanly(small_run, small_tmpfs):
    fs = small_tmpfs(48)
    args = small_run("f", "--duration", "60", "--nvme-layout", "file-per-block", "--nvme-gb", "0.04",
                     "--allow-tmpfs", quiet=False)
    args[args.index("--cache-dir") + 1] = str(fs)
    proc = _start(args)
    _wait_for(proc, "running:")
    with open(fs / "filler", "wb", buffering=0) as f:  # another tenant takes all the space
        try:
            while True:
                f.write(b"\0" * (256 << 10))
        except OSError:
            pass
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out[-2000:], err)
    assert "Traceback" not in err
    res = small_run.results("f")
    assert res["run"]["stopped_reason"] == "fault" and "disk full" in res["run"]["fault"]
    assert "FAULT: disk full" in out
    assert sorted(os.listdir(fs)) == ["filler"], "the run left data behind"


def test_gpu_real_without_a_device_names_what_is_missing(small_run):
    r = run_cli(small_run("gpu", "--gpu", "real"))
    assert_clean_error(r, "--gpu real:")
    assert "gpu extra" in r.stderr or "no CUDA device" in r.stderr


def test_gpu_auto_without_a_device_turns_the_tier_off_and_says_so(small_run):
    from kv_cache.tiers.devices import open_cupy

    if open_cupy()[0] is not None:
        pytest.skip("a GPU is present: auto turns the tier on")
    r = run_cli(small_run("auto", *bounded(4)))
    assert r.returncode == 0, r.stderr
    notes = small_run.results("auto")["run"]["notes"]
    assert any(n.startswith("GPU tier off: ") for n in notes), notes


def test_a_trace_too_large_for_memory_is_refused_before_it_is_read(small_run, tmp_path):
    """Its records would take 7 times its 4 TiB (a sparse file: a few records, then a hole): one sentence, before
    the file is read or anything is made."""
    path = sparse_trace(tmp_path / "huge.jsonl", 4 << 40)
    r = run_cli(small_run("x", "--trace", str(path)))
    assert_clean_error(r, f"trace {path} (4,194,304 MiB of mooncake) takes about 28672.00 GiB of memory while it is "
                          f"read", "head -n N FILE > PART")
    assert not (small_run.out / "x").exists() and os.listdir(small_run.cache) == []
