"""The multi-tier block cache: where blocks live, and the waterfall between tiers.

Vocabulary: tiers are ordered fastest first (e.g. gpu, cpu, nvme). A new block goes to the top tier; when that
tier is full its policy picks *victims* that are *demoted* to the next tier (waterfall), and the bottom tier
*evicts* for good. A hit read from a lower tier is *promoted* back to the top tier unless promotion is off. A
block being read is *pinned* and never chosen as a victim. An object larger than one I/O moves as parts (parts.py).

Prefix structure: a block written as part of a chain names its *parent*
(the block before it); each entry counts its children per tier. A block
with a child in its own tier is *held*: its policy does not offer it, so
tails leave a tier before their heads. A head with children only in other
tiers is not held (held by a child anywhere, a full bottom tier of heads
whose tails live above could take no demotion): when it is evicted, its
descendants leave with it (cascade, counted), so no cached block is one no
lookup can reach (a *dead* block: one whose parent is gone). A head shared
by many chains in its tier lives as long as any of them needs it.

Locking: one lock guards the index, the per-tier accounting and the
policies; no I/O ever happens under it. Space is reserved under the lock
(victims are chosen and marked MOVING at once), then the reserving thread
performs the moves, deepest first, and only then writes its own block, so a
tier's slots are never over-committed. A reader that meets a MOVING block
waits for the move to finish (and one that meets a LANDING block, whose bytes a batch moves with its others,
for them to land: landing.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from time import monotonic_ns as now_ns

import numpy as np

from kv_cache import counters as C
from kv_cache.cache.batch import Batches
from kv_cache.cache.chains import CORRUPT, DROPPING, LANDING, READY, Entry, PrefixStructure
from kv_cache.cache.landing import Landing
from kv_cache.cache.parts import Parts
from kv_cache.cache.policies import make
from kv_cache.cache.room import MOVING, Move, Room
from kv_cache.tiers.base import IO_UNITS, SHARED, SPLITS, device_begin, device_ns, moves_real_bytes


@dataclass
class Reservation:
    """Space reserved for a new block, with the moves that must run before it is written."""

    entry: Entry
    moves: list[Move]


class BlockCache(Batches, Landing, Room, PrefixStructure):
    """Index + per-tier policies + placement over an ordered list of tiers."""

    def __init__(self, tiers: list, policy: type, promote: bool, recorder, gds=None, parts: Parts | None = None,
                 clock=None):
        """policy: a POLICIES class (one instance a tier); clock: a clock-reading policy's (a replay's: the run's)."""
        self.tiers = tiers
        self.gds = gds  # a GdsLink: NVMe <-> HBM without the host bounce (--gds)
        self.parts = parts or Parts()  # objects larger than one I/O move as parts (--io-chunk-mb)
        self.names = [t.name for t in tiers]
        # a read can be checked only where real bytes came back (not from the null or a simulated tier)
        self.verifiable = [moves_real_bytes(t) for t in tiers]
        self.policies = [make(policy, clock) for _ in tiers]
        self.promote_enabled = promote
        self.recorder = recorder
        self.index: dict[int, Entry] = {}
        self.pending: dict[int, tuple] = {}  # key -> (thread, bytes, phase, entry) of a PLACING block's write
        self.landing: dict[int, tuple] = {}  # key -> (thread, move, buffer) of a LANDING demotion (landing.py)
        self.promoting: dict[int, tuple] = {}  # key -> (thread, entry, bytes, source tier) of a pending promotion
        # NOTE: with --shared-storage the bottom tier is written by other ranks too. A lookup that
        # misses here adopts a block published there; such remote blocks count against no local
        # capacity, are never local victims, and are copied (not moved) when promoted.
        self.shared = len(tiers) - 1 if SHARED in tiers[-1].flags else None
        self.adopted = 0
        self.used = [0] * len(tiers)     # slots of blocks in, or reserved for, each tier
        self.leaving = [0] * len(tiers)  # slots of chosen victims still physically there, owed to nobody
        self._slot_counts: list[dict[int, int]] = [{} for _ in tiers]  # block size -> its slots, each tier's
        self.bottom = len(tiers) - 1
        self._trash: dict[int, list] = {}  # thread -> blocks it dropped, to delete from their tier outside the lock
        self._lock = threading.Lock()  # `with self._lock`: C, where the Condition's enter / exit are Python
        self._cond, self._waiting = threading.Condition(self._lock), 0  # readers waiting for a move (_wait)

    # ------------------------------------------------------------------ reads

    def pin_prefix(self, keys) -> list[Entry]:
        """Pin and return the entries of the longest cached prefix of keys."""
        hits: list[Entry] = []
        with self._lock:
            for k in keys:
                e = self.index.get(k)
                while e is not None and e.state in (MOVING, LANDING):
                    self._wait()
                    e = self.index.get(k)
                if e is None and self.shared is not None:
                    e = self._adopt(k)
                if e is None or e.state != READY:
                    break
                e.pins += 1
                self.policies[e.tier].on_hit(k)
                hits.append(e)
        return hits

    def _adopt(self, key: int) -> Entry | None:
        nbytes = self.tiers[self.shared].adopt(key)
        if nbytes is None:
            return None
        self.adopted += 1
        e = self.index[key] = Entry(key, self.shared, nbytes, "remote", remote=True)
        return e

    def forget_vanished(self, e: Entry) -> None:
        """A pinned block's file was removed by another rank before we read it: it is a miss now.

        NOTE: two ranks that write the same block before either sees the other's both hold it as
        their own; when one evicts it, the other's copy vanishes too, and its accounting goes with it.
        """
        with self._lock:
            e.pins -= 1
            if self.index.get(e.key) is not e:
                return
            if e.pins == 0:
                del self.index[e.key]
                self._gone(e)
                if not e.remote:
                    self.used[e.tier] -= self._slots(e.tier, e.nbytes)
                    self._unplaced(e)
                    for k, _, _ in self.parts.of(e.key, e.nbytes):
                        self.tiers[e.tier].release(k)
            self._wake()
        self._empty_trash()

    def unpin(self, entries) -> None:
        with self._lock:
            for e in entries:
                e.pins -= 1
                self._drop_corrupt(e)
        self._empty_trash()

    def discard(self, e: Entry) -> None:
        """A pinned block read back wrong: never served again, its slots freed once no reader holds it.

        NOTE: it stays in the index (state CORRUPT, a miss for every lookup) until its last pin goes,
        so that a rewrite of the same key cannot meet the corrupt copy's slots in the tier.
        """
        with self._lock:
            e.pins -= 1
            if self.index.get(e.key) is e and e.state != CORRUPT:
                self._unplaced(e)
                e.state = CORRUPT
            self._drop_corrupt(e)
            self._wake()
        self._empty_trash()

    def _drop_corrupt(self, e: Entry) -> None:
        """Lock held: drop a corrupt (or cascaded) block once nobody holds it."""
        if e.state == CORRUPT and not e.pins and self.index.get(e.key) is e:
            self._drop(e)

    def _timed(self, t: int, e: Entry, op: str, phase: str, start: int, times: list[tuple[int, int]],
               split: bool = False, units: list[tuple[int, int]] | None = None) -> None:
        """One block operation: an object of parts takes the sum of its parts' I/O times, each beside it (as a tier's
        own --io-unit layer I/Os are). split: device_begin() was called just before it, on this thread: its device
        and host parts are recorded too (one operation at a time: a batch's I/Os run on other threads). units: its
        --io-unit layer I/Os' (ns, bytes) in a batch, each from the batch's submission (else the tier's own)."""
        total = sum(ns for ns, _ in times)
        self.recorder.op(self.names[t], op, phase, start, total, e.nbytes, e.key)
        device = min(device_ns(), total) if split and SPLITS in self.tiers[t].flags else 0
        if device:  # the reference's device / host split (none through GDS, which no engine times)
            self.recorder.split(self.names[t], op, start, device, total - device)
        if units is None:
            units = times if len(times) > 1 else self.tiers[t].io_times() if IO_UNITS in self.tiers[t].flags else []
        if units:
            self.recorder.io_units(self.names[t], op, phase, start, units)

    def _gds_whole(self, e: Entry) -> bool:  # GDS moves whole blocks (its landing buffer holds one I/O)
        return self.gds is not None and not self.parts.many(e.nbytes)

    def _into_top(self, e: Entry, src: int, state: str) -> None:
        """Lock held: a promoted block is now the top tier's, in state (READY, or LANDING until a batch writes it):
        its source slots freed (another rank's block keeps its own), its parent's counts moved, its tier's order."""
        if not e.remote:
            self.used[src] -= self._slots(src, e.nbytes)
        self._child_moved(e, src, 0)
        e.tier, e.state, e.remote = 0, state, False
        self._placed(e)

    def read(self, e: Entry, out: np.ndarray, phase: str, op: str = "read", consume=None) -> int:
        """Read a pinned block into out; return the tier index it came from (op: read, donor_read). An object of
        parts is read part by part into out's start, consume(offset, part) taking each (see parts.py)."""
        t = e.tier
        gds = self._gds_whole(e) and self.gds.lands(self.tiers[t]) and not e.remote
        device_begin()
        start = now_ns()
        if gds:
            land = self.gds.load(e.key)  # NVMe -> HBM: the timed read
        times = self.parts.read(self.tiers[t], e.key, e.nbytes, out, consume) if not gds else \
            [(now_ns() - start, e.nbytes)]
        self._timed(t, e, op, phase, start, times, split=True)
        if gds:
            self.gds.to_host(land, out[: e.nbytes])  # untimed: only to verify the stamps
        return t

    def release(self, e: Entry, data: np.ndarray, scratch: np.ndarray, defer: bool = False) -> None:
        """Unpin a block that was read into data, promoting it to the top tier if due. defer (a batch read): the
        promotion's state changes now, its bytes go with the batch's others (landing.py, commit_promotions)."""
        with self._lock:
            src = e.tier
            moves = None
            if self.promote_enabled and src > 0 and e.pins == 1 and e.state == READY:
                moves = self._reserve(0, e.nbytes)
            e.pins -= 1
            if moves is None:
                self._drop_corrupt(e)
            else:
                self._unplaced(e)
                e.state = MOVING
        if moves is None:
            self._empty_trash()
            return
        move = Move(e, src, 0)
        together = defer and self._promotes_together(e, src)
        try:
            if defer and not together:
                self.commit_promotions()  # the room this one's moves take, as serial mode's found it
            self.run_moves(moves, scratch, defer=together)
            if together:
                if self._promotes_later(e, src, data):
                    return
                self.commit_promotions()  # its parent left: it goes now, after those before it
            start = now_ns()
            direct = self._gds_whole(e) and self.gds.promotes(self.tiers[src], self.tiers[0])
            if self.parts.many(e.nbytes):  # its parts were read one by one: copied again, tier to tier
                self.parts.move(self.tiers[src], self.tiers[0], e.key, e.nbytes, scratch)
            elif not (direct and self.gds.promote(e.key, e.nbytes)):  # GDS: the block is in HBM already
                self.tiers[0].put(e.key, data[: e.nbytes])
            if not e.remote:  # another rank's block stays where it is: we take a copy
                self.parts.delete(self.tiers[src], e.key, e.nbytes)
            self.recorder.op(self.names[0], "promote", "load", start, now_ns() - start, e.nbytes, e.key)
        except BaseException:
            self._forget(e, move, src_accounted=e.remote)
            raise
        with self._lock:
            self._into_top(e, src, READY)
            if self._orphaned(e):
                self._drop_now(e)
            self._wake()
        self._empty_trash()

    # ------------------------------------------------------------------ writes

    def reserve_write(self, key: int, nbytes: int, label: str, parent: int | None = None,
                      why: list | None = None) -> Reservation | None:
        """Reserve room for a new block in the highest tier that can make it; None if the block is
        already cached or being written, no tier can take it, or its parent (the block before it in
        its chain) is not cached: no lookup could ever reach it, so no engine would store it (why: a
        list the refusal's reason is appended to, one of counters.WRITE_SKIPPED_WHY)."""
        with self._lock:
            return self._reserve_write(key, nbytes, label, parent, why)

    def _reserve_write(self, key: int, nbytes: int, label: str, parent: int | None,
                       why: list | None = None) -> Reservation | None:
        """reserve_write, the lock held."""
        if key in self.index:
            return _refused(why, "cached")
        p = self.index.get(parent) if parent is not None else None
        if parent is not None and (p is None or p.state in (CORRUPT, DROPPING)):
            return _refused(why, "parent_gone")
        if p is not None:
            p.pins += 1  # the parent must not be the victim that makes room for its own child
        try:
            for t in range(len(self.tiers)):
                moves = self._reserve(t, nbytes)
                if moves is not None:
                    e = self.index[key] = Entry(key, t, nbytes, label)
                    e.parent = p
                    self._child_moved(e, None, t)
                    return Reservation(e, moves)
        finally:
            if p is not None:
                p.pins -= 1
        return _refused(why, "no_room")

    def commit_write(self, res: Reservation, buf: np.ndarray, phase: str, scratch: np.ndarray,
                     produce=None) -> None:
        """Run the reservation's moves, then write the block (timed) into its tier; an object of parts is made
        part by part into buf's start by produce(offset, view) (see parts.py)."""
        e = res.entry
        try:
            self.run_moves(res.moves, scratch)
            device_begin()
            start = now_ns()
            times = self.parts.write(self.tiers[e.tier], e.key, e.nbytes, buf, produce)
            self._timed(e.tier, e, "write", phase, start, times, split=True)
        except BaseException:
            self.abort(res)
            raise
        with self._lock:
            e.state = READY
            self._placed(e)
            if self._orphaned(e):  # its parent left while it was written: unreachable, dropped
                self._drop_now(e)
            self._wake()
        self._empty_trash()

    def _drop_now(self, e) -> None:
        """Lock held: a ready, unpinned block whose parent left meanwhile leaves the cache too."""
        self.recorder.count(C.CASCADE_DROPS)
        self._unplaced(e)
        self._drop(e)

    def abort(self, res: Reservation) -> None:
        """Give back a reservation whose block will not be written."""
        e = res.entry
        with self._lock:
            if self.index.get(e.key) is e:
                del self.index[e.key]
                self._gone(e)
                self.used[e.tier] -= self._slots(e.tier, e.nbytes)
            self._wake()
        self._empty_trash()


def _refused(why: list | None, reason: str) -> None:
    """A write refused: its reason said where the caller asked for it."""
    if why is not None:
        why.append(reason)
