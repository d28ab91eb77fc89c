"""Issue 18: what the run will write is said first, settings.yaml repeats the run, compare warns, help helps."""

import yaml
from conftest import bounded, run_cli
from found import REGISTRY
from results_fixture import results

from kv_cache.config import Settings, replace
from kv_cache.report.compare import setting_differences
from kv_cache.run.geometry import geometry
from kv_cache.run.stack import RunContext, resolved
from kv_cache.tiers.kinds import StorageSite


def test_the_run_says_what_it_writes_and_settings_yaml_repeats_it(small_run):
    r = run_cli(small_run("a", "--workers", "0", *bounded(6), quiet=False))
    assert r.returncode == 0, r.stderr
    assert "writes: about" in r.stdout and "MiB of new KV per request" in r.stdout
    # issue 28: what the run writes at the probe's pace, before (an estimate: it was said "at most", and a run
    # with deeper queues wrote three times that); what it wrote, after
    said = " ".join(r.stdout.split())
    assert "at the probe's best" in said and "window and drain write about" in said and "at most about" not in said
    res = small_run.results("a")
    whole = res["bytes_whole_run"]["nvme"]["write"]
    assert whole >= res["bytes"]["nvme"]["write"] > 0
    assert f"nvme wrote {whole / 2**30:,.2f} GiB" in r.stdout and "whole run (warm-up and drain included)" in r.stdout
    folder = small_run.out / "a"
    saved = yaml.safe_load((folder / "settings.yaml").read_text())
    assert saved["schedule"]["workers"] >= 4  # 0 (auto) resolved to what ran
    assert "(auto: 2 per core of" in r.stdout  # issue 46: the rule that chose, and the probe beside it
    probe = small_run.results("a")["run"]["workers_probe"]
    assert probe and probe[0]["threads"] == 1 and all(s["gbps"] > 0 for s in probe)
    assert saved["tiers"]["cache_dir"] == str(small_run.cache.resolve())
    again = run_cli(["--config", str(folder / "settings.yaml"), "--run-id", "b", "--quiet"])  # its 6 requests
    assert again.returncode == 0, again.stderr
    assert small_run.results("b")["run"]["workers"] == saved["schedule"]["workers"]


def test_an_automatic_tier_size_is_recorded_exactly():
    s = replace(Settings(), "tiers.nvme_gb", 0.0)
    geo = geometry(s)

    class Bottom:
        name = "nvme"  # the medium's module says which key its automatic size goes into
        capacity_bytes = 1234 * geo.slot_bytes

    site = StorageSite("/c", "/c/d", "ext4", "/", "direct")
    out = resolved(s, RunContext(geo, site, [Bottom()], [], None, 6), REGISTRY)
    assert int(out.tiers.nvme_gb * 2**30) == Bottom.capacity_bytes
    assert (out.schedule.workers, out.tiers.cache_dir) == (6, "/c")
    null_io = replace(replace(s, "schedule.workers", 3), "tiers.null_io", True)  # the null tier chose nothing
    no_site = resolved(null_io, RunContext(geo, None, [Bottom()], [], None, 6), REGISTRY)
    assert (no_site.tiers.nvme_gb, no_site.schedule.workers, no_site.tiers.cache_dir) == (0, 3, "")

    class Remote:
        name = "valkey"  # a remote bottom's automatic size goes into tiers.remote_gb, never tiers.nvme_gb
        capacity_bytes = 77 * geo.slot_bytes

    remote = resolved(s, RunContext(geo, None, [Remote()], [], None, 6), REGISTRY)
    assert (remote.tiers.nvme_gb, int(remote.tiers.remote_gb * 2**30)) == (0, Remote.capacity_bytes)


def test_compare_names_the_settings_that_differ_and_ignores_the_others():
    a, b = results(), results()
    b.settings = {**b.settings, "tiers": {**b.settings["tiers"], "io_engine": "mmap"},
                  "run": {**b.settings["run"], "output_dir": "elsewhere", "run_id": "x"}}
    assert setting_differences([("a", a), ("b", b)]) == ["tiers.io_engine: direct | mmap"]


def test_short_help_lists_subcommands_and_the_full_list_is_behind_help_all():
    short, full = run_cli(["--help"]), run_cli(["--help-all"])
    assert short.returncode == full.returncode == 0
    assert len(short.stdout.splitlines()) < 250 < len(full.stdout.splitlines())
    for sub in ("report", "compare", "policies", "validate", "clean", "--help-all"):
        assert sub in short.stdout
    assert "--semantic-threshold" in full.stdout and "--semantic-threshold" not in short.stdout
    assert "--users" in short.stdout and "--cache-dir" in short.stdout
    # issue 39, item 5: the short help is grouped by task and holds what the quick start uses
    for title in ("the run:", "the model:", "the tiers:", "the traffic:", "disaggregated prefill / decode nodes",
                  "several processes or hosts"):
        assert f"\n{title}" in short.stdout, title
    for flag in ("--trace", "--trace-speedup", "--remote-url", "--role", "--handoff", "--processes", "--submission",
                 "--trials", "--request-rate"):
        assert f"\n  {flag} " in short.stdout, flag
    for flag in ("--no-promote", "--no-semantic-context-gate", "--no-semantic-multi-donor", "--no-telemetry"):
        text = full.stdout.split("\n  " + flag, 1)[1][:200]  # its help entry, not the usage line
        assert "Turn off" in " ".join(text.split()), flag
