"""The typed Results: what results.json holds, as dataclasses built by the recorder.

Report, compare, trials and submission read these fields, never key paths in
a dict. The JSON schema is generated from the dataclasses and stored per
version in ``schemas/results-v<N>.json``; ``tests/unit/test_results_schema.py``
fails when the dataclasses no longer match the stored schema of
``SCHEMA_VERSION``: a change is announced by bumping the version and storing
the new schema beside the old ones (``python -m kv_cache.recorder.schema``).

Units are in the names: ``_ms`` milliseconds, ``_gbps`` 10^9 bytes per second
over the measurement window, ``_bytes`` and counts as integers. A ratio over
an empty denominator is null, never 0. Sections whose keys are data (QoS
class names, gauges, the settings tree, histogram encodings) stay plain
mappings; their layout is documented in the README.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

SCHEMA_VERSION = 2  # 2: typed Results; run.bottom_tier; optional sections always present (null when off)
SCHEMAS = Path(__file__).resolve().parent / "schemas"


class SchemaError(ValueError):
    """A results file that does not follow the schema this tool reads."""


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


@dataclass
class ReadWrite:
    """One tier's read and write figures (bytes, blocks or GB/s)."""

    read: float = 0
    write: float = 0


@dataclass
class TierInfo:
    capacity_bytes: int
    description: str
    simulated: bool = False
    null: bool = False


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
    workers_probe: list[dict] | None  # --workers 0: each concurrency step of the probe (threads, GB/s)
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
    gds: dict | None
    notes: list[str]
    partial: bool
    stopped_reason: str | None
    fault: str
    duration_s: float = 0.0          # the measurement window


@dataclass
class Requests:
    completed: int = 0
    per_s: float = 0.0
    issued: int = 0
    dropped_at_stop: int = 0
    users_started: int = 0
    users_paced: int = 0
    held_for_previous_turn: int = 0  # open loop: turns that arrived before their session's previous answer
    issued_in_window: int = 0        # offered load: requests that arrived (were due) inside the window
    warmup_completed: int = 0        # completed before the window opened
    in_flight_at_end: int = 0        # issued - warm-up - completed - dropped: 0 after a full drain


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
    budget: dict | None = None   # the budget's parts (one rank's; absent after a merge of ranks)
    per_rank: bool = False       # merged over MPI ranks: the peak of one rank


@dataclass
class Results:
    """results.json."""

    schema_version: int
    run: RunInfo
    latency_ms: dict[str, dict[str, Latency]]                       # tier -> op
    latency_ms_by_phase: dict[str, dict[str, dict[str, Latency]]]   # tier -> op -> phase
    request_latency_ms: dict[str, Latency]                          # storage, queue, ttft, e2e, handoff
    qos: dict
    semantic: dict | None
    bandwidth_gbps: dict[str, ReadWrite]
    bytes: dict[str, ReadWrite]
    blocks: dict[str, ReadWrite]
    ops: dict[str, dict[str, int]]
    requests: Requests
    load: dict | None            # what decided the numbers: {kind: storage | queue | users, rates, waits, advice}
    tokens: Tokens
    hit_rate: HitRate
    blocks_write_skipped: int
    shared_storage: SharedStorage
    verification: Verification
    warmup: Warmup
    timeseries: list[dict]
    steady_state: dict | None
    mlperf_compatible: MlperfCompatible
    memory: Memory
    cpu: Cpu
    occupancy: dict
    workload: dict
    role: dict | None
    settings: dict
    snapshot: dict
    precondition: dict | None = None
    autoscale: dict | None = None
    telemetry: dict | None = None
    telemetry_per_rank: list | None = None
    ranks_detail: list | None = None
    rank_spread: dict | None = None
    warnings: list[str] = field(default_factory=list)
    trials: dict | None = None

    @property
    def bottom(self) -> str:
        """The storage tier's name."""
        return self.run.bottom_tier

    def latency(self, tier: str, op: str, pct: str) -> float | None:
        s = self.latency_ms.get(tier, {}).get(op)
        return getattr(s, pct) if s is not None else None

    def storage_gbps(self, direction: str) -> float | None:
        """The storage (bottom) tier's read or write GB/s, or None when it moved nothing."""
        bw = self.bandwidth_gbps.get(self.bottom)
        return getattr(bw, direction) if bw is not None else None

    def request(self, kind: str, pct: str) -> float | None:
        """A per-request latency percentile (storage, queue, ttft, e2e, ...), or None without samples."""
        s = self.request_latency_ms.get(kind)
        return getattr(s, pct) if s is not None else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "results") -> Results:
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != SCHEMA_VERSION:
            raise SchemaError(f"{where} has schema_version {version}, this tool reads {SCHEMA_VERSION}; "
                              f"re-run it with this version (or read it with the version that wrote it)")
        return _load(cls, data, where)


# ---------------------------------------------------------------------------- loading and the JSON schema

def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional(tp) -> tuple[bool, Any]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return True, rest[0] if len(rest) == 1 else functools.reduce(operator.or_, rest)
    return False, tp


def _load(tp, value, where: str):
    optional, tp = _optional(tp)
    if value is None:
        if optional or tp is Any:
            return None
        raise SchemaError(f"{where} is null where the schema needs a value")
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SchemaError(f"{where} is not an object")
        hints = _hints(tp)
        unknown = set(value) - set(hints)
        if unknown:
            raise SchemaError(f"{where} has keys the schema does not know: {', '.join(sorted(unknown))}")
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _load(hints[f.name], value[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SchemaError(f"{where} lacks the key {f.name}")
        return tp(**kwargs)
    if origin is dict:
        _, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise SchemaError(f"{where} is not an object")
        return {k: _load(vt, v, f"{where}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise SchemaError(f"{where} is not an array")
        (vt,) = typing.get_args(tp) or (Any,)
        return [_load(vt, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _load(option, value, where)
            except SchemaError:
                continue
        raise SchemaError(f"{where} is none of {' | '.join(_name(a) for a in typing.get_args(tp))}: {value!r:.40}")
    return _scalar(tp, value, where)


def _name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _scalar(tp, value, where: str):
    """A leaf value of the type the schema says, a number finite and within 64 bits (a file with Infinity or
    10^400 in it was not written by this tool)."""
    if tp is Any or tp in (dict, list):  # a plain JSON value: its numbers are still checked
        _plain_numbers(value, where)
        return value
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str)}.get(tp)
    if ok is None or not ok(value):
        raise SchemaError(f"{where} is {_kind(value)} where the schema needs {_JSON.get(tp, _name(tp))}")
    _plain_numbers(value, where)
    return value


def _kind(value) -> str:
    return "null" if value is None else _JSON.get(type(value), type(value).__name__) + f" {value!r:.40}"


def _plain_numbers(value, where: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, float) and not math.isfinite(value) or isinstance(value, (int, float)) \
            and abs(value) >= 2**63:
        raise SchemaError(f"{where} is {value!r}, not a finite number within 64 bits")
    if isinstance(value, dict):
        for k, v in value.items():
            _plain_numbers(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _plain_numbers(v, f"{where}[{i}]")


_JSON = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object", list: "array"}


def json_schema(tp=Results) -> dict:
    """The JSON schema of a type (draft 2020-12 subset), generated from the dataclasses."""
    optional, tp = _optional(tp)
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        out = {"type": "object", "title": tp.__name__, "additionalProperties": False,
               "properties": {f.name: json_schema(hints[f.name]) for f in dataclasses.fields(tp)},
               "required": [f.name for f in dataclasses.fields(tp)]}
    elif typing.get_origin(tp) is dict:
        out = {"type": "object", "additionalProperties": json_schema(typing.get_args(tp)[1])}
    elif typing.get_origin(tp) is list:
        args = typing.get_args(tp)
        out = {"type": "array", **({"items": json_schema(args[0])} if args else {})}
    elif typing.get_origin(tp) in (Union, types.UnionType):
        out = {"anyOf": [json_schema(a) for a in typing.get_args(tp)]}
    else:
        out = {"type": _JSON.get(tp, "object")} if tp is not Any else {}
        if tp is float:
            out = {"type": ["number", "integer"]}
    if optional:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def stored_schema(version: int = SCHEMA_VERSION) -> dict | None:
    path = SCHEMAS / f"results-v{version}.json"
    return json.loads(path.read_text()) if path.exists() else None


def render_schema() -> str:
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema",
           "$id": f"kv-cache-bench/results-v{SCHEMA_VERSION}", **json_schema(Results)}
    return json.dumps(doc, indent=1) + "\n"


if __name__ == "__main__":  # python -m kv_cache.recorder.schema: store the schema of this version
    SCHEMAS.mkdir(exist_ok=True)
    target = SCHEMAS / f"results-v{SCHEMA_VERSION}.json"
    target.write_text(render_schema())
    sys.stdout.write(f"wrote {target}\n")
