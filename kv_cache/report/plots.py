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

from kv_cache import runlog
from kv_cache.recorder.histogram import decode, merged, values_at
from kv_cache.recorder.results_schema import Results
from kv_cache.report.capacity import draw_capacity
from kv_cache.report.console import source_order, tier_label
from kv_cache.report.figure import save
from kv_cache.report.plots_control import draw_autoscale, draw_qos
from kv_cache.report.table import supported

PCTS = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0)
OP_MARKERS = {"read": "o", "write": "s", "demote": "v", "promote": "^", "delete": "P", "wait": "*"}
OP_LINES = {"read": "-", "write": "--", "demote": ":", "promote": "-."}


def _nines(p: float) -> float:
    return -np.log10(max(1.0 - p / 100.0, 1e-5))


def latency_curves(results: Results) -> dict[tuple[str, str], tuple[list[float], list[float], int]]:
    """(tier, op) -> (percentiles, ms, samples) of the block operations of the run's tiers only (request,
    QoS and donor-lookup latencies are per request, not per block), at the percentiles their count supports."""
    groups: dict[tuple[str, str], list] = {}
    for key, text in results.snapshot.histograms.items():
        tier, op, _phase = key.split("/")
        if tier in results.run.tiers:
            groups.setdefault((tier, op), []).append(decode(text))
    out = {}
    for k, hs in sorted(groups.items()):
        h = merged(hs)
        n = h.get_total_count()
        pcts = [p for p in PCTS if supported(p, n)]
        if n:
            out[k] = (pcts, [max(v, 1) / 1e6 for v in values_at(h, pcts)], n)
    return out


def draw_latency(results: Results):
    curves = latency_curves(results)
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(10, 6))
    hue = {tier: f"C{i % 10}" for i, tier in enumerate(results.run.tiers)}  # one hue per tier, one marker per op
    for tier, _op in curves:
        hue.setdefault(tier, f"C{len(hue) % 10}")
    for (tier, op), (pcts, ms, n) in curves.items():
        color = hue[tier]
        line = [(p, v) for p, v in zip(pcts, ms) if p < 100]  # supported percentiles, joined
        ax.plot([_nines(p) for p, _ in line], [v for _, v in line], marker=OP_MARKERS.get(op, "D"),
                ls=OP_LINES.get(op, "-"), color=color, label=f"{tier_label(results, tier)} {op} (n={n:,})")
        ax.scatter([_nines(100.0)], [ms[-1]], marker="x", color=color)  # the max: one sample, not a curve
    ax.set_yscale("log")
    ax.set_xticks([_nines(p) for p in PCTS], [f"p{p:g}" if p < 100 else "max" for p in PCTS])
    ax.set_ylabel("latency per block operation (ms, log scale)")
    ax.set_xlabel("percentile (a curve stops where its sample count cannot support the next one; x: max)")
    run = results.run
    size = f"{run.block_bytes / 2**20:.2f} MiB blocks" if run.block_tokens else "whole-request objects"
    ax.set_title(f"Per-block latency percentiles — {run.model}, {size} (request latencies: see the summary)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: it covers no curve
    return fig


def _full_seconds(results: Results) -> list[dict]:
    """Time-series rows of whole seconds: the drain's partial last second would read as a cliff."""
    whole = int(results.run.duration_s)
    return [r for r in results.timeseries if r["t_s"] < whole]


def _series(rows: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else r.get(key, 0) for r in rows], dtype=float)


SMOOTH_S = 5  # requests per second jump 0/1/2 at low rates: a moving mean over this many seconds reads


def moving_mean(values: np.ndarray, window: int = SMOOTH_S) -> np.ndarray:
    """Trailing mean over up to `window` seconds (shorter at the start)."""
    out = np.empty_like(values, dtype=float)
    for i in range(len(values)):
        out[i] = np.nanmean(values[max(0, i - window + 1):i + 1])
    return out


def draw_throughput(results: Results):
    rows = _full_seconds(results)
    if not rows:
        return None
    t = _series(rows, "t_s")
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for tier in results.run.tiers:
        for d, style in (("read", "-"), ("write", "--")):
            # a tier above the storage is read for its hits and for every block demoted out of it (copied down):
            # at a 0 % hit rate its reads are all demotion traffic
            what = " (hits + demotions out)" if d == "read" and tier != results.bottom else ""
            ax1.plot(t, _series(rows, f"{tier}_{d}_gbps"), style, label=f"{tier_label(results, tier)} {d}{what}")
    ax1.set_ylabel("GB/s")
    ax1.set_title("Bandwidth per tier and direction (demotions included)")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: it covers no peak
    req = _series(rows, "requests")
    ax2.bar(t, req, width=0.9, color="C0", alpha=0.25, label="requests completed in each second")
    ax2.plot(t, moving_mean(req), color="C0", lw=2, label=f"requests / s ({SMOOTH_S} s moving mean)")
    ax2.set_ylabel("requests / s")
    ax2.set_ylim(bottom=0)
    ax2b = ax2.twinx()
    ax2b.plot(t, _series(rows, "ops"), color="tab:gray", alpha=0.6, label="block operations / s")
    ax2b.set_ylabel("block operations / s")
    ax2b.set_ylim(bottom=0)
    ax2.set_xlabel("seconds into the measurement window")
    ax2.set_title("Throughput")
    ax2.grid(alpha=0.3)
    lines = ax2.get_legend_handles_labels()[0] + ax2b.get_legend_handles_labels()[0]
    ax2.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="upper left", bbox_to_anchor=(1.08, 1.0))
    return fig


def draw_occupancy(results: Results):
    rows = _full_seconds(results)
    if not rows or not any("queue_depth" in r for r in rows):
        return None
    t = _series(rows, "t_s")
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for tier, info in results.run.tiers.items():  # % of each tier's own capacity: a small tier stays visible
        used = _series(rows, f"{tier}_used_bytes")
        ax1.plot(t, 100 * used / max(info.capacity_bytes, 1),
                 label=f"{tier_label(results, tier)} (capacity {_size(info.capacity_bytes)})")
    ax1.set_ylabel("% of the tier's capacity held")
    ax1.set_ylim(0, 105)
    ax1.set_title("Tier occupancy")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    queued, flying = _series(rows, "queue_depth"), _series(rows, "in_flight")
    ax2.step(t, queued, where="post", label="requests queued")
    ax2.step(t, flying, where="post", label="requests in flight (queued + running)")
    top = np.nanmax(np.concatenate([queued, flying])) if len(t) else 0
    ax2.set_ylim(0, max(5.0, 1.15 * (top if np.isfinite(top) else 0)))  # a change of 1 must not fill the axis
    ax2.set_xlabel("seconds into the measurement window")
    ax2.set_ylabel("requests")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    return fig


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def _annotate(ax, xs, values) -> None:
    """The value over each bar; 'n/a' where there is none, so 0 % and missing never look alike."""
    for x, v in zip(xs, values):
        ax.text(x, (100 * v if v is not None else 0) + 1.5, "n/a" if v is None else f"{100 * v:.1f}%",
                ha="center", va="bottom", fontsize=7)


def draw_hit_rate(results: Results):
    theory_all = results.workload.theoretical_hit_rate
    theory = theory_all.by_source
    sources = source_order(results)
    if not sources:
        return None
    x = np.arange(len(sources) + 1)
    a = [results.hit_rate.tokens] + [results.hit_rate.by_source.get(s) for s in sources]
    b = [theory_all.tokens] + [theory.get(s) for s in sources]
    fig, ax = plt.subplots(figsize=(10, 5))
    ax.bar(x - 0.2, [100 * (v or 0) for v in a], 0.4, label="achieved (this run)")
    ax.bar(x + 0.2, [100 * (v or 0) for v in b], 0.4, label="infinite cache, estimated before the run")
    _annotate(ax, x - 0.2, a)
    _annotate(ax, x + 0.2, b)
    ax.set_xticks(x, ["all (tokens)"] + sources)
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(0, 112)
    ceiling = results.hit_rate.infinite_cache
    if ceiling is not None:
        ax.axhline(100 * ceiling, color="gray", ls=":", label=f"infinite cache, the run's own requests {ceiling:.1%}")
    ax.set_title("Hit rate by source: achieved vs an infinite cache (n/a: no prompt token of that source)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


DRAWINGS = (("latency_percentiles.png", draw_latency), ("throughput.png", draw_throughput),
            ("occupancy.png", draw_occupancy), ("hit_rate.png", draw_hit_rate),
            ("qos_attainment.png", draw_qos), ("autoscale_curve.png", draw_autoscale),
            ("capacity_curve.png", draw_capacity))


def make_plots(results: Results, folder: Path, drawings=DRAWINGS) -> list[Path]:
    """The plots that can be drawn. A plot never fails a run: one that raises is skipped with one warning on
    stderr, its traceback kept in the run's log (a bug of ours, to be reported, not the run's fault)."""
    made = []
    for name, draw in drawings:
        try:
            fig = draw(results)
            if fig is not None:
                made.append(save(fig, folder, name))
        except Exception as e:  # noqa: BLE001 - any drawing error: the results are already written
            plt.close("all")
            line = runlog.internal(f"{name} could not be drawn", e)
            runlog.tell(f"warning: {line}; the other report files are written.")
    return made
