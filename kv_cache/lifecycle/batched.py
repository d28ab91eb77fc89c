"""--request-io batched, a part of ``Lifecycle`` (executor.py): a request's blocks in flight together.

The hit prefix is read in windows of --max-inflight blocks (the cache groups a window by tier: one get_many each),
then judged in chain order exactly as serial mode judges it block by block: each verified, released (promoted if
due), and the first that vanished or reads back wrong ends the hit, the rest unpinned. The new blocks of a phase
(prefill, decode) are reserved and placed in order (each as a serial write would leave the cache), filled, and
written as one put_many per tier. The cache's
state changes keep serial mode's order, so hit rates and eviction order are serial mode's; what changes is the
depth the storage sees and each request's storage time (a batch's wall time, not the sum of its blocks').
"""

from __future__ import annotations

from time import monotonic_ns as now_ns

from kv_cache import counters as C
from kv_cache.errors import BlockVanished
from kv_cache.lifecycle.payload import block_digest
from kv_cache.lifecycle.plan import KVPlan
from kv_cache.lifecycle.worker import WorkerBuffers
from kv_cache.types import RequestOutcome


class BatchedPaths:
    """The batched read of a hit prefix and the batched write of a phase's new blocks."""

    def _read_hits_batched(self, entries: list, bufs: WorkerBuffers) -> tuple[int, list[int], int]:
        """Read pinned entries (chain order) in windows: (storage ns, the tier of each that hit, how many hit)."""
        storage_ns, tiers = 0, []
        for w in range(0, len(entries), self.batch):
            window = entries[w:w + self.batch]
            try:
                self._check_stop()
                spent, got = self._read_window(window, bufs, "read", to_first_miss=True)
            except BaseException:
                self.cache.unpin(entries[w + len(window):])
                raise
            storage_ns += spent
            hit = got.index(None) if None in got else len(got)
            tiers += got[:hit]
            if hit < len(window):  # the rest of the prefix is a miss (recomputed, rewritten)
                self.cache.unpin(entries[w + len(window):])
                return storage_ns, tiers, w + hit
        return storage_ns, tiers, len(entries)

    def _read_window(self, window: list, bufs: WorkerBuffers, op: str, to_first_miss: bool) -> tuple[int, list]:
        """Read pinned entries together (the cache groups them by tier), then judge each in order as serial mode
        judges a block: (storage ns, per entry the tier it hit in, or None: it vanished or read back wrong).
        to_first_miss (a prefix): the first miss ends it, the window's rest unpinned unread; else (donor blocks,
        each on its own) every block is judged. A read's error unpins what was not judged and is raised."""
        outs = [bufs.batch_view(j, e.nbytes) for j, e in enumerate(window)]
        start = now_ns()
        try:
            got = self.cache.read_batch(window, outs, "load", op)
        except BaseException:
            self.cache.unpin(window)
            raise
        storage_ns, tiers = now_ns() - start, []
        try:
            for j, (e, r) in enumerate(zip(window, got)):
                if isinstance(r, BaseException) and not isinstance(r, BlockVanished):
                    self.cache.unpin(window[j + 1:])
                    raise r
                intact = False
                if isinstance(r, BlockVanished):  # another rank evicted it from shared storage: a miss now
                    self.cache.forget_vanished(e)
                    self.recorder.count(C.SHARED_VANISHED, start_ns=start)
                else:
                    judged = now_ns()
                    spent, intact = self._judge(e, outs[j], r, bufs, defer=True)
                    storage_ns += spent
                    if intact and self._bytes_checked(r):
                        bufs.verified(j, outs[j])
                    self.recorder.own(now_ns() - judged - spent)  # its verification: the generator's work
                tiers.append(r if intact else None)
                if not intact and to_first_miss:
                    self.cache.unpin(window[j + 1:])
                    break
        finally:  # the window's promotions, together, before its buffers are read into again
            start = now_ns()
            self.cache.commit_promotions()
            storage_ns += now_ns() - start
        return storage_ns, tiers

    def _bytes_checked(self, tier: int) -> bool:
        """A block read from tier and judged intact was checked byte for byte, or by its checksum (not only its
        stamps, nor taken on trust from a tier that keeps no bytes)."""
        return self.verify in ("checksum", "full") and self.cache.verifiable[tier]

    def _judge(self, e, data, tier: int, bufs: WorkerBuffers, verdict: bool | None = None,
               defer: bool = False) -> tuple[int, bool]:
        """Verify a block read into data (verdict: already judged, part by part), then release it (promoted if
        due; defer: with its window's others) or discard it: (release ns, intact). Serial and batched reads."""
        start = now_ns()
        if verdict is not None:
            intact = verdict
        else:
            intact = self._check(e.key, data, start, e.digest) if self.cache.verifiable[tier] else True
        start = now_ns()
        if intact:
            self.cache.release(e, data, bufs.scratch, defer)
        else:
            self.cache.discard(e)
            self.recorder.count(C.VERIFY_DISCARDED)
        return now_ns() - start, intact

    def _write_batched(self, plan: KVPlan, indices, bufs: WorkerBuffers, phase: str, out: RequestOutcome) -> int:
        """Write the plan's blocks at indices in windows: their payloads lent together (untimed, as serial mode's
        are made before each write's clock: from the payload pool in place where they can be, else made in their
        batch buffers), reserved and placed in order, then one put_many per tier."""
        storage_ns, todo = 0, list(indices)
        for w in range(0, len(todo), self.batch):
            window = todo[w:w + self.batch]
            self._check_stop()
            wants = [(plan.keys[i], self.object_bytes(plan.tokens_per_key[i]), plan.labels[i], plan.parent(i))
                     for i in window]
            made = now_ns()
            lent = [(bufs.batch_view(n, nbytes), range(0)) for n, (_, nbytes, _, _) in enumerate(wants)] \
                if self.fake_io else bufs.lend_many(self.payloads, [(key, nbytes) for key, nbytes, _, _ in wants])
            self.recorder.own(now_ns() - made)  # the payloads made and stamped: the generator's work
            try:
                start = now_ns()
                why: list[str] = []
                placed = self.cache.place_writes(wants, [data for data, _ in lent], phase, bufs.scratch, why)
                kept = [(r, lent[n][0]) for n, r in enumerate(placed) if r is not None]
                if kept:
                    self.cache.commit_batch([r for r, _ in kept], [v for _, v in kept], phase)
                storage_ns += now_ns() - start
                refusals = iter(why)  # in the window's order, one for each block placed as None
                for (key, _, _, parent), r in zip(wants, placed):
                    if r is None:
                        out.refused(key, parent, next(refusals))
                if self.verify == "checksum":  # kept in the index: every later read of the block is checked
                    hashed = now_ns()
                    for r, data in kept:
                        r.entry.digest = block_digest(data)
                    self.recorder.own(now_ns() - hashed)
            finally:
                if not self.fake_io:
                    self.payloads.give_back_many([held for _, held in lent])
        return storage_ns
