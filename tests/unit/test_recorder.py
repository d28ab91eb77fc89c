"""The recorder: warm-up excluded, shards merged, snapshots serialise and merge exactly."""

import threading

from kv_cache.recorder.recorder import Recorder, Snapshot

S = 1_000_000_000


def test_warmup_operations_are_counted_apart():
    r = Recorder()
    r.op("cpu", "write", "prefill", 5, 100, 4096)  # before measuring starts
    r.start_measuring(10 * S)
    r.op("cpu", "write", "prefill", 9 * S, 100, 4096)  # started in warm-up
    r.op("cpu", "write", "prefill", 11 * S, 300, 4096)
    snap = r.snapshot()
    assert snap.counters["warmup.ops"] == 2
    assert snap.counters["ops.cpu.write"] == 1
    assert snap.counters["bytes.cpu.write"] == 4096
    assert snap.hists[("cpu", "write", "prefill")].get_total_count() == 1
    assert snap.series[1]["bytes.cpu.write"] == 4096


def test_requests_count_when_they_complete_in_the_window():
    r = Recorder()
    r.start_measuring(10 * S)
    r.request(1 * S, 2 * S, 12 * S, 5, {"tokens.prompt": 100})  # issued in warm-up, done in the window
    r.request(1 * S, 2 * S, 3 * S, 5, {"tokens.prompt": 50})    # done in warm-up
    snap = r.snapshot()
    assert snap.counters["requests.completed"] == 1
    assert snap.counters["tokens.prompt"] == 100
    assert snap.hists[("request", "e2e", "all")].get_max_value() >= 11 * S * 0.999


def test_shards_from_many_threads_add_up():
    r = Recorder()
    r.start_measuring(1)

    def work():
        for i in range(1000):
            r.op("nvme", "read", "load", 2 + i, 1000 + i, 8192)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = r.snapshot()
    assert snap.counters["ops.nvme.read"] == 4000
    assert snap.counters["bytes.nvme.read"] == 4000 * 8192
    assert snap.hists[("nvme", "read", "load")].get_total_count() == 4000


def test_snapshot_round_trip_and_merge():
    a, b = Recorder(), Recorder()
    a.start_measuring(1)
    b.start_measuring(1)
    a.op("cpu", "read", "load", 5, 10, 1)
    b.op("cpu", "read", "load", 5, 20, 2)
    sa = Snapshot.from_dict(a.snapshot().to_dict())
    m = sa.merge(b.snapshot())
    assert m.counters["bytes.cpu.read"] == 3
    assert m.hists[("cpu", "read", "load")].get_total_count() == 2


def test_rates_over_empty_denominators_are_null():
    r = Recorder()
    r.start_measuring(1)
    r.stop_measuring(2 * S)
    from results_fixture import results

    res = results(r, tiers=("cpu",))
    assert res.hit_rate.tokens is None and res.hit_rate.blocks is None
    assert all(c["attainment"] is None and c["met"] is None for c in res.qos["classes"].values())
    assert res.qos["all_met"] is None
    assert (res.bandwidth_gbps["cpu"].read, res.bandwidth_gbps["cpu"].write) == (0.0, 0.0)
