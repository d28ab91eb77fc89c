"""The NIXL handoff's side channel (nixl.py): newline-delimited JSON over TCP on HOST:PORT, bound to
that address only. The prefill node accepts decode nodes of its run (same identity) and sends each the header
and every manifest line; a decode node connects (retrying while the prefill node is not up yet)."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections import deque

from kv_cache import runlog
from kv_cache.errors import UserError

HEARTBEAT_S = 1.0
HEARTBEAT = b'{"kind":"alive"}\n'


MAX_LINE = 16 << 20  # one line: a request's keys, slots and digests (a million-token prompt's is a few MiB)


class Line:
    """Newline-delimited JSON over a socket. A line must arrive whole within the socket's timeout (a peer that
    drips bytes without a newline reset a per-receive timeout forever) and within MAX_LINE bytes (one that floods
    without a newline ran a node out of memory)."""

    def __init__(self, sock: socket.socket):
        self.sock, self._buf = sock, bytearray()
        self.lock = threading.Lock()

    def send(self, record: dict | bytes) -> None:
        data = record if isinstance(record, bytes) else (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self.lock:
            self.sock.sendall(data)

    def recv(self) -> dict | None:
        """The next record; None when the peer closed. TimeoutError when no whole line came within the socket's
        timeout; ValueError for a line too long, or not a JSON object."""
        limit = self.sock.gettimeout()
        deadline = None if limit is None else time.monotonic() + limit
        while (end := self._buf.find(b"\n")) < 0:
            if len(self._buf) > MAX_LINE:
                raise ValueError(f"a line runs past {MAX_LINE:,} bytes without an end")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no whole line within the timeout")
                self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            finally:
                if deadline is not None:
                    self.sock.settimeout(limit)
            if not chunk:
                return None
            self._buf += chunk
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError("a line that is not a JSON object")
        return record

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class PrefillChannel:
    """The side channel of a prefill node: accepts decode nodes of this run and hands each request to one of them.

    A request line goes to one attached decode node (in turn), which loads it and acknowledges it ("ack"): only
    then are its blocks released (on_ack(keys)), so a block is never replaced while a decode node may read it. A
    decode node that leaves, or says nothing (not even its heartbeat) for peer_timeout_s, has its requests handed
    to another; requests go only to nodes whose clock runs ("ready": one still building its tiers would hold them),
    and wait while there is none. Other lines (the end) go to all."""

    def __init__(self, host: str, port: int, identity: dict, slots, metadata: bytes, header: dict):
        """metadata: the prefill node's NIXL agent metadata, for decode nodes to add it as a remote agent."""
        self.identity, self.slots = identity, slots
        self.header = {"kind": "header", **header, "metadata": base64.b64encode(metadata).decode(),
                       "region": slots.region_addr, "region_mem": slots.region_mem,
                       "region_dev": slots.region_dev, "tags": slots.tags_addr,
                       "slot_bytes": slots.slot_bytes, "nslots": slots.nslots}
        self.lines: list[bytes] = []  # lines for every decode node (the end)
        self.pending: deque[tuple[str, list[int], bytes]] = deque()  # requests no decode node has yet
        self.assigned: dict[str, dict[str, tuple[list[int], bytes]]] = {}  # node -> rid -> (keys, line)
        self.heard: dict[str, float] = {}
        self.peers: dict[str, Line] = {}
        self.done: set[str] = set()
        self.ready: set[str] = set()  # decode nodes whose clock runs (they built their tiers after attaching)
        self.ever: set[str] = set()  # every decode node that attached (one that died is still one that came)
        self.turn = 0
        self.on_ack = lambda keys: None  # the store's release of a request's blocks
        self.peer_timeout_s = 10.0
        self.lost_requests = 0  # handed to a node that left after the end: no one can load them any more
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
        """A line every HEARTBEAT_S (a decode node tells an idle prefill node from a frozen one), and a decode
        node silent for peer_timeout_s is let go (its requests go to another)."""
        while not self.closed:
            time.sleep(HEARTBEAT_S)
            self._send_all(HEARTBEAT)
            now = time.monotonic()
            with self.lock:
                silent = [self.peers[n] for n, t in self.heard.items() if now - t > self.peer_timeout_s
                          and n in self.peers]
            for peer in silent:
                peer.close()  # its _serve thread ends and hands its requests on

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
        traceback on junk before), and its requests not yet acknowledged go to another node."""
        name = None
        try:
            name = self._talk(peer)
        except ValueError as e:  # junk or a flood: the connection ends, said once (it was silent)
            runlog.tell(f"warning: a peer of the handoff's side channel sent {e}; its connection was closed.")
        except (OSError, AttributeError, TypeError):
            pass
        finally:
            peer.close()
            if name is not None:
                self._leave(name, peer)

    def _talk(self, peer: Line) -> str | None:
        peer.sock.settimeout(None)
        hello = peer.recv()
        if not hello or hello.get("kind") != "attach":
            return None
        wrong = [k for k in self.identity if hello.get("identity", {}).get(k) != self.identity[k]]
        if wrong:
            runs = ", ".join(f"{k} {self.identity[k]!r}" for k in wrong)
            peer.send({"kind": "refused", "why": f"this prefill node runs {runs}"})
            return None
        name = str(hello.get("name"))
        with self.lock:  # the header, then this node takes its turn in the requests
            peer.send(self.header)
            self.peers[name], self.heard[name] = peer, time.monotonic()
            self.assigned.setdefault(name, {})
            self.ever.add(name)
            self._dispatch()
            for line in self.lines:
                peer.send(line)
        while (msg := peer.recv()) is not None:
            with self.lock:
                self.heard[name] = time.monotonic()
            if msg.get("kind") == "ack":
                with self.lock:
                    got = self.assigned.get(name, {}).pop(str(msg.get("rid")), None)
                if got is not None:
                    self.on_ack(got[0])
            elif msg.get("kind") == "done":
                self.done.add(name)
            elif msg.get("kind") == "ready":
                with self.lock:
                    self.ready.add(name)
                    self._dispatch()
        return name

    def _leave(self, name: str, peer: Line) -> None:
        """A decode node left: what it had not acknowledged goes to another node, or waits for one."""
        with self.lock:
            if self.peers.get(name) is peer:
                self.peers.pop(name)
            self.heard.pop(name, None)
            orphans = self.assigned.pop(name, {})
            if self.lines:  # the end was sent: no node follows the manifest any more
                self.lost_requests += len(orphans)
                release = [keys for keys, _ in orphans.values()]
            else:
                self.pending.extendleft((rid, keys, line) for rid, (keys, line) in reversed(orphans.items()))
                release = []
                self._dispatch()
        for keys in release:
            self.on_ack(keys)

    def _dispatch(self) -> None:
        """Lock held: hand the pending requests to the attached nodes whose clock runs, in turn (one still building
        its tiers would hold its requests' blocks, and the prefill node's space with them, until it is ready)."""
        while self.pending and (names := sorted(self.ready & set(self.peers))):
            name = names[self.turn % len(names)]
            self.turn += 1
            rid, keys, line = self.pending.popleft()
            try:
                self.peers[name].send(line)
            except OSError:
                self.pending.appendleft((rid, keys, line))
                self.peers.pop(name, None)
                continue
            self.assigned.setdefault(name, {})[rid] = (keys, line)

    def append(self, record: dict | bytes) -> None:
        line = record if isinstance(record, bytes) else (json.dumps(record) + "\n").encode()
        if not line.startswith(b'{"kind":"request"'):
            with self.lock:
                self.lines.append(line)
            self._send_all(line)
            return
        d = json.loads(line)
        keys = [int(k, 16) for k in d["keys"]]
        d["slots"] = self.slots.where(keys)  # where each of its blocks is, now (held there until acknowledged)
        line = (json.dumps(d, separators=(",", ":")) + "\n").encode()
        with self.lock:
            self.pending.append((str(d["rid"]), keys, line))
            self._dispatch()

    def unread(self) -> int:
        """Requests handed over that no decode node has acknowledged (pending or in a node's hands)."""
        with self.lock:
            return len(self.pending) + sum(len(a) for a in self.assigned.values())

    def attached(self) -> set[str]:
        """Every decode node that attached during the run (connected now or not)."""
        with self.lock:
            return set(self.ever)

    def connected(self) -> set[str]:
        with self.lock:
            return set(self.peers)

    def ready_nodes(self) -> set[str]:
        """Decode nodes connected whose clock runs, not yet done."""
        with self.lock:
            return (self.ready & set(self.peers)) - self.done

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
