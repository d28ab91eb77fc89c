"""Merging the results of several MPI ranks into one: exact, never by averaging percentiles.

Each rank's results carry its encoded histograms and counters (``snapshot``)
and the offset that maps its monotonic clock onto wall-clock time. Rank 0
adds histograms and counters, takes the common window (earliest start to
latest end, in wall-clock time) for every rate, and reports per-rank
bandwidth with its min, max and spread beside the aggregate.
"""

from __future__ import annotations

from functools import reduce

from kv_cache.recorder.results import SCHEDULED, RunFacts, build_results, rates_by_source
from kv_cache.recorder.results_schema import Results
from kv_cache.recorder.snapshot import Snapshot


def _snapshot(results: dict) -> Snapshot:
    snap = Snapshot.from_dict(results["snapshot"])
    off = results["run"]["wall_offset_ns"]
    snap.window_start_ns += off
    snap.window_end_ns += off
    return snap


def _sum_dicts(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = _sum_dicts([out.get(k, {}), v]) if isinstance(v, dict) else out.get(k, 0) + v
    return out


def _workload(results: list[dict]) -> dict:
    first = dict(results[0]["workload"])
    counts = _sum_dicts([r["workload"]["counts"] for r in results])
    first["counts"] = counts
    first["requests_analysed"] = sum(r["workload"]["requests_analysed"] for r in results)
    first["theoretical_hit_rate"] = {
        "tokens": counts["cached"] / counts["prompt"] if counts["prompt"] else None,
        "by_source": rates_by_source(counts["cached_by_source"], counts["prompt_by_source"])}
    first["distributions_from_rank"] = 0
    return first


def _spread(values: list[float]) -> dict:
    mean = sum(values) / len(values)
    return {"min": min(values), "max": max(values), "spread": (max(values) - min(values)) / mean if mean else None}


def _merge_dropping(a: Snapshot, b: Snapshot) -> Snapshot:
    """a and b merged, and both freed: rank 0 holds three snapshots at most, however many ranks there are."""
    out = a.merge(b)
    a.release()
    b.release()
    return out


def _merged_tier(first: dict, each: list[dict]) -> dict:
    """A tier of every rank: their capacities summed; its description rank 0's, said so (its slots and its folder
    were read as the sum's)."""
    described = f"{len(each)} ranks, rank 0's: {first['description']}" if len(each) > 1 else first["description"]
    return {**first, "capacity_bytes": sum(x["capacity_bytes"] for x in each), "description": described}


def merge_ranks(ranks: list[Results]) -> Results:
    """One Results for all ranks (see the module docstring)."""
    results = [r.to_dict() for r in ranks]
    merged = reduce(_merge_dropping, (_snapshot(r) for r in results))
    runs = [r["run"] for r in results]
    run = dict(runs[0])
    faults = [f"rank {x['rank']} on {x['hosts'][0]}: {x['fault']}" for x in runs if x["fault"]]
    run.update(rank=None, ranks=len(results), hosts=sorted({h for x in runs for h in x["hosts"]}),
               partial=any(x["partial"] for x in runs), fault="; ".join(faults),
               stopped_reason=next((x["stopped_reason"] for x in runs if x["partial"]), runs[0]["stopped_reason"]),
               tiers={t: _merged_tier(info, [x["tiers"][t] for x in runs]) for t, info in runs[0]["tiers"].items()})
    facts = RunFacts(
        workload=_workload(results),
        memory={"peak_rss_bytes": max(r["memory"]["peak_rss_bytes"] for r in results),
                "budget_bytes": max(r["memory"]["budget_bytes"] for r in results), "per_rank": True},
        occupancy=_sum_dicts([r["occupancy"] for r in results]),
        scheduled={k: sum(r["requests"].get(k, 0) for r in results) for k in SCHEDULED},
        shared_storage=results[0]["shared_storage"]["enabled"],
        adopted_blocks=sum(r["shared_storage"]["adopted_blocks"] for r in results),
        ranks={"telemetry_per_rank": [r.get("telemetry") for r in results],
               "ranks_detail": [{"rank": x["run"]["rank"], "host": x["run"]["hosts"][0],
                                 "window_s": x["run"]["duration_s"], "requests_completed": x["requests"]["completed"],
                                 "bandwidth_gbps": x["bandwidth_gbps"], "stopped_reason": x["run"]["stopped_reason"],
                                 "fault": x["run"]["fault"]} for x in results],
               "rank_spread": {t: {d: _spread([x["bandwidth_gbps"][t][d] for x in results]) for d in ("read", "write")}
                               for t in runs[0]["tiers"]}})
    return build_results(merged, run, results[0]["settings"], facts)
