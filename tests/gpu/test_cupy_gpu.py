"""On a real GPU (make test-gpu): the CuPy tier in a full run, NVML telemetry. Skipped without a device."""

from __future__ import annotations

import pytest
from conftest import run_cli

from kv_cache.tiers.devices import open_cupy

pytestmark = pytest.mark.gpu

BACKEND, WHY = open_cupy()
needs_gpu = pytest.mark.skipif(BACKEND is None, reason=WHY or "no GPU")


@needs_gpu
def test_full_run_with_a_real_gpu_tier_verifies_every_block(small_run):
    r = run_cli(small_run("gpu", "--gpu", "real", "--gpu-mem-gb", "0.02", "--duration", "3"))
    assert r.returncode == 0, r.stderr
    res = small_run.results("gpu")
    gpu = res["run"]["tiers"]["gpu"]
    assert not gpu["simulated"] and "cupy" in gpu["description"]
    assert res["ops"]["gpu"].get("write", 0) > 0 and res["ops"]["cpu"].get("demote", 0) > 0
    assert res["verification"]["blocks_checked"] > 0 and res["verification"]["failures"] == 0
    tele = res["telemetry"]
    assert tele["nvml"] == "ok" and tele["gpus"] and "mem_used_bytes_max" in tele["gpus"][0]
    assert any("gpu0_mem_used_bytes" in row for row in res["timeseries"])


@needs_gpu
def test_more_hbm_than_free_is_refused(small_run):
    free = BACKEND.free_bytes(0) / 2**30
    r = run_cli(small_run("big", "--gpu", "real", "--gpu-mem-gb", str(round(free * 2 + 1))))
    assert r.returncode == 2 and "of its HBM is free" in r.stderr
