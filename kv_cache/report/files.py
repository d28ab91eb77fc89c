"""The report folder reports/<run-id>/: pure functions of the results dict.

    results.json    everything (written by the run)
    settings.yaml   the exact resolved settings, loadable with --config
    timeseries.csv  one row per measured second
    summary.md      the console summary as Markdown, with the plots
    *.png           plots (report/plots.py)
"""

from __future__ import annotations

import csv
from pathlib import Path

import yaml

from kv_cache.recorder.results_schema import Results
from kv_cache.report.console import render
from kv_cache.safefiles import write_file, write_with


def _plain(obj):
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def write_settings(results: Results, folder: Path) -> Path:
    return write_file(folder / "settings.yaml", "# The resolved settings of this run: python kv_cache_benchmark.py "
                      "--config settings.yaml\n" + yaml.safe_dump(_plain(results.settings), sort_keys=False), "report")


def _significant(v: float, digits: int) -> float:
    return float(f"{v:.{digits}g}")


def csv_value(column: str, v) -> str:
    """A time-series cell at the precision it has: per-second latencies come from histograms at one
    significant figure (buckets up to 6.25 % wide), so two significant digits; rates and ratios at 4."""
    if v is None:
        return ""
    if isinstance(v, int):  # bool too
        return str(v)
    if column.endswith("_ms"):
        return f"{_significant(v, 2):g}"
    if column.endswith("_bytes"):
        return str(round(v))
    return f"{v:.4f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:.1f}"


def write_timeseries(results: Results, folder: Path) -> Path:
    rows = results.timeseries
    columns = list(dict.fromkeys(k for row in rows for k in row)) or ["t_s"]

    def rows_to(f) -> None:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for row in rows:
            w.writerow({k: csv_value(k, row.get(k)) for k in columns})
    return write_with(folder / "timeseries.csv", rows_to, "report")


def write_summary(results: Results, folder: Path, plots: list[Path]) -> Path:
    lines = [f"# kv-cache-bench run {results.run.run_id}", "", "```", render(results), "```", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    return write_file(folder / "summary.md", "\n".join(lines) + "\n", "report")


def write_report(results: Results, folder: Path) -> list[Path]:
    """Every file of the report folder but results.json; returns their paths."""
    from kv_cache.report.plots import make_plots

    plots = make_plots(results, folder)
    return [write_settings(results, folder), write_timeseries(results, folder),
            write_summary(results, folder, plots), *plots]
