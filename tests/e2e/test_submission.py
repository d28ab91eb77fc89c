"""Trials, preconditioning, submission packages and validate."""

import json

import pytest
from conftest import bounded, run_cli
from helpers import assert_clean_error

pytestmark = pytest.mark.slow  # make test-all (CI); make test stays quick

SMOKE = ("--submission", "smoke", "--trials", "2", "--precondition", "--seed", "42", "--duration", "1",
         "--warmup", "0.2")


def test_trials_report_median_and_spread(small_run):
    r = run_cli(small_run("t", "--trials", "3", *bounded(8), quiet=False))
    assert r.returncode == 0, r.stderr
    assert "Trials     3 of the same schedule" in r.stdout and "CV" in r.stdout
    said = r.stdout[r.stdout.index("Trials     3"):]
    again = run_cli(["report", str(small_run.out / "t")])  # the spread was said once, at the run's end, and lost
    assert again.returncode == 0 and said.split("\n")[:6] == again.stdout[again.stdout.index("Trials "):].split(
        "\n")[:6]
    res = small_run.results("t")
    s = res["trials"]["summary"]["requests_per_s"]
    assert len(s["values"]) == 3 and s["min"] <= s["median"] <= s["max"] and s["cv"] is not None
    for k in (1, 2, 3):
        trial = json.loads((small_run.out / "t" / f"trial-{k}" / "results.json").read_text())
        assert trial["workload"]["theoretical_hit_rate"] == res["workload"]["theoretical_hit_rate"]  # one schedule


def test_a_trial_frees_its_memory_before_the_next_allocates_its_own(small_run):
    """--submission smoke's second trial peaked at 9.6 GiB resident against a 5.6 GiB budget: the first trial's CPU
    tier and buffers, held in reference cycles, were still resident when the second allocated its own."""
    r = run_cli(small_run("m", "--trials", "2", "--cpu-mem-gb", "1", *bounded(3)))
    assert r.returncode == 0, r.stderr
    for k in (1, 2):
        memory = json.loads((small_run.out / "m" / f"trial-{k}" / "results.json").read_text())["memory"]
        assert memory["peak_rss_bytes"] <= memory["budget_bytes"], (k, memory)


def test_trials_choose_their_workers_once(small_run):
    """Issue 39, item 3: --workers 0 re-ran the probe in each trial (8 workers in trial 1, 4 in trial 2) under
    "same seed, same schedule". The probe runs in trial 1; every later trial keeps its choice."""
    r = run_cli(small_run("w", "--trials", "2", "--workers", "0", *bounded(6), quiet=False))
    assert r.returncode == 0, r.stderr
    first, second = (json.loads((small_run.out / "w" / f"trial-{k}" / "results.json").read_text())["run"]
                     for k in (1, 2))
    assert first["workers_probe"] and second["workers_probe"] is None
    assert second["workers"] == first["workers"]
    assert f"workers: {first['workers']}, chosen in trial 1, kept for every trial" in r.stdout


def test_precondition_writes_the_tier_and_reports_passes(small_run):
    r = run_cli(small_run("p", "--precondition", "--precondition-passes", "2", *bounded(4), quiet=False))
    assert r.returncode == 0, r.stderr
    assert "pass 1:" in r.stdout and "pass 2:" in r.stdout
    pre = small_run.results("p")["precondition"]
    assert pre["passes"] == 2 and len(pre["gbps"]) == 2 and all(g > 0 for g in pre["gbps"])
    assert pre["bytes_per_pass"] == small_run.results("p")["run"]["tiers"]["nvme"]["capacity_bytes"]
    # the summary a reader keeps says the device was preconditioned (only the lines before the run did)
    summary = (small_run.out / "p" / "summary.md").read_text()
    assert "preconditioned: the nvme tier written whole in 2 passes before the clock" in " ".join(summary.split())


def test_submission_package_is_complete_and_validates(small_run):
    r = run_cli(small_run("s", *SMOKE))
    assert r.returncode == 0, r.stderr
    folder = small_run.out / "s"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["rules"] == "smoke" and manifest["for_submission"] is False
    for name in ("results.json", "trials.json", "settings.yaml", "system.json", "trial-1/results.json",
                 "trial-2/results.json", "trial-2/latency_percentiles.png"):
        assert name in manifest["files"], name
    system = json.loads((folder / "system.json").read_text())
    assert system["cache_dir"]["fs_type"] and system["kernel"]["release"] and system["memory_bytes"] > 0
    assert system["packages"]["numpy"]
    v = run_cli(["validate", str(folder)])
    assert v.returncode == 1
    assert v.stdout.count("\n  - ") == 1 and "not a valid submission" in v.stdout  # the only objection


def test_validate_catches_a_modified_file_and_a_rule_violation(small_run):
    assert run_cli(small_run("m", *SMOKE)).returncode == 0
    folder = small_run.out / "m"
    trial = folder / "trial-1" / "results.json"
    data = json.loads(trial.read_text())
    data["requests"]["per_s"] *= 2  # a flattering edit
    trial.write_text(json.dumps(data))
    (folder / "extra.txt").write_text("hello")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["rules"] = "v1"  # claim the real rules
    (folder / "manifest.json").write_text(json.dumps(manifest))
    v = run_cli(["validate", str(folder)])
    assert v.returncode == 1
    assert "trial-1/results.json: checksum differs" in v.stdout
    assert "extra.txt: not in the manifest" in v.stdout
    assert "rule: --duration must be >= 300" in v.stdout and "rule: --trials must be >= 3" in v.stdout
    assert "measured" in v.stdout and "300 s required" in v.stdout


@pytest.mark.parametrize("extra,fragment", [
    (("--submission", "v1", "--seed", "42", "--duration", "100"), "--duration must be >= 300 (is 100)"),
    (("--submission", "smoke", "--seed", "7"), "--seed must be 42 (is 7)"),
    (("--submission", "smoke", "--null-io"), "--null-io must be off"),
])
def test_submission_refuses_settings_that_break_the_rules(small_run, extra, fragment):
    assert_clean_error(run_cli(small_run("x", *extra)), fragment)


def test_submission_smoke_alone_runs_its_rules_in_seconds(small_run):
    """Issue 39, item 7: `--submission smoke` on its own was refused ("run.trials must be >= 2", config keys, not
    flags) and took 206 s with the flags added. The rules now supply what was left at its default, and say so."""
    r = run_cli(small_run("alone", "--submission", "smoke", "--seed", "42", quiet=False))  # the fixture's seed is 7
    assert r.returncode == 0, r.stderr
    assert "--submission smoke: " in r.stdout and "--trials 2" in r.stdout and "--precondition" in r.stdout
    res = small_run.results("alone")
    assert res["trials"]["count"] == 2 and res["run"]["duration_s"] <= 3
    assert "validate: rules 'smoke' are for trying the machinery" in r.stdout  # its only objection


def test_validate_of_a_folder_without_package(tmp_path):
    """A plain run's folder (no --submission) read 'does NOT conform (? rules) ... manifest.json is missing or
    unreadable ([Errno 2] ...)': it says what the folder is not and how to make one."""
    (tmp_path / "results.json").write_text("{}")
    v = run_cli(["validate", str(tmp_path)])
    assert v.returncode == 1 and "not a submission package" in v.stdout and "--submission v1" in v.stdout
    assert "?" not in v.stdout and "Errno" not in v.stdout
