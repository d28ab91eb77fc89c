"""A remote tier shared by independent runs (--remote-namespace NAME): the engines of a fleet over one Valkey or S3
bucket, as `fleet --export-assignment` launches them, or hosts without MPI.

Every run naming the namespace writes its blocks there under the block's own key, so a block any of them wrote is
every one's to read: a lookup that misses a run's own tiers adopts it (cache.pin_prefix, the --shared-storage
semantics: an adopted block counts against no local capacity and is copied, not moved, when promoted). A block two
runs write (both missed it before either wrote it) is one object, written twice, each run holding it as its own.
Each run evicts or promotes out only what it wrote, and that deletes the object for everyone: a reader then finds it
vanished (a miss, counted), as on a shared directory, whoever wrote it.

Membership is a marker per member in the namespace (its pid and host), and the namespace's own marker names a
member still in it (what `clean --remote-url` checks: a killed member's namespace is found and removed). At its end
a run removes its member marker, then lists the members left (one whose process is gone from this host is not
counted: a member killed mid-run): none, and it is the last, removing the namespace whole (or marking it kept with
--keep-data); else it names one of them in the namespace's marker and leaves its blocks to those still reading.
Any store that lists its names can share one (Valkey's SCAN, S3's LIST): each member removes its own marker before
it lists, so of two members ending together the later one finds none left.
"""

from __future__ import annotations

import json
import os
import re
import socket

import numpy as np

from kv_cache import runlog
from kv_cache.errors import BlockVanished, RunFault, ServerDown, UserError
from kv_cache.markers import is_alive, marker_body
from kv_cache.tiers.base import SHARED, one_by_one
from kv_cache.tiers.remote import NAMESPACE, RemoteTier

PREFIX = "shared-"  # kvbench-shared-<name>: never a run id's namespace (those are timestamps or --run-id)
MEMBER = "member-"  # <namespace>member-<host>-<pid>: a member's marker
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def check_name(name: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise UserError(f"--remote-namespace {name!r}: use 1 to 64 letters, digits, '.', '_' or '-'.")


class SharedRemoteTier(RemoteTier):
    """A remote tier in a namespace other runs share: their blocks readable (adopt), the last run out removes it."""

    @staticmethod
    def id_for(name: str) -> str:
        """The namespace's id in the store's names (remote.NAMESPACE before it)."""
        check_name(name)
        return PREFIX + name

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)  # marks this member (mark)
        self.flags = self.flags | {SHARED}

    @property
    def members(self) -> int:
        """The runs in the namespace now, this one included (a listing of the namespace: not at start-up)."""
        return len(self._members())

    def _member_name(self) -> str:
        return f"{self.store.namespace(self.run_id)}{MEMBER}{socket.gethostname()}-{os.getpid()}"

    def _members(self) -> list[str]:
        start = self.store.namespace(self.run_id) + MEMBER
        return [n for n in self.store.names(self.run_id) if n.startswith(start)]

    def _live_members(self) -> list[bytes]:
        """The marker bodies of the members still in the namespace; one whose process is gone from this host (a
        member killed mid-run) is no longer counted, so the last live member still removes the namespace."""
        out = []
        for name in self._members():
            body = self.store.read_small(name)
            try:
                alive = is_alive(json.loads(body)) if body else False
            except (ValueError, AttributeError):
                alive = None  # not ours to judge: counted, as one on another host
            if alive is not False:
                out.append(body)
        return out

    def mark(self) -> None:
        """This member's marker, and the namespace's naming it (a member alive)."""
        body = json.dumps(marker_body(self.run_id)).encode()
        self.store.write_small(self._member_name(), body)
        self.store.write_small(self.store.marker_name(self.run_id), body)

    def _size(self, key: int) -> int:
        """The bytes of key's object as the store holds it now (0: none)."""
        return self._call(self.store.size_of, self.store.object_name(self.run_id, key), self.slot_bytes)

    def adopt(self, key: int) -> int | None:
        return self._size(key) or None

    def held_bytes(self, key: int, out: np.ndarray) -> int:
        return self.slots.lookup(key)[1] if key in self.slots else out.size  # another run's block: out's size

    def _vanished(self, key: int, r):
        """r, or BlockVanished where r is a fault reading a block that is gone: another run evicted it, or promoted
        it out (one it wrote, or one both wrote before either saw the other's: one object, written twice, each run
        holding it as its own). A miss now, as on a shared directory (the lifecycle counts it and drops the entry,
        its slots with it: BlockCache.forget_vanished)."""
        if isinstance(r, RunFault) and not isinstance(r, ServerDown) and not self._size(key):
            return BlockVanished(key)
        return r

    def get(self, key: int, out: np.ndarray) -> None:
        try:
            super().get(key, out)
        except RunFault as e:
            raise self._vanished(key, e) from None

    def get_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        """A batch at once; a Valkey pipeline that failed on a block another run evicted goes again one by one, so
        only that block's result is its vanishing."""
        try:
            got = super().get_many(items)
        except ServerDown:
            raise
        except RunFault:
            return one_by_one(self.get, items)
        return [self._vanished(key, r) for (key, _), r in zip(items, got)]

    def close(self, remove: bool = True) -> None:
        """Leave the namespace: the last member removes it (or marks it kept); the others leave their blocks to
        those still reading, the namespace's marker naming one of them."""
        try:
            self.store.remove([self._member_name()])
            others = self._live_members()
            if others:
                self.store.write_small(self.store.marker_name(self.run_id), others[0])
        except (RunFault, UserError):
            others = []  # the server is gone: the parent's close says what stays there and how to remove it
        if not others:
            super().close(remove)
            return
        runlog.tell(f"the shared namespace {NAMESPACE}{self.run_id} in {self.store.url} keeps this run's blocks for "
                    f"the {len(others)} run(s) still in it; the last to end removes it.")
        self.store.close()
