"""Issue 18: plots a storage engineer would show a customer, and a time series at the precision it has."""

import numpy as np
from results_fixture import S, results

from kv_cache import runlog
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.sections import Autoscale, TheoreticalHitRate
from kv_cache.recorder.typed import load_section
from kv_cache.report.files import csv_value
from kv_cache.report.plots import (
    draw_hit_rate,
    draw_latency,
    draw_occupancy,
    draw_throughput,
    latency_curves,
    make_plots,
)
from kv_cache.report.plots_control import draw_autoscale, draw_qos
from kv_cache.types import RequestOutcome


def _busy_results():
    r = Recorder()
    r.start_measuring(1)
    for i in range(150):
        r.op("nvme", "read", "load", S // 10 + i, 1_000_000 + 1000 * i, 2 << 20)
    r.op("cpu", "write", "prefill", S // 10, 50_000, 2 << 20)
    for i in range(15):  # per-request latencies: never on the per-block plot
        r.request(S // 10, S // 10 + 10, S // 5 + i, 1000, RequestOutcome(10, 0), ttft_ns=S // 5, qos="interactive")
    r.gauge({"queue_depth": 1, "in_flight": 2, "cpu_used_bytes": 2 << 20, "nvme_used_bytes": 6 << 20}, S // 2)
    r.stop_measuring(3 * S)
    return results(r)


def test_the_per_block_plot_holds_block_operations_at_supported_percentiles_only():
    curves = latency_curves(_busy_results())
    assert set(curves) == {("nvme", "read"), ("cpu", "write")}  # no request, qos.* or semantic curve
    pcts, _, n = curves[("nvme", "read")]
    assert n == 150 and pcts == [50.0, 75.0, 90.0, 95.0, 99.0, 100.0]  # p99.9 needs 1,000 samples
    assert curves[("cpu", "write")][0] == [100.0]  # one sample: its max only
    assert draw_latency(_busy_results()) is not None


def test_qos_targets_are_bars_wide_and_a_zero_attainment_is_labelled():
    res = _busy_results()
    res.qos.classes["interactive"].attainment = 0.0
    fig = draw_qos(res)
    ax1, ax2 = fig.axes
    segments = [s for c in ax1.collections for s in c.get_segments()]
    assert segments and all(abs((s[1][0] - s[0][0]) - 0.4) < 1e-9 for s in segments)  # as wide as a bar
    assert "0.0%" in [t.get_text() for t in ax2.texts]
    assert ax2.get_legend()._bbox_to_anchor is not None  # the legend sits outside the bars


def test_occupancy_in_percent_of_each_tier_and_a_queue_axis_that_does_not_magnify_one_request():
    res = _busy_results()
    res.timeseries = [{"t_s": t, "queue_depth": 1 + t % 2, "in_flight": 2, "cpu_used_bytes": 2 << 20,
                       "nvme_used_bytes": 6 << 20} for t in range(3)]
    ax1, ax2 = draw_occupancy(res).axes
    cpu = ax1.get_lines()[0].get_ydata()
    assert np.allclose(cpu, 100 * (2 << 20) / res.run.tiers["cpu"].capacity_bytes)
    assert ax1.get_ylim() == (0, 105) and ax2.get_ylim()[1] >= 5


def test_requests_per_second_are_smoothed_and_hit_rates_are_labelled():
    res = _busy_results()
    res.timeseries = [{"t_s": t, "requests": t % 3, "ops": 5} for t in range(3)]
    labels = [ln.get_label() for ln in draw_throughput(res).axes[1].get_lines()]
    assert any("moving mean" in x for x in labels)
    res.workload.theoretical_hit_rate = TheoreticalHitRate(0.5, {"system": 1.0, "user": 0.0})
    res.hit_rate.by_source = {"user": 0.0}
    texts = [t.get_text() for t in draw_hit_rate(res).axes[0].texts]
    assert "n/a" in texts and "0.0%" in texts and "100.0%" in texts


def test_timeseries_values_at_the_precision_they_have():
    assert csv_value("nvme_read_p99_ms", 1048.575) == "1000"
    assert csv_value("nvme_read_p50_ms", 0.0123456) == "0.012"
    assert csv_value("nvme_read_gbps", 0.597734121) == "0.5977"
    assert csv_value("host_mem_used_bytes", 953323520.0) == "953323520"
    assert csv_value("hit_rate", None) == "" and csv_value("requests", 3) == "3"


def test_an_autoscaler_curve_without_any_ttft_is_drawn(tmp_path):
    res = _busy_results()
    steps = [{"users": u, "window_s": 1.0, "offered_per_s": 1.0, "requests_per_s": 1.0, "tokens_per_s": 10.0,
              "ttft_p95_ms": None, "attainment": None, "sla_met": False, "classes": {}} for u in (2, 4)]
    res.autoscale = load_section(Autoscale, {"mode": "qos", "pool_users": 4, "best": None, "verdict": "",
                                             "settings": {}, "curve": steps})
    made = make_plots(res, tmp_path, [("autoscale_curve.png", draw_autoscale)])
    assert [p.name for p in made] == ["autoscale_curve.png"]  # a log axis over no value raised at save


def test_a_plot_that_cannot_be_drawn_is_skipped_with_one_warning(tmp_path, capsys):
    def broken(results):
        raise KeyError("no_such_column")
    runlog.open_log(tmp_path / "run.log")
    try:
        made = make_plots(_busy_results(), tmp_path, [("broken.png", broken), ("latency.png", draw_latency)])
    finally:
        runlog.close()
    assert [p.name for p in made] == ["latency.png"]
    err = capsys.readouterr().err.strip().splitlines()  # one sentence, wrapped at 100 columns
    assert all(x.startswith("    ") for x in err[1:]) and all(len(x) <= 100 for x in err)
    said = " ".join(" ".join(err).split())
    assert "broken.png could not be drawn: KeyError" in said and "run.log" in said
    log = (tmp_path / "run.log").read_text()
    assert "Traceback" in log and "no_such_column" in log


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_legends_sit_beside_the_curves_not_on_them():
    """The latency legend covered the NVMe curves and the throughput legend its peak: each is outside its axes."""
    res = _busy_results()
    res.timeseries = [{"t_s": t, "requests": 5, "ops": 50, "nvme_write_gbps": 0.5 + t, "nvme_read_gbps": 0.2,
                       "cpu_write_gbps": 1.0, "cpu_read_gbps": 1.0} for t in range(4)]
    for fig in (draw_latency(res), draw_throughput(res)):
        fig.canvas.draw()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is not None:
                box, area = legend.get_window_extent(), ax.get_window_extent()
                assert not _overlap(box, area), (ax.get_title(), box, area)


def test_the_qos_plot_draws_only_the_percentiles_its_table_shows():
    res = _busy_results()  # 15 interactive requests: p95 needs 20, p99 100: the table prints '-' for both
    assert res.qos.classes["interactive"].requests == 15
    ax1 = draw_qos(res).axes[0]
    heights = [b.get_height() for b in ax1.patches]
    assert heights and all(np.isnan(h) for h in heights)
    assert sum(t.get_text() == "too few\nrequests" for t in ax1.texts) == 2
    labels = [t.get_text() for t in ax1.get_legend().get_texts()]
    assert labels.count("target") == 1 and len(labels) == len(set(labels))  # one target entry, no twin lines
    assert not any(x.startswith("TTFT") for x in labels)  # issue 39, item 8: no legend entry for a bar never drawn


def test_each_tier_has_one_hue_and_each_op_one_marker():
    """Issue 39, item 8: the latency plot reused one colour for two tiers (cpu demote and nvme write)."""
    r = Recorder()
    r.start_measuring(1)
    for tier, op in (("cpu", "write"), ("cpu", "demote"), ("nvme", "write"), ("nvme", "read"), ("cpu", "read"),
                     ("nvme", "promote"), ("cpu", "promote"), ("nvme", "demote")):
        for i in range(20):
            r.op(tier, op, "load", S // 10 + i, 1_000_000 + 1000 * i, 2 << 20)
    r.stop_measuring(3 * S)
    lines = [ln for ln in draw_latency(results(r)).axes[0].get_lines()]
    by_tier, by_op = {}, {}
    for ln in lines:
        tier, op = ln.get_label().split(" (")[0].split()
        by_tier.setdefault(tier, set()).add(ln.get_color())
        by_op.setdefault(op, set()).add(ln.get_marker())
    assert all(len(c) == 1 for c in by_tier.values()) and len(set().union(*by_tier.values())) == len(by_tier)
    assert all(len(m) == 1 for m in by_op.values())


def test_reads_of_a_tier_above_the_storage_say_they_include_demotions():
    """Issue 39, item 8: "cpu read" at a 0 % hit rate was demotion traffic, unlabelled."""
    res = _busy_results()
    res.timeseries = [{"t_s": t, "requests": 1, "ops": 5, "cpu_read_gbps": 1.0} for t in range(3)]
    labels = [ln.get_label() for ln in draw_throughput(res).axes[0].get_lines()]
    assert "cpu read (hits + demotions out)" in labels and "nvme read" in labels


def test_the_compare_plot_puts_higher_and_lower_is_better_on_axes_of_their_own(tmp_path):
    """Issue 39, item 8: one axis mixed ratios where above 1 was better with ratios where it was worse."""
    from kv_cache.report.compare import comparison_plots, draw_comparison

    runs = [("a", _busy_results()), ("b", _busy_results())]
    assert [p.name for p in comparison_plots(runs, tmp_path)] == ["compare_headlines.png"]
    fig = draw_comparison(runs)
    titles = [ax.get_title() for ax in fig.axes]
    assert any(t.startswith("Higher is better") for t in titles) and any(t.startswith("Lower is better")
                                                                          for t in titles), titles


def _curve(model: str, rates: list[float]):
    from kv_cache.recorder.stack_distances import CapacityCurve, CapacityPoint

    points = [CapacityPoint(2 ** i, 2 ** i / 512, r, {"system": r / 2}, r / 2, 1.0, 0.5, 10.0, 5.0, 1e6)
              for i, r in enumerate(rates)]
    return CapacityCurve(model, False, 1.0, "lru", 0, 2 << 20, 100, 1.0, 4, rates[-1], 2, 8, "replayed", points)


def test_a_capacity_curve_of_a_few_percent_fills_its_axis_and_a_long_title_is_whole(tmp_path):
    """Issue 46, point 8: a 4-6 % curve was drawn on a 0-100 % axis (a flat line), and the merged plot's title was
    cut at the figure's edge."""
    from kv_cache.report.capacity import draw_capacity

    res = _busy_results()
    res.capacity_curve = _curve("LRU stack distances of 3 runs merged in wall-clock order; their upper tiers pooled "
                                "(modelled)", [0.04, 0.05, 0.055, 0.06])
    fig = draw_capacity(res)
    top = fig.axes[0].get_ylim()[1]
    assert 6 < top < 10
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.tight_layout()  # as save() lays it out
    renderer = FigureCanvasAgg(fig).get_renderer()
    box, title = fig.bbox, fig.axes[0].title.get_window_extent(renderer)
    assert box.x0 <= title.x0 and title.x1 <= box.x1, (title, box)
