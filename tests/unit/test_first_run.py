"""Issue 18: the first run explains itself: the load verdict, accounting that adds up, honest percentiles."""

import pytest
from results_fixture import results

from kv_cache.recorder.results_schema import Latency
from kv_cache.recorder.sections import TheoreticalHitRate
from kv_cache.recorder.verdict import load_verdict
from kv_cache.report.console import render, source_order
from kv_cache.report.table import pct_ms
from kv_cache.run.describe import warnings_of


def verdict(offered, served, window_s, q50, st50, workers, rows, q95=None, st95=None, dropped=0):
    return load_verdict({"issued_in_window": offered, "completed": served, "dropped_at_stop": dropped}, window_s,
                        {"p50": q50, "p95": q95}, {"p50": st50, "p95": st95}, workers, rows)


def test_make_runs_overload_is_called_queue_bound_with_both_rates():
    # make run of the issue: 200 users, 4 workers, 30 requests served in 64 s, queue wait p50 21.6 s
    v = verdict(230, 30, 64.1, 21_600, 900, 4, [{"in_flight": 200}] * 60)
    assert v["kind"] == "queue" and v["offered_per_s"] == pytest.approx(230 / 64.1)
    assert "--workers" in v["advice"]


def test_a_long_queue_tail_or_a_backlog_at_the_stop_is_never_called_storage_bound():
    # issue 28's make run: the median waited little, but p95 waited 28 s and 19 requests were left queued
    tail = verdict(60, 60, 60.0, 400, 900, 4, [{"in_flight": 4}] * 60, q95=28_000, st95=2_000)
    assert tail["kind"] == "queue" and "p95" in tail["advice"] and "did not wait long" not in tail["advice"]
    backlog = verdict(60, 60, 60.0, 400, 900, 4, [{"in_flight": 4}] * 60, q95=1_000, st95=2_000, dropped=19)
    assert backlog["kind"] == "queue" and "19 requests still queued" in backlog["advice"]
    assert backlog["queue_wait_p95_ms"] == 1_000 and backlog["dropped_at_stop"] == 19


def test_idle_workers_are_bound_by_the_users_pace():
    v = verdict(20, 20, 10, 0.01, 5, 8, [{"in_flight": 1}] * 10)
    assert v["kind"] == "users" and "--users" in v["advice"]


def test_busy_workers_and_a_short_queue_are_storage_bound():
    v = verdict(100, 100, 10, 1, 40, 4, [{"in_flight": 4}] * 10, q95=5, st95=60, dropped=2)
    assert v["kind"] == "storage" and "2 left queued at the stop" in v["advice"]  # said, never "no backlog"
    assert verdict(5, 0, 10, None, None, 4, []) is None


def test_the_users_line_adds_up_to_the_users():
    r = results()
    r.run.users = 200
    r.requests.users_started, r.requests.users_paced, r.requests.users_waiting_at_stop = 36, 20, 150
    line = next(x for x in render(r).splitlines() if x.strip().startswith("users:"))
    assert "36 of 200 started (20 of them after waiting" in line and "164 never started, 150 of them" in line


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
    r.workload.theoretical_hit_rate = TheoreticalHitRate(0.5, {"user": 0.0, "history": 0.9, "system": 1.0})
    r.hit_rate.by_source = {"user": 0.0}
    assert source_order(r) == ["system", "history", "user"]
    assert "by source (each of its own prompt tokens): system n/a, history n/a, user 0.0%" in render(r)


def test_the_drain_is_said_on_the_window_line():
    r = results()
    r.settings["run"]["duration_s"] = 60
    r.run.duration_s = 64.1
    assert "window 64.1 s (--duration 60 + 4.1 s drain" in render(r)


def test_the_window_line_of_ranks_says_the_workers_are_each_ranks():
    """Merged over ranks, users are the total and workers one rank's: '800 users, 4 workers' read as 4 in all."""
    r = results()
    r.run.workers = 4
    assert "4 workers, seed" in render(r)
    r.run.ranks = 4
    assert f"{r.run.users} users, 4 workers a rank, seed" in render(r)
    r.run.workers = 1  # one, as a --null-io run takes by default: not '1 workers'
    assert f"{r.run.users} users, 1 worker a rank, seed" in render(r)


@pytest.mark.parametrize("source,arrival,said", [
    ("synthetic", "closed", "8 users"), ("synthetic", "poisson", "8 users"), ("sharegpt", "closed", "8 users"),
    ("mooncake", "trace", "open loop at the trace's times"), ("mooncake", "poisson", "open loop (poisson)"),
    ("mooncake", "sequence", "one sequence"), ("handoff", "handoff", "the prefill node's requests")])
def test_the_window_line_names_users_only_where_there_are_some(source, arrival, said):
    """A trace's requests at their times said '200 users' (--users' default, not used there)."""
    r = results()
    r.run.users, r.workload.source, r.workload.arrival, r.run.workers = 8, source, arrival, 2
    assert f"MiB; {said}, 2 workers, seed" in render(r)


def test_an_idle_decode_node_is_told_about_its_prefill_nodes_not_its_users():
    """Issue 38, item 6: a decode node was advised to "raise --users", which means nothing there."""
    rows = [{"in_flight": 0.2}] * 30
    args = ({"issued_in_window": 10, "completed": 10}, 30.0, {"p50": 1.0}, {"p50": 5.0}, 4, rows)
    assert "raise --users" in load_verdict(*args)["advice"]
    decode = load_verdict(*args, arrival="handoff")["advice"]
    assert "prefill nodes' pace" in decode and "raise --users" not in decode


@pytest.mark.parametrize("arrival, knob, not_said, bound_by", [
    ("closed", "raise --users", "--trace-speedup", "the users' pace"),
    ("trace", "raise --trace-speedup", "--users", "the trace's timestamps"),
    ("poisson", "raise --request-rate", "--users", "the arrival rate"),
    ("sequence", "--arrival closed or poisson", "raise", "one request at a time")])
def test_an_idle_run_is_told_the_flag_that_loads_its_own_arrival(arrival, knob, not_said, bound_by):
    """An Azure trace at its times was told "raise --users (or --request-rate, --trace-speedup)", and its warning
    "raise --users": --users makes no user there (ignored, said so before the run)."""
    rows = [{"in_flight": 0.2}] * 30
    advice = load_verdict({"issued_in_window": 10, "completed": 10}, 30.0, {"p50": 1.0}, {"p50": 5.0}, 4, rows,
                          arrival=arrival)["advice"]
    assert knob in advice and not_said not in advice
    r = results()
    r.workload.arrival = arrival
    r.bytes[r.bottom].read = r.bytes[r.bottom].write = 0
    assert any(f"{knob}" in w and not_said not in w for w in warnings_of(r) if "saw no traffic" in w)
    r.load.kind = "users"
    assert f"load: bound by {bound_by}:" in render(r).replace("\n      ", " ")
    from kv_cache.report.compare import comparison_table

    table = comparison_table([("a", r), ("b", r)]).splitlines()
    assert next(line for line in table if line.startswith("load verdict")).count(bound_by.removeprefix("the ")) == 2


def test_a_disk_the_benchmark_moved_nothing_on_reads_as_a_sentence():
    """Issue 38, item 6: the decode node printed "... written 0.00 GB =  the benchmark's"."""
    from dataclasses import replace

    from kv_cache.recorder.sections import DeviceOverBenchmark, DiskTelemetry, TelemetrySummary
    from kv_cache.report.console import telemetry_section

    tele = TelemetrySummary(5, DiskTelemetry("vda", 0, 0, 0, 0, DeviceOverBenchmark(None, None)), [], "off", 8.0,
                            2**30)
    text = "\n".join(telemetry_section(replace(results(), telemetry=tele)))
    assert "=  the benchmark's" not in text and "the benchmark moved nothing there" in text


def _queue(storage_mean_ms: float, cpu_s: float, cores: int = 2, null: bool = False):
    """make run's queue: 4 workers, 30 requests served in 10 s, each waiting 2 s for a worker."""
    return load_verdict({"issued_in_window": 60, "completed": 30, "dropped_at_stop": 0}, 10.0, {"p50": 2000.0},
                        {"p50": storage_mean_ms, "mean": storage_mean_ms}, 4, [{"in_flight": 4}] * 10,
                        cpu_s=cpu_s, cores=cores, null=null)


def test_a_null_tier_is_never_called_the_storage():
    """README's --null-io capacity command said 'QUEUE-BOUND on storage ... a storage result at 4 workers'
    concurrency': a null tier moves no byte, and the time its operations took is the generator's own."""
    v = _queue(storage_mean_ms=1200.0, cpu_s=6.0, null=True)
    assert v["cause"] == "generator" and "null tier" in v["advice"] and "storage result" not in v["advice"]
    calm = load_verdict({"issued_in_window": 30, "completed": 30}, 10.0, {"p50": 1.0}, {"p50": 5.0}, 4,
                        [{"in_flight": 3.5}] * 10, null=True)
    assert calm["kind"] == "storage" and "the numbers are the storage's" not in calm["advice"]
    r = results()
    r.load.kind, r.run.tiers[r.bottom].null = "storage", True
    assert "load: bound by the generator's per-block work (a null tier):" in render(r)
    from kv_cache.report.compare import comparison_table

    row = next(line for line in comparison_table([("a", r), ("b", r)]).splitlines() if line.startswith("load verdict"))
    assert row.count("generator (null tier)") == 2, row


def test_a_queue_of_workers_busy_in_storage_is_a_storage_result_at_that_concurrency():
    """Issue 46, point 6: every quick-start run ended 'QUEUE-BOUND ... the numbers describe the load generator's
    queue' even where the workers spent their time in block I/O: that is the storage's figure at 4 workers."""
    v = _queue(storage_mean_ms=1200.0, cpu_s=6.0)  # 30 x 1.2 s in I/O of 4 x 10 s: 90 %
    assert v["kind"] == "queue" and v["cause"] == "storage"
    assert v["workers_in_io_share"] == pytest.approx(0.9) and v["process_cpu_share"] == pytest.approx(0.3)
    assert "a storage result at the concurrency of 4 workers" in v["advice"]


def test_a_queue_of_a_generator_out_of_cpu_says_so():
    v = _queue(storage_mean_ms=1200.0, cpu_s=19.0)  # 95 % of 2 cores' 10 s
    assert v["cause"] == "cpu" and "ran out of CPU" in v["advice"] and "not the storage" in v["advice"]
    idle = _queue(storage_mean_ms=100.0, cpu_s=4.0)  # neither: the generator's own work or waits
    assert idle["cause"] == "generator" and "storage result" not in idle["advice"]


def test_compare_fits_100_columns_and_shows_the_choices_and_the_verdict():
    """Issue 46, points 6 and 8: compare printed tables 121-141 columns wide (the runs' folders as column names),
    and did not show what each run chose (workers, tier sizes) nor what bound it."""
    from kv_cache.report.compare import comparison_table

    a, b = results(), results()
    b.settings = {**b.settings, "tiers": {**b.settings.get("tiers", {}), "cache_dir": "/x" * 30}}
    text = comparison_table([("reports/20261127T045205Z-4385-with-a-long-name", a),
                             ("reports/20261127T045205Z-4386-with-a-long-name", b)])
    lines = text.splitlines()
    assert all(len(x) <= 100 for x in lines if " " in x.strip()), max(lines, key=len)
    assert any(x.startswith("workers") for x in lines) and any(x.startswith("load verdict") for x in lines)
    assert any(x.startswith("nvme tier GiB") for x in lines)
    assert "run 1: reports/20261127T045205Z-4385-with-a-long-name" in text


def test_compare_of_many_runs_sets_them_beside_the_baseline_in_tables_that_fit():
    """Nine runs in one table wrapped each row over three lines; now as many runs a table as fit beside run 1."""
    from kv_cache.report.compare import comparison_table

    lines = comparison_table([(f"run-{i}", results()) for i in range(9)]).splitlines()
    rows = [n for n, x in enumerate(lines) if x.startswith("requests / s")]
    assert len(rows) > 1 and all(lines[n + 1].startswith("cached tokens / s") for n in rows), "\n".join(lines)
    heads = [x.split() for x in lines if x.startswith("measure")]
    assert all(h[1:3] == ["run", "1"] for h in heads)  # the baseline in each
    shown = sorted(int(h) for head in heads for h in head[3:] if h.isdigit() and h != "1")
    assert shown == sorted(list(range(2, 10)) * 2)  # every other run once, as a column and in its ratio "i / 1"


def test_compare_says_an_mpi_runs_workers_and_tiers_are_each_ranks():
    """An MPI run beside a single process read 'workers 4 | 4', 'cpu tier GiB 1 | 4': its figures are a rank's."""
    from kv_cache.report.compare import comparison_table

    a, b = results(), results()
    b.run.ranks = 4
    rows = {x.split()[0]: x for x in comparison_table([("one", a), ("mpi", b)]).splitlines() if x.strip()}
    assert rows["workers"].split()[1:] == [str(a.run.workers), str(b.run.workers), "x", "4"], rows["workers"]


def test_a_synthetic_runs_pre_run_hit_rate_is_said_to_be_an_estimate():
    """Issue 50, point 5: synthetic users' pre-run figure is a sample of their first requests (a run beat it); its
    analysis counts as many requests as it read, which read as 'all N requests of the trace' (make run printed it)."""
    from kv_cache.report.console import _analysed

    r = results()
    r.workload.trace, r.workload.requests_analysed, r.workload.requests_total = None, 4000, 4000
    assert "an estimate, not a bound" in _analysed(r) and "trace" not in _analysed(r)


def test_compare_gives_the_hit_rate_in_percent_as_every_other_output():
    """compare printed 'token hit rate 0.04375 0.4581' where the summary said 4.4 % and 45.8 %."""
    from kv_cache.report.compare import comparison_table

    a = results()
    row = next(x for x in comparison_table([("a", a), ("b", results())]).splitlines() if x.startswith("token hit"))
    assert row.split()[:5] == ["token", "hit", "rate", "%", f"{100 * a.hit_rate.tokens:.4g}"], row


def test_compare_says_which_run_stopped_early():
    """An interrupted run compared beside a whole one read like any other: its 7.7 s of figures beside 10 s, no word."""
    from kv_cache.report.compare import comparison_table

    a, b = results(), results()
    b.run.partial, b.run.stopped_reason, b.run.duration_s = True, "interrupted", 7.7
    text = comparison_table([("whole", a), ("cut", b)])
    rows = {x.split()[0]: x for x in text.splitlines() if x.strip()}
    assert rows["run"].split()[1:] == ["complete", "PARTIAL", "(interrupted)"], rows["run"]
    assert "run 2 stopped 7.7 s into its measurement (interrupted)" in text
