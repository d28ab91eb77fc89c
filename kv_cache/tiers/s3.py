"""An S3-compatible object store as the remote bottom tier: one object per block.

--remote-url s3://BUCKET[/PREFIX]; the endpoint and credentials come from the environment as every S3 tool
reads them: AWS_ENDPOINT_URL (none: AWS itself), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
(default us-east-1), and AWS_CA_BUNDLE (a PEM file: the authority an https endpoint's certificate is checked
against, where it is not the system's). Two clients, chosen by media.s3.client: obstore (Rust, object_store)
and boto3 (botocore, a pool sized to the threads that move bytes); make bench measures both against a plain
loop of each. A block over media.s3.part_mb goes up in parts (multipart upload). Every call is bounded by
media.s3.timeout_s and not retried: a timeout, a refused credential, a missing bucket is said with the URL.

This module is the whole medium: its settings section, its builder, its contract cases.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import numpy as np

from kv_cache.config.keys import key
from kv_cache.config.media import section
from kv_cache.errors import RunFault, ServerDown, UserError
from kv_cache.tiers.registry import GiB
from kv_cache.tiers.remote import (
    MARKER_OBJECT,
    NAMESPACE,
    REMOTE_AUTO_MAX,
    RemoteTier,
    contract_tier,
    register_remote,
)

SCHEMES = ("s3",)


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


def _ca_bundle(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise UserError(f"AWS_CA_BUNDLE={path} cannot be read ({e.strerror}); point it at the PEM file of the "
                        f"authority that signed the endpoint's certificate.") from None


class _Obstore:
    """obstore's calls, the store's ops."""

    def __init__(self, bucket: str, endpoint: str, env, s: S3Settings):
        import obstore
        from obstore.exceptions import BaseError
        from obstore.store import S3Store

        # NOTE: obstore raises the builtin FileNotFoundError (PermissionError, TimeoutError, ...) for some errors
        self.ob, self.errors = obstore, (BaseError, OSError)
        options = {"timeout": f"{s.timeout_s}s", "connect_timeout": f"{min(s.timeout_s, 10)}s",
                   "allow_http": endpoint.startswith("http://"), "pool_max_idle_per_host": "64"}
        if env.get("AWS_CA_BUNDLE"):  # boto3 reads the variable itself; object_store takes the PEM's text
            options["root_certificate"] = _ca_bundle(env["AWS_CA_BUNDLE"])
        self.store = S3Store(bucket, endpoint=endpoint or None, access_key_id=env.get("AWS_ACCESS_KEY_ID"),
                             secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
                             region=env.get("AWS_REGION", "us-east-1"), client_options=options,
                             retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=s.timeout_s)})
        self.part = int(s.part_mb * 2**20)

    def put(self, name: str, data: memoryview) -> None:
        big = len(data) > self.part
        self.ob.put(self.store, name, data, use_multipart=big, chunk_size=self.part, max_concurrency=4)

    def get(self, name: str):
        return self.ob.get(self.store, name).bytes()

    def delete(self, names: list[str]) -> None:
        self.ob.delete(self.store, names)

    def list(self, prefix: str) -> Iterator[str]:
        for batch in self.ob.list(self.store, prefix, chunk_size=1000):
            for meta in batch:
                yield meta["path"]

    def prefixes(self, prefix: str) -> list[str]:
        return list(self.ob.list_with_delimiter(self.store, prefix or None)["common_prefixes"])

    def kind(self, e: Exception) -> str:
        """missing | denied | down | other, from obstore's exception types."""
        from obstore import exceptions as x

        if isinstance(e, (x.NotFoundError, FileNotFoundError)):
            return "missing"
        if isinstance(e, (x.PermissionDeniedError, x.UnauthenticatedError, PermissionError)):
            return "denied"
        if isinstance(e, (TimeoutError, ConnectionError)):
            return "down"
        text = str(e)
        if "NoSuchBucket" in text:
            return "bucket"
        if "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text or "AccessDenied" in text:
            return "denied"
        if "non-2xx status code" in text:  # the server answered (its status is in the message's first line)
            return "other"
        if "connect" in text.lower() or "timed out" in text.lower() or "timeout" in text.lower():
            return "down"
        return "other"


class _Boto3:
    """boto3's calls, the store's ops."""

    def __init__(self, bucket: str, endpoint: str, env, s: S3Settings, lanes: int):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        self.errors = (BotoCoreError, ClientError)
        self.bucket = bucket
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint or None, aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"), region_name=env.get("AWS_REGION", "us-east-1"),
            # NOTE: True, not None, where AWS_CA_BUNDLE is unset or empty: None lets botocore read the variable
            # itself, and an empty one turned verification off (an InsecureRequestWarning per request, tested)
            verify=env.get("AWS_CA_BUNDLE") or True,
            config=Config(connect_timeout=min(s.timeout_s, 10), read_timeout=s.timeout_s,
                          retries={"max_attempts": 1, "mode": "standard"}, max_pool_connections=lanes + 4))
        self.part = int(s.part_mb * 2**20)
        self.transfer = TransferConfig(multipart_threshold=self.part, multipart_chunksize=self.part, use_threads=False)

    def put(self, name: str, data: memoryview) -> None:
        if len(data) > self.part:
            self.client.upload_fileobj(io.BytesIO(data), self.bucket, name, Config=self.transfer)
        else:
            self.client.put_object(Bucket=self.bucket, Key=name, Body=bytes(data))

    def get(self, name: str):
        return self.client.get_object(Bucket=self.bucket, Key=name)["Body"].read()

    def delete(self, names: list[str]) -> None:
        self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": n} for n in names], "Quiet": True})

    def list(self, prefix: str) -> Iterator[str]:
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                yield item["Key"]

    def prefixes(self, prefix: str) -> list[str]:
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                            Delimiter="/"):
            out += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        return out

    def kind(self, e: Exception) -> str:
        code = getattr(e, "response", {}).get("Error", {}).get("Code", "") if hasattr(e, "response") else ""
        if code in ("NoSuchKey", "404"):
            return "missing"
        if code == "NoSuchBucket":
            return "bucket"
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            return "denied"
        name = type(e).__name__
        if "Endpoint" in name or "Connect" in name or "Timeout" in name:
            return "down"
        return "other"


class S3ObjectStore:
    """An S3 bucket (and prefix) behind a URL, as a remote tier uses it (see tiers/remote.py's Store)."""

    def __init__(self, url: str, settings: S3Settings, lanes: int, env=None):
        env = os.environ if env is None else env
        self.url = url  # s3:// URLs carry no secret: the credentials are in the environment
        self.bucket, self.prefix, endpoint = _where(url, env)
        self.where = f"{url} at {endpoint or 'AWS'}"
        self.timeout = settings.timeout_s
        self.version = f"S3 ({settings.client})"
        _check_setup(url, endpoint, env)
        try:
            self.ops = (_Obstore(self.bucket, endpoint, env, settings) if settings.client == "obstore"
                        else _Boto3(self.bucket, endpoint, env, settings, lanes))
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

    def check(self) -> None:
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

    def delete(self, names: list[tuple[str, int]]) -> None:
        self.remove([n for n, _ in names])

    def remove(self, names: list[str]) -> None:
        if not names:
            return
        try:
            self.ops.delete(names)
        except self.ops.errors as e:
            raise self._error(f"deleting {names[0]}", e) from None

    def object_name(self, run_id: str, key: int) -> str:
        return f"{self.prefix}{NAMESPACE}{run_id}/{key:016x}"

    def marker_name(self, run_id: str) -> str:
        return f"{self.prefix}{NAMESPACE}{run_id}/{MARKER_OBJECT}"

    def names(self, run_id: str) -> Iterator[str]:
        try:
            yield from self.ops.list(f"{self.prefix}{NAMESPACE}{run_id}/")
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
        pass


def open_store(url: str, settings: S3Settings, lanes: int = 4, env=None) -> S3ObjectStore:
    try:
        return S3ObjectStore(url, settings, lanes, env)
    except ImportError:
        raise UserError(f"--remote-url {url} needs the {settings.client} client: pip install -e '.[remote]' "
                        f"(make install installs it).") from None


def make_for_test(variant: str, directory: str, capacity_bytes: int, slot_bytes: int, server=None) -> RemoteTier:
    """The contract test's tier over a real S3 gateway (the s3_server fixture), with each client (variant)."""
    store = open_store(server.url, S3Settings(client=variant), 4, server.env)
    return contract_tier("s3", store, variant, directory, capacity_bytes, slot_bytes)


register_remote("s3", SCHEMES, open_store, contract=("obstore", "boto3"), make_for_test=make_for_test, server="s3")
