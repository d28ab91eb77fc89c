"""Two disaggregated nodes start their clocks together. A decode node attaches, then builds its tiers (the README's
two nodes on their defaults: 23 s on a 2-core VM); the prefill node started its clock at once, filled its handoff
space in its warm-up and waited for acknowledgements through its whole 20 s window (one request completed in it),
and the decode node, whose clock started after that, took everything in its own warm-up: 'nothing was measured',
exit 1. Now the prefill node waits (at most --disagg-wait-s) for a decode node whose clock runs."""

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import REPO
from helpers import wait_for_line
from servers import free_port

pytestmark = pytest.mark.slow

# the decode node's set-up made slow where no flag can: 8 s between attaching and its clock
SLOW_SET_UP = """
import sys, time
import kv_cache.run.pipeline as p
real = p._wait_for_start
def slow(*a, **k):
    time.sleep(8)
    return real(*a, **k)
p._wait_for_start = slow
from kv_cache.cli.main import leave, main
leave(main(sys.argv[1:]))
"""
ENV = {**os.environ, "UCX_TLS": "tcp", "PYTHONUNBUFFERED": "1"}


def _handoff(transport: str, tmp_path) -> list[str]:
    if transport == "nixl":
        if importlib.util.find_spec("nixl_cu12") is None:
            pytest.skip("nixl-cu12 is not installed (make install)")
        return ["--handoff", f"nixl://127.0.0.1:{free_port()}"]
    (tmp_path / "shared").mkdir()
    return ["--handoff-dir", str(tmp_path / "shared")]


@pytest.mark.parametrize("transport", ["folder", "nixl"])
def test_a_prefill_node_starts_its_clock_when_its_decode_node_is_ready(small_run, tmp_path, transport):
    handoff = [*_handoff(transport, tmp_path), "--disagg-wait-s", "60", "--disagg-handoff-gb", "0.25"]
    (tmp_path / "dcache").mkdir()
    dec = subprocess.Popen([sys.executable, "-c", SLOW_SET_UP,
                            *small_run("dec", "--role", "decode", *handoff, "--warmup", "2", "--duration", "600",
                                       quiet=False), "--cache-dir", str(tmp_path / "dcache")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    try:
        wait_for_line(dec, "waiting for a prefill node")
        pre = subprocess.run([sys.executable, str(REPO / "kv_cache_benchmark.py"),
                              *small_run("pre", "--role", "prefill", *handoff, "--warmup", "2", "--duration", "6",
                                         quiet=False)],
                             capture_output=True, text=True, env=ENV, timeout=300)
        out, err = dec.communicate(timeout=300)
    finally:
        dec.kill()
    assert pre.returncode == 0, pre.stderr
    assert "waiting up to 60 s for a decode node to be ready" in pre.stdout and " ready\n" in pre.stdout
    # before: 'nothing was measured', exit 1 (all of it came in the decode node's warm-up)
    assert dec.returncode == 0, out[-3000:] + err[-3000:]
    p, d = small_run.results("pre"), small_run.results("dec")
    # the decode node's row for the space it reads is the prefill node's space; a folder's read '0.03 GiB ... 1
    # slots of 32.00 MiB': the decode node's own reader, not a space
    lines = out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("  tier handoff"))
    row = " ".join(" ".join([lines[at], *(x for x in lines[at + 1:at + 4] if x.startswith(" " * 20))]).split())
    assert row.startswith("tier handoff - GiB the prefill node's block files in" if transport == "folder" else
                          "tier handoff 0.25 GiB the prefill node's registered memory"), row
    assert "slots" not in row, row
    assert d["requests"]["completed"] > 0 and p["requests"]["completed"] > 0
    assert d["requests"]["completed"] + d["warmup"]["requests"] == p["requests"]["completed"] + p["warmup"]["requests"]
    # a decode node's storage under test is the handoff it loads from: its MLPerf table names read "storage read
    # 0.000 GB/s" (its own NVMe tier, idle), and a warning said that tier saw no traffic
    assert d["run"]["bottom_tier"] == "handoff" and d["bandwidth_gbps"]["handoff"]["read"] > 0
    said = " ".join(out.split())
    assert "storage read 0.000 GB/s" not in said and "saw no traffic" not in said, said[-3000:]
