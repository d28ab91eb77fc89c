"""Telemetry: host readings, and the block layer's bytes matching what we wrote with O_DIRECT."""

from __future__ import annotations

import os

import pytest

from kv_cache.buffers import aligned_buffer
from kv_cache.recorder.telemetry import Telemetry, disk_of
from kv_cache.tiers.fsinfo import probe_direct


def test_a_sample_has_host_readings_and_says_why_gpus_are_missing(tmp_path):
    t = Telemetry(str(tmp_path))
    row = t.sample(measuring=True)
    assert 0.0 <= row["host_cpu_pct"] <= 100.0 and row["host_mem_used_bytes"] > 0
    assert t.sample(measuring=True) is None  # at most once a second
    s = t.summary()
    assert s["samples"] == 1
    assert s["nvml"] == "ok" or s["nvml"].startswith(("NVML unavailable", "nvidia-ml-py"))
    assert s["nvml"] != "ok" or s["gpus"]
    t.close()


def test_the_block_layer_sees_the_bytes_written_with_o_direct(tmp_path):
    if disk_of(str(tmp_path)) is None or probe_direct(str(tmp_path)):
        pytest.skip("tmp_path is not on a block device accepting O_DIRECT here")
    t = Telemetry(str(tmp_path), nvml=False)
    t.sample(measuring=True)
    buf = aligned_buffer(8 << 20)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        for i in range(4):
            os.pwrite(fd, buf, i * buf.size)
    finally:
        os.close(fd)
    s = t.summary({"read": 0, "write": 4 * buf.size})
    assert s["disk"]["write_bytes"] >= 4 * buf.size  # other writers can only add
    assert s["disk"]["device_over_benchmark"]["write"] >= 1.0
    assert s["disk"]["device_over_benchmark"]["read"] is None  # nothing read: null, never 0
