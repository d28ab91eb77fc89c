"""One place shapes a Results (recorder/results.py: the snapshot and the run's RunFacts), for one process and for
the merge of MPI ranks alike (issue 40, item 4)."""

import dataclasses

from results_fixture import S, facts, run_info

from kv_cache.config import Settings
from kv_cache.recorder.merge import merge_ranks
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.results import SCHEDULED, build_results
from kv_cache.types import RequestOutcome


def rank(r: int, completed: int, abandoned: int):
    rec = Recorder()
    rec.start_measuring(1)
    for i in range(completed):
        rec.request(S // 10, S // 10 + 5, S // 5 + i, 1000, RequestOutcome(32, 4, cached_tokens=16))
    rec.stop_measuring(2 * S)
    scheduled = dict.fromkeys(SCHEDULED, 0) | {"issued": completed + abandoned, "abandoned_at_stop": abandoned}
    return build_results(rec.snapshot(), {**run_info(), "rank": r, "ranks": 2},
                         Settings().to_dict(), dataclasses.replace(facts(), scheduled=scheduled))


def test_every_request_a_rank_issued_is_accounted_for_after_the_merge():
    """The merge of ranks summed the scheduler's counts but abandoned_at_stop: 3 requests abandoned at the drain
    read as still in flight at the end."""
    a, b = rank(0, 4, 1), rank(1, 3, 2)
    assert (a.requests.in_flight_at_end, b.requests.in_flight_at_end) == (0, 0)
    merged = merge_ranks([a, b])
    assert merged.requests.issued == 10 and merged.requests.completed == 7
    assert merged.requests.abandoned_at_stop == 3 and merged.requests.in_flight_at_end == 0


def test_a_request_outcome_is_read_back_under_the_same_names():
    r = rank(0, 2, 0)
    assert (r.tokens.prompt, r.tokens.cached, r.tokens.generated) == (64, 32, 8)
    assert r.hit_rate.tokens == 0.5


def test_a_merged_tier_says_its_description_is_rank_zero_s():
    """Two ranks printed 'tier cpu 1.88 GiB  host RAM arena, 12 slots of 80.00 MiB': the capacity summed over the
    ranks, its slots (and an NVMe tier's folder, ...-r0) one rank's."""
    merged = merge_ranks([rank(0, 1, 0), rank(1, 1, 0)])
    one = rank(0, 1, 0).run.tiers
    for name, tier in merged.run.tiers.items():
        assert tier.capacity_bytes == 2 * one[name].capacity_bytes
        assert tier.description == f"2 ranks, rank 0's: {one[name].description}"


def test_merged_ranks_say_their_hosts_telemetry_against_all_the_ranks_bytes():
    """Two ranks' run said no telemetry at all; each rank's own, kept per rank, held the shared disk's bytes (both
    ranks' I/O) against its own: 2.02x."""
    from kv_cache.recorder.sections import DiskTelemetry, TelemetrySummary
    from kv_cache.report.console import render

    ranks = []
    for r, (dev, ours) in enumerate(((12_000_000_000, 6_000_000_000), (11_900_000_000, 5_900_000_000))):
        one = rank(r, 1, 0)
        one.telemetry = TelemetrySummary(10, DiskTelemetry("vda", dev, dev, ours, ours), [], "no NVML", 20.0 + r,
                                         2.0 * 2**30)
        ranks.append(one)
    merged = merge_ranks(ranks)
    assert merged.telemetry is None and len(merged.telemetry_per_rank) == 2
    said = " ".join(render(merged).split())
    assert ("Telemetry per host (each rank samples its whole host over its window: ranks on one share its figures) "
            "h (ranks 0-1): host CPU 20% busy (mean), memory used peak 2.00 GiB; disk vda (block layer): read 12.00 "
            "GB, written 12.00 GB = read 1.01x, write 1.01x its 2 rank(s)' bytes") in said, said


def test_merged_ranks_say_their_hosts_disk_latency_from_one_ranks_trace():
    """Each rank traced its disk's latency, and the merged run said none of it: now one rank's a host (each rank's
    trace holds every request of the disk, so two added would count each one twice)."""
    from kv_cache.recorder.sections import DeviceLatency, Latency, TelemetrySummary
    from kv_cache.report.console import render

    ranks = []
    for r, host in enumerate(("a", "a", "b")):
        one = rank(r, 1, 0)
        one.run.hosts = [host]
        why = "the block tracepoints are not visible" if r == 0 else ""
        traced = DeviceLatency(why, "eBPF", "vda", Latency(100 + r, p50=1.0 + r, p95=2.0, p99=3.0, max=4.0),
                               None, {"read": 100 + r}, {"read": 1 << 30}, 0)
        one.telemetry = TelemetrySummary(10, None, [], "no NVML", 20.0, 2.0 * 2**30, traced)
        ranks.append(one)
    merged = merge_ranks(ranks)
    said = " ".join(render(merged).split())
    assert ("a (ranks 0-1): host CPU 20% busy (mean), memory used peak 2.00 GiB device latency per block request, ms "
            "(rank 1's trace, every rank's requests: eBPF; a block may be several requests; 101 requests in the whole "
            "run, 0 lost) read 101 requests p50 2.00") in said, said
    assert "b (rank 2): host CPU 20% busy (mean), memory used peak 2.00 GiB device latency per block request, ms " \
           "(eBPF; a block may be several requests; 102 requests in the whole run, 0 lost) read 102 requests p50 " \
           "3.00" in said, said


def test_the_preconditioned_tier_is_named_as_the_tier_written_not_the_storage_under_test():
    """With a remote tier below the NVMe tier (or a decode node's handoff) the summary said "preconditioned: the
    valkey tier written whole": --precondition writes the NVMe tier."""
    from results_fixture import results

    from kv_cache.recorder.sections import Precondition
    from kv_cache.report.console import render

    r = results(tiers=("cpu", "nvme", "valkey"))
    r.precondition = Precondition(2, [1.0, 1.1], 8 << 20, None, None, "nvme")
    assert r.bottom == "valkey" and "preconditioned: the nvme tier written whole in 2 passes" in render(r)
