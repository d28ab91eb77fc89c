"""The memory budget is computed before the run and refused with numbers."""

import pytest

from kv_cache.config import resolve
from kv_cache.errors import UserError
from kv_cache.run.budget import MemoryBudget, check_fits
from kv_cache.run.compose import geometry, memory_budget

GiB = 2**30


def test_budget_parts():
    s = resolve(None, [], {"tiers.cpu_mem_gb": "2", "schedule.workers": "4"})
    b = memory_budget(s, geometry(s))
    assert b.cpu_tier_bytes == 25 * 80 * 2**20  # whole 80 MiB slots that fit in 2 GiB
    assert b.staging_bytes == 4 * 2 * 80 * 2**20  # workers x 2 x one llama70b block
    assert b.total_bytes == b.cpu_tier_bytes + b.staging_bytes + b.payload_pool_bytes + b.overhead_bytes


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
