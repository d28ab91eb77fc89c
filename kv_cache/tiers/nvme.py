"""NVMe tier: blocks in files of a cache directory, moved by one of the disk engines found (tiers/engines.py).

Vocabulary: *layout* is where bytes go (``slab``: preallocated files cut
into fixed slots, no file created or removed per block; ``file-per-block``:
one file per block); *engine* is how bytes move, one entry of an ops table
(fio's ioengines: a new engine, io_uring say, is one class and one entry):

- ``direct``: O_DIRECT pread/pwrite from page-aligned buffers; the page cache
  is never involved.
- ``buffered``: pwrite + fdatasync, then the range is dropped from the page
  cache; before a read the range is dropped again, so reads come from the device.
- ``mmap``: copy into a shared mapping + msync (flush) on write; before a read
  the range is unmapped (MADV_DONTNEED) and dropped from the page cache, so
  the copy out faults pages in from the device. Slab layout only.
"""

from __future__ import annotations

import mmap
import os
import shutil
import threading
import time

import numpy as np

from kv_cache.buffers import aligned_buffer
from kv_cache.errors import RunFault, UserError
from kv_cache.tiers.base import BATCHES, IO_UNITS, PRECONDITIONS, SHARED, SPLITS, STORAGE, SlottedTier, slots_of
from kv_cache.tiers.engines import POOL_ALL, POOL_MOST, POOL_THREADS, Engine, Pools, Target
from kv_cache.tiers.kinds import GiB, StackContext, TierKind, capacity_of
from kv_cache.tiers.null import NullTier
from kv_cache.tiers.nvme_files import BlockFiles
from kv_cache.tiers.nvme_size import NVME_AUTO_MAX, _agree, _most_bytes, _resolved, capacity
from kv_cache.tiers.posix_io import CHUNK, drop_cached, pwrite_all
from kv_cache.tiers.slots import runs


class _Slab(Target):
    """One preallocated slab file and, for an engine that maps, its mapping."""

    def __init__(self, path: str, size: int, engine: Engine):
        self.size = size
        super().__init__(path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | engine.open_flags, 0o600))
        try:
            os.posix_fallocate(self.fd, 0, size)
        except OSError as e:
            # NOTE: ext4 may allocate all the free space before it answers ENOSPC: remove the file.
            os.close(self.fd)
            os.unlink(path)
            raise UserError(f"cannot preallocate {size / 2**30:.2f} GiB for {path} ({e.strerror}); "
                            f"free space there or lower --nvme-gb.") from None
        if engine.maps:
            self.mm = mmap.mmap(self.fd, size)
            # NOTE: a fault reads its one page, not a window around it: the kernel's read-around filled large folios
            # reaching past a block's or an I/O unit's range, which its drop could not evict and its msync wrote
            # whole (--io-unit layer, 64 KiB units, one worker: the disk read 0.28x and wrote 27x the bytes counted)
            self.mm.madvise(mmap.MADV_RANDOM)
            self.view = np.frombuffer(self.mm, dtype=np.uint8)

    def close(self) -> None:
        if self.mm is not None:
            self.view = None
            self.mm.close()
        os.close(self.fd)


class NvmeTier(BlockFiles, SlottedTier):
    """Storage tier in a directory; see the module docstring for layouts and engines."""

    name = "nvme"

    def __init__(self, directory: str, capacity_bytes: int, slot_bytes: int, engine: Engine,
                 layout: str = "slab", slab_file_bytes: int = 4 << 30, engine_note: str = "", shared: bool = False,
                 writer: str = "0", io_unit_bytes: int = 0, batch: int = 0, lanes: int = 0):
        """batch: the blocks one worker's batch holds (0: none given); lanes: the threads that move batches (the
        workers and the demoter), whose pools are started here, before the clock."""
        super().__init__(capacity_bytes // slot_bytes, slot_bytes)
        if shared:
            layout = "file-per-block"  # other processes must find blocks by name
        self.ops, engine = engine, engine.name
        if layout == "file-per-block" and self.ops.maps:
            raise UserError(f"--io-engine {engine} needs --nvme-layout slab (one mapping per slab file)"
                            + (" and --shared-storage needs one file per block." if shared else "."))
        self.directory, self.engine, self.layout, self.writer = directory, engine, layout, writer
        self.flags = frozenset({PRECONDITIONS, STORAGE, SPLITS} | ({SHARED} if shared else set()))
        self.per_file = max(1, slab_file_bytes // slot_bytes)
        # --io-unit layer: every block moves as I/Os of at most io_unit_bytes, each timed (io_times)
        self.unit = io_unit_bytes or CHUNK
        if io_unit_bytes:
            self.flags = self.flags | {IO_UNITS}
        self._ios = threading.local()
        self.pools: Pools | None = None
        self.slabs: list[_Slab] = []
        if layout == "slab":
            self._make_slabs()
        # a synchronous engine's pools (made once the slabs are, so a refused slab starts no thread): a thread for each
        # I/O a worker's batch holds (with layer units, each unit)
        ios = batch * -(-slot_bytes // self.unit)
        threads = min(ios, POOL_MOST, max(POOL_THREADS, POOL_ALL // max(lanes, 1)))
        if self.ops.pooled:
            self.pools = Pools(threads if batch else POOL_THREADS, lanes if batch else 0)
        # the most I/Os a worker's batch keeps in flight here (1: one at a time): the --io-trace fio job's depth
        self.io_depth = max(1, min(ios, threads if self.ops.pooled else self.ops.depth))
        self.flags = self.flags | {BATCHES}  # a batch's I/Os go to the engine together (--io-unit layer: each unit)
        note = f" ({engine_note})" if engine_note else ""
        unit = f", one I/O per {io_unit_bytes / 2**10:,.0f} KiB (layer group)" if io_unit_bytes else ""
        self.description = (f"{engine}{note}, {layout} in {directory}{' (shared by every rank)' if shared else ''}, "
                            f"{slots_of(self.num_slots, slot_bytes)}{unit}")

    def _make_slabs(self) -> None:
        left = self.num_slots
        while left > 0:
            n = min(left, self.per_file)
            path = os.path.join(self.directory, f"slab-{len(self.slabs):04d}.kv")
            self.slabs.append(_Slab(path, n * self.slot_bytes, self.ops))
            left -= n

    # ---------------------------------------------------------------- slab layout

    @property
    def io_unit_bytes(self) -> int | None:
        """results' run.tiers.<tier>.io_unit_bytes: the most bytes one I/O moves with --io-unit layer; None, a
        block an I/O."""
        return self.unit if IO_UNITS in self.flags else None

    def _slab_at(self, slot: int) -> tuple[_Slab, int]:
        return self.slabs[slot // self.per_file], (slot % self.per_file) * self.slot_bytes


    def _pieces(self, target, off: int, view: np.ndarray) -> list:
        """(target, offset, view) of one run of a block's bytes: whole, or with --io-unit layer cut into its units
        (each one I/O of the batch, timed apart as a serial put or get times them) where the engine does not cut
        and time them itself (cuts_units)."""
        if IO_UNITS not in self.flags or self.ops.cuts_units:
            return [(target, off, view)]
        return [(target, off + o, view[o:o + self.unit]) for o in range(0, view.size, self.unit)]

    # ---------------------------------------------------------------- tier protocol

    def _times(self) -> list | None:
        return self._ios.times if IO_UNITS in self.flags else None

    def _new_times(self) -> None:
        """--io-unit layer: this thread's next put or get records its I/Os afresh (nothing to do otherwise)."""
        if IO_UNITS in self.flags:
            self._ios.times = []

    def io_times(self) -> list[tuple[int, int]]:
        return getattr(self._ios, "times", [])

    def put(self, key: int, buf: np.ndarray) -> None:
        self._new_times()
        slots = self.slots.alloc(key, buf.size)
        try:
            if self.layout == "file-per-block":
                self._file_write(key, buf)
                return
            for first, pos, length in runs(slots, buf.size, self.slot_bytes, self.per_file):
                slab, off = self._slab_at(first)
                self.ops.write(slab, off, buf[pos:pos + length], self.unit, self._times())
        except BaseException:
            self.slots.release(key)
            raise

    def batch_path(self) -> str:
        files = ", each block's file opened before the batch and closed after it" \
            if self.layout == "file-per-block" else ""
        units = ", every layer group's I/O of every block in it, each timed" if IO_UNITS in self.flags else ""
        pool = f" ({self.pools.threads} threads: as many I/Os in flight)" if self.pools is not None else ""
        return f"the {self.engine} engine's: {self.ops.batch}{pool}{files}{units}"

    def put_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        """A batch of blocks into their slabs or files, every block's I/Os handed to the engine at once (its batch
        path)."""
        if BATCHES not in self.flags:
            return super().put_many(items)
        taken, out = [], [None] * len(items)
        for n, (key, buf) in enumerate(items):
            try:
                taken.append((n, self.slots.alloc(key, buf.size)))
            except Exception as e:  # noqa: BLE001 - this block's result (no room, a key twice)
                out[n] = e
        if self.layout == "file-per-block":
            written = self._files_many([(n, items[n][0], items[n][1]) for n, _ in taken], self._create,
                                       self.ops.write_many, out)
            for n, key, t in written:
                try:
                    self._publish(key, t)
                except OSError as e:
                    out[n] = RunFault(f"cannot rename {t.path} to {self._file(key)}: {e.strerror}.")
        else:
            ios, owner = self._ios_of([(items[n][1], slots, items[n][1].size) for n, slots in taken])
            self._moved(self.ops.write_many, ios, owner, [n for n, _ in taken], out)
        for n, res in enumerate(out):
            if isinstance(res, BaseException) and n in dict(taken):
                self.slots.release(items[n][0])
        return out

    def get_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        if BATCHES not in self.flags or SHARED in self.flags:
            return super().get_many(items)
        found, out = [], [None] * len(items)
        for n, (key, buf) in enumerate(items):
            try:
                slots, nbytes = self.slots.lookup(key)
                found.append((n, (buf, slots, nbytes)))
            except Exception as e:  # noqa: BLE001 - this block's result
                out[n] = e
        if self.layout == "file-per-block":
            self._files_many([(n, items[n][0], buf[:nbytes]) for n, (buf, _, nbytes) in found], self._open,
                             self.ops.read_many, out)
            return out
        ios, owner = self._ios_of([b for _, b in found])
        self._moved(self.ops.read_many, ios, owner, [n for n, _ in found], out)
        return out

    def _ios_of(self, blocks: list) -> tuple[list, list[int]]:
        """(slab, offset, view) of each run (or unit) of each (buffer, slots, nbytes), and the block each belongs
        to."""
        ios, owner = [], []
        for b, (buf, slots, nbytes) in enumerate(blocks):
            for first, pos, length in runs(slots, nbytes, self.slot_bytes, self.per_file):
                slab, off = self._slab_at(first)
                for io in self._pieces(slab, off, buf[pos:pos + length]):
                    ios.append(io)
                    owner.append(b)
        return ios, owner

    def _moved(self, verb, ios: list, owner: list[int], index: list[int], out: list) -> None:
        """ios through the engine's batch verb (write_many or read_many); a block's result: its last I/O's
        completion, or the first exception among its I/Os; with --io-unit layer each of its units' completion too
        (batch_io_times): as the engine timed them where it cuts them itself, else each I/O the tier cut."""
        timed = IO_UNITS in self.flags
        cut = [] if timed and self.ops.cuts_units else None
        done = (verb(ios, self.unit, self.pools) if cut is None else verb(ios, self.unit, self.pools, cut)) \
            if ios else []
        units: list[list[tuple[int, int]]] = [[] for _ in out] if timed else []
        for j, (res, b) in enumerate(zip(done, owner)):
            n = index[b]
            was = out[n]
            if isinstance(was, BaseException):
                continue
            if isinstance(res, BaseException):
                out[n] = res
                continue
            if was is None or res > was:
                out[n] = res
            if timed:
                units[n] += cut[j] if cut is not None else [(res, ios[j][2].size)]
        if timed:
            self._ios.batch = [[] if isinstance(r, BaseException) else u for r, u in zip(out, units)]

    def batch_io_times(self) -> list[list[tuple[int, int]]]:
        return getattr(self._ios, "batch", [])

    def adopt(self, key: int) -> int | None:
        """Size of a block another process published in this shared tier, or None."""
        try:
            return os.stat(self._file(key)).st_size
        except FileNotFoundError:
            return None

    def get(self, key: int, out: np.ndarray) -> None:
        self._new_times()
        if SHARED in self.flags and key not in self.slots:  # another rank's block: its size is out's
            self._file_read(key, out)
            return
        slots, nbytes = self.slots.lookup(key)
        if self.layout == "file-per-block":
            self._file_read(key, out[:nbytes])
            return
        for first, pos, length in runs(slots, nbytes, self.slot_bytes, self.per_file):
            slab, off = self._slab_at(first)
            self.ops.read(slab, off, out[pos:pos + length], self.unit, self._times())

    def delete(self, key: int) -> None:
        self.slots.release(key)
        if self.layout == "file-per-block":
            try:
                os.unlink(self._file(key))
            except FileNotFoundError:
                pass

    def precondition(self, passes: int, steady: float = 0.0, on_pass=None, chunk_bytes: int = 16 << 20) -> dict:
        """Write the tier's whole space sequentially, pass after pass (SNIA's workload-independent
        preconditioning); with steady > 0, go on (at most 10 passes) until the last 3 passes' bandwidth
        is within steady x their mean. Returns the passes' GB/s and whether a steady state was reached.
        """
        buf = aligned_buffer(chunk_bytes)
        buf.view(np.uint64)[:] = np.random.default_rng(0x5EED).integers(0, 2**63, buf.size // 8, dtype=np.uint64)
        rounds: list[float] = []
        limit = max(passes, 10) if steady else passes
        while len(rounds) < limit:
            start = time.perf_counter()
            written = self._fill_once(buf)
            rounds.append(written / (time.perf_counter() - start) / 1e9)
            if on_pass:
                on_pass(len(rounds), rounds[-1], written)
            window = rounds[-3:]
            if len(rounds) >= passes and (not steady or (len(window) == 3 and
                                                         max(window) - min(window) <= steady * sum(window) / 3)):
                break
        window = rounds[-3:]
        is_steady = len(window) == 3 and max(window) - min(window) <= steady * sum(window) / 3 if steady else None
        return {"passes": len(rounds), "gbps": rounds, "bytes_per_pass": self.capacity_bytes, "steady": is_steady,
                "steady_tolerance": steady or None, "tier": self.name}

    def _fill_once(self, buf: np.ndarray) -> int:
        """One sequential pass over the tier's space; in file-per-block layout a scratch file as large."""
        written = 0
        targets = [(slab.fd, slab.path, slab.size) for slab in self.slabs]
        scratch = None
        if not targets:
            scratch = os.path.join(self.directory, "precondition.tmp")
            fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | self.ops.open_flags, 0o600)
            targets = [(fd, scratch, self.capacity_bytes)]
        try:
            for fd, path, size in targets:
                for off in range(0, size, buf.size):
                    n = min(buf.size, size - off)
                    pwrite_all(fd, buf[:n], off, path)
                    written += n
                os.fsync(fd)
                drop_cached(fd, 0, size)  # a page-cache engine's pass left it cached, in folios larger than a block
        finally:
            if scratch is not None:
                os.close(targets[0][0])
                os.unlink(scratch)
        return written

    def close(self, remove: bool = True) -> None:
        if self.pools is not None:
            self.pools.close()
        for slab in self.slabs:
            slab.close()
        self.slabs = []
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)


def contract(engines: dict) -> tuple[str, ...]:
    """engine/layout of every engine found (a mapping engine has the slab layout alone)."""
    return tuple(f"{e}/{lay}" for e in engines for lay in ("slab", "file-per-block")
                 if not (engines[e].maps and lay != "slab"))


def make_for_test(variant: str, directory: str, capacity_bytes: int, slot_bytes: int, server=None,
                  engines=None) -> NvmeTier | None:
    """The contract test's tier: engine/layout, two slots per slab file so objects cross file boundaries (None:
    the engine cannot run on this host, said by its unavailable())."""
    engine, layout = variant.split("/")
    if engines[engine].unavailable():
        return None
    return NvmeTier(directory, capacity_bytes, slot_bytes, engines[engine], layout, slab_file_bytes=2 * slot_bytes)


def build(ctx: StackContext) -> tuple[SlottedTier | None, str]:
    """The local disk tier; under --null-io the null tier of --nvme-gb (the policies' and hit rates' tests)."""
    s, slot, site = ctx.settings, ctx.slot_bytes, ctx.site
    if s.nvme == "off":
        return None, "NVMe tier off (--nvme off)."
    if ctx.null_io:
        cap = capacity_of(s.nvme_gb, slot) if s.nvme_gb else NVME_AUTO_MAX
        return NullTier("nvme", max(cap, slot), slot), ""
    free = shutil.disk_usage(site.cache_dir).free
    cap, said = capacity(s, site, slot, ctx.max_object_bytes, free)
    note = "" if s.nvme_gb else (f"nvme tier size chosen: {cap / GiB:.2f} GiB = {said}; --nvme-gb fixes it "
                                 f"(settings.yaml records it)")
    return NvmeTier(site.data_dir, cap, slot, ctx.engines[site.engine], s.nvme_layout, int(s.slab_file_gb * GiB),
                    site.engine_note, s.shared_storage, ctx.writer, ctx.io_unit_bytes, ctx.batch, ctx.lanes), note



def _shared_files(engine: Engine, slot_bytes: int, name: str):
    def open_blocks(directory: str, capacity_bytes: int, writer: str):
        tier = NvmeTier(directory, max(capacity_bytes, slot_bytes), slot_bytes, engine, shared=True, writer=writer)
        tier.name = name
        return tier
    return open_blocks


MEDIUM = TierKind("nvme", 2, build, most_bytes=_most_bytes, resolved=_resolved, contract=contract,
                  make_for_test=make_for_test, agree=_agree, shared_files=_shared_files)
