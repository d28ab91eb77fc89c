"""Faults of the remote tiers on the real CLI over real servers: a server that is down, refuses the credentials,
lacks the bucket, runs out of memory, or dies mid-run; a killed run's leftovers found and cleaned. Each is one
sentence naming the URL (without its password), exit 2 before the run or a fault stop with partial results
(exit 1) during it, never a traceback, never a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SMALL, bounded, run_cli
from helpers import assert_clean_error, said, sentences
from servers import HOST, free_port, password_of, s3_objects, valkey_keys
from servers import start as start_server

pytestmark = pytest.mark.slow  # make test-all (CI)


def remote_args(out: Path, run_id: str, url: str, *extra: str, requests: int = 16) -> list[str]:
    return ["--config", str(SMALL), "--output-dir", str(out), "--run-id", run_id, "--quiet", "--nvme", "off",
            "--nvme-gb", "0", "--remote-url", url, *bounded(requests), *extra]


def one_sentence(r: subprocess.CompletedProcess, *words: str) -> str:
    """The one sentence on stderr (wrapped at 100 columns), holding every word."""
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    err = sentences(r.stderr)
    assert len(err) == 1, r.stderr
    for w in words:
        assert w in err[0], r.stderr
    return err[0]


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "kv_cache_benchmark.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))


def wait_for(predicate, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_a_server_that_is_down_is_one_sentence_before_the_run(tmp_path):
    url = f"valkey://:hunter2@{HOST}:{free_port()}/0"
    r = run_cli(remote_args(tmp_path, "down", url, "--remote-gb", "0.25", "--valkey-timeout-s", "2"))
    assert r.returncode == 2
    one_sentence(r, f"valkey://:****@{HOST}:", "no Valkey/Redis server answers")
    assert "hunter2" not in r.stderr + r.stdout
    assert not (tmp_path / "down").exists()  # nothing reserved, nothing left


def test_refused_credentials_are_one_sentence_without_the_password(valkey_server, tmp_path):
    wrong = valkey_server.url.replace(password_of(valkey_server.url), "not-the-password")
    r = run_cli(remote_args(tmp_path, "auth", wrong, "--remote-gb", "0.25"))
    assert r.returncode == 2
    one_sentence(r, "refused the credentials")
    assert "not-the-password" not in r.stderr + r.stdout


def test_a_missing_bucket_and_a_wrong_secret_are_one_sentence(s3_server, tmp_path):
    r = run_cli(remote_args(tmp_path, "nob", "s3://no-such-bucket-kvb/x", "--remote-gb", "0.25"),
                extra_env=s3_server.env)
    assert r.returncode == 2
    one_sentence(r, "s3://no-such-bucket-kvb/x", "bucket")
    r = run_cli(remote_args(tmp_path, "sec", s3_server.url, "--remote-gb", "0.25"),
                extra_env=dict(s3_server.env, AWS_SECRET_ACCESS_KEY="wrong-secret-value"))
    assert r.returncode == 2
    one_sentence(r, s3_server.url)
    assert "wrong-secret-value" not in r.stderr + r.stdout


def test_an_unknown_scheme_and_a_stack_without_storage_are_refused(tmp_path):
    r = run_cli(remote_args(tmp_path, "ftp", "ftp://example/x", "--remote-gb", "0.25"))
    assert r.returncode == 2
    one_sentence(r, "ftp://example/x", "redis://", "s3://")
    r = run_cli(["--config", str(SMALL), "--output-dir", str(tmp_path), "--nvme", "off", "--nvme-gb", "0",
                 *bounded(4)])
    assert r.returncode == 2
    one_sentence(r, "--remote-url")


def test_maxmemory_reached_is_a_fault_stop_with_partial_results_and_no_key_left(tmp_path):
    # 25 blocks of 2 MiB as jemalloc stores them
    server = start_server("valkey", tmp_path / "small-valkey", password="", maxmemory="64mb")
    try:
        r = run_cli(remote_args(tmp_path, "oom", server.url, "--remote-gb", "0.25"))
        assert r.returncode == 1, r.stderr
        assert "out of memory" in r.stderr and "Traceback" not in r.stderr
        res = json.loads((tmp_path / "oom" / "results.json").read_text())
        assert res["run"]["partial"] and res["run"]["stopped_reason"] == "fault"
        assert "maxmemory" in res["run"]["fault"] and server.url in res["run"]["fault"]
        assert valkey_keys(server.url) == []  # the fault stop still deletes what the run wrote
        # --remote-gb 0 sizes the tier from the server's maxmemory instead: that run fits and ends well
        r = run_cli(remote_args(tmp_path, "fits", server.url, requests=6))
        assert r.returncode == 0, r.stderr
        res = json.loads((tmp_path / "fits" / "results.json").read_text())
        assert 0 < res["settings"]["tiers"]["remote_gb"] < 64 / 1024
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_server_killed_or_frozen_mid_run_stops_the_run_with_partial_results(tmp_path, how):
    """killed: its connections reset; frozen (SIGSTOP): they stay open and silent, and only the timeout on each
    call (--valkey-timeout-s) ends the run's calls."""
    server = start_server("valkey", tmp_path / "doomed", password="")
    try:
        run = start(remote_args(tmp_path, "dies", server.url, "--remote-gb", "0.25", "--valkey-timeout-s", "4",
                                requests=100000))
        wait_for(lambda: len(valkey_keys(server.url)) > 3)  # blocks reached the server
        server.kill() if how == "killed" else os.kill(server.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        _, err = run.communicate(timeout=90)  # a timeout on every call: never a hang
        # issue 37: one timeout for the call that found it silent, one for the cleanup's attempt, then the drain:
        # the in-flight requests' later calls fail at once (they each waited a timeout: 4-5 timeouts in all)
        assert time.monotonic() - stopped < 2 * 4 + 6
        if how == "frozen":
            os.kill(server.proc.pid, signal.SIGCONT)
        assert run.returncode == 1, err
        err = said(err)
        assert "stopped answering" in err and server.url in err and "Traceback" not in err
        if how == "frozen":  # still frozen when the run closed: what stays there is said, and how it goes
            assert "could not remove this run's objects" in err and "clean --remote-url" in err, err
        res = json.loads((tmp_path / "dies" / "results.json").read_text())
        assert res["run"]["partial"] and res["run"]["stopped_reason"] == "fault"
    finally:
        server.stop()


def stable(listing, seconds: float = 30.0) -> list[str]:
    """listing() once two calls half a second apart agree."""
    end, last = time.monotonic() + seconds, listing()
    while time.monotonic() < end:
        time.sleep(0.5)
        now = listing()
        if now == last:
            return now
        last = now
    raise AssertionError("the listing never settled")


@pytest.mark.parametrize("medium", ["valkey", "s3"])
def test_a_killed_runs_leftovers_are_reported_and_cleaned(request, tmp_path, medium):
    server = request.getfixturevalue(f"{medium}_server")
    names = (lambda: valkey_keys(server.url)) if medium == "valkey" else (lambda: s3_objects(server))
    run = start(remote_args(tmp_path, "killed", server.url, "--remote-gb", "0.25", requests=100000), server.env)
    wait_for(lambda: len(names()) > 3)
    run.send_signal(signal.SIGKILL)
    run.communicate(timeout=30)
    left = stable(names)  # a PUT cut by the kill may still settle on the server
    assert len(left) > 3
    r = run_cli(remote_args(tmp_path, "next", server.url, "--remote-gb", "0.25", requests=2), extra_env=server.env)
    assert r.returncode == 0, r.stderr
    notes = json.loads((tmp_path / "next" / "results.json").read_text())["run"]["notes"]
    assert any("killed run(s) left" in n and "killed" in n and "clean --remote-url" in n for n in notes), notes
    dry = run_cli(["clean", "--remote-url", server.url, "--dry-run"], extra_env=server.env)
    assert dry.returncode == 0 and "would remove" in dry.stdout and names() == left
    cleaned = run_cli(["clean", "--remote-url", server.url], extra_env=server.env)
    assert cleaned.returncode == 0 and "removed" in cleaned.stdout, cleaned.stderr
    assert names() == []


@pytest.mark.parametrize("env, says", [
    ({"AWS_ENDPOINT_URL": "http://127.0.0.1:1"}, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}, "AWS_SECRET_ACCESS_KEY is not set"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_ENDPOINT_URL": "htp:/x"}, "is not an http://"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_ENDPOINT_URL": "http://127.0.0.1:99999"},
     "is not an http://"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_ENDPOINT_URL": "http://[::1"}, "is not an http://"),
])
@pytest.mark.parametrize("client", ["obstore", "boto3"])
def test_an_s3_setup_mistake_is_one_sentence_before_the_run(tmp_path, env, says, client):
    """Issue 37, item 3: no endpoint or no credentials was obstore's internal TypeError, a malformed endpoint a Rust
    panic (109 lines) or boto3's ValueError. Nothing is contacted: each is refused before the run."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    r = subprocess.run([sys.executable, str(REPO / "kv_cache_benchmark.py"), "--config", str(SMALL), "--remote-url",
                        "s3://bucket/p", "--set", f"media.s3.client={client}", "--cache-dir", str(tmp_path),
                        "--output-dir", str(tmp_path / "r"), "--max-requests", "2"], capture_output=True, text=True,
                       timeout=120, env={**base, **env})
    assert_clean_error(r, says)
    assert not list(tmp_path.glob("r/*/results.json"))


@pytest.mark.parametrize("tail, says", [
    ("/abc", "the database 'abc' is not a number"), ("/0 extra", "white-space or control character"),
    ("/0\nx", "white-space or control character"), ("/0x", "the database '0x' is not a number")])
def test_a_malformed_valkey_url_is_refused_naming_the_part(valkey_server, tmp_path, tail, says):
    """Issue 37, item 4: a db of abc, '0 extra' or '0\\nx' became db 0, an empty host localhost, port 0 6379: each
    went to another place than the one named, silently (exit 0)."""
    r = run_cli(remote_args(tmp_path, "bad", valkey_server.url.rstrip("/0123456789") + tail, "--remote-gb", "0.25"))
    assert r.returncode == 2
    one_sentence(r, says)


@pytest.mark.parametrize("url, says", [("redis://:6379/0", "the host is empty"),
                                       (f"redis://{HOST}:0/0", "port 0 is not a port"),
                                       (f"redis://{HOST}:port/0", "the port is not a number")])
def test_an_empty_host_or_a_port_out_of_range_is_refused(tmp_path, url, says):
    r = run_cli(remote_args(tmp_path, "bad", url, "--remote-gb", "0.25"))
    assert r.returncode == 2
    one_sentence(r, says)


def test_rediss_against_a_plain_port_says_it_speaks_tls_first(valkey_server, tmp_path):
    tls = valkey_server.url.replace("valkey://", "valkeys://").replace("redis://", "rediss://")
    r = run_cli(remote_args(tmp_path, "tls", tls, "--remote-gb", "0.25", "--set", "media.valkey.timeout_s=2"))
    assert r.returncode == 2
    one_sentence(r, "speaks TLS first")
