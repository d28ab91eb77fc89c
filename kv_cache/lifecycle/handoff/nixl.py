"""Disaggregated prefill / decode over NIXL (--handoff nixl://HOST:PORT): the decode node pulls the blocks from
the prefill node's registered memory with NIXL READ transfers (UCX: RDMA where there is, TCP where not).

    prefill node                                        decode node
    region: slots of registered host memory  <-- READ --  its workers' buffers (registered on first use)
    tags:   one u64 per slot: the key it holds <-- READ --  checked after each block (below)
    side channel: TCP on HOST:PORT, bound to that address only, newline-delimited JSON:
        decode -> attach {identity}         prefill -> header {agent metadata, region, tags, slot size}
                                             prefill -> every manifest line so far and then as they come,
                                                        each request with the slot of each of its blocks
        decode -> ready (its clock runs: requests go only to such nodes)
        decode -> done                       prefill -> end

A request's blocks are held in their slots until the decode node it was assigned to acknowledges it (space.py):
no slot is reused under a reader, so a block read is the block published. Every 4 KiB page of a block still starts
with its key's stamp (payload.py) and the decode node checks them and the block's digest: a block that is not
what was published fails the verification, never passes as read. A slot's tag (one u64 per slot, 0 while its
bytes are being copied in) is read only when a stamp differs: the tag then says whether the slot was reused (after
a timeout dropped the block: counted missing) or its bytes are wrong (counted as a failure).

The region lives in host memory, or in GPU memory (--disagg-handoff-memory gpu, NIXL VRAM) when the run has a
real GPU tier: DeviceSlots behind the same interface, copying each block in from the worker's host buffer.
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

from kv_cache.errors import RunFault, UserError
from kv_cache.lifecycle.handoff import PeerSpace, Transport
from kv_cache.lifecycle.handoff.agent import ENGINE, POLL_S, SCHEME, make_agent, parse_url
from kv_cache.lifecycle.handoff.channel import HEARTBEAT, HEARTBEAT_S, Line, PrefillChannel, connect
from kv_cache.lifecycle.handoff.regions import DeviceSlots, RegisteredSlots
from kv_cache.lifecycle.handoff.space import HandoffSpace, OnSpace
from kv_cache.lifecycle.payload import stamped_with
from kv_cache.types import Handoff

TRANSPORT = Transport("nixl", SCHEME, f"{SCHEME}HOST:PORT (the prefill node's address and a free port)")


class NixlPublisher(OnSpace):
    """A prefill node publishing into registered memory and announcing over the side channel."""

    role, engine = "prefill", ENGINE

    def __init__(self, url: str, slots, identity: dict, agent):
        """slots: RegisteredSlots or DeviceSlots, registered with agent (closed here if the channel fails)."""
        host, port = parse_url(url)
        self.where, self.blocks = url, slots
        try:
            header = {**identity, "started_wall": time.time()}
            self.channel = PrefillChannel(host, port, identity, slots, agent.get_agent_metadata(), header)
        except BaseException:
            slots.close()
            raise
        self.space = HandoffSpace(slots, keep_released=False)  # a slot acknowledged is free for the next block
        self.channel.on_ack = self.space.release
        # a decode node connected, or none yet (one starting up): worth waiting for, once at most
        self.space.readers = lambda: bool(self.channel.connected()) or not (self.channel.attached()
                                                                             or self.space.waited_out)
        self._open = True

    @classmethod
    def create(cls, url: str, slot_bytes: int, capacity_bytes: int, identity: dict, device=None) -> NixlPublisher:
        """device: (backend, gpu) for a region in GPU memory, or None for host memory."""
        agent = make_agent(f"kvbench-prefill-{os.uname().nodename}-{os.getpid()}", serves=True)
        slots = (RegisteredSlots(agent, capacity_bytes, slot_bytes) if device is None
                 else DeviceSlots(agent, capacity_bytes, slot_bytes, *device))
        return cls(url, slots, identity, agent)

    def hand_over(self, record: Handoff) -> None:
        self.space.announce(record.keys, lambda: self.channel.append(record.to_line()))

    def reading(self) -> set[str]:
        """Decode nodes still connected and not done (one whose connection ended is not waited for)."""
        return self.channel.connected() - set(self.channel.done)

    def attached(self) -> set[str]:
        return self.channel.attached()

    def ready_nodes(self) -> set[str]:
        return self.channel.ready_nodes()

    def finish(self, wait_s: float, remove: bool, say) -> dict:
        """End line, then wait (at most wait_s) for connected decode nodes to finish; deregister the region."""
        self.space.announce((), lambda: self.channel.append({"kind": "end", "done_wall": time.time()}))
        deadline = time.monotonic() + wait_s
        while self.reading() and time.monotonic() < deadline:
            time.sleep(0.05)
        attached, waiting = self.channel.attached(), sorted(self.channel.attached() - set(self.channel.done))
        still = sorted(self.reading())
        lost = sorted(set(waiting) - set(still))
        if still:
            say(f"  handoff: decode node(s) {', '.join(still)} still reading after {wait_s:g} s; removing anyway")
        if lost:
            say(f"  handoff: decode node(s) {', '.join(lost)} left before the end (their connection ended)")
        unread = self.channel.unread() + self.channel.lost_requests
        if unread:
            say(f"  handoff: {unread} request(s) handed over were never loaded by a decode node (none attached, or "
                f"the one holding them left); their blocks were released")
        self._open = False
        self.channel.close()
        self.blocks.close(remove)  # deregistered (and zeroed) whatever remove says: no one may read it after
        return {"published_blocks": self.space.published, "decode_nodes": sorted(attached),
                "decode_nodes_unfinished": waiting, "requests_unacknowledged": unread}

    def abandon(self, remove: bool) -> None:
        """The run failed: end the manifest (decode nodes stop), release the region (whatever remove says)."""
        if self._open:
            self.finish(0.0, remove, lambda *_: None)


class NixlLoader:
    """A decode node: the side channel's lines (for the follower) and NIXL READs of the published blocks."""

    role, engine = "decode", ENGINE

    def __init__(self, url: str, identity: dict, wait_s: float, say, peer_timeout_s: float = 10.0):
        self.url, self.where, self.peer_timeout_s = url, url, peer_timeout_s
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
        try:  # a header of the wrong shape, bad base64 or a foreign metadata blob: one sentence naming the peer
            self.blocks = PeerSpace(ENGINE, int(header["nslots"]) * int(header["slot_bytes"]),
                                      f"the prefill node's registered memory at {url}, read with NIXL READs (UCX)")
            metadata = base64.b64decode(header["metadata"], validate=True)
        except (KeyError, TypeError, ValueError) as e:
            self.link.close()
            raise UserError(f"the peer at {url} sent a handoff header this benchmark cannot use ({type(e).__name__}: "
                            f"{e}); is it a --role prefill run of this version?") from None
        self.agent = make_agent(self.name, serves=False)
        try:
            self.peer = self.agent.add_remote_agent(metadata)
        except Exception as e:  # noqa: BLE001 - NIXL's own error classes for a blob that is no agent's metadata
            self.link.close()
            raise UserError(f"the peer at {url} sent NIXL metadata its agent refused ({type(e).__name__}); is it a "
                            f"--role prefill run of this version?") from None
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

    def ready(self) -> None:
        """This node's tiers are built and its clock starts: the prefill node, waiting for one, starts its own."""
        try:
            self.link.send({"kind": "ready"})
        except OSError:
            pass  # the prefill node is gone: its follower says so

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

    def _read(self, descs: list[tuple[int, int, int]], remote_mem=("DRAM", 0)) -> None:
        """One NIXL READ of a descriptor list ((local address, remote address, bytes) each), polled to its end (at
        most --disagg-peer-timeout-s); a failure of any kind is a RunFault."""
        try:
            state = self._transfer(descs, remote_mem)
        except Exception as e:  # noqa: BLE001 - NIXL's bindings raise their own classes (nixlRemoteDisconnectError)
            state = type(e).__name__
        if state != "DONE":
            raise RunFault(f"a NIXL READ from the prefill node at {self.url} failed ({state}; "
                           f"{self.peer_timeout_s:g} s at most, --disagg-peer-timeout-s): the prefill node stopped "
                           f"or its network did.")

    def _transfer(self, descs: list[tuple[int, int, int]], remote_mem: tuple[str, int]) -> str:
        local = self.agent.get_xfer_descs([(a, n, 0) for a, _, n in descs], "DRAM")
        remote = self.agent.get_xfer_descs([(r, n, remote_mem[1]) for _, r, n in descs], remote_mem[0])
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
        """Read one published block into out; False when it is not (or no longer) in the prefill node's slots."""
        return self.load_many([(key, out)])[0]

    def load_many(self, items: list[tuple[int, object]]) -> list[bool]:
        """Read published blocks into their buffers with one READ of their descriptor list (NIXL's unit of
        transfer: a decode engine pulls a request's KV so); per block False when it is not (or no longer) in the
        prefill node's slots."""
        found = []
        for n, (key, out) in enumerate(items):
            slot = self.slot_of.get(key, -1)
            if slot >= 0:
                found.append((n, key, slot, np.frombuffer(out, np.uint8)))
                self._registered(found[-1][3])
        got = [False] * len(items)
        if not found:
            return got
        base, sb = self.header["region"], self.header["slot_bytes"]
        self._read([(arr.ctypes.data, base + slot * sb, arr.nbytes) for _, _, slot, arr in found],
                   (self.header.get("region_mem", "DRAM"), self.header.get("region_dev", 0)))
        for n, key, slot, arr in found:
            # every page is this block's: not replaced (the common case); else the seqlock decides
            got[n] = stamped_with(key, arr) or self._tag(slot) == key
        return got

    def _tag(self, slot: int) -> int:
        """The slot's tag now (a READ after the block's: the seqlock's check)."""
        tag = getattr(self.tag, "buf", None)
        if tag is None:
            tag = self.tag.buf = np.zeros(1, np.uint64)
            self._registered(tag)
        self._read([(tag.ctypes.data, self.header["tags"] + slot * 8, 8)])
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

