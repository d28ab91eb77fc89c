"""At least 68 bad inputs: each gets one sentence on stderr, exit 2, no traceback, nothing left behind.

Every case runs the real CLI against small settings in a fresh output and cache folder; the
fragments are the words a user needs (the flag or file at fault, and what is wrong).
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_cli
from helpers import assert_clean_error

NAN_INF = [(flag, v) for flag in ("--duration", "--warmup", "--cpu-mem-gb", "--nvme-gb", "--gpu-mem-gb",
                                  "--request-rate", "--trace-speedup", "--steady-state", "--semantic-threshold")
           for v in ("nan", "inf")] + [("--think-time-s", "nan,1"), ("--think-time-s", "0,inf")]

CASES = [
    *[([flag, v], [flag, "finite"]) for flag, v in NAN_INF],
    (["--duration=-inf"], ["--duration", "finite"]),
    (["--seed", "-1"], ["--seed", "must be >= 0"]),
    (["--seed", "1.5"], ["--seed", "integer"]),
    (["--seed", "99999999999999999999999"], ["--seed", "must be <="]),
    (["--users", "0"], ["--users", "must be >= 1"]),
    (["--users", "-3"], ["--users", "must be >= 1"]),
    (["--users", "2.5"], ["--users", "integer"]),
    (["--users", ""], ["--users", "integer"]),
    (["--workers", "-1"], ["--workers", "must be >= 0"]),
    (["--duration", "0"], ["--duration", "must be >= 0.1"]),
    (["--duration", "ten"], ["--duration", "must be a number"]),
    (["--warmup", "-1"], ["--warmup", "must be >= 0"]),
    (["--max-requests", "-5"], ["--max-requests", "must be >= 0"]),
    (["--trials", "0"], ["--trials", "must be >= 1"]),
    (["--tp", "0"], ["--tp", "must be >= 1"]),
    (["--block-tokens", "-16"], ["--block-tokens", "must be >= 0"]),
    (["--cpu-mem-gb", "-1"], ["--cpu-mem-gb", "must be >= 0"]),
    (["--model", ""], ["unknown model"]),
    (["--model", "gpt-17"], ["unknown model 'gpt-17'"]),
    (["--kv-dtype", "int3"], ["invalid choice"]),
    (["--verify", "maybe"], ["invalid choice"]),
    (["--io-engine", "magic"], ["invalid choice"]),
    (["--policy", "random"], ["invalid choice"]),
    (["--run-id", "../escape"], ["--run-id", "'..'"]),
    (["--run-id", "a/b"], ["--run-id"]),
    (["--run-id", ".."], ["--run-id"]),
    (["--run-id", "/abs"], ["--run-id"]),
    (["--run-id", "x" * 200], ["--run-id"]),
    (["--run-id", "-dash"], ["--run-id"]),
    (["--cache-dir", "/"], ["--cache-dir /", "system folder"]),
    (["--cache-dir", "/etc"], ["--cache-dir /etc", "system folder"]),
    (["--cache-dir", "/usr"], ["system folder"]),
    (["--cache-dir", "/usr/local"], ["system folder"]),
    (["--cache-dir", "/root"], ["system folder"]),
    (["--cache-dir", "/boot"], ["system folder"]),
    (["--cache-dir", "/proc"], ["system folder"]),
    (["--cache-dir", "/sys"], ["system folder"]),
    (["--cache-dir", "/dev"], ["system folder"]),
    (["--cache-dir", "/var/lib"], ["system folder"]),
    (["--cache-dir", "/bin"], ["system folder"]),
    (["--output-dir", "/etc"], ["--output-dir", "system folder"]),
    (["--set", "run.seed=[1"], ["--set run.seed=[1", "not valid YAML"]),
    (["--set", "run.seed"], ["expected section.key=value"]),
    (["--set", "nosuch.key=1"], ["unknown key"]),
    (["--set", "workload.users=0"], ["--set workload.users", "must be >= 1"]),
    (["--set", "run.duration_s=.nan"], ["--set run.duration_s", "finite"]),
    (["--set", "profiles.chatbot.think_time_s=[.inf,1]"], ["think_time_s", "finite"]),
    (["--set", "profiles.chatbot.context_tokens=[5,1]"], ["low <= high"]),
    (["--set", "run={a: 1}"], ["unknown key"]),
    (["--profile-mix", "chatbot=-1"], [">= 0"]),
    (["--profile-mix", "chatbot=nan"], ["--profile-mix"]),
    (["--qos-mix", "interactive=x"], ["--qos-mix"]),
    (["--semantic-mix", "nope=1", "--semantic"], ["--semantic-mix"]),
    (["--trace", "/nonexistent/trace.json"], ["/nonexistent/trace.json"]),
    (["--request-rate", "5"], ["--request-rate", "--arrival"]),
    (["--first-turn-only"], ["--first-turn-only", "--trace"]),
    (["--arrival", "poisson", "--request-rate", "1e9"], ["--request-rate"]),
    # issue 37: what was accepted, or went elsewhere, or was blamed on something else
    (["--no-shuffle"], ["--no-shuffle", "replayed trace"]),
    (["--arrival", "poisson", "--request-rate", "5", "--admission", "all"], ["--admission all", "open loop"]),
    (["--set", "nosuch.key=1"], ["--set nosuch.key", "unknown key 'nosuch'"]),
    (["--set", "models.tiny=3"], ["--set models.tiny", "must be a mapping"]),
    (["--remote-url", "redis://:6379/0"], ["the host is empty"]),
    (["--remote-url", "redis://127.0.0.1:0/0"], ["port 0"]),
    (["--remote-url", "redis://127.0.0.1:6379/abc"], ["'abc' is not a number"]),
    (["--disagg-peer-timeout-s", "0.5", "--role", "decode", "--handoff", "nixl://127.0.0.1:7"],
     ["--disagg-peer-timeout-s", "must be >= 1"]),
]


@pytest.mark.parametrize("extra,fragments", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_is_one_sentence(small_run, extra, fragments):
    r = run_cli(small_run("x", *extra), timeout=60)
    assert_clean_error(r, *fragments)
    assert not (small_run.out / "x").exists()
    assert os.listdir(small_run.cache) == []


def test_table_is_at_least_sixty_cases():
    assert len(CASES) + len(FILE_CASES) >= 68


def _binary(p):
    p.write_bytes(b"\x00\x01\xff\xfe" * 64)


def _not_utf8_yaml(p):
    p.write_bytes(b"run: {seed: 1}\n# \xff\xfe\n")


def _list_yaml(p):
    p.write_text("- 1\n- 2\n")


def _bad_yaml(p):
    p.write_text("run: {seed: [1\n")


def _nan_yaml(p):
    p.write_text("run: {duration_s: .nan}\n")


FILE_CASES = [(_binary, ["pass a YAML file"]), (_not_utf8_yaml, ["not UTF-8"]), (_list_yaml, ["mapping"]),
              (_bad_yaml, ["not valid YAML"]), (_nan_yaml, ["run.duration_s", "finite"])]


@pytest.mark.parametrize("make,fragments", FILE_CASES, ids=[f.__name__ for f, _ in FILE_CASES])
def test_bad_config_file(small_run, tmp_path, make, fragments):
    cfg = tmp_path / "bad.yaml"
    make(cfg)
    args = small_run("x")
    args[args.index("--config") + 1] = str(cfg)
    assert_clean_error(run_cli(args, timeout=60), str(cfg), *fragments)
    assert not (small_run.out / "x").exists()


TRACE_CASES = {
    "huge_tokens.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                       "0,ChatGPT,99999999999999999999,10,10,Conversation log\n",
    "nan_tokens.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                      "0,ChatGPT,nan,10,10,Conversation log\n1,ChatGPT,inf,10,10,Conversation log\n",
    "nan_time.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "nan,ChatGPT,100,10,110,Conversation log\n",
    "huge_mooncake.jsonl": '{"timestamp": 0, "input_length": 1e300, "output_length": 5, "hash_ids": [1]}\n',
    "inf_mooncake.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": Infinity, "hash_ids": [1]}\n',
}


@pytest.mark.parametrize("name", sorted(TRACE_CASES))
def test_trace_numbers_out_of_range_are_refused_or_skipped(small_run, tmp_path, name):
    trace = tmp_path / name
    trace.write_text(TRACE_CASES[name])
    r = run_cli(small_run("x", "--trace", str(trace), "--duration", "0.5", "--warmup", "0"), timeout=60)
    assert "Traceback" not in r.stderr
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert str(trace) in r.stderr or name in r.stderr
    assert os.listdir(small_run.cache) == []


def test_invalid_utf8_in_a_trace_is_counted_as_malformed(small_run, tmp_path):
    trace = tmp_path / "conv.jsonl"
    good = json.dumps({"timestamp": 0, "input_length": 300, "output_length": 20, "hash_ids": [1, 2]})
    trace.write_bytes((good + "\n").encode() * 20 + b'{"timestamp": 1, "input_length": "\xff\xfe"}\n')
    r = run_cli(small_run("x", "--trace", str(trace), "--duration", "0.5", "--warmup", "0"), timeout=60)
    assert "Traceback" not in r.stderr
    assert r.returncode in (0, 2), r.stderr
    if r.returncode == 0:
        log = small_run.results("x")["workload"]["trace"]
        assert sum(log["skipped"].values()) >= 1, log


def test_report_of_a_corrupt_results_file(tmp_path):
    for text in ("{not json", '{"schema_version": 1}', '{"schema_version": 1, "run": 5}', "[]", "\xff"):
        f = tmp_path / "results.json"
        f.write_text(text, errors="surrogateescape") if text != "\xff" else f.write_bytes(b"\xff\xfe")
        for cmd in (["report", str(f)], ["compare", str(f), str(f)]):
            r = run_cli(cmd, timeout=60)
            assert_clean_error(r, str(f))


def test_a_results_file_of_another_schema_version_is_not_called_damaged(tmp_path):
    """A baseline written before a schema bump was "an incomplete or damaged results file ... re-run or restore
    it", named results.json only: which of the two compared runs it was, the sentence did not say."""
    from results_fixture import results

    from kv_cache.recorder.results_schema import SCHEMA_VERSION, UPGRADES

    old = tmp_path / "baseline" / "results.json"
    old.parent.mkdir()
    unread = min(UPGRADES) - 1  # older than the oldest version this one still reads
    old.write_text(json.dumps({**results().to_json(), "schema_version": unread}))
    r = run_cli(["compare", str(old.parent), str(old.parent)], timeout=60)
    assert_clean_error(r, f"{old} has schema_version {unread} (an older version of kv-cache-bench "
                          f"wrote it), and this version reads {SCHEMA_VERSION}")
    assert "damaged" not in r.stderr


def test_a_results_file_of_schema_19_is_still_read(tmp_path):
    """Schema 20 added one field (why each new block was not written): every run of the version before could no
    longer be reported or compared ("re-run that run with this version"). It is read, that field said not recorded."""
    from results_fixture import results

    data = {**results().to_json(), "schema_version": 19, "blocks_write_skipped": 5}
    del data["blocks_write_skipped_by"]
    old = tmp_path / "old" / "results.json"
    old.parent.mkdir()
    old.write_text(json.dumps(data))
    r = run_cli(["report", str(old.parent)], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "new blocks not written: 5 (why not recorded: a results file of schema 19)" in " ".join(r.stdout.split())
    assert run_cli(["compare", str(old.parent), str(old.parent), "--output", str(tmp_path / "plots")],
                   timeout=60).returncode == 0


def test_compare_output_on_an_existing_file(small_run, tmp_path):
    assert run_cli(small_run("a", "--duration", "0.5", "--warmup", "0")).returncode == 0
    existing = tmp_path / "plots"
    existing.write_text("keep me")
    run_dir = str(small_run.out / "a")
    r = run_cli(["compare", run_dir, run_dir, "--output", str(existing)])
    assert_clean_error(r, "--output", str(existing))
    assert existing.read_text() == "keep me"


def test_a_results_file_of_schema_20_with_a_capacity_curve_is_still_read(tmp_path):
    """Schema 21 added the curve's served order: a run of schema 20 is read (its order not known: nothing said), and
    one of 19 still is, through 20."""
    from dataclasses import replace

    from results_fixture import results

    from kv_cache.recorder.results_schema import Results
    from kv_cache.recorder.stack_distances import CapacityCurve

    r = results()
    r.capacity_curve = CapacityCurve("LRU stack distances", False, 1.0, "lru", 0, 2 << 20, 10, 1.0, 16, 0.3, 9, 12,
                                     "-", [])
    data = {**r.to_json(), "schema_version": 20}
    del data["capacity_curve"]["served_order"]
    assert Results.from_dict(json.loads(json.dumps(data))).capacity_curve == replace(r.capacity_curve)
    old = tmp_path / "old" / "results.json"
    old.parent.mkdir()
    old.write_text(json.dumps(data))
    out = run_cli(["report", str(old.parent)], timeout=60)
    assert out.returncode == 0 and "Capacity curve" in out.stdout and "order:" not in out.stdout, out.stderr
    del data["blocks_write_skipped_by"]
    assert Results.from_dict({**data, "schema_version": 19}).blocks_write_skipped_by is None
