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
    moved = gpu["transfers"]  # the arena, the payload pool and the workers' buffers are registered: nothing staged
    assert moved["host_to_device"]["staged"] == 0 and moved["device_to_host"]["staged"] == 0, gpu["staged_why"]
    assert moved["device_to_host"]["direct"] > 0
    tele = res["telemetry"]
    assert tele["nvml"] == "ok" and tele["gpus"] and "mem_used_bytes_max" in tele["gpus"][0]
    assert any("gpu0_mem_used_bytes" in row for row in res["timeseries"])


@needs_gpu
def test_more_hbm_than_free_is_refused(small_run):
    free = BACKEND.free_bytes(0) / 2**30
    r = run_cli(small_run("big", "--gpu", "real", "--gpu-mem-gb", str(round(free * 2 + 1))))
    assert r.returncode == 2 and "of its HBM is free" in r.stderr


def _kvikio_missing() -> str:
    try:
        import kvikio  # noqa: F401
    except ImportError:
        return "kvikio is not installed (the gds extra)"
    return ""


@needs_gpu
@pytest.mark.skipif(bool(_kvikio_missing()), reason=_kvikio_missing() or "kvikio")
def test_gds_run_says_which_path_ran_and_verifies_every_block(small_run):
    # No CPU tier: GPU -> NVMe demotions cross the link; NVMe reads land in HBM.
    r = run_cli(small_run("gds", "--gpu", "real", "--gpu-mem-gb", "0.02", "--cpu-mem-gb", "0", "--gds",
                          "--duration", "3", quiet=False))
    assert r.returncode == 0, r.stderr
    res = small_run.results("gds")
    gds = res["run"]["gds"]
    assert gds["demoted_blocks"] > 0 and gds["loaded_blocks"] > 0
    assert ("cuFile" in gds["mode"]) or ("compatibility mode" in gds["mode"])
    assert " ".join(f"GDS path: {gds['mode']}".split()) in " ".join(r.stdout.split())  # lines wrap at 100 columns
    assert res["verification"]["failures"] == 0


@needs_gpu
def test_pinned_memory_is_used_directly_and_registered_memory_given_back():
    """A CuPy pinned allocation is not registered again (cudaErrorInvalidValue / AlreadyRegistered), and close()
    unregisters only what the tier registered (the gpu_bench crash of issue 35)."""
    from kv_cache.buffers import aligned_buffer
    from kv_cache.tiers.gpu import GpuTier

    slot = 1 << 20
    tier = GpuTier(BACKEND, 4 * slot, slot, [0], lanes=1, staging_bytes=slot)
    pinned, plain = BACKEND.alloc_pinned(slot), aligned_buffer(slot)
    assert BACKEND.is_pinned(pinned) and not BACKEND.is_pinned(plain)
    tier.pin_host(pinned)
    tier.pin_host(plain)
    assert BACKEND.is_pinned(plain)
    pinned[:] = 3
    tier.put(1, pinned)
    tier.get(1, plain)
    assert (plain == 3).all()
    assert tier.transfers() == {"host_to_device": {"direct": 1, "staged": 0},
                                "device_to_host": {"direct": 1, "staged": 0}}
    tier.close()
    assert not BACKEND.is_pinned(plain)


@needs_gpu
@pytest.mark.parametrize("copy, path", [("kernel", "host"), ("kernel", "hbm"), ("batch", "host"),
                                        ("per-piece", "host")])
def test_paged_blocks_round_trip_on_the_device_byte_identical_per_piece(copy, path):
    """Issue 49 point 4 on a real GPU: written, demoted, evicted, loaded back into other slots, read again: the
    same bytes, every piece where the engine's layout puts it (the same check as the fake device's)."""
    from paged_check import round_trip

    why = BACKEND.copy_why_not(copy)
    if why:
        pytest.skip(why)
    assert round_trip(BACKEND, copy, [0], path) == []


@needs_gpu
@pytest.mark.parametrize("copy", ["kernel", "batch", "per-piece"])
def test_a_paged_run_on_the_device_verifies_every_block(small_run, copy):
    why = BACKEND.copy_why_not(copy)
    if why:
        pytest.skip(why)
    r = run_cli(small_run(copy, "--gpu", "real", "--gpu-copy", copy, "--gpu-mem-gb", "0.02", "--max-requests", "40",
                          "--duration", "30"))
    assert r.returncode == 0, r.stderr
    res = small_run.results(copy)
    assert res["run"]["tiers"]["gpu"]["hbm_layout"]["copy"] == copy
    assert res["ops"]["cpu"]["demote"] > 0 and res["ops"]["gpu"]["promote"] > 0
    assert res["verification"]["blocks_checked"] > 0 and res["verification"]["failures"] == 0
