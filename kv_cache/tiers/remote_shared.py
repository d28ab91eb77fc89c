"""A remote tier shared by independent runs (--remote-namespace NAME): the engines of a fleet over one Valkey, as
`fleet --export-assignment` launches them, or hosts without MPI.

Every run naming the namespace writes its blocks there under the block's own key, so a block any of them wrote is
every one's to read: a lookup that misses a run's own tiers adopts it (cache.pin_prefix, the --shared-storage
semantics: an adopted block counts against no local capacity and is copied, not moved, when promoted). A block two
runs write is one object, written twice. Each run evicts only what it wrote, and its eviction deletes the object
for everyone (a reader then finds it vanished, as on a shared directory): a fleet sized so the shared tier never
evicts (what `fleet` says it needs) sees none of that.

Membership is a count on the server (INCRBY, atomic): each run adds one as it joins and takes one away at its end;
the last to end removes the namespace whole (or marks it kept with --keep-data), since the others may read any
block until then. Each member keeps a marker of its own (its pid and host): a member killed mid-run leaves it, and
`clean --remote-url` then finds the namespace and removes it.
"""

from __future__ import annotations

import json
import re

import numpy as np

from kv_cache import runlog
from kv_cache.errors import BlockVanished, RunFault, ServerDown, UserError
from kv_cache.markers import marker_body
from kv_cache.tiers.base import SHARED, one_by_one
from kv_cache.tiers.remote import NAMESPACE, RemoteTier

PREFIX = "shared-"  # kvbench-shared-<name>: never a run id's namespace (those are timestamps or --run-id)
MEMBERS = "members"
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
        super().__init__(*args, **kw)
        self.flags = self.flags | {SHARED}
        self.members_name = self.store.namespace(self.run_id) + MEMBERS
        self.members = self._call(self.store.add, self.members_name, 1)  # runs in it now, this one included

    def _member_marker(self) -> str:
        body = marker_body(self.run_id)
        return f"{self.store.namespace(self.run_id)}member-{body['host']}-{body['pid']}{self.store.name_sep}" \
               f"{self.store.marker_leaf}"

    def mark(self) -> None:
        """This member's own marker (the namespace's is the last member's, when it keeps the namespace)."""
        self.store.write_small(self._member_marker(), json.dumps(marker_body(self.run_id)).encode())

    def adopt(self, key: int) -> int | None:
        n = self._call(self.store.size_of, self.store.object_name(self.run_id, key), self.slot_bytes)
        return n or None

    def held_bytes(self, key: int, out: np.ndarray) -> int:
        return self.slots.lookup(key)[1] if key in self.slots else out.size  # another run's block: out's size

    def get(self, key: int, out: np.ndarray) -> None:
        """Another run's block that is gone (its writer evicted it) is BlockVanished: a miss now, as on a shared
        directory (the lifecycle counts it and drops the entry)."""
        try:
            super().get(key, out)
        except ServerDown:
            raise
        except RunFault:
            if key in self.slots or self._call(self.store.size_of, self.store.object_name(self.run_id, key),
                                               self.slot_bytes):
                raise
            raise BlockVanished(key) from None

    def get_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        """A batch in one round trip; one that failed on a block another run evicted goes again one by one, so
        only that block's result is its vanishing."""
        try:
            return super().get_many(items)
        except ServerDown:
            raise
        except RunFault:
            if all(key in self.slots for key, _ in items):
                raise
            return one_by_one(self.get, items)

    def close(self, remove: bool = True) -> None:
        """Leave the namespace: the last member removes it (or marks it kept); the others leave their blocks to
        those still reading."""
        try:
            left = self.store.add(self.members_name, -1)
            self.store.remove([self._member_marker()])
        except (RunFault, UserError):
            left = 0  # the server is gone: the parent's close says what stays there and how to remove it
        if left <= 0:
            super().close(remove)
            return
        runlog.tell(f"the shared namespace {NAMESPACE}{self.run_id} in {self.store.url} keeps this run's blocks for "
                    f"the {left} run(s) still in it; the last to end removes it.")
        self.store.close()

