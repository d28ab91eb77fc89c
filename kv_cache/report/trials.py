"""--trials N read back: each headline number's median and spread over the trials, and one warning naming those
the trials disagree on. The run says it at its end, and `report` of its folder says it again."""

from __future__ import annotations

import math

from kv_cache.recorder.results_schema import Results
from kv_cache.recorder.sections import Spread, Trials
from kv_cache.report.table import format_table

PERCENT = ("token_hit_rate",)  # a fraction in results.json, said as a percent like every other hit rate
SPREAD_WARN = 0.10  # a headline whose trials differ by more than this share of its median is not one figure

LONGER = {  # what bounded each trial's window -> what lengthens it
    "max_requests": "raise --max-requests",
    "duration": "lengthen --duration or --warmup",
    "trace_end": "give a longer trace (each trial ran it to its end)",
}


def decimals(v: float) -> int:
    """The decimals that give 4 significant digits; a thousand and more in whole units (32,784, not 3.278e+04)."""
    return 0 if v == 0 or abs(v) >= 1000 else max(0, 3 - math.floor(math.log10(abs(v))))


def value(name: str, v: float, places: int | None = None) -> str:
    """v with `places` decimals (default: its own 4 significant digits), as a percent for a hit rate. A row gives
    its min and max the median's places, so that a column of figures reads alike (341.0 beside 331.6, not 341)."""
    if name in PERCENT:
        return f"{v:.1%}"
    return f"{v:,.{decimals(v) if places is None else places}f}"


def table(summary: dict[str, Spread]) -> list[str]:
    rows = [["headline", "", "median", "min", "max", "CV"]]
    for name, s in summary.items():
        if s.median is not None:
            cv = "-" if s.cv is None else f"{s.cv:.1%}"
            places = decimals(s.median)
            rows.append([name, "", *(value(name, v, places) for v in (s.median, s.min, s.max)), cv])
    return format_table(rows, 2, "  ")


def _spread(s: Spread) -> float | None:
    """(max - min) / median, where two trials or more gave the figure."""
    if not s.median or s.max is None or len([v for v in s.values if v is not None]) < 2:
        return None
    return (s.max - s.min) / abs(s.median)


def spread_warning(summary: dict[str, Spread], stopped_reason: str | None) -> list[str]:
    """One line naming every headline whose trials differ by more than SPREAD_WARN of its median (the median alone
    would hide it), with what lengthens a trial given what bounded it."""
    apart = [f"{name} by {spread:.0%} ({value(name, s.min, decimals(s.median))} to "
             f"{value(name, s.max, decimals(s.median))})" for name, s in summary.items()
             if (spread := _spread(s)) is not None and spread > SPREAD_WARN]
    if not apart:
        return []
    longer = LONGER.get(stopped_reason or "", "lengthen the trials")
    return [f"warning: the trials differ by more than {SPREAD_WARN:.0%} of the median in {len(apart)} headline "
            f"number{'s' if len(apart) > 1 else ''}: {'; '.join(apart)}. The system did not give one figure; "
            f"{longer}, or look for what else ran."]


def trials_lines(trials: Trials | None, stopped_reason: str | None) -> list[str]:
    """The trials' section of a summary: which trial results.json holds, the table, the warning."""
    if trials is None:
        return []
    which = "the median trial" if trials.count % 2 else "the lower of the two middle trials"  # an even count has none
    return ([f"Trials     {trials.count} of the same schedule; results.json = {which} by cached tokens/s, trial "
             f"{trials.median_trial} (each trial in trial-<k>/)"]
            + table(trials.summary) + spread_warning(trials.summary, stopped_reason))


def section(results: Results) -> list[str]:
    return trials_lines(results.trials, results.run.stopped_reason)
