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

import functools

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
    return _decoded_into(new_second_histogram(), text)


def record(hist: HdrHistogram, value_ns: int) -> None:
    hist.record_value(min(max(int(value_ns), LOWEST_NS), HIGHEST_NS))


# NOTE: a bincount spans every bucket of the histogram (33,792 in a latency one): ~110 us a call however few the
# values, paid by every fold's (tier, op, phase, second) and by every block's layer units (issue 48). Below
# counts/SPARSE_AT values, np.add.at of each one is cheaper (numpy 2.4 here: 2 us for 8, 30 us for 512).
SPARSE_AT = 16


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
    if v.size * SPARSE_AT < counts.size:  # a few values: each added where it falls (2-30 us, not ~110)
        np.add.at(counts, index, 1)
    else:
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


def release(hist: HdrHistogram) -> None:
    """Free hist as soon as it is dropped: hdrh's histogram and its encoder refer to each other, so otherwise it waits
    for the cycle collector, and a merge that drops one snapshot a rank holds them all until then (rank 0's at the
    end of an MPI run: a snapshot of the whole time series each). hist is not used after."""
    hist.encoder = None


def encode(hist: HdrHistogram) -> str:
    return hist.encode().decode("ascii")


def decode(text: str) -> HdrHistogram:
    return _decoded_into(new_histogram(), text)


def _decoded_into(out: HdrHistogram, text: str) -> HdrHistogram:
    """out with text's histogram added (hdrh's decode_and_add, its decoded copy freed at once: release)."""
    if text:
        part = HdrHistogram.decode(text, out.b64_wrap)
        out.add(part)
        release(part)
    return out


@functools.lru_cache(maxsize=8)
def _bucket_values(unit_magnitude: int, half_magnitude: int, counts_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(highest, median) equivalent value of every counter index of a histogram of this geometry, as hdrh's
    get_value_from_index / get_highest_equivalent_value / _hdr_median_equiv_value compute them one at a time."""
    i = np.arange(counts_len, dtype=np.int64)
    half = 1 << half_magnitude
    bucket = (i >> half_magnitude) - 1
    sub = (i & (half - 1)) + half
    first = bucket < 0
    sub[first] -= half
    bucket[first] = 0
    lowest = sub << (bucket + unit_magnitude)
    size = np.int64(1) << (bucket + unit_magnitude)
    return lowest + size - 1, lowest + (size >> 1)


def _counts(hist: HdrHistogram) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counts, highest, median) per index: hdrh walks its 33,792 counters in Python for every percentile and mean
    (half a second per histogram); numpy does it in a millisecond, to the same values."""
    counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len].astype(np.int64)
    highest, median = _bucket_values(hist.unit_magnitude, hist.sub_bucket_half_count_magnitude, hist.counts_len)
    return counts, highest, median


def values_at(hist: HdrHistogram, percentiles) -> list[int]:
    """The values at these percentiles (0 < p <= 100), by HdrHistogram's rank rule (see the module docstring)."""
    n = hist.get_total_count()
    counts, highest, _ = _counts(hist)
    cumulative = np.cumsum(counts)
    targets = [max(int(min(p, 100.0) * n / 100 + 0.5), 1) for p in percentiles]
    return [int(highest[min(int(np.searchsorted(cumulative, t)), len(highest) - 1)]) for t in targets]


def value_at(hist: HdrHistogram, percentile: float) -> int:
    return values_at(hist, [percentile])[0]


def at_ms(hist: HdrHistogram | None, percentile: float, per_ms: float = 1e6) -> float | None:
    """The percentile in ms (the histogram's unit: per_ms of them make a ms), None when it holds nothing."""
    return value_at(hist, percentile) / per_ms if hist is not None and hist.get_total_count() else None


def mean_value(hist: HdrHistogram) -> float:
    counts, _, median = _counts(hist)
    n = int(counts.sum())
    return float(np.dot(counts.astype(np.float64), median.astype(np.float64)) / n) if n else 0.0


def supported(p: float, count: int) -> bool:
    """The one rule for every output (console, results.json, compare, trials, plots): a percentile is a figure only
    from enough samples: p needs 1 / (1 - p) of them (p99 100, p99.9 1,000; the max: any). Rounded, as 100 - 99.9
    is not exactly 0.1 in floating point."""
    return p >= 100.0 or round(count * (100.0 - p), 6) >= 100.0


def summary_ms(hist: HdrHistogram) -> dict:
    """count, p50 .. p99.9, max and mean in milliseconds; a percentile too few samples support is None (with the
    count beside it: 3 samples have no p95, only a max)."""
    n = hist.get_total_count()
    if n == 0:
        return {"count": 0, **{k: None for k in PCT_KEYS}, "max": None, "mean": None}
    out = {"count": n}
    for k, p, v in zip(PCT_KEYS, PERCENTILES, values_at(hist, PERCENTILES)):
        out[k] = v / 1e6 if supported(p, n) else None
    out["max"] = hist.get_max_value() / 1e6
    out["mean"] = mean_value(hist) / 1e6
    return out


def count_at_or_below(hist: HdrHistogram, value_ns: float) -> int:
    """Recorded values <= value_ns (to the histogram's precision: values in value_ns's bucket count)."""
    if not hist.get_total_count():
        return 0
    limit = hist.get_highest_equivalent_value(min(max(int(value_ns), LOWEST_NS), HIGHEST_NS))
    counts, highest, _ = _counts(hist)
    return int(counts[highest <= limit].sum())
