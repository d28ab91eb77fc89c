"""bench/remote_bench.py's limit for the whole program: the tier alone moving the run's own reads and writes,
mixed, on a real server."""

import valkey
from helpers import bench_module
from servers import valkey_keys

from kv_cache.tiers.valkey import ValkeySettings, open_store

BLOCK = 64 << 10


def calls(url: str) -> dict[str, int]:
    stats = valkey.Valkey.from_url(url).info("commandstats")
    return {op: stats.get(f"cmdstat_{op}", {}).get("calls", 0) for op in ("get", "set")}


def test_the_whole_program_s_limit_moves_the_run_s_own_reads_and_writes_and_leaves_nothing(valkey_server):
    """The whole program's row had no limit ('-'): at 32 MiB it read 0.63 and wrote 0.16 GB/s where the tier
    alone read 2.48 and wrote 1.55 in phases of their own, a third of it on paper; the same mix through the tier
    alone moved 1.41 GB/s against the run's 1.06. The limit must move exactly the run's reads and writes (the
    writes to new keys), and leave the server as it found it."""
    remote_bench = bench_module("remote_bench")
    whole = {"read": {"bytes": 7 * BLOCK}, "write": {"bytes": 5 * BLOCK}}
    before = calls(valkey_server.url)
    store = open_store(valkey_server.url, ValkeySettings(), 3)
    limit = remote_bench.whole_limit(store, "valkey", whole, 3, BLOCK)
    after = calls(valkey_server.url)
    assert (limit["reads"], limit["writes"], limit["threads"]) == (7, 5, 3)
    assert after["get"] - before["get"] == 7
    assert after["set"] - before["set"] == 1 + 7 + 5  # the namespace marker; the keys the reads find; the new ones
    assert abs(limit["gbps"] - limit["read_gbps"] - limit["write_gbps"]) < 1e-9
    assert valkey_keys(valkey_server.url) == []
    idle = {"read": {"bytes": 0}, "write": {"bytes": 0}}
    assert remote_bench.whole_limit(open_store(valkey_server.url, ValkeySettings(), 1), "valkey", idle, 1, BLOCK) \
        is None
