"""A request's blocks in flight together (--request-io batched), a part of ``BlockCache`` (cache.py).

The engines that offload KV move a request's blocks as one job (vLLM's offloading connector: one batched copy per
request; LMCache: a request's chunks fetched concurrently; NIXL: a descriptor list per transfer). Here the reads of
a request's pinned hit blocks go to each tier as one ``get_many``, and its new blocks' writes as one ``put_many``
per tier. The cache's state changes stay where serial mode makes them and in its order: each new block is reserved,
the demotions it needs are made (their bytes land together before the new blocks', landing.py), and it is placed in
its tier's order (PLACING) before the next one is reserved, as a serial write would leave it; only bytes wait, to go
together. Read blocks are judged and
released (promoted if due) in chain order after their batch. Hit rates and eviction order are serial mode's
(bench/same_schedule.py shows it). Each block's latency runs from its batch's submission to its own
completion (fio's completion latency at that depth); each batch as a whole is recorded beside it (op load or
store) with how many blocks it held (results' queue_depth).
"""

from __future__ import annotations

import threading
from time import monotonic_ns as now_ns

import numpy as np

from kv_cache import counters as C
from kv_cache.cache.chains import LANDING, PLACING, READY, Entry
from kv_cache.tiers.base import IO_UNITS, device_begin, in_flight_take


def batch_units(tier, start: int, n: int) -> list[tuple[int, int]]:
    """The --io-unit layer I/Os of the tier's last batch of n items on this thread, (ns from start, bytes) each, every
    item's in turn (none of an item that failed; none at all where its last batch was not of n)."""
    got = tier.batch_io_times()
    return [(c - start, b) for u in got for c, b in u] if len(got) == n else []


class Batches:
    """read_batch, place_writes and commit_batch of a BlockCache."""

    def _batchable(self, e: Entry) -> bool:
        """A block the batch path moves: one object (no parts), not another rank's (read by name), one GDS lands in
        HBM only where its reads take batches; the others take the serial path inside the batch."""
        tier = self.tiers[e.tier]
        gds = self._gds_whole(e) and self.gds.lands(tier) and not self.gds.loads_batch()
        return not (e.remote or gds or self.parts.many(e.nbytes))

    def read_batch(self, entries: list[Entry], outs: list[np.ndarray], phase: str, op: str = "read") -> list:
        """Read pinned entries into outs, one get_many per tier (chain order within it); per entry the tier index
        it was read from, or the exception its read raised (the caller judges them in chain order)."""
        result: list = [None] * len(entries)
        by_tier: dict[int, list[int]] = {}
        for i, e in enumerate(entries):
            if self._batchable(e):
                by_tier.setdefault(e.tier, []).append(i)
            else:
                try:
                    result[i] = self.read(e, outs[i], phase, op)
                except Exception as ex:  # noqa: BLE001 - judged by the caller, as a serial read's would be
                    result[i] = ex
        for t, idx in by_tier.items():
            gds = self.gds is not None and self.gds.lands(self.tiers[t])
            in_flight_take()  # what an earlier call left is not this batch's
            start = now_ns()
            done = self.gds.load_many([entries[i].key for i in idx]) if gds else \
                self.tiers[t].get_many([(entries[i].key, outs[i][:entries[i].nbytes]) for i in idx])
            self._record_batch(t, C.LOAD_BATCH, phase, op, start, [entries[i] for i in idx], done, in_flight_take())
            for i, d in zip(idx, done):
                result[i] = d if isinstance(d, BaseException) else t
                if gds and not isinstance(d, BaseException):  # untimed: only to verify the stamps
                    self.gds.to_host(self.gds.landed(entries[i].key), outs[i][:entries[i].nbytes])
        return result

    def _record_batch(self, t: int, kind: str, phase: str, op: str, start: int, entries: list[Entry],
                      done: list, busy: int | None) -> None:
        """Each block's op from the batch's submission to its completion (its --io-unit layer I/Os each too), and
        the batch as a whole (busy: its I/Os' time in flight, where the tier's engine timed them)."""
        ok = [(e, d) for e, d in zip(entries, done) if not isinstance(d, BaseException)]
        last = max([start, *(d for _, d in ok)])
        name = self.names[t]  # no split (a batch's I/Os ran elsewhere): the blocks' ops recorded together
        self.recorder.ops(name, op, phase, start, [(d - start, e.nbytes, e.key) for e, d in ok])
        if IO_UNITS in self.tiers[t].flags:  # and their units beside them
            self.recorder.io_units(name, op, phase, start, batch_units(self.tiers[t], start, len(entries)))
        self.recorder.batch(name, kind, phase, start, last - start, len(entries), busy)

    def place_writes(self, wants: list[tuple[int, int, str, int | None]], datas: list[np.ndarray], phase: str,
                     scratch: np.ndarray, why: list | None = None) -> list:
        """Reserve, in order, each (key, nbytes, label, parent) as reserve_write does, run the moves it needs
        (demotions) and place it, its bytes the same place in datas (made before the batch), in its tier's order
        at once (PLACING: no reader's hit until its bytes land): every later block of the batch meets the cache
        serial mode's write of this one would have left. Should a later block need it as a victim (as serial
        mode could evict or demote it), its bytes are written first (_flush). The others go with commit_batch.
        None for a block reserve_write refuses (its reason appended to why, as reserve_write does)."""
        placed: list = []
        me = threading.get_ident()
        evicted: list | None = None if self.recorder.in_order else []  # a batch's evictions, recorded together
        try:
            for n, want in enumerate(wants):
                with self._lock:
                    res = self._reserve_write(*want, why)
                if res is not None:
                    try:
                        self.run_moves(res.moves, scratch, defer=True, evicted=evicted)
                    except BaseException:
                        self.abort(res)
                        raise
                    with self._lock:
                        res.entry.state = PLACING
                        self.pending[res.entry.key] = (me, datas[n], phase, res.entry)
                        self._placed(res.entry)
                        if self._orphaned(res.entry):  # its parent left while room was made: serial mode
                            self._drop_now(res.entry)  # writes it, then drops it (its bytes written by the trash)
                    self._empty_trash()
                placed.append(res)
        except BaseException:
            self._land_anyway()
            self.give_back([r for r in placed if r is not None])
            raise
        finally:
            if evicted:
                self.record_evictions(evicted)
        return placed

    def _land_anyway(self) -> None:
        """The batch failed: its landing demotions still move (their blocks are in the tiers' order already); one
        that fails too has dropped its block."""
        try:
            self.land()
        except Exception:  # noqa: BLE001, S110 - the batch's own failure is the one raised
            pass

    def give_back(self, reservations: list) -> None:
        """Placed reservations whose bytes will not be written leave the cache (their tier's order too)."""
        with self._lock:
            for r in reservations:
                self._pending_of(r.entry)
                if r.entry.state == PLACING and self.index.get(r.entry.key) is r.entry:
                    self._unplaced(r.entry)
        for r in reservations:
            if r.entry.state == PLACING:
                self.abort(r)

    def _pending_of(self, e: Entry) -> tuple | None:
        """Lock held: e's write record taken out of pending (thread, bytes, phase, entry); None where its bytes were
        written or given up, or the record is another entry's of the same key (written again by another worker once
        e was dropped: taken, that one was never written and ours was, where no index entry counted it, issue 48)."""
        mine = self.pending.get(e.key)
        if mine is None or mine[3] is not e:
            return None
        del self.pending[e.key]
        return mine

    def _flushable(self, e: Entry) -> bool:
        """Lock held: e's bytes are owed by this thread's batch (a PLACING write, a LANDING demotion or promotion):
        serial mode would have moved them already, so it may be a victim or be dropped (its bytes land first)."""
        return e.state in (PLACING, LANDING) and self._owed(e)

    def _flush(self, e: Entry, t: int) -> None:
        """Before e moves out of tier t (or is dropped): its bytes where serial mode had put them, if they had not
        landed: this thread's pending promotions written, its landing demotions landed, or its write made (timed:
        the write serial mode would have made)."""
        me = threading.get_ident()
        if self.promoting.get(e.key, (None,))[0] == me:
            self.commit_promotions()  # a pending promotion: written with those before it, as serial mode had
            return
        if self.landing.get(e.key, (None,))[0] == me:
            self.land()  # a landing demotion: its bytes reach the tier it is in, as serial mode's had
            return
        with self._lock:
            mine = self._pending_of(e)
        if mine is None or mine[0] != me:  # another thread's batch: dropped before its bytes
            return
        self.land()  # the room its bytes take, as serial mode's write found it
        _, data, phase, _ = mine
        device_begin()
        start = now_ns()
        times = self.parts.write(self.tiers[t], e.key, e.nbytes, data)
        self._timed(t, e, "write", phase, start, times, split=True)

    def commit_batch(self, reservations: list, datas: list[np.ndarray], phase: str) -> None:
        """Write the placed blocks (one put_many per tier), then make them READY in order. A block whose write
        fails is given back; the first failure is raised once the others are ready."""
        with self._lock:  # those a later block of the batch moved out were written then (_flush)
            todo = [i for i, r in enumerate(reservations) if self._pending_of(r.entry) is not None]
        by_tier: dict[int, list[int]] = {}
        for i in todo:
            by_tier.setdefault(reservations[i].entry.tier, []).append(i)
        failed: dict[int, BaseException] = {}
        try:
            self.land()  # the demotions that made their room, together
            for t, idx in by_tier.items():
                entries = [reservations[i].entry for i in idx]
                in_flight_take()
                start = now_ns()
                done = self.tiers[t].put_many([(e.key, datas[i][:e.nbytes]) for e, i in zip(entries, idx)])
                self._record_batch(t, C.STORE_BATCH, phase, "write", start, entries, done, in_flight_take())
                failed.update({i: d for i, d in zip(idx, done) if isinstance(d, BaseException)})
        except BaseException:
            self.give_back([reservations[i] for i in todo])
            raise
        with self._lock:
            for i in todo:
                e = reservations[i].entry
                if i in failed or self.index.get(e.key) is not e:
                    continue
                e.state = READY  # its policy's hold is current: every change of its children while PLACING told it
                if self._orphaned(e):  # its parent left while it was written: unreachable, dropped
                    self._drop_now(e)
            self._wake()
        self._empty_trash()
        self.give_back([reservations[i] for i in failed])  # still PLACING: out of its tier's order and the index
        if failed:
            raise failed[min(failed)]
