"""Memory budget: computed before the run, refused with the numbers when it does not fit.

budget = CPU tier + staging (workers x 2 buffers x largest object, at least 2 MiB each: one for the request's
block, one for waterfall moves; and the batch arena of batched request I/O) + a real GPU tier's staging (one
pinned buffer of the largest object per lane: workers + 1, and the CUDA runtime's own memory) + payload pool and
its stamp tags + the donor store when --semantic is on (its bound: every donor at the longest prompt) + the
bookkeeping of every block the tiers can hold (index entry, policy entry, slot: BOOKKEEPING_BYTES each) + synthetic
users' conversations at their longest (each user's last prompt and answer, and the user: USER_BYTES) + the time
series of every second the window may last (timeseries_bytes: per-second histograms and counters, which grow with
--duration and --drain-s, and their copies made into results.json at the end; under MPI, rank 0's merge of every
rank's) + a fixed
allowance for the interpreter, histograms, queues, the planner's chain memo (at most 32 MiB: cache/hashing.py's
MEMO_BYTES) and the infinite-cache ceiling's keys (about 38 MiB at most: lifecycle/ceiling.py's CEILING_BYTES) + a
replayed trace's records (1.5-7.5 times its files: sources/trace_io.py's MEMORY_PER_FILE_BYTE; while they are read, up
to 12.5 times, checked before: sizing.check_trace_fits).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from kv_cache.errors import UserError
from kv_cache.hostmemory import available_bytes, where_from
from kv_cache.recorder.access_log import FOLD_SLACK, ROW_BYTES

OVERHEAD_BYTES = 256 << 20
# Python objects the cache keeps per block it holds: measured 0.9 KiB (lru) to 1.3 KiB (semantic-adaptive) with
# tracemalloc over 75,000 chained blocks; 1.5 KiB leaves room.
BOOKKEEPING_BYTES = 1536
# --capacity-curve, per access of its bound, at its worst (a block a request, so a row a request; tracemalloc over
# 135,000 accesses sampled to 1/4, tests/unit/test_capacity.py's chains cut to one block): the log holds
# 72 B an access (its arrays and its rows'), 408 at the peak of a halving (old and new arrays), and computing the
# curve after the run takes 228 more (300 with the log): the halving's peak, the larger, with a little room; plus
# the rows without a kept access gathered before a fold, and their copy
ACCESS_LOG_BYTES = 420
ACCESS_LOG_FIXED_BYTES = 2 * FOLD_SLACK * ROW_BYTES
USER_BYTES = 2048  # a synthetic user without its conversation (its generator and state): measured 1.5 KiB
# The recorder's time series, a second of the window at its peak (the snapshot and results.json's rows made at the
# end, beside the recorder's own): measured with tracemalloc over 80-200 s of 1 to 16 workers busy on 1 to 4 tiers
# (tests/unit/test_budget.py holds a real recorder to it): about 7.3 KiB a second, 7.9 KiB more a tier (its read and
# write histograms of the second, handed to the snapshot at the end, not copied) and 0.6 + 0.3 KiB a tier for each
# worker (its own counters of the second; where a dict grows moves them); with room, a day of 16 workers on 4 tiers
# is 7.3 GiB
SECOND_BYTES, SECOND_TIER_BYTES = 8 << 10, 10 << 10
SECOND_WORKER_BYTES, SECOND_WORKER_TIER_BYTES = 512, 512
# Under MPI rank 0 also merges the ranks' results at the end, a second of the window at its peak: three decoded
# snapshots at a time (two merged into a third) and every rank's results (received, and made a dict to merge):
# measured with tracemalloc over 50-300 s of 1 to 4 tiers and 2 to 5 ranks (tests/unit/test_budget.py holds a real
# merge to it): 16.5 KiB a tier for the merge, 1.7 + 1.7 KiB a tier for each rank's results; with room
MERGE_SECOND_BYTES, MERGE_SECOND_TIER_BYTES = 4 << 10, 20 << 10
RANK_SECOND_BYTES, RANK_SECOND_TIER_BYTES = 2 << 10, 2 << 10
HEADROOM = 0.9  # leave a tenth of available memory to the OS and the page cache


@dataclass(frozen=True)
class MemoryBudget:
    cpu_tier_bytes: int
    staging_bytes: int
    payload_pool_bytes: int
    overhead_bytes: int = OVERHEAD_BYTES
    donor_store_bytes: int = 0
    bookkeeping_bytes: int = 0  # BOOKKEEPING_BYTES per block the tiers can hold
    handoff_bytes: int = 0  # a NIXL prefill node's registered region (--disagg-handoff-gb)
    gpu_staging_bytes: int = 0  # a real GPU tier's lanes: a pinned (page-locked) buffer of the largest object each,
    # and the CUDA runtime's own host memory (the backend's runtime_bytes)
    payload_stamps_bytes: int = 0  # the payload pool's stamp tags and the workers' check rows
    access_log_bytes: int = 0  # --capacity-curve: its log at its bound, and the curve computed from it after the run
    backlog_bytes: int = 0  # --max-backlog-gb: the requests issued and not yet done
    traffic_bytes: int = 0  # synthetic users' conversations at their longest (this process's users)
    timeseries_bytes: int = 0  # the time series of the window's seconds (timeseries_bytes())
    trace_bytes: int = 0  # a replayed trace's records (sources/trace_io.py's MEMORY_PER_FILE_BYTE)

    @property
    def total_bytes(self) -> int:
        return (self.cpu_tier_bytes + self.staging_bytes + self.payload_pool_bytes + self.overhead_bytes
                + self.donor_store_bytes + self.bookkeeping_bytes + self.handoff_bytes + self.gpu_staging_bytes
                + self.payload_stamps_bytes + self.access_log_bytes + self.backlog_bytes + self.traffic_bytes
                + self.timeseries_bytes + self.trace_bytes)

    def to_dict(self) -> dict:
        return {"cpu_tier": self.cpu_tier_bytes, "staging": self.staging_bytes,
                "payload_pool": self.payload_pool_bytes, "overhead": self.overhead_bytes,
                "donor_store": self.donor_store_bytes, "bookkeeping": self.bookkeeping_bytes,
                "handoff": self.handoff_bytes, "total": self.total_bytes, "gpu_staging": self.gpu_staging_bytes,
                "payload_stamps": self.payload_stamps_bytes, "access_log": self.access_log_bytes,
                "request_backlog": self.backlog_bytes, "traffic": self.traffic_bytes,
                "timeseries": self.timeseries_bytes, "trace": self.trace_bytes}


def timeseries_bytes(seconds: int, tiers: int, workers: int, ranks: int = 1) -> int:
    """What the recorder's time series of `seconds` seconds of the window takes at its peak, with `tiers` tiers and
    `workers` workers (each keeps its own counters of a second); with ranks > 1, on rank 0, which merges them all."""
    per_worker = SECOND_WORKER_BYTES + SECOND_WORKER_TIER_BYTES * tiers
    own = SECOND_BYTES + SECOND_TIER_BYTES * tiers + workers * per_worker
    if ranks == 1:
        return seconds * own
    merge = MERGE_SECOND_BYTES + MERGE_SECOND_TIER_BYTES * tiers
    return seconds * (own + merge + ranks * (RANK_SECOND_BYTES + RANK_SECOND_TIER_BYTES * tiers))


def fits(budget: MemoryBudget, available: int | None = None) -> bool:
    available = available_bytes() if available is None else available
    return budget.total_bytes <= int(available * HEADROOM)


def check_fits(budget: MemoryBudget, workers: int, object_bytes: int, available: int | None = None,
               ranks_here: int = 1) -> None:
    """Raise UserError with the numbers and a suggestion when the budget exceeds available memory (available: this
    process's share of it, when ranks_here ranks share the host)."""
    available = available_bytes() if available is None else available
    limit = int(available * HEADROOM)
    if budget.total_bytes <= limit:
        return
    gib = 2**30
    over = budget.total_bytes - limit
    per_worker = budget.staging_bytes / max(workers, 1)  # its block's buffer, its scratch, its batch's arena
    fixes = [  # the largest part's fix: it is what the user has to change most
        (budget.cpu_tier_bytes, "lower --cpu-mem-gb" + (f" to {(budget.cpu_tier_bytes - over) / gib:.1f}"
                                                        if budget.cpu_tier_bytes > over else "")),
        (budget.donor_store_bytes, "lower --semantic-max-donors"),
        (budget.bookkeeping_bytes, "lower the tiers' capacity (--gpu-mem-gb, --nvme-gb) or raise --block-tokens: "
                                   "fewer, larger blocks"),
        (budget.handoff_bytes, "lower --disagg-handoff-gb (the prefill node's registered region for NIXL)"),
        (budget.staging_bytes, f"lower --workers (each holds {per_worker / gib:.2f} GiB of buffers: its block's, "
                               f"its scratch and its batch in flight, up to --max-inflight blocks) or use a smaller "
                               f"--block-tokens"),
        (budget.access_log_bytes, "lower --capacity-log-accesses (the capacity curve's log: a SHARDS sample past it)"),
        (budget.backlog_bytes, "lower --max-backlog-gb (the requests issued and not yet done)"),
        (budget.traffic_bytes, "lower --users (each holds its conversation: its last prompt and answer)"),
        (budget.timeseries_bytes, "shorten --duration or --drain-s (the time series keeps every second of the "
                                  "window; under MPI rank 0 merges every rank's), or lower --workers"),
        (budget.trace_bytes, "replay a part of the trace (its first lines: head -n N FILE > PART)"),
        (budget.gpu_staging_bytes, f"lower --workers (each GPU lane pins {object_bytes / gib:.2f} GiB of host "
                                   f"memory) or use a smaller --block-tokens"),
    ]
    suggestion = max(fixes, key=lambda f: f[0])[1]
    raise UserError(
        f"memory budget {budget.total_bytes / gib:.2f} GiB (CPU tier {budget.cpu_tier_bytes / gib:.2f} + staging "
        f"{workers} workers x {per_worker / 2**20:,.1f} MiB = {budget.staging_bytes / gib:.2f} + payload pool "
        f"{budget.payload_pool_bytes / gib:.2f} + donor store {budget.donor_store_bytes / gib:.2f} + bookkeeping "
        f"{budget.bookkeeping_bytes / gib:.2f} ({budget.bookkeeping_bytes // BOOKKEEPING_BYTES:,} blocks the tiers "
        f"can hold x {BOOKKEEPING_BYTES / 1024:.1f} KiB)"
        + (f" + NIXL handoff region {budget.handoff_bytes / gib:.2f}" if budget.handoff_bytes else "")
        + (f" + GPU lanes' pinned staging {budget.gpu_staging_bytes / gib:.2f}" if budget.gpu_staging_bytes else "")
        + (f" + payload stamps {budget.payload_stamps_bytes / gib:.2f}" if budget.payload_stamps_bytes else "")
        + (f" + capacity curve's access log {budget.access_log_bytes / gib:.2f}" if budget.access_log_bytes else "")
        + (f" + request backlog {budget.backlog_bytes / gib:.2f}" if budget.backlog_bytes else "")
        + (f" + users' conversations {budget.traffic_bytes / gib:.2f}" if budget.traffic_bytes else "")
        + (f" + time series {budget.timeseries_bytes / gib:.2f}" if budget.timeseries_bytes else "")
        + (f" + the trace's records {budget.trace_bytes / gib:.2f}" if budget.trace_bytes else "")
        + f" + overhead {budget.overhead_bytes / gib:.2f}) exceeds "
        f"{HEADROOM:.0%} of the {available / gib:.2f} GiB available{where_from(available * ranks_here)}"
        + (f" to each of the {ranks_here} ranks on this host (its {available * ranks_here / gib:.2f} GiB shared "
           f"evenly; fewer ranks a host (mpirun's -np or --processes) leave each more)" if ranks_here > 1 else "")
        + f"; {suggestion}.")


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
