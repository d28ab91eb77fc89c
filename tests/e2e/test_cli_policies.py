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


def test_policies_needs_a_sequence_length_and_known_names(small_run):
    assert_clean_error(run_cli(["policies", *small_run("p1")]), "--max-requests N")
    assert_clean_error(run_cli(["policies", *small_run("p2", "--max-requests", "5"), "--policies", "mru"]),
                       "unknown policy 'mru'")


@pytest.mark.parametrize("value", ["nan", "-1", "inf"])
def test_a_recompute_cost_that_is_not_a_finite_number_is_refused(value):
    """Issue 37, item 7: NaN and -1 were accepted (a negative cost rewards a miss)."""
    r = run_cli(["policies", "--prefill-ms-per-token", value], timeout=60)
    assert_clean_error(r, "--prefill-ms-per-token", "finite number >= 0")
