"""The NIXL handoff's side channel (nixl_handoff.py): newline-delimited JSON over TCP on HOST:PORT, bound to
that address only. The prefill node accepts decode nodes of its run (same identity) and sends each the header
and every manifest line; a decode node connects (retrying while the prefill node is not up yet)."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time

from kv_cache.errors import UserError

HEARTBEAT_S = 1.0
HEARTBEAT = b'{"kind":"alive"}\n'


class Line:
    """Newline-delimited JSON over a socket."""

    def __init__(self, sock: socket.socket):
        self.sock, self.file = sock, sock.makefile("rb")
        self.lock = threading.Lock()

    def send(self, record: dict | bytes) -> None:
        data = record if isinstance(record, bytes) else (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self.lock:
            self.sock.sendall(data)

    def recv(self) -> dict | None:
        line = self.file.readline()
        return json.loads(line) if line.endswith(b"\n") else None

    def close(self) -> None:
        for f in (self.file, self.sock):
            try:
                f.close()
            except OSError:
                pass


class PrefillChannel:
    """The side channel of a prefill node: accepts decode nodes of this run, sends them every manifest line."""

    def __init__(self, host: str, port: int, identity: dict, slots, metadata: bytes, header: dict):
        """metadata: the prefill node's NIXL agent metadata, for decode nodes to add it as a remote agent."""
        self.identity, self.slots = identity, slots
        self.header = {"kind": "header", **header, "metadata": base64.b64encode(metadata).decode(),
                       "region": slots.region.ctypes.data, "tags": slots.tags.ctypes.data,
                       "slot_bytes": slots.slot_bytes, "nslots": slots.nslots}
        self.lines: list[bytes] = []
        self.peers: dict[str, Line] = {}
        self.done: set[str] = set()
        self.ever: set[str] = set()  # every decode node that attached (one that died is still one that came)
        self.lock = threading.Lock()
        try:
            self.server = socket.create_server((host, port))
        except OSError as e:
            raise UserError(f"--handoff nixl://{host}:{port}: cannot listen there ({why(e)}); pass an address "
                            f"of this host and a free port.") from None
        self.server.settimeout(0.2)
        self.closed = False
        threading.Thread(target=self._accept, name="handoff-accept", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="handoff-heartbeat", daemon=True).start()

    def _heartbeat(self) -> None:
        """A line every HEARTBEAT_S, so that a decode node tells an idle prefill node from a frozen one."""
        while not self.closed:
            time.sleep(HEARTBEAT_S)
            self._send_all(HEARTBEAT)

    def _send_all(self, line: bytes) -> None:
        with self.lock:
            for name, peer in list(self.peers.items()):
                try:
                    peer.send(line)
                except OSError:
                    self.peers.pop(name, None)

    def _accept(self) -> None:
        while not self.closed:
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            threading.Thread(target=self._serve, args=(Line(sock),), name="handoff-peer", daemon=True).start()

    def _serve(self, peer: Line) -> None:
        """One decode node's connection; junk, a reset or a vanished peer ends it quietly (its thread printed a
        traceback on junk before)."""
        try:
            self._talk(peer)
        except (OSError, ValueError, AttributeError, TypeError):
            pass
        finally:
            with self.lock:
                for name, p in list(self.peers.items()):
                    if p is peer:
                        self.peers.pop(name)
            peer.close()

    def _talk(self, peer: Line) -> None:
        peer.sock.settimeout(None)
        hello = peer.recv()
        if not hello or hello.get("kind") != "attach":
            return peer.close()
        wrong = [k for k in self.identity if hello.get("identity", {}).get(k) != self.identity[k]]
        if wrong:
            runs = ", ".join(f"{k} {self.identity[k]!r}" for k in wrong)
            peer.send({"kind": "refused", "why": f"this prefill node runs {runs}"})
            return peer.close()
        name = str(hello.get("name"))
        with self.lock:  # the header and every line so far, then the peer gets each new line as it is sent
            peer.send(self.header)
            for line in self.lines:
                peer.send(line)
            self.peers[name] = peer
            self.ever.add(name)
        while (msg := peer.recv()) is not None:
            if msg.get("kind") == "done":
                self.done.add(name)

    def append(self, record: dict | bytes) -> None:
        line = record if isinstance(record, bytes) else (json.dumps(record) + "\n").encode()
        if line.startswith(b'{"kind":"request"'):  # where each of its blocks is, now
            d = json.loads(line)
            d["slots"] = self.slots.where(int(k, 16) for k in d["keys"])
            line = (json.dumps(d, separators=(",", ":")) + "\n").encode()
        with self.lock:
            self.lines.append(line)
        self._send_all(line)

    def attached(self) -> set[str]:
        """Every decode node that attached during the run (connected now or not)."""
        with self.lock:
            return set(self.ever)

    def connected(self) -> set[str]:
        with self.lock:
            return set(self.peers)

    def close(self) -> None:
        self.closed = True
        self.server.close()
        with self.lock:
            for peer in self.peers.values():
                peer.close()
            self.peers.clear()


def why(e: OSError) -> str:
    """The system's words for e, without what Python adds to some (create_server repeats the address)."""
    return os.strerror(e.errno) if e.errno else str(e) or type(e).__name__


def connect(host: str, port: int, wait_s: float, url: str, say) -> socket.socket:
    """Connect to the prefill node's side channel, retrying until wait_s (a decode node may start first)."""
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5)
            sock.settimeout(None)  # the manifest may be quiet for long: reads block until a line or the end
            return sock
        except ConnectionRefusedError:
            pass
        except OSError as e:
            raise UserError(f"--handoff {url}: cannot reach the prefill node ({why(e)}); check the "
                            f"address and that this host has a route to it.") from None
        if time.monotonic() >= deadline:
            raise UserError(f"no prefill node answered at {url} within {wait_s:g} s; start a --role prefill run "
                            f"with the same --handoff (or raise --disagg-wait-s).")
        if not said:
            say(f"  waiting for a prefill node at {url} (up to {wait_s:g} s, --disagg-wait-s)")
            said = True
        time.sleep(0.1)
