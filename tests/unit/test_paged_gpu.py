"""The GPU tier in the engine's paged layout (issue 49), on the fake device: every path moves the pieces, each copy
method with the same semantics, what ran said in results.json, bad input one sentence each."""

from __future__ import annotations

import pytest
from conftest import run_cli
from helpers import bench_module
from paged_check import round_trip

from kv_cache.tiers.devices import FakeDevice
from kv_cache.tiers.paged import COPIES


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize("gpus", [1, 2])
def test_blocks_round_trip_through_every_path_and_every_piece_sits_where_the_engine_puts_it(copy, gpus):
    assert round_trip(FakeDevice(count=gpus), copy, list(range(gpus))) == []


@pytest.mark.parametrize("via", ["host", "hbm"])
def test_the_kernel_through_an_hbm_staging_buffer_moves_the_same_bytes(via):
    """The kernel's two ways across the link (zero copy, or through a lane's HBM staging buffer and one DMA copy
    per block; the buffer here holds one block, so a batch goes through it a block at a time)."""
    from kv_cache.tiers import paged as gpu

    old = gpu.HBM_STAGE_BYTES
    gpu.HBM_STAGE_BYTES = 64 * 1024  # one of the check's 64 KiB blocks: a batch goes through it in turn
    try:
        assert round_trip(FakeDevice(count=2), "kernel", [0, 1], via) == []
    finally:
        gpu.HBM_STAGE_BYTES = old


def _env(spec: str = "1:2") -> dict:
    return {"KVBENCH_FAKE_GPU": spec}


@pytest.mark.parametrize("copy", COPIES)
def test_a_run_as_typed_moves_the_pieces_by_the_method_asked_and_verifies_every_block(small_run, copy):
    """The command line with --gpu-copy: the tier's HBM is the per-layer tensors (llama8b, 16-token blocks: 64
    pieces of 32 KiB), blocks demoted to the CPU tier and promoted back are verified, and results.json says which
    layout and copy ran."""
    r = run_cli(small_run(copy, "--gpu", "real", "--gpu-copy", copy, "--gpu-mem-gb", "0.01", "--max-requests", "40",
                          "--duration", "30"), extra_env=_env())
    assert r.returncode == 0, r.stderr
    res = small_run.results(copy)
    gpu = res["run"]["tiers"]["gpu"]
    assert gpu["hbm_layout"]["kind"] == "paged" and gpu["hbm_layout"]["copy"] == copy
    assert gpu["hbm_layout"]["pieces_per_block"] == 64 and gpu["hbm_layout"]["piece_bytes"] == 32 * 1024
    assert f"64 pieces of 32 KiB, copied by {copy}" in gpu["description"]
    assert res["ops"]["cpu"]["demote"] > 0 and res["ops"]["gpu"]["promote"] > 0
    assert res["verification"]["blocks_checked"] > 0 and res["verification"]["failures"] == 0


def test_contiguous_is_kept_on_request_and_an_lmcache_chunk_is_sixteen_pages(small_run):
    r = run_cli(small_run("flat", "--gpu", "real", "--gpu-layout", "contiguous", "--gpu-mem-gb", "0.01",
                          "--max-requests", "10", "--warmup", "0", "--duration", "30"), extra_env=_env())
    assert r.returncode == 0, r.stderr
    flat = small_run.results("flat")["run"]["tiers"]["gpu"]
    assert flat["hbm_layout"]["kind"] == "contiguous" and "contiguous slots" in flat["description"]
    r = run_cli(small_run("chunk", "--gpu", "real", "--block-tokens", "256", "--gpu-mem-gb", "0.1", "--cpu-mem-gb",
                          "0.1", "--nvme-gb", "1", "--max-requests", "10", "--warmup", "0", "--duration", "30"),
                 extra_env=_env())
    assert r.returncode == 0, r.stderr
    chunk = small_run.results("chunk")
    assert chunk["run"]["tiers"]["gpu"]["hbm_layout"]["pieces_per_block"] == 2 * 32 * 16
    assert "(16 pages of 16 tokens)" in chunk["run"]["tiers"]["gpu"]["description"]
    assert chunk["verification"]["failures"] == 0


def test_auto_says_why_a_whole_request_object_stays_contiguous(small_run):
    r = run_cli(small_run("whole", "--gpu", "real", "--block-tokens", "0", "--gpu-mem-gb", "0.05", "--cpu-mem-gb",
                          "0.1", "--nvme-gb", "1", "--max-requests", "4", "--warmup", "0", "--duration", "30",
                          quiet=False), extra_env=_env())
    assert r.returncode == 0, r.stderr
    assert "contiguous slots (--gpu-layout auto): --block-tokens 0 stores one object per request" in \
        " ".join(r.stdout.split())
    assert small_run.results("whole")["run"]["tiers"]["gpu"]["hbm_layout"]["kind"] == "contiguous"


def test_the_kernel_through_hbm_as_typed_verifies_and_its_staging_counts_against_the_hbm(small_run):
    r = run_cli(small_run("hbm", "--gpu", "real", "--gpu-kernel-path", "hbm", "--gpu-mem-gb", "0.01",
                          "--max-requests", "40", "--duration", "30"), extra_env=_env())
    assert r.returncode == 0, r.stderr
    res = small_run.results("hbm")
    assert res["run"]["tiers"]["gpu"]["hbm_layout"]["kernel_path"] == "hbm"
    assert "through HBM staging" in res["run"]["tiers"]["gpu"]["description"]
    assert res["ops"]["gpu"]["promote"] > 0 and res["verification"]["failures"] == 0
    # 0.05 GiB of slots fit a 0.1 GiB device; with a 64 MiB staging buffer per worker's lane they do not
    r = run_cli(small_run("nohbm", "--gpu", "real", "--gpu-kernel-path", "hbm", "--gpu-mem-gb", "0.05",
                          "--max-requests", "4"), extra_env=_env("1:0.1"))
    text = " ".join(r.stderr.split())
    assert r.returncode == 2 and "of --gpu-kernel-path hbm's staging buffers" in text, text
    assert "or use --gpu-kernel-path host" in text


def test_gds_gathers_the_pieces_into_its_landing_buffer_and_scatters_them_back(small_run):
    r = run_cli(small_run("gds", "--gpu", "real", "--gds", "--gpu-mem-gb", "0.01", "--cpu-mem-gb", "0",
                          "--max-requests", "40", "--duration", "30"), extra_env=_env())
    assert r.returncode == 0, r.stderr
    res = small_run.results("gds")
    assert res["run"]["tiers"]["gpu"]["hbm_layout"]["kind"] == "paged"
    assert res["run"]["gds"]["demoted_blocks"] > 0 and res["run"]["gds"]["loaded_blocks"] > 0
    assert res["verification"]["blocks_checked"] > 0 and res["verification"]["failures"] == 0


@pytest.mark.parametrize("args, env, words", [
    (["--gpu", "simulated", "--gpu-layout", "paged"], "1:2", "--gpu simulated has no HBM"),
    (["--gpu", "real", "--gpu-layout", "paged", "--block-tokens", "100"], "1:2",
     "--block-tokens 100 is not a whole number of 16-token pages"),
    (["--gpu", "real", "--gpu-copy", "batch", "--block-tokens", "0"], "1:2",
     "--block-tokens 0 stores one object per request"),
    (["--gpu", "real", "--gpu-layout", "contiguous", "--gpu-copy", "per-piece"], "1:2",
     "--gpu-layout contiguous keeps a block in one piece"),
    (["--gpu", "real", "--gpu-copy", "batch"], "1:2:12.4", "new in CUDA 12.8, and this host has runtime 12.4"),
    (["--gpu", "simulated", "--gpu-copy", "batch"], "1:2", "--gpu-copy acts only with a real GPU tier"),
    (["--gpu", "real", "--gpu-copy", "batch", "--gpu-kernel-path", "hbm"], "1:2",
     "--gpu-kernel-path acts only with the paged layout's kernel"),
    # a batch of --gds I/O holds two device buffers a block in flight (a read's landing, a paged demotion's gather)
    (["--gpu", "real", "--gds", "--cpu-mem-gb", "0", "--max-inflight", "8", "--workers", "1"], "1:0.05",
     "--gds needs 68 MiB of HBM on GPU 0 for its landing and gather buffers"),
])
def test_a_layout_or_copy_that_cannot_be_is_one_sentence(small_run, args, env, words):
    r = run_cli(small_run("bad", *args, "--gpu-mem-gb", "0.01", "--max-requests", "4"), extra_env=_env(env))
    assert r.returncode == 2, r.stdout + r.stderr
    text = " ".join(r.stderr.split())
    assert words in text and "Traceback" not in text and text.count("error:") == 1, text
    assert not (small_run.out / "bad").exists() and not any(small_run.cache.iterdir())


def test_the_paged_bench_measures_every_method_direct_on_the_fake_device():
    """bench/paged_bench.py once forgot to record its page-locked buffer with the tier: every block went through the
    staging copy and every method read 0.1 of the link on the H200. Each row now says how many were staged."""
    bench = bench_module("paged_bench")
    VARIANTS, paged_round = bench.VARIANTS, bench.paged_round  # noqa: N806 (the bench's names)
    res = paged_round(fake=True, models=("llama3.1-8b",), batches=2, rounds=1)
    assert [r["copy"] for r in res["rows"]] == [v[0] for v in VARIANTS]
    assert all(r["staged"] == 0 and r["h2d_gbps"] > 0 and r["d2h_gbps"] > 0 for r in res["rows"]), res["rows"]
