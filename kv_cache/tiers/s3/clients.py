"""The S3 medium's two clients reduced to the store's ops: put, get, delete, list, and the kind of an error."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import timedelta

from kv_cache.errors import UserError


def _ca_bundle(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise UserError(f"AWS_CA_BUNDLE={path} cannot be read ({e.strerror}); point it at the PEM file of the "
                        f"authority that signed the endpoint's certificate.") from None


class ObstoreOps:
    """obstore's calls, the store's ops."""

    def __init__(self, bucket: str, endpoint: str, env, s):  # s: the medium's S3Settings
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

    def head(self, name: str) -> int:
        return int(self.ob.head(self.store, name)["size"])

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


class Boto3Ops:
    """boto3's calls, the store's ops."""

    def __init__(self, bucket: str, endpoint: str, env, s, lanes: int):  # s: S3Settings
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

    def head(self, name: str) -> int:
        return int(self.client.head_object(Bucket=self.bucket, Key=name)["ContentLength"])

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
