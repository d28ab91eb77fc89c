"""Real servers for the remote tiers' tests and bench: each remote medium's module declares its own (its
local_server hook: kv_cache/tiers/localserver.py runs it on 127.0.0.1 only), found here through the registry (found.py);
and what a test reads back from them (the keys or objects a run left)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from found import REGISTRY

from kv_cache.tiers.localserver import HOST, LocalServer, free_port

__all__ = ["HOST", "LocalServer", "free_port", "media_with_servers", "password_of", "s3_objects", "start",
           "valkey_keys"]


def start(medium: str, folder: Path, **options) -> LocalServer:
    """The medium's own local server (its module's local_server), started in folder; RuntimeError or ImportError
    where it cannot start here."""
    return REGISTRY.media.by_name()[medium].local_server(folder, **options)


def media_with_servers() -> list[str]:
    """The media whose modules declare a local server: conftest.py makes a <name>_server fixture of each."""
    return sorted(name for name, k in REGISTRY.media.by_name().items() if k.local_server is not None)


def password_of(url: str) -> str:
    return urlsplit(url).password or ""


def valkey_keys(url: str, pattern: str = "kvbench-*") -> list[str]:
    """The keys of a server matching pattern (what a run left there)."""
    import valkey

    client = valkey.Valkey.from_url(url, socket_timeout=10)
    try:
        return sorted(k.decode() for k in client.scan_iter(match=pattern, count=1000))
    finally:
        client.close()


def s3_objects(server: LocalServer, prefix: str = "runs/") -> list[str]:
    """The object names of the server's bucket under prefix (what a run left there)."""
    import boto3

    env = server.env
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_REGION"],
                      verify=env.get("AWS_CA_BUNDLE") or None)
    bucket = server.url.split("://", 1)[1].split("/", 1)[0]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))
