"""Issue 48: a request's blocks in flight together (--request-io batched), the cache's decisions unchanged."""

from __future__ import annotations

import csv
import threading
import time

import numpy as np
import pytest
from conftest import bounded, run_cli
from found import ENGINES
from helpers import assert_clean_error, bench_module

from kv_cache.cache.cache import BlockCache
from kv_cache.cache.chains import LANDING
from kv_cache.cache.policies.lru import LRUPolicy
from kv_cache.cache.room import MOVING
from kv_cache.errors import RunFault
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.base import BATCHES
from kv_cache.tiers.cpu import CpuTier

SEQUENCE = ["--workers", "1", "--users", "1", "--arrival", "sequence", "--max-requests", "40", "--duration", "600",
            "--warmup", "0", "--cpu-mem-gb", "0.04", "--nvme-gb", "0.1", "--gpu", "off"]


def _ops(path) -> list[tuple[str, str, str]]:
    with open(path, newline="") as f:
        return [(r["op"], r["tier"], r["key"]) for r in csv.DictReader(f)]


def _as(mode: str, args) -> list[str]:
    """args for mode: serial has no batch, and refuses the --max-inflight of one."""
    args = list(args)
    if mode == "serial" and "--max-inflight" in args:
        i = args.index("--max-inflight")
        del args[i:i + 2]
    return [*args, "--request-io", mode]


def _both_ways(small_run, tmp_path, *args: str, env: dict | None = None) -> dict:
    """The same seeded run serial and batched: each mode's (results, its I/O trace's ops, its summary in one line)."""
    runs = {}
    for mode in ("serial", "batched"):
        trace = tmp_path / f"{mode}.csv"
        r = run_cli(small_run(mode, *SEQUENCE, *_as(mode, args), "--io-trace", str(trace), quiet=False),
                    extra_env=env)
        assert r.returncode == 0, r.stderr
        runs[mode] = (small_run.results(mode), _ops(trace), " ".join(r.stdout.split()))
    return runs


TIGHT = ["--cpu-mem-gb", "0.012", "--nvme-gb", "0.024", "--max-inflight", "4", "--max-requests", "60"]


@pytest.mark.slow  # two runs of 40 requests: make test-all (CI); make test stays quick
@pytest.mark.parametrize("tiers", [[], TIGHT], ids=["small tiers", "tiers so tight an ancestor of a batch goes"])
def test_batched_makes_serial_mode_s_cache_decisions_at_depth(small_run, tmp_path, tiers):
    """The same seeded sequence, one worker: batched and serial evict, demote, promote and write the same blocks
    in the same order and hit the same tokens; batched had more than one block in flight, and says so. With tiers
    of 6 and 12 blocks, making room for a batch's block evicts an ancestor of the batch: serial mode had written
    the blocks before it and drops them (and refuses the rest); batched must do the same, not write on."""
    runs = {}
    for mode in ("serial", "batched"):
        trace = tmp_path / f"{mode}.csv"
        r = run_cli(small_run(mode, *SEQUENCE, *_as(mode, tiers), "--io-trace", str(trace), quiet=False))
        assert r.returncode == 0, r.stderr
        runs[mode] = (small_run.results(mode), _ops(trace), r.stdout)
    (serial, s_ops, _), (batched, b_ops, said) = runs["serial"], runs["batched"]
    assert _moves(s_ops) == _moves(b_ops)  # the eviction order into each tier
    assert sorted(s_ops) == sorted(b_ops)  # the same reads and writes; a batch groups a request's I/O by tier
    assert serial["hit_rate"] == batched["hit_rate"] and serial["blocks"] == batched["blocks"]
    assert serial["blocks_write_skipped_by"] == batched["blocks_write_skipped_by"]  # refused alike, for one reason
    assert batched["run"]["request_io"] == "batched" and batched["run"]["max_inflight"] == (4 if tiers else 32)
    assert serial["queue_depth"] == {} and serial["run"]["request_io"] == "serial"
    depth = batched["queue_depth"]
    assert max(k["max"] for tier in depth.values() for k in tier.values()) > 1  # blocks in flight together
    assert "store" in batched["latency_ms"]["cpu"]  # each batch as a whole, beside its blocks' own
    assert f"request I/O: batched, up to {4 if tiers else 32} blocks" in " ".join(said.split())
    assert batched["run"]["tiers"]["nvme"]["batches"].startswith("the direct engine's")


@pytest.mark.parametrize("mode", ["batched", "serial"])
def test_the_blocks_not_written_are_counted_by_why(small_run, mode):
    """Tiers of 6 and 12 blocks under 60 requests of longer prompts: making room for a block evicts an ancestor of
    its chain (its parent left the cache), and the rest of the chain follows that cut. The console said nothing of
    them (results.json one count): now how many and why, both ways."""
    r = run_cli(small_run(mode, *SEQUENCE, *_as(mode, TIGHT), quiet=False))
    assert r.returncode == 0, r.stderr
    res = small_run.results(mode)
    by = res["blocks_write_skipped_by"]
    assert sum(by.values()) == res["blocks_write_skipped"] and 0 < by["parent_gone"] < by["after_cut"]
    said = " ".join(r.stdout.split())
    assert (f"new blocks not written: {res['blocks_write_skipped']:,} (" + ("" if not by["no_room"] else
            f"no room in any tier {by['no_room']:,} (each slot held for a chain, or in flight); ") +
            f"their parent left the cache first {by['parent_gone']:,} (evicted, often for the chain's own room); "
            f"after an earlier block of their request was refused {by['after_cut']:,}") in said


def test_the_depth_the_device_was_given_is_measured_and_is_the_batch_s(small_run):
    """Batched, as typed (the direct engine, --max-inflight 32), one worker over the NVMe tier alone: a request's hit
    prefix of up to 32 blocks went to the worker's pool of 8 threads, so the device held at most 8 of them at once,
    while results.json gave the batch's blocks as its queue depth (21 on average here). The pool now has a thread
    for each I/O of a batch, started with the tier, and the depth the medium was given is measured beside the blocks
    (each I/O's time in flight, summed, over the batch's time: Little's law), in results.json and the summary."""
    r = run_cli(small_run("q", *SEQUENCE, "--cpu-mem-gb", "0", quiet=False))
    assert r.returncode == 0, r.stderr
    res = small_run.results("q")
    load = res["queue_depth"]["nvme"]["load"]
    assert res["run"]["io_engine"] == "direct" and load["max"] > 8  # a batch asked for more than 8 blocks
    # measured, and never more than a batch's blocks at once: the time average of each batch is at most its blocks
    assert 1 < load["in_flight_mean"] <= load["mean"] + 0.05 and load["in_flight_p95"] <= 32  # (+ a bucket's width)
    said = " ".join(r.stdout.split())
    assert "nvme: the direct engine's: a pool of threads per worker, one for each I/O of its batch (32 threads: " \
           "as many I/Os in flight)" in said
    assert f"nvme load {load['mean']:.1f} blocks a batch (p95 {load['p95']:g}), {load['in_flight_mean']:.1f} I/Os " \
           f"in flight (p95 {load['in_flight_p95']:g})" in said


def test_the_payload_pool_holds_a_copy_for_each_half_of_it_the_workers_lend_at_once(small_run):
    """2 workers of 32 blocks of 2 MiB write 128 MiB at once, as much as one pool holds (4 workers, twice that, copied
    46 % of their payloads over one). The pool has two copies, in the memory budget and said; serial, one."""
    for mode, copies in (("batched", 2), ("serial", 1)):
        r = run_cli(small_run(mode, *bounded(4), "--request-io", mode, quiet=False))
        assert r.returncode == 0, r.stderr
        assert small_run.results(mode)["memory"]["budget"]["payload_pool"] == copies * (128 << 20)
        said = " ".join(r.stdout.split())
        assert ("payload pool: 256 MiB, 2 copies of 128 MiB, for the 128 MiB of new blocks the workers write at once"
                in said) == (copies == 2), said


@pytest.mark.slow  # a run and the bench's module: make test-all (CI)
def test_the_tier_s_depth_is_in_results_and_e2e_bench_s_fio_runs_at_it(small_run):
    """With --io-unit layer a batch of 4 blocks of 32 layer groups is 128 I/Os; the direct engine's pool keeps 64 of
    them in flight (its most). bench/e2e_bench.py ran fio at min(--max-inflight, the engine's most) = 4 a job, 16
    times shallower than the run it compares with: it now reads the depth the tier set up from results.json
    (run.tiers.<tier>.io_depth, the one the --io-trace fio job is written with), and so does its fio of the same
    I/O model (psync, a job for each thread of the pool). Its fio moved whole blocks too, where the run moved layer
    units of 1/32 of one: fio's --bs is now the tier's I/O (run.tiers.<tier>.io_unit_bytes); no p95 of ours is set
    beside fio's clat then (a unit is timed from its batch's submission, fio's from its own)."""
    e2e_bench = bench_module("e2e_bench")
    r = run_cli(small_run("u", *SEQUENCE, "--max-requests", "10", "--cpu-mem-gb", "0", "--io-unit", "layer",
                          "--max-inflight", "4"))
    assert r.returncode == 0, r.stderr
    res = small_run.results("u")
    assert res["run"]["tiers"]["nvme"]["io_depth"] == 64  # 4 blocks x 32 units, the pool's most
    assert "(64 threads: as many I/Os in flight)" in res["run"]["tiers"]["nvme"]["batches"]
    unit = res["run"]["block_bytes"] // 32
    assert res["run"]["tiers"]["nvme"]["io_unit_bytes"] == unit
    figures = e2e_bench.figures(res)
    assert e2e_bench.fio_shape(figures) == ("io_uring", 64, unit)
    assert e2e_bench.threads_shape(figures) == 64  # the same model in fio: a psync job for each of the pool's threads
    row = {"label": "512K", "ours": figures, "fio": {"engine": "io_uring", "jobs": 1, "depth": 64, "gbps": 1.0,
                                                   "read": {"p95": 1.0}, "write": {"p95": 1.0}}}
    assert e2e_bench.p95_ratio(row) is None and e2e_bench.UNITS_NOTE in e2e_bench.tables([row])


def _moves(ops: list[tuple[str, str, str]]) -> dict[tuple[str, str], list[str]]:
    """Each (op, tier)'s keys in order, of the cache's moves: its eviction order into each tier."""
    out: dict = {}
    for op, tier, key in ops:
        if op in ("evict", "demote", "promote"):
            out.setdefault((op, tier), []).append(key)
    return out


@pytest.mark.slow  # two runs on the fake device: make test-all (CI)
def test_hbm_straight_over_nvme_demotes_its_batches_together_in_serial_mode_s_order(small_run, tmp_path):
    """HBM of 5 blocks straight over the NVMe tier (no CPU tier), on the fake device as typed: a batch's demotions
    out of HBM went one by one (no host slots to take them). They land through the worker's scratch, a window at a
    time (one D2H batch into it, one write batch out of it), making serial mode's decisions."""
    runs = _both_ways(small_run, tmp_path, "--gpu", "real", "--gpu-mem-gb", "0.01", "--cpu-mem-gb", "0",
                      "--max-inflight", "8", env={"KVBENCH_FAKE_GPU": "1:2"})
    (serial, s_ops, _), (batched, b_ops, said) = runs["serial"], runs["batched"]
    assert "land in nvme through each worker's pinned scratch, 8 at a time" in said
    assert _moves(s_ops) == _moves(b_ops) and sorted(s_ops) == sorted(b_ops)
    assert ("demote", "nvme") in _moves(b_ops) and "cpu" not in batched["blocks"]
    assert serial["hit_rate"] == batched["hit_rate"] and serial["blocks"] == batched["blocks"]
    assert serial["blocks_write_skipped_by"] == batched["blocks_write_skipped_by"]  # refused alike, for one reason
    assert batched["queue_depth"]["nvme"]["demotions"]["max"] > 1
    assert batched["run"]["tiers"]["gpu"]["transfers"]["device_to_host"]["staged"] == 0  # the scratch is pinned
    assert batched["verification"]["blocks_checked"] > 0 and batched["verification"]["failures"] == 0


@pytest.mark.slow  # two runs: make test-all (CI)
def test_one_file_a_block_moves_its_batches_together_in_serial_mode_s_order(small_run, tmp_path):
    """--nvme-layout file-per-block (LMCache's local disk and the MLPerf reference: a file a block): a batch went one
    block after another. Each block's file is opened, every I/O handed to the engine at once, each file closed:
    the NVMe tier's loads, stores and demotions go deeper than one, making serial mode's decisions."""
    runs = _both_ways(small_run, tmp_path, "--nvme-layout", "file-per-block", "--max-inflight", "8")
    (serial, s_ops, _), (batched, b_ops, said) = runs["serial"], runs["batched"]
    assert ("nvme: the direct engine's: a pool of threads per worker, one for each I/O of its batch (8 threads: "
            "as many I/Os in flight), each block's file opened before") in said
    assert _moves(s_ops) == _moves(b_ops) and sorted(s_ops) == sorted(b_ops)
    assert serial["hit_rate"] == batched["hit_rate"] and serial["blocks"] == batched["blocks"]
    assert serial["blocks_write_skipped_by"] == batched["blocks_write_skipped_by"]  # refused alike, for one reason
    depth = batched["queue_depth"]["nvme"]
    assert depth["load"]["max"] > 1 and depth["demotions"]["max"] > 1
    assert batched["verification"]["blocks_checked"] > 0 and batched["verification"]["failures"] == 0


@pytest.mark.slow  # two runs: make test-all (CI)
@pytest.mark.parametrize("engine", ["direct", "io_uring"])
def test_layer_units_move_in_batches_each_timed_as_serial_mode_times_them(small_run, tmp_path, engine):
    """--io-unit layer (a block as one I/O per layer group, each timed): a batch went one block after another. Every
    unit of every block of a batch goes to the engine at once; each unit's latency runs from the batch's submission
    (as a block's does), and the units counted per operation are serial mode's, with its decisions: where the tier
    cuts the units (the direct engine's pool) and where the engine cuts and times them (io_uring)."""
    if ENGINES[engine].unavailable():
        pytest.skip(f"{engine}: {ENGINES[engine].unavailable()}")
    runs = _both_ways(small_run, tmp_path, "--io-unit", "layer", "--max-inflight", "8", "--io-engine", engine)
    (serial, s_ops, _), (batched, b_ops, said) = runs["serial"], runs["batched"]
    assert "every layer group's I/O of every block in it, each timed" in said
    assert _moves(s_ops) == _moves(b_ops) and sorted(s_ops) == sorted(b_ops)
    assert serial["hit_rate"] == batched["hit_rate"] and serial["blocks"] == batched["blocks"]
    assert serial["blocks_write_skipped_by"] == batched["blocks_write_skipped_by"]  # refused alike, for one reason
    units = {mode: {op: v["count"] for op, v in r["latency_ms"]["nvme"].items() if op.endswith("_io")}
             for mode, (r, *_) in runs.items()}
    assert units["serial"] == units["batched"] and units["batched"]["read_io"] > batched["latency_ms"]["nvme"][
        "read"]["count"]  # each block's reads cut into layer groups
    assert {"read_io", "demote_io"} <= set(units["batched"])
    depth = batched["queue_depth"]["nvme"]
    assert depth["load"]["max"] > 1 and depth["demotions"]["max"] > 1


@pytest.mark.slow  # two runs over a real Valkey server: make test-all (CI)
def test_nvme_over_a_remote_tier_demotes_its_batches_together_in_serial_mode_s_order(small_run, tmp_path,
                                                                                     valkey_server):
    """The NVMe tier of 20 blocks over a Valkey tier: a batch's demotions out of NVMe went one by one (the disk holds
    no host copy to write from). They land through each worker's scratch, a window at a time (one read batch off the
    disk into it, one pipeline out of it), making serial mode's decisions."""
    runs = _both_ways(small_run, tmp_path, "--cpu-mem-gb", "0.02", "--nvme-gb", "0.04", "--max-inflight", "8",
                      "--remote-url", valkey_server.url, "--remote-gb", "0.25")
    (serial, s_ops, _), (batched, b_ops, said) = runs["serial"], runs["batched"]
    assert "demotions out of nvme land in valkey through each worker's scratch, 8 at a time" in said
    assert _moves(s_ops) == _moves(b_ops) and sorted(s_ops) == sorted(b_ops)
    assert ("demote", "valkey") in _moves(b_ops)
    assert serial["hit_rate"] == batched["hit_rate"] and serial["blocks"] == batched["blocks"]
    assert serial["blocks_write_skipped_by"] == batched["blocks_write_skipped_by"]  # refused alike, for one reason
    assert batched["queue_depth"]["valkey"]["demotions"]["max"] > 1
    # measured: each SET of a pipeline outstanding until its replies are read, over the demotions' batch
    assert 0 < batched["queue_depth"]["valkey"]["demotions"]["in_flight_mean"] <= 8
    assert batched["verification"]["blocks_checked"] > 0 and batched["verification"]["failures"] == 0


@pytest.mark.slow  # two runs on the fake device: make test-all (CI)
def test_a_batch_s_demotions_land_together_in_serial_mode_s_order(small_run, tmp_path):
    """HBM of 5 blocks over a CPU tier of 10 and an NVMe tier, on the fake device as typed: each batch's new blocks
    push victims down both tiers. Batched mode moves them as batches (HBM into the CPU tier's slots as one D2H
    batch, the CPU tier's slots into the NVMe engine's batch), deeper than one, and still makes serial mode's
    decisions: the same demotions, evictions and promotions into each tier in the same order, the same hits. The
    blocks a read window promotes go up together too."""
    runs = _both_ways(small_run, tmp_path, "--gpu", "real", "--gpu-mem-gb", "0.01", "--cpu-mem-gb", "0.02",
                      "--max-inflight", "8", env={"KVBENCH_FAKE_GPU": "1:2"})
    (serial, s_ops, _), (batched, b_ops, _) = runs["serial"], runs["batched"]
    assert _moves(s_ops) == _moves(b_ops) and sorted(s_ops) == sorted(b_ops)
    assert {("demote", "cpu"), ("demote", "nvme")} <= set(_moves(b_ops))
    assert serial["hit_rate"] == batched["hit_rate"] and serial["blocks"] == batched["blocks"]
    assert serial["blocks_write_skipped_by"] == batched["blocks_write_skipped_by"]  # refused alike, for one reason
    depth = batched["queue_depth"]
    assert depth["cpu"]["demotions"]["max"] > 1 and depth["nvme"]["demotions"]["max"] > 1
    assert depth["gpu"]["promotions"]["max"] > 1  # a window's promoted blocks written into HBM as one batch
    assert depth["gpu"]["promotions"]["in_flight_mean"] is None  # copies queued on a stream: not timed, not said
    assert "demotions" in batched["latency_ms"]["cpu"] and "demotions" not in serial["latency_ms"]["cpu"]
    assert batched["verification"]["blocks_checked"] > 0 and batched["verification"]["failures"] == 0


@pytest.mark.slow  # two runs on the fake device per layout: make test-all (CI)
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_gds_demotions_and_reads_go_together_in_serial_mode_s_order(small_run, tmp_path, layout):
    """--gds, HBM of 5 blocks straight over the NVMe tier, on the fake device as typed: a batch's demotions and reads
    went one cuFile I/O after another. They go as batches (the paged layout's demotions each gathered into a buffer
    of their own first; the reads each into a landing buffer of their own, promoted from it), deeper than one, and
    the cache still makes serial mode's decisions: the same demotions, evictions and promotions in the same order,
    the same hits, every block read back verified."""
    runs = _both_ways(small_run, tmp_path, "--gpu", "real", "--gds", "--gpu-layout", layout, "--gpu-mem-gb", "0.01",
                      "--cpu-mem-gb", "0", "--max-inflight", "8", env={"KVBENCH_FAKE_GPU": "1:2"})
    (serial, s_ops, _), (batched, b_ops, said) = runs["serial"], runs["batched"]
    assert _moves(s_ops) == _moves(b_ops) and sorted(s_ops) == sorted(b_ops)
    assert ("demote", "nvme") in _moves(b_ops)
    assert "GDS: demotions out of gpu into nvme's slab files, " + (
        "8 blocks' cuFile writes at a time" if layout == "paged" else "every block's cuFile writes") in said
    assert "reads of nvme land in HBM 8 blocks' cuFile reads at a time" in said
    assert "through each worker's pinned scratch" not in said  # it said so, and it never was: GDS moves them
    assert serial["hit_rate"] == batched["hit_rate"] and serial["blocks"] == batched["blocks"]
    assert serial["blocks_write_skipped_by"] == batched["blocks_write_skipped_by"]  # refused alike, for one reason
    assert serial["run"]["gds"]["demoted_blocks"] == batched["run"]["gds"]["demoted_blocks"] > 0
    assert serial["run"]["gds"]["loaded_blocks"] == batched["run"]["gds"]["loaded_blocks"] > 0
    depth = batched["queue_depth"]["nvme"]
    assert depth["demotions"]["max"] > 1 and depth["load"]["max"] > 1  # both ways, a batch at a time
    # the cuFile I/Os timed: the fake device runs them one after another, so at most one in flight
    assert 0 < depth["demotions"]["in_flight_mean"] <= 1 and 0 < depth["load"]["in_flight_mean"] <= 1
    assert batched["run"]["tiers"]["gpu"]["hbm_layout"]["kind"] == layout
    assert batched["verification"]["blocks_checked"] > 0 and batched["verification"]["failures"] == 0


@pytest.mark.slow  # one run on the fake device over a real Valkey server: make test-all (CI)
def test_gds_over_a_remote_tier_runs_as_typed(small_run, valkey_server):
    """--gds with the NVMe tier over a Valkey tier was refused with "drop --null-io" (not given): the link looked
    for the NVMe tier at the bottom only. GDS takes HBM's demotions into the disk and its reads back, the disk's
    own demotions land in Valkey through each worker's scratch, and the shape line says each once."""
    r = run_cli(small_run("g", *SEQUENCE, "--gpu", "real", "--gds", "--gpu-mem-gb", "0.01", "--cpu-mem-gb", "0",
                          "--nvme-gb", "0.04", "--max-inflight", "8", "--remote-url", valkey_server.url,
                          "--remote-gb", "0.25", quiet=False), extra_env={"KVBENCH_FAKE_GPU": "1:2"})
    assert r.returncode == 0, r.stderr
    said, res = " ".join(r.stdout.split()), small_run.results("g")
    assert "demotions out of nvme land in valkey through each worker's pinned scratch, 8 at a time" in said
    assert "demotions out of gpu land in nvme through" not in said  # GDS moves those
    assert res["run"]["gds"]["demoted_blocks"] > 0 and res["run"]["gds"]["loaded_blocks"] > 0
    assert res["queue_depth"]["valkey"]["demotions"]["max"] > 1
    assert res["verification"]["blocks_checked"] > 0 and res["verification"]["failures"] == 0


@pytest.mark.slow  # one run of 2 MiB blocks, 32 of them in flight: make test-all (CI)
def test_a_simulated_gpu_tier_hands_back_the_bytes_its_write_lent(small_run):
    """A batch's writes lend their payloads from whichever of their places in the payload pool is free (32 blocks
    of 2 MiB in flight over a 64 MiB pool take many). A simulated GPU tier holds no bytes: it rebuilt a block it
    demoted at its first place, which the checksum taken at the block's write did not match (31 of 451 blocks read
    back wrong). It rebuilds the place the write came from: every block read back verifies."""
    r = run_cli(small_run("s", "--model", "llama8b", "--block-tokens", "16", "--gpu", "simulated", "--gpu-mem-gb",
                          "0.05", "--cpu-mem-gb", "0", "--nvme-gb", "0.5", "--max-inflight", "16", "--workers", "2",
                          "--users", "4", "--max-requests", "40"))
    assert r.returncode == 0, r.stderr
    res = small_run.results("s")
    assert res["ops"]["nvme"]["demote"] > 0 and res["ops"]["nvme"]["read"] > 0
    assert res["verification"]["blocks_checked"] > 0 and res["verification"]["failures"] == 0


@pytest.mark.slow
def test_a_window_of_max_inflight_bounds_the_depth(small_run):
    r = run_cli(small_run("w", *SEQUENCE, "--max-inflight", "2"))
    assert r.returncode == 0, r.stderr
    depth = small_run.results("w")["queue_depth"]
    assert depth and all(k["max"] <= 2 for tier in depth.values() for k in tier.values())


def test_bad_depth_or_shape_is_one_sentence(small_run):
    assert_clean_error(run_cli(small_run("x", "--max-inflight", "0")), "must be >= 1")
    assert_clean_error(run_cli(small_run("x", "--max-inflight", "-3")), "must be >= 1")
    assert_clean_error(run_cli(small_run("x", "--max-inflight", "5000")), "must be <= 1024")
    assert_clean_error(run_cli(small_run("x", "--request-io", "parallel")), "choose from 'batched', 'serial'")


class _Staggered(CpuTier):
    """A CPU tier whose batch completes its blocks 5 ms apart (a device finishing them one by one)."""

    def get_many(self, items):
        super().get_many(items)
        t0 = time.monotonic_ns()
        return [t0 + (i + 1) * 5_000_000 for i in range(len(items))]


def test_each_block_s_latency_runs_from_its_batch_s_submission_to_its_own_completion():
    """fio's completion latency at depth N: a batch of three, completing 5, 10 and 15 ms after submission, records
    three block reads of at least 5, 10 and 15 ms, and the batch (op load) as a whole."""
    rec = Recorder()
    rec.start_measuring(0)
    tier = _Staggered(8 << 20, 1 << 20)
    cache = BlockCache([tier], LRUPolicy, False, rec)
    data = np.zeros(1 << 20, np.uint8)
    for k in (1, 2, 3):
        cache.commit_write(cache.reserve_write(k, 1 << 20, "user"), data, "prefill", data)
    entries = cache.pin_prefix([1]) + cache.pin_prefix([2]) + cache.pin_prefix([3])
    got = cache.read_batch(entries, [np.zeros(1 << 20, np.uint8) for _ in entries], "load")
    assert got == [0, 0, 0]
    snap = rec.snapshot()
    reads = snap.hists[("cpu", "read", "load")]
    assert reads.get_total_count() == 3 and reads.get_min_value() >= 5_000_000
    assert reads.get_max_value() >= 15_000_000
    assert snap.hists[("cpu", "load", "load")].get_total_count() == 1
    assert snap.hists[("depth", "cpu", "load")].get_max_value() == 3


class _Gone(CpuTier):
    """A tier with a batch path whose batch call raises (its server went away mid-run)."""

    flags = CpuTier.flags | {BATCHES}

    def put_many(self, items):
        raise RunFault("the server stopped answering")


def _settled(cache) -> bool:
    """No block is left waiting for bytes that will never come (a reader would wait on it for ever)."""
    return not cache.landing and not cache.promoting and all(
        e.state not in (LANDING, MOVING) for e in cache.index.values())


def test_a_batch_call_that_raises_strands_no_demotion_or_promotion():
    """A server gone mid-run: the batch of demotions into it raises as a whole, and so does a window's batch of
    promotions into the top tier. Each block is dropped (as a failed serial move), the failure raised, and no block
    stays landing: a reader waited for one for ever (a run killed its Valkey server and hung in its drain)."""
    rec, data, size = Recorder(), np.zeros(1 << 20, np.uint8), 1 << 20
    cache = BlockCache([CpuTier(2 * size, size), _Gone(8 * size, size)], LRUPolicy, True, rec)
    for k in (1, 2):
        cache.commit_write(cache.reserve_write(k, size, "user"), data, "prefill", data)
    placed = cache.place_writes([(k, size, "user", None) for k in (3, 4)], [data, data], "prefill", data)
    with pytest.raises(RunFault):
        cache.commit_batch(placed, [data, data], "prefill")
    assert _settled(cache) and 1 not in cache.index and 2 not in cache.index
    top = _Gone(2 * size, size)
    cache = BlockCache([top, CpuTier(8 * size, size)], LRUPolicy, True, rec)
    for k in (1, 2, 3):  # 1 goes down to the CPU tier
        cache.commit_write(cache.reserve_write(k, size, "user"), data, "prefill", data)
    entries = cache.pin_prefix([1])
    assert cache.read_batch(entries, [data], "load") == [1]
    cache.release(entries[0], data, data, defer=True)  # promoted: pending until the window commits
    assert not _settled(cache)
    with pytest.raises(RunFault):
        cache.commit_promotions()
    assert _settled(cache) and 1 not in cache.index


def test_a_batch_s_blocks_under_a_parent_another_worker_dropped_leave_with_it():
    """A batch places block 3 (child of 2) in the lower tier and 4 (child of 3) in the top one, demoting 2 to make
    its room (landing). Another worker then finds 2's parent 1 corrupt and drops it: its cascade passes 2 by (its
    bytes are in flight). When the batch commits, 2 lands orphaned and goes, then 3; 4 was left READY under a
    parent that was leaving (DROPPING), a dead block no lookup could reach. Every block goes, and no tier holds
    a block the index does not."""
    rec, data, size = Recorder(), np.zeros(1 << 20, np.uint8), 1 << 20
    top, low = CpuTier(2 * size, size), CpuTier(8 * size, size)
    cache = BlockCache([top, low], LRUPolicy, False, rec)
    cache.commit_write(cache.reserve_write(1, size, "user"), data, "prefill", data)
    cache.commit_write(cache.reserve_write(2, size, "user", 1), data, "prefill", data)
    placed = cache.place_writes([(3, size, "user", 2), (4, size, "user", 3)], [data, data], "prefill", data)
    assert [r.entry.tier for r in placed] == [1, 0] and cache.index[2].state == LANDING

    def corrupt_parent():  # a reader on another thread finds 1 corrupt
        cache.discard(cache.pin_prefix([1])[0])

    other = threading.Thread(target=corrupt_parent)
    other.start()
    other.join()
    cache.commit_batch(placed, [data, data], "prefill")
    assert not cache.index and cache.occupancy()["cpu"]["dead_blocks"] == 0
    assert top.slots.keys() == [] and low.slots.keys() == [] and cache.used == [0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("request_io", ["batched", "serial"])
def test_blocks_larger_than_a_payload_segment_made_again_in_their_buffers_verify_byte_for_byte(small_run,
                                                                                              request_io):
    """llama70b's blocks of 208 tokens are 65 MiB, past the payload pool's 64 MiB segment (its 256-token blocks,
    80 MiB): a worker makes each in its buffer, by stamping again the one it made there before (no copy from the
    pool) unless a read landed there since. Every block read back (prefix hits, between writes into the same
    buffers) is compared byte for byte."""
    r = run_cli(small_run("l", "--model", "llama70b", "--block-tokens", "208", "--gpu", "off", "--cpu-mem-gb", "0",
                          "--nvme-gb", "1.5", "--workers", "2", "--users", "2", "--request-io", request_io,
                          "--verify", "full", *bounded(24)), timeout=300)
    assert r.returncode == 0, r.stderr
    res = small_run.results("l")
    assert res["ops"]["nvme"]["write"] > 4 and res["ops"]["nvme"]["read"] > 0
    assert res["verification"]["blocks_checked"] > 0 and res["verification"]["failures"] == 0


@pytest.mark.slow  # six runs of 400 requests (about 2 minutes of a 2-core machine): make test-all, as CI runs it
@pytest.mark.parametrize("tiers", [["--gpu", "off"], ["--gpu", "simulated", "--gpu-mem-gb", "0.02"]],
                         ids=["cpu-nvme", "gpu-cpu-nvme"])
def test_workers_batching_through_full_tiers_leave_no_block_behind(small_run, tiers):
    """Four workers write and promote through full memory tiers at once (a tier of 25 blocks of 2 MiB over the NVMe
    tier of 150). A block of one worker's batch dropped while its bytes were still owed was deleted by another
    worker's trash while its own worker wrote it, a batch took another worker's write of a key written again, and
    a batch's trash was emptied before its upper tier's demotions had landed: each left bytes in a tier that no
    index entry counted, until a write met a full tier (TierFull) or a demotion a block that was gone (KeyError),
    in 3 runs of 4 (issue 48). Three runs each, every one clean and its every read block checked."""
    for run in range(3):
        r = run_cli(small_run(f"w{run}", "--model", "llama8b", "--block-tokens", "16", "--workers", "4", "--users",
                              "30", "--cpu-mem-gb", "0.05", "--nvme-gb", "0.3", "--seed", str(run), *tiers,
                              *bounded(400)), timeout=300)
        assert r.returncode == 0, r.stderr
        res = small_run.results(f"w{run}")
        assert res["snapshot"]["counters"].get("ops.nvme.demote", 0) > 0  # the memory tiers were full
        assert not [t for t, o in res["occupancy"].items() if o["dead_blocks"]]  # every cached block reachable
