"""The typed Results: what results.json holds, as dataclasses built by the recorder.

Report, compare, trials and submission read these fields, never key paths in
a dict; the sections beyond the core figures are in sections.py, the loading
and the JSON schema in typed.py. The JSON schema is generated from the
dataclasses and stored per version in ``schemas/results-v<N>.json``; ``tests/unit/test_results_schema.py``
fails when the dataclasses no longer match the stored schema of
``SCHEMA_VERSION``: a change is announced by bumping the version and storing
the new schema beside the old ones (``python -m kv_cache.recorder.results_schema``).

Units are in the names: ``_ms`` milliseconds, ``_gbps`` 10^9 bytes per second
over the measurement window, ``_bytes`` and counts as integers. A ratio over
an empty denominator is null, never 0. Loading checks every value's type, and
that every number is finite and within 64 bits. Only mappings whose keys are
data (tier, class and transform names, time-series columns, the settings
tree, histogram encodings) are mappings, of typed values.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kv_cache.recorder.sections import (
    Autoscale,
    BudgetParts,
    GdsInfo,
    Latency,
    LoadVerdict,
    Occupancy,
    Precondition,
    ProbeStep,
    Qos,
    RankDetail,
    RankSpread,
    Role,
    Semantic,
    SnapshotData,
    SteadyState,
    TelemetrySummary,
    Trials,
    Workload,
)
from kv_cache.recorder.stack_distances import CapacityCurve
from kv_cache.recorder.typed import SchemaVersionError, json_schema
from kv_cache.recorder.typed import load as _load

SCHEMA_VERSION = 21  # 21: capacity_curve.served_order (the requests' order against their arrival order)
# (20: blocks_write_skipped_by (why each new block not written was refused))
# (19: workload.trace.changed (records kept with a change: answers_given_fixed_length,
# answers_cut; they were counted as skipped); precondition.tier (the tier written: not always the storage under
# test); a decode node's run.bottom_tier is "handoff", the storage it loads prefixes from
# (18: memory.budget.trace (a replayed trace's records))
# (17: memory.budget.timeseries (the time series of every second the window may last))
# (16: memory.budget.traffic (synthetic users' conversations at their longest))
# (15: run.tiers.*.io_unit_bytes (an NVMe tier's I/O size under --io-unit layer))
# (14: run.tiers.*.io_depth (the most I/Os a worker's batch keeps in flight on an NVMe tier))
# (13: queue_depth.*.*.in_flight_mean / in_flight_p95 (the depth the medium was given, measured))
# (12: memory.budget.request_backlog (--max-backlog-gb) and requests.backlog_bytes_at_stop)
# (11: memory.budget.access_log (--capacity-curve's log, bounded by --capacity-log-accesses))
# (10: run.tiers.*.hbm_layout (a real GPU tier's HBM: contiguous, or paged and its copy method))
# (9: capacity_curve.demand_model; a point's bottom share, reads and writes null where not replayed;
# hit_rate.infinite_cache and hit_rate.infinite_cache_untracked (the run's own ceiling, measured))
# (8: capacity_curve.replayed (typed: was the curve's policy replayed, not read from its words))
# (7: load.cause, load.workers_in_io_share, load.process_cpu_share (what a queue was made of))
# (6: role.requests_unacknowledged and role.dropped_unread (a prefill node's handoff); the
# capacity_curve section (--capacity-curve); latency percentiles too few samples support are null)
# (5: run.tiers.*.transfers (direct / staged), memory.budget.gpu_staging and payload_stamps)
# (4: memory.budget.handoff, a NIXL prefill node's registered region)
# (3: every section typed (sections.py), value types checked on load, bytes_whole_run)
# (2: typed Results; run.bottom_tier; optional sections always present, null when off)
SCHEMAS = Path(__file__).resolve().parent / "schemas"
SIGNIFICANT = 6  # digits of a measured float in results.json
RESULTS_LIMIT = 1 << 30  # the most a results.json is read: a day's run with per-second histograms stays far below


def rounded(obj, digits: int = SIGNIFICANT):
    """obj with every float at `digits` significant digits (ints, strings and None as they are)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rounded(v, digits) for v in obj]
    return obj


@dataclass
class ReadWrite:
    """One tier's read and write figures (bytes, blocks or GB/s)."""

    read: float = 0
    write: float = 0


@dataclass
class Transfers:
    """Host <-> device copies of a tier that moves bytes over PCIe, the whole run: direct from or into page-locked
    host memory, or staged (a pinned bounce buffer plus a host copy, inside the timed operation)."""

    direct: int = 0
    staged: int = 0


@dataclass
class QueueDepth:
    """A tier's batches of one kind (--request-io batched), per batch: the blocks one worker handed it together
    (mean, p95, max), and the I/Os its medium had in flight on average over the batch's time (in_flight_*: Little's
    law over each I/O's time from its submission to its completion; null where the medium's batch path does not
    time its I/Os). A pool of threads or a ring holds at most its own depth of a batch's blocks at once."""

    batches: int
    mean: float
    p95: float
    max: int
    in_flight_mean: float | None = None
    in_flight_p95: float | None = None


@dataclass
class HbmLayout:
    """A real GPU tier's HBM: contiguous slots, or the engine's paged layout (paged.Paging) and its copy method."""

    kind: str                       # contiguous or paged
    copy: str | None = None         # kernel, batch or per-piece (--gpu-copy)
    kernel_path: str | None = None  # the kernel's way across the link: host or hbm (--gpu-kernel-path)
    page_tokens: int | None = None
    layers: int | None = None
    parts: int | None = None        # 2 (K and V) or 1 (MLA)
    pieces_per_block: int | None = None
    piece_bytes: int | None = None
    host_order: str | None = None   # the gathered block's order on the host side


@dataclass
class TierInfo:
    capacity_bytes: int
    description: str
    simulated: bool = False
    null: bool = False
    transfers: dict[str, Transfers] | None = None  # host_to_device, device_to_host (a real GPU tier)
    staged_why: str = ""  # the first staged transfer's buffer, when any was staged
    batches: str = ""     # how a batch of its blocks reaches the medium (--request-io batched)
    hbm_layout: HbmLayout | None = None  # a real GPU tier's HBM
    io_depth: int | None = None  # the most I/Os a worker's batch keeps in flight on it (its engine's pool or ring)
    io_unit_bytes: int | None = None  # the most bytes one of its I/Os moves (--io-unit layer); null: a block an I/O


@dataclass
class RunInfo:
    """What ran, where, and how it ended."""

    rank: int | None
    ranks: int
    hosts: list[str]
    wall_offset_ns: int
    tool_version: str
    run_id: str
    host: str
    started_utc: str
    model: str
    kv_dtype: str
    tp: int
    bytes_per_token: int
    block_tokens: int
    block_bytes: int
    slot_bytes: int
    users: int
    workers: int
    workers_probe: list[ProbeStep] | None  # --workers 0: each concurrency step of the probe
    seed: int
    warmup_s: float
    io_engine: str
    io_engine_requested: str
    io_engine_note: str
    nvme_layout: str
    cache_dir: str | None
    fs_type: str | None
    tiers: dict[str, TierInfo]
    bottom_tier: str                 # the storage under test: the last tier of the stack
    gds: GdsInfo | None
    notes: list[str]
    partial: bool
    stopped_reason: str | None
    fault: str
    request_io: str = "serial"       # batched: a request's blocks in flight together; serial: one at a time
    max_inflight: int = 1            # the most blocks of one worker in flight together
    duration_s: float = 0.0          # the measurement window
    issuing_s: float = 0.0           # the window until issuing stopped (the drain after it excluded)


@dataclass
class Requests:
    completed: int = 0
    per_s: float = 0.0
    issued: int = 0
    dropped_at_stop: int = 0
    users_started: int = 0           # closed loop: users whose first request was issued
    users_paced: int = 0             # of them, those whose first request waited for a short queue first
    users_waiting_at_stop: int = 0   # never started: still waiting for a short queue when the run stopped
    held_for_previous_turn: int = 0  # open loop: turns that arrived before their session's previous answer
    issued_in_window: int = 0        # offered load: requests that arrived (were due) inside the window
    warmup_completed: int = 0        # completed before the window opened
    in_flight_at_end: int = 0        # issued - warm-up - completed - dropped - abandoned: 0 after the drain
    abandoned_at_stop: int = 0       # in flight when --drain-s ran out: stopped at their next block operation
    backlog_bytes_at_stop: int = 0   # what the requests issued and not yet done held when issuing stopped


@dataclass
class Tokens:
    prompt: int = 0
    cached: int = 0
    generated: int = 0
    per_s: float = 0.0
    cached_per_s: float = 0.0
    generated_per_s: float = 0.0
    cached_by_tier: dict[str, int] = field(default_factory=dict)
    cached_by_source: dict[str, int] = field(default_factory=dict)
    prompt_by_source: dict[str, int] = field(default_factory=dict)


@dataclass
class HitRate:
    tokens: float | None = None
    blocks: float | None = None
    by_source: dict[str, float | None] = field(default_factory=dict)
    # the window's requests against an infinite cache (lifecycle/ceiling.py): the ceiling `tokens` cannot exceed;
    # null where some request was not tracked (past its bound, or a decode node's handoff)
    infinite_cache: float | None = None
    infinite_cache_untracked: int = 0  # requests of the window it could not judge


@dataclass
class SharedStorage:
    enabled: bool = False
    adopted_blocks: int = 0
    vanished_blocks: int = 0


@dataclass
class Verification:
    mode: str
    blocks_checked: int = 0
    failures: int = 0
    failures_in_warmup: int = 0
    blocks_discarded: int = 0
    scope: str = "whole run, warm-up included"


@dataclass
class Warmup:
    ops: int = 0
    requests: int = 0


@dataclass
class MlperfCompatible:
    """The names MLPerf Storage's tables use, computed by our rules (the bottom tier is the storage)."""

    cached_tokens_per_s: float
    storage_read_gbps: float
    storage_write_gbps: float
    storage_read_p95_ms: float | None


@dataclass
class Cpu:
    """CPU time of the benchmark's process(es) in the window (all threads, user + system)."""

    process_s: float = 0.0
    per_gib_moved: float | None = None  # CPU seconds per GiB read or written in any tier


@dataclass
class Memory:
    peak_rss_bytes: int
    budget_bytes: int
    budget: BudgetParts | None = None  # the budget's parts (one rank's; null after a merge of ranks)
    per_rank: bool = False       # merged over MPI ranks: the peak of one rank


@dataclass
class Results:
    """results.json."""

    schema_version: int
    run: RunInfo
    latency_ms: dict[str, dict[str, Latency]]                       # tier -> op
    latency_ms_by_phase: dict[str, dict[str, dict[str, Latency]]]   # tier -> op -> phase
    request_latency_ms: dict[str, Latency]                          # storage, queue, ttft, e2e, handoff
    qos: Qos
    semantic: Semantic | None
    bandwidth_gbps: dict[str, ReadWrite]
    bytes: dict[str, ReadWrite]                  # in the window
    bytes_whole_run: dict[str, ReadWrite]        # warm-up, window and drain: what the run really moved
    blocks: dict[str, ReadWrite]
    ops: dict[str, dict[str, int]]
    requests: Requests
    load: LoadVerdict | None     # what decided the numbers: storage, the generator's queue, or the users' pace
    tokens: Tokens
    hit_rate: HitRate
    blocks_write_skipped: int
    blocks_write_skipped_by: dict[str, int] | None  # counters.WRITE_SKIPPED_WHY; None: schema 19's (not recorded)
    shared_storage: SharedStorage
    verification: Verification
    warmup: Warmup
    timeseries: list[dict[str, float | None]]   # one row per second; its columns are named after the tiers
    steady_state: SteadyState | None
    mlperf_compatible: MlperfCompatible
    memory: Memory
    cpu: Cpu
    occupancy: dict[str, Occupancy]
    workload: Workload
    role: Role | None
    settings: dict[str, Any]     # the settings tree as run (config/schema.py; settings.yaml reruns it)
    snapshot: SnapshotData
    precondition: Precondition | None = None
    autoscale: Autoscale | None = None
    telemetry: TelemetrySummary | None = None
    telemetry_per_rank: list[TelemetrySummary | None] | None = None
    ranks_detail: list[RankDetail] | None = None
    rank_spread: dict[str, dict[str, RankSpread]] | None = None
    warnings: list[str] = field(default_factory=list)
    trials: Trials | None = None
    capacity_curve: CapacityCurve | None = None
    queue_depth: dict[str, dict[str, QueueDepth]] = field(default_factory=dict)  # tier -> load / store (batched)

    @property
    def bottom(self) -> str:
        """The storage tier's name."""
        return self.run.bottom_tier

    def latency(self, tier: str, op: str, pct: str) -> float | None:
        """A tier's latency percentile for op, or None where it has none, or is a null tier (it moves no byte: its
        times are the generator's, not a figure of storage, as storage_gbps says of its rates)."""
        info = self.run.tiers.get(tier)
        s = self.latency_ms.get(tier, {}).get(op)
        return getattr(s, pct) if s is not None and not (info is not None and info.null) else None

    def storage_gbps(self, direction: str) -> float | None:
        """The storage (bottom) tier's read or write GB/s, or None when it moved nothing (a null tier, --null-io,
        moves no byte: its counted GB/s are the generator's pace, not a figure of storage)."""
        info = self.run.tiers.get(self.bottom)
        if info is not None and info.null:
            return None
        bw = self.bandwidth_gbps.get(self.bottom)
        return getattr(bw, direction) if bw is not None else None

    def request(self, kind: str, pct: str) -> float | None:
        """A per-request latency percentile (storage, queue, ttft, e2e, ...), or None without samples."""
        s = self.request_latency_ms.get(kind)
        return getattr(s, pct) if s is not None else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> dict:
        """What results.json holds: to_dict() with every measured float at SIGNIFICANT digits (a histogram holds 3,
        a rate over a window no more); the settings as given and the raw snapshot untouched."""
        out = self.to_dict()
        return {k: v if k in ("settings", "snapshot") else rounded(v) for k, v in out.items()}

    @classmethod
    def from_dict(cls, data: dict, where: str = "results") -> Results:
        version = data.get("schema_version") if isinstance(data, dict) else None
        while version in UPGRADES:  # an older file this version still reads: what it did not record is None
            data = UPGRADES[version](dict(data))
            version = data["schema_version"]
        if version != SCHEMA_VERSION:
            raise SchemaVersionError(where, version, SCHEMA_VERSION)
        return _load(cls, data, where)


# version -> the same results in the next version (older ones are refused): 19 lacks blocks_write_skipped_by only,
# 20 capacity_curve.served_order
UPGRADES = {19: lambda data: {**data, "schema_version": 20, "blocks_write_skipped_by": None},
            20: lambda data: {**data, "schema_version": 21, "capacity_curve": data.get("capacity_curve") and
                              {**data["capacity_curve"], "served_order": None}}}


def stored_schema(version: int = SCHEMA_VERSION) -> dict | None:
    path = SCHEMAS / f"results-v{version}.json"
    return json.loads(path.read_text()) if path.exists() else None


def render_schema() -> str:
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema",
           "$id": f"kv-cache-bench/results-v{SCHEMA_VERSION}", **json_schema(Results)}
    return json.dumps(doc, indent=1) + "\n"


if __name__ == "__main__":  # python -m kv_cache.recorder.results_schema: store the schema of this version
    SCHEMAS.mkdir(exist_ok=True)
    target = SCHEMAS / f"results-v{SCHEMA_VERSION}.json"
    target.write_text(render_schema())
    sys.stdout.write(f"wrote {target}\n")
