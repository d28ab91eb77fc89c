"""Settings: config.yaml equals the schema; unknown keys and wrong types are refused by name."""

import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from found import REGISTRY, SECTIONS

from kv_cache.config import REPO_CONFIG, Settings, default_dict, iter_keys, resolve
from kv_cache.config.load import iter_media_keys
from kv_cache.errors import UserError

REPO = Path(__file__).resolve().parents[2]


def test_config_yaml_holds_every_default_of_the_schema():
    assert yaml.safe_load(REPO_CONFIG.read_text()) == default_dict(SECTIONS)


def test_every_key_is_documented_in_config_yaml():
    text = REPO_CONFIG.read_text()
    for dotted, f, _ in (*iter_keys(Settings), *iter_media_keys(SECTIONS)):
        assert f.metadata.get("help"), dotted
        assert f"{dotted.split('.')[-1]}:" in text, dotted


def test_every_key_is_used_by_the_code():
    import pathlib

    code = "\n".join(p.read_text() for p in pathlib.Path(REPO_CONFIG.parent, "kv_cache").rglob("*.py")
                     if p.name != "config.py")
    for dotted, _, _ in (*iter_keys(Settings), *iter_media_keys(SECTIONS)):
        leaf = dotted.split(".")[-1]
        if dotted.startswith("profiles."):
            continue  # read through getattr(profile, ...) in the synthetic source
        if dotted.startswith("qos.") and dotted.count(".") == 2 and leaf != "priority":
            from kv_cache.recorder.slas import CHECKS  # SLA targets are read by name from the judge's checks

            assert leaf in {f"{m}_{p}_ms" for m, p in CHECKS}, f"{dotted} is never judged"
            continue
        assert f".{leaf}" in code, f"{dotted} is never read"


def test_precedence_defaults_file_set_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("workload: {users: 3}\nrun: {seed: 5}\n")
    s = resolve(str(f), ["run.seed=6", "tiers.cpu_mem_gb=1.5"], {"workload.users": "9"},
                media_sections=SECTIONS)
    assert (s.workload.users, s.run.seed, s.tiers.cpu_mem_gb) == (9, 6, 1.5)
    assert s.model.block_tokens == 256


@pytest.mark.parametrize("text,msg", [
    ("tiers: {cpu_memgb: 1}", "unknown key 'tiers.cpu_memgb'"),
    ("bogus: {a: 1}", "unknown key 'bogus'"),
    ("workload: {users: many}", "workload.users must be an integer"),
    ("workload: {users: 0}", "workload.users must be >= 1"),
    ("tiers: {nvme_layout: stripes}", "tiers.nvme_layout must be one of slab, file-per-block"),
    ("run: {keep_data: maybe}", "run.keep_data must be true or false"),
    ("profiles: {chatbot: {think_time_s: [2, 1]}}", "profiles.chatbot.think_time_s must have low <= high"),
    ("tiers: 5", "section tiers must be a mapping"),
    ("- a\n- b", "must hold a mapping"),
    ("run: {seed: [1", "is not valid YAML"),
])
def test_bad_files_are_refused_with_the_key(tmp_path, text, msg):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(UserError, match=msg):
        resolve(str(f), [], {}, media_sections=SECTIONS)


def test_an_engine_not_in_the_table_is_one_sentence(tmp_path):
    """The engine names are the engines table's (issue 40): a file naming another is refused by the options' check,
    listing the table."""
    from kv_cache.run.checks import check_options

    f = tmp_path / "c.yaml"
    f.write_text("tiers: {io_engine: aio}\n")
    with pytest.raises(UserError, match="--io-engine aio: no such engine; use one of buffered, direct, io_uring, mmap"):
        check_options(resolve(str(f), [], {}, media_sections=SECTIONS), False, REGISTRY)


def test_missing_config_file():
    with pytest.raises(UserError, match="does not exist"):
        resolve("/nonexistent/c.yaml", [], {}, media_sections=SECTIONS)


def test_ranges_from_the_command_line():
    s = resolve(None, ["profiles.coding.context_tokens=100,200"], {"workload.system_prompt_tokens": "10,20"},
                media_sections=SECTIONS)
    assert s.profiles.coding.context_tokens == (100, 200)
    assert s.workload.system_prompt_tokens == (10, 20)


def test_config_yaml_is_what_the_generator_writes():
    from kv_cache.config.doc import render

    assert REPO_CONFIG.read_text() == render(SECTIONS), "run: python -m kv_cache.cli.configdoc config.yaml"


def test_every_number_a_user_gives_is_bounded_above():
    """A 1e30 s duration never ends and a 1e30 GiB tier never finishes allocating: every number has a ceiling."""
    unbounded = [d for d, f, t in (*iter_keys(Settings), *iter_media_keys(SECTIONS))
                 if (t in (int, float) or typing.get_origin(t) is tuple) and f.metadata.get("hi") is None]
    assert unbounded == []


@pytest.mark.parametrize("flag, value", [("run.duration_s", 1e30), ("run.warmup_s", 1e30),
                                         ("workload.generation_ms_per_token", 1e30), ("tiers.gpu_mem_gb", 1e30),
                                         ("profiles.chatbot.context_tokens", (1, 10**30))])
def test_a_number_past_its_ceiling_is_refused_with_the_flag(flag, value):
    with pytest.raises(UserError, match="must be <="):
        resolve(None, [], {flag: value}, media_sections=SECTIONS)


def test_a_mistake_names_what_the_user_typed_not_another_source(tmp_path):
    """Issue 37, item 7: `--set nosuch.key=1` was blamed on config.yaml, `--set models.tiny=...` on "config", and a
    settings file's scalar section on the --set (or flag) that set a key inside it."""
    from kv_cache.errors import UserError

    with pytest.raises(UserError, match=r"^--set nosuch.key: unknown key 'nosuch'"):
        resolve(None, ["nosuch.key=1"], {}, media_sections=SECTIONS)
    with pytest.raises(UserError, match=r"^--set models.tiny: models.tiny must be a mapping"):
        resolve(None, ["models.tiny=3"], {}, media_sections=SECTIONS)
    scalar = tmp_path / "s.yaml"
    scalar.write_text("run: 5\n")
    with pytest.raises(UserError, match=r"^config file .*s.yaml: section run must be a mapping, got 5"):
        resolve(str(scalar), ["run.seed=1"], {}, media_sections=SECTIONS)


def test_settings_resolve_against_the_media_sections_given_not_an_import_side_effect():
    """Issue 40, item 2: resolving media: {valkey: ...} before any tier module was imported failed with "unknown
    medium (known: none)". resolve takes the sections; the registry finds every medium first. In a fresh
    interpreter: this one has imported every medium already."""
    code = ("import sys\n"
            "from kv_cache.config import resolve\n"
            "assert not any(m.startswith('kv_cache.tiers.') for m in sys.modules), 'a medium imported early'\n"
            "from kv_cache.run.registry import discover\n"
            "s = resolve(None, ['media.valkey.timeout_s=3'], {}, media_sections=discover().sections())\n"
            "print(s.media['valkey'].timeout_s)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3.0"


def test_the_schema_module_is_not_an_entry_that_empties_config_yaml():
    """python -m kv_cache.config.doc printed nothing (exit 0), so the docs' `> config.yaml` emptied the file: it now
    refuses, naming the real entry, which writes the file itself (no redirect to get wrong)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "kv_cache.config.doc"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode != 0 and not r.stdout and "python -m kv_cache.cli.configdoc config.yaml" in r.stderr
    for page in ("docs/settings.md", "docs/architecture.md"):
        assert "kv_cache.config.doc >" not in (REPO / page).read_text(), page
