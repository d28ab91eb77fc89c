"""Issue 39, item 1: the README is a front page (under 300 lines) linking every docs page, and every command shown
in the README and docs/ names only flags that exist (ours, a sub-command's, or the MLPerf reference's, which the
front door translates)."""

import re
import shlex
from pathlib import Path

from kv_cache.cli.flags import SUBCOMMANDS

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").glob("*.md"))


def _known_flags() -> set[str]:
    from found import REGISTRY

    from kv_cache.cli import main as cli
    from kv_cache.cli import mlperf

    flags = {s for a in cli.run_parser(REGISTRY)._actions for s in a.option_strings}
    flags |= mlperf.REFERENCE_FLAGS | {"--debug", "--allow-run-as-root", "--oversubscribe", "--hostfile", "-np"}
    for name in SUBCOMMANDS:
        make = getattr(cli, f"_{name}_parser", None)
        if make is not None:
            flags |= {s for a in make()._actions for s in a.option_strings}
    return flags | _subcommand_flags()


def _subcommand_flags() -> set[str]:
    """The flags each sub-command's parser declares (read from its source: they are built inside its command)."""
    source = "".join((REPO / "kv_cache" / "cli" / n).read_text() for n in ("main.py", "flags.py", "fleet.py"))
    return set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', source))


def commands(text: str) -> list[str]:
    """Every command line the text shows: in ```sh blocks (continuations joined) and in `inline code`."""
    found = []
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            found.append(line.split(" #")[0])
    found += re.findall(r"`((?:python3? )?(?:kv_cache_benchmark\.py|-m kv_cache)[^`]*)`", text)
    found += [f"x {m}" for m in re.findall(r'make run ARGS="([^"]*)"', text)]
    return [c for c in found if "kv_cache_benchmark.py" in c or c.startswith("x ")]


def _flags_of(command: str) -> list[str]:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return [w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)]


def test_every_documented_command_names_only_flags_that_exist():
    known = _known_flags()
    unknown = []
    for page in [REPO / "README.md", *PAGES]:
        for command in commands(page.read_text()):
            unknown += [f"{page.name}: {flag} in: {command.strip()[:100]}" for flag in _flags_of(command)
                        if flag not in known]
    assert not unknown, "\n".join(unknown)


# pages whose inline flags are other tools' (fio, the bench scripts) as well as ours
OTHER_TOOLS = {"performance.md", "testing.md"}


def test_every_flag_named_in_the_text_exists():
    """`--flag` in running text too (the LMCache table named `--decode-writes`, a flag that never existed: the
    setting's flag is --no-decode-writes). A prefix ending in "-" names a family; `--num-user` is the MLPerf
    reference's abbreviation, which the front door expands."""
    known = _known_flags() | {"--num-user"}
    unknown = [f"{page.name}: {m}" for page in [REPO / "README.md", *PAGES] if page.name not in OTHER_TOOLS
               for m in re.findall(r"`(--[a-z][a-z0-9-]*[a-z0-9])", page.read_text()) if m not in known]
    assert not unknown, unknown


def test_the_check_catches_a_flag_that_does_not_exist():
    text = "```sh\npython kv_cache_benchmark.py --users 8 --no-such-flag 3\n```\n`kv_cache_benchmark.py --dration 5`"
    known = _known_flags()
    assert [f for c in commands(text) for f in _flags_of(c) if f not in known] == ["--no-such-flag", "--dration"]


def test_the_readme_is_a_front_page_that_links_every_docs_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 300
    linked = set(re.findall(r"\]\(docs/([a-z0-9-]+\.md)\)", text))
    assert {p.name for p in PAGES} <= linked, sorted({p.name for p in PAGES} - linked)
    assert "Quick start" in text and 6 <= len(commands(text.split("## Quick start")[1].split("##")[0])) <= 12


def test_every_relative_link_of_the_docs_resolves():
    broken = []
    for page in [REPO / "README.md", REPO / "CHANGELOG.md", *PAGES]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, broken


def test_a_shipped_sample_is_as_long_as_the_text_says():
    """The README called traces/mooncake_conversation_sample.jsonl a 400-request sample; it holds 200."""
    said = []
    for page in [REPO / "README.md", REPO / "traces" / "README.md", *PAGES]:
        text = " ".join(page.read_text().split())
        said += re.findall(r"a ([\d,]+)-request sample is `(traces/[^`]+)`", text)
    assert said
    for n, path in said:
        assert len((REPO / path).read_text().splitlines()) == int(n.replace(",", "")), (n, path)


def test_the_results_docs_give_the_schema_version_the_program_writes():
    """docs/results.md said schema_version 16 while the program wrote 18."""
    from kv_cache.recorder.results_schema import SCHEMA_VERSION

    (said,) = re.findall(r"\| `schema_version` \| (\d+) \|", (REPO / "docs" / "results.md").read_text())
    assert int(said) == SCHEMA_VERSION


def test_every_sub_command_has_its_line_in_the_help():
    """--help listed six sub-commands; fleet, the seventh, ran but was not among them (two lists of them)."""
    import subprocess
    import sys

    from kv_cache.cli.main import COMMANDS

    assert COMMANDS.keys() == {"run", *SUBCOMMANDS}
    said = subprocess.run([sys.executable, str(REPO / "kv_cache_benchmark.py"), "--help"], capture_output=True,
                          text=True, timeout=60).stdout
    for name in SUBCOMMANDS:
        assert f"\n  {name} " in said, name
    assert max(map(len, said.splitlines())) <= 100
