"""The recorder: warm-up excluded, shards merged, snapshots serialise and merge exactly."""

import threading

import pytest

from kv_cache.recorder.recorder import Recorder, Snapshot
from kv_cache.types import RequestOutcome

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


@pytest.mark.parametrize("traced", [True, False])
def test_a_batch_s_blocks_recorded_together_are_recorded_as_one_at_a_time(traced):
    """ops() (a batch's blocks, one call) leaves what op() a block leaves, in the window and in warm-up: every
    counter, series and latency; with an I/O trace, a line a block in order (without one, op() takes its own path:
    no lists made for an eviction's one op)."""
    from kv_cache.recorder.histogram import value_at

    class Trace:
        def __init__(self):
            self.lines = []

        def op(self, *args):
            self.lines.append(args)

    batch = [(1_000 + 7 * i, 4096 * (1 + i % 3), i) for i in range(40)]
    got = []
    for together in (False, True):
        r = Recorder()
        r.io_trace = Trace() if traced else None
        r.start_measuring(10 * S)
        for start in (9 * S, 11 * S, 12 * S + 5):  # a batch in warm-up, two in the window
            if together:
                r.ops("nvme", "read", "load", start, batch)
            else:
                for dur, nbytes, key in batch:
                    r.op("nvme", "read", "load", start, dur, nbytes, key)
        snap = r.snapshot()
        h = snap.hists[("nvme", "read", "load")]
        got.append((dict(snap.counters), {k: dict(v) for k, v in snap.series.items()}, h.get_total_count(),
                    [value_at(h, q) for q in (50, 95, 99)], r.io_trace.lines if traced else []))
    assert got[0] == got[1]
    assert got[1][0]["ops.nvme.read"] == 80 and got[1][0]["warmup.ops"] == 40
    assert len(got[1][4]) == (120 if traced else 0)


@pytest.mark.parametrize("traced", [True, False])
@pytest.mark.parametrize("op", ["evict", "write"])
def test_ops_each_with_its_own_start_are_recorded_as_one_at_a_time(traced, op):
    """ops_each() (a batch's evictions, each started at its own time) leaves what op() each leaves: ops that straddle
    the window's start and a second's end count in warm-up and in each their own second, every counter, series and
    latency; with an I/O trace, a line each with its own start."""
    from kv_cache.recorder.histogram import value_at

    class Trace:
        def __init__(self):
            self.lines = []

        def op(self, *args):
            self.lines.append(args)

    starts = [10 * S - 3, 10 * S + 5, 11 * S - 1, 11 * S, 11 * S + 9, 12 * S + 1]
    done = [(start, 500 + 13 * i, 4096 * (1 + i % 2), i + 1) for i, start in enumerate(starts)]
    got = []
    for together in (False, True):
        r = Recorder()
        r.io_trace = Trace() if traced else None
        r.start_measuring(10 * S)
        if together:
            r.ops_each("nvme", op, "evict", done)
        else:
            for start, dur, nbytes, key in done:
                r.op("nvme", op, "evict", start, dur, nbytes, key)
        snap = r.snapshot()
        h = snap.hists[("nvme", op, "evict")]
        got.append((dict(snap.counters), {k: dict(v) for k, v in snap.series.items()}, h.get_total_count(),
                    [value_at(h, q) for q in (50, 99)], r.io_trace.lines if traced else []))
    assert got[0] == got[1]
    assert got[1][0][f"ops.nvme.{op}"] == 5 and got[1][0]["warmup.ops"] == 1
    assert {sec: row["ops"] for sec, row in got[1][1].items()} == {0: 2, 1: 2, 2: 1}


def test_requests_count_when_they_complete_in_the_window():
    r = Recorder()
    r.start_measuring(10 * S)
    r.request(1 * S, 2 * S, 12 * S, 5, RequestOutcome(100, 0))  # issued in warm-up, done in the window
    r.request(1 * S, 2 * S, 3 * S, 5, RequestOutcome(50, 0))    # done in warm-up
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
    assert all(c.attainment is None and c.met is None for c in res.qos.classes.values())
    assert res.qos.all_met is None
    assert (res.bandwidth_gbps["cpu"].read, res.bandwidth_gbps["cpu"].write) == (0.0, 0.0)


def test_bulk_recording_lands_in_the_same_buckets_as_one_value_at_a_time():
    """record_many (numpy) against hdrh's own record_value: same counts per bucket, total, min and max,
    values clamped alike (0 and negatives to 1 ns, above an hour to an hour), bucket edges included."""
    import numpy as np

    from kv_cache.recorder.histogram import (
        SECOND_HIGHEST_US,
        encode,
        new_histogram,
        new_second_histogram,
        record,
        record_many,
    )

    rng = np.random.default_rng(3)
    edges = [0, -7, 1, 2, 1023, 1024, 1025, 2047, 2048, 2**40 - 1, 2**40, 3_600 * S, 10**15]
    values = np.concatenate([rng.integers(1, 10**6, 3000), rng.integers(1, 3_600 * S, 3000), edges])
    one, bulk = new_histogram(), new_histogram()
    for v in values:
        record(one, int(v))
    record_many(bulk, values)
    assert encode(bulk) == encode(one)
    assert (bulk.get_total_count(), bulk.get_min_value(), bulk.get_max_value()) == \
        (one.get_total_count(), one.get_min_value(), one.get_max_value())
    few = new_histogram()  # a few values a call (a fold's per second, a block's layer units): each added where it
    for at in range(0, values.size, 7):  # falls, a value twice in one call counted twice
        record_many(few, np.concatenate([values[at:at + 7], values[at:at + 1]]))
    for v in values[::7]:
        record(one, int(v))
    assert encode(few) == encode(one)
    one, bulk = new_second_histogram(), new_second_histogram()
    micros = rng.integers(1, 10**8, 2000)
    for v in micros:
        one.record_value(int(v))
    record_many(bulk, micros, 1, SECOND_HIGHEST_US)
    assert encode(bulk) == encode(one)


def test_buffered_block_latencies_are_all_in_every_read():
    """Block latencies wait in a thread's buffer until FOLD_AT of them: a snapshot or a live percentile taken
    before that still sees every one (a read that skipped the fold would miss them)."""
    from kv_cache.recorder.recorder import FOLD_AT

    r = Recorder()
    r.start_measuring(1)
    for i in range(FOLD_AT // 2):
        r.op("nvme", "read", "load", 2 + i, 1_000_000 + i, 4096)
    assert r.recent_percentile("nvme", "read", 50.0) is None  # second 0 is still running
    snap = r.snapshot()
    assert snap.hists[("nvme", "read", "load")].get_total_count() == FOLD_AT // 2
    assert snap.second_hists[(0, "nvme", "read")].get_total_count() == FOLD_AT // 2
    r.op("nvme", "write", "prefill", 2, 2_000_000, 4096)
    r.op("nvme", "evict", "evict", 2, 5_000, 4096)
    snap = r.snapshot()
    assert snap.hists[("nvme", "write", "prefill")].get_total_count() == 1
    assert snap.hists[("nvme", "evict", "evict")].get_total_count() == 1
    assert snap.second_hists[(0, "nvme", "write")].get_total_count() == 1  # evictions have no per-second row
    assert snap.hists[("nvme", "read", "load")].get_total_count() == FOLD_AT // 2  # folded once, not twice


def test_a_block_s_io_units_are_buffered_with_the_blocks_and_have_no_per_second_row():
    """io_units (--io-unit layer: a block's layer-group I/Os) wait in the thread's buffer as block latencies do
    (a numpy pass a block cost ~20 us): every unit in its <op>_io histogram at the next read, in the window only,
    never in the per-second rows (those are the blocks'), and the buffer counts them toward its fold."""
    from kv_cache.recorder.recorder import FOLD_AT

    r = Recorder()
    r.io_units("nvme", "read", "load", 0, [(50_000, 16384)] * 4)  # warm-up: nothing
    r.start_measuring(1)
    r.op("nvme", "read", "load", 2, 1_000_000, 32 * 16384)
    r.io_units("nvme", "read", "load", 2, [(40_000 + i, 16384) for i in range(32)])
    assert r._shard().npending == 33  # buffered, not recorded one block at a time
    snap = r.snapshot()
    assert snap.hists[("nvme", "read_io", "load")].get_total_count() == 32
    assert snap.second_hists[(0, "nvme", "read")].get_total_count() == 1
    assert not any(op.endswith("_io") for _, _, op in snap.second_hists)
    for _ in range(FOLD_AT // 32):
        r.io_units("nvme", "read", "load", 2, [(40_000, 16384)] * 32)
    assert r._shard().npending < FOLD_AT  # folded when FOLD_AT wait, units among them


def test_ops_that_move_no_bytes_have_no_per_second_row():
    """A NIXL prefill node's wait for room in its handoff space and an eviction are timed ops with no direction:
    the per-second read and write rows are the bytes' (a wait was counted as a write there)."""
    r = Recorder()
    r.start_measuring(1)
    r.op("handoff", "wait", "prefill", 2, 5_000_000, 1 << 20)
    r.op("nvme", "evict", "evict", 2, 3_000, 1 << 20)
    r.op("nvme", "write", "prefill", 2, 1_000_000, 1 << 20)
    snap = r.snapshot()
    assert snap.hists[("handoff", "wait", "prefill")].get_total_count() == 1
    assert set(snap.second_hists) == {(0, "nvme", "write")}
    assert snap.second_hists[(0, "nvme", "write")].get_total_count() == 1


def test_buffered_latencies_from_many_threads_add_up_exactly_with_a_reader_folding_meanwhile():
    from kv_cache.recorder.recorder import FOLD_AT

    r = Recorder()
    r.start_measuring(1)
    per_thread = FOLD_AT * 12 + 17
    done = threading.Event()

    def work():
        for i in range(per_thread):
            r.op("cpu", "write", "decode", 2, 1000 + i, 8)

    def read():
        while not done.is_set():
            r.recent_percentile("cpu", "write", 50.0)  # folds every thread's buffer, as the live line does

    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes: a fold without the lock loses values
    try:
        reader = threading.Thread(target=read)
        reader.start()
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        reader.join()
    finally:
        sys.setswitchinterval(interval)
    snap = r.snapshot()
    assert snap.hists[("cpu", "write", "decode")].get_total_count() == 4 * per_thread
    assert snap.second_hists[(0, "cpu", "write")].get_total_count() == 4 * per_thread
    assert snap.counters["ops.cpu.write"] == 4 * per_thread
