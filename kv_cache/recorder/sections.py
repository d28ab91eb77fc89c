"""The typed sections of results.json beyond the core figures: load control, the traffic's analysis, the
cache's occupancy, telemetry, semantic reuse, trials and MPI ranks.

Each is a dataclass whose fields are the keys results.json holds: report, compare, trials, submission and the
MLPerf output read attributes, and loading a file checks every value's type (results_schema.py). Only mappings whose
keys are data stay mappings of typed values: tier names, QoS class and transform names, time-series columns,
a GPU's sampled metrics, the settings tree and the encoded histograms of the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Latency:
    """Percentiles of one histogram, ms (null without samples)."""

    count: int = 0
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    max: float | None = None
    mean: float | None = None


# ---------------------------------------------------------------------------- QoS and the load verdict

@dataclass
class QosTargets:
    """A class's SLA targets, ms."""

    ttft_p95: float
    ttft_p99: float
    e2e_p95: float
    e2e_p99: float


@dataclass
class QosChecks:
    """Which targets held (null: the class had no request)."""

    ttft_p95: bool | None = None
    ttft_p99: bool | None = None
    e2e_p95: bool | None = None
    e2e_p99: bool | None = None


@dataclass
class QosClass:
    priority: int
    requests: int
    ttft_ms: Latency
    e2e_ms: Latency
    targets_ms: QosTargets
    attainment: float | None
    checks: QosChecks
    met: bool | None


@dataclass
class Qos:
    mix: str
    assign: str
    attainment_goal: float
    classes: dict[str, QosClass]
    all_met: bool | None


@dataclass
class LoadVerdict:
    """What decided the numbers (recorder/verdict.py): storage, the generator's queue, or the users' pace."""

    offered_per_s: float
    served_per_s: float
    queue_wait_p50_ms: float | None
    queue_wait_p95_ms: float | None
    storage_p50_ms: float | None
    dropped_at_stop: int
    workers: int
    workers_busy_mean: float | None
    kind: str
    advice: str
    workers_in_io_share: float | None = None  # the workers' time in block I/O (storage time per request, summed)
    process_cpu_share: float | None = None    # the process's CPU time over the cores' (None in an MPI merge)
    cause: str = ""  # storage (workers busy in block I/O), cpu (the generator ran out of CPU) or generator


@dataclass
class StepClass:
    requests: int
    ttft_p95_ms: float | None
    met: bool | None


@dataclass
class AutoscaleStep:
    users: int
    window_s: float
    offered_per_s: float
    requests_per_s: float
    tokens_per_s: float              # prompt tokens served per second (what the capacity search maximises)
    ttft_p95_ms: float | None
    attainment: float | None
    sla_met: bool | None
    classes: dict[str, StepClass]
    generated_tokens_per_s: float = 0.0  # answer tokens per second (the MLPerf reference's throughput)


@dataclass
class Autoscale:
    mode: str
    pool_users: int
    curve: list[AutoscaleStep]
    best: AutoscaleStep | None
    verdict: str
    settings: dict[str, Any]  # the autoscale section of the settings, as run


@dataclass
class SteadyState:
    tolerance: float
    window_s: int
    detected: bool
    from_s: int | None
    requests_per_s: float | None
    tokens_per_s: float | None


@dataclass
class Role:
    """A disaggregated node's own figures."""

    role: str
    handoff_dir: str
    engine: str
    published_blocks: int | None = None           # prefill
    decode_nodes: list[str] | None = None
    decode_nodes_unfinished: list[str] | None = None
    requests_unacknowledged: int | None = None    # handed over, never acknowledged by a decode node
    dropped_unread: int | None = None             # held blocks dropped after the wait for an acknowledgement
    missing_blocks: int | None = None             # decode
    prefill_done_to_decode_loaded_ms: Latency | None = None


# ---------------------------------------------------------------------------- the traffic before the run

@dataclass
class Distribution:
    """Token counts of the analysed requests (count 0: nothing was analysed)."""

    count: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: int | None = None


@dataclass
class TokenCounts:
    cached: int
    prompt: int
    cached_by_source: dict[str, int]
    prompt_by_source: dict[str, int]


@dataclass
class TheoreticalHitRate:
    """The hit rate of an infinite cache where every write has finished."""

    tokens: float | None
    by_source: dict[str, float | None]


@dataclass
class TraceLog:
    format: str
    skipped: dict[str, int]
    examples: list[str]
    changed: dict[str, int] = field(default_factory=dict)  # records kept with a change, by what changed


@dataclass
class Workload:
    source: str
    arrival: str
    notes: list[str]
    trace: TraceLog | None
    tokenizer: str | None
    requests_analysed: int
    requests_total: int | None
    prompt_tokens: Distribution
    output_tokens: Distribution
    counts: TokenCounts
    theoretical_hit_rate: TheoreticalHitRate
    distributions_from_rank: int | None = None  # merged over MPI ranks: counts summed, the token distributions
    # are this rank's


# ---------------------------------------------------------------------------- the cache, the host, the device

@dataclass
class Occupancy:
    """A tier at the end: its blocks, and those no lookup can reach any more (dead)."""

    blocks: int
    bytes: int
    slots_accounted: int
    dead_blocks: int
    dead_bytes: int


@dataclass
class Precondition:
    passes: int
    gbps: list[float]
    bytes_per_pass: int
    steady: bool | None
    steady_tolerance: float | None
    tier: str = ""  # the tier written (the NVMe tier: the storage under test may be another below it, or a handoff)


@dataclass
class BudgetParts:
    """The memory budget's parts, bytes (run/budget.py)."""

    cpu_tier: int
    staging: int
    payload_pool: int
    overhead: int
    donor_store: int
    bookkeeping: int
    handoff: int  # a NIXL prefill node's registered region
    total: int
    gpu_staging: int = 0  # a real GPU tier's lanes: one pinned buffer of the largest object each
    payload_stamps: int = 0  # the payload pool's stamp tags and the workers' check rows (payload.stamp_bytes)
    access_log: int = 0  # --capacity-curve's access log at its bound and the curve computed from it after the run
    request_backlog: int = 0  # --max-backlog-gb: the requests issued and not yet done
    traffic: int = 0  # synthetic users' conversations at their longest (budget.py)
    timeseries: int = 0  # the time series of every second the window may last (budget.py)
    trace: int = 0  # a replayed trace's records (budget.py)


@dataclass
class DeviceOverBenchmark:
    read: float | None
    write: float | None


@dataclass
class DiskTelemetry:
    """The block layer's bytes of the cache directory's disk in the window, beside the benchmark's own."""

    device: str
    read_bytes: int
    write_bytes: int
    benchmark_read_bytes: int | None = None
    benchmark_write_bytes: int | None = None
    device_over_benchmark: DeviceOverBenchmark | None = None


@dataclass
class DeviceLatency:
    """The storage disk's latency per block request, issue -> complete (eBPF), or why it was not measured."""

    unavailable: str = ""
    source: str = ""
    device: str = ""
    read: Latency | None = None     # the window's requests
    write: Latency | None = None
    requests_whole_run: dict[str, int] = field(default_factory=dict)   # read, write, other (flush, discard)
    bytes_whole_run: dict[str, int] = field(default_factory=dict)      # read, write
    lost_events: int = 0


@dataclass
class TelemetrySummary:
    samples: int
    disk: DiskTelemetry | None
    gpus: list[dict[str, int | float | str]]  # index, name and each sampled metric's _mean and _max
    nvml: str
    host_cpu_pct_mean: float | None
    host_mem_used_bytes_max: float | None
    device_latency: DeviceLatency | None = None


@dataclass
class GdsInfo:
    mode: str
    demoted_blocks: int
    loaded_blocks: int


@dataclass
class ProbeStep:
    threads: int
    gbps: float


# ---------------------------------------------------------------------------- semantic reuse

@dataclass
class SemanticRates:
    """SemBench's contract for one group of recipients (a transform, or all of them)."""

    exact_block_hit_rate: float | None
    semantic_candidate_block_rate: float | None
    semantic_eligible_block_rate: float | None
    semantic_loaded_block_rate: float | None
    fuzzy_block_rate: float | None
    semantic_eligible_lift: float | None
    exact_token_weighted_reuse_rate: float | None
    candidate_token_weighted_reuse_rate: float | None
    eligible_token_weighted_reuse_rate: float | None
    loaded_token_weighted_reuse_rate: float | None
    donor_found_rate: float | None
    donor_accepted_rate: float | None
    counts: dict[str, int]


@dataclass
class Semantic:
    settings: dict[str, Any]  # the semantic settings, as run
    overall: SemanticRates
    by_transform: dict[str, SemanticRates]
    negative_control_semantic_eligible_rate: float | None
    donor_lookup_ms: dict[str, Latency]
    donor_bytes_by_tier: dict[str, int]
    donor_blocks_by_tier: dict[str, int]
    donor_blocks_missing: int


# ---------------------------------------------------------------------------- trials and ranks

@dataclass
class Spread:
    """One headline number over trials: its values, median, range and coefficient of variation."""

    values: list[float | None]
    median: float | None
    min: float | None
    max: float | None
    cv: float | None


@dataclass
class Trials:
    count: int
    median_trial: int
    summary: dict[str, Spread]



@dataclass
class RankReadWrite:
    read: float
    write: float


@dataclass
class RankDetail:
    rank: int | None
    host: str
    window_s: float
    requests_completed: int
    bandwidth_gbps: dict[str, RankReadWrite]
    stopped_reason: str | None
    fault: str


@dataclass
class RankSpread:
    min: float
    max: float
    spread: float | None


@dataclass
class SnapshotData:
    """The merged statistics as results.json stores them (recorder/snapshot.py): encoded histograms keyed
    tier/op/phase, counters, per-second series and gauges keyed by the second."""

    histograms: dict[str, str]
    counters: dict[str, int]
    series: dict[str, dict[str, int]]
    window_ns: list[int]
    second_histograms: dict[str, str] = field(default_factory=dict)
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)
