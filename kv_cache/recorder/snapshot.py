"""Snapshot: the merged statistics of a run (or of several ranks): histograms, counters, one-second series.

A plain value made by Recorder.snapshot(), serialised into results.json and merged exactly across MPI ranks.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kv_cache.recorder.histogram import decode, decode_second, encode, merged, new_second_histogram, release


@dataclass
class Snapshot:
    """Merged statistics: histograms, counters, one-second series and the window.

    second_hists: (second, tier, op) -> coarse histogram of that second (µs), for time-series
    percentiles; gauges: second -> sampled levels (queue depth, occupancy, ...), summed on merge.
    """

    hists: dict[tuple, object] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    series: dict[int, dict[str, int]] = field(default_factory=dict)
    window_start_ns: int = 0
    window_end_ns: int = 0
    second_hists: dict[tuple, object] = field(default_factory=dict)
    gauges: dict[int, dict[str, float]] = field(default_factory=dict)

    @property
    def window_s(self) -> float:
        return max(self.window_end_ns - self.window_start_ns, 1) / 1e9

    def to_dict(self) -> dict:
        return {
            "histograms": {"/".join(k): encode(h) for k, h in self.hists.items()},
            "counters": dict(self.counters),
            "series": {str(s): v for s, v in self.series.items()},
            "window_ns": [self.window_start_ns, self.window_end_ns],
            "second_histograms": {f"{s}/{t}/{o}": encode(h) for (s, t, o), h in self.second_hists.items()},
            "gauges": {str(s): v for s, v in self.gauges.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> Snapshot:
        seconds = {}
        for k, v in d.get("second_histograms", {}).items():
            sec, tier, op = k.split("/")
            seconds[(int(sec), tier, op)] = decode_second(v)
        return cls({tuple(k.split("/")): decode(v) for k, v in d["histograms"].items()}, dict(d["counters"]),
                   {int(s): dict(v) for s, v in d["series"].items()}, *d["window_ns"], seconds,
                   {int(s): dict(v) for s, v in d.get("gauges", {}).items()})

    def release(self) -> None:
        """Free this snapshot's histograms when it is dropped (histogram.release); it is not used after."""
        for h in (*self.hists.values(), *self.second_hists.values()):
            release(h)

    def merge(self, other: Snapshot) -> Snapshot:
        """Exact merge: histograms add, counters add, the window spans both."""
        hists = {k: merged([h for h in (self.hists.get(k), other.hists.get(k)) if h is not None])
                 for k in set(self.hists) | set(other.hists)}
        counters = defaultdict(int, self.counters)
        for k, v in other.counters.items():
            counters[k] += v
        series: dict[int, dict[str, int]] = {s: dict(v) for s, v in self.series.items()}
        for s, row in other.series.items():
            dst = series.setdefault(s, {})
            for k, v in row.items():
                dst[k] = dst.get(k, 0) + v
        starts = [w for w in (self.window_start_ns, other.window_start_ns) if w]
        seconds = {}
        for k in set(self.second_hists) | set(other.second_hists):
            h = new_second_histogram()
            for part in (self.second_hists.get(k), other.second_hists.get(k)):
                if part is not None and part.get_total_count():
                    h.add(part)
            seconds[k] = h
        gauges = {s: dict(v) for s, v in self.gauges.items()}
        for s, row in other.gauges.items():
            dst = gauges.setdefault(s, {})
            for k, v in row.items():
                dst[k] = dst.get(k, 0) + v
        return Snapshot(hists, dict(counters), series, min(starts, default=0),
                        max(self.window_end_ns, other.window_end_ns), seconds, gauges)


def copy_second(h):
    """A copy of a per-second histogram (the recorder keeps filling its own)."""
    out = new_second_histogram()
    if h.get_total_count():
        out.add(h)
    return out
