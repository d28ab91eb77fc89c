"""file://DIR (--handoff-dir DIR): disaggregated nodes sharing a folder.

    <handoff-dir>/kvbench-handoff/
        manifest.jsonl     header line, then one line per handed-over request, then an end line
        blocks/<key>.kv    published KV blocks (written under a private name, then renamed)
        decode-*.reading   a decode node attached; decode-*.ready: its clock runs; decode-*.done: it finished
        decode-*.acks      the requests it loaded, one rid per line (its acknowledgements)

The prefill node computes a request's KV (its own tiers serve its prefix cache as usual), publishes every
prompt block not already published (timed: op ``write`` on tier ``handoff``) and then appends the request's
manifest line with one ``write`` on an O_APPEND descriptor: a reader sees whole lines or nothing. The decode node
follows the manifest (sources/decode_arrivals.py), reads the listed blocks (timed: op ``read`` on tier ``handoff``; each
verified against the digest the line carries), appends the request's rid to its acks file, then appends its
decode blocks to its own tiers. The request's blocks are held (space.py) until the first acknowledgement of it:
a full space makes the prefill node wait, never removes a block a decode node has not read, unless no decode
node is attached, or none acknowledged within --disagg-wait-s. Every decode node follows the whole manifest: a
second one finds the blocks the first already acknowledged only while their room is not needed.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time

from kv_cache import runlog
from kv_cache.errors import BlockVanished, RunFault, UserError
from kv_cache.lifecycle.handoff import PeerSpace, Transport
from kv_cache.lifecycle.handoff.space import HandoffSpace, OnSpace
from kv_cache.safefiles import create_marker
from kv_cache.types import Handoff

TRANSPORT = Transport("file", "file://", "file://DIR (a folder both nodes share)")
FOLDER = "kvbench-handoff"
MANIFEST = "manifest.jsonl"
ACK_POLL_S = 0.01
ACKS_READ = 1 << 20  # the most of one acks file read a poll: a request id a line, thousands of them


def append_line(fd: int, record: dict | bytes, path: str) -> None:
    line = record if isinstance(record, bytes) else (json.dumps(record) + "\n").encode()
    if os.write(fd, line) != len(line):  # one write per line: readers see whole lines
        raise RunFault(f"short write to {path} (disk full?).")


def _markers(folder: str, suffix: str) -> set[str]:
    try:
        return {n.rsplit(".", 1)[0] for n in os.listdir(folder) if n.endswith(suffix)}
    except FileNotFoundError:
        return set()


class FolderPublisher(OnSpace):
    """A prefill node publishing block files into the folder and announcing them in its manifest."""

    role = "prefill"

    def __init__(self, root: str, open_blocks, engine: str, capacity_bytes: int, identity: dict):
        """open_blocks(directory, capacity_bytes, writer): the shared file tier that holds the blocks (the
        composition root chooses it; this side knows only the tier interface)."""
        self.where = folder = os.path.join(root, FOLDER)
        try:  # the folder itself must be new: one left by another node is never adopted (nor removed)
            os.mkdir(folder)
            os.mkdir(os.path.join(folder, "blocks"))
        except FileExistsError:
            raise UserError(f"{folder} already exists (an earlier prefill node did not finish, or another is "
                            f"running); remove it or pass another --handoff-dir.") from None
        except OSError as e:
            raise UserError(f"cannot create {folder}: {e.strerror}.") from None
        self.manifest = os.path.join(folder, MANIFEST)
        self.blocks = open_blocks(os.path.join(folder, "blocks"), capacity_bytes, f"p{os.getpid()}")
        self.engine = self.blocks.engine
        self.space = HandoffSpace(self.blocks, keep_released=True)
        # a decode node reading, or none yet (one starting up): worth waiting for, once at most
        self.space.readers = lambda: bool(self.reading()) or not (self.attached() or self.space.waited_out)
        self._handed: dict[str, tuple[int, ...]] = {}  # rid -> keys, until its first acknowledgement
        self._acks_read: dict[str, int] = {}  # acks file -> bytes read
        self._refused: set[str] = set()  # acks files that are not regular files (links, FIFOs, devices)
        self._fd = os.open(self.manifest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND, 0o644)
        append_line(self._fd, {"kind": "header", **identity, "engine": engine, "started_wall": time.time()},
                    self.manifest)
        self._open = True
        threading.Thread(target=self._follow_acks, name="handoff-acks", daemon=True).start()

    def hand_over(self, record: Handoff) -> None:
        self._handed[record.rid] = record.keys
        self.space.announce(record.keys, lambda: append_line(self._fd, record.to_line(), self.manifest))

    def _follow_acks(self) -> None:
        """Every decode node's acks file, tailed: a request's first acknowledgement releases its blocks."""
        while self._open:
            for name in _markers(self.where, ".acks"):
                for rid in self._new_acks(os.path.join(self.where, name + ".acks")):
                    keys = self._handed.pop(rid, None)
                    if keys is not None:
                        self.space.release(keys)
            time.sleep(ACK_POLL_S)

    def _new_acks(self, path: str) -> list[str]:
        """The request ids a decode node appended to its acks file since the last poll: at most ACKS_READ bytes
        a poll, from a regular file only (never through a link: a link to /dev/zero took a node to 7 GiB, a FIFO
        would hang it); a file that is not one is said once and never read."""
        if path in self._refused:
            return []
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        except OSError as e:
            return self._refuse(path, e.strerror or str(e))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return self._refuse(path, "not a regular file")
            data = os.pread(fd, ACKS_READ, self._acks_read.get(path, 0))
        finally:
            os.close(fd)
        whole = data[:data.rfind(b"\n") + 1]  # a line still being written is read next time
        if not whole and len(data) == ACKS_READ:  # no line in a whole read: not a decode node's acks
            return self._refuse(path, f"no line in {ACKS_READ:,} bytes")
        self._acks_read[path] = self._acks_read.get(path, 0) + len(whole)
        return whole.decode(errors="replace").split()

    def _refuse(self, path: str, why: str) -> list[str]:
        self._refused.add(path)
        runlog.tell(f"warning: {path} is not a decode node's acknowledgements ({why}, planted?); it is not read, "
                    f"and the requests it would acknowledge keep their blocks until the run's end.")
        return []

    def attached(self) -> set[str]:
        return _markers(self.where, ".reading")

    def reading(self) -> set[str]:
        """Decode nodes that are still reading: waited for at the end (the folder cannot tell a dead one)."""
        return self.attached() - _markers(self.where, ".done")

    def ready_nodes(self) -> set[str]:
        return _markers(self.where, ".ready") & self.reading()

    def finish(self, wait_s: float, remove: bool, say) -> dict:
        """End line, then wait (at most wait_s) for attached decode nodes to finish; remove the folder."""
        self.space.announce((), lambda: append_line(self._fd, {"kind": "end", "done_wall": time.time()},
                                                    self.manifest))
        deadline = time.monotonic() + wait_s
        while self.reading() and time.monotonic() < deadline:
            time.sleep(0.05)
        attached, waiting = self.attached(), sorted(self.reading())
        if waiting:
            say(f"  handoff: decode node(s) {', '.join(waiting)} still reading after {wait_s:g} s; removing anyway")
        time.sleep(2 * ACK_POLL_S)  # the acks written just before a node's done
        self._open = False
        unread = len(self._handed)
        if unread:
            say(f"  handoff: {unread} request(s) handed over were never acknowledged by a decode node (none "
                f"attached, or it left or came late); their blocks were released")
        os.close(self._fd)
        if remove:
            self.blocks.close(remove=True)
            for name in os.listdir(self.where):
                os.unlink(os.path.join(self.where, name))
            os.rmdir(self.where)
        return {"published_blocks": self.space.published, "decode_nodes": sorted(attached),
                "decode_nodes_unfinished": waiting, "requests_unacknowledged": unread}

    def abandon(self, remove: bool) -> None:
        """The run failed: end the manifest (decode nodes stop) and remove the folder (remove)."""
        if self._open:
            self.finish(0.0, remove, lambda *_: None)


def mark_reading(folder: str) -> str:
    """Say in the folder that this decode node reads it (the prefill node waits for it at its end)."""
    marker = f"decode-{os.uname().nodename}-{os.getpid()}"
    path = os.path.join(folder, marker + ".reading")
    try:
        create_marker(path)
    except FileExistsError:
        raise UserError(f"{path} exists (a file or link planted at this decode node's marker); nothing is "
                        f"written through it: remove it.") from None
    except FileNotFoundError:  # the prefill node ended between its manifest being found and now
        raise UserError(f"the prefill node finished and removed {folder} before this decode node could attach "
                        f"(it waits only for decode nodes already reading); start the decode node before the "
                        f"prefill node ends.") from None
    return marker


class FolderLoader:
    """A decode node reading the folder's block files and acknowledging each request it loaded."""

    role = "decode"

    def __init__(self, root: str, open_blocks):
        self.where = os.path.join(root, FOLDER)
        self.files = open_blocks(os.path.join(self.where, "blocks"), 0, f"d{os.getpid()}")  # read, never filled
        self.engine = self.files.engine
        # the results' row: the space is the prefill node's (its own tier here would read "0.03 GiB, 1 slots")
        self.blocks = PeerSpace(self.engine, 0, f"the prefill node's block files in {self.where}/blocks, read here "
                                                f"({self.engine}, a file per block)")
        self.marker = mark_reading(self.where)
        self._acks = -1
        self._lock = threading.Lock()

    def load_many(self, items: list[tuple[int, object]]) -> list[bool]:
        """Read published blocks into their buffers (the shared files' batch path); per block False when it is
        gone (removed for space, or the prefill ended)."""
        got = []
        for d in self.files.get_many(items):
            if isinstance(d, BaseException) and not isinstance(d, (BlockVanished, RunFault)):
                raise d
            got.append(not isinstance(d, BaseException))
        return got

    def loaded(self, record: Handoff) -> None:
        """This node loaded the request: its rid in the acks file, and the prefill node may let its blocks go."""
        path = os.path.join(self.where, self.marker + ".acks")
        try:
            with self._lock:
                if self._acks < 0:  # this node's own, new file: never one found there, never through a link
                    self._acks = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND,
                                         0o644)
                append_line(self._acks, f"{record.rid}\n".encode(), path)
        except FileNotFoundError:
            pass  # the prefill node already removed the folder: nothing is waiting for this word
        except OSError as e:
            raise RunFault(f"cannot write this decode node's acknowledgements to {path} ({e.strerror}): a file or "
                           f"link of that name was already there.") from None

    def ready(self) -> None:
        """This node's tiers are built and its clock starts: the prefill node, waiting for one, starts its own."""
        self._mark(".ready")

    def _mark(self, suffix: str) -> None:
        path = os.path.join(self.where, self.marker + suffix)
        try:
            create_marker(path)
        except FileExistsError:  # planted: never written through (it truncated what a link pointed at)
            runlog.tell(f"warning: {path} exists (a file or link planted at this decode node's marker); nothing "
                        f"was written through it.")
        except OSError:
            pass  # the prefill node already removed the folder

    def detach(self) -> None:
        with self._lock:
            if self._acks >= 0:
                os.close(self._acks)
                self._acks = -1
        self._mark(".done")
