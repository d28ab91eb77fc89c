#!/usr/bin/env python3
"""make bench, disaggregated handoff: prefill -> decode over NIXL against NIXL's own READ loop, and the folder.

Between two network namespaces joined by a veth pair (root; tests/netns.py), UCX over TCP (UCX_TLS=tcp) — two
hosts' network stacks on one machine; without root, on 127.0.0.1. At one block size (2 MiB: llama8b, 16 tokens):

1. anchor: a plain NIXL READ loop — a target process registers N blocks of host memory, a reader process in the
   other namespace READs them one at a time into its registered buffer (no workload, no checks): per-block p50.
2. ours alone: the same loop through our classes (NixlPublisher publishing stamped blocks, NixlLoader.load(): the
   READ, the stamps' check, the bookkeeping), no workload: what our code path costs beside NIXL's.
3. ours, NIXL: a --role prefill node in one namespace, a --role decode node (1 worker) in the other with
   --handoff nixl:// and --request-io serial (one block in flight, as the anchor); the decode node's per-block
   read p50 (latency_ms.handoff.read), its GB/s over its window, and the ratio anchor p50 / ours p50 (1.0: the
   decode node reads a block as fast as NIXL alone does).
   Each node's CPU tier holds its own blocks (--cpu-mem-gb 1), as a GPU node keeps its KV in HBM. Twice:
   "prefill serving", the prefill node publishes 60 requests in a moment and then only serves them, as the
   anchor's target does; "prefill flat out", it publishes for 10 s as fast as it can, its own workload on the
   core that also serves the READs (and, over veth, runs the network stack for them).
   And "2 decode nodes, prefill flat out": two decode nodes (1 worker each) sharing the prefill node's requests,
   each request loaded by one of them; the prefill node's waits for room (its handoff space full of blocks not
   yet acknowledged) are printed for both flat-out rows.
4. ours, NIXL, the decode node's blocks on its disk: "prefill serving" again with the nodes' CPU tiers of the
   test settings (30 MB): the decode node demotes its decode blocks to its disk between READs, on its one core
   (O_DIRECT writes, the file system's journal): what a node's own storage traffic costs its READs.
5. ours, folder: the same two nodes with --handoff file://DIR on this machine's disk (its page cache included:
   a shared folder on one host is not a network), for scale.
6. ours, NIXL, batched (a run's default --request-io): "prefill serving" again, the decode node reading a
   request's window of blocks in one READ; its per-block time runs from the READ's start to the block's end (a
   window's time, not comparable with the anchor's one block), so its ratio is of GB/s: ours / the anchors'.

Each node, and each side of the anchor, runs on a core of its own (taskset), as on hosts of their own. The
figures move by tens of percent from minute to minute on this VM, so each round (3, --rounds) runs the anchor
before and after each of ours, and each ratio compares ours with the mean of the two anchors around it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from netns import NetnsPair, why_not  # noqa: E402

from kv_cache.tiers import localserver  # noqa: E402

BLOCK = 2 * 2**20
ENV = {**os.environ, "UCX_TLS": "tcp", "PYTHONUNBUFFERED": "1"}
CLI = [sys.executable, str(REPO / "kv_cache_benchmark.py")]
SMALL = REPO / "tests" / "fixtures" / "small.yaml"


def target(folder: str, blocks: int) -> None:
    """The anchor's target: register `blocks` blocks, write the metadata for the reader, wait until it is done."""
    from kv_cache.lifecycle.handoff.agent import make_agent

    agent = make_agent("anchor-target", serves=True)
    region = np.random.default_rng(1).integers(0, 255, blocks * BLOCK, dtype=np.uint8)
    agent.register_memory([(region.ctypes.data, region.nbytes, 0, "")], "DRAM")
    meta = Path(folder) / "target.bin"
    meta.with_suffix(".tmp").write_bytes(agent.get_agent_metadata())
    meta.with_suffix(".tmp").rename(meta)
    (Path(folder) / "target.json").write_text(json.dumps({"region": region.ctypes.data}))
    while not (Path(folder) / "reader.done").exists():
        time.sleep(0.05)
    os._exit(0)  # NIXL's bundled libnl crashes in its destructor at exit (kv_cache.cli.main.leave)


def reader(folder: str, blocks: int, rounds: int) -> None:
    """The anchor's reader: READ every block, one at a time, `rounds` times; print the per-block seconds."""
    from kv_cache.lifecycle.handoff.agent import POLL_S, make_agent

    agent = make_agent("anchor-reader", serves=False)
    while not (Path(folder) / "target.json").exists():
        time.sleep(0.05)
    peer = agent.add_remote_agent((Path(folder) / "target.bin").read_bytes())
    base = json.loads((Path(folder) / "target.json").read_text())["region"]
    buf = np.zeros(BLOCK, np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    times = []
    for _ in range(rounds):
        for i in range(blocks):
            start = time.perf_counter()
            local = agent.get_xfer_descs([(buf.ctypes.data, BLOCK, 0)], "DRAM")
            remote = agent.get_xfer_descs([(base + i * BLOCK, BLOCK, 0)], "DRAM")
            handle = agent.initialize_xfer("READ", local, remote, peer)
            state = agent.transfer(handle)
            while state == "PROC":
                time.sleep(POLL_S)
                state = agent.check_xfer_state(handle)
            agent.release_xfer_handle(handle)
            times.append(time.perf_counter() - start)
    (Path(folder) / "reader.done").touch()
    print(json.dumps(times), flush=True)
    os._exit(0)


IDENT = {"model": "bench", "kv_dtype": "fp16", "tp": 1, "block_tokens": 16, "seed": 1}


def store_target(url: str, blocks: int) -> None:
    """Our prefill side alone: NixlPublisher publishes `blocks` blocks as one request, then serves until done."""
    from kv_cache.lifecycle.handoff.nixl import NixlPublisher
    from kv_cache.lifecycle.payload import PayloadPool
    from kv_cache.types import Handoff

    store = NixlPublisher.create(url, BLOCK, blocks * BLOCK, IDENT)
    pool, data = PayloadPool(1), np.zeros(BLOCK, np.uint8)
    keys = tuple(range(1, blocks + 1))
    for k in keys:
        pool.fill(k, data)  # stamped, as a prefill node's blocks (the decode side checks the stamps)
        store.blocks.put(k, memoryview(data))
    store.hand_over(Handoff("r", keys, (BLOCK,) * blocks, (), (), blocks * 16, 1, 16, time.time()))
    deadline = time.monotonic() + 60
    # a prefill node's clock starts once a decode node is ready, and requests go only to ready nodes: the end line
    # finish() sends to every attached node would reach one not yet ready before its request
    while not store.ready_nodes() and time.monotonic() < deadline:
        time.sleep(0.05)
    store.finish(120, True, lambda *_: None)  # its reader never acknowledges (no workload): nothing to say
    os._exit(0)


def store_reader(url: str, blocks: int, rounds: int) -> None:
    """Our decode side alone: NixlLoader.load() of every block, one at a time; the per-block seconds."""
    from kv_cache.lifecycle.handoff.nixl import NixlLoader

    link = NixlLoader(url, IDENT, 30, lambda m: None)
    link.ready()  # as a decode node whose clock starts: requests go only to ready nodes
    deadline = time.monotonic() + 30
    while len(link.slot_of) < blocks:
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(link.slot_of)} of the {blocks} blocks handed over within 30 s")
        time.sleep(0.01)
    out, times = memoryview(np.zeros(BLOCK, np.uint8)), []
    for _ in range(rounds):
        for k in range(1, blocks + 1):
            start = time.perf_counter()
            if not link.load(k, out):
                raise SystemExit(f"block {k} missing")
            times.append(time.perf_counter() - start)
    link.detach()
    print(json.dumps(times), flush=True)
    os._exit(0)


def pair(run, target_args: list[str], reader_args: list[str]) -> dict:
    """A target process in namespace a and a reader in b (this file's other modes); the reader's figures."""
    me = [sys.executable, __file__]
    tgt = subprocess.Popen(run("a", [*me, *target_args]), env=ENV)
    out = subprocess.run(run("b", [*me, *reader_args]), env=ENV, capture_output=True, text=True, timeout=300)
    tgt.wait(timeout=60)
    if out.returncode or not out.stdout.strip():
        raise SystemExit(f"{' '.join(reader_args)} failed: {out.stderr[-800:]}")
    times = np.array(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"p50_ms": float(np.percentile(times, 50) * 1e3), "p99_ms": float(np.percentile(times, 99) * 1e3),
            "gbps": BLOCK * len(times) / times.sum() / 1e9, "blocks": len(times)}


BACKLOG = ("--max-requests", "60", "--duration", "600")  # published in a moment; then the prefill node only serves
FLAT_OUT = ("--duration", "10")  # the prefill node publishing all along, its core busy with its own workload
IN_MEMORY = ("--cpu-mem-gb", "1")  # a node's own blocks stay in its CPU tier (a GPU node's in HBM), off its disk


def handoff(run, tmp: Path, url: str, bound: tuple[str, ...] = FLAT_OUT, own: tuple[str, ...] = IN_MEMORY,
            decoders: int = 1, io: str = "serial") -> dict:
    """A prefill node (namespace a) and `decoders` decode nodes (namespace b, 1 worker each); the decode nodes'
    figures (the median of their p50s and p99s, their GB/s summed) and the prefill node's waits for room. io:
    --request-io of both nodes: serial, one block in flight as the anchor's loop; batched (the default of a run), a
    request's window of blocks in one READ, each block's time from the READ's start to its end."""
    def node(run_id: str, role: str, *extra: str) -> list[str]:
        cache = tmp / f"{run_id}-cache"
        cache.mkdir(parents=True, exist_ok=True)
        return [*CLI, "--config", str(SMALL), "--output-dir", str(tmp / "reports"), "--cache-dir", str(cache),
                "--run-id", run_id, "--role", role, "--handoff", url, "--disagg-wait-s", "30",
                "--disagg-handoff-gb", "2", "--warmup", "0", "--request-io", io, *own, *extra]

    names = [f"dec{i}" for i in range(decoders)]
    decs = []
    for name in names:
        dec = subprocess.Popen(run("b", node(name, "decode", "--duration", "600", "--workers", "1")), env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = ""
        while "waiting for a prefill node" not in seen and dec.poll() is None:
            seen += dec.stdout.readline()
        decs.append(dec)
    pre = subprocess.run(run("a", node("pre", "prefill", "--quiet", *bound)), env=ENV,
                         capture_output=True, text=True, timeout=300)
    errs = [dec.communicate(timeout=300)[1] for dec in decs]
    if pre.returncode or any(dec.returncode for dec in decs):
        raise SystemExit(f"handoff over {url} failed: {pre.stderr[-500:]} {' '.join(e[-500:] for e in errs)}")
    ds = [json.loads((tmp / "reports" / name / "results.json").read_text()) for name in names]
    lats = [d["latency_ms"]["handoff"]["read"] for d in ds]
    wait = json.loads((tmp / "reports" / "pre" / "results.json").read_text())["latency_ms"]["handoff"].get("wait")
    return {"p50_ms": float(np.median([x["p50"] for x in lats])), "p99_ms": float(np.median([x["p99"] for x in lats])),
            "gbps": sum(d["bandwidth_gbps"]["handoff"]["read"] for d in ds), "blocks": sum(x["count"] for x in lats),
            "missing": sum(d["role"]["missing_blocks"] for d in ds),
            "failures": sum(d["verification"]["failures"] for d in ds),
            "waits": (wait or {}).get("count") or 0, "wait_p50_ms": (wait or {}).get("p50")}


def pinned(side: str, argv: list[str]) -> list[str]:
    """argv on one core of its own, where there are two: each node (and each side of the anchor) as on a host of
    its own, not one node's workload delaying the other's transfers on a shared core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return argv
    return ["taskset", "-c", str(cores["ab".index(side)]), *argv]


def free_port(host: str) -> int:
    """A free port: on 127.0.0.1 asked of the kernel; in a namespace made for this run every port is free."""
    if host != "127.0.0.1":
        return 20000 + os.getpid() % 20000
    return localserver.free_port()


def rounds(run, host: str, tmp: Path, n: int) -> list[dict]:
    """n rounds (one_round), each in a folder and on ports of its own."""
    out = []
    for i in range(n):
        (tmp / f"round{i}").mkdir()
        out.append(one_round(run, host, tmp / f"round{i}", free_port(host) + 6 * i))
    return out


def one_round(run, host: str, folder: Path, port: int) -> dict:
    """The anchor, then each of ours (our load path alone, a decode node with the prefill node serving, one with
    it flat out, one serving with the decode node's blocks on its disk) followed by the anchor again. This VM's
    transfers speed up and slow down by tens of percent from minute to minute, so each of ours is compared with
    the mean of the two anchors around it."""
    def anchor(k: int) -> dict:
        (folder / f"a{k}").mkdir()
        return pair(run, ["--target", str(folder / f"a{k}"), "64"], ["--reader", str(folder / f"a{k}"), "64", "4"])

    ours = {"alone": lambda: pair(run, ["--store-target", f"nixl://{host}:{port}", "64"],
                                  ["--store-reader", f"nixl://{host}:{port}", "64", "4"]),
            "served": lambda: handoff(run, folder / "served", f"nixl://{host}:{port + 1}", BACKLOG),
            "node": lambda: handoff(run, folder / "flat", f"nixl://{host}:{port + 2}"),
            "two": lambda: handoff(run, folder / "two", f"nixl://{host}:{port + 4}", decoders=2),
            "disk": lambda: handoff(run, folder / "disk", f"nixl://{host}:{port + 3}", BACKLOG, own=()),
            "batched": lambda: handoff(run, folder / "batched", f"nixl://{host}:{port + 5}", BACKLOG, io="batched")}
    anchors, got = [anchor(0)], {}
    for k, (name, measure) in enumerate(ours.items(), 1):
        got[name] = measure()
        anchors.append(anchor(k))
        got[name]["anchor_p50_ms"] = (anchors[-2]["p50_ms"] + anchors[-1]["p50_ms"]) / 2
        got[name]["anchor_gbps"] = (anchors[-2]["gbps"] + anchors[-1]["gbps"]) / 2
    got["anchor"] = sorted(anchors, key=lambda a: a["p50_ms"])[len(anchors) // 2]
    return got


def main() -> None:
    modes = {"--target": target, "--reader": reader, "--store-target": store_target, "--store-reader": store_reader}
    if len(sys.argv) > 1 and sys.argv[1] in modes:
        return modes[sys.argv[1]](sys.argv[2], *map(int, sys.argv[3:]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of anchor, load path and decode node [3]")
    n = ap.parse_args().rounds
    try:
        import nixl_cu12  # noqa: F401
    except ImportError:
        print("handoff bench: skipped: nixl-cu12 is not installed (make install)")
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        why = why_not()
        net = NetnsPair().__enter__() if why is None else None
        try:
            run = (lambda side, argv: net.exec_argv(side, pinned(side, argv))) if net else pinned
            host = net.addr["a"] if net else "127.0.0.1"
            where = (f"two network namespaces ({net.addr['a']} -> {net.addr['b']}, veth)" if net else
                     f"127.0.0.1 ({why})")
            done = rounds(run, host, tmp, n)
        finally:
            if net:
                net.__exit__()
        shared = tmp / "shared"
        shared.mkdir()
        folder = handoff(pinned, tmp / "folder", f"file://{shared}")
    report(done, folder, where)


def report(done: list[dict], folder: dict, where: str) -> None:
    print(f"Handoff, 2 MiB blocks, one in flight (--request-io serial) but in the batched row, UCX over TCP, "
          f"{where}, each side on a core of its own; "
          f"{len(done)} rounds (median of the rounds' p50 and p99; GB/s and blocks of the median round; the anchor's "
          f"row: each round's median of its 5 runs):")
    print(f"  {'':38} {'p50 ms':>8} {'p99 ms':>8} {'GB/s':>8} {'blocks':>7} {'missing':>8} {'failed':>7}")
    rows = [(name, [r[k] for r in done]) for name, k in (("anchor: plain NIXL READ loop", "anchor"),
                                                         ("ours: NixlLoader.load() alone", "alone"),
                                                         ("ours: decode node, prefill serving", "served"),
                                                         ("ours: decode node, prefill flat out", "node"),
                                                         ("ours: 2 decode nodes, prefill flat out", "two"),
                                                         ("ours: decode node, its blocks on disk", "disk"),
                                                         ("ours: decode node batched, serving", "batched"))]
    for name, rs in [*rows, ("ours: decode node, file:// (local)", [folder])]:
        mid = sorted(rs, key=lambda r: r["p50_ms"])[len(rs) // 2]
        lost = [f"{sum(r[k] for r in rs):8d}" if k in rs[0] else f"{'-':>8}" for k in ("missing", "failures")]
        print(f"  {name:38} {np.median([r['p50_ms'] for r in rs]):8.2f} {np.median([r['p99_ms'] for r in rs]):8.2f} "
              f"{mid['gbps']:8.3f} {mid['blocks']:7d} {lost[0]} {lost[1]:>7}")
    for name, k in (("load() alone", "alone"), ("decode node, prefill serving", "served"),
                    ("decode node, prefill flat out", "node"), ("2 decode nodes, prefill flat out", "two"),
                    ("decode node, its blocks on disk", "disk")):
        ratios = [r[k]["anchor_p50_ms"] / r[k]["p50_ms"] for r in done]
        print(f"  ratio anchor p50 (mean of the runs before and after) / ours p50, {name:31}: "
              f"{' '.join(f'{x:.2f}' for x in ratios)} per round, "
              f"median {np.median(ratios):.2f} (target >= 0.9)")
    ratios = [r["batched"]["gbps"] / r["batched"]["anchor_gbps"] for r in done]
    print(f"  ratio ours GB/s / the anchors' around it, decode node batched, prefill serving: "
          f"{' '.join(f'{x:.2f}' for x in ratios)} per round, median {np.median(ratios):.2f} (its p50: a request's "
          f"window of blocks in one READ, each block timed from the READ's start to its end; the anchor's: one block)")
    for name, k in (("prefill flat out, 1 decode node", "node"), ("prefill flat out, 2 decode nodes", "two")):
        waits = [r[k]["waits"] for r in done]
        p50s = [r[k]["wait_p50_ms"] for r in done if r[k]["wait_p50_ms"] is not None]
        print(f"  the prefill node's waits for room, {name}: {sum(waits)} over the rounds"
              + (f", p50 {np.median(p50s):.2f} ms" if p50s else ""))
    print("  missing / failed: blocks summed over the rounds (a prefill node holds a request's blocks until a "
          "decode node acknowledges it, and waits when its space is full: none should go missing); 2 decode nodes: "
          "each request to one of them, GB/s summed, p50 / p99 the median of theirs; a decode node's GB/s is "
          "paced by the prefill node's publishing (the workload), the anchor's by the transport alone")


if __name__ == "__main__":
    main()
