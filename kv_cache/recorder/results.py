"""Results from a Snapshot: the typed ``Results`` of results_schema.py, written as results.json.

Reports and plots read only the Results. Units are in the names: latencies in
milliseconds, bandwidth in GB/s (10^9 bytes per second) over the measurement
window, bytes as integers. The storage under test is the bottom tier
(``run.bottom_tier``), whatever its medium.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

from kv_cache import counters as C
from kv_cache.config import QOS_CLASSES
from kv_cache.recorder.histogram import at_ms, mean_value, merged, summary_ms, value_at
from kv_cache.recorder.results_schema import SCHEMA_VERSION, Results
from kv_cache.recorder.semantic_metrics import semantic_section
from kv_cache.recorder.slas import judge, overall
from kv_cache.recorder.snapshot import Snapshot
from kv_cache.recorder.verdict import load_verdict

# Per-request latencies, ms from the intended start: storage (sum of the request's block operations),
# queue (waiting for a worker), ttft (storage part of time-to-first-token), e2e, handoff (decode node:
# prefill complete -> decode loaded), turn_wait (open loop: a session's turn held after its arrival until the
# previous turn's answer).
REQUEST_LATENCIES = ("storage", "queue", "ttft", "e2e", "handoff", "turn_wait", "generation")


def _rate(num: float, den: float) -> float | None:
    """A ratio, or None (null, never 0) over an empty denominator."""
    return num / den if den else None


def rates_by_source(cached: dict, prompt: dict) -> dict:
    """Cached over prompt tokens per source; a chunk-reuse source (rag_chunk) is over its base (rag)."""
    out = {k: _rate(cached.get(k, 0), v) for k, v in prompt.items()}
    for k, v in cached.items():
        if k.endswith("_chunk"):
            out[k] = _rate(v, prompt.get(k[: -len("_chunk")], 0))
    return out


def latency_tables(snap: Snapshot, tiers: list[str]) -> tuple[dict, dict]:
    """latency_ms.<tier>.<op> (merged over phases) and latency_ms_by_phase.<tier>.<op>.<phase>."""
    by_op: dict[tuple, list] = defaultdict(list)
    by_phase: dict = defaultdict(lambda: defaultdict(dict))
    for (tier, op, phase), h in snap.hists.items():
        if tier in tiers:
            by_op[(tier, op)].append(h)
            by_phase[tier][op][phase] = summary_ms(h)
    flat: dict = defaultdict(dict)
    for (tier, op), hs in sorted(by_op.items()):
        flat[tier][op] = summary_ms(merged(hs))
    return {t: dict(v) for t, v in flat.items()}, {t: {o: dict(p) for o, p in v.items()} for t, v in by_phase.items()}


def timeseries(snap: Snapshot, tiers: list[str]) -> list[dict]:
    """One row per measured second: GB/s per tier and direction, p50/p99 per tier and op (coarse
    per-second histograms), ops, requests, tokens, hit rate, and the sampled gauges."""
    last = max([*snap.series, *snap.gauges, *(k[0] for k in snap.second_hists)], default=-1)
    rows = []
    for sec in range(0, last + 1):
        src = snap.series.get(sec, {})
        prompt, cached, generated = (src.get(name, 0) for name in C.SERIES_TOKENS)
        row = {"t_s": sec, "ops": src.get("ops", 0), "requests": src.get("requests", 0),
               "tokens_prompt": prompt, "tokens_cached": cached, "tokens_generated": generated,
               "hit_rate": _rate(cached, prompt)}
        for t in tiers:
            for d in ("read", "write"):
                row[f"{t}_{d}_gbps"] = src.get(C.BYTES(t, d), 0) / 1e9
                h = snap.second_hists.get((sec, t, d))
                row[f"{t}_{d}_p50_ms"], row[f"{t}_{d}_p99_ms"] = at_ms(h, 50.0, 1e3), at_ms(h, 99.0, 1e3)
        row.update(snap.gauges.get(sec, {}))
        rows.append(row)
    return rows


def qos_section(snap: Snapshot, settings: dict) -> dict:
    """Per QoS class: storage TTFT and end-to-end latency against the class's SLA targets."""
    q = settings["qos"]
    classes = {}
    for name in QOS_CLASSES:
        ttft, e2e = snap.hists.get(C.qos_hist(name, "ttft")), snap.hists.get(C.qos_hist(name, "e2e"))
        if ttft is None:
            ttft = e2e = merged([])
        classes[name] = {"priority": q[name]["priority"], **judge(ttft, e2e, q[name], q["attainment"])}
    return {"mix": q["mix"], "assign": q["assign"], "attainment_goal": q["attainment"], "classes": classes,
            "all_met": overall(classes)}


def role_section(role: dict | None, c: dict, snap: Snapshot) -> dict | None:
    """A disaggregated node's own figures (its handoff tier's bandwidth and latency are in the tables)."""
    if role is None:
        return None
    out = dict(role)
    if role["role"] == "prefill":
        out["dropped_unread"] = c.get(C.HANDOFF_DROPPED_UNREAD, 0)
    if role["role"] == "decode":
        h = snap.hists.get(C.request_hist("handoff"))
        out.update(missing_blocks=c.get(C.HANDOFF_MISSING, 0),
                   prefill_done_to_decode_loaded_ms=summary_ms(h if h is not None else merged([])))
    return out


def steady_state(rows: list[dict], tolerance: float, window: int) -> dict | None:
    """The first window of full seconds whose requests/s all stay within tolerance x their mean."""
    if not tolerance:
        return None
    full = rows[:-1]  # the last second is cut by the window's end
    out = {"tolerance": tolerance, "window_s": window, "detected": False, "from_s": None,
           "requests_per_s": None, "tokens_per_s": None}
    for i in range(0, len(full) - window + 1):
        part = full[i:i + window]
        mean = sum(r["requests"] for r in part) / window
        if mean and all(abs(r["requests"] - mean) <= tolerance * mean for r in part):
            tokens = sum(r["tokens_prompt"] for r in full[i:]) / len(full[i:])
            reqs = sum(r["requests"] for r in full[i:]) / len(full[i:])
            return {**out, "detected": True, "from_s": part[0]["t_s"], "requests_per_s": reqs,
                    "tokens_per_s": tokens}
    return out


def _cpu(c: dict, tiers: list[str]) -> dict:
    cpu_s = c.get(C.PROCESS_CPU_US, 0) / 1e6
    moved = sum(c.get(C.BYTES(t, d), 0) for t in tiers for d in ("read", "write"))
    return {"process_s": cpu_s, "per_gib_moved": cpu_s / (moved / 2**30) if moved else None}


@dataclass
class RunFacts:
    """What a run knew beside its recorder: the scheduler's counts, the memory, the cache's state, the
    workload's analysis, the role's end. build_results is the one place a Results is shaped, from these and the
    recorder's snapshot (for one process, and for the merge of MPI ranks: merge.py)."""

    workload: dict                       # sections.Workload
    memory: dict                         # schema.Memory
    occupancy: dict                      # tier -> sections.Occupancy
    scheduled: dict[str, int] = field(default_factory=dict)  # SCHEDULED: what the scheduler issued and dropped
    shared_storage: bool = False
    adopted_blocks: int = 0              # shared storage: blocks another rank wrote, adopted
    precondition: dict | None = None
    autoscale: dict | None = None
    role: dict | None = None             # a disaggregated node's end (run/handoff.finish_role)
    telemetry: dict | None = None        # sections.TelemetrySummary
    ranks: dict = field(default_factory=dict)  # merged ranks: telemetry_per_rank, ranks_detail, rank_spread

    @staticmethod
    def scheduled_of(outcome) -> dict[str, int]:
        """SCHEDULED from the scheduler's RunOutcome."""
        return {name: getattr(outcome, attr) for name, attr in SCHEDULED.items()}


# requests.<name> the scheduler counts (summed over ranks in a merge) -> the RunOutcome's field holding it
SCHEDULED = {"issued": "issued", "dropped_at_stop": "dropped_at_stop", "abandoned_at_stop": "abandoned",
             "users_started": "users_started", "users_paced": "users_paced", "users_waiting_at_stop": "users_waiting",
             "held_for_previous_turn": "held_for_turn", "backlog_bytes_at_stop": "backlog_bytes"}


def _requests(c: dict, window: float, scheduled: dict[str, int]) -> dict:
    requests = {"completed": c.get(C.REQUESTS_COMPLETED, 0), "per_s": c.get(C.REQUESTS_COMPLETED, 0) / window,
                "issued_in_window": c.get(C.REQUESTS_ISSUED_IN_WINDOW, 0),
                "warmup_completed": c.get(C.WARMUP_REQUESTS, 0), **scheduled}
    # every issued request is accounted for: completed before or in the window, dropped at the stop, or still
    # in flight (0 after the drain)
    requests["in_flight_at_end"] = (requests.get("issued", 0) - requests["warmup_completed"] - requests["completed"]
                                    - requests.get("dropped_at_stop", 0) - requests.get("abandoned_at_stop", 0))
    return requests


def _per_tier(c: dict, family: C.Family, tiers: list[str], window: float = 0.0) -> dict:
    """tier -> {read, write} of a family: counts, or GB/s over the window when one is given."""
    return {t: {d: c.get(family(t, d), 0) / window / 1e9 if window else c.get(family(t, d), 0)
                for d in ("read", "write")} for t in tiers}


def _tokens(c: dict, tiers: list[str], window: float) -> dict:
    prompt, cached, generated = (c.get(name, 0) for name in C.SERIES_TOKENS)
    return {"prompt": prompt, "cached": cached, "generated": generated, "per_s": prompt / window,
            "cached_per_s": cached / window, "generated_per_s": generated / window,
            "cached_by_tier": {t: c.get(C.TOKENS_CACHED_BY_TIER(t), 0) for t in tiers},
            "cached_by_source": C.TOKENS_CACHED_BY_SOURCE.of(c), "prompt_by_source": C.TOKENS_PROMPT_BY_SOURCE.of(c)}


def _verification(c: dict, mode: str) -> dict:
    return {"mode": mode, "blocks_checked": c.get(C.VERIFIED, 0), "failures": c.get(C.VERIFY_FAILED, 0),
            "failures_in_warmup": c.get(C.VERIFY_FAILED_IN_WARMUP, 0), "blocks_discarded": c.get(C.VERIFY_DISCARDED, 0),
            "scope": "whole run, warm-up included"}


def queue_depths(snap: Snapshot) -> dict:
    """tier -> load / store -> the depth of its batches: blocks asked, I/Os in flight where measured (counts, not
    times: read from the histograms' values)."""
    out: dict = defaultdict(dict)
    for key, h in snap.hists.items():
        if key[0] == "depth" and h.get_total_count():
            # NOTE: mean_value and value_at, not hdrh's own: those walk its 33,792 counters in Python (1.2 s a run)
            flying = snap.hists.get(C.in_flight_hist(key[1], key[2]))
            measured = flying is not None and flying.get_total_count()
            out[key[1]][key[2]] = {"batches": h.get_total_count(), "mean": round(mean_value(h), 3),
                                   "p95": value_at(h, 95.0), "max": h.get_max_value(),
                                   "in_flight_mean": round(mean_value(flying) / C.IN_FLIGHT_SCALE, 2) if measured
                                   else None,
                                   "in_flight_p95": value_at(flying, 95.0) / C.IN_FLIGHT_SCALE if measured else None}
    return dict(out)


def build_results(snap: Snapshot, run_info: dict, settings: dict, facts: RunFacts) -> Results:
    """Assemble the Results (see results_schema.py and docs/results.md)."""
    c = snap.counters
    bottom = run_info["bottom_tier"]
    tiers = list(run_info["tiers"])
    window = snap.window_s
    latency, latency_by_phase = latency_tables(snap, tiers)
    tokens = _tokens(c, tiers, window)
    series = timeseries(snap, tiers)
    requests = _requests(c, window, facts.scheduled)
    request_latency = {k: summary_ms(snap.hists[C.request_hist(k)]) for k in REQUEST_LATENCIES
                       if C.request_hist(k) in snap.hists}
    bandwidth = _per_tier(c, C.BYTES, tiers, window)
    return Results.from_dict({
        "schema_version": SCHEMA_VERSION,
        "run": {**run_info, "duration_s": window},
        "latency_ms": latency,
        "latency_ms_by_phase": latency_by_phase,
        "request_latency_ms": request_latency,
        "qos": qos_section(snap, settings),
        "semantic": semantic_section(snap, settings, tiers),
        "bandwidth_gbps": bandwidth,
        "bytes": _per_tier(c, C.BYTES, tiers),
        "bytes_whole_run": {t: {d: c.get(C.BYTES(t, d), 0) + c.get(C.WARMUP_BYTES(t, d), 0)
                                for d in ("read", "write")} for t in tiers},
        "blocks": _per_tier(c, C.BLOCKS, tiers),
        "ops": {t: C.OPS.under(t).of(c) for t in tiers},
        "requests": requests,
        "load": load_verdict(requests, window, request_latency.get("queue", {}), request_latency.get("storage", {}),
                             run_info["workers"], series, facts.workload["arrival"],
                             None if facts.ranks else c.get(C.PROCESS_CPU_US, 0) / 1e6,
                             None if facts.ranks else os.cpu_count(), run_info["tiers"][bottom].get("null", False)),
        "tokens": tokens,
        "hit_rate": {"tokens": _rate(tokens["cached"], tokens["prompt"]),
                     "blocks": _rate(c.get(C.BLOCKS_HIT, 0), c.get(C.BLOCKS_LOOKUP, 0)),
                     "by_source": rates_by_source(tokens["cached_by_source"], tokens["prompt_by_source"]),
                     "infinite_cache": None if c.get(C.INFINITE_UNTRACKED, 0) else
                     _rate(c.get(C.TOKENS_INFINITE, 0), tokens["prompt"]),
                     "infinite_cache_untracked": c.get(C.INFINITE_UNTRACKED, 0)},
        "blocks_write_skipped": c.get(C.BLOCKS_WRITE_SKIPPED, 0),
        "blocks_write_skipped_by": {why: c.get(C.BLOCKS_WRITE_SKIPPED_BY(why), 0) for why in C.WRITE_SKIPPED_WHY},
        "queue_depth": queue_depths(snap),
        "shared_storage": {"enabled": facts.shared_storage, "adopted_blocks": facts.adopted_blocks,
                           "vanished_blocks": c.get(C.SHARED_VANISHED, 0)},
        "verification": _verification(c, settings["run"]["verify"]),
        "warmup": {"ops": c.get(C.WARMUP_OPS, 0), "requests": c.get(C.WARMUP_REQUESTS, 0)},
        "cpu": _cpu(c, tiers),
        "timeseries": series,
        "steady_state": steady_state(series, settings["run"]["steady_tolerance"], settings["run"]["steady_window_s"]),
        "mlperf_compatible": {
            "cached_tokens_per_s": tokens["cached_per_s"],
            "storage_read_gbps": bandwidth[bottom]["read"] if bottom in bandwidth else 0.0,
            "storage_write_gbps": bandwidth[bottom]["write"] if bottom in bandwidth else 0.0,
            "storage_read_p95_ms": latency.get(bottom, {}).get("read", {}).get("p95"),
        },
        "memory": facts.memory,
        "occupancy": facts.occupancy,
        "workload": facts.workload,
        "precondition": facts.precondition,
        "autoscale": facts.autoscale,
        "telemetry": facts.telemetry,
        **facts.ranks,
        "role": role_section(facts.role, c, snap),
        "settings": settings,
        "snapshot": snap.to_dict(),
    }, "the results being built")
