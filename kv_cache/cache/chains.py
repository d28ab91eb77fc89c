"""The cache's index entries and their prefix structure: parents, children per tier, held and dead blocks.

A mixin of BlockCache (it reads its index, tiers and policies); every method runs with the
cache's lock held. See cache.py's docstring for the rules.
"""

from __future__ import annotations

import threading

from kv_cache import counters as C

READY, WRITING, CORRUPT, DROPPING = "ready", "writing", "corrupt", "dropping"
PLACING = "placing"  # placed in its tier's order as a serial write would be, its bytes still in flight (batch.py)
LANDING = "landing"  # placed in its new tier by a batch's demotion or promotion, its bytes not there yet (landing.py)


class Entry:
    """Index record of one block; a remote block lives in a shared tier and belongs to another process.

    digest: the checksum of the bytes written (--verify checksum), set by the writer; None if unknown.
    """

    __slots__ = ("key", "tier", "nbytes", "pins", "state", "label", "remote", "digest", "parent", "kids", "held",
                 "children")

    def __init__(self, key: int, tier: int, nbytes: int, label: str, remote: bool = False):
        self.key, self.tier, self.nbytes, self.label, self.remote = key, tier, nbytes, label, remote
        self.pins = 0
        self.state = READY if remote else WRITING
        self.digest: int | None = None
        self.parent: Entry | None = None  # the block before it in its chain (None: a chain's head)
        self.kids: list[int] | None = None  # children per tier, once it has any
        self.children: set[Entry] | None = None  # the entries whose parent it is
        self.held = False                 # its policy was told hold(): not a candidate


class PrefixStructure:

    def _blocked(self, e: Entry) -> bool:
        """e may not leave its tier: a child of it is there."""
        return bool(e.kids) and e.kids[e.tier] > 0

    def _refresh(self, e: Entry) -> None:
        """Tell e's policy whether e is a candidate, when that changed (most calls: it did not, asked first)."""
        blocked = self._blocked(e)
        if blocked == e.held or e.state not in (READY, PLACING, LANDING) or self.index.get(e.key) is not e:
            return
        policy = self.policies[e.tier]
        policy.hold(e.key) if blocked else policy.free(e.key)
        e.held = blocked

    def _child_moved(self, e: Entry, old: int | None, new: int | None) -> None:
        """e entered (old None), left (new None) or changed tier: its parent's counts follow."""
        p = e.parent
        if p is None:
            return
        if p.kids is None:
            p.kids, p.children = [0] * len(self.tiers), set()
        if old is not None:
            p.kids[old] -= 1
        if new is not None:
            p.kids[new] += 1
        if old is None:
            p.children.add(e)
        elif new is None:
            p.children.discard(e)
        self._refresh(p)

    def _placed(self, e: Entry) -> None:
        """e is READY in e.tier: its policy orders it (held if a child is there too)."""
        self.policies[e.tier].on_insert(e.key, e.label, e.nbytes)
        e.held = False
        self._refresh(e)

    def _unplaced(self, e: Entry) -> None:
        self.policies[e.tier].on_remove(e.key)
        e.held = False

    def _gone(self, e: Entry) -> None:
        """e left the index: its descendants are unreachable now, and go with it (cascade).

        NOTE: a ready descendant is dropped at once (its bytes go to _trash, deleted outside the lock), and
        so is one of this thread's batch placed ahead of its bytes (batch.py: serial mode would have written it
        already; its bytes are written, then deleted, by _empty_trash); one being read is marked CORRUPT (never
        served again, freed by its last reader); one being moved or written is dropped when that finishes (see
        _orphaned).

        The walk is a loop with a stack of its own, not a call a level: a chain of 4-token blocks is thousands
        deep, past Python's recursion limit. The order is the recursion's: each child in turn, a dropped block
        trashed after its descendants."""
        self._child_moved(e, e.tier, None)
        if not e.children:  # a leaf (most evictions): nothing to walk
            return
        walk = [(e, list(e.children)[::-1])]  # each list reversed: pop() takes the next child
        while walk:
            parent, kids = walk[-1]
            if not kids:
                walk.pop()
                if walk:  # a dropped descendant, its own descendants handled: its bytes go
                    self._trash_of_mine().append(parent)
                continue
            c = kids.pop()
            c.parent = None  # its parent is gone: c no longer counts in anyone's children
            if self.index.get(c.key) is not c or (c.state != READY and not self._flushable(c)):
                c.parent = parent  # MOVING / WRITING: _orphaned() sees the dead parent when it lands
                continue
            self.recorder.count(C.CASCADE_DROPS)
            self._unplaced(c)
            if c.pins:
                c.state = CORRUPT  # a reader holds it: never served again, dropped by its last reader
            else:
                c.state = DROPPING  # as _drop(c): its descendants go with it (c has no parent left to tell)
                walk.append((c, list(c.children or ())[::-1]))

    def _drop(self, e: Entry) -> None:
        """e leaves the cache: a miss at once (state DROPPING), its descendants go with it, and its bytes
        and slots are freed by _empty_trash outside the lock (until then the key cannot be rewritten)."""
        e.state = DROPPING
        self._gone(e)
        self._trash_of_mine().append(e)

    def _orphaned(self, e: Entry) -> bool:
        """e's parent left the cache while e was being moved or written (or is leaving: DROPPING, its cascade ran
        while e was in flight and passed it by, and the index lets it go only once its bytes are deleted; judged
        present, e stayed READY under a dead parent, no lookup reaching it, issue 48)."""
        p = e.parent
        return p is not None and (self.index.get(p.key) is not p or p.state == DROPPING)

    def _wait(self) -> None:
        """Lock held: wait for a move to finish (counted, so that _wake skips notify_all when none waits)."""
        self._waiting += 1
        try:
            self._cond.wait()
        finally:
            self._waiting -= 1

    def _wake(self) -> None:
        """Lock held: wake the readers waiting for a move, if any (nearly every commit, move and release
        calls this, and usually nobody waits)."""
        if self._waiting:
            self._cond.notify_all()

    def _trash_of_mine(self) -> list:
        """Lock held: the blocks this thread dropped and has not deleted yet."""
        return self._trash.setdefault(threading.get_ident(), [])

    def _empty_trash(self) -> None:
        """Delete the bytes of the blocks this thread dropped (outside the lock: a tier's delete may be I/O), then
        free their slots and keys.

        NOTE: each thread empties its own trash (every call that drops a block empties it after): a block of this
        thread's batch dropped ahead of its bytes is written or landed first (_flush), then deleted, by this thread.
        Emptied by whichever thread came next, it was deleted by one thread while its own thread wrote it (not
        present yet, then written): its slots were never freed, and a run with two tiers and four workers stopped
        on a full tier (issue 48)."""
        me = threading.get_ident()
        if not self._trash.get(me):  # NOTE: read without the lock: only this thread adds to its list
            return
        with self._lock:
            trash = self._trash.pop(me)
        for e in trash:
            if self.pending or self.landing or self.promoting:  # a batch's block dropped ahead of its bytes: they
                # land first (written, demoted or promoted as serial mode had), then go
                self._flush(e, e.tier)
            if not e.remote:
                self.parts.delete(self.tiers[e.tier], e.key, e.nbytes, present_only=True)
        with self._lock:
            for e in trash:
                if self.index.get(e.key) is e:
                    del self.index[e.key]
                    if not e.remote:
                        self.used[e.tier] -= self._slots(e.tier, e.nbytes)
            self._wake()

    def occupancy(self) -> dict[str, dict[str, int]]:
        """Per tier: blocks, bytes of blocks, reserved slots, and the blocks and bytes no lookup can reach
        any more (an ancestor is gone from the cache: dead)."""
        with self._lock:
            out = {n: {"blocks": 0, "bytes": 0, "slots_accounted": self.used[i], "dead_blocks": 0, "dead_bytes": 0}
                   for i, n in enumerate(self.names)}
            reachable: dict[int, bool] = {}
            for e in self.index.values():
                if e.state == DROPPING:  # leaving: its bytes are being deleted
                    continue
                row = out[self.names[e.tier]]
                row["blocks"] += 1
                row["bytes"] += e.nbytes
                if not self._reachable(e, reachable):
                    row["dead_blocks"] += 1
                    row["dead_bytes"] += e.nbytes
            return out

    def _reachable(self, e: Entry, memo: dict[int, bool]) -> bool:
        """Every ancestor of e is the cached entry of its key (iterative: chains are long)."""
        path, node, ok = [], e, True
        while node is not None:
            known = memo.get(id(node))
            if known is not None:
                ok = known
                break
            path.append(node)
            if self.index.get(node.key) is not node or node.state == CORRUPT:
                ok = False
                break
            node = node.parent
        for n in path:
            memo[id(n)] = ok
        return ok
