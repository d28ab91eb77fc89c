"""Memory budget: computed before the run, refused with the numbers when it does not fit.

budget = CPU tier + staging (workers x 2 buffers x largest object, at least
2 MiB each: one for the request's block, one for waterfall moves) + payload pool + the donor store
when --semantic is on (its bound: every donor at the longest prompt) + a
fixed allowance for the interpreter, histograms and queues.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import psutil

from kv_cache.errors import UserError

OVERHEAD_BYTES = 256 << 20
HEADROOM = 0.9  # leave a tenth of available memory to the OS and the page cache


@dataclass(frozen=True)
class MemoryBudget:
    cpu_tier_bytes: int
    staging_bytes: int
    payload_pool_bytes: int
    overhead_bytes: int = OVERHEAD_BYTES
    donor_store_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (self.cpu_tier_bytes + self.staging_bytes + self.payload_pool_bytes + self.overhead_bytes
                + self.donor_store_bytes)

    def to_dict(self) -> dict:
        return {"cpu_tier": self.cpu_tier_bytes, "staging": self.staging_bytes,
                "payload_pool": self.payload_pool_bytes, "overhead": self.overhead_bytes,
                "donor_store": self.donor_store_bytes, "total": self.total_bytes}


def fits(budget: MemoryBudget, available: int | None = None) -> bool:
    available = psutil.virtual_memory().available if available is None else available
    return budget.total_bytes <= int(available * HEADROOM)


def check_fits(budget: MemoryBudget, workers: int, object_bytes: int, available: int | None = None) -> None:
    """Raise UserError with the numbers and a suggestion when the budget exceeds available memory."""
    available = psutil.virtual_memory().available if available is None else available
    limit = int(available * HEADROOM)
    if budget.total_bytes <= limit:
        return
    gib = 2**30
    over = budget.total_bytes - limit
    suggestion = (f"lower --cpu-mem-gb to {max(0.0, (budget.cpu_tier_bytes - over) / gib):.1f}"
                  if budget.cpu_tier_bytes > over else
                  "lower --semantic-max-donors" if budget.donor_store_bytes > over else
                  f"lower --workers (each needs {2 * object_bytes / gib:.2f} GiB of staging) or use a smaller "
                  f"--block-tokens")
    raise UserError(
        f"memory budget {budget.total_bytes / gib:.2f} GiB (CPU tier {budget.cpu_tier_bytes / gib:.2f} + staging "
        f"{workers} workers x 2 x {object_bytes / 2**20:.1f} MiB = {budget.staging_bytes / gib:.2f} + payload pool "
        f"{budget.payload_pool_bytes / gib:.2f} + donor store {budget.donor_store_bytes / gib:.2f} + overhead "
        f"{budget.overhead_bytes / gib:.2f}) exceeds "
        f"{HEADROOM:.0%} of the {available / gib:.2f} GiB available; {suggestion}.")


def peak_rss_bytes() -> int:
    """This process's peak resident memory.

    NOTE: Linux keeps getrusage's ru_maxrss across execve, so a run started from a large parent (a test
    runner, a notebook) would report the parent's peak; VmHWM belongs to this process's own memory map.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
