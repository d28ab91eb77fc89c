"""Disaggregated prefill / decode over NIXL (--handoff nixl://HOST:PORT): the decode node pulls the blocks from
the prefill node's registered memory with NIXL READ transfers (UCX: RDMA where there is, TCP where not).

    prefill node                                        decode node
    region: slots of registered host memory  <-- READ --  its workers' buffers (registered on first use)
    tags:   one u64 per slot: the key it holds <-- READ --  checked after each block (below)
    side channel: TCP on HOST:PORT, bound to that address only, newline-delimited JSON:
        decode -> attach {identity}         prefill -> header {agent metadata, region, tags, slot size}
                                             prefill -> every manifest line so far and then as they come,
                                                        each request with the slot of each of its blocks
        decode -> done                       prefill -> end

A slot is reused (oldest published first, as the folder handoff removes its oldest files) when the handoff
space is full. Reuse is made visible twice. Every 4 KiB page of a block starts with its key's stamp (payload.py):
a block read whose every page carries the key was not replaced, and costs one READ, as NIXL's own loop does. Only
when a stamp differs is the slot's tag read: a seqlock, 0 before the block's bytes are copied in, its key after.
A tag that is not the key means the block was (being) replaced while or before it was read, and the block counts
as missing, never as read; a tag that is the key means the bytes themselves are wrong, and the verification that
follows counts the failure. (A replacement that overtakes the READ inside its last page leaves every stamp right:
that block fails the verification, which counts it as a failure rather than as missing: never as a good read.)
Both agents are torn down before the process ends, and the region is deregistered: nothing of the prefill
node's memory is reachable after its run.
"""

from __future__ import annotations

import base64
import os
import queue
import threading
import time

import numpy as np

from kv_cache.buffers import aligned_buffer
from kv_cache.errors import RunFault, UserError
from kv_cache.lifecycle.handoff import HandoffStore
from kv_cache.lifecycle.nixl_channel import HEARTBEAT, HEARTBEAT_S, Line, PrefillChannel, connect
from kv_cache.lifecycle.payload import stamped_with

MISSING = ("the NIXL handoff needs NIXL's wheel: pip install --no-deps nixl-cu12 (make install does; its torch "
           "dependency is not needed for host memory)")
SCHEME = "nixl://"
ENGINE = "nixl (UCX)"  # what the results' role section and tier table name
PROGRESS_DELAY_US = 1000  # NIXL's progress thread wakes on UCX's events, and at the latest after this (make_agent)
POLL_S = 0.00005  # a decode worker's pause between polls of its READ


def parse_url(url: str) -> tuple[str, int]:
    """nixl://HOST:PORT -> (host, port), or one sentence."""
    rest = url[len(SCHEME):] if url.startswith(SCHEME) else ""
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--handoff {url}: expected nixl://HOST:PORT (the prefill node's address and a free port), "
                        f"or file://DIR for a shared folder.")
    return host.strip("[]"), int(port)


def nixl_api():
    # NOTE: NIXL's and UCX's own log lines (a peer that reset its connection, a backend's warnings) broke the
    # one-line stderr rule: silenced unless --debug, before the libraries load (they read these once)
    from kv_cache import runlog

    quiet = not runlog.debugging()
    os.environ.setdefault("UCX_LOG_LEVEL", "fatal" if quiet else "warn")
    os.environ.setdefault("NIXL_LOG_LEVEL", "FATAL" if quiet else "WARN")
    try:
        from nixl_cu12 import _api
    except ImportError:
        raise UserError(MISSING + ".") from None
    import logging

    logging.getLogger("nixl").setLevel(logging.CRITICAL if quiet else logging.WARNING)
    return _api


def make_agent(name: str, serves: bool):
    """A NIXL agent with the UCX backend; one that serves READs (a prefill node) with NIXL's progress thread, made to
    sleep between events. A reader's own threads progress its READs while they poll them (a thread beside them
    would contend for the same UCX worker).

    NIXL's Python wrapper fixes that thread's poll delay at 0: it spins a whole core (2.99 CPU-s in 3 s idle,
    measured), which a 2-vCPU node cannot spare. With PROGRESS_DELAY_US the thread sleeps in poll() on UCX's event
    fd and wakes when data arrives (0.09 CPU-s in 3 s idle). It needs no GIL: a prefill node's busy workers do not
    delay the READs it serves, as a Python pump's would. The wrapper has no setting for the delay, so its C++ agent
    is made here with one (the wrapper's `agent`), and the backend then created on it."""
    api = nixl_api()
    try:
        agent = api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=False, backends=[]))
        if "UCX" not in agent.plugin_list:
            raise UserError("NIXL has no UCX plugin here; the NIXL handoff moves blocks over UCX.")
        conf = api.nixlBind.nixlAgentConfig()
        conf.useProgThread, conf.pthrDelay = serves, PROGRESS_DELAY_US
        conf.syncMode = api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT.value  # many workers
        agent.agent = api.nixlBind.nixlAgent(name, conf)
        agent.create_backend("UCX", {})
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - NIXL raises plain exceptions for a missing backend
        raise UserError(f"NIXL could not start its UCX backend ({e}); check that this host's loopback (lo) and the "
                        f"interface to the other node are up, and that UCX_TLS names transports it has (e.g. "
                        f"UCX_TLS=tcp).") from None
    return agent


class RegisteredSlots:
    """The prefill node's handoff space: slots of registered host memory and their tags (the blocks interface
    HandoffStore uses: put, delete, slots_for, slot_bytes, capacity_bytes, engine, close)."""

    engine, name, flags = ENGINE, "handoff", frozenset()

    def __init__(self, agent, capacity_bytes: int, slot_bytes: int):
        self.slot_bytes = slot_bytes
        self.nslots = max(capacity_bytes // slot_bytes, 1)
        self.capacity_bytes = self.nslots * slot_bytes
        self.region = aligned_buffer(self.capacity_bytes)
        self.tags = np.zeros(self.nslots, np.uint64)
        self.agent = agent
        self.regs = [agent.register_memory([(a.ctypes.data, a.nbytes, 0, "")], "DRAM")
                     for a in (self.region, self.tags)]
        self.free = list(range(self.nslots - 1, -1, -1))
        self.slot_of: dict[int, int] = {}
        self.lock = threading.Lock()
        self.description = (f"registered host memory read by decode nodes with NIXL (UCX), {self.nslots} slots of "
                            f"{slot_bytes / 2**20:.2f} MiB")

    def slots_for(self, nbytes: int) -> int:
        if nbytes > self.slot_bytes:
            raise RunFault(f"a block of {nbytes} bytes exceeds the handoff slot of {self.slot_bytes}.")
        return 1

    def put(self, key: int, data) -> None:
        with self.lock:
            slot = self.free.pop()
            self.slot_of[key] = slot
        self.tags[slot] = 0  # the seqlock: a reader that sees 0 or another key after its read drops the block
        start = slot * self.slot_bytes
        self.region[start:start + data.nbytes] = np.frombuffer(data, np.uint8)
        self.tags[slot] = key

    def delete(self, key: int) -> None:
        with self.lock:
            slot = self.slot_of.pop(key)
            self.free.append(slot)

    def where(self, keys) -> list[int]:
        with self.lock:
            return [self.slot_of.get(k, -1) for k in keys]

    def close(self, remove: bool = True) -> None:
        for reg in self.regs:
            self.agent.deregister_memory(reg)
        self.regs = []
        self.region[:] = 0  # nothing of the run's blocks stays in memory a later owner of these pages could read


class NixlPrefill(HandoffStore):
    """A prefill node publishing into registered memory and announcing over the side channel."""

    @classmethod
    def create_nixl(cls, url: str, slot_bytes: int, capacity_bytes: int, identity: dict) -> NixlPrefill:
        host, port = parse_url(url)
        agent = make_agent(f"kvbench-prefill-{os.uname().nodename}-{os.getpid()}", serves=True)
        slots = RegisteredSlots(agent, capacity_bytes, slot_bytes)
        store = cls(url, "prefill", lambda *_: slots, capacity_bytes, identity, f"p{os.getpid()}")
        store.folder = url
        try:
            header = {**identity, "started_wall": time.time()}
            store.channel = PrefillChannel(host, port, identity, slots, agent.get_agent_metadata(), header)
        except BaseException:
            slots.close()
            raise
        store._fd = 0  # open: finish() and abandon() end the manifest once
        store.acks = True  # blocks held until the decode node that loaded them says so (no reader meets a reuse)
        store.channel.on_ack = store.release
        # a decode node connected, or none yet (one starting up): worth waiting for, once at most
        store.readers = lambda: bool(store.channel.connected()) or not (store.channel.attached() or store.waited_out)
        return store

    def _append(self, record: dict | bytes) -> None:
        self.channel.append(record)

    def attached(self) -> set[str]:
        return self.channel.attached()

    def finished(self) -> set[str]:
        return set(self.channel.done)

    def reading(self) -> set[str]:
        """Decode nodes still connected and not done (one whose connection ended is not waited for)."""
        return self.channel.connected() - self.finished()

    def finish(self, wait_s: float, remove: bool, say) -> dict:
        out = super().finish(wait_s, remove, say)
        unread = self.channel.unread() + self.channel.lost_requests
        if unread:
            say(f"  handoff: {unread} request(s) handed over were never loaded by a decode node (none attached, or "
                f"the one holding them left); their blocks were released")
        return out

    def _close_manifest(self, remove: bool) -> int:
        self.channel.close()
        self.blocks.close(remove)  # deregistered (and zeroed) whatever remove says: no one may read it after
        return -1


class RemoteSlots:
    """What a decode node's results say of the handoff space it reads (the tier table's row)."""

    engine, name, flags = ENGINE, "handoff", frozenset()

    def __init__(self, capacity_bytes: int, description: str):
        self.capacity_bytes, self.description = capacity_bytes, description


class NixlDecode:
    """A decode node: the side channel's lines (for the follower) and NIXL READs of the published blocks."""

    role, engine = "decode", ENGINE

    def __init__(self, url: str, identity: dict, wait_s: float, say, peer_timeout_s: float = 10.0):
        self.url, self.folder, self.peer_timeout_s = url, url, peer_timeout_s
        host, port = parse_url(url)
        self.link = Line(connect(host, port, wait_s, url, say))
        # NOTE: every read of the side channel has a deadline: a port that accepts and never speaks, or a frozen
        # prefill node (no line, not even its heartbeat), is a fault, never a hang
        self.link.sock.settimeout(peer_timeout_s)
        self.name = f"decode-{os.uname().nodename}-{os.getpid()}"
        try:
            self.link.send({"kind": "attach", "name": self.name, "identity": identity})
            header = self.link.recv()
        except (OSError, ValueError) as e:
            self.link.close()
            raise UserError(f"the peer at {url} accepted the connection but sent no handoff header within "
                            f"{peer_timeout_s:g} s ({type(e).__name__}); is it a --role prefill run of this "
                            f"benchmark? (--disagg-peer-timeout-s)") from None
        if header is None or header.get("kind") != "header":
            why = header.get("why") if header else "it closed the connection"
            self.link.close()
            raise UserError(f"the prefill node at {url} refused this decode node: {why}; start both nodes with the "
                            f"same --model, --kv-dtype, --tp, --block-tokens and --seed.")
        self.header = header
        self.blocks = RemoteSlots(header["nslots"] * header["slot_bytes"],
                                  f"the prefill node's registered memory at {url}, read with NIXL READs (UCX)")
        self.agent = make_agent(self.name, serves=False)
        self.peer = self.agent.add_remote_agent(base64.b64decode(header["metadata"]))
        self.slot_of: dict[int, int] = {}
        self.records: queue.Queue = queue.Queue()
        self.registered: dict[int, object] = {}
        self.tag = threading.local()
        self.lock = threading.Lock()
        self.attached = True
        threading.Thread(target=self._follow, name="handoff-follow", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="handoff-heartbeat", daemon=True).start()

    def _heartbeat(self) -> None:
        """This node's heartbeat: the prefill node tells a busy decode node from a frozen one (it hands a silent
        one's requests to another)."""
        while self.attached:
            time.sleep(HEARTBEAT_S)
            try:
                self.link.send(HEARTBEAT)
            except OSError:
                return

    def loaded(self, record) -> None:
        """This node loaded the request: the prefill node may release its blocks."""
        try:
            self.link.send({"kind": "ack", "rid": record.rid})
        except OSError:
            pass  # the prefill node is gone: its follower says so

    def _follow(self) -> None:
        while True:
            why = "closed its side channel"
            try:
                rec = self.link.recv()
            except TimeoutError:
                rec, why = None, (f"sent nothing, not even its heartbeat, for {self.peer_timeout_s:g} s "
                                  f"(--disagg-peer-timeout-s): it stopped or its network did")
            except (OSError, ValueError):
                rec = None
            if rec is None:
                self.records.put({"kind": "lost", "why": f"the prefill node at {self.url} {why} before the end of "
                                                         f"its manifest"})
                return
            if rec.get("kind") == "alive":  # its heartbeat: alive, nothing to hand over
                continue
            if rec.get("kind") == "request":
                for k, slot in zip(rec["keys"], rec.pop("slots", ())):
                    self.slot_of[int(k, 16)] = slot
            self.records.put(rec)
            if rec.get("kind") == "end":
                return

    def next_record(self, timeout: float) -> dict | None:
        try:
            return self.records.get(timeout=timeout)
        except queue.Empty:
            return None

    def _registered(self, arr: np.ndarray) -> None:
        base = arr
        while isinstance(base.base, np.ndarray):
            base = base.base
        with self.lock:
            if base.ctypes.data not in self.registered:
                self.registered[base.ctypes.data] = self.agent.register_memory(
                    [(base.ctypes.data, base.nbytes, 0, "")], "DRAM")

    def _read(self, local_addr: int, remote_addr: int, nbytes: int) -> None:
        """One NIXL READ, polled to its end (at most --disagg-peer-timeout-s); a failure of any kind is a RunFault."""
        try:
            state = self._transfer(local_addr, remote_addr, nbytes)
        except Exception as e:  # noqa: BLE001 - NIXL's bindings raise their own classes (nixlRemoteDisconnectError)
            state = type(e).__name__
        if state != "DONE":
            raise RunFault(f"a NIXL READ from the prefill node at {self.url} failed ({state}; "
                           f"{self.peer_timeout_s:g} s at most, --disagg-peer-timeout-s): the prefill node stopped "
                           f"or its network did.")

    def _transfer(self, local_addr: int, remote_addr: int, nbytes: int) -> str:
        local = self.agent.get_xfer_descs([(local_addr, nbytes, 0)], "DRAM")
        remote = self.agent.get_xfer_descs([(remote_addr, nbytes, 0)], "DRAM")
        handle = self.agent.initialize_xfer("READ", local, remote, self.peer)
        try:
            state, deadline = self.agent.transfer(handle), time.monotonic() + self.peer_timeout_s
            while state == "PROC" and time.monotonic() < deadline:
                time.sleep(POLL_S)  # a pause: the other threads and processes of a small node get the CPU
                state = self.agent.check_xfer_state(handle)
            return state
        finally:
            try:
                self.agent.release_xfer_handle(handle)
            except Exception:  # noqa: BLE001, S110 - a handle of a dead peer: nothing left to release
                pass

    def load(self, key: int, out) -> bool:
        """Read a published block into out; False when it is not (or no longer) in the prefill node's slots."""
        slot = self.slot_of.get(key, -1)
        if slot < 0:
            return False
        arr = np.frombuffer(out, np.uint8)
        self._registered(arr)
        self._read(arr.ctypes.data, self.header["region"] + slot * self.header["slot_bytes"], arr.nbytes)
        # every page is this block's: not replaced (one round trip, the common case); else the seqlock decides
        return stamped_with(key, arr) or self._tag(slot) == key

    def _tag(self, slot: int) -> int:
        """The slot's tag now (a READ after the block's: the seqlock's check)."""
        tag = getattr(self.tag, "buf", None)
        if tag is None:
            tag = self.tag.buf = np.zeros(1, np.uint64)
            self._registered(tag)
        self._read(tag.ctypes.data, self.header["tags"] + slot * 8, 8)
        return int(tag[0])

    def detach(self) -> None:
        self.attached = False
        try:
            self.link.send({"kind": "done"})
        except OSError:
            pass
        self.link.close()
        try:  # after a prefill node died, NIXL may refuse these too: the process ends anyway
            for reg in self.registered.values():
                self.agent.deregister_memory(reg)
            self.agent.remove_remote_agent(self.peer)
        except Exception:  # noqa: BLE001, S110
            pass
        self.registered.clear()

    def abandon(self, remove: bool) -> None:
        self.detach()
