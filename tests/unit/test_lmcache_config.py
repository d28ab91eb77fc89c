"""--lmcache-config FILE: an LMCache YAML run as this benchmark's tiers (cli/lmcache.py; issue 39, item 9)."""

import pytest
from conftest import bounded, run_cli
from found import REGISTRY
from helpers import assert_clean_error

from kv_cache.cli.lmcache import translate
from kv_cache.errors import UserError


def _file(tmp_path, text: str) -> str:
    path = tmp_path / "lmcache.yaml"
    path.write_text(text)
    return str(path)


def test_each_lmcache_key_sets_its_counterpart(tmp_path):
    (tmp_path / "kv").mkdir()
    sets, origins, notes, _ = translate(_file(tmp_path, "chunk_size: 16\nlocal_cpu: true\nmax_local_cpu_size: 2.5\n"
                                                     f"local_disk: file://{tmp_path}/kv/\nmax_local_disk_size: 40\n"
                                                     "remote_url: redis://127.0.0.1:6379\nsave_decode_cache: true\n"
                                                     "cache_policy: LFU\nremote_serde: naive\n"), REGISTRY.media)
    assert sets == ["model.block_tokens=16", "tiers.cpu_mem_gb=2.5", f"tiers.cache_dir='{tmp_path}/kv/'",
                    "tiers.nvme='on'", "tiers.nvme_gb=40.0", "tiers.remote_url='redis://127.0.0.1:6379'",
                    "workload.decode_writes=true", "cache.policy='lfu'"]
    assert origins["tiers.nvme_gb"].endswith(": max_local_disk_size")
    assert notes and "remote_serde" in notes[0]


def test_lmcache_defaults_cpu_only_and_no_decode_cache(tmp_path):
    sets, _, _, _ = translate(_file(tmp_path, "chunk_size: 256\n"), REGISTRY.media)
    assert "tiers.cpu_mem_gb=5.0" in sets and "tiers.nvme='off'" in sets and "workload.decode_writes=false" in sets
    sets, _, _, _ = translate(_file(tmp_path, f"local_cpu: false\nlocal_disk: {tmp_path}\n"), REGISTRY.media)
    assert "tiers.cpu_mem_gb=0" in sets and f"tiers.cache_dir='{tmp_path}'" in sets


@pytest.mark.parametrize("text,fragment", [
    ("remote_url: lm://localhost:65432\n", "a store this benchmark has no medium for"),
    ("local_disk: /a,/b\n", "names several folders"),
    ("chunk_size: -4\n", "whole number of tokens"),
    ("max_local_cpu_size: lots\n", "LMCache's sizes are GiB"),
    ("cache_policy: MRU\n", "here: LRU, LFU, FIFO"),
    ("chunck_size: 256\n", "chunck_size is not LMCache keys"),
    # issue 52, item 5: 'no' and 'false' (strings) were taken as true, and file:// as the current folder
    ("local_cpu: 'no'\n", "local_cpu is 'no'; LMCache's switches are true or false"),
    ("save_decode_cache: 'false'\n", "save_decode_cache is 'false'"),
    ("local_disk: 'file://'\n", "local_disk is 'file://', which names no folder"),
])
def test_what_cannot_run_here_is_one_sentence(tmp_path, text, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        translate(_file(tmp_path, text), REGISTRY.media)


def test_a_run_from_an_lmcache_file(small_run, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    path = _file(tmp_path, f"chunk_size: 16\nlocal_cpu: true\nmax_local_cpu_size: 0.05\nlocal_disk: file://{disk}\n"
                           f"max_local_disk_size: 0.3\n")
    r = run_cli(small_run("lm", "--lmcache-config", path, *bounded(6), quiet=False))
    assert r.returncode == 0, r.stderr
    assert "LMCache configuration" in r.stdout
    s = small_run.results("lm")["settings"]
    assert s["tiers"]["cpu_mem_gb"] == 0.05 and s["tiers"]["nvme_gb"] == 0.3 and s["workload"]["decode_writes"] is False
    assert s["tiers"]["cache_dir"] != str(disk)  # the test's own --cache-dir flag wins over the file's local_disk
    bad = run_cli(small_run("bad", "--lmcache-config", _file(tmp_path, "remote_url: lm://h:1\n")))
    assert_clean_error(bad, "lm://h:1", "redis://")


@pytest.mark.slow  # the real CLI, a process a case: make test-all (CI)
def test_a_missing_or_wrong_shaped_lmcache_file_names_its_own_flag(tmp_path):
    """Issue 46, point 8: a missing --lmcache-config file was blamed on --config."""
    from conftest import run_cli
    from helpers import assert_clean_error

    r = run_cli(["--lmcache-config", str(tmp_path / "missing.yaml")])
    assert_clean_error(r, "LMCache configuration", "--lmcache-config")
    assert "--config." not in r.stderr
    (tmp_path / "list.yaml").write_text("- local_cpu\n")
    assert_clean_error(run_cli(["--lmcache-config", str(tmp_path / "list.yaml")]), "(--lmcache-config) must hold")


@pytest.mark.slow  # the real CLI, a process a case: make test-all (CI)
@pytest.mark.parametrize("disk, fragment", [
    ("/etc", "local_disk /etc is a system folder"),
    ("/proc/kvbench", "local_disk /proc/kvbench is a system folder"),
    ("{tmp}/a-file", "a file: the disk tier's folder must be a folder"),
    ("{tmp}/dangling", "a link to nothing"),
])
def test_a_wrong_local_disk_is_blamed_on_the_lmcache_file_and_its_key(tmp_path, disk, fragment):
    """Issue 52, item 6: these were blamed on --cache-dir (a flag the user never typed)."""
    from conftest import run_cli
    from helpers import assert_clean_error

    (tmp_path / "a-file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    f = tmp_path / "lmcache.yaml"
    f.write_text(f"local_disk: '{disk.format(tmp=tmp_path)}'\nmax_local_disk_size: 1\n")
    r = run_cli(["--lmcache-config", str(f), "--max-requests", "1"])
    assert_clean_error(r, f"--lmcache-config {f}: ", fragment)
    assert "--cache-dir" not in r.stderr


@pytest.mark.slow  # the real CLI, a process a case: make test-all (CI)
def test_a_settings_file_nested_thousands_deep_is_one_sentence(tmp_path):
    """Issue 52, item 6: a RecursionError (an internal error) for --lmcache-config and plain --config."""
    from conftest import run_cli
    from helpers import assert_clean_error

    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 3000 + "]" * 3000 + "\n")
    for flag in ("--lmcache-config", "--config"):
        assert_clean_error(run_cli([flag, str(deep)]), f"({flag}) nests deeper than a settings file can")


@pytest.mark.slow  # the real CLI, a process a case: make test-all (CI)
@pytest.mark.parametrize("text, typed, blamed", [
    ("local_cpu: false\n", [], "it names no local_disk: --nvme off"),
    ("max_local_cpu_size: 0.0001\n", [], "its max_local_cpu_size (or local_cpu) is --cpu-mem-gb"),
    ("max_local_cpu_size: 0.0001\n", ["--cpu-mem-gb", "0.0001"], None),  # typed by the user: theirs to fix
])
def test_a_later_check_names_the_lmcache_key_behind_a_flag_the_user_never_typed(tmp_path, text, typed, blamed):
    """Issue 52's tour: '--nvme off' and '--cpu-mem-gb' were blamed for an LMCache file's keys."""
    r = run_cli(["--lmcache-config", _file(tmp_path, text), *typed, "--max-requests", "1", "--output-dir",
                 str(tmp_path / "out")])
    assert_clean_error(r)
    said = " ".join(r.stderr.split())
    if blamed:
        assert f"--lmcache-config {tmp_path / 'lmcache.yaml'} ({blamed}" in said, said
    else:
        assert "--lmcache-config" not in said and "--cpu-mem-gb 0.0001" in said, said


@pytest.mark.slow  # the real CLI, a process a case: make test-all (CI)
def test_a_missing_local_disk_is_made_as_lmcache_makes_it(tmp_path):
    """LMCache's local_disk "does NOT need to exist beforehand" (its local storage docs); here a missing one was
    refused. It is made and said, and removed again when the run is then refused before it ran."""
    from conftest import SMALL, run_cli

    disk = tmp_path / "lm" / "disk"
    f = tmp_path / "lmcache.yaml"
    f.write_text(f"chunk_size: 16\nmax_local_cpu_size: 0.03\nlocal_disk: 'file://{disk}/'\nmax_local_disk_size: 0.25\n")
    base = ["--lmcache-config", str(f), "--config", str(SMALL), "--output-dir", str(tmp_path / "o"), "--run-id"]
    r = run_cli([*base, "ok", "--max-requests", "2", "--warmup", "0", "--duration", "600", "--quiet"])
    assert r.returncode == 0, r.stderr
    assert disk.is_dir() and (tmp_path / "o" / "ok" / "results.json").exists()
    disk.rmdir()
    (tmp_path / "lm").rmdir()
    refused = run_cli([*base, "no", "--users", "0"])  # refused after the folder was made
    assert refused.returncode == 2 and not (tmp_path / "lm").exists(), refused.stderr

