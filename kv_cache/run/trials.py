"""--trials N: the same run N times (same seed, same schedule), then the median and spread.

Part of the composition root: each trial is a whole run in its own folder
reports/<run-id>/trial-<k>/; the run folder itself gets trials.json and a
results.json that is the median trial's (by cached tokens/s) plus a ``trials``
key with, for each headline number, its values, median, min, max and
coefficient of variation.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from kv_cache.recorder.results_schema import Results, rounded
from kv_cache.recorder.sections import Trials
from kv_cache.recorder.typed import load_section
from kv_cache.report.trials import trials_lines
from kv_cache.run import outfolder

HEADLINES = {  # storage_*: the bottom tier, the storage under test
    "requests_per_s": lambda r: r.requests.per_s,
    "cached_tokens_per_s": lambda r: r.tokens.cached_per_s,
    "token_hit_rate": lambda r: r.hit_rate.tokens,
    "storage_read_gbps": lambda r: r.storage_gbps("read"),
    "storage_write_gbps": lambda r: r.storage_gbps("write"),
    "storage_read_p95_ms": lambda r: r.latency(r.bottom, "read", "p95"),
    "storage_read_p99_ms": lambda r: r.latency(r.bottom, "read", "p99"),
    "request_e2e_p99_ms": lambda r: r.request("e2e", "p99"),
}


def summarize(trials: list[Results]) -> dict:
    """Median and spread of every headline number over the trials (None values left out)."""
    out = {}
    for name, get in HEADLINES.items():
        values = [get(r) for r in trials]
        present = [v for v in values if v is not None]
        if not present:
            out[name] = {"values": values, "median": None, "min": None, "max": None, "cv": None}
            continue
        mean = statistics.fmean(present)
        cv = statistics.pstdev(present) / mean if mean and len(present) > 1 else None
        out[name] = {"values": values, "median": statistics.median(present), "min": min(present),
                     "max": max(present), "cv": cv}
    return out


def median_trial(trials: list[Results]) -> int:
    """Index of the trial whose cached tokens/s is the median (lower middle for an even count)."""
    order = sorted(range(len(trials)), key=lambda i: HEADLINES["cached_tokens_per_s"](trials[i]) or 0)
    return order[(len(order) - 1) // 2]


def conclude(trials: list[Results], folder: Path, say) -> Results:
    """trials.json, and results.json = the median trial with the trials' summary; the table and its warnings
    said. Returns the median trial."""
    summary = summarize(trials)
    k = median_trial(trials)
    best = trials[k]
    outfolder.write_json(folder / "trials.json", {"trials": len(trials), "summary": rounded(summary)})
    best.trials = load_section(Trials, {"count": len(trials), "median_trial": k + 1, "summary": summary}, "trials")
    outfolder.write_json(folder / "results.json", best.to_json())
    say("\n".join(trials_lines(best.trials, best.run.stopped_reason)))
    return best
