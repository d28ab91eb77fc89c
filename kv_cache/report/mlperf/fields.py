"""The run's figures read under the MLPerf reference's names: histograms and counters of the run's snapshot, in
the reference's units (GiB, GiB/s, ms), and one note for every field left null (docs/mlperf.md "The MLPerf front door").

The reference's "storage" tier is our bottom tier; its "gpu" and "cpu" tiers are ours of those names."""

from __future__ import annotations

from kv_cache import counters as C
from kv_cache.model import GiB
from kv_cache.recorder.histogram import at_ms, mean_value, merged, supported
from kv_cache.recorder.results_schema import Results
from kv_cache.recorder.snapshot import Snapshot

TIERS = (("GPU", "gpu"), ("CPU", "cpu"), ("Storage", "storage"))  # the reference's tier labels and field prefixes

# the reference's "gb" fields are GiB (bytes / 1024^3), its "gbps" GiB/s: model.GiB
PCTS = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p999": 99.9, "p9999": 99.99}
TIER_LABEL = {"gpu": "GPU", "cpu": "CPU"}


class Fields:
    """One run's figures by the reference's rules (its names), and the reasons for every null."""

    def __init__(self, r: Results, snap: Snapshot):
        self.r, self.snap, self.c = r, snap, snap.counters
        self.notes: list[str] = []
        # every rate over the window in which exactly its bytes moved: results.json's run.duration_s, the drain
        # included as its bytes are (the reference divides what completes during its threads' join by the time
        # until its stop event: a rank wrote 0.554 GiB/s where its disk sustained 0.266, issue 51)
        self.window = r.run.duration_s
        self.tiers = {"gpu": "gpu", "cpu": "cpu", "storage": r.bottom}  # theirs -> ours

    def null(self, fields: str, why: str) -> None:
        """A field that cannot be had here: null, and one note naming it and why."""
        self.notes.append(f"{fields}: null: {why}")
        return None

    def zero(self, fields: str, why: str, value=0):
        """A number the reference writes where we have nothing to count (a tier not in the run, no sample): 0, as
        the reference's own readers take for a key it leaves out (mlpstorage's aggregation, json_to_xlsx), and one
        note naming it and why; a null there crashed their max() and sums."""
        self.notes.append(f"{fields}: {value}: {why}")
        return value

    def has(self, ref_tier: str) -> bool:
        return self.tiers[ref_tier] in self.r.run.tiers

    def count(self, name: str) -> int:
        return int(self.c.get(name, 0))

    def hist(self, tier: str, op: str, phases: tuple[str, ...] = ()):
        """The histogram of one tier and op over its phases (all of them when none is named), or None."""
        parts = [h for (t, o, p), h in self.snap.hists.items() if t == tier and o == op and (not phases or p in phases)]
        h = merged(parts) if parts else None
        return h if h is not None and h.get_total_count() else None

    @staticmethod
    def latency_merged(hists):
        """The sum of several histograms, or None when they hold nothing."""
        h = merged(hists)
        return h if h.get_total_count() else None

    def phase_count(self, op: str, phases: tuple[str, ...]) -> int:
        return sum(h.get_total_count() for (t, o, p), h in self.snap.hists.items()
                   if o == op and p in phases and t in self.r.run.tiers)

    def latency(self, h, keys=("mean", *PCTS)) -> dict[str, float]:
        """mean and percentiles in ms of an ns histogram (0.0 without samples: the caller notes why). A percentile
        too few samples support (the rule of results.json, where it is null) is their max here, where the
        reference's readers need a number, and one note says so."""
        out = {k: (self._pct(h, k) if k in PCTS else mean_value(h) / 1e6) if h is not None else 0.0 for k in keys}
        if "max" in keys:
            out["max"] = h.get_max_value() / 1e6 if h is not None else 0.0
        return out

    def _pct(self, h, key: str) -> float:
        if supported(PCTS[key], h.get_total_count()):
            return at_ms(h, PCTS[key])
        note = ("a percentile from fewer samples than it needs (p95: 20, p99: 100, p99.9: 1,000, p99.99: 10,000) is "
                "the max of those samples, never an interpolated figure (results.json has null and the count)")
        if note not in self.notes:
            self.notes.append(note)
        return h.get_max_value() / 1e6

    def request_latency(self, kind: str, field: str) -> dict[str, float]:
        h = self.snap.hists.get(C.request_hist(kind))
        if h is None or not h.get_total_count():
            why = ("no modelled generation (--generation-mode none)" if kind == "generation" else
                   "no request completed in the measurement window")
            self.zero(f"summary.{field}.*", f"no sample ({why})")
            return self.latency(None)
        return self.latency(h)

    def request_seconds(self, kind: str) -> float:
        """The sum over the window's requests of their time in one part (s): mean x count of its histogram."""
        h = self.snap.hists.get(C.request_hist(kind))
        return mean_value(h) * h.get_total_count() / 1e9 if h is not None else 0.0

    def moved_gib(self, ref_tier: str, direction: str) -> float:
        b = self.r.bytes.get(self.tiers[ref_tier])
        return (getattr(b, direction) if b else 0) / GiB

    def per_s(self, value: float) -> float:
        return value / self.window if self.window else 0.0

    def missing_tier_notes(self) -> None:
        for ref, why in (("gpu", "--gpu-mem-gb 0 or no GPU found"), ("cpu", "--cpu-mem-gb 0")):
            if not self.has(ref):
                self.zero(f"summary.cache_stats.{ref}_* and tier_{ref}_*",
                          f"no {TIER_LABEL[ref]} tier in this run ({why}): nothing there, as the reference counts it")
