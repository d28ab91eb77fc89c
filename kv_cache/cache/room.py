"""Room in a tier: the victims a reservation needs chosen under the lock (placement), then the waterfall's moves
run outside it (demote one tier down, or evict from the bottom). A part of ``BlockCache`` (cache.py), kept apart
because it is the one place a block changes tier; cache.py's docstring has the vocabulary and the locking rule.
"""

from __future__ import annotations

from time import monotonic_ns as now_ns

import numpy as np

from kv_cache.cache.chains import READY, Entry

MOVING = "moving"
SIZES_KEPT = 256  # block sizes whose slot count each tier's _slots keeps


class Move:
    """One planned waterfall step: demote entry from src to dst, or evict it (dst None). ``leaving_slots``: the
    part of its slots held in ``BlockCache.leaving`` until the move frees them (the rest is owed to the reservation
    that chose it). ``unlanded``: when chosen, its bytes were still owed by this thread's batch (a write placed ahead
    of them, a landing demotion, a pending promotion): run_moves lands or writes them first. A block chosen READY
    owes none, and none can come to be owed while it moves (only its own thread's batch places, defers or promotes
    blocks, and never one that is MOVING): its move skips that check (the owed maps and the lock, an eviction a
    written block once the cache is full)."""

    # NOTE: a plain class, not a frozen dataclass: its __init__ set each field through object.__setattr__ (1.4 against
    # 0.6 us), and a batch's every write makes one for the eviction that makes its room (issue 48). Never changed.
    __slots__ = ("entry", "src", "dst", "leaving_slots", "unlanded")

    def __init__(self, entry: Entry, src: int, dst: int | None, leaving_slots: int = 0, unlanded: bool = False):
        self.entry, self.src, self.dst, self.leaving_slots, self.unlanded = entry, src, dst, leaving_slots, unlanded

    def evicting(self) -> Move:
        """The same move as an eviction (its destination dropped)."""
        return Move(self.entry, self.src, None, self.leaving_slots, self.unlanded)


class Room:
    """Placement and moves of a BlockCache (its tiers, policies, index, used / leaving slots and lock)."""

    # ------------------------------------------------------------------ placement (lock held)

    def _slots(self, t: int, nbytes: int) -> int:
        """Slots a block of nbytes takes in tier t: a tier's answer for a size never changes, and a written block
        asks it about four times (kept for the first SIZES_KEPT sizes: a whole-request run has a size an object)."""
        known = self._slot_counts[t]
        n = known.get(nbytes)
        if n is None:
            n = self.tiers[t].slots_for(nbytes)
            if len(known) < SIZES_KEPT:
                known[nbytes] = n
        return n

    def _free(self, t: int) -> int:
        return self.tiers[t].num_slots - self.used[t] - self.leaving[t]

    def _victims(self, t: int, deficit: int) -> list[Entry] | None:
        """Unpinned ready blocks of tier t in policy order covering deficit slots (out of the policy), or None."""
        victims, got = [], 0
        order = self.policies[t].candidates()
        try:
            for key in order:
                e = self.index[key]
                if e.pins == 0 and (e.state == READY or self._flushable(e)):
                    victims.append(e)
                    got += self._slots(t, e.nbytes)
                    if got >= deficit:  # out of the policy before close(), which then has none to put back
                        return [self._unplaced(v) or v for v in victims]
        finally:
            order.close()  # the policy puts back what was looked at
        return None

    def _reserve(self, t: int, nbytes: int) -> list[Move] | None:
        """Reserve room for nbytes in tier t; return the moves that must run first, or None.

        NOTE: a victim is still physically in the tier until its move runs. The slots that cover
        this reservation's deficit are owed to it (its thread runs the moves before writing);
        any excess stays in ``leaving`` so that no other thread counts it as free too early.
        The victims' own destinations are reserved the same way, one tier down (waterfall).
        """
        need = self._slots(t, nbytes)
        deficit = need - self._free(t)
        victims = self._victims(t, deficit) if deficit > 0 else []
        if victims is None:
            return None
        moves: list[Move] = []
        for e in victims:
            size = self._slots(t, e.nbytes)
            owed = min(size, deficit)
            deficit -= owed
            unlanded = e.state != READY  # PLACING or LANDING: _victims took it as this thread's batch's (_flushable)
            e.state = MOVING
            self.used[t] -= size
            self.leaving[t] += size - owed
            deeper = self._reserve(t + 1, e.nbytes) if t + 1 < len(self.tiers) else None
            if deeper is not None:
                moves.extend(deeper)
            moves.append(Move(e, t, None if deeper is None else t + 1, size - owed, unlanded))
        self.used[t] += need
        return moves

    # ------------------------------------------------------------------ moves (no lock)

    def run_moves(self, moves: list[Move], scratch: np.ndarray, defer: bool = False,
                  evicted: list | None = None) -> None:
        """Perform planned moves in order (deepest first), each timed and recorded. defer (a batch being placed):
        a demotion's state changes now, its bytes land with the batch's others (landing.py). evicted: a list given
        gets each eviction's (tier, start, ns, bytes, key), for record_evictions to record with the batch's others."""
        for i, mv in enumerate(moves):
            e, src = mv.entry, self.tiers[mv.src]
            try:
                if defer and i == 0 and self._owes_any(moves):
                    self.land()  # a victim whose bytes, or the room for them, this batch still owes: first
                if mv.unlanded:
                    self._flush(e, mv.src)  # a block of this thread's batch whose bytes had not landed yet
                if defer and mv.dst is not None:
                    if self._deferrable(mv) and self._defer(mv, scratch):
                        continue
                    self.land()  # this one moves now, into room the landing ones make
            except BaseException:
                for failed in moves[i:]:
                    self._forget(failed.entry, failed, src_accounted=True)
                raise
            start = now_ns()
            try:
                if mv.dst is not None and self._gds_whole(e) and self.gds.links(src, self.tiers[mv.dst]):
                    self.gds.demote(e.key)  # HBM -> NVMe slab, no host bounce
                elif mv.dst is not None:  # HBM -> a registered CPU arena is one copy (move_to), else via scratch
                    self.parts.move(src, self.tiers[mv.dst], e.key, e.nbytes, scratch)
                self.parts.delete(src, e.key, e.nbytes)
            except BaseException:
                for failed in moves[i:]:  # nobody may wait forever on a MOVING block
                    self._forget(failed.entry, failed, src_accounted=True)
                raise
            if mv.dst is None and evicted is not None:
                evicted.append((mv.src, start, now_ns() - start, e.nbytes, e.key))
            elif mv.dst is None:
                self.recorder.op(src.name, "evict", "evict", start, now_ns() - start, e.nbytes, e.key)
            else:
                self._timed(mv.dst, e, "demote", "evict", start, [(now_ns() - start, e.nbytes)])
                self.recorder.add_bytes(src.name, "read", start, e.nbytes)
            with self._lock:
                self.leaving[mv.src] -= mv.leaving_slots  # its slots are physically free now
                if mv.dst is None:
                    del self.index[e.key]
                    self._gone(e)
                else:
                    self._child_moved(e, mv.src, mv.dst)
                    e.tier, e.state = mv.dst, READY
                    self._placed(e)
                    if self._orphaned(e):  # its parent left while it moved: it goes too
                        self._drop_now(e)
                self._wake()
            self._empty_trash()

    def record_evictions(self, evicted: list) -> None:
        """The evictions run_moves collected (a batch's: one a written block, once the cache is full), recorded each
        as op() records one, a tier's together (an op() an eviction was 4.9 % of the workers' time holding the GIL
        at 512 KiB blocks, issue 48)."""
        by_tier: dict[int, list] = {}
        for t, start, ns, nbytes, key in evicted:
            by_tier.setdefault(t, []).append((start, ns, nbytes, key))
        for t, done in by_tier.items():
            self.recorder.ops_each(self.names[t], "evict", "evict", done)

    def _owes_any(self, moves: list[Move]) -> bool:
        """A move's block whose bytes, or the room for them, this thread's batch still owes (a loop, not any() over a
        generator: nearly every write runs its moves through here, and nearly none is unlanded)."""
        for m in moves:
            if m.unlanded and self._owed(m.entry):
                return True
        return False

    def _forget(self, e: Entry, mv: Move, src_accounted: bool) -> None:
        """A move failed mid-way: drop the block from the index, both tiers and their accounting."""
        with self._lock:
            if self.index.get(e.key) is e:
                del self.index[e.key]
                self._gone(e)
            self.leaving[mv.src] -= mv.leaving_slots
            if not src_accounted:
                self.used[mv.src] -= self._slots(mv.src, e.nbytes)
            if mv.dst is not None:
                self.used[mv.dst] -= self._slots(mv.dst, e.nbytes)
                self.parts.delete(self.tiers[mv.dst], e.key, e.nbytes, present_only=True)
            self.parts.delete(self.tiers[mv.src], e.key, e.nbytes, present_only=True)
            self._wake()
        self._empty_trash()

