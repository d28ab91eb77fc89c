"""The versioned Results schema: a plain dict built from a Snapshot, written as results.json.

Reports and plots read only this dict. Keys that scripts rely on are listed
in the README ("results.json"); new keys may be added, none is renamed
without a new ``schema_version``. Units are in the key names or documented
there: latencies in milliseconds, bandwidth in GB/s (10^9 bytes per second)
over the measurement window, bytes as integers.
"""

from __future__ import annotations

from collections import defaultdict

from kv_cache.recorder.histogram import merged, summary_ms
from kv_cache.recorder.recorder import Snapshot

SCHEMA_VERSION = 1


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


def _prefixed(counters: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in counters.items() if k.startswith(prefix)}


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


def _pct_ms(hist, pct: float) -> float | None:
    return hist.get_value_at_percentile(pct) / 1e3 if hist is not None and hist.get_total_count() else None


def timeseries(snap: Snapshot, tiers: list[str]) -> list[dict]:
    """One row per measured second: GB/s per tier and direction, p50/p99 per tier and op (coarse
    per-second histograms), ops, requests, tokens, hit rate, and the sampled gauges."""
    last = max([*snap.series, *snap.gauges, *(k[0] for k in snap.second_hists)], default=-1)
    rows = []
    for sec in range(0, last + 1):
        src = snap.series.get(sec, {})
        prompt, cached = src.get("tokens.prompt", 0), src.get("tokens.cached", 0)
        row = {"t_s": sec, "ops": src.get("ops", 0), "requests": src.get("requests", 0),
               "tokens_prompt": prompt, "tokens_cached": cached, "hit_rate": _rate(cached, prompt)}
        for t in tiers:
            for d in ("read", "write"):
                row[f"{t}_{d}_gbps"] = src.get(f"bytes.{t}.{d}", 0) / 1e9
                h = snap.second_hists.get((sec, t, d))
                row[f"{t}_{d}_p50_ms"], row[f"{t}_{d}_p99_ms"] = _pct_ms(h, 50.0), _pct_ms(h, 99.0)
        row.update(snap.gauges.get(sec, {}))
        rows.append(row)
    return rows


def build_results(snap: Snapshot, run_info: dict, settings: dict, extra: dict) -> dict:
    """Assemble the results dict (see the module docstring and the README)."""
    c = snap.counters
    tiers = list(run_info["tiers"])
    window = snap.window_s
    latency, latency_by_phase = latency_tables(snap, tiers)
    prompt, cached = c.get("tokens.prompt", 0), c.get("tokens.cached", 0)
    by_source_prompt = _prefixed(c, "tokens.prompt_by_source.")
    by_source_cached = _prefixed(c, "tokens.cached_by_source.")
    return {
        "schema_version": SCHEMA_VERSION,
        "run": {**run_info, "duration_s": window},
        "latency_ms": latency,
        "latency_ms_by_phase": latency_by_phase,
        "request_latency_ms": {k: summary_ms(snap.hists[("request", k, "all")])
                               for k in ("storage", "queue", "e2e") if ("request", k, "all") in snap.hists},
        "bandwidth_gbps": {t: {d: c.get(f"bytes.{t}.{d}", 0) / window / 1e9 for d in ("read", "write")}
                           for t in tiers},
        "bytes": {t: {d: c.get(f"bytes.{t}.{d}", 0) for d in ("read", "write")} for t in tiers},
        "blocks": {t: {d: c.get(f"blocks.{t}.{d}", 0) for d in ("read", "write")} for t in tiers},
        "ops": {t: _prefixed(c, f"ops.{t}.") for t in tiers},
        "requests": {"completed": c.get("requests.completed", 0),
                     "per_s": c.get("requests.completed", 0) / window, **extra.get("requests", {})},
        "tokens": {"prompt": prompt, "cached": cached, "generated": c.get("tokens.generated", 0),
                   "per_s": prompt / window, "cached_per_s": cached / window,
                   "generated_per_s": c.get("tokens.generated", 0) / window,
                   "cached_by_tier": {t: c.get(f"tokens.cached_by_tier.{t}", 0) for t in tiers},
                   "cached_by_source": by_source_cached, "prompt_by_source": by_source_prompt},
        "hit_rate": {"tokens": _rate(cached, prompt),
                     "blocks": _rate(c.get("blocks.hit", 0), c.get("blocks.lookup", 0)),
                     "by_source": rates_by_source(by_source_cached, by_source_prompt)},
        "blocks_write_skipped": c.get("blocks.write_skipped", 0),
        "shared_storage": {**extra.get("shared_storage", {"enabled": False, "adopted_blocks": 0}),
                           "vanished_blocks": c.get("shared.vanished", 0)},
        "verification": {"mode": settings["run"]["verify"],
                         "blocks_checked": c.get("verification.blocks_checked", 0),
                         "failures": c.get("verification.failures", 0)},
        "warmup": {"ops": c.get("warmup.ops", 0), "requests": c.get("warmup.requests", 0)},
        "timeseries": timeseries(snap, tiers),
        "mlperf_compatible": {
            "cached_tokens_per_s": cached / window,
            "storage_read_gbps": c.get("bytes.nvme.read", 0) / window / 1e9,
            "storage_write_gbps": c.get("bytes.nvme.write", 0) / window / 1e9,
            "storage_read_p95_ms": latency.get("nvme", {}).get("read", {}).get("p95"),
        },
        **{k: v for k, v in extra.items() if k not in ("requests", "shared_storage")},
        "settings": settings,
        "snapshot": snap.to_dict(),
    }
