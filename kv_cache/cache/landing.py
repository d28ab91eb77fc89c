"""A batch's demotions and a read window's promotions moved together (--request-io batched), a part of
``BlockCache`` (cache.py).

Making room for a batch's new blocks demotes victims one tier down, one a block. Serial mode moves each before
the next block is reserved; an engine offloads them as one job (vLLM's connector: one batched copy of a request's
blocks into its CPU pool; LMCache: a request's chunks stored concurrently). Here a demotion made while a batch is
placed changes the cache's state at once, as serial mode's would (the block is in its new tier's order, its
parent's counts follow: every later block of the batch meets the cache serial mode left), and is *landing*: its
bytes still in the tier above. ``land`` then moves them, deepest tier first (a tier's moves out free the slots its
moves in take), each tier's as one batch: HBM into the CPU tier's slots as one D2H batch (``move_many_to``), the
CPU tier's slots straight into a batching tier's ``put_many``, HBM with no CPU tier below it and the NVMe tier over
a remote one through the worker's scratch, a window at a time (a read batch into it, a write batch out of it);
elsewhere one after another through the worker's buffer, as serial mode does. Each block's demote latency runs
from its batch's submission to its own completion, the batch as a whole beside it (op ``demotions``, with its
depth).

A landing block is no reader's hit until it lands (readers wait, as for a move). Should a later block of the same
batch pick it as a victim again, or need room its bytes still hold, this thread's landing blocks land first.

Promotions after a batch read go the same way (``commit_promotions``): each read block due for promotion changes
the cache at once (in the top tier's order, its source copy deleted: its bytes are in the read buffer), its room
made by landing demotions, and the window's promotions are written into the top tier as one ``put_many`` once the
demotions landed. Should a later one pick a pending promotion as a victim, the pending ones are written first, in
order, as serial mode had written them.
"""

from __future__ import annotations

import threading
from functools import partial
from time import monotonic_ns as now_ns

from kv_cache import counters as C
from kv_cache.buffers import direct_aligned
from kv_cache.cache.chains import LANDING, READY
from kv_cache.cache.room import Move
from kv_cache.tiers.base import BATCHES, IO_UNITS, in_flight, in_flight_take


class Landing:
    """A BlockCache's demotions deferred and landed, and its promotions committed together (its tiers, parts,
    recorder, index, lock, ``landing`` and ``promoting``)."""

    def _owed(self, e) -> bool:
        """e's bytes are owed by this thread's batch (a write placed ahead of its bytes, a landing demotion or a
        pending promotion)."""
        me, key = threading.get_ident(), e.key
        for owed in (self.pending, self.landing, self.promoting):  # not any() of a generator: half the time
            v = owed.get(key)
            if v is not None and v[0] == me:
                return True
        return False

    def _deferrable(self, mv: Move) -> bool:
        """A demotion the batch path moves: one I/O between two tiers of this process (through GDS where its link
        takes batches)."""
        e, src, dst = mv.entry, self.tiers[mv.src], self.tiers[mv.dst]
        gds = self._gds_whole(e) and self.gds.links(src, dst) and not self.gds.batches()
        return not (e.remote or gds or self.parts.many(e.nbytes))

    def _defer(self, mv: Move, scratch) -> bool:
        """Make a demotion's state change now (as run_moves would once its bytes moved); its bytes land later.
        False: it must move now (its parent left meanwhile: serial mode moves, then drops it)."""
        e = mv.entry
        with self._lock:
            if self._orphaned(e):
                return False
            self._child_moved(e, mv.src, mv.dst)
            e.tier, e.state = mv.dst, LANDING
            self._placed(e)
            self.landing[e.key] = (threading.get_ident(), mv, scratch)
        return True

    def land(self) -> None:
        """Move the bytes of this thread's landing demotions, deepest tier first, each tier's as one batch. A move
        that fails drops its block (as a failed serial move does); the first failure is raised once all landed."""
        me = threading.get_ident()
        with self._lock:
            mine = [v[1:] for v in self.landing.values() if v[0] == me]
            for mv, _ in mine:
                del self.landing[mv.entry.key]
        error = None
        for dst in sorted({mv.dst for mv, _ in mine}, reverse=True):
            group = [(mv, scratch) for mv, scratch in mine if mv.dst == dst]
            error = self._land_group([mv for mv, _ in group], group[0][1]) or error
        # the trash once every group landed: a block of the batch dropped meanwhile is written first (_flush), into
        # room an upper tier's group makes (emptied after the lower group, it met the upper tier full, issue 48)
        error = self._settle([]) or error
        if error is not None:
            raise error

    def _land_group(self, moves: list[Move], scratch) -> BaseException | None:
        """One tier's landing demotions (all from the tier above): together where the two tiers can, else one by
        one; then each block is READY where it was placed. Returns the first failure."""
        src, dst = self.tiers[moves[0].src], self.tiers[moves[0].dst]
        in_flight_take()
        start = now_ns()
        units: list = [None] * len(moves)  # each move's --io-unit layer writes into dst, when a batch made them
        try:
            done = self._together(src, dst, moves, scratch)
        except BaseException as ex:  # the batch call itself raised (a server gone): each fails with it, dropped
            done = [ex] * len(moves), None  # (nobody may wait on a landing block for ever)
        if done is None:
            done = [self._one(src, dst, mv, scratch) for mv in moves]
        else:
            done, got = done
            if got and len(got) == len(moves):
                units = [[(c - start, b) for c, b in u] for u in got]
            ends = [d for d in done if not isinstance(d, BaseException)]
            if ends:
                self.recorder.batch(dst.name, C.DEMOTE_BATCH, "evict", start, max(ends) - start, len(moves),
                                    in_flight_take())
            done = [(start, d) for d in done]
        return self._settle([partial(self._landed, mv, src, dst, began, d, u)
                             for mv, (began, d), u in zip(moves, done, units)], trash=False)

    def _settle(self, ends: list, trash: bool = True) -> BaseException | None:
        """Run each block's end whatever another's raised (a reader waits on any left landing), then (trash) empty
        the trash: the first failure, or None."""
        error = None
        for end in [*ends, self._empty_trash] if trash else ends:
            try:
                end()
            except BaseException as ex:  # noqa: BLE001 - raised once all are settled
                error = error or ex
        return error

    def _landed(self, mv: Move, src, dst, began: int, d, units: list | None = None) -> None:
        """One landing demotion's end: its source copy deleted, timed (units: its --io-unit layer writes, from a
        batch), READY where it was placed; or (d an exception, or the delete failing) dropped, and the failure
        raised."""
        e = mv.entry
        if not isinstance(d, BaseException):
            try:
                self.parts.delete(src, e.key, e.nbytes)
            except Exception as ex:  # noqa: BLE001 - as a failed move
                d = ex
        if isinstance(d, BaseException):
            self._forget_landing(mv)
            raise d
        if self.index.get(e.key) is not e:  # another thread's trash freed it ahead of its bytes: they go too
            self.parts.delete(dst, e.key, e.nbytes, present_only=True)
        self._timed(mv.dst, e, "demote", "evict", began, [(d - began, e.nbytes)], units=units)
        self.recorder.add_bytes(src.name, "read", began, e.nbytes)
        with self._lock:
            self.leaving[mv.src] -= mv.leaving_slots  # its slots are physically free now
            self._arrived(e)

    def _arrived(self, e) -> None:
        """Lock held: a LANDING block's bytes are where it was placed: READY, or dropped if its parent left meanwhile
        (as serial mode drops a block whose move ends orphaned); the waiting readers are woken either way."""
        if e.state == LANDING and self.index.get(e.key) is e:
            e.state = READY
            if self._orphaned(e):
                self._drop_now(e)
        self._wake()

    def _together(self, src, dst, moves: list[Move], scratch) -> tuple | None:
        """(each move's completion ns or exception, dst's --io-unit layer I/Os of each or None), the tier's moves in
        flight together; None where they cannot be (neither HBM into host slots, nor host slots or, through
        scratch, another tier into a batching tier)."""
        items = [(mv.entry.key, mv.entry.nbytes) for mv in moves]
        if self.gds is not None and self.gds.links(src, dst):  # HBM straight into the slab files, no host bounce
            return self.gds.demote_many([k for k, _ in items]), None
        done = src.move_many_to(items, dst)
        if done is not None:
            return done, None
        if BATCHES not in dst.flags:
            return None
        views = [src.held_view(k) for k, _ in items]
        if any(v is None for v in views):
            return self._through(src, dst, items, scratch)
        done = dst.put_many([(k, v) for (k, _), v in zip(items, views)])
        return done, dst.batch_io_times() if IO_UNITS in dst.flags else None

    @staticmethod
    def _through(src, dst, items: list[tuple[int, int]], scratch) -> tuple | None:
        """Moves whose source holds no host copy (HBM with no CPU tier below, the NVMe tier over a remote one) through
        the worker's scratch, as many blocks at a time as it holds: one read batch into it, then one write batch out
        of it: (each one's completion or exception, its --io-unit layer writes). None where it holds one block
        (run/sizing.demotion_depth): one by one then."""
        each = direct_aligned(max(n for _, n in items))
        room = len(scratch) // each
        if room < 2:
            return None
        done: list = []
        units: list[list] = []
        spent = None  # the writes' time in flight (the source's reads are not the depth dst was given)
        for w in range(0, len(items), room):
            window = [(k, scratch[i * each:i * each + n]) for i, (k, n) in enumerate(items[w:w + room])]
            got = src.get_many(window)
            in_flight_take()
            ok = [n for n, g in enumerate(got) if not isinstance(g, BaseException)]
            put = dst.put_many([window[n] for n in ok]) if ok else []
            wrote_ns = in_flight_take()
            spent = spent if wrote_ns is None else (spent or 0) + wrote_ns
            wrote = dst.batch_io_times() if IO_UNITS in dst.flags and ok else []
            mine: list[list] = [[] for _ in got]
            for i, (n, p) in enumerate(zip(ok, put)):
                got[n] = p
                mine[n] = wrote[i] if len(wrote) == len(ok) else []
            done += got
            units += mine
        if spent is not None:
            in_flight(spent)
        return done, units if IO_UNITS in dst.flags else None

    def _one(self, src, dst, mv: Move, scratch) -> tuple[int, object]:
        """(its start, its completion ns or exception) of one move, alone, as serial mode makes it."""
        start = now_ns()
        try:
            self.parts.move(src, dst, mv.entry.key, mv.entry.nbytes, scratch)
        except Exception as ex:  # noqa: BLE001 - judged by _land_group
            return start, ex
        return start, now_ns()

    def _forget_landing(self, mv: Move) -> None:
        """A landing move failed: its block leaves both tiers (picked again as a victim meanwhile, its new tier's
        slots are no longer counted as this move's)."""
        e = mv.entry
        with self._lock:
            landing = e.state == LANDING and self.index.get(e.key) is e
            if landing:
                self._unplaced(e)
        self._forget(e, mv if landing else mv.evicting(), src_accounted=True)

    # ------------------------------------------------------------------ promotions after a batch read

    def _promotes_later(self, e, src: int, data) -> bool:
        """A promotion whose room was made (its moves deferred): its state changes now, as serial mode's once its
        put returned, its bytes go with the window's others. False: it goes now (its parent left meanwhile: serial
        mode writes it, then drops it).

        NOTE: its source copy is deleted now: the bytes are in the read buffer, and serial mode has freed those
        slots before the next block's room is made (the demotions that room needs may land in them)."""
        with self._lock:
            if self._orphaned(e):
                return False
        if not e.remote:  # another rank's block stays where it is: we take a copy
            self.parts.delete(self.tiers[src], e.key, e.nbytes)
        with self._lock:
            self._into_top(e, src, LANDING)
            self.promoting[e.key] = (threading.get_ident(), e, data, src)
        return True

    def _promoted(self, e, src: int, start: int, d) -> None:
        """One pending promotion's end: timed, READY in the top tier; or (d an exception) dropped, d raised."""
        if not isinstance(d, BaseException) and self.index.get(e.key) is not e:  # another thread's trash freed
            self.tiers[0].delete(e.key)  # it ahead of its bytes: they go too
            return
        if isinstance(d, BaseException):
            with self._lock:
                if e.state == LANDING and self.index.get(e.key) is e:
                    self._unplaced(e)
            self._forget(e, Move(e, src, 0), src_accounted=True)
            raise d
        self.recorder.op(self.tiers[0].name, "promote", "load", start, d - start, e.nbytes, e.key)
        with self._lock:
            self._arrived(e)

    def _promotes_together(self, e, src: int) -> bool:
        """A promotion the batch path writes: not an object of parts, not GDS's own, not into a tier timing its
        I/O units."""
        direct = self._gds_whole(e) and self.gds.promotes(self.tiers[src], self.tiers[0])
        return not (direct or self.parts.many(e.nbytes) or IO_UNITS in self.tiers[0].flags)

    def commit_promotions(self) -> None:
        """Land this thread's demotions, then write its pending promotions into the top tier as one batch (each op
        promote, from the batch's submission to its completion); READY in order. A failure drops its block (as a
        failed serial promotion does) and is raised once the others are in."""
        try:
            self.land()
        finally:  # a demotion that failed to land never strands a pending promotion (readers wait on it)
            self._write_promotions()

    def _write_promotions(self) -> None:
        me = threading.get_ident()
        with self._lock:
            mine = [v[1:] for v in self.promoting.values() if v[0] == me]
            for e, *_ in mine:
                del self.promoting[e.key]
        if not mine:
            return
        top = self.tiers[0]
        in_flight_take()
        start = now_ns()
        try:
            done = top.put_many([(e.key, data[:e.nbytes]) for e, data, _ in mine])
        except BaseException as ex:  # the batch call itself raised: each fails with it (nobody may wait on them)
            done = [ex] * len(mine)
        ends = [d for d in done if not isinstance(d, BaseException)]
        if ends:
            self.recorder.batch(top.name, C.PROMOTE_BATCH, "load", start, max(ends) - start, len(mine),
                                in_flight_take())
        error = self._settle([partial(self._promoted, e, src, start, d) for (e, _, src), d in zip(mine, done)])
        if error is not None:
            raise error
