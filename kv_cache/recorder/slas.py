"""QoS SLAs judged from histograms: the same judge for the whole run and for an autoscaler step.

Targets are on the *storage part of time-to-first-token* (queue wait + cached
prefix load + prefill write, measured from the intended start) and on end-to-end
time; generation time a run models (if any) is only in end-to-end time, so an
interactive SLA can pass when storage is fast (MLPerf's could not, flaw 20).
A class is *met* when every configured percentile target holds (a percentile too few requests support holds
when all of them are within it, and is undecided, null, otherwise);
*attainment* is the share of its requests whose storage TTFT is within the
p95 target. A class without requests is neither met nor failed: null.
"""

from __future__ import annotations

from kv_cache.recorder.histogram import count_at_or_below, summary_ms

CHECKS = (("ttft", "p95"), ("ttft", "p99"), ("e2e", "p95"), ("e2e", "p99"))


def judge(ttft, e2e, targets: dict, attainment_goal: float) -> dict:
    """One class: latencies, targets, which targets hold, attainment (histograms in ns, targets in ms)."""
    n = ttft.get_total_count()
    out = {"requests": n, "ttft_ms": summary_ms(ttft), "e2e_ms": summary_ms(e2e),
           "targets_ms": {f"{m}_{p}": targets[f"{m}_{p}_ms"] for m, p in CHECKS}}
    if not n:
        return {**out, "attainment": None, "checks": {f"{m}_{p}": None for m, p in CHECKS}, "met": None}
    checks = {f"{m}_{p}": _holds(out[f"{m}_ms"], p, targets[f"{m}_{p}_ms"]) for m, p in CHECKS}
    attained = count_at_or_below(ttft, targets["ttft_p95_ms"] * 1e6) / n
    met = False if False in checks.values() or attained < attainment_goal else (
        None if None in checks.values() else True)
    return {**out, "attainment": attained, "checks": checks, "met": met}


def _holds(summary: dict, pct: str, target_ms: float) -> bool | None:
    """Whether a percentile target holds; from too few samples to have that percentile, it holds when every
    sample is within it (the max), and is undecided (None) otherwise."""
    value = summary[pct]
    if value is not None:
        return value <= target_ms
    return True if summary["max"] <= target_ms else None


def overall(classes: dict) -> bool | None:
    """Every class with requests met; null when no class had any."""
    judged = [c["met"] for c in classes.values() if c["met"] is not None]
    return all(judged) if judged else None
