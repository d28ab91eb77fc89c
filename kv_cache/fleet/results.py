"""fleet.json: what a fleet sweep found, typed and versioned as results.json is (recorder/typed.py checks every value
on reading). A figure the simulation could not give is null, with the reason in the file (e.g. a rate without a
span of arrival times)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kv_cache.fleet.simulate import TIERS, Simulated
from kv_cache.model import GiB
from kv_cache.recorder.stack_distances import COLUMNS, capacity_grid, curve
from kv_cache.recorder.typed import load_section

FLEET_SCHEMA = 1
FLEET_FILE = "fleet.json"
FLEET_LIMIT = 64 << 20  # bytes of a fleet.json read back (compare, report): a larger one is not ours


@dataclass
class SharedDemand:
    """The shared tier at the traffic's rate."""

    read_blocks: int
    write_blocks: int
    rewrite_blocks: int           # writes of a block some engine had published already
    read_gbps: float | None       # null: the arrivals span no time
    write_gbps: float | None
    read_iops: float | None       # one block a read
    write_iops: float | None
    bytes_per_request: float
    peak_gib: float               # distinct blocks held at once, at most (an unbounded tier: what it needed)
    infinite_hit_rate: float      # of prompt tokens, from its access stream's stack distances (one LRU pool)
    knee_90_gib: float | None     # the capacity reaching 90 % of that (null: no hit at all)
    knee_99_gib: float | None
    sample_rate: float            # the stack distances' SHARDS rate (1.0: exact)


@dataclass
class FleetPoint:
    engines: int
    router: str
    hit_rate: dict[str, float]                  # hbm, cpu, shared, total: of prompt tokens
    hit_rate_by_source: dict[str, dict[str, float]]  # tier -> source -> of that source's prompt tokens
    shared: SharedDemand
    requests_max_over_mean: float               # load imbalance across engines
    prefill_max_over_mean: float | None         # computed prompt tokens (null: none computed)
    seconds: float                              # the simulation's wall time


@dataclass
class FleetStreamInfo:
    source: str
    timing: str
    requests: int
    span_s: float
    requests_per_s: float | None
    block_tokens: int
    slot_bytes: int


@dataclass
class FleetFile:
    schema: int
    model: str                    # what is simulated and what is modelled, in words
    shared_writes: str            # demote | through: how blocks reach the shared tier
    engine_model: str             # cache (the benchmark's cache per engine) | stack (its LRU waterfall alone)
    stream: FleetStreamInfo
    engine_tiers: dict[str, float]  # hbm_gib, cpu_gib (each engine's), shared_gib (the fleet's; 0: unbounded)
    policy: str
    points: list[FleetPoint]
    settings: dict

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data) -> FleetFile:
        return load_section(cls, data, "fleet")


def _ratio(values: np.ndarray) -> float | None:
    mean = float(values.mean()) if values.size else 0.0
    return float(values.max()) / mean if mean else None


def point(sim: Simulated, span_s: float, slot: int) -> FleetPoint:
    """A simulated point's figures: hit rates, the shared tier's demand and capacity curve, the imbalance."""
    prompt_total = max(int(sim.prompt_tokens.sum()), 1)
    rate = {t: float(sim.hit_tokens[i].sum()) / prompt_total for i, t in enumerate(TIERS)}
    rate["total"] = float(sim.hit_tokens.sum()) / prompt_total
    by_source = {t: {c: float(sim.hit_tokens[i, k]) / int(sim.prompt_tokens[k]) for k, c in enumerate(COLUMNS)
                     if sim.prompt_tokens[k]} for i, t in enumerate(TIERS)}
    pool, log = sim.pool, sim.log.arrays()
    c = curve(log, 0, capacity_grid(log, 0, rate=sim.log.rate), rate=sim.log.rate, with_knees=True,
              sampled_from=sim.log.lookup_tokens) if len(log["keys"]) else None

    def gib(slots):
        return None if slots is None else slots * slot / GiB

    def per_s(blocks: int, scale: float = 1.0):
        return blocks * scale / span_s if span_s > 0 else None

    shared = SharedDemand(
        pool.reads, pool.writes, pool.rewrites, per_s(pool.reads, slot / 1e9), per_s(pool.writes, slot / 1e9),
        per_s(pool.reads), per_s(pool.writes), (pool.reads + pool.writes) * slot / len(sim.assignment),
        pool.peak_blocks * slot / GiB, c.infinite if c else 0.0, gib(c.knees[0]) if c else None,
        gib(c.knees[1]) if c else None, c.sampled if c else 1.0)
    return FleetPoint(sim.engines, sim.router, rate, by_source, shared, _ratio(sim.requests_per_engine) or 1.0,
                      _ratio(sim.prefill_per_engine), sim.seconds)
