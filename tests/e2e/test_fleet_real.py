"""The fleet held against reality (issue 53, point 4): a point's assignment exported as one trace per engine
(fleet --export-assignment), its run.sh run as typed, N real runs as processes sharing one namespace of a Valkey
server (or an S3 gateway's bucket) on 127.0.0.1: each tier's hit rate within 0.5 points of the simulation, the
shared tier's blocks read and written within 2 %, and the namespace gone after the last run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, run_cli
from helpers import assert_clean_error
from servers import s3_objects, valkey_keys

# the tiers the simulation names, top to bottom, and a small engine: 384 KiB blocks (tiny-1b at tp 4, fp8), an HBM
# tier of 27 blocks and a CPU tier of 54, so a conversation's earlier turns are in the shared tier when it comes back
FLEET = ["--model", "tiny-1b", "--tp", "4", "--kv-dtype", "fp8", "--block-tokens", "128", "--gpu", "simulated",
         "--gpu-mem-gb", "0.01", "--cpu-mem-gb", "0.02", "--trace-speedup", "3"]  # --engine-model auto: cache
LEAD_S = 4  # seconds of set-up an engine's run gets before the first arrival (about 2 here; the engines share cores)


def conversations(path, convs: int = 13, turns: int = 5, gap_ms: int = 300) -> None:
    """A Mooncake-format trace of our own (numbers only): convs conversations of turns turns, each turn its
    conversation's whole history plus two 512-token blocks, behind one shared first block; turn by turn, a request
    every gap_ms. An odd convs puts a conversation's turns on different engines under round-robin."""
    rows = []
    for t in range(turns):
        for c in range(convs):
            ids = [0, *(1000 * (c + 1) + k for k in range(2 * (t + 1)))]
            rows.append({"timestamp": (t * convs + c) * gap_ms, "input_length": 512 * len(ids) - 100,
                         "output_length": 64, "hash_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def summed(folder) -> tuple[dict, int, int, int, int]:
    """The engines' runs together: tokens served by each tier (top to bottom) over their prompt tokens, the bottom
    tier's bytes read and written (the whole run's: no warm-up), the blocks adopted from other engines, the runs."""
    served, prompt, read, written, adopted = None, 0, 0, 0, 0
    runs = sorted((folder / "runs").iterdir())
    for run in runs:
        r = json.loads((run / "results.json").read_text())
        by_tier = r["tokens"]["cached_by_tier"]
        served = [a + b for a, b in zip(served, by_tier.values())] if served else list(by_tier.values())
        prompt += r["tokens"]["prompt"]
        bottom = list(by_tier)[-1]
        moved = r["bytes_whole_run"][bottom]
        read, written = read + moved["read"], written + moved["write"]
        adopted += r["shared_storage"]["adopted_blocks"]
    return {t: x / prompt for t, x in zip(("hbm", "cpu", "shared"), served)}, read, written, adopted, len(runs)


@pytest.mark.slow  # make test-all (CI): each replays its trace in real time (two engines on Valkey: 72 s here)
@pytest.mark.parametrize("engines,router,medium", [(2, "round-robin", "valkey"), (4, "prefix", "valkey"),
                                                   (2, "round-robin", "s3")])
def test_real_engines_sharing_a_remote_tier_serve_what_the_fleet_simulated(request, tmp_path, engines, router,
                                                                            medium):
    server = request.getfixturevalue(f"{medium}_server")
    trace = tmp_path / "conv.jsonl"
    conversations(trace)
    # the simulation serves each request before the next arrives; a real engine does only while it keeps up. On
    # the S3 gateway a request took 120-360 ms on CI's two cores, past the 100 ms between arrivals at speedup 3: the
    # engines' queues reordered their reads and promotions against each other's (one promoted a block out of the
    # shared tier before the other read it), and the hit rates left the simulation's (shared 47.5 % against 52.3).
    # At speedup 0.5 (600 ms between arrivals) a request is done before the next one, on either engine, arrives.
    # Its trace is shorter (7 conversations of 4 turns: 28 requests, 17 s at that pace, against 39 s for 65).
    speeds = ["0.5", "0.125"] if medium == "s3" else ["3", "0.75", "0.25"]
    if medium == "s3":
        conversations(trace, convs=7, turns=4)
    # NOTE: a machine busy with other work (CI's two cores running two tests at once) can hold a request past the
    # next arrival (151 ms against 100 at speedup 3 on Valkey): compare says so and to export the point again at a
    # lower --trace-speedup, which is what a user does, and what this test does (on Valkey twice: at 0.75, 400 ms
    # apart, four engines still waited 555 ms once for a worker on a slow day's CI, 2026-12-06)
    for speed in speeds:
        export = tmp_path / f"export-{speed}"
        point, exported, ran = _export_and_run(trace, export, speed, engines, router, server)
        if "Kept up with the trace" in ran.stdout:
            break
    sim, busy = exported["fleet"], sum(1 for e in exported["engines"] if e["requests"])  # run.sh runs those
    assert sim["hit_rate"]["shared"] > 0.3  # the check means something: most hits cross engines
    assert "against" in ran.stdout and "Prompt tokens served, by tier" in ran.stdout  # run.sh's compare POINT
    assert "Kept up with the trace" in ran.stdout, ran.stdout  # each request done before the next arrived
    assert sim["arrival_gap_ms"] > 0
    rate, read, written, adopted, runs = summed(point)
    assert runs == busy >= 2
    for tier in ("hbm", "cpu", "shared"):
        assert abs(rate[tier] - sim["hit_rate"][tier]) <= 0.005, (tier, rate, sim["hit_rate"])
    slot = sim["slot_bytes"]
    assert read == pytest.approx(sim["shared_read_blocks"] * slot, rel=0.02), (read / slot, sim)
    assert written == pytest.approx(sim["shared_write_blocks"] * slot, rel=0.02), (written / slot, sim)
    assert adopted > 0  # blocks another engine wrote were read
    left = valkey_keys(server.url, "kvbench-shared-*") if medium == "valkey" else s3_objects(server, "")
    assert not [n for n in left if "kvbench-shared-" in n]  # the last run out removed the namespace


def _export_and_run(trace, export, speed: str, engines: int, router: str, server):
    """The fleet's point exported at this --trace-speedup, and its run.sh run against the server: (the point's folder,
    its engines.json, run.sh's outcome)."""
    # --trace-speedup after FLEET's: the last one given holds
    r = run_cli(["fleet", "--trace", str(trace), *FLEET, "--trace-speedup", speed, "--engines", str(engines),
                 "--router", router, "--export-assignment", str(export), "--output-dir", str(export.parent / "rep"),
                 "--run-id", f"f{speed}"])
    assert r.returncode == 0, r.stderr
    point = export / f"{router}-{engines}"
    exported = json.loads((point / "engines.json").read_text())
    ran = subprocess.run(["sh", str(point / "run.sh"), server.url, str(4 + LEAD_S * engines)], capture_output=True,
                         text=True, timeout=300, cwd=REPO, env=dict(os.environ, PYTHON=sys.executable, **server.env))
    logs = "".join(p.read_text()[-3000:] for p in sorted(point.glob("engine-*.log")))
    assert ran.returncode == 0, ran.stdout + logs
    return point, exported, ran


@pytest.mark.parametrize("extra,fragments", [
    (["--request-rate", "20", "--max-requests", "50"], ["synthetic users are no trace"]),
    (["--trace", str(REPO / "traces" / "mooncake_conversation_sample.jsonl"), "--engine-model", "stack"],
     ["--engine-model cache --shared-writes demote"]),
    (["--trace", str(REPO / "traces" / "mooncake_conversation_sample.jsonl"), "--shared-writes", "through"],
     ["--engine-model cache --shared-writes demote"]),
    (["--trace", str(REPO / "traces" / "mooncake_conversation_sample.jsonl"), "--request-rate", "5"],
     ["drop --request-rate"]),
])
def test_an_assignment_a_run_cannot_replay_is_one_sentence(tmp_path, extra, fragments):
    r = run_cli(["fleet", *FLEET, *extra, "--export-assignment", str(tmp_path / "x"), "--output-dir",
                 str(tmp_path / "rep")])
    assert_clean_error(r, *fragments)
    assert not (tmp_path / "x").exists()


def test_an_export_never_writes_over_one(tmp_path):
    trace, export = tmp_path / "conv.jsonl", tmp_path / "export"
    conversations(trace, convs=3, turns=2)
    args = ["fleet", "--trace", str(trace), *FLEET, "--engines", "2", "--router", "round-robin", "--output-dir",
            str(tmp_path / "rep"), "--export-assignment"]
    assert run_cli([*args, str(export)]).returncode == 0
    before = (export / "round-robin-2" / "engine-0.jsonl").read_text()
    assert '"source_index": 0' in before
    assert_clean_error(run_cli([*args, str(export)]), "holds files already")
    assert (export / "round-robin-2" / "engine-0.jsonl").read_text() == before
    (tmp_path / "file").write_text("x")
    assert_clean_error(run_cli([*args, str(tmp_path / "file")]), "is a file")
    point = export / "round-robin-2"
    assert_clean_error(run_cli(["compare", str(point)]), "no run of this fleet point has ended yet", "run.sh")
    (point / "engines.json").write_text('{"fleet": {"router": "x"}}')
    assert_clean_error(run_cli(["compare", str(point)]), "is not a readable fleet export")


def bailian(path, chats: int = 5, turns: int = 3) -> None:
    """A Bailian-format trace of our own: chats chained by parent_chat_id, 16-token hash blocks, seconds."""
    rows = []
    for t in range(turns):
        for c in range(chats):
            ids = [1, *(100 * (c + 1) + k for k in range(8 * (t + 1)))]
            parent = (t - 1) * chats + c if t else -1
            rows.append({"chat_id": t * chats + c, "parent_chat_id": parent, "timestamp": 0.3 * (t * chats + c),
                         "input_length": 16 * len(ids) - 5, "output_length": 8, "hash_ids": ids, "turn": t + 1})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("fmt", ["mooncake", "bailian"])
def test_each_engine_s_trace_builds_the_requests_the_fleet_planned(tmp_path, fmt):
    """Every exported record builds, token for token, the request of the fleet's trace it came from, in its
    engine's arrival order, and every request is in exactly one engine's trace."""
    from kv_cache.sources import hashtrace
    from kv_cache.sources.trace_io import TraceLog

    trace, export = tmp_path / "t.jsonl", tmp_path / "export"
    (conversations if fmt == "mooncake" else bailian)(trace)
    r = run_cli(["fleet", "--trace", str(trace), *FLEET, "--engines", "3", "--router", "round-robin",
                 "--export-assignment", str(export), "--output-dir", str(tmp_path / "rep")])
    assert r.returncode == 0, r.stderr
    whole = hashtrace.load([str(trace)], fmt, TraceLog(strict=True))
    seen = []
    for k in range(3):
        share = hashtrace.load([str(export / "round-robin-3" / f"engine-{k}.jsonl")], fmt, TraceLog(strict=True))
        assert [x.index for x in share] == sorted(x.index for x in share)
        for rec in share:
            mine, theirs = rec.build(1000), whole[rec.index].build(1000)
            assert np.array_equal(mine.prompt_tokens, theirs.prompt_tokens)
            assert np.array_equal(mine.output_tokens, theirs.output_tokens)
            assert rec.arrival_s == pytest.approx(whole[rec.index].arrival_s)
        seen += [x.index for x in share]
    assert sorted(seen) == list(range(len(whole)))


def test_each_engine_s_run_gets_the_share_of_the_shared_tier_it_was_simulated_with(tmp_path):
    """A bounded shared tier split as the simulation splits it at each point: over N engines, --shared-gb / N each
    (in whole blocks), not the sweep's smallest share."""
    import yaml

    trace, export = tmp_path / "conv.jsonl", tmp_path / "export"
    conversations(trace, convs=3, turns=2)
    r = run_cli(["fleet", "--trace", str(trace), *FLEET, "--engines", "2,4", "--router", "round-robin",
                 "--shared-gb", "1", "--export-assignment", str(export), "--output-dir", str(tmp_path / "rep")])
    assert r.returncode == 0, r.stderr
    slot_gib = 128 * 3072 / 2**30  # tiny-1b at tp 4, fp8: 3 KiB a token
    for n in (2, 4):
        run = yaml.safe_load((export / f"round-robin-{n}" / "settings.yaml").read_text())
        assert 1 / n - slot_gib <= run["tiers"]["remote_gb"] <= 1 / n, (n, run["tiers"]["remote_gb"])
