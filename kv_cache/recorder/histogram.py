"""Latency histograms: HdrHistogram, recorded in integer nanoseconds, merged by addition.

EXECUTIVE SUMMARY
  range      1 ns .. 1 h (3.6e12 ns): GB-sized blocks on slow storage still fit
             (fio's histogram tops out at 2^34 ns = 17 s).
  precision  3 significant figures: a value's bucket is at most 1/1024 (0.1 %) wide.
  memory     33,792 counters x 8 B = about 270 KB per histogram in memory; encoded
             (zlib + base64) a few KB.
  merge      exact: histograms add bucket by bucket, across threads, trials and
             MPI ranks; percentiles are never averaged.
  rank rule  percentile p of N values is the value of rank int(p * N / 100 + 0.5),
             reported as the highest value equivalent to its bucket (HdrHistogram's
             convention; numpy's "inverted_cdf" may differ by one bucket).
"""

from __future__ import annotations

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_NS = 1
HIGHEST_NS = 3_600 * 10**9
SIG_FIGS = 3
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
PCT_KEYS = ("p50", "p90", "p95", "p99", "p999")


def new_histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_NS, HIGHEST_NS, SIG_FIGS)


# Per-second histograms for the time series: microseconds, 1 significant figure (a bucket is at
# most 1/16 = 6.25 % wide), 4-byte counters: 464 counters, about 1.9 KB each in memory.
SECOND_HIGHEST_US = 3_600_000_000


def new_second_histogram() -> HdrHistogram:
    return HdrHistogram(1, SECOND_HIGHEST_US, 1, word_size=4)


def decode_second(text: str) -> HdrHistogram:
    out = new_second_histogram()
    if text:
        out.decode_and_add(text)
    return out


def record(hist: HdrHistogram, value_ns: int) -> None:
    hist.record_value(min(max(int(value_ns), LOWEST_NS), HIGHEST_NS))


def record_many(hist: HdrHistogram, values, lowest: int = LOWEST_NS, highest: int = HIGHEST_NS) -> None:
    """Record every value (clamped to [lowest, highest]) at once: the same buckets, count, min and max as one
    record_value() each, computed in numpy (hdrh's record_value is Python: a few µs per value, paid on every
    block operation otherwise)."""
    v = np.clip(np.asarray(values, dtype=np.int64), lowest, highest)
    if not v.size:
        return
    # bit length of (v | sub_bucket_mask): frexp's exponent, exact for values below 2^53
    bits = np.frexp((v | hist.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
    bucket = bits - hist.unit_magnitude - (hist.sub_bucket_half_count_magnitude + 1)
    sub_bucket = v >> (bucket + hist.unit_magnitude)
    index = ((bucket + 1) << hist.sub_bucket_half_count_magnitude) + sub_bucket - hist.sub_bucket_half_count
    counts = np.ctypeslib.as_array(hist.counts)
    counts += np.bincount(index, minlength=counts.size).astype(counts.dtype)
    hist.total_count += int(v.size)
    hist.min_value = min(hist.min_value, int(v.min()))
    hist.max_value = max(hist.max_value, int(v.max()))


def merged(hists) -> HdrHistogram:
    """The exact sum of hists (a new histogram)."""
    out = new_histogram()
    for h in hists:
        # NOTE: hdrh's add() of an empty histogram sets the target's minimum to 0: skip empties.
        if h.get_total_count():
            out.add(h)
    return out


def encode(hist: HdrHistogram) -> str:
    return hist.encode().decode("ascii")


def decode(text: str) -> HdrHistogram:
    out = new_histogram()
    if text:
        out.decode_and_add(text)
    return out


def summary_ms(hist: HdrHistogram) -> dict:
    """count, p50 .. p99.9, max and mean in milliseconds."""
    n = hist.get_total_count()
    if n == 0:
        return {"count": 0, **{k: None for k in PCT_KEYS}, "max": None, "mean": None}
    values = hist.get_percentile_to_value_dict(list(PERCENTILES))
    out = {"count": n}
    for pct, k in zip(PERCENTILES, PCT_KEYS):
        out[k] = values[pct] / 1e6
    out["max"] = hist.get_max_value() / 1e6
    out["mean"] = hist.get_mean_value() / 1e6
    return out


def count_at_or_below(hist: HdrHistogram, value_ns: float) -> int:
    """Recorded values <= value_ns (to the histogram's precision: values in value_ns's bucket count)."""
    if not hist.get_total_count():
        return 0
    limit = hist.get_highest_equivalent_value(min(max(int(value_ns), LOWEST_NS), HIGHEST_NS))
    return sum(item.count_at_value_iterated_to for item in hist.get_recorded_iterator()
               if item.value_iterated_to <= limit)
