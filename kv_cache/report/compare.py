"""kv_cache_benchmark.py compare RUN RUN ...: headline numbers side by side, ratios to the first run.

Pure functions of the results files; plots go to --output (default reports/compare-<time>/).
"""

from __future__ import annotations

from pathlib import Path

from kv_cache.recorder.results_schema import Results
from kv_cache.recorder.verdict import arrival_of, null_bottom, pace
from kv_cache.report.console import run_state
from kv_cache.report.table import WIDTH, fit, format_table


def _storage(op: str, pct: str):
    """The bottom tier's (the storage under test's) latency of op, whatever its medium."""
    return lambda r: r.latency(r.bottom, op, pct)


def _top(op: str, pct: str):
    """The fastest tier's latency of op (a memory tier when there is one above the storage)."""
    return lambda r: r.latency(next(iter(r.run.tiers)), op, pct) if len(r.run.tiers) > 1 else None


HEADLINES = (  # (name, getter, higher is better); storage = the bottom tier
    ("requests / s", lambda r: r.requests.per_s, True),
    ("cached tokens / s", lambda r: r.tokens.cached_per_s, True),
    ("token hit rate %", lambda r: None if r.hit_rate.tokens is None else 100 * r.hit_rate.tokens, True),
    ("storage read GB/s", lambda r: r.storage_gbps("read"), True),
    ("storage write GB/s", lambda r: r.storage_gbps("write"), True),
    ("storage read p50 ms", _storage("read", "p50"), False),
    ("storage read p99 ms", _storage("read", "p99"), False),
    ("storage demote p99 ms", _storage("demote", "p99"), False),
    ("top tier write p99 ms", _top("write", "p99"), False),
    ("request storage p95 ms", lambda r: r.request("storage", "p95"), False),
    ("request e2e p99 ms", lambda r: r.request("e2e", "p99"), False),
    ("queue wait p95 ms", lambda r: r.request("queue", "p95"), False),
)


def _fmt(v) -> str:
    """A headline at the precision it has: 4 significant digits below 100 (0.000123 GB/s is not 0.000)."""
    if v is None:
        return "-"
    return f"{v:.4g}" if abs(v) < 100 else f"{v:,.0f}"


def _setting(v) -> str:
    return "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


# Settings that do not change what is measured: where the report goes, how much is printed or traced.
NOT_MEASURED = ("run.output_dir", "run.run_id", "run.quiet", "run.keep_data", "run.io_trace", "run.telemetry",
                "run.trials", "run.submission")


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and k != "models":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def setting_differences(runs: list[tuple[str, Results]]) -> list[str]:
    """The settings (as each run resolved them) that differ between the runs and change the numbers."""
    flats = [_flat(r.settings) for _, r in runs]
    keys = sorted(set().union(*flats) - set(NOT_MEASURED))
    return [f"{k}: " + " | ".join(_setting(f.get(k)) for f in flats) for k in keys
            if len({repr(f.get(k)) for f in flats}) > 1]


def _verdict(r: Results) -> str:
    """The load verdict in a word or two: what decided the numbers, and for a queue what it was made of."""
    v = r.load
    if v is None:
        return "-"
    paced = pace(arrival_of(r)).removeprefix("the ")  # users' pace, trace's timestamps, arrival rate, ...
    storage = "generator (null tier)" if null_bottom(r) else "storage"
    return {"queue": f"queue ({v.cause or '-'})", "users": paced, "storage": storage}.get(v.kind, v.kind)


def _ranks(r: Results, one: str) -> str:
    """A rank's figure, times the ranks of an MPI run (its settings and workers are each rank's)."""
    return one if r.run.ranks <= 1 or one == "-" else f"{one} x {r.run.ranks}"


def _size_gib(key: str):
    """A tier's size as the run resolved it (auto choices written in), GiB."""
    def get(r: Results) -> str:
        v = _flat(r.settings).get(key)
        return _ranks(r, "-" if v is None else f"{v:.4g}")
    return get


CHOICES = (  # what a run chose or was told, beside the numbers: the same command chooses the same on one machine
    ("workers", lambda r: _ranks(r, str(r.run.workers))),
    ("cpu tier GiB", _size_gib("tiers.cpu_mem_gb")),
    ("nvme tier GiB", _size_gib("tiers.nvme_gb")),
    ("load verdict", _verdict),
)


def _table(runs: list[tuple[str, Results]], picked: list[int]) -> list[str]:
    """The first run (the baseline) and the runs picked (their indexes) side by side, with each one's ratios to it."""
    cols = [0, *picked]
    header = ["measure", ""] + [f"run {i + 1}" for i in cols] + [f"{i + 1} / 1" for i in picked]
    rows = [header]
    for title, get, _better in HEADLINES:
        values = [get(runs[i][1]) for i in cols]
        if all(v is None for v in values):
            continue
        base = values[0]
        ratios = [f"{v / base:.2f}x" if v is not None and base else "-" for v in values[1:]]
        rows.append([title, ""] + [_fmt(v) for v in values] + ratios)
    pad = [""] * len(picked)
    described = [("run", run_state), ("model", lambda r: r.run.model), ("io engine", lambda r: r.run.io_engine),
                 ("storage tier", lambda r: r.bottom), *CHOICES]
    return format_table(rows + [[title, ""] + [get(runs[i][1]) for i in cols] + pad for title, get in described])


def comparison_table(runs: list[tuple[str, Results]]) -> str:
    """Runs as columns named 1, 2, ... (their folders listed first); as many runs a table beside the baseline as fit
    100 columns (nine runs in one table wrapped each row over three lines), the baseline in each."""
    legend = [f"run {i}: {name}" for i, (name, _) in enumerate(runs, 1)]
    others = list(range(1, len(runs)))
    for k in range(len(others), 0, -1):
        tables = [_table(runs, others[j:j + k]) for j in range(0, len(others), k)]
        if k == 1 or all(len(line) <= WIDTH for t in tables for line in t):
            break
    lines = legend
    for t in tables:
        lines += [""] + t
    short = [f"run {i} stopped {r.run.duration_s:.1f} s into its measurement ({r.run.stopped_reason})"
             for i, (_, r) in enumerate(runs, 1) if r.run.partial]
    if short:
        lines += ["", f"note: partial results: {'; '.join(short)}; {'its' if len(short) == 1 else 'their'} figures "
                      f"are of that window, not of the run asked for."]
    diff = setting_differences(runs)
    if diff:
        lines += ["", f"note: these runs differ in {len(diff)} setting(s) that change the numbers (values in run "
                      f"order; compare like with like, or read the ratios knowing it):"] + [f"  {d}" for d in diff]
    return fit("\n".join(lines))


def comparison_plots(runs: list[tuple[str, Results]], folder: Path) -> list[Path]:
    from kv_cache.report.capacity import draw_capacity_overlay
    from kv_cache.report.figure import save

    folder.mkdir(parents=True, exist_ok=True)
    made = [save(draw_comparison(runs), folder, "compare_headlines.png")]
    overlay = draw_capacity_overlay(runs)  # runs made with --capacity-curve: their curves on one axis
    return made + ([save(overlay, folder, "compare_capacity.png")] if overlay is not None else [])


def draw_comparison(runs: list[tuple[str, Results]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [n for n, _ in runs]
    measures = [(t, g, b) for t, g, b in HEADLINES if all(g(r) is not None for _, r in runs) and g(runs[0][1])]
    # one axis per direction: a ratio above 1 is better on the left and worse on the right
    panels = [(better, [m for m in measures if m[2] == better]) for better in (True, False)]
    panels = [(b, ms) for b, ms in panels if ms]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(13, 6), squeeze=False)
    width = 0.8 / len(runs)
    for ax, (better, ms) in zip(axes[0], panels):
        x = np.arange(len(ms))
        for i, (name, r) in enumerate(runs):
            ax.bar(x + i * width - 0.4 + width / 2, [g(r) / g(runs[0][1]) for _, g, _ in ms], width, label=name)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(x, [t for t, _, _ in ms], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"ratio to {names[0]}")
        ax.set_title(f"{'Higher' if better else 'Lower'} is better ({'above' if better else 'below'} 1: better "
                     f"than {names[0]})")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return fig
