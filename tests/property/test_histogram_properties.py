"""Histograms merge exactly: associative, count-preserving, equal to recording everything in one."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kv_cache.recorder.histogram import decode, encode, merged, new_histogram, record, summary_ms, values_at

values = st.lists(st.integers(1, 10**12), max_size=200)


def hist(vals):
    h = new_histogram()
    for v in vals:
        record(h, v)
    return h


@settings(max_examples=60, deadline=None)
@given(a=values, b=values, c=values)
def test_merge_is_associative_and_preserves_counts(a, b, c):
    left = merged([merged([hist(a), hist(b)]), hist(c)])
    right = merged([hist(a), merged([hist(b), hist(c)])])
    assert left.get_total_count() == right.get_total_count() == len(a) + len(b) + len(c)
    assert left.equals(right) and left.equals(hist(a + b + c))


@settings(max_examples=30, deadline=None)
@given(a=values)
def test_encoding_round_trips(a):
    assert decode(encode(hist(a))).equals(hist(a))


@settings(max_examples=40, deadline=None)
@given(a=st.lists(st.integers(1_000, 10**10), min_size=1, max_size=300))
def test_percentiles_are_within_a_tenth_of_a_percent(a):
    s = summary_ms(hist(a))
    exact = sorted(a)
    rank = max(1, int(0.99 * len(a) + 0.5))  # HdrHistogram's rank rule
    (p99,) = values_at(hist(a), (99.0,))
    assert abs(p99 - exact[rank - 1]) <= exact[rank - 1] * 0.001 + 1
    assert (s["p99"] is None) == (len(a) < 100)  # a percentile is a figure only from enough samples (issue 39)
    assert s["p99"] is None or s["p99"] * 1e6 == p99
    assert s["count"] == len(a)
    assert abs(s["max"] * 1e6 - max(a)) <= max(a) * 0.001 + 1


def test_empty_summary_is_null_not_zero():
    assert summary_ms(new_histogram())["p50"] is None


@settings(max_examples=15, deadline=None)  # hdrh's own walk, the reference here, takes 0.1 s per histogram
@given(st.lists(st.integers(1, 10**12), min_size=1, max_size=100), st.booleans())
def test_numpy_percentiles_mean_and_counts_equal_hdrhs_own(values, per_second):
    """values_at / mean_value / count_at_or_below walk the counters in numpy: the values hdrh's Python walk gives."""
    from kv_cache.recorder.histogram import count_at_or_below, mean_value, new_second_histogram, values_at

    h = new_second_histogram() if per_second else new_histogram()
    for v in values:
        h.record_value(min(v, h.highest_trackable_value))
    pcts = [0.1, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0]
    assert values_at(h, pcts) == [h.get_value_at_percentile(p) for p in pcts]
    assert abs(mean_value(h) - h.get_mean_value()) <= 1e-9 * h.get_mean_value()
    limit = h.get_highest_equivalent_value(sorted(values)[len(values) // 2])
    want = sum(i.count_at_value_iterated_to for i in h.get_recorded_iterator() if i.value_iterated_to <= limit)
    assert count_at_or_below(h, limit) == want
