"""The hit rates a run reports, checked against an independent reference simulator.

The simulator is written from the definition of a prefix cache, not from the cache's code: a
block is hit-able only when every block before it in its request is cached; a lookup stops at
the first miss; a missed block is written only if the block before it is cached; when full,
the least recently used block among those with no cached child (tails first) is evicted, and
never the parent of the block being written. It replays the same block sequence as a real run
(one worker, --null-io, requests back to back), on synthetic multi-turn users and on the
Mooncake trace sample, at several capacities; the run's block hit count must equal it exactly.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO, SMALL, run_cli
from found import REGISTRY, SECTIONS

from kv_cache.cache.hashing import chain_root
from kv_cache.config import resolve
from kv_cache.lifecycle.plan import Planner
from kv_cache.run.geometry import chain_id, geometry
from kv_cache.run.traffic import build_traffic

pytestmark = pytest.mark.slow  # make test-all (CI); make test stays quick

MOONCAKE = REPO / "traces" / "mooncake_conversation_sample.jsonl"
REQUESTS = 150


class ReferencePrefixLRU:
    """Infinite (capacity None) or finite prefix cache with tail-first LRU, by the definition."""

    def __init__(self, capacity: int | None):
        self.capacity = capacity
        self.parent: dict[int, int | None] = {}  # cached block -> the block before it
        self.used: dict[int, int] = {}           # cached block -> last use
        self.clock = 0
        self.hits = self.lookups = 0

    def _touch(self, key: int) -> None:
        self.clock += 1
        self.used[key] = self.clock

    def request(self, keys: list[int], prompt_blocks: int) -> None:
        self.lookups += prompt_blocks
        hit = 0
        while hit < prompt_blocks and keys[hit] in self.parent:
            self._touch(keys[hit])
            hit += 1
        self.hits += hit
        for i in range(hit, len(keys)):
            self._write(keys[i], keys[i - 1] if i else None)

    def _write(self, key: int, parent: int | None) -> None:
        if key in self.parent or (parent is not None and parent not in self.parent):
            return  # cached already, or unreachable: never stored
        if self.capacity is not None and len(self.parent) >= self.capacity:
            with_child = {p for p in self.parent.values() if p is not None}
            leaves = [k for k in self.parent if k not in with_child and k != parent]
            if not leaves:
                return
            victim = min(leaves, key=self.used.__getitem__)
            del self.parent[victim], self.used[victim]
        self.parent[key] = parent
        self._touch(key)


UNBOUNDED = 1 << 20  # blocks: more than any of these runs writes (the null tier's default 64 GiB is not)


def _args(out, run_id: str, blocks: int | None, extra: list[str]) -> list[str]:
    nvme_gb = repr((blocks or UNBOUNDED) * 2 / 1024)  # 2 MiB blocks, exact in binary
    return ["--config", str(SMALL), "--null-io", "--cpu-mem-gb", "0", "--nvme-gb", nvme_gb, "--policy", "lru",
            "--arrival", "sequence", "--workers", "1", "--max-requests", str(REQUESTS), "--duration", "600",
            "--warmup", "0", "--output-dir", str(out), "--run-id", run_id, "--quiet", "--no-telemetry", *extra]


def _simulate(args: list[str], capacity: int | None) -> ReferencePrefixLRU:
    flags = {"tiers.null_io": True, "tiers.cpu_mem_gb": 0.0, "schedule.arrival": "sequence", "run.seed": 7}
    trace = args[args.index("--trace") + 1] if "--trace" in args else None
    if trace:
        flags["trace.path"] = trace
    s = resolve(str(SMALL), [], flags, media_sections=SECTIONS)
    planner = Planner(s.model.block_tokens,
                      chain_root(chain_id(s, geometry(s))))
    user = build_traffic(s, REGISTRY).users[0]
    sim = ReferencePrefixLRU(capacity)
    for _ in range(REQUESTS):
        req = user.next_request()
        if req is None:
            break
        plan = planner.plan(req)
        sim.request(list(plan.keys), plan.num_prompt_blocks)
    return sim


@pytest.mark.parametrize("traffic", ["synthetic", "mooncake"])
@pytest.mark.parametrize("blocks", [None, 400, 120, 40])
def test_run_hit_rate_equals_the_reference_simulation(tmp_path, traffic, blocks):
    extra = ["--trace", str(MOONCAKE)] if traffic == "mooncake" else []
    args = _args(tmp_path, "r", blocks, extra)
    r = run_cli(args, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    counters = res["snapshot"]["counters"]
    sim = _simulate(args, blocks)  # None: the definition's infinite cache
    assert counters["blocks.lookup"] == sim.lookups
    assert counters["blocks.hit"] == sim.hits, (counters["blocks.hit"], sim.hits, sim.lookups)
    if blocks is not None and blocks <= 120:
        assert sim.hits < _simulate(args, None).hits  # the capacity really binds
    assert sum(t["dead_blocks"] for t in res["occupancy"].values()) == 0
