"""Issue 37, item 1: nothing is ever written through a symbolic link. `ln -s /etc/passwd link.json; --output
link.json` replaced the file behind the link with JSON (exit 0). Every writer refuses a link at its file's own
name in one sentence, before the run where the name is known then, and writes a new file renamed over the name
(so a link placed meanwhile is replaced, never followed)."""

from __future__ import annotations

import os

import pytest
from conftest import REPO, SMALL, bounded, run_cli
from helpers import assert_clean_error

from kv_cache.errors import UserError
from kv_cache.safefiles import write_file


@pytest.fixture
def victim(tmp_path):
    """A file standing for /etc/passwd, and a link to it."""
    target = tmp_path / "victim.txt"
    target.write_text("root:x:0:0\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    return target, link


def test_the_writer_never_follows_a_link_and_never_leaves_half_a_file(victim, tmp_path):
    target, link = victim
    with pytest.raises(UserError, match="is a symbolic link .* nothing is written through a link"):
        write_file(link, "{}", "--output")
    assert target.read_text() == "root:x:0:0\n"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    with pytest.raises(UserError):
        write_file(dangling, "{}", "--output")
    plain = tmp_path / "plain.json"
    plain.write_text("old")
    write_file(plain, "new")
    assert plain.read_text() == "new" and sorted(os.listdir(tmp_path)) == ["dangling.json", "link.json",
                                                                           "plain.json", "victim.txt"]


@pytest.mark.parametrize("flag", ["--output", "--xlsx-output"])
def test_a_reference_output_that_is_a_link_is_refused_before_the_run(victim, tmp_path, flag):
    target, link = victim
    extra = ["--output", str(tmp_path / "o.json")] if flag == "--xlsx-output" else []
    r = run_cli(["--num-users", "2", "--gpu-mem-gb", "0", flag, str(link), *extra, "--cache-dir", str(tmp_path),
                 *bounded(2)], timeout=60)
    assert_clean_error(r, flag, "symbolic link")
    assert target.read_text() == "root:x:0:0\n"


def test_an_io_trace_or_its_fio_job_that_is_a_link_is_refused_before_the_run(victim, tmp_path):
    target, link = victim
    for trace, name in ((link, "--io-trace"), (tmp_path / "t.csv", "fio job")):
        if name == "fio job":
            (tmp_path / "t.fio").symlink_to(target)
        r = run_cli(["--config", str(SMALL), "--io-trace", str(trace), "--cache-dir", str(tmp_path), "--output-dir",
                     str(tmp_path / "r"), *bounded(2)], timeout=60)
        assert_clean_error(r, name, "symbolic link")
    assert target.read_text() == "root:x:0:0\n"


def test_an_output_folder_named_with_a_slash_is_a_folder(tmp_path):
    r = run_cli(["--num-users", "2", "--output", str(tmp_path / "newfolder") + "/", "--cache-dir", str(tmp_path),
                 *bounded(2)], timeout=60)
    assert_clean_error(r, "--output", "is a folder")
    assert not (tmp_path / "newfolder").exists()


def test_a_report_file_whose_name_is_a_link_is_refused_not_followed(victim, tmp_path):
    """A link placed in a folder of ours (compare's plots folder here) is refused in one sentence."""
    from kv_cache.report.figure import save

    target, _ = victim
    import matplotlib.pyplot as plt

    (tmp_path / "plot.png").symlink_to(target)
    fig, _ = plt.subplots()
    with pytest.raises(UserError, match="symbolic link"):
        save(fig, tmp_path, "plot.png")
    assert target.read_text() == "root:x:0:0\n"


def test_one_file_for_both_reference_outputs_is_refused_before_the_run(tmp_path):
    """Issue 52, item 5: --output X --xlsx-output X replaced the JSON results with the spreadsheet, exit 0."""
    same = tmp_path / "out.json"
    r = run_cli(["--num-users", "2", "--gpu-mem-gb", "0", "--output", str(same), "--xlsx-output", str(same),
                 "--cache-dir", str(tmp_path), *bounded(2)], timeout=60)
    assert_clean_error(r, "--xlsx-output", "is --output's file too")
    assert not same.exists()


WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND"}
SAFE_FLAGS = {"O_NOFOLLOW", "O_EXCL"}  # O_CREAT | O_EXCL fails on a link too, whatever it points to


def _names(node) -> set[str]:
    import ast

    return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(node)
            if isinstance(n, (ast.Attribute, ast.Name))}


def _unsafe_writes(path, source: str) -> list[str]:
    """Every call of this module that may write a file through a link at its name: os.open with a writing flag but
    neither O_NOFOLLOW nor O_EXCL; open() in a writing mode other than 'x'; Path.write_text / write_bytes."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f, where = node.func, f"{path}:{node.lineno}"
        if isinstance(f, ast.Attribute) and f.attr == "open" and _names(f.value) == {"os"} and len(node.args) > 1:
            flags = _names(node.args[1])
            if flags & WRITE_FLAGS and not flags & SAFE_FLAGS and "devnull" not in _names(node.args[0]):
                found.append(f"{where}: os.open({ast.unparse(node.args[1])})")
        elif isinstance(f, ast.Name) and f.id == "open":
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"),
                                                                None)
            text = mode.value if isinstance(mode, ast.Constant) else "r"
            if set(text) & set("wa+") and "x" not in text:
                found.append(f"{where}: open(..., {text!r})")
        elif isinstance(f, ast.Attribute) and f.attr in ("write_text", "write_bytes"):
            found.append(f"{where}: .{f.attr}()")
    return found


def test_no_module_writes_a_file_in_a_way_that_follows_a_link_at_its_name():
    """Issue 52: a test that plants a link at every name the program writes. Rather than one per name (the names grow
    with every feature), every call that writes a file is read from the source: it refuses a link at its name
    (O_NOFOLLOW, or O_CREAT | O_EXCL, or safefiles.write_file, which renames a new file over the name). The
    schema generator run by hand (python -m ...results_schema) writes into the source tree and is left out."""
    root = REPO / "kv_cache"
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if str(rel) in ("safefiles.py", "recorder/results_schema.py"):
            continue
        found += _unsafe_writes(rel, path.read_text())
    assert found == [], found
    # and the reader itself: each kind of unsafe call is caught
    planted = ("import os\nos.open(p, os.O_WRONLY | os.O_CREAT)\nopen(p, 'w')\nPath(p).write_text('x')\n"
               "os.open(p, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW)\nopen(p, 'x')\nos.open(os.devnull, os.O_WRONLY)\n")
    assert [f.split(": ", 1)[1] for f in _unsafe_writes("planted.py", planted)] == [
        "os.open(os.O_WRONLY | os.O_CREAT)", "open(..., 'w')", ".write_text()"]
