"""Issue 26: a prefill node hands its blocks to a decode node over NIXL (--handoff nixl://HOST:PORT): the decode
node pulls them with NIXL READs (UCX over TCP here) from the prefill node's registered memory, verifies and times
each. On localhost, and across two network stacks (two namespaces joined by a veth pair, root only)."""

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, SMALL, bounded, run_cli
from helpers import assert_clean_error, assert_held_until_loaded, sentences, wait_for_line
from netns import NetnsPair, why_not
from servers import free_port

SCRIPTS = REPO / "tests" / "scripts"  # the helper processes' code, in files ruff checks

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("nixl_cu12") is None,
                                                   reason="nixl-cu12 is not installed (make install)")]
TCP = {"UCX_TLS": "tcp"}  # over TCP, as between two hosts without RDMA (not shared memory)
ENV = {**os.environ, **TCP, "PYTHONUNBUFFERED": "1"}
CLI = [sys.executable, str(REPO / "kv_cache_benchmark.py")]


def node_args(small_run, tmp_path, run_id: str, role: str, url: str, *extra: str) -> list[str]:
    cache = tmp_path / f"{run_id}-cache"
    cache.mkdir(exist_ok=True)
    return [*small_run(run_id, "--role", role, "--handoff", url, "--disagg-wait-s", "30", "--disagg-handoff-gb",
                       "0.25", *extra, quiet=False),
            "--cache-dir", str(cache)]


def start_decode(argv: list[str]) -> subprocess.Popen:
    """A decode node, started first; returns once it says it waits for the prefill node."""
    dec = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    wait_for_line(dec, "waiting for a prefill node")
    return dec


def serving_pair(small_run, tmp_path, *dec_extra: str) -> tuple[str, subprocess.Popen, subprocess.Popen]:
    """A decode node and a prefill node (run long), returned once the decode node has served a request (its live
    line, one every 10 s off a terminal, counts one done): (url, decode, prefill)."""
    url = f"nixl://127.0.0.1:{free_port()}"
    dec = start_decode([*CLI, *node_args(small_run, tmp_path, "dec", "decode", url, "--duration", "600",
                                         "--warmup", "0", *dec_extra)])
    pre = subprocess.Popen([*CLI, *node_args(small_run, tmp_path, "pre", "prefill", url, "--duration", "600",
                                             "--warmup", "0")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for_line(dec, r"\] [1-9][\d,]* requests")
    except BaseException:  # never leave the two nodes running behind a failed test
        for node in (dec, pre):
            node.kill()
            node.communicate(timeout=30)
        raise
    return url, dec, pre


def check_handed_over(small_run, url: str) -> None:
    p, d = small_run.results("pre"), small_run.results("dec")
    assert p["role"]["engine"] == d["role"]["engine"] == "nixl (UCX)"
    assert p["role"]["handoff_dir"] == d["role"]["handoff_dir"] == url
    assert p["blocks"]["handoff"]["write"] > 0 and len(p["role"]["decode_nodes"]) == 1
    # every request handed over was served, every block arrived, and each read back the right bytes
    assert d["requests"]["completed"] == p["requests"]["completed"] + p["warmup"]["requests"] > 0
    assert d["blocks"]["handoff"]["read"] > 0 and d["role"]["missing_blocks"] == 0
    assert d["latency_ms"]["handoff"]["read"]["count"] == d["blocks"]["handoff"]["read"]
    assert d["verification"]["blocks_checked"] >= d["blocks"]["handoff"]["read"]
    assert d["verification"]["failures"] == 0
    assert d["role"]["prefill_done_to_decode_loaded_ms"]["count"] == d["requests"]["completed"]


def test_prefill_and_decode_nodes_over_nixl_on_localhost(small_run, tmp_path):
    url = f"nixl://127.0.0.1:{free_port()}"
    dec = start_decode([*CLI, *node_args(small_run, tmp_path, "dec", "decode", url, "--duration", "600",
                                         "--warmup", "0")])
    pre = run_cli(node_args(small_run, tmp_path, "pre", "prefill", url, *bounded(12)), extra_env=TCP)
    out, err = dec.communicate(timeout=120)
    assert pre.returncode == 0, pre.stderr
    assert dec.returncode == 0, err
    check_handed_over(small_run, url)
    depth = small_run.results("dec")["queue_depth"]["handoff"]["load"]  # issue 48: a request's blocks in one READ
    assert depth["max"] > 1 and depth["batches"] < small_run.results("dec")["blocks"]["handoff"]["read"]


@pytest.mark.root
@pytest.mark.skipif(why_not() is not None, reason=why_not() or "")
def test_prefill_and_decode_nodes_over_nixl_on_two_network_stacks(small_run, tmp_path):
    with NetnsPair() as net:
        url = f"nixl://{net.addr['a']}:{free_port()}"
        dec = start_decode(net.exec_argv("b", [*CLI, *node_args(small_run, tmp_path, "dec", "decode", url,
                                                                  "--duration", "600", "--warmup", "0")]))
        pre = subprocess.run(net.exec_argv("a", [*CLI, *node_args(small_run, tmp_path, "pre", "prefill", url,
                                                                   *bounded(12))]),
                             capture_output=True, text=True, env=ENV, timeout=180)
        out, err = dec.communicate(timeout=120)
    assert pre.returncode == 0, pre.stderr
    assert dec.returncode == 0, err
    check_handed_over(small_run, url)
    assert small_run.results("pre")["run"]["host"] != small_run.results("dec")["run"]["host"]  # two hosts' names


def test_a_decode_node_with_no_prefill_node_says_so(small_run, tmp_path):
    url = f"nixl://127.0.0.1:{free_port()}"
    r = run_cli(small_run("lonely", "--role", "decode", "--handoff", url, "--disagg-wait-s", "0.5"), extra_env=TCP)
    assert_clean_error(r, f"no prefill node answered at {url} within 0.5 s", "--role prefill")


def test_a_port_in_use_is_one_sentence(small_run):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        url = f"nixl://127.0.0.1:{taken.getsockname()[1]}"
        r = run_cli(small_run("pre", "--role", "prefill", "--handoff", url, "--disagg-handoff-gb", "0.25",
                              *bounded(4)), extra_env=TCP)
    assert_clean_error(r, f"--handoff {url}: cannot listen there", "a free port")


def test_an_unreachable_host_and_an_address_not_of_this_host_are_one_sentence(small_run, tmp_path):
    """Across two network stacks: a decode node pointed at an address no host answers on its link (ARP finds no
    one), and a prefill node told to listen on the other host's address."""
    with NetnsPair() as net:
        nobody = f"nixl://{net.subnet}.3:{free_port()}"  # in the subnet this test made; no namespace holds it
        dec = net.run("b", [*CLI, *small_run("dec", "--role", "decode", "--handoff", nobody,
                                             "--disagg-wait-s", "30")], env=ENV, timeout=120)
        other = f"nixl://{net.addr['b']}:{free_port()}"
        pre = net.run("a", [*CLI, *small_run("pre", "--role", "prefill", "--handoff", other,
                                             "--disagg-handoff-gb", "0.25", *bounded(4))], env=ENV, timeout=120)
    assert_clean_error(dec, f"--handoff {nobody}: cannot reach the prefill node", "route")
    assert_clean_error(pre, f"--handoff {other}: cannot listen there", "a free port")


def test_a_decode_node_of_another_run_is_refused_by_name(small_run, tmp_path):
    url = f"nixl://127.0.0.1:{free_port()}"
    pre = subprocess.Popen([*CLI, *node_args(small_run, tmp_path, "pre", "prefill", url, "--duration", "20",
                                             "--warmup", "0", "--seed", "1")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for_line(pre, "for a decode node to be ready")  # its side channel listens
        r = run_cli(small_run("dec", "--role", "decode", "--handoff", url, "--seed", "2"), extra_env=TCP)
    finally:
        pre.send_signal(signal.SIGINT)
        pre.communicate(timeout=60)
    assert_clean_error(r, f"the prefill node at {url} refused this decode node", "seed 1", "same --model")


def test_the_prefill_node_dying_mid_run_is_a_fault_stop_of_the_decode_node(small_run, tmp_path):
    url, dec, pre = serving_pair(small_run, tmp_path)  # it was serving when its prefill node died
    pre.kill()  # no goodbye: the decode node must notice, not hang
    pre.communicate(timeout=30)
    out, err = dec.communicate(timeout=120)
    assert dec.returncode == 1, out[-3000:] + err
    d = small_run.results("dec")
    assert d["run"]["stopped_reason"] == "fault" and url in d["run"]["fault"], d["run"]["fault"]
    assert d["run"]["partial"] and d["requests"]["completed"] > 0  # it was serving when the prefill node died


def test_a_prefill_node_flat_out_waits_for_its_decode_node_and_loses_no_block(small_run, tmp_path):
    """Issue 38, item 1: a prefill node outrunning one decode worker replaced blocks nobody had read (20,806
    missing over 3 bench rounds). Its blocks are now held until the decode node acknowledges the request: a full
    handoff space makes the prefill node wait (timed, "wait" on the handoff tier), and no block goes missing."""
    url = f"nixl://127.0.0.1:{free_port()}"
    dec = start_decode([*CLI, *node_args(small_run, tmp_path, "dec", "decode", url, "--duration", "600",
                                         "--warmup", "0", "--workers", "1", "--disagg-wait-s", "5",
                                         "--request-io", "serial")])  # one block a READ: it cannot keep up
    pre = run_cli([*node_args(small_run, tmp_path, "pre", "prefill", url, *bounded(40), "--disagg-handoff-gb",
                              "0.25")], timeout=300, extra_env=TCP)
    out, err = dec.communicate(timeout=300)
    assert pre.returncode == 0, pre.stderr
    assert dec.returncode == 0, err
    assert_held_until_loaded(small_run.results("pre"), small_run.results("dec"))


def test_two_decode_nodes_share_the_requests_without_loading_one_twice(small_run, tmp_path):
    """Issue 38, item 4: each request goes to one decode node; together they load every request once."""
    url = f"nixl://127.0.0.1:{free_port()}"
    decs = [start_decode([*CLI, *node_args(small_run, tmp_path, name, "decode", url, "--duration", "600",
                                           "--warmup", "0", "--disagg-wait-s", "5")]) for name in ("d1", "d2")]
    pre = run_cli([*node_args(small_run, tmp_path, "pre", "prefill", url, *bounded(30))], timeout=300,
                  extra_env=TCP)
    for dec in decs:
        _, err = dec.communicate(timeout=300)
        assert dec.returncode == 0, err
    assert pre.returncode == 0, pre.stderr
    p = small_run.results("pre")
    done = [small_run.results(n)["requests"]["completed"] for n in ("d1", "d2")]
    assert sum(done) == p["requests"]["completed"] + p["warmup"]["requests"] and min(done) > 0, done
    assert all(small_run.results(n)["role"]["missing_blocks"] == 0 for n in ("d1", "d2"))
    assert len(p["role"]["decode_nodes"]) == 2


def test_a_frozen_prefill_node_is_a_fault_stop_within_the_peer_timeout(small_run, tmp_path):
    """Issue 37, item 2: a frozen prefill node (SIGSTOP) left its decode node silent and running at 150 s. It
    sends a heartbeat every second; nothing for --disagg-peer-timeout-s is a fault stop naming it, with the
    results so far."""

    url, dec, pre = serving_pair(small_run, tmp_path, "--disagg-peer-timeout-s", "3")
    try:
        pre.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        out, err = dec.communicate(timeout=120)
        took = time.monotonic() - frozen
    finally:
        pre.send_signal(signal.SIGCONT)
        pre.kill()
        pre.communicate(timeout=30)
    assert dec.returncode == 1, err
    d = small_run.results("dec")
    assert d["run"]["stopped_reason"] == "fault" and url in d["run"]["fault"], d["run"]["fault"]
    assert "--disagg-peer-timeout-s" in d["run"]["fault"] and d["run"]["partial"]
    assert len(sentences(err)) <= 1, err  # one sentence: no NIXL or UCX log line beside it
    assert took < 90, took  # the 3 s peer timeout, the drain of READs bound by it, the results: never unbounded


def test_a_decode_node_killed_mid_run_is_reported_by_its_prefill_node(small_run, tmp_path):
    """Issue 37, item 7: after its decode node was killed, the prefill node reported "decode nodes attached:
    none", and waited --disagg-wait-s for it at the end."""

    url, dec, pre = serving_pair(small_run, tmp_path)
    try:
        dec.kill()
        dec.communicate(timeout=30)
        pre.send_signal(signal.SIGINT)  # the prefill node stops cleanly and ends its manifest
        killed = time.monotonic()
        out, err = pre.communicate(timeout=120)
    finally:
        pre.kill()
    assert pre.returncode == 130 and "Traceback" not in err, err
    role = small_run.results("pre")["role"]
    assert len(role["decode_nodes"]) == 1 and role["decode_nodes_unfinished"] == role["decode_nodes"]
    assert "left before the end" in out
    assert time.monotonic() - killed < 30  # it did not wait --disagg-wait-s (30 s here) for a dead node


def test_junk_on_the_side_channel_is_ignored_without_a_traceback(small_run, tmp_path):
    """Issue 37, item 7: junk sent to a prefill node's side channel printed a thread's traceback."""
    port = free_port()
    url = f"nixl://127.0.0.1:{port}"
    pre = subprocess.Popen([*CLI, *node_args(small_run, tmp_path, "pre", "prefill", url, "--disagg-wait-s", "1",
                                             *bounded(30))],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for_line(pre, "running:")
        for junk in (b"not json\n", b'{"kind": "attach"}\n', b"\xff\xfe\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(junk)
        out, err = pre.communicate(timeout=180)
    finally:
        pre.kill()
    assert pre.returncode == 0 and "Traceback" not in err and "Exception" not in err, err


def test_the_readmes_two_namespace_recipe_runs_as_printed(small_run, tmp_path):
    """Issue 38, item 3: the documented recipe (docs/disaggregated.md), its own text (names and addresses made
    this test's own, the run shortened by flags added at the end): both nodes run and hand every request over."""
    if why_not():
        pytest.skip(why_not())
    text = (REPO / "docs" / "disaggregated.md").read_text()
    recipe = re.search(r"```sh\n(ip netns add pre;.*?)```", text, re.S).group(1)
    tag = os.getpid() % 100000
    subnet = f"10.232.{tag % 250}"
    for old, new in (("pre", f"kvr{tag}p"), ("dec", f"kvr{tag}d"), ("vpre", f"kvw{tag}p"), ("vdec", f"kvw{tag}d"),
                     ("10.231.1", subnet)):
        recipe = re.sub(rf"\b{re.escape(old)}\b", new, recipe)
    setup = [line for line in recipe.splitlines() if line.startswith("ip ")]
    dec_line = next(line for line in recipe.splitlines() if "--role decode" in line).rstrip(" &")
    pre_line = recipe.split("--role prefill", 1)[0].splitlines()[-1] + "--role prefill" + \
        recipe.split("--role prefill", 1)[1].replace("\\\n", " ")
    mine = f" --config {SMALL} --output-dir {tmp_path}/reports --cache-dir {tmp_path}"
    try:
        for line in setup:
            subprocess.run(line, shell=True, check=True, timeout=30)
        dec = subprocess.Popen(f"{dec_line.replace('python', sys.executable)}{mine} --run-id dec --warmup 0 "
                               f"--disagg-wait-s 10", shell=True, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        pre = subprocess.run(f"{pre_line.strip().replace('python', sys.executable)}{mine} --run-id pre --warmup 0 "
                             f"--max-requests 12", shell=True, cwd=REPO,
                             capture_output=True, text=True, timeout=300)
        _, err = dec.communicate(timeout=300)
    finally:
        for ns in (f"kvr{tag}p", f"kvr{tag}d"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert pre.returncode == 0, pre.stderr
    assert dec.returncode == 0, err
    p = json.loads((tmp_path / "reports" / "pre" / "results.json").read_text())
    d = json.loads((tmp_path / "reports" / "dec" / "results.json").read_text())
    assert d["requests"]["completed"] == p["requests"]["completed"] > 0 and d["role"]["missing_blocks"] == 0


def test_a_port_that_accepts_and_never_speaks_is_one_sentence(small_run, tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    url = f"nixl://127.0.0.1:{server.getsockname()[1]}"
    try:
        r = run_cli([*node_args(small_run, tmp_path, "dec", "decode", url, "--disagg-peer-timeout-s", "2")],
                    timeout=60, extra_env=TCP)
    finally:
        server.close()
    assert_clean_error(r, url, "sent no handoff header within 2 s")


def _fake_prefill(behaviour: str) -> tuple[socket.socket, threading.Thread]:
    """A peer on 127.0.0.1 that accepts one decode node and misbehaves: drips bytes without a newline (one a
    second, forever), or sends a header of the wrong shape, or one whose metadata is not base64."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)  # its attach line
            try:
                if behaviour == "drip":  # 120 s of bytes: a timeout per receive never fires
                    for _ in range(240):
                        conn.sendall(b"x")
                        time.sleep(0.5)
                elif behaviour == "shape":
                    conn.sendall(b'{"kind": "header", "nslots": "many"}\n')
                else:
                    conn.sendall(b'{"kind": "header", "nslots": 1, "slot_bytes": 4096, "metadata": "%%%"}\n')
                time.sleep(5)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return server, t


@pytest.mark.parametrize("behaviour", ["drip", "shape", "base64"])
def test_a_peer_that_drips_or_sends_a_wrong_header_is_one_sentence(small_run, tmp_path, behaviour):
    """Issue 52, items 3 and 4: a peer dripping bytes without a newline hung a decode node (its timeout held per
    receive, not per line); a header of the wrong shape or bad base64 was an internal error."""
    server, _ = _fake_prefill(behaviour)
    url = f"nixl://127.0.0.1:{server.getsockname()[1]}"
    start = time.monotonic()
    try:
        r = run_cli([*node_args(small_run, tmp_path, "dec", "decode", url, "--disagg-peer-timeout-s", "2")],
                    timeout=150, extra_env=TCP)
    finally:
        server.close()
    assert_clean_error(r, url)
    assert time.monotonic() - start < 60  # the 2 s peer timeout and start-up: far from the peer's 120 s


# A prefill side that publishes two blocks and serves them until killed, and a decode side that reads one, waits
# for the kill, then reads the other: in processes of their own (a NIXL agent in pytest's process would take its
# bundled libnl's crash at exit with it).


def test_a_read_from_a_prefill_node_that_died_is_a_run_fault_naming_it(tmp_path):
    """A READ whose peer is gone raised NIXL's own exception class (nixlRemoteDisconnectError), which ended the
    decode node as an internal error; it must be a RunFault (a fault stop) naming the prefill node."""
    url = f"nixl://127.0.0.1:{free_port()}"
    env = {**ENV, "PYTHONPATH": str(REPO)}
    target = subprocess.Popen([sys.executable, str(SCRIPTS / "nixl_target.py"), url], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert target.stdout.readline().strip() == "published"
        reader = subprocess.Popen([sys.executable, str(SCRIPTS / "nixl_reader.py"), url], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert reader.stdout.readline().strip() == "first True"
    finally:
        target.kill()
        target.wait()
    out, err = reader.communicate("go\n", timeout=90)
    assert reader.returncode == 0, err
    assert f"RunFault: a NIXL READ from the prefill node at {url} failed" in out, out + err


# Both sides in one process of its own: the prefill side publishes blocks 1 and 2 (stamped payloads, as a prefill
# node's), the decode side reads them; then slot 1 is reused for block 3 and block 2's bytes are damaged in place.


def test_a_replaced_block_is_missing_and_a_damaged_one_is_read_and_fails_its_verification(tmp_path):
    """A slot reused for another block while the decode node still expects the first: the block counts as missing,
    never as read (its pages carry another key, and the tag says so); a block damaged in place is read (its tag
    is still its key) and the verification that follows fails it, never hides it as missing."""
    url = f"nixl://127.0.0.1:{free_port()}"
    r = subprocess.run([sys.executable, str(SCRIPTS / "nixl_reuse.py"), url], capture_output=True, text=True,
                       timeout=120, env={**ENV, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert "before True True True True" in lines, r.stdout + r.stderr
    assert "after False True False" in lines, r.stdout + r.stderr


# The prefill side's region in "GPU memory" of the fake device (its HBM is host memory, registered as such; a real
# GPU's is registered as VRAM): blocks copied in with the device's H2D copies, read by the decode side with READs.


def test_a_prefill_region_in_gpu_memory_is_read_by_the_decode_side(tmp_path):
    """Issue 38: the prefill node's region can live in GPU memory (--disagg-handoff-memory gpu): DeviceSlots behind
    the same interface, each block copied in by the device, read by a decode node's NIXL READs; on the fake device
    here (a real GPU's run is make device-check's)."""
    url = f"nixl://127.0.0.1:{free_port()}"
    r = subprocess.run([sys.executable, str(SCRIPTS / "nixl_device.py"), url], capture_output=True, text=True,
                       timeout=120, env={**ENV, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert f"device DRAM 3 {4 * 2**20} 3" in r.stdout and "freed 0" in r.stdout, r.stdout + r.stderr


def test_a_gpu_region_runs_as_a_user_types_it(small_run, tmp_path):
    """Issue 46, point 2: `--role prefill --handoff nixl://... --gpu real --disagg-handoff-memory gpu` died on the H200
    ("TypeError: 'int' object is not subscriptable": tiers.gpus is a count) while the test above built the region
    by hand. Here the command line a user types, on the fake device (KVBENCH_FAKE_GPU), with a decode node reading
    every block of the region."""
    url = f"nixl://127.0.0.1:{free_port()}"
    fake = {**ENV, "KVBENCH_FAKE_GPU": "1:1"}
    dec = start_decode([*CLI, *node_args(small_run, tmp_path, "dec", "decode", url, "--warmup", "0")])
    pre = subprocess.run([*CLI, *node_args(small_run, tmp_path, "pre", "prefill", url, *bounded(6), "--gpu", "real",
                                           "--gpu-mem-gb", "0.05", "--disagg-handoff-memory", "gpu")],
                         capture_output=True, text=True, timeout=300, env=fake)
    _, err = dec.communicate(timeout=300)
    assert pre.returncode == 0, pre.stdout[-1500:] + pre.stderr
    assert dec.returncode == 0, err
    assert "fake devices in host memory (tests only)" in " ".join(pre.stdout.split())
    p = json.loads((tmp_path / "reports" / "pre" / "results.json").read_text())
    d = json.loads((tmp_path / "reports" / "dec" / "results.json").read_text())
    assert "fake device 0" in json.dumps(p["run"]["tiers"]["gpu"])  # the real GPU tier's path, on the stand-in
    assert d["requests"]["completed"] == p["requests"]["completed"] == 6 and d["role"]["missing_blocks"] == 0
    assert d["verification"]["failures"] == 0


def test_a_gpu_region_without_a_real_gpu_tier_is_one_sentence(small_run, tmp_path):
    r = run_cli([*node_args(small_run, tmp_path, "pre", "prefill", f"nixl://127.0.0.1:{free_port()}"),
                 "--disagg-handoff-memory", "gpu", "--gpu", "off"], timeout=60, extra_env=TCP)
    assert_clean_error(r, "--disagg-handoff-memory gpu", "--gpu real")


def test_without_nixl_the_nixl_handoff_is_one_sentence(small_run, tmp_path):
    shadow = tmp_path / "shadow" / "nixl_cu12"  # a nixl_cu12 that cannot be imported, ahead of any installed one
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not here')\n")
    r = run_cli(small_run("pre", "--role", "prefill", "--handoff", f"nixl://127.0.0.1:{free_port()}",
                          "--disagg-handoff-gb", "0.25", *bounded(2)),
                extra_env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert_clean_error(r, "the NIXL handoff needs NIXL's wheel: pip install --no-deps nixl-cu12")


def test_the_handoff_benchs_load_path_pair_runs():
    """make bench's handoff row 'NixlLoader.load() alone' hung for its 300 s and killed the bench: its reader never
    said ready, and requests go only to decode nodes that have (since 13c1215)."""
    from helpers import bench_module

    bench = bench_module("handoff_bench")
    url = f"nixl://127.0.0.1:{free_port()}"
    got = bench.pair(bench.pinned, ["--store-target", url, "8"], ["--store-reader", url, "8", "2"])
    assert got["blocks"] == 16 and got["p50_ms"] > 0
