"""The memory budget is computed before the run and refused with numbers."""

import pytest

from kv_cache.config import resolve
from kv_cache.errors import UserError
from kv_cache.run.budget import BOOKKEEPING_BYTES, MemoryBudget, check_fits
from kv_cache.run.compose import geometry, memory_budget

GiB = 2**30


def test_budget_parts():
    s = resolve(None, [], {"tiers.cpu_mem_gb": "2", "schedule.workers": "4"})
    b = memory_budget(s, geometry(s))
    assert b.cpu_tier_bytes == 25 * 80 * 2**20  # whole 80 MiB slots that fit in 2 GiB
    assert b.staging_bytes == 4 * 2 * 80 * 2**20  # workers x 2 x one llama70b block
    # gpu auto (16 GiB), cpu 2 GiB, nvme auto (at most 64 GiB) at 80 MiB slots: their blocks' bookkeeping
    assert b.bookkeeping_bytes == (204 + 25 + 819) * BOOKKEEPING_BYTES
    assert b.total_bytes == (b.cpu_tier_bytes + b.staging_bytes + b.payload_pool_bytes + b.overhead_bytes
                             + b.bookkeeping_bytes)


def test_a_tier_too_large_to_keep_track_of_is_refused_before_anything_is_built():
    s = resolve(None, [], {"tiers.gpu": "simulated", "tiers.gpu_mem_gb": 2**20, "model.name": "llama8b",
                           "model.block_tokens": 4})
    b = memory_budget(s, geometry(s))
    assert b.bookkeeping_bytes > (2**20 * GiB // (512 << 10)) * 1000  # 2 G blocks of 512 KiB
    with pytest.raises(UserError, match="bookkeeping .* blocks the tiers can hold.*--block-tokens"):
        check_fits(b, 4, geometry(s).max_object_bytes, available=24 * GiB)


def test_refusal_names_the_numbers_and_a_fix():
    b = MemoryBudget(20 * GiB, 1 * GiB, 128 << 20)
    with pytest.raises(UserError) as e:
        check_fits(b, 4, 128 << 20, available=16 * GiB)
    text = str(e.value)
    assert "CPU tier 20.00" in text and "16.00 GiB available" in text and "lower --cpu-mem-gb" in text


def test_staging_heavy_budget_suggests_fewer_workers():
    with pytest.raises(UserError, match="lower --workers"):
        check_fits(MemoryBudget(0, 30 * GiB, 128 << 20), 16, 1 * GiB, available=16 * GiB)


def test_default_run_fits_a_24_gib_machine():
    s = resolve(None, [], {})
    b = memory_budget(s, geometry(s))
    check_fits(b, 4, geometry(s).max_object_bytes, available=24 * GiB)
    assert b.total_bytes < 8 * GiB


def test_a_nixl_prefill_nodes_region_is_a_part_of_the_budget_and_only_its():
    """--disagg-handoff-gb is host memory a NIXL prefill node registers: counted (and in results' budget parts);
    a decode node, or a folder handoff, registers none."""
    def handoff_bytes(role: str, url: str) -> int:
        s = resolve(None, [], {"disagg.role": role, "disagg.handoff": url, "disagg.handoff_gb": "3"})
        b = memory_budget(s, geometry(s))
        assert b.to_dict()["handoff"] == b.handoff_bytes and b.to_dict()["total"] == b.total_bytes
        return b.handoff_bytes

    assert handoff_bytes("prefill", "nixl://127.0.0.1:5555") == 3 * GiB
    assert handoff_bytes("decode", "nixl://127.0.0.1:5555") == 0
    assert handoff_bytes("prefill", "file:///tmp") == 0
