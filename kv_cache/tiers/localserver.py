"""A server process of ours for a remote medium's tests and bench: each remote medium's module declares how to
start its own (``register_remote(..., local_server=...)``), this module runs it.

Bound to 127.0.0.1 only, on a free port, in a folder of its own; it dies with the process that started it
(PR_SET_PDEATHSIG: a killed pytest leaves no server behind) and is stopped by its PID (SIGTERM, then SIGKILL).
Nothing here runs in a benchmark run: a run's --remote-url names a server the user runs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"


def _die_with_parent() -> None:
    """In the server's child process: SIGKILL it when the process that started it dies."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct free ports: each one's socket held until all are drawn. Drawn one after another, each closed, the
    kernel may give the same port twice: the S3 gateway's volume server once took the port drawn for its gateway,
    which then could not listen, while the wait for that port saw the volume server there."""
    held: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            held.append(s)
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((HOST, port)) == 0


@dataclass
class LocalServer:
    """A server process of ours: its URL, the environment a client needs, and how to stop it."""

    url: str
    proc: subprocess.Popen
    folder: Path
    env: dict = field(default_factory=dict)
    sockets: list[Path] = field(default_factory=list)  # files it makes outside its folder, removed at its stop

    def stop(self, timeout: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after timeout (a server may ignore SIGTERM while it closes: its data is the
        test's own, in the test's folder)."""
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


def spawn(args: list[str], folder: Path, port: int, url: str, log: str, seconds: float = 10.0,
          env: dict | None = None, stdout_log: bool = False, sockets: tuple[Path, ...] = ()) -> LocalServer:
    """Start args in folder and wait until it listens on port (its log's tail in the error if it exits);
    stdout_log: the server writes its log on stdout (else it writes folder/log itself); sockets: files it makes
    outside its folder, removed at its stop (and when it fails to start)."""
    folder.mkdir(parents=True, exist_ok=True)
    # the log is opened never through a link (a folder reused by a test may hold one where the log goes)
    out = os.open(folder / log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644) if stdout_log \
        else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT if stdout_log else subprocess.DEVNULL,
                                start_new_session=True, cwd=folder, preexec_fn=_die_with_parent,
                                env=dict(os.environ, **(env or {})))
    finally:
        if stdout_log:
            os.close(out)
    server = LocalServer(url, proc, folder, sockets=list(sockets))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            server.kill()
            text = (folder / log).read_text()[-500:] if (folder / log).exists() else ""
            raise RuntimeError(f"the server exited at start ({text})")
        if _listening(port):
            return server
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    server.kill()
    raise RuntimeError(f"the server did not listen on {HOST}:{port} within {seconds:g} s")


def certificates(folder: Path) -> Path:
    """A certificate authority (ca.pem) and a certificate for 127.0.0.1 it signed (cert.pem, key.pem), made for
    one server in its folder (trustme); the authority's path."""
    import trustme

    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert(HOST)
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    return folder / "ca.pem"
