"""The memory budget is computed before the run and refused with numbers."""

import gc
import json
import pickle
import threading
import tracemalloc

import pytest
from found import REGISTRY, SECTIONS
from results_fixture import facts, run_info

from kv_cache.config import Settings, resolve
from kv_cache.errors import UserError
from kv_cache.lifecycle.payload import POOL_SPAN_BYTES, SEGMENT_BYTES
from kv_cache.recorder.merge import merge_ranks
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.results import build_results, timeseries
from kv_cache.run.budget import BOOKKEEPING_BYTES, USER_BYTES, MemoryBudget, check_fits, timeseries_bytes
from kv_cache.run.geometry import geometry
from kv_cache.run.sizing import batch_depth, demotion_depth, memory_budget, payload_copies
from kv_cache.types import RequestOutcome

GiB = 2**30


def test_budget_parts():
    s = resolve(None, [], {"tiers.cpu_mem_gb": "2", "schedule.workers": "4"}, media_sections=SECTIONS)
    b = memory_budget(s, geometry(s), REGISTRY)
    assert b.cpu_tier_bytes == 25 * 80 * 2**20  # whole 80 MiB slots that fit in 2 GiB
    # workers x (2 + 2) x one llama70b block: its buffer, its scratch, and 2 blocks in flight (batched request I/O:
    # --max-inflight 32 bounded by a worker's 160 MiB of batch buffers)
    assert b.staging_bytes == 4 * (2 + 2) * 80 * 2**20
    serial = resolve(None, [], {"tiers.cpu_mem_gb": "2", "schedule.workers": "4", "schedule.request_io": "serial"},
                     media_sections=SECTIONS)
    assert memory_budget(serial, geometry(serial), REGISTRY).staging_bytes == 4 * 2 * 80 * 2**20
    # cpu 2 GiB, nvme auto (at most 64 GiB) at 80 MiB slots: their blocks' bookkeeping; --gpu auto with no GPU builds
    # no GPU tier: its 16 GiB of blocks are counted where one may be built (a GPU backend) or is simulated
    assert b.bookkeeping_bytes == (25 + 819) * BOOKKEEPING_BYTES
    assert memory_budget(s, geometry(s), REGISTRY, object()).bookkeeping_bytes == (204 + 25 + 819) * BOOKKEEPING_BYTES
    sim = resolve(None, [], {"tiers.cpu_mem_gb": "2", "schedule.workers": "4", "tiers.gpu": "simulated"},
                  media_sections=SECTIONS)
    assert memory_budget(sim, geometry(sim), REGISTRY).bookkeeping_bytes == (204 + 25 + 819) * BOOKKEEPING_BYTES
    assert b.gpu_staging_bytes == 0  # no real GPU tier
    pages = 80 * 2**20 // 4096  # the tags, each of the 16 places' up to a 64 MiB segment, 4 workers' check rows
    assert b.payload_stamps_bytes == pages * 8 + 16384 * 8 * 16 + 4 * pages * 24
    assert b.backlog_bytes == 0  # a closed loop: its users wait for their answers (an open loop's is below)
    # 200 users, each its conversation at the longest (coding and document: 32,768 tokens and an 800-token answer)
    assert b.traffic_bytes == 200 * ((32768 + 800) * 4 + USER_BYTES)
    # 60 s and a 5 s drain, on the cpu and nvme tiers (no GPU tier is built), 4 workers
    assert b.timeseries_bytes == 66 * ((8 + 2 * 10) * 1024 + 4 * (512 + 2 * 512))
    assert b.total_bytes == (b.cpu_tier_bytes + b.staging_bytes + b.payload_pool_bytes + b.overhead_bytes
                             + b.bookkeeping_bytes + b.payload_stamps_bytes + b.backlog_bytes + b.traffic_bytes
                             + b.timeseries_bytes)


def test_the_budget_holds_every_synthetic_user_s_conversation_at_its_longest(tmp_path):
    """Each user keeps its last prompt and answer (its next prompt's history): 5,000 users' sample and run took
    1.56 GiB against a budget of 0.31 that counted none. This process's users only (MPI ranks share them), and none
    where the traffic is not synthetic users."""
    def budget(**sets) -> MemoryBudget:
        s = resolve(None, [], {"schedule.workers": "4", **sets}, media_sections=SECTIONS)
        return memory_budget(s, geometry(s), REGISTRY)

    one = budget(**{"workload.users": "1"}).traffic_bytes
    assert one == (32768 + 800) * 4 + USER_BYTES
    assert budget(**{"workload.users": "5000"}).traffic_bytes == 5000 * one
    chat = budget(**{"workload.users": "10", "workload.profile_mix": "chatbot=1"}).traffic_bytes
    assert chat == 10 * ((16384 + 200) * 4 + USER_BYTES)  # only the profiles the mix uses
    s = resolve(None, [], {"workload.users": "10"}, media_sections=SECTIONS)
    assert memory_budget(s, geometry(s), REGISTRY, ranks=4).traffic_bytes == 3 * one  # users 0, 4, 8 on rank 0
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    trace = resolve(None, [], {"trace.path": str(tmp_path / "t.jsonl")}, media_sections=SECTIONS)
    assert memory_budget(trace, geometry(trace), REGISTRY).traffic_bytes == 0  # its records: trace_bytes


def _busy(rec: Recorder, seconds: int, workers: int, tiers: list[str]) -> None:
    """rec fed `seconds` seconds of every worker (a thread each) moving blocks on every tier and finishing a request."""
    def work() -> None:
        for sec in range(seconds):
            at = (sec + 1) * 10**9 + 1000
            for tier in tiers:
                for op, phase in (("read", "load"), ("write", "prefill"), ("write", "decode"), ("demote", "evict")):
                    rec.ops(tier, op, phase, at, [(2_000_000 + i, 2 << 20, i) for i in range(3)])
                rec.add_bytes(tier, "read", at, 2 << 20)
            rec.request(at - 10**6, at, at + 10**5, 10**6, RequestOutcome(1000, 100, 500), at, "interactive")

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for sec in range(seconds):
        rec.gauge({"queue_depth": 3, **{f"{t}_used_bytes": 1e9 for t in tiers}}, (sec + 1) * 10**9)


def _busy_recorder(seconds: int, workers: int, tiers: list[str]) -> int:
    """tracemalloc's peak over a busy recorder (_busy), then the end of a run: its snapshot, the time series' rows,
    results.json's text."""
    rec = Recorder()
    rec.start_measuring(10**9)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _busy(rec, seconds, workers, tiers)
        snap = rec.snapshot(final=True)  # the run's end: its histograms handed over (pipeline._results)
        json.dumps({"snapshot": snap.to_dict(), "timeseries": timeseries(snap, tiers)})  # its text: in the peak
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("workers,tiers", [(1, ["cpu"]), (3, ["cpu", "nvme"]), (6, ["gpu", "cpu", "nvme"])])
def test_the_budget_holds_the_time_series_a_busy_recorder_keeps_each_second(workers, tiers):
    """The time series grows with the window: a second's histograms and counters, and their copies at the end. A day
    of it was about 8 GiB no budget counted; its part per second holds what a real recorder takes, and not twice."""
    grown = (_busy_recorder(200, workers, tiers) - _busy_recorder(80, workers, tiers)) / 120
    model = timeseries_bytes(1, len(tiers), workers)
    assert 0.5 * model < grown <= model, (grown, model)


def _rank_zero_merge(seconds: int, tiers: list[str], ranks: int) -> int:
    """tracemalloc's peak over what rank 0 does at the end of an MPI run of `seconds` seconds: every other rank's
    results received (unpickled), all merged, the merged and each rank's results made into their files' text. Under
    gc.disable(): what the merge drops must be freed when it drops it, not when the cycle collector next runs."""
    rec = Recorder()
    rec.start_measuring(10**9)
    _busy(rec, seconds, 2, tiers)
    rec.stop_measuring((seconds + 1) * 10**9)
    info = run_info(tuple(tiers))
    own, *others = [build_results(rec.snapshot(), {**info, "rank": r, "ranks": ranks}, Settings().to_dict(), facts())
                    for r in range(ranks)]
    sent = [pickle.dumps(r) for r in others]
    del rec, others
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        gathered = [own] + [pickle.loads(p) for p in sent]
        for text in (merge_ranks(gathered).to_json(), *(r.to_json() for r in gathered)):
            del text
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        gc.enable()


@pytest.mark.parametrize("ranks,tiers", [(2, ["cpu"]), (4, ["cpu", "nvme"])])
def test_rank_zero_s_merge_of_every_rank_s_time_series_is_in_its_budget(ranks, tiers):
    """Rank 0 merges every rank's results at the end: a day of 16 workers on four tiers over 4 ranks held 20 GiB
    more than its budget counted (hdrh's histograms refer to themselves through their encoder, so each rank's decoded
    snapshot waited for the cycle collector). Its part per second holds a real merge, and only rank 0 counts it."""
    grown = (_rank_zero_merge(150, tiers, ranks) - _rank_zero_merge(50, tiers, ranks)) / 100
    model = timeseries_bytes(1, len(tiers), 2, ranks) - timeseries_bytes(1, len(tiers), 2)
    assert 0.5 * model < grown <= model, (grown, model)
    s = resolve(None, [], {"run.duration_s": "86400"}, media_sections=SECTIONS)
    zero, one = (memory_budget(s, geometry(s), REGISTRY, ranks=ranks, rank=r).timeseries_bytes for r in (0, 1))
    assert zero - one == 86406 * (timeseries_bytes(1, 2, 2, ranks) - timeseries_bytes(1, 2, 2))
    assert one == memory_budget(s, geometry(s), REGISTRY).timeseries_bytes


def test_a_day_s_time_series_is_budgeted_and_its_refusal_says_to_shorten_the_run():
    def budget(duration: str, drain: str = "5") -> MemoryBudget:
        s = resolve(None, [], {"schedule.workers": "16", "tiers.gpu": "simulated", "run.duration_s": duration,
                               "run.drain_s": drain}, media_sections=SECTIONS)
        return memory_budget(s, geometry(s), REGISTRY)

    minute, day = budget("60"), budget("86400")
    assert day.timeseries_bytes == timeseries_bytes(86406, 3, 16) == 86406 * minute.timeseries_bytes // 66
    assert day.total_bytes - minute.total_bytes == day.timeseries_bytes - minute.timeseries_bytes > 5 * GiB
    assert budget("5", "86400").timeseries_bytes == day.timeseries_bytes  # the drain is recorded too
    with pytest.raises(UserError) as e:
        check_fits(MemoryBudget(GiB, GiB, 128 << 20, timeseries_bytes=day.timeseries_bytes), 16, 2 << 20,
                   available=8 * GiB)
    text = " ".join(str(e.value).split())
    assert f"time series {day.timeseries_bytes / GiB:.2f}" in text and "shorten --duration or --drain-s" in text


def test_an_engine_that_maps_the_slab_budgets_each_workers_block_in_its_mapping():
    """--io-engine mmap: a worker's block is resident in the slab's mapping while it moves (4 workers of 80 MiB
    blocks: a run's peak RSS was 0.3 GiB over its budget); the other engines move bytes through counted buffers."""
    def staging(engine: str, nvme: str = "on") -> int:
        s = resolve(None, [], {"tiers.io_engine": engine, "tiers.nvme": nvme, "schedule.workers": "4"},
                    media_sections=SECTIONS)
        return memory_budget(s, geometry(s), REGISTRY).staging_bytes

    assert staging("mmap") - staging("direct") == 4 * 80 * 2**20
    assert staging("buffered") == staging("io_uring") == staging("direct")
    assert staging("mmap", "off") == staging("direct", "off")


def test_the_payload_pool_has_a_copy_for_each_half_of_it_the_workers_lend_at_once():
    """Its bytes in the budget and in the run alike (prepare.build makes the pool with payload_copies)."""
    one = POOL_SPAN_BYTES + SEGMENT_BYTES
    for workers, tokens, request_io, copies in ((4, 16, "batched", 4), (2, 16, "batched", 2), (4, 4, "batched", 1),
                                                 (16, 16, "serial", 1), (4, 256, "batched", 1), (16, 0, "serial", 1)):
        s = resolve(None, [], {"model.name": "llama8b" if tokens < 256 else "llama70b", "model.block_tokens": tokens,
                               "schedule.workers": workers, "schedule.request_io": request_io},
                    media_sections=SECTIONS)
        assert payload_copies(s, geometry(s).io_bytes) == copies, (workers, tokens, request_io)
        assert memory_budget(s, geometry(s), REGISTRY).payload_pool_bytes == copies * one


def test_a_tier_too_large_to_keep_track_of_is_refused_before_anything_is_built():
    s = resolve(None, [], {"tiers.gpu": "simulated", "tiers.gpu_mem_gb": 2**20, "model.name": "llama8b",
                           "model.block_tokens": 4}, media_sections=SECTIONS)
    b = memory_budget(s, geometry(s), REGISTRY)
    assert b.bookkeeping_bytes > (2**20 * GiB // (512 << 10)) * 1000  # 2 G blocks of 512 KiB
    with pytest.raises(UserError, match="bookkeeping .* blocks the tiers can hold.*--block-tokens"):
        check_fits(b, 4, geometry(s).max_object_bytes, available=24 * GiB)


def test_refusal_names_the_numbers_and_a_fix():
    b = MemoryBudget(20 * GiB, 1 * GiB, 128 << 20)
    with pytest.raises(UserError) as e:
        check_fits(b, 4, 128 << 20, available=16 * GiB)
    text = str(e.value)
    assert "CPU tier 20.00" in text and "16.00 GiB available" in text and "lower --cpu-mem-gb" in text


def test_staging_heavy_budget_suggests_fewer_workers_with_what_each_holds():
    """The staging each worker holds is the budget's (a block's buffer, a scratch and a batch in flight), not the 2
    blocks a worker held before batched I/O: the sentence's sum must add up."""
    with pytest.raises(UserError, match="lower --workers") as e:
        check_fits(MemoryBudget(0, 30 * GiB, 128 << 20), 16, 1 * GiB, available=16 * GiB)
    text = " ".join(str(e.value).split())
    assert "staging 16 workers x 1,920.0 MiB = 30.00" in text and "each holds 1.88 GiB of buffers" in text


def test_default_run_fits_a_24_gib_machine():
    s = resolve(None, [], {}, media_sections=SECTIONS)
    b = memory_budget(s, geometry(s), REGISTRY)
    check_fits(b, 4, geometry(s).max_object_bytes, available=24 * GiB)
    assert b.total_bytes < 8 * GiB


def test_a_nixl_prefill_nodes_region_is_a_part_of_the_budget_and_only_its():
    """--disagg-handoff-gb is host memory a NIXL prefill node registers: counted (and in results' budget parts);
    a decode node, or a folder handoff, registers none."""
    def handoff_bytes(role: str, url: str) -> int:
        s = resolve(None, [], {"disagg.role": role, "disagg.handoff": url, "disagg.handoff_gb": "3"},
                    media_sections=SECTIONS)
        b = memory_budget(s, geometry(s), REGISTRY)
        assert b.to_dict()["handoff"] == b.handoff_bytes and b.to_dict()["total"] == b.total_bytes
        return b.handoff_bytes

    assert handoff_bytes("prefill", "nixl://127.0.0.1:5555") == 3 * GiB
    assert handoff_bytes("decode", "nixl://127.0.0.1:5555") == 0
    assert handoff_bytes("prefill", "file:///tmp") == 0


def test_a_real_gpu_tiers_lanes_are_their_own_part_and_their_fix():
    """Each GPU lane pins a buffer of the largest object (workers + 1 lanes): a part of the budget of its own, and
    the refusal names it when it is the largest part (the MLPerf reference's line on a GPU host was killed, not
    refused: 9 lanes x 4.1 GiB)."""
    from kv_cache.tiers.devices import FakeDevice

    s = resolve(None, [], {"tiers.cpu_mem_gb": "0.5", "schedule.workers": "8", "model.block_tokens": "0"},
                media_sections=SECTIONS)
    geo = geometry(s)
    b = memory_budget(s, geo, REGISTRY, FakeDevice())
    assert b.gpu_staging_bytes == 9 * geo.io_bytes
    assert memory_budget(s, geo, REGISTRY).gpu_staging_bytes == 0
    with pytest.raises(UserError, match="GPU lanes' pinned staging .* lower --workers"):
        check_fits(MemoryBudget(0, 1 * GiB, 128 << 20, gpu_staging_bytes=30 * GiB), 8, 1 * GiB, available=16 * GiB)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize("tokens", ["0", "16"])
def test_the_budget_matches_what_a_fake_gpu_run_really_allocates(tmp_path, monkeypatch, tokens):
    """The reference's shape (one object per request, GiB-sized at llama8b) and 2 MiB blocks in batches (the payload
    pool's copies: 3 workers x 32 blocks lent at once, 3 copies) on the fake device: what building the run and its
    workers really makes resident (tiers, lanes, workers' buffers, payload pool and its templates) is the budget's
    allocated parts within 10 %. The fake device's slabs stand in for HBM and are left out."""
    import gc

    from kv_cache.run import prepare, stack
    from kv_cache.tiers.devices import FakeDevice

    dev = FakeDevice(hbm_bytes=4 * GiB)
    monkeypatch.setattr(stack, "open_cupy", lambda: (dev, ""))
    s = resolve(None, [], {"model.name": "llama8b", "model.block_tokens": tokens, "tiers.gpu": "real",
                           "tiers.gpu_mem_gb": "0.25", "tiers.cpu_mem_gb": "0.5", "tiers.nvme_gb": "0.5",
                           "schedule.workers": "3", "tiers.cache_dir": str(tmp_path), "tiers.null_io": "false",
                           "profiles.chatbot.max_context_tokens": "1024", "profiles.coding.max_context_tokens": "1024",
                           "profiles.document.max_context_tokens": "1024"}, media_sections=SECTIONS)
    gc.collect()
    before = _rss()
    b = prepare.build(s, REGISTRY, "budget-check")
    payloads = b.payloads
    try:
        geo = b.geo
        depth = batch_depth(s, geo.io_bytes)  # as the pipeline makes them: each worker's batch arena too
        moves = demotion_depth(s, geo.io_bytes, True)
        bufs = [stack.worker_state(b.tiers, geo.io_bytes, False, depth, moves)() for _ in range(b.workers)]
        for i, w in enumerate(bufs):  # each worker stamps and checks the last part of the largest object once
            last = (geo.max_object_bytes - 1) // geo.io_bytes * geo.io_bytes
            part = w.block[:min(geo.io_bytes, geo.max_object_bytes - last)]
            payloads.fill(i, part, last)
            assert payloads.check(i, part, "stamps", None, last)
        grown = _rss() - before - sum(dev.allocated)
        budget = b.budget
        # the cache's bookkeeping and the requests' backlog grow during the run, up to their parts
        allocated = budget.total_bytes - budget.overhead_bytes - budget.bookkeeping_bytes - budget.backlog_bytes
        assert budget.gpu_staging_bytes == (b.workers + 1) * geo.io_bytes > 0
        assert abs(grown - allocated) <= 0.10 * allocated, (grown, budget.to_dict())
    finally:
        prepare.close(b, True, role_open=False)


def test_the_references_object_per_request_streams_through_buffers_of_one_part():
    """Issue 36: its CLOSED workloads' objects reach 4,196 MiB at llama3.1-8b; held whole, 16 workers needed
    131 GiB of staging. Moved as parts of --io-chunk-mb, the budget grows with workers x part: it fits 24 GiB."""
    s = resolve(None, [], {"model.name": "llama3.1-8b", "model.block_tokens": "0", "schedule.workers": "16",
                           "tiers.cpu_mem_gb": "4"}, media_sections=SECTIONS)
    geo = geometry(s)
    assert geo.max_object_bytes > 4000 * 2**20 and geo.io_bytes == 64 * 2**20 == geo.part_bytes
    b = memory_budget(s, geo, REGISTRY)
    assert b.staging_bytes == 16 * 2 * 64 * 2**20
    check_fits(b, 16, geo.io_bytes, available=24 * GiB)
    assert geometry(resolve(None, [], {"model.block_tokens": "0", "tiers.io_chunk_mb": "40"},
                            media_sections=SECTIONS)).part_bytes == 32 * 2**20
    blocks = geometry(resolve(None, [], {"model.name": "llama8b"},
                              media_sections=SECTIONS))  # blocks: every block one I/O, no parts
    assert blocks.part_bytes == 0 and blocks.io_bytes == blocks.max_object_bytes


def test_hbm_straight_over_a_lower_tier_budgets_each_workers_demotion_window():
    """Issue 48: with no CPU tier below HBM, or the NVMe tier over a remote one, a batch's demotions land through
    each worker's scratch, a window of --max-inflight blocks (run/sizing.demotion_depth): the budget counts it, and
    only there."""
    from kv_cache.lifecycle.worker import buffer_bytes
    from kv_cache.tiers.devices import FakeDevice

    base = {"tiers.gpu_mem_gb": "0.25", "schedule.workers": "4", "schedule.max_inflight": "8",
            "model.block_tokens": "16"}
    over = resolve(None, [], {**base, "tiers.cpu_mem_gb": "0"}, media_sections=SECTIONS)
    under = resolve(None, [], {**base, "tiers.cpu_mem_gb": "0.5"}, media_sections=SECTIONS)
    geo = geometry(over)
    each = -(-geo.io_bytes // 4096) * 4096
    staging = {name: memory_budget(s, geo, REGISTRY, gpu).staging_bytes
               for name, s, gpu in (("over", over, FakeDevice()), ("under", under, FakeDevice()), ("none", over, None))}
    assert staging["over"] - staging["under"] == 4 * (8 * each - buffer_bytes(geo.io_bytes)) > 0
    assert staging["none"] == staging["under"]  # no GPU tier: a scratch of one block
    remote = {"tiers.remote_url": "valkey://127.0.0.1:6379/0", "schedule.workers": "4", "schedule.max_inflight": "8",
              "model.block_tokens": "16"}
    disk = resolve(None, [], remote, media_sections=SECTIONS)  # the NVMe tier over a remote one: its window too
    no_disk = resolve(None, [], {**remote, "tiers.nvme": "off"}, media_sections=SECTIONS)
    staging = {name: memory_budget(s, geometry(s), REGISTRY).staging_bytes
               for name, s in (("disk", disk), ("no disk", no_disk))}
    each = -(-geometry(disk).io_bytes // 4096) * 4096
    assert staging["disk"] - staging["no disk"] == 4 * (8 * each - buffer_bytes(geometry(disk).io_bytes)) > 0


def test_an_open_loops_backlog_is_a_part_of_its_budget_and_a_closed_loops_is_not(tmp_path):
    """--max-backlog-gb bounds what the requests issued and not yet done hold (an open loop stops issuing past it):
    the budget counts it where requests arrive on their own clock."""
    t = tmp_path / "t.jsonl"
    t.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    for arrival, trace, counted in (("poisson", "", True), ("trace", str(t), True), ("auto", str(t), True),
                                    ("closed", "", False), ("auto", "", False), ("sequence", "", False)):
        s = resolve(None, [], {"schedule.arrival": arrival, "trace.path": trace, "schedule.max_backlog_gb": "0.5"},
                    media_sections=SECTIONS)
        assert memory_budget(s, geometry(s), REGISTRY).backlog_bytes == (2**29 if counted else 0), arrival


def test_the_budget_s_demotion_window_is_the_one_the_built_stack_lands_through(tmp_path, valkey_server):
    """Issue 48: which demotions land through a worker's scratch is said twice, from the settings for the memory
    budget before any tier exists (demotion_depth) and from the built stack for the landing and the shape line
    (through_scratch): every stack must get one answer. A simulated GPU tier straight over the NVMe tier was a pair
    in the stack and not in the budget (its scratch held one block: its demotions went one by one); --gds over a
    remote tier was refused with a sentence about --null-io, which was not given."""
    from kv_cache.run.site import storage_site
    from kv_cache.run.sizing import demotion_depth, through_scratch
    from kv_cache.run.stack import build_tiers, gds_link
    from kv_cache.tiers.devices import FakeDevice

    answers = {}
    for gpu in ("off", "simulated", "real"):
        for cpu in ("0", "0.05"):
            for below in ("nvme", "nvme+remote", "remote"):
                for gds in (False, True) if gpu == "real" and "nvme" in below else (False,):
                    name = f"{gpu} gpu, cpu {cpu}, {below}{', gds' if gds else ''}"
                    case = tmp_path / str(len(answers))
                    case.mkdir()
                    keys = {"tiers.gpu": gpu, "tiers.gpu_mem_gb": "0.01", "tiers.cpu_mem_gb": cpu,
                            "tiers.nvme": "on" if "nvme" in below else "off", "schedule.workers": "1",
                            "schedule.max_inflight": "8", "model.name": "llama8b", "model.block_tokens": "16",
                            "tiers.gds": str(gds).lower()}
                    if "nvme" in below:
                        keys |= {"tiers.nvme_gb": "0.05", "tiers.cache_dir": str(case)}
                    if "remote" in below:
                        keys |= {"tiers.remote_url": valkey_server.url, "tiers.remote_gb": "0.1"}
                    if gpu == "off":
                        del keys["tiers.gpu_mem_gb"]
                    s = resolve(None, [], keys, media_sections=SECTIONS)
                    geo, device = geometry(s), FakeDevice() if gpu == "real" else None
                    site = storage_site(s, "agree", REGISTRY.engines) if "nvme" in below else None
                    tiers, _ = build_tiers(s, geo, site, REGISTRY, gpu=device, run_id=f"agree{len(answers)}")
                    link = gds_link(s, tiers, device, geo)
                    try:
                        predicted = demotion_depth(s, geo.io_bytes, device is not None) > 1
                        assert predicted == bool(through_scratch(tiers, link)), name
                        answers[name] = predicted
                    finally:
                        if link is not None:
                            link.close()
                        for t in tiers:
                            t.close()
    assert answers["simulated gpu, cpu 0, nvme"] and answers["real gpu, cpu 0, nvme"]
    assert not answers["real gpu, cpu 0, nvme, gds"] and answers["real gpu, cpu 0, nvme+remote, gds"]
    assert not answers["off gpu, cpu 0.05, nvme"]
