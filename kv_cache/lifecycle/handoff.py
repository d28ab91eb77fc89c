"""Disaggregated prefill / decode nodes: the handoff directory they share.

    <handoff-dir>/kvbench-handoff/
        manifest.jsonl     header line, then one line per handed-over request, then an end line
        blocks/<key>.kv    published KV blocks (written under a private name, then renamed)
        decode-*.reading   a decode node attached; decode-*.done: it finished

The prefill node computes a request's KV (its own tiers serve its prefix
cache as usual), publishes every prompt block not already published (timed:
op ``write`` on tier ``handoff``) and then appends the request's manifest
line with one ``write`` on an O_APPEND descriptor: a reader sees whole lines
or nothing (it ignores a line without its newline). The decode node follows
the manifest, reads the listed blocks (timed: op ``read`` on tier
``handoff``; stamps verified: both nodes build payloads from the same seed),
records prefill-complete -> decode-loaded, then appends its decode blocks to
its own tiers. Published blocks beyond the handoff space are removed oldest
first; a decode node that comes too late counts them missing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from time import monotonic_ns as now_ns

from kv_cache.errors import BlockVanished, RunFault, UserError
from kv_cache.lifecycle.payload import block_digest
from kv_cache.types import Handoff

FOLDER = "kvbench-handoff"
MANIFEST = "manifest.jsonl"
IDENTITY = ("model", "kv_dtype", "tp", "block_tokens", "seed")  # what both nodes must agree on


class HandoffStore:
    """The shared folder as a prefill node writes it or a decode node reads it."""

    def __init__(self, root: str, role: str, open_blocks, capacity_bytes: int, identity: dict, writer: str):
        """open_blocks(directory, capacity_bytes, writer): the shared file tier that holds the blocks (the
        composition root chooses it; this stage knows only the tier interface)."""
        self.folder = os.path.join(root, FOLDER)
        self.role, self.identity = role, identity
        self.manifest = os.path.join(self.folder, MANIFEST)
        self.blocks = open_blocks(os.path.join(self.folder, "blocks"), capacity_bytes, writer)
        self._published: OrderedDict[int, int] = OrderedDict()  # key -> bytes, oldest first
        self._digests: dict[int, int] = {}  # key -> XXH3-64 of the bytes published, while published
        self._writing: dict[int, threading.Event] = {}
        self._used = 0
        self._lock = threading.Lock()
        # acks (the NIXL handoff): a block is held by each request handed over with it until the decode node that
        # loaded the request acknowledges it; a held block is never replaced (no reader meets another's bytes)
        self.acks = False
        self._holds: dict[int, int] = {}  # key -> requests handed over with it, not yet acknowledged
        self._pins: dict[int, int] = {}   # key -> requests being published with it (not handed over yet)
        self._space = threading.Condition(self._lock)
        self.wait_s = 60.0  # the most a publisher waits for room before it drops the oldest unread blocks
        self.readers = lambda: True  # whether a decode node is (or may soon be) there to acknowledge
        self.stopping = lambda: False  # the run's drain ran out: no more waiting
        self.waited_out = False  # a wait ran to its deadline (with no decode node yet: none is coming)
        self._fd = -1
        self.marker = ""

    # ------------------------------------------------------------------ prefill side

    @classmethod
    def create(cls, root: str, open_blocks, engine: str, capacity_bytes: int, identity: dict):
        folder = os.path.join(root, FOLDER)
        try:  # the folder itself must be new: one left by another node is never adopted (nor removed)
            os.mkdir(folder)
            os.mkdir(os.path.join(folder, "blocks"))
        except FileExistsError:
            raise UserError(f"{folder} already exists (an earlier prefill node did not finish, or another is "
                            f"running); remove it or pass another --handoff-dir.") from None
        except OSError as e:
            raise UserError(f"cannot create {folder}: {e.strerror}.") from None
        store = cls(root, "prefill", open_blocks, capacity_bytes, identity, f"p{os.getpid()}")
        store._fd = os.open(store.manifest, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        store._append({"kind": "header", **identity, "engine": engine, "started_wall": time.time()})
        return store

    def _append(self, record: dict | bytes) -> None:
        line = record if isinstance(record, bytes) else (json.dumps(record) + "\n").encode()
        if os.write(self._fd, line) != len(line):  # one write per line: readers see whole lines
            raise RunFault(f"short write to {self.manifest} (disk full?).")

    def publish(self, keys, nbytes, fill, buf, recorder) -> int:
        """Publish the blocks of keys not yet published (fill(key, view) makes their bytes); storage ns."""
        spent = 0
        for key, size in zip(keys, nbytes):
            mine, waiting = self._claim(key, size, recorder)
            if waiting is not None:
                waiting.wait()
            if not mine:
                continue
            data = buf[:size]
            fill(key, data)
            # NOTE: the decode node compares with this (one hash of the block it just read, hot in its cache)
            # instead of regenerating the payload: a 2 MiB block checked in 0.06 ms, not 0.28
            self._digests[key] = block_digest(data)
            start = now_ns()
            try:
                self.blocks.put(key, data)
            finally:
                with self._lock:
                    self._writing.pop(key).set()
            spent += now_ns() - start
            recorder.op("handoff", "write", "prefill", start, now_ns() - start, size, key)
        return spent

    def _claim(self, key: int, size: int, recorder=None) -> tuple[bool, threading.Event | None]:
        """(write it myself, event to wait for when another worker is writing it). With acks the request being
        published holds the block, and a full space makes the publisher wait (timed) for a decode node's ack."""
        size = self.blocks.slots_for(size) * self.blocks.slot_bytes  # the space is counted in slots
        with self._lock:
            if self.acks:
                self._pins[key] = self._pins.get(key, 0) + 1
            if key in self._writing:
                return False, self._writing[key]
            if key in self._published:
                self._published.move_to_end(key)  # still referenced: not the oldest any more
                return False, None
            self._make_room(size, recorder)
            self._published[key] = size
            self._used += size
            self._writing[key] = threading.Event()
            return True, None

    def _make_room(self, size: int, recorder) -> None:
        """Lock held: free room for size bytes. Without acks: the oldest blocks go (a late reader finds them
        missing). With acks: only blocks no request holds go; else wait for an ack (backpressure, timed as the
        handoff's "wait"), at most wait_s and while a decode node is attached, then the oldest held blocks go,
        counted as dropped unread."""
        start = now_ns()
        deadline = time.monotonic() + self.wait_s
        while True:
            for old in list(self._published):  # oldest first; never one a worker is writing now
                if self._used + size <= self.blocks.capacity_bytes:
                    break
                if old not in self._writing and not self._holds.get(old) and not self._pins.get(old):
                    self._drop(old)
            if self._used + size <= self.blocks.capacity_bytes or not self.acks:
                break
            left = deadline - time.monotonic()
            # waiting helps only while a decode node is (or may yet be) there and a block waits for its acknowledgement
            if left <= 0 or not self.readers() or not any(self._holds.values()) or self.stopping():
                self.waited_out = self.waited_out or left <= 0
                for old in [k for k in self._published if k not in self._writing]:
                    if self._used + size <= self.blocks.capacity_bytes:
                        break
                    self._holds.pop(old, None)
                    self._drop(old)
                    if recorder is not None:
                        recorder.count("handoff.dropped_unread")
                break
            self._space.wait(min(left, 0.5))
        if self.acks and recorder is not None and now_ns() - start > 1_000_000:  # waited (not a lock's hiccup)
            recorder.op("handoff", "wait", "prefill", start, now_ns() - start, size, 0)

    def _drop(self, key: int) -> None:
        self._used -= self._published.pop(key)
        self._digests.pop(key, None)
        self.blocks.delete(key)

    def release(self, keys) -> None:
        """A decode node loaded the request these keys were handed over with: its holds go, and a block no
        request holds leaves the space (a waiting publisher is woken)."""
        with self._lock:
            for key in keys:
                left = self._holds.get(key, 0) - 1
                if left > 0:
                    self._holds[key] = left
                    continue
                self._holds.pop(key, None)
                if key in self._published and key not in self._writing and not self._pins.get(key):
                    self._drop(key)
            self._space.notify_all()

    def digests(self, keys) -> tuple[int, ...]:
        """The published blocks' digests (0: one not published any more)."""
        with self._lock:
            return tuple(self._digests.get(k, 0) for k in keys)

    def hand_over(self, record: Handoff) -> None:
        with self._lock:
            for key in record.keys if self.acks else ():  # published for this request: held until it is loaded
                pins = self._pins.get(key, 0) - 1
                if pins > 0:
                    self._pins[key] = pins
                else:
                    self._pins.pop(key, None)
                self._holds[key] = self._holds.get(key, 0) + 1
            self._append(record.to_line())

    def finish(self, wait_s: float, remove: bool, say) -> dict:
        """End line, then wait (at most wait_s) for attached decode nodes to finish; remove the folder."""
        with self._lock:
            self._append({"kind": "end", "done_wall": time.time()})
        deadline = time.monotonic() + wait_s
        while self.reading() and time.monotonic() < deadline:
            time.sleep(0.05)
        attached = self.attached()
        waiting = sorted(attached - self.finished())
        lost = sorted(set(waiting) - self.reading())
        if set(waiting) - set(lost):
            say(f"  handoff: decode node(s) {', '.join(sorted(set(waiting) - set(lost)))} still reading after "
                f"{wait_s:g} s; removing anyway")
        if lost:
            say(f"  handoff: decode node(s) {', '.join(lost)} left before the end (their connection ended)")
        self._fd = self._close_manifest(remove)
        return {"published_blocks": len(self._published), "decode_nodes": sorted(attached),
                "decode_nodes_unfinished": waiting}

    def _close_manifest(self, remove: bool) -> int:
        """End of the prefill side: close the manifest, and remove the folder (remove); the fd's new value."""
        os.close(self._fd)
        if remove:
            self.blocks.close(remove=True)
            for name in os.listdir(self.folder):
                os.unlink(os.path.join(self.folder, name))
            os.rmdir(self.folder)
        return -1

    @property
    def engine(self) -> str:
        return self.blocks.engine

    def abandon(self, remove: bool) -> None:
        """The run failed: end the manifest (decode nodes stop) and remove the folder, or detach."""
        if self.role == "prefill" and self._fd >= 0:
            self.finish(0.0, remove, lambda *_: None)
        else:
            self.detach()

    def attached(self) -> set[str]:
        return {n.rsplit(".", 1)[0] for n in os.listdir(self.folder) if n.endswith(".reading")}

    def finished(self) -> set[str]:
        return {n.rsplit(".", 1)[0] for n in os.listdir(self.folder) if n.endswith(".done")}

    def reading(self) -> set[str]:
        """Decode nodes that are still reading: waited for at the end (the folder cannot tell a dead one)."""
        return self.attached() - self.finished()

    # ------------------------------------------------------------------ decode side

    @staticmethod
    def mark_reading(folder: str) -> str:
        """Say in the folder that this decode node reads it (the prefill node waits for it at its end)."""
        marker = f"decode-{os.uname().nodename}-{os.getpid()}"
        try:
            open(os.path.join(folder, marker + ".reading"), "w").close()
        except FileNotFoundError:  # the prefill node ended between its manifest being found and now
            raise UserError(f"the prefill node finished and removed {folder} before this decode node could attach "
                            f"(it waits only for decode nodes already reading); start the decode node before the "
                            f"prefill node ends.") from None
        return marker

    @classmethod
    def attach(cls, root: str, open_blocks, identity: dict):
        """Join a folder a prefill node made (its header already read and checked)."""
        store = cls(root, "decode", open_blocks, 0, identity, f"d{os.getpid()}")
        store.marker = cls.mark_reading(store.folder)
        return store

    def loaded(self, record: Handoff) -> None:
        """A decode node's word that it loaded a request (the folder's blocks are not held: nothing to say)."""

    def load(self, key: int, out) -> bool:
        """Read a published block into out; False when it is gone (removed for space, or the prefill ended)."""
        try:
            self.blocks.get(key, out)
            return True
        except (BlockVanished, RunFault):
            return False

    def detach(self) -> None:
        if self.marker:
            try:
                open(os.path.join(self.folder, self.marker + ".done"), "w").close()
            except OSError:
                pass  # the prefill node already removed the folder


def check_header(header: dict, identity: dict, where: str) -> None:
    for k in IDENTITY:
        if header.get(k) != identity[k]:
            raise UserError(f"{where} was written for {k} {header.get(k)!r} but this decode node runs "
                            f"{identity[k]!r}; start both nodes with the same --model, --kv-dtype, --tp, "
                            f"--block-tokens and --seed.")
