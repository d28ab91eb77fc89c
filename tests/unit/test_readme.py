"""Issue 18: the README's first screen is true: what make install installs, the test time, the ignore file."""

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_names_every_dependency_make_install_installs():
    readme = REPO / "README.md"
    head = readme.read_text().split("## What a run does")[0]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = re.search(r'-e "\.\[([a-z,]+)\]"', (REPO / "Makefile").read_text()).group(1).split(",")
    names = [re.split(r"[<>=\[]", d)[0] for d in project["dependencies"]]
    names += [re.split(r"[<>=\[]", d)[0] for e in extras for d in project["optional-dependencies"][e]]
    missing = [n for n in names if n.split("-")[0].lower() not in head.lower()]
    assert not missing, f"README's first screen does not say make install installs: {missing}"


def test_the_readme_test_time_is_the_fast_suite_and_gitignore_holds():
    head = (REPO / "README.md").read_text()[:2500]
    assert "make test " in head and "2 minutes" in head and "make test-all" in head
    ignore = (REPO / ".gitignore").read_text().splitlines()
    assert ".venv/" in ignore  # the README recommends python3 -m venv .venv
    for line in ignore:
        if line.startswith("!"):
            assert (REPO / line[1:]).exists(), f".gitignore keeps {line[1:]}, which does not exist"
