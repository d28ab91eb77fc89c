"""Issue 18: the first run explains itself: the load verdict, accounting that adds up, honest percentiles."""

import pytest
from results_fixture import results

from kv_cache.recorder.schema import Latency
from kv_cache.recorder.verdict import load_verdict
from kv_cache.report.console import render, source_order
from kv_cache.report.table import pct_ms


def test_make_runs_overload_is_called_queue_bound_with_both_rates():
    # make run of the issue: 200 users, 4 workers, 30 requests served in 64 s, queue wait p50 21.6 s
    v = load_verdict(offered=230, served=30, window_s=64.1, queue_p50_ms=21_600, storage_p50_ms=900, workers=4,
                     rows=[{"in_flight": 200}] * 60)
    assert v["kind"] == "queue" and v["offered_per_s"] == pytest.approx(230 / 64.1)
    assert "--workers" in v["advice"]


def test_idle_workers_are_bound_by_the_users_pace():
    v = load_verdict(offered=20, served=20, window_s=10, queue_p50_ms=0.01, storage_p50_ms=5, workers=8,
                     rows=[{"in_flight": 1}] * 10)
    assert v["kind"] == "users" and "--users" in v["advice"]


def test_busy_workers_and_a_short_queue_are_storage_bound():
    v = load_verdict(offered=100, served=100, window_s=10, queue_p50_ms=1, storage_p50_ms=40, workers=4,
                     rows=[{"in_flight": 4}] * 10)
    assert v["kind"] == "storage"
    assert load_verdict(offered=5, served=0, window_s=10, queue_p50_ms=None, storage_p50_ms=None, workers=4,
                        rows=[]) is None


def test_the_console_says_the_verdict_and_the_accounting_adds_up():
    r = results()
    r.requests.issued, r.requests.warmup_completed, r.requests.dropped_at_stop = 9, 3, 5
    r.requests.in_flight_at_end = r.requests.issued - 3 - r.requests.completed - 5
    text = render(r)
    assert f"9 issued = 3 completed in warm-up + {r.requests.completed} completed in the window" in text
    assert "5 queued at stop (dropped) + 0 in flight" in text
    assert "load: " in text


ALL = ("p50", "p90", "p95", "p99", "p999")


@pytest.mark.parametrize("count, shown", [(15, set(ALL[:2])), (20, set(ALL[:3])), (999, set(ALL[:4])),
                                          (1000, set(ALL))])
def test_percentiles_need_enough_samples(count, shown):
    s = Latency(count, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 2.0)
    assert {k for k in ("p50", "p90", "p95", "p99", "p999") if pct_ms(s, k) != "-"} == shown


def test_hit_rate_sources_keep_their_place_when_one_has_no_hit():
    r = results()
    r.workload = {"theoretical_hit_rate": {"tokens": 0.5, "by_source": {"user": 0.0, "history": 0.9,
                                                                          "system": 1.0}}}
    r.hit_rate.by_source = {"user": 0.0}
    assert source_order(r) == ["system", "history", "user"]
    assert "by source: system n/a, history n/a, user 0.0%" in render(r)


def test_the_drain_is_said_on_the_window_line():
    r = results()
    r.settings["run"]["duration_s"] = 60
    r.run.duration_s = 64.1
    assert "window 64.1 s (--duration 60 + 4.1 s drain" in render(r)
