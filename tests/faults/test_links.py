"""Issue 37, item 1: nothing is ever written through a symbolic link. `ln -s /etc/passwd link.json; --output
link.json` replaced the file behind the link with JSON (exit 0). Every writer refuses a link at its file's own
name in one sentence, before the run where the name is known then, and writes a new file renamed over the name
(so a link placed meanwhile is replaced, never followed)."""

from __future__ import annotations

import os

import pytest
from conftest import SMALL, bounded, run_cli
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
