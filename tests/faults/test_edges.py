"""Issue 28: the last rows of the fault table, each on the real CLI.

Flags without effect, numbers past what a machine and a day hold, inputs that are not regular text files,
results files that are not what this tool writes, messages that name what the user typed, signals in the drain
and while results are written, a bug in a worker or in the report said in one line with its traceback kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SMALL, TRACES_ABSENT, bounded, run_cli
from helpers import assert_clean_error, sentences

pytestmark = pytest.mark.slow  # real CLI runs: make test-all (CI); make test stays quick

CASES = [
    # flags with no effect in the chosen mode
    (["--rag-top-k", "8"], ["--rag-top-k", "--rag"]),
    (["--rag-zipf", "0.5"], ["--rag-zipf", "--rag"]),
    (["--gpu", "off", "--gpu-mem-gb", "4"], ["--gpu-mem-gb", "GPU tier"]),
    (["--gpu", "off", "--gpus", "2"], ["--gpus", "GPU tier"]),
    (["--gpu-sim-gbps", "10"], ["--gpu-sim-gbps", "--gpu simulated"]),
    (["--shared-storage"], ["--shared-storage", "MPI"]),
    (["--precondition-passes", "3"], ["--precondition-passes", "--precondition"]),
    (["--precondition-steady", "0.1"], ["--precondition-steady", "--precondition"]),
    (["--io-unit", "block", "--layers-per-io", "4"], ["--layers-per-io", "--io-unit layer"]),
    (["--nvme-layout", "file-per-block", "--slab-file-gb", "1"], ["--slab-file-gb", "--nvme-layout slab"]),
    (["--steady-window-s", "5"], ["--steady-window-s", "--steady-state"]),
    (["--autoscale-step-s", "2"], ["--autoscale-step-s", "--autoscale"]),
    (["--semantic-top-k", "3"], ["--semantic-top-k", "--semantic"]),
    (["--disagg-wait-s", "5"], ["--disagg-wait-s", "--role"]),
    (["--trace-speedup", "2"], ["--trace-speedup", "--trace"]),
    (["--think-time-s", "0,1"], ["--think-time-s", "--trace"]),
    # values that were accepted and meant nothing, or hung, or overflowed
    (["--cpu-mem-gb", "1e-30"], ["--cpu-mem-gb 1e-30 holds no", "or 0 to turn the CPU tier off"]),
    # the size typed is short, not the disk: "has too little space ... (79 GiB free); free space"
    (["--nvme-gb", "0.001"], ["--nvme-gb 0.001 holds no 2.0 MiB object", "pass --nvme-gb 0.01 or more"]),
    (["--gpu", "simulated", "--gpu-mem-gb", "1e-6"], ["--gpu-mem-gb 1e-06 holds no"]),
    (["--semantic", "--semantic-threshold", "-1"], ["--semantic-threshold", "must be >= 0"]),
    (["--model", "LLAMA8B"], ["unknown model 'LLAMA8B'", "case-sensitive", "'llama8b'"]),
    (["--duration", "1e30"], ["--duration", "must be <= 86400"]),
    (["--warmup", "1e30"], ["--warmup", "must be <= 86400"]),
    (["--generation-ms-per-token", "1e30"], ["--generation-ms-per-token", "must be <="]),
    (["--gpu", "simulated", "--gpu-mem-gb", "1e30"], ["--gpu-mem-gb", "must be <="]),
    (["--set", "profiles.chatbot.context_tokens=[1,1.0e+30]"], ["--set profiles.chatbot.context_tokens",
                                                                 "must be <="]),
    (["--io-trace", "/etc/kvbench-trace.csv"], ["--io-trace", "system folder"]),
    # MLPerf reference flags: checked, and named as typed
    (["--precondition-size-gb", "nan"], ["--precondition-size-gb", "finite number"]),
    (["--num-users", "4", "--users", "8"], ["--num-users and --users both set workload.users"]),
    (["--num-users", "-1"], ["--num-users: workload.users must be >= 1"]),
    # the section a --set gave is named, not the config file
    (["--set", "run={a: 1}"], ["--set run: unknown key 'run.a'"]),
    (["--set", "run=5"], ["--set run=5: run is a section"]),
    # argparse: one line, not its usage block
    (["--kv-dtype", "int3"], ["invalid choice", "--help"]),
    (["--no-such-flag"], ["unrecognized arguments: --no-such-flag", "--help"]),
]


@pytest.mark.parametrize("extra,fragments", CASES, ids=[" ".join(c[0])[:50] for c in CASES])
def test_bad_input_is_one_sentence_and_exit_2(small_run, extra, fragments):
    r = run_cli(small_run("x", *extra), timeout=60)
    assert_clean_error(r, *fragments)
    assert "config file" not in r.stderr or "--config" in extra  # what the user typed is named, not the file
    assert not (small_run.out / "x").exists() and os.listdir(small_run.cache) == []


def test_a_storage_flag_under_null_io_is_said_and_ignored(small_run):
    r = run_cli(small_run("n", "--null-io", "--io-engine", "mmap", *bounded(4), quiet=False))
    assert r.returncode == 0, r.stderr
    assert "--io-engine has no effect with --null-io" in r.stdout
    assert any("--io-engine has no effect" in n for n in small_run.results("n")["run"]["notes"])


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_special_files_are_refused_before_they_are_read(fifo, tmp_path):
    # a FIFO would block the read forever, /dev/zero fill the memory: both refused from their type
    assert_clean_error(run_cli(["--config", str(fifo)], timeout=30), "is a FIFO", "not a regular file")
    assert_clean_error(run_cli(["--config", "/dev/zero"], timeout=30), "/dev/zero is a character device")
    assert_clean_error(run_cli(["report", str(fifo)], timeout=30), "is a FIFO")
    assert_clean_error(run_cli(["--trace", str(fifo)], timeout=30), "trace file", "is a FIFO")
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of nothing, no disk used
    assert_clean_error(run_cli(["--config", str(huge)], timeout=30), "more than the", "such a file can be")


@pytest.mark.parametrize("head", [b"\xff\xfeT\x00i\x00m\x00e\x00", b"\x00\x01\x02\x03binary"])
def test_a_binary_or_utf16_trace_is_named_not_printed(small_run, tmp_path, head):
    trace = tmp_path / "t.csv"
    trace.write_bytes(head * 100)
    r = run_cli(small_run("x", "--trace", str(trace)), timeout=60)
    assert_clean_error(r, "is not text (binary or UTF-16)")
    assert len(r.stderr) < 250  # the path and one sentence, no mojibake


RESULTS_DAMAGE = [
    ("Infinity", lambda d: d["requests"].__setitem__("per_s", "__INF__"), "Infinity is not a number"),
    ("1e400", lambda d: d["requests"].__setitem__("per_s", "__BIG__"), "not a finite number"),
    ("10^400 as an integer", lambda d: d["requests"].__setitem__("completed", 10**400), "within 64 bits"),
    ("a string for a number", lambda d: d["latency_ms"]["nvme"]["write"].__setitem__("p95", "fast"),
     "latency_ms.nvme.write.p95 is string"),
    ("a list for a section", lambda d: d.__setitem__("qos", []), "qos is not an object"),
]


@pytest.fixture(scope="module")
def one_results(tmp_path_factory):
    """A real results.json of a short run (made once for the results-file cases)."""
    out = tmp_path_factory.mktemp("one")
    (out / "cache").mkdir()
    r = run_cli(["--config", str(SMALL), "--output-dir", str(out), "--cache-dir", str(out / "cache"), "--run-id", "r",
                 "--quiet", *bounded(6)])
    assert r.returncode == 0, r.stderr
    return json.loads((out / "r" / "results.json").read_text())


@pytest.mark.parametrize("name,damage,says", RESULTS_DAMAGE, ids=[d[0] for d in RESULTS_DAMAGE])
def test_a_results_file_this_tool_did_not_write_is_refused_by_its_schema(one_results, tmp_path, name, damage, says):
    data = json.loads(json.dumps(one_results))
    damage(data)
    text = json.dumps(data).replace('"__INF__"', "Infinity").replace('"__BIG__"', "1e400")
    path = tmp_path / "results.json"
    path.write_text(text)
    for cmd in (["report", str(path)], ["compare", str(path), str(path), "--output", str(tmp_path / "cmp")]):
        assert_clean_error(run_cli(cmd, timeout=60), str(path), says)
    assert not (tmp_path / "cmp").exists()  # refused before the plot folder was made


def test_results_hold_measured_floats_at_the_precision_they_have(one_results):
    def floats(obj):
        if isinstance(obj, float):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from floats(v)
        elif isinstance(obj, list):
            for v in obj:
                yield from floats(v)

    measured = [v for k, v in one_results.items() if k not in ("settings", "snapshot")]
    values = list(floats(measured))
    assert values and all(len(f"{abs(v):.15g}".replace(".", "").strip("0")) <= 6 for v in values)


def test_compare_output_is_checked_before_anything_is_read(tmp_path):
    assert_clean_error(run_cli(["compare", "a", "b", "--output", "/etc"]), "--output /etc", "system folder")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_clean_error(run_cli(["compare", "a", "b", "--output", str(blocker / "plots")]), "is a file in its path")


def test_compare_prints_small_numbers_with_their_digits():
    from kv_cache.report.compare import _fmt, _setting

    assert _fmt(0.000123) == "0.000123" and _fmt(26.2181) == "26.22" and _fmt(1234.5) == "1,234"
    assert _setting(0.1 + 0.2) == "0.3" and _setting(3) == "3"


# ---------------------------------------------------------------------------- bugs and signals, injected

def run_patched(patch: str, args: list[str], timeout: float = 120, env: dict | None = None):
    """The real CLI after `patch` (Python run first in the same process): a bug or a signal where no user input
    can put one."""
    code = f"import sys\n{patch}\nfrom kv_cache.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))


WORKER_BUG = """
from kv_cache.lifecycle.executor import Lifecycle
real, calls = Lifecycle.execute, []
def execute(self, req, state):
    calls.append(1)
    if len(calls) == 2:  # the second request executed (not a user's second turn: paced users may never reach it)
        {}['no such block']  # a bug of ours
    return real(self, req, state)
Lifecycle.execute = execute
"""


@pytest.mark.parametrize("debug", [False, True])
def test_a_bug_in_a_worker_is_one_line_naming_the_log_that_holds_its_traceback(small_run, debug):
    r = run_patched(WORKER_BUG, small_run("bug", *bounded(6)) + (["--debug"] if debug else []))
    assert r.returncode == 1, r.stderr
    log = small_run.out / "bug" / "run.log"
    text = log.read_text()
    assert "Traceback" in text and "no such block" in text and "test_edges" not in text
    assert "in execute" in text  # the frame of the bug
    fault = [x for x in sentences(r.stderr) if x.startswith("kv_cache_benchmark.py: run fault:")]
    assert fault and "internal error in a worker: KeyError" in fault[0] and str(log) in fault[0]
    assert ("Traceback" in r.stderr) == debug  # --debug prints it; otherwise it is in the log only
    assert small_run.results("bug")["run"]["fault"].startswith("internal error in a worker: KeyError")


def test_a_bug_in_the_report_is_exit_1_with_its_traceback_kept(small_run, tmp_path):
    assert run_cli(small_run("ok", *bounded(4))).returncode == 0
    patch = "import kv_cache.report.console as c\ndef render(*a, **k):\n    raise TypeError('a bug')\nc.render = render"
    r = run_patched(patch, ["report", str(small_run.out / "ok")], env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = sentences(r.stderr)
    assert len(lines) == 1 and "internal error: TypeError: a bug (traceback in" in lines[0]
    logs = list(tmp_path.glob("kvbench-*.log"))
    assert len(logs) == 1 and "in render\nTypeError: a bug" in logs[0].read_text()


KILL_IN = """
import os, signal
import {module} as m
real = m.{name}
def hooked(*a, **k):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*a, **k)
m.{name} = hooked
"""


@pytest.mark.parametrize("module,name", [("kv_cache.scheduler.runner", "Runner._drain"),
                                         ("kv_cache.run.outfolder", "_write_files")],
                         ids=["in the drain", "while results are written"])
def test_a_signal_after_the_window_keeps_the_results_and_exits_128_plus_it(small_run, module, name):
    owner, _, attr = name.rpartition(".")
    patch = KILL_IN.format(module=module, name=name)
    if owner:  # a method: patch it on its class
        patch = patch.replace(f"real = m.{name}", f"real = m.{owner}.{attr}").replace(
            f"m.{name} = hooked", f"m.{owner}.{attr} = hooked")
    r = run_patched(patch, small_run("sig", *bounded(6)))  # --quiet: the stop is still said on stderr
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert "SIGTERM received" in r.stderr and "results.json" in r.stderr and r.stdout == ""
    res = small_run.results("sig")
    assert res["requests"]["completed"] == 6 and res["run"]["stopped_reason"] == "max_requests"


def test_a_signal_while_the_report_folder_is_reserved_leaves_nothing(small_run):
    patch = KILL_IN.format(module="kv_cache.run.outfolder", name="write_marker")
    r = run_patched(patch, small_run("start", *bounded(4)))
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert "SIGTERM received before the measurement started" in r.stderr
    assert not (small_run.out / "start").exists() and os.listdir(small_run.cache) == []


def test_nothing_measured_is_said_on_stderr_with_quiet(small_run):
    patch = ("import kv_cache.recorder.recorder as r\nreal = r.Recorder.request\n"
             "r.Recorder.request = lambda self, *a, **k: None")  # no request is ever recorded as completed
    r = run_patched(patch, small_run("none", *bounded(4)))
    assert r.returncode == 1 and r.stdout == ""
    assert "nothing was measured" in r.stderr


def test_the_traces_readme_example_runs(tmp_path):
    text = (REPO / "traces" / "README.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("Try one:"))
    argv = line.split("`")[1].split()[2:]  # after "python kv_cache_benchmark.py"
    r = run_cli([*argv, "--null-io", "--max-requests", "20", "--output-dir", str(tmp_path), "--quiet"],
                timeout=120)
    assert r.returncode == 0, r.stderr  # its pre-run checks pass (the warm-up swallowed the trace before)
    assert Path(tmp_path).iterdir()


def test_a_reader_that_closes_the_pipe_does_not_stop_the_run(small_run):
    """Issue 37, item 7: `| head` gave "internal error: BrokenPipeError" and a report folder with only run.log."""
    p = subprocess.Popen([sys.executable, str(REPO / "kv_cache_benchmark.py"), *small_run("pipe")[:-1],
                          *bounded(12)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.readline()
    p.stdout.close()  # as head does after its lines
    err = p.stderr.read()
    assert p.wait(timeout=180) == 0 and "BrokenPipe" not in err and "internal error" not in err, err
    assert small_run.results("pipe")["requests"]["completed"] > 0


@pytest.mark.parametrize("extra, says", [
    (["--trace", "traces/mooncake_conversation_sample.jsonl", "--first-turn-only"], "--first-turn-only acts on"),
    (["--trace", "traces/mooncake_conversation_sample.jsonl", "--trace-model", "GPT-4"], "--trace-model acts on"),
    (["--no-shuffle"], "--no-shuffle acts only with a replayed trace (--trace FILE), which this run does not have; add "
                       "it or drop --no-shuffle"),
    (["--arrival", "poisson", "--request-rate", "5", "--admission", "all"], "--admission all paces"),
    (["--request-io", "serial", "--max-inflight", "8"], "--max-inflight acts only with a request's blocks moved in "
                                                        "batches (--request-io batched, --block-tokens > 0)"),
    (["--block-tokens", "0", "--max-inflight", "8"], "--max-inflight acts only with a request's blocks moved"),
])
def test_a_flag_that_would_do_nothing_here_is_refused(small_run, extra, says):
    """Issue 37, item 7: accepted though meaningless."""
    r = run_cli([*small_run("nothing"), *extra, *bounded(2)], cwd=REPO)
    assert_clean_error(r, says)


def test_a_trace_run_leaves_no_tokenizer_cache_in_tmpdir(small_run, tmp_path):
    """Issue 37, item 7: tiktoken copied its table into $TMPDIR/data-gym-cache on every trace run."""
    pytest.importorskip("tiktoken")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    trace = REPO.parent / "shared" / "traces" / "sharegpt"
    files = sorted(trace.glob("*.json*")) if trace.is_dir() else []
    if not files:
        pytest.skip(TRACES_ABSENT)
    r = run_cli([*small_run("tok"), "--trace", str(files[0]), "--tokenizer", "tiktoken", *bounded(2)],
                extra_env={"TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stderr
    assert not (tmp / "data-gym-cache").exists()


@pytest.mark.root
def test_an_output_on_a_full_filesystem_is_refused_before_the_run(small_tmpfs, tmp_path):
    """Issue 37, item 7: --output on a full filesystem was found only after the run."""
    full = small_tmpfs(1)
    (full / "filler").write_bytes(b"\0" * (900 << 10))
    r = run_cli(["--num-users", "2", "--gpu-mem-gb", "0", "--output", str(full / "o.json"), "--cache-dir",
                 str(tmp_path), *bounded(2)], timeout=60)
    assert_clean_error(r, "--output", "KiB free")


def test_a_trace_timestamp_years_after_its_first_is_refused(small_run, tmp_path):
    """Issue 37, item 7: a huge timestamp was accepted: the run would wait for a request due in 3,000 years."""
    trace = tmp_path / "burst.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "0.0,ChatGPT,100,20,120,Conversation log\n1e11,ChatGPT,100,20,120,Conversation log\n")
    r = run_cli([*small_run("huge"), "--trace", str(trace), *bounded(2)])
    assert_clean_error(r, "after the file's first", "spans at most 365 days")


@pytest.mark.parametrize("refused", [["--cpu-mem-gb", "100000"], ["--nvme-gb", "100000", "--model", "llama8b"]])
def test_a_refused_first_run_leaves_no_empty_reports_folder(tmp_path, refused):
    """Issue 52, item 7: a refusal left an empty ./reports (and reports/cache) in the current folder."""
    r = subprocess.run([sys.executable, str(REPO / "kv_cache_benchmark.py"), *refused], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert_clean_error(r)
    assert list(tmp_path.iterdir()) == []


def test_a_run_leaves_no_empty_cache_folder_beside_its_own(tmp_path):
    """With no --cache-dir a run (and each of --trials' runs) made <output-dir>/cache for its data, removed the data
    and left the folder: `report <output-dir>/*` then refused it as an argument it did not know."""
    out = tmp_path / "out"
    r = run_cli(["--config", str(SMALL), "--output-dir", str(out), "--run-id", "r", "--trials", "2", *bounded(3)])
    assert r.returncode == 0, r.stderr
    assert [p.name for p in out.iterdir()] == ["r"]


def test_a_reference_run_that_measured_nothing_is_never_a_pass(tmp_path):
    """Issue 52, item 5: under the reference's command line, a run with 0 completed requests printed "MLPerf
    reference assessment: PASS" and wrote its criteria passed, while stderr said nothing was measured."""
    patch = ("import kv_cache.recorder.recorder as r\n"
             "r.Recorder.request = lambda self, *a, **k: None")  # no request is ever recorded as completed
    out = tmp_path / "ref.json"
    r = run_patched(patch, ["--num-users", "2", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0.1", "--output", str(out),
                            "--cache-dir", str(tmp_path), "--output-dir", str(tmp_path / "reports"), *bounded(3)])
    assert "MLPerf reference assessment: PASS" not in r.stdout and "nothing was measured" in r.stderr
    health = json.loads(out.read_text())["summary"]["cache_stats"]["storage_health"] if out.exists() else None
    assert health is None or (health["overall_status"].startswith("NOT JUDGED") and not health["criteria"])


@pytest.mark.parametrize("plant", ["fifo", "link", "junk", "endless", "dir"])
def test_a_planted_manifest_is_one_sentence_never_a_hang(small_run, tmp_path, plant):
    """Issue 52, item 3: a FIFO manifest hung a decode node past --disagg-wait-s; junk in it was an internal error."""
    shared = tmp_path / "shared"
    (shared / "kvbench-handoff").mkdir(parents=True)
    manifest = shared / "kvbench-handoff" / "manifest.jsonl"
    if plant == "fifo":
        os.mkfifo(manifest)
    elif plant == "link":
        (tmp_path / "elsewhere.jsonl").write_text('{"kind": "header"}\n')
        manifest.symlink_to(tmp_path / "elsewhere.jsonl")
    elif plant == "junk":
        manifest.write_text("not json at all\n")
    elif plant == "dir":  # issue 52's tour: a planted directory where a handoff file belongs
        manifest.mkdir()
    else:
        manifest.write_bytes(b"[" * (17 << 20))
    r = run_cli(small_run("dec", "--role", "decode", "--handoff-dir", str(shared), "--disagg-wait-s", "2",
                          *bounded(2)), timeout=60)
    assert_clean_error(r, str(manifest))


@pytest.mark.parametrize("args, env, fragment", [
    (["--start-delay", "-1"], {}, "--start-delay: must be a number of seconds from 0 to 86400, got '-1'"),
    (["--start-delay", "nan"], {}, "got 'nan'"),
    (["--end-delay", "1e30"], {}, "got '1e30'"),
    ([], {"KV_CACHE_WRAPPER_DELAY_S": "junk"}, "KV_CACHE_WRAPPER_DELAY_S must be a number of seconds"),
    (["--rank-output-base", "{file}"], {}, "cannot make the rank's folder"),
])
def test_the_mlpstorage_wrapper_refuses_bad_input_in_one_sentence(tmp_path, args, env, fragment):
    """Issue 52, item 4: Python tracebacks for a negative, NaN or 1e30 delay, junk in KV_CACHE_WRAPPER_DELAY_S, an
    output base that is a file."""
    (tmp_path / "a-file").write_text("x")
    args = [a.replace("{file}", str(tmp_path / "a-file")) for a in args]
    base = {"--rank-output-base": str(tmp_path / "out"), "--rank-cache-base": str(tmp_path / "cache")}
    argv = [x for k, v in base.items() if k not in args for x in (k, v)] + args
    r = subprocess.run([sys.executable, str(REPO / "mlperf" / "mlperf_wrapper.py"), *argv], capture_output=True,
                       text=True, timeout=30, env=dict(os.environ, **env))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and fragment in r.stderr, r.stderr


def test_ctrl_c_in_another_command_says_that_command_stopped(small_run):
    """Ctrl-C in `capacity` (minutes over a long trace) said "received before the measurement started; nothing
    was measured": a run's sentence, where no run was stopped."""
    assert run_cli(small_run("cap", "--null-io", "--capacity-curve", *bounded(6))).returncode == 0
    patch = KILL_IN.format(module="kv_cache.run.capacity_curve", name="section").replace("SIGTERM", "SIGINT")
    r = run_patched(patch, ["capacity", str(small_run.out / "cap")])
    assert r.returncode == 128 + signal.SIGINT, r.stderr
    assert "SIGINT received: the capacity command stopped before it finished." in " ".join(r.stderr.split())
    assert "measure" not in r.stderr, r.stderr
