"""Issue 46, point 5: every path, module, page or section that a comment, docstring, message or doc names exists.

About ten comments and one printed message sent readers to README sections that had moved to docs/, the docs told
them to run a module that has no main, and the README cited a file a user does not have. Scanned here: the source
of kv_cache/, bench/, mlperf/, tests/ and the entry point (comments, docstrings and messages are all in it), and
every page of docs/ with the READMEs. CHANGELOG.md is history and keeps the names of its day."""

import importlib.util
import re
from pathlib import Path

from conftest import REPO

SHARED = REPO.parent / "shared"
SOURCES = [p for d in ("kv_cache", "bench", "mlperf", "tests") for p in (REPO / d).rglob("*.py")] + [
    REPO / "kv_cache_benchmark.py"]
PAGES = [*(REPO / "docs").glob("*.md"), REPO / "README.md", REPO / "traces" / "README.md",
         REPO / "reports" / "README.md"]
PATH = re.compile(r"(?<![\w./-])((?:kv_cache|tests|bench|docs|mlperf|traces|\.ci)/[\w./+-]*\w)")
SHARED_PATH = re.compile(r"\.\./shared/([\w./-]*\w)")
MODULE = re.compile(r"python3? -m (kv_cache[\w.]*)")
SECTION = re.compile(r"(README|docs/[\w-]+\.md)(?:'s|:)? \\?\"([^\"\\]+)\\?\"")
TEMPLATE = re.compile(r"[<>{}*$]|\.\.\.")


def _headings(page: Path) -> list[str]:
    """A page's sections: its headings and its bold paragraph leads (**Tokens.** ...)."""
    text = page.read_text()
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")] + re.findall(
        r"^\*\*([^*]+)\*\*", text, re.M)


def _texts() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in [*SOURCES, *PAGES] if p.name != Path(__file__).name]


def missing_references(texts: list[tuple[Path, str]]) -> list[str]:
    bad = []
    for path, text in texts:
        where = path.relative_to(REPO)
        for m in PATH.finditer(text):
            ref = m.group(1).rstrip(".")
            tail = text[m.end():m.end() + 1]
            if TEMPLATE.search(text[m.start():m.end() + 2]) or tail in "<{*" or ref.startswith("bench/out/"):
                continue  # a pattern, or what a run writes (bench/out/ is made by make bench)
            if not (REPO / ref).exists() and not (REPO / ref.rstrip("/")).exists():
                bad.append(f"{where}: {ref} does not exist")
        for m in SHARED_PATH.finditer(text):
            if path.suffix == ".md" and path.name == "README.md" and path.parent == REPO:
                bad.append(f"{where}: ../shared/{m.group(1)} is the development workspace's, not a user's")
            elif SHARED.is_dir() and not (SHARED / m.group(1)).exists():
                bad.append(f"{where}: ../shared/{m.group(1)} does not exist")
        for m in MODULE.finditer(text):
            if importlib.util.find_spec(m.group(1)) is None:
                bad.append(f"{where}: python -m {m.group(1)}: no such module")
        for m in SECTION.finditer(text):
            page = REPO / ("README.md" if m.group(1) == "README" else m.group(1))
            name = " ".join(m.group(2).split()).lower()  # a docstring may wrap the section's name
            if not page.exists() or not any(name in h.lower() for h in _headings(page)):
                bad.append(f"{where}: {m.group(1)} has no section \"{m.group(2)}\"")
    return bad


def test_every_named_path_module_and_section_exists():
    bad = missing_references(_texts())
    assert not bad, "\n".join(bad)


def test_the_check_finds_what_moved():
    """It can fail: the comment of the issue, a README section that moved to docs/, and a module with a typo."""
    planted = [(REPO / "kv_cache" / "x.py", 'computed by our rules (README: "MLPerf front door").'),
               (REPO / "docs" / "x.md", "see kv_cache/tiers/uring2.py and python -m kv_cache.cli.confdoc"),
               (REPO / "README.md", "The design: `../shared/DESIGN.md`.")]
    bad = missing_references(planted)
    assert len(bad) == 4, bad
