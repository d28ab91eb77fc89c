"""The fleet sub-command as typed (issue 53): N engines and a router over one shared tier, on paper."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, SMALL, run_cli
from helpers import assert_clean_error, sparse_trace

from kv_cache.fleet.results import FleetFile

MOONCAKE = REPO / "traces" / "mooncake_conversation_sample.jsonl"
SYNTHETIC = ["--config", str(SMALL), "--request-rate", "20", "--max-requests", "300", "--gpu-mem-gb", "0.05",
             "--cpu-mem-gb", "0.1"]


def fleet(tmp_path, run_id: str, *args: str, timeout: float = 240):
    r = run_cli(["fleet", *args, "--output-dir", str(tmp_path), "--run-id", run_id], timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r, FleetFile.from_dict(json.loads((tmp_path / run_id / "fleet.json").read_text()))


def by(f: FleetFile) -> dict:
    return {(p.engines, p.router): p for p in f.points}


def figures(p) -> dict:
    """A point's figures without its wall time and router name."""
    d = {k: v for k, v in vars(p).items() if k not in ("seconds", "router")}
    d["shared"] = vars(p.shared)
    return d


@pytest.mark.parametrize("model", ["stack", pytest.param("cache", marks=pytest.mark.slow)])
def test_fleet_sweeps_engines_and_routers_as_typed(tmp_path, model):
    r, f = fleet(tmp_path, "a", *SYNTHETIC, "--engines", "1,4", "--engine-model", model)
    assert f.engine_model == model
    points = by(f)
    assert set(points) == {(n, x) for n in (1, 4) for x in ("least-loaded", "prefix", "round-robin", "session")}
    for p in f.points:  # the tiers split the total between them
        assert p.hit_rate["hbm"] + p.hit_rate["cpu"] + p.hit_rate["shared"] == pytest.approx(p.hit_rate["total"])
        # an unbounded shared tier: its access stream's stack distances give back the hit rate it served
        assert abs(p.shared.infinite_hit_rate - p.hit_rate["shared"]) < 0.02, (p.router, p.engines)
    one = [figures(p) for (n, _), p in points.items() if n == 1]
    assert all(x == one[0] for x in one)  # one engine: every router has the one choice
    local = {x: points[4, x].hit_rate["hbm"] + points[4, x].hit_rate["cpu"] for x in ("round-robin", "session",
                                                                                     "prefix")}
    assert local["session"] > local["round-robin"] and local["prefix"] > local["round-robin"], local
    assert points[4, "prefix"].shared.read_gbps < points[4, "round-robin"].shared.read_gbps
    assert points[4, "round-robin"].requests_max_over_mean <= points[4, "session"].requests_max_over_mean
    assert "Prompt tokens served, by tier" in r.stdout and "The shared tier's demand" in r.stdout
    assert (tmp_path / "a" / "fleet.png").stat().st_size > 5000


@pytest.mark.slow
def test_the_waterfall_alone_serves_what_the_cache_serves(tmp_path):
    """--engine-model stack against the benchmark's own cache on the same traffic (write-through: the same shared
    tier in both): each tier's share within 2.5 points, the total the same (the stack's prefix rule is approximate)."""
    args = [*SYNTHETIC, "--engines", "1,4", "--router", "round-robin,prefix", "--shared-writes", "through"]
    _, cache = fleet(tmp_path, "c", *args, "--engine-model", "cache")
    _, stack = fleet(tmp_path, "s", *args, "--engine-model", "stack")
    assert stack.engine_model == "stack" and cache.engine_model == "cache"
    for key, p in by(cache).items():
        q = by(stack)[key]
        for tier in ("hbm", "cpu", "shared"):
            assert abs(p.hit_rate[tier] - q.hit_rate[tier]) < 0.025, (key, tier, p.hit_rate, q.hit_rate)
        assert p.hit_rate["total"] == pytest.approx(q.hit_rate["total"], abs=1e-9)


def _mooncake_ceiling() -> float:
    """The sample's infinite-cache hit rate at its own 512-token blocks, from its hash ids alone: a block hits when
    an earlier request had the same ids up to it; a lookup stops at its first miss."""
    seen, hit, prompt = set(), 0, 0
    for line in MOONCAKE.read_text().splitlines():
        rec = json.loads(line)
        ids, n = rec["hash_ids"], rec["input_length"]
        prefixes = [tuple(ids[: j + 1]) for j in range(n // 512)]
        for pre in prefixes:
            if pre not in seen:
                break
            hit += 512
        seen.update(prefixes)
        prompt += n
    return hit / prompt


def test_write_through_reaches_the_traces_ceiling_whatever_the_router(tmp_path):
    """Every block is stored as it is made, so with an unbounded shared tier every router and engine count serves
    the trace's whole infinite-cache hit rate, and writes each distinct block once."""
    _, f = fleet(tmp_path, "t", "--model", "llama3.1-8b", "--trace", str(MOONCAKE), "--block-tokens", "512",
                 "--gpu-mem-gb", "1", "--cpu-mem-gb", "2", "--engines", "1,3", "--shared-writes", "through")
    ceiling = _mooncake_ceiling()
    assert ceiling > 0.03
    for p in f.points:
        assert p.hit_rate["total"] == pytest.approx(ceiling, abs=1e-9), (p.engines, p.router)
        assert p.shared.rewrite_blocks == 0
        # one unbounded LRU pool: its access stream's stack distances give back exactly the hits it served
        assert p.shared.infinite_hit_rate == pytest.approx(p.hit_rate["shared"], abs=1e-9), (p.engines, p.router)
    assert len({p.shared.write_blocks for p in f.points}) == 1
    assert {p.router for p in f.points} == {"least-loaded", "prefix", "round-robin"}  # no conversations: no session
    assert f.shared_writes == "through" and f.stream.span_s > 0 and f.stream.requests == 200


@pytest.mark.slow
@pytest.mark.parametrize("writes", ["demote", "through"])
def test_a_bounded_shared_tier_never_holds_more_than_its_capacity(tmp_path, writes):
    _, free = fleet(tmp_path, "u", *SYNTHETIC, "--engines", "3", "--router", "round-robin", "--shared-writes", writes)
    _, bounded = fleet(tmp_path, "b", *SYNTHETIC, "--engines", "3", "--router", "round-robin", "--shared-writes",
                       writes, "--shared-gb", "0.1")
    assert free.points[0].shared.peak_gib > 0.2  # unbounded, it held more
    assert bounded.points[0].shared.peak_gib <= 0.1
    assert bounded.points[0].hit_rate["shared"] < free.points[0].hit_rate["shared"]


def test_a_quiet_fleet_prints_nothing(tmp_path):
    """--quiet ("print nothing but errors") printed the planning, every point and the tables."""
    r, f = fleet(tmp_path, "q", *SYNTHETIC, "--max-requests", "40", "--engines", "2", "--router", "round-robin",
                 "--quiet")
    assert r.stdout == "" and len(f.points) == 1


@pytest.mark.slow
def test_a_seed_gives_the_same_fleet(tmp_path):
    _, a = fleet(tmp_path, "x", *SYNTHETIC, "--engines", "2,5")
    _, b = fleet(tmp_path, "y", *SYNTHETIC, "--engines", "2,5")
    assert [figures(p) for p in a.points] == [figures(p) for p in b.points]


@pytest.mark.parametrize("args,fragments", [
    (["--engines", "0"], ["--engines 0", "between 1 and"]),
    (["--engines", "4,x"], ["--engines 4,x", "whole numbers"]),
    (["--router", "random"], ["--router random", "no such router", "round-robin"]),
    (["--block-tokens", "0"], ["--block-tokens N"]),
    (["--shared-gb", "0.001"], ["--shared-gb"]),
    (["--shared-writes", "through", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0"], ["--shared-writes through",
                                                                                "--gpu-mem-gb"]),
    (["--semantic"], ["drop --semantic"]),
    (["--max-requests", "300000000"], ["300,000,000 requests", "GiB planned", "lower --max-requests"]),
    (["--engine-model", "stack", "--policy", "fifo"], ["--engine-model stack", "--policy is fifo"]),
    # how a run measures: on paper it did nothing, without a word
    (["--trials", "3"], ["fleet plans on paper", "--trials says how a run measures", "drop it"]),
    (["--no-telemetry"], ["--no-telemetry says how a run measures"]),
    (["--set", "tiers.io_engine=mmap"], ["--set tiers.io_engine says how a run measures"]),
])
def test_bad_fleet_input_is_one_sentence(tmp_path, args, fragments):
    r = run_cli(["fleet", *SYNTHETIC, *args, "--output-dir", str(tmp_path), "--run-id", "bad"], timeout=120)
    assert_clean_error(r, *fragments)
    assert not (tmp_path / "bad").exists()


def test_what_the_traffic_lacks_is_one_sentence(tmp_path):
    out = ["--output-dir", str(tmp_path)]
    assert_clean_error(run_cli(["fleet", "--config", str(SMALL), "--max-requests", "10", *out]), "--request-rate R")
    assert_clean_error(run_cli(["fleet", "--config", str(SMALL), "--request-rate", "5", *out]), "--max-requests N")
    r = run_cli(["fleet", "--model", "llama3.1-8b", "--trace", str(MOONCAKE), "--block-tokens", "512", "--router",
                 "session", *out])
    assert_clean_error(r, "--router session", "no conversation", "round-robin")
    assert list(tmp_path.iterdir()) == []
    huge = sparse_trace(tmp_path.parent / "huge.jsonl", 4 << 40)  # its records: 7 times 4 TiB while they are read
    r = run_cli(["fleet", "--model", "llama3.1-8b", "--trace", str(huge), "--block-tokens", "512", *out])
    assert_clean_error(r, f"trace {huge} (4,194,304 MiB of mooncake)", "head -n N FILE > PART")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "taken").mkdir()
    assert_clean_error(run_cli(["fleet", *SYNTHETIC, *out, "--run-id", "taken"]), "already exists")


@pytest.mark.slow
def test_compare_puts_two_fleets_side_by_side(tmp_path):
    fleet(tmp_path, "d", *SYNTHETIC, "--engines", "3", "--router", "prefix,round-robin")
    fleet(tmp_path, "t", *SYNTHETIC, "--engines", "3", "--router", "prefix", "--shared-writes", "through")
    r = run_cli(["compare", str(tmp_path / "d"), str(tmp_path / "t" / "fleet.json")])
    assert r.returncode == 0, r.stderr
    assert "Fleet runs against d" in r.stdout and "--shared-writes through (against demote)" in r.stdout
    rows = [x.split() for x in r.stdout.splitlines()]
    assert ["t", "-", "-", "-", "-", "-"] in rows  # round-robin: not in the second run
    assert any(x[:2] == ["t", x[1]] and x[2] == "pp" and x[1].startswith(("+", "-")) for x in rows), r.stdout


def test_compare_refuses_a_damaged_or_mixed_fleet(tmp_path, small_run):
    fleet(tmp_path, "d", *SYNTHETIC, "--engines", "2", "--router", "prefix")
    bad = tmp_path / "bad"
    bad.mkdir()
    for text, fragment in (("[1]", "not an object"), ('{"schema": 1', "not a readable fleet file")):
        (bad / "fleet.json").write_text(text)
        assert_clean_error(run_cli(["compare", str(tmp_path / "d"), str(bad)]), str(bad / "fleet.json"), fragment)
    assert_clean_error(run_cli(["compare", str(tmp_path / "d"), str(tmp_path)]), "no fleet run")
