"""PNG plots of a run, made with matplotlib from the Results alone.

- latency_percentiles.png: per-block latency percentile curves per tier x op (log latency, "nines" axis)
- throughput.png: bandwidth per tier and direction, and requests/s, over time
- occupancy.png: bytes held by each tier, queue depth and requests in flight, over time
- hit_rate.png: token hit rate by source, achieved beside the infinite-cache (theoretical) rate
- qos_attainment.png, autoscale_curve.png: see plots_control.py
Simulated tiers are labelled SIMULATED in every legend they appear in.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from kv_cache.recorder.histogram import decode, merged
from kv_cache.recorder.schema import Results
from kv_cache.report.console import tier_label
from kv_cache.report.figure import save
from kv_cache.report.plots_control import autoscale_curve, qos_attainment

PCTS = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0)


def _label(results: Results, tier: str) -> str:
    return tier_label(results, tier)


def _nines(p: float) -> float:
    return -np.log10(max(1.0 - p / 100.0, 1e-5))


def latency_percentiles(results: Results, folder: Path) -> Path | None:
    groups: dict[tuple[str, str], list] = {}
    for key, text in results.snapshot["histograms"].items():
        tier, op, _phase = key.split("/")
        if tier != "request":
            groups.setdefault((tier, op), []).append(decode(text))
    curves = {k: merged(v) for k, v in groups.items()}
    curves = {k: h for k, h in curves.items() if h.get_total_count()}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(10, 6))
    x = [_nines(p) for p in PCTS]
    for (tier, op), h in sorted(curves.items()):
        y = [max(h.get_value_at_percentile(p), 1) / 1e6 for p in PCTS]
        ax.plot(x, y, marker="o", label=f"{_label(results, tier)} {op} (n={h.get_total_count():,})")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"p{p:g}" if p < 100 else "max" for p in PCTS])
    ax.set_ylabel("latency per block operation (ms, log scale)")
    ax.set_xlabel("percentile")
    run = results.run
    size = f"{run.block_bytes / 2**20:.2f} MiB blocks" if run.block_tokens else "whole-request objects"
    ax.set_title(f"Per-block latency percentiles — {run.model}, {size}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return save(fig, folder, "latency_percentiles.png")


def _full_seconds(results: Results) -> list[dict]:
    """Time-series rows of whole seconds: the drain's partial last second would read as a cliff."""
    whole = int(results.run.duration_s)
    return [r for r in results.timeseries if r["t_s"] < whole]


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def _series(rows: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else r.get(key, 0) for r in rows], dtype=float)


def throughput(results: Results, folder: Path) -> Path | None:
    rows = _full_seconds(results)
    if not rows:
        return None
    t = _series(rows, "t_s")
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for tier in results.run.tiers:
        for d, style in (("read", "-"), ("write", "--")):
            ax1.plot(t, _series(rows, f"{tier}_{d}_gbps"), style, label=f"{_label(results, tier)} {d}")
    ax1.set_ylabel("GB/s")
    ax1.set_title("Bandwidth per tier and direction (demotions included)")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8, ncol=2)
    ax2.plot(t, _series(rows, "requests"), label="requests completed / s")
    ax2.set_ylabel("requests / s")
    ax2b = ax2.twinx()
    ax2b.plot(t, _series(rows, "ops"), color="tab:gray", alpha=0.6, label="block operations / s")
    ax2b.set_ylabel("block operations / s")
    ax2.set_xlabel("seconds into the measurement window")
    ax2.set_title("Throughput")
    ax2.grid(alpha=0.3)
    lines = ax2.get_legend_handles_labels()[0] + ax2b.get_legend_handles_labels()[0]
    ax2.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="upper left")
    return save(fig, folder, "throughput.png")


def occupancy(results: Results, folder: Path) -> Path | None:
    rows = _full_seconds(results)
    if not rows or not any("queue_depth" in r for r in rows):
        return None
    t = _series(rows, "t_s")
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for tier, info in results.run.tiers.items():
        used = _series(rows, f"{tier}_used_bytes") / 2**30
        ax1.plot(t, used, label=f"{_label(results, tier)} (capacity {_size(info.capacity_bytes)})")
    ax1.set_ylabel("GiB held")
    ax1.set_title("Tier occupancy")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.plot(t, _series(rows, "queue_depth"), label="requests queued")
    ax2.plot(t, _series(rows, "in_flight"), label="requests in flight (queued + running)")
    ax2.set_xlabel("seconds into the measurement window")
    ax2.set_ylabel("requests")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    return save(fig, folder, "occupancy.png")


def hit_rate(results: Results, folder: Path) -> Path | None:
    achieved = {k: v for k, v in results.hit_rate.by_source.items() if v is not None}
    theory = (results.workload.get("theoretical_hit_rate") or {}).get("by_source", {})
    sources = sorted(set(achieved) | {k for k, v in theory.items() if v is not None})
    if not sources:
        return None
    x = np.arange(len(sources) + 1)
    labels = ["all (tokens)"] + sources
    a = [results.hit_rate.tokens or 0] + [achieved.get(s) or 0 for s in sources]
    th_all = (results.workload.get("theoretical_hit_rate") or {}).get("tokens")
    b = [th_all or 0] + [theory.get(s) or 0 for s in sources]
    fig, ax = plt.subplots(figsize=(10, 5))
    ax.bar(x - 0.2, [100 * v for v in a], 0.4, label="achieved (this run)")
    ax.bar(x + 0.2, [100 * v for v in b], 0.4, label="theoretical (infinite cache)")
    ax.set_xticks(x, labels)
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Hit rate by source: achieved vs an infinite cache")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return save(fig, folder, "hit_rate.png")


def make_plots(results: Results, folder: Path) -> list[Path]:
    made = [f(results, folder) for f in (latency_percentiles, throughput, occupancy, hit_rate, qos_attainment,
                                         autoscale_curve)]
    return [p for p in made if p is not None]
