"""The policies sub-command: one request sequence, several policies, one comparison."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from helpers import assert_clean_error

pytestmark = pytest.mark.slow  # make test-all (CI); make test stays quick


def test_policies_replay_the_same_sequence_and_compare(small_run):
    r = run_cli(["policies", *small_run("pol", "--max-requests", "40", "--duration", "600", "--warmup", "0",
                                        quiet=False), "--policies", "lru,fifo,semantic-adaptive"], timeout=180)
    assert r.returncode == 0, r.stderr
    assert "modelled TTFT = measured storage TTFT" in r.stdout
    data = json.loads((small_run.out / "pol" / "policies.json").read_text())
    rows = {row["policy"]: row for row in data["policies"]}
    assert set(rows) == {"lru", "fifo", "semantic-adaptive"}
    runs = {n: json.loads((small_run.out / "pol" / n / "results.json").read_text()) for n in rows}
    # One deterministic sequence: every policy saw exactly the same requests and prompt tokens.
    assert {r["requests"]["completed"] for r in runs.values()} == {40}
    assert len({r["tokens"]["prompt"] for r in runs.values()}) == 1
    assert all(r["settings"]["cache"]["policy"] == n for n, r in runs.items())
    assert all(row["modelled_ttft_mean_ms"] >= row["storage_ttft_mean_ms"] for row in rows.values())
    assert (small_run.out / "pol" / "policies.png").stat().st_size > 5000
    # a policy that cut more chains wrote fewer new blocks and spent less storage time: both said beside its TTFT
    # (S3-FIFO on Mooncake's sample wrote 1,288 where LRU wrote 2,098, and 'won' TTFT by 141.8 to 266.5 ms)
    for n, row in rows.items():
        written = sum(ops.get("write", 0) for ops in runs[n]["ops"].values())
        unwritten = sum(runs[n]["blocks_write_skipped_by"].values())
        assert (row["blocks_written"], row["blocks_not_written"]) == (written, unwritten)
        line = next(ln for ln in r.stdout.splitlines() if ln.split()[:1] == [n] and "%" in ln)
        assert line.split()[-2:] == [f"{written:,}", f"{unwritten:,}"], line


def test_policies_needs_a_sequence_length_and_known_names(small_run):
    assert_clean_error(run_cli(["policies", *small_run("p1")]), "--max-requests N")
    assert_clean_error(run_cli(["policies", *small_run("p2", "--max-requests", "5"), "--policies", "mru"]),
                       "unknown policy 'mru'")
    # replaced by the sequence, then refused as if not typed: "add --arrival poisson or drop --request-rate"
    r = run_cli(["policies", *small_run("p3", "--max-requests", "5", "--arrival", "poisson", "--request-rate", "5")])
    assert_clean_error(r, "policies replays one fixed sequence", "--arrival would change how they arrive")


@pytest.mark.parametrize("value", ["nan", "-1", "inf"])
def test_a_recompute_cost_that_is_not_a_finite_number_is_refused(value):
    """Issue 37, item 7: NaN and -1 were accepted (a negative cost rewards a miss)."""
    r = run_cli(["policies", "--prefill-ms-per-token", value], timeout=60)
    assert_clean_error(r, "--prefill-ms-per-token", "finite number >= 0")


def test_policies_print_within_100_columns_and_leave_no_folder_in_their_report(tmp_path):
    """Its table was one row a policy of every column: 150 wide with two tiers, more with --rag and a GPU tier; with
    no --cache-dir its runs made their data folder inside the comparison's report, left there empty; and `report`
    of that folder said its results.json did not exist."""
    from conftest import SMALL

    out = tmp_path / "reports"
    r = run_cli(["policies", "--config", str(SMALL), "--output-dir", str(out), "--run-id", "pol", "--max-requests",
                 "12", "--duration", "600", "--warmup", "0", "--rag", "--gpu", "simulated", "--gpu-mem-gb", "0.02",
                 "--policies", "lru,semantic-adaptive"], timeout=180)
    assert r.returncode == 0, r.stderr
    wide = [line for line in r.stdout.splitlines() if len(line) > 100 and " " in line.strip()]
    assert not wide, wide
    assert "Hit rate by source" in r.stdout and "  semantic-adaptive  nvme" in r.stdout, r.stdout
    assert sorted(p.name for p in (out / "pol").iterdir()) == ["lru", "policies.json", "policies.png",
                                                               "semantic-adaptive"]
    # report of the comparison's folder named a results.json that does not exist; then it named the runs in it and
    # said nothing of their comparison: it says the comparison again
    again = run_cli(["report", str(out / "pol")])
    assert again.returncode == 0, again.stderr
    table = r.stdout[r.stdout.index("Policies on one request sequence"):]
    assert again.stdout == table, again.stdout
    assert_clean_error(run_cli(["report", str(out / "pol"), "--mlperf-output", str(tmp_path / "m.json")]),
                       "holds no results.json of its own but the runs lru, semantic-adaptive: pass one of them")
    (out / "pol" / "policies.json").write_text('{"policies": [{"policy": "lru"}], "ttft_model": "x"}')
    assert_clean_error(run_cli(["report", str(out / "pol")]), "policies.json is not a policies comparison",
                       "run the policies sub-command again")


def test_quiet_policies_print_nothing(small_run):
    """--quiet ("print nothing but errors") printed each policy's line and the whole comparison."""
    r = run_cli(["policies", *small_run("q", "--max-requests", "4", "--duration", "600", "--warmup", "0"),
                 "--policies", "lru"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and (small_run.out / "q" / "policies.json").exists()


def test_each_policy_runs_the_whole_sequence_whatever_the_configs_clock(small_run):
    """`policies --max-requests 200` ran each policy for the default 60 s after a 5 s warm-up: 33 to 40 of the 200
    requests completed, a different number a policy, under "Policies on one request sequence". The sequence's end
    ends a run now (the config's 2 s and 0.5 s warm-up here); a typed --duration that cuts one is said, exit 1."""
    r = run_cli(["policies", *small_run("whole", "--max-requests", "60", quiet=False), "--policies", "lru,fifo"],
                timeout=240)
    assert r.returncode == 0, r.stderr
    runs = [json.loads((small_run.out / "whole" / n / "results.json").read_text()) for n in ("lru", "fifo")]
    assert [(x["requests"]["completed"], x["run"]["stopped_reason"]) for x in runs] == [(60, "max_requests")] * 2
    assert "warning" not in r.stdout
    assert "Policies on one request sequence (60 requests each)" in r.stdout, r.stdout
    assert r.stdout.count("\n   60 requests in ") == 2, r.stdout  # each policy's end said as it comes (minutes each)
    cut = run_cli(["policies", *small_run("cut", "--max-requests", "5000", "--duration", "0.5", quiet=False),
                   "--policies", "lru"], timeout=240)
    assert cut.returncode == 0, cut.stderr  # one policy: cut, but nothing to differ from
    done = json.loads((small_run.out / "cut" / "lru" / "results.json").read_text())["requests"]["completed"]
    assert f"note: --duration ended every policy's run after {done:,} requests, before the sequence's end" \
        in " ".join(cut.stdout.split()), cut.stdout
    assert_clean_error(run_cli(["policies", *small_run("w", "--max-requests", "5", "--warmup", "1")]),
                       "--warmup 1 would leave out those of its first seconds")


def test_policies_cut_to_different_lengths_are_said_not_to_compare():
    from kv_cache.report.policies import cut_lines, unequal

    def row(name, done, why):
        return {"policy": name, "requests": done, "stopped_reason": why}

    rows = [row("lru", 38, "duration"), row("s3fifo", 47, "duration"), row("fifo", 200, "max_requests")]
    (line,) = cut_lines(rows)
    assert unequal(rows) and " ".join(line.split()).startswith(
        "warning: --duration ended 2 of the 3 policies' runs before the sequence's end (requests completed: lru 38, "
        "s3fifo 47): they did not see the same requests"), line
    assert cut_lines([row("lru", 200, "max_requests")] * 2) == [] and not unequal([row("lru", 200, "max_requests")] * 2)
