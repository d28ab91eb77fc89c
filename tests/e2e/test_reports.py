"""The report folder, plots, compare, the I/O trace and the live line."""

import csv
import io
import json
import os
import shutil
import struct
import time

import pytest
import yaml
import zstandard
from conftest import bounded, run_cli

from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.results_schema import SCHEMA_VERSION
from kv_cache.report.live import LiveLine

PLOTS = ("latency_percentiles.png", "throughput.png", "occupancy.png", "hit_rate.png")


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_folder_files_exist_and_parse(small_run):
    r = run_cli(small_run("a", "--duration", "3"))  # three seconds of time series: the run is bounded by time
    assert r.returncode == 0, r.stderr
    folder = small_run.out / "a"
    settings = yaml.safe_load((folder / "settings.yaml").read_text())
    assert settings["model"]["name"] == "llama8b" and settings["run"]["duration_s"] == 3.0
    rows = list(csv.DictReader((folder / "timeseries.csv").open()))
    assert len(rows) >= 3
    for col in ("t_s", "nvme_read_gbps", "cpu_write_p99_ms", "queue_depth", "nvme_used_bytes", "hit_rate"):
        assert col in rows[0], col
    assert any(float(row["nvme_write_gbps"]) > 0 for row in rows)
    summary = (folder / "summary.md").read_text()
    assert "Per-block latency" in summary and "![latency_percentiles](latency_percentiles.png)" in summary
    for name in PLOTS:
        w, h = png_size(folder / name)
        assert 600 <= w <= 2000 and 300 <= h <= 1500 and (folder / name).stat().st_size > 10_000, name
    # settings.yaml given back to --config repeats the run: test_first_run_cli.py runs it


@pytest.mark.slow
def test_compare_two_real_runs(small_run, tmp_path):
    for run_id, engine in (("d", "direct"), ("m", "mmap")):
        r = run_cli(small_run(run_id, *bounded(8), "--io-engine", engine))
        assert r.returncode == 0, r.stderr
    out = tmp_path / "cmp"
    r = run_cli(["compare", str(small_run.out / "d"), str(small_run.out / "m"), "--output", str(out)])
    assert r.returncode == 0, r.stderr
    assert "2 / 1" in r.stdout and "requests / s" in r.stdout and "mmap" in r.stdout
    assert "run 2: m" in r.stdout  # the runs' names above the table, the columns numbered
    lines = [line for line in r.stdout.splitlines() if line.startswith("storage write GB/s")]
    assert lines and lines[0].rstrip().endswith("x")
    assert png_size(out / "compare_headlines.png")[0] >= 600
    bad = run_cli(["compare", str(small_run.out / "d")])
    assert bad.returncode == 2 and "at least two runs" in bad.stderr


@pytest.mark.slow
def test_io_trace_rows_and_fio_job(small_run, tmp_path):
    trace = tmp_path / "ops.csv.zst"
    r = run_cli(small_run("t", *bounded(10), "--io-trace", str(trace)))
    assert r.returncode == 0, r.stderr
    with open(trace, "rb") as f:
        rows = list(csv.DictReader(io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f))))
    res = small_run.results("t")
    measured = [row for row in rows if row["measured"] == "1"]
    ops = sum(sum(v.values()) for v in res["ops"].values())
    assert len(measured) == ops > 0
    assert {row["op"] for row in rows} >= {"write", "demote"} and all(len(row["key"]) == 16 for row in rows)
    assert all(float(row["intended_start_s"]) <= float(row["start_s"]) + 1e-6 for row in rows)
    job = (tmp_path / "ops.fio").read_text()
    assert "rw=randrw" in job and "bs=2097152" in job and f"directory={small_run.cache}" in job
    # batched (the default) on the direct engine: each of the 2 workers kept up to its pool's 32 I/Os in flight
    assert "ioengine=psync" in job and "numjobs=64" in job and "iodepth=1" in job
    # the jobs' files together are the tier's size: each job's was the tier's / workers, 32 times the tier in all
    size = int(next(line for line in job.splitlines() if line.startswith("size="))[5:])
    capacity = res["run"]["tiers"]["nvme"]["capacity_bytes"]
    assert capacity - 64 * 2097152 < 64 * size <= capacity, (size, capacity)


@pytest.mark.slow
def test_each_trials_io_trace_keeps_its_ending(small_run, tmp_path):
    """--trials 2 --io-trace ops.csv.zst wrote ops.csv.trial1.zst: no longer a .csv.zst by its name. The trial's
    mark goes before the ending, and the fio job beside each is named after it."""
    r = run_cli(small_run("tt", *bounded(3), "--trials", "2", "--io-trace", str(tmp_path / "ops.csv.zst")))
    assert r.returncode == 0, r.stderr
    for k in (1, 2):
        with open(tmp_path / f"ops.trial{k}.csv.zst", "rb") as f:
            assert "key" in next(csv.reader(io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f))))
        assert "rw=" in (tmp_path / f"ops.trial{k}.fio").read_text()


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_live_line_refreshes_on_a_terminal_and_logs_otherwise(monkeypatch):
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(100, 24): os.terminal_size((120, 24)))
    rec = Recorder()
    rec.start_measuring(1)
    for tty, marker in ((True, "\r"), (False, "\n")):
        out = _Stream(tty)
        live = LiveLine(rec, 60, "nvme", out)
        live.next = 0  # due now
        live(5)
        text = out.getvalue()
        assert marker in text and "5 requests" in text and "nvme read" in text and "hit 0.0%" in text
        assert live.every_s == (1.0 if tty else 10.0)
    out = _Stream(True)  # a rank under mpirun: its pty is forwarded line by line, so one line per update
    live = LiveLine(rec, 60, "nvme", out, refresh=False)
    live.next = 0
    live(7)
    assert "\r" not in out.getvalue() and out.getvalue().endswith("\n") and live.every_s == 10.0


def test_the_live_line_counts_the_run_not_the_set_up_before_it(monkeypatch):
    """The line said '[warm-up   15/6 s]' for a 1 s warm-up and a 5 s window: its clock started when the stages were
    built, before the traffic's analysis and the preconditioning. It starts at the dispatcher's first tick."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    rec = Recorder()
    out = _Stream(False)
    live = LiveLine(rec, 6, "nvme", out)
    now[0] += 9.0  # the set-up: 9 s
    live(0)  # the dispatcher's first tick: the clock starts, nothing is due yet
    assert out.getvalue() == ""
    now[0] += 10.0
    live(1)
    assert out.getvalue().startswith("  [warm-up 10/6 s] 1 requests"), out.getvalue()


def test_a_logged_live_line_keeps_its_words_through_the_run(monkeypatch):
    """A logged run (make run's output, the README's `try one`) switched to the terse '[meas 41/60s] ... nvme r 0.01 w
    3.71 GB/s p95 102.4 ms hit 4%' once the read p95 reached 100 ms: the long form was 101 columns with its padding,
    which a log (not redrawn) does not need. The usual figures keep the long form."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    rec = Recorder()
    rec.start_measuring(1)
    monkeypatch.setattr(rec, "recent_percentile", lambda tier, op, pct: 254.0)
    out = _Stream(False)
    live = LiveLine(rec, 60, "nvme", out)
    live(0)
    now[0] += 41.0
    live(93)
    line = out.getvalue().rstrip("\n")
    assert line.startswith("  [measuring 41/60 s] 93 requests, nvme read ") and line.endswith("hit 0.0%"), line
    assert "read p95 254.0 ms" in line and len(line) <= 100, line


def test_the_live_line_fits_the_terminal(monkeypatch):
    """Issue 39, item 4: the ~100-column progress line wrapped at 80 and redrew badly: it fits the terminal, less
    one column, in its short form when the long one does not fit."""
    rec = Recorder()
    rec.start_measuring(1)
    for cols in (80, 60, 200):
        monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(100, 24), c=cols: os.terminal_size((c, 24)))
        out = _Stream(True)
        live = LiveLine(rec, 60, "nvme", out)
        live.next = 0
        live(123456)
        line = out.getvalue().lstrip("\r")
        assert len(line) == min(cols, 101) - 1 and "123,456" in line, (cols, line)


def test_every_line_of_a_run_fits_100_columns(small_run):
    """Issue 39, item 4: 11-39 summary lines of a run exceeded 120 columns (up to 393): prose wraps at 100."""
    r = run_cli(small_run("wide", *bounded(6), quiet=False))
    assert r.returncode == 0, r.stderr
    long = [line for line in r.stdout.splitlines() if len(line) > 100 and " " in line.strip()]
    assert not long, long


def test_the_set_up_is_said_before_it_is_done(small_run):
    """make run printed nothing for its first 13 s (a 4 GiB CPU tier pre-touched, the NVMe slab, the workers'
    probe), then every set-up line at once: silence that reads as a hang. A line says what is being built first."""
    r = run_cli(small_run("said", *bounded(2), quiet=False))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("  building the tiers: ") and "CPU memory pre-touched" in first, r.stdout[:500]
    assert r.stdout.index("building the tiers") < r.stdout.index("  tier cpu:")


def test_a_run_that_does_not_fit_is_refused_before_it_says_it_builds(small_run):
    """--cpu-mem-gb 100 on a 24 GiB host printed 'building the tiers: 100 GiB of CPU memory pre-touched' and then
    refused the run for its memory budget: nothing was built. The line comes once the run is known to fit."""
    r = run_cli(small_run("big", "--cpu-mem-gb", "100000", *bounded(2), quiet=False))
    assert r.returncode == 2 and "memory budget" in r.stderr, r.stderr
    assert "building the tiers" not in r.stdout, r.stdout


def test_quiet_prints_nothing(small_run):
    r = run_cli(small_run("q", *bounded(4)))
    assert r.returncode == 0 and r.stdout == ""
    assert json.loads((small_run.out / "q" / "results.json").read_text())["schema_version"] == SCHEMA_VERSION


def test_report_writes_the_mlperf_fields_of_any_run(small_run, tmp_path):
    """Issue 40, item 1: the MLPerf exporter is a report of Results (report/mlperf/), reachable for any run."""
    assert run_cli(small_run("m", *bounded(4))).returncode == 0
    out = tmp_path / "mlperf.json"
    r = run_cli(["report", str(small_run.out / "m"), "--mlperf-output", str(out)])
    assert r.returncode == 0, r.stderr
    fields = json.loads(out.read_text())
    assert fields["summary"]["total_requests"] > 0 and "MLPerf reference assessment:" in r.stdout


def test_a_logged_live_line_fits_100_columns_too():
    """Issue 39, item 4: off a terminal (a log, make run's output) the line is logged whole: 102 columns."""
    rec = Recorder()
    rec.start_measuring(1)
    out = _Stream(False)
    live = LiveLine(rec, 3600, "objectstore", out)  # a remote tier's long name, an hour's run, many requests
    live.next = 0
    live(12345678)
    line = out.getvalue().rstrip("\n")
    assert len(line) <= 100 and "] 12,345,678 requests" in line, line  # the phrase the NIXL tests wait for


def test_a_decode_node_s_live_line_shows_the_handoff_it_loads_from():
    """A decode node's line read 'nvme read 0.00 / write 0.00 GB/s' through its run: its own tiers take only its
    decode blocks, and what it measures is the handoff it loads from (1.86 GB/s there)."""
    from types import SimpleNamespace

    from found import SECTIONS

    from kv_cache.config import resolve
    from kv_cache.run.progress import Progress

    tiers = SimpleNamespace(tiers=[SimpleNamespace(name=n, slot_bytes=1) for n in ("cpu", "nvme")])
    for role, shown in (("decode", "handoff"), ("prefill", "nvme"), ("both", "nvme")):
        s = resolve(None, [], {"disagg.role": role}, media_sections=SECTIONS)
        assert Progress(s, Recorder(), None, tiers, False, None).live.tier == shown, role
