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


def _markers_left_out(target: str) -> set[str]:
    """The pytest markers a Makefile target's -m expression leaves out ("not gpu and not mpi" -> {gpu, mpi})."""
    recipe = re.search(rf"^{target}:.*\n\t(.*)$", (REPO / "Makefile").read_text(), re.M).group(1)
    return set(re.findall(r"not (\w+)", re.search(r'-m "([^"]*)"', recipe).group(1)))


def test_the_readme_and_the_makefile_say_the_same_of_what_make_test_runs():
    head = (REPO / "README.md").read_text()[:2500]
    line = next(x for x in head.splitlines() if x.startswith("make test "))
    left_out = _markers_left_out("test")
    assert left_out == {"gpu", "mpi", "slow"}
    assert "no GPU, MPI or slow tests" in line and "make test-all" in line
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].splitlines()[0]
    assert "no GPU, MPI or slow tests" in recipe
    took = re.search(r"about \d+ minutes on 2 cores", line)  # the time it takes, the same in both
    assert took and took.group(0) in recipe
    mpi_help = next(x for x in makefile.splitlines() if x.startswith("test-mpi:"))
    assert "make test does not" in mpi_help  # it once said the 2-rank tests also run in make test
    text = (REPO / "README.md").read_text()
    assert "`make test` runs a 2-rank" not in text


def test_the_readme_test_time_is_the_fast_suite_and_gitignore_holds():
    head = (REPO / "README.md").read_text()[:2500]
    assert "make test " in head and "make test-all" in head
    ignore = (REPO / ".gitignore").read_text().splitlines()
    assert ".venv/" in ignore  # the README recommends python3 -m venv .venv
    for line in ignore:
        if line.startswith("!"):
            assert (REPO / line[1:]).exists(), f".gitignore keeps {line[1:]}, which does not exist"
