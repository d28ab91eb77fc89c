"""make install picks the CuPy / kvikio wheels of the driver's CUDA major version (nvidia-smi's header)."""

from __future__ import annotations

import os
import subprocess
import sys

from kv_cache.tiers.gpu_wheels import driver_cuda_major, extras_for

HEADER = "| NVIDIA-SMI 580.95.05    Driver Version: 580.95.05    CUDA Version: {cuda}     |"


def test_the_drivers_cuda_major_chooses_the_extras():
    assert driver_cuda_major(HEADER.format(cuda="13.0")) == 13
    assert extras_for(13)[0] == ("gpu-cu13", "gds-cu13")
    assert extras_for(12)[0] == ("gpu", "gds")
    assert extras_for(14)[0] == ("gpu-cu13", "gds-cu13") and "newer" in extras_for(14)[1]
    assert extras_for(None)[0] == ("gpu", "gds")


def test_the_extras_exist_in_pyproject():
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert "cupy-cuda13x" in " ".join(extras["gpu-cu13"]) and "kvikio-cu13" in " ".join(extras["gds-cu13"])
    assert "cupy-cuda12x" in " ".join(extras["gpu"]) and "kvikio-cu12" in " ".join(extras["gds"])


def test_a_cuda_13_host_gets_the_cuda_13_wheels(tmp_path):
    """Against an nvidia-smi that prints a CUDA 13 driver's header (the GPU host of issue 35 had cupy-cuda13x)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{HEADER.format(cuda='13.0')}'\n")
    smi.chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "kv_cache.tiers.gpu_wheels"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}"))
    assert r.returncode == 0 and r.stdout.split() == ["gpu-cu13", "gds-cu13"], r
    assert "CUDA 13" in r.stderr


def test_device_check_says_in_one_line_that_there_is_no_gpu_and_exits_0():
    """make device-check on a host without a GPU (CI, this machine): one line, exit 0, nothing left behind."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    from kv_cache.tiers.devices import open_cupy

    if open_cupy()[0] is not None:
        import pytest

        pytest.skip("a GPU is here: make device-check runs the whole check")
    r = subprocess.run([sys.executable, str(repo / "bench" / "device_check.py")], capture_output=True, text=True,
                       timeout=60, cwd=repo)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("device-check: no GPU here")
