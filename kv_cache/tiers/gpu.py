"""GPU HBM tier: preallocated device slabs of fixed slots, over one or more GPUs.

Everything that allocates happens before the clock starts: one device slab
per GPU, and one *lane* per worker — a stream per GPU and a pinned staging
buffer of the largest block. A worker takes its lane on its first transfer
(no allocation then). Slot s lives on GPU s mod N (blocks spread over the
devices; consecutive slots alternate).

A put copies host -> device on the worker's own stream(s) and waits for
those streams only; a get copies device -> host the same way. A host buffer
registered as pinned (before the clock: the workers' block and move buffers,
the CPU tier's arena and the payload pool, see ``pin_host``) is copied
directly, and a demotion lands straight in the CPU tier's slots; any other
goes through the lane's pinned staging buffer, that host copy inside the
timed operation, and is counted as staged (``transfers``). The cache
times each operation from issue to the completion of its own stream(s): no
device-wide synchronisation anywhere.

In the paged layout (paged.py, --gpu-layout) the slabs are replaced by the
engine's per-layer tensors and every copy above moves a block's pieces by
the copy method (a kernel, a batch of copies, or a copy per piece).
"""

from __future__ import annotations

import time
from bisect import bisect_right

import numpy as np

from kv_cache.buffers import address
from kv_cache.errors import UserError
from kv_cache.tiers.base import BATCHES, HOST_SLOTS, PINS_HOST, PerThread, SlottedTier, one_by_one, slots_of
from kv_cache.tiers.devices import D2H, H2D, check_fits
from kv_cache.tiers.kinds import GiB, StackContext, TierKind, capacity_of, holds_no_slot
from kv_cache.tiers.null import NullTier
from kv_cache.tiers.paged import KERNEL_BLOCKS, PagedHbm, Paging
from kv_cache.tiers.simulated import SimulatedTier


class _Lane:
    __slots__ = ("streams", "staging", "staging_addr", "counts", "scratch", "stage")

    def __init__(self, backend, devices: list[int], staging_bytes: int, kernel: bool, stage_bytes: int):
        self.streams = [backend.stream(d) for d in devices]
        self.staging = backend.alloc_pinned(staging_bytes)
        self.staging_addr = self.staging.ctypes.data
        self.counts = [0, 0, 0, 0]  # host -> HBM direct, staged; HBM -> host direct, staged (this lane's thread only)
        # the paged kernel's descriptors, per device (--gpu-copy kernel only), and its HBM staging where used
        self.scratch = [backend.kernel_scratch(d, KERNEL_BLOCKS) for d in devices] if kernel else []
        self.stage = [backend.alloc_device(d, stage_bytes) for d in devices] if stage_bytes else []


H2D_DIRECT, H2D_STAGED, D2H_DIRECT, D2H_STAGED = range(4)


class GpuTier(SlottedTier):
    name = "gpu"
    flags = frozenset({PINS_HOST, BATCHES})

    def __init__(self, backend, capacity_bytes: int, slot_bytes: int, devices: list[int], lanes: int,
                 staging_bytes: int, paging: Paging | None = None):
        super().__init__(capacity_bytes // slot_bytes, slot_bytes)
        self.backend, self.devices, self.paging = backend, devices, paging
        n = len(devices)
        per_device = [-(-(self.num_slots - i) // n) for i in range(n)]
        if paging is None:
            self.slabs, self.hbm = [backend.alloc_device(d, k * slot_bytes) for d, k in zip(devices, per_device)], None
        else:  # the engine's per-layer tensors instead of slabs
            why = backend.copy_why_not(paging.copy)
            if why:
                raise UserError(why + ".")
            self.slabs, self.hbm = [], PagedHbm(backend, paging, devices, per_device)
        self._one = n == 1 and paging is None
        self._bases = [backend.address(slab) for slab in self.slabs]
        kernel, stage = paging is not None and paging.copy == "kernel", paging.stage_bytes() if paging else 0
        self._lanes = [_Lane(backend, devices, staging_bytes, kernel, stage) for _ in range(lanes)]
        self.lanes = PerThread(self._lanes, "the GPU tier's lanes")
        # page-locked host ranges, sorted by start, for a bisect per transfer (a list scan cost ~5 us at 70)
        self._pinned_lo: list[int] = []
        self._pinned_hi: list[int] = []
        self._owned: list[np.ndarray] = []  # what this tier registered itself, and so unregisters
        self.staged_why = ""  # the first staged transfer's buffer, said in the results
        models = sorted({backend.model(d) for d in devices})
        self.description = (f"{backend.name}: {n} x {', '.join(models)}, "
                            f"{slots_of(self.num_slots, slot_bytes)}, {lanes} lanes (stream per GPU + pinned staging)"
                            + (f"; {paging.describe()}" if paging else "; contiguous slots"))

    # ---------------------------------------------------------------- host memory and lanes

    def pin_host(self, arr: np.ndarray) -> None:
        """Make a long-lived host buffer a direct DMA source and target (no staging copy): register it, unless
        it is page-locked already (a pinned allocation: registering it again is a CUDA error)."""
        if not arr.nbytes:
            return
        if not self.backend.is_pinned(arr):
            self.backend.register_host(arr)
            self._owned.append(arr)
        lo = arr.ctypes.data
        i = bisect_right(self._pinned_lo, lo)
        self._pinned_lo.insert(i, lo)
        self._pinned_hi.insert(i, lo + arr.nbytes)

    def _is_pinned(self, addr: int, nbytes: int) -> bool:
        i = bisect_right(self._pinned_lo, addr) - 1
        return i >= 0 and addr + nbytes <= self._pinned_hi[i]

    def _lane(self) -> _Lane:
        return self.lanes.mine()

    def _place(self, slot: int) -> tuple[int, int]:
        """(device index, byte offset in its slab) of a slot."""
        n = len(self.devices)
        return slot % n, (slot // n) * self.slot_bytes

    def _split(self, addr: int, nbytes: int, nslots: int) -> list[tuple[int, int]]:
        """A contiguous host range cut at slot boundaries: (address, length) per slot."""
        if nslots == 1:
            return [(addr, nbytes)]
        sb = self.slot_bytes
        return [(addr + i * sb, min(sb, nbytes - i * sb)) for i in range(nslots)]

    def _copy(self, kind: int, slots: list[int], pieces: list[tuple[int, int]], lane: _Lane) -> None:
        """One copy per slot on this lane's stream(s), then wait for those streams only.

        NOTE: by address, computed once per transfer: a numpy view and its .ctypes per piece cost about a
        microsecond each, the largest part of a small block's fixed cost (0.5 MiB moves in ~20 us over PCIe 5).
        """
        if self._one:  # one device, contiguous: no placement arithmetic, one stream to wait for
            copy, sb, base, stream = self.backend.copy_ptr, self.slot_bytes, self._bases[0], lane.streams[0]
            for slot, (addr, n) in zip(slots, pieces):
                copy(kind, base + slot * sb, addr, n, stream)
            self.backend.sync(stream)
            return
        used: set = set()
        self._queue(kind, [(slots, pieces)], lane, used)
        for d in used:
            self.backend.sync(lane.streams[d])

    def _queue(self, kind: int, blocks: list[tuple[list[int], list[tuple[int, int]]]], lane: _Lane,
               used: set) -> None:
        """Each block's copies (its slots, its host pieces) queued on this lane's stream(s), not waited for; used
        gets the devices touched."""
        if self.hbm is not None:
            self.hbm.move(kind == H2D, blocks, lane, used)
            return
        copy = self.backend.copy_ptr
        for slots, pieces in blocks:
            for slot, (addr, n) in zip(slots, pieces):
                d, off = self._place(slot)
                copy(kind, self._bases[d] + off, addr, n, lane.streams[d])
                used.add(d)

    def batch_path(self) -> str:
        return ("every block's copies queued on the worker's stream, synchronised once per batch (a block from a "
                "host buffer that is not page-locked goes alone, through the lane's staging buffer)")

    def get_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        return self._many(D2H, items)

    def put_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        return self._many(H2D, items)

    def _many(self, kind: int, items: list) -> list:
        """A batch of direct copies queued together and synchronised once (each block completes at that sync, as
        an engine's batch does); a staged block, or one the slots refuse, goes alone."""
        lane, out, queued, todo = self._lane(), [None] * len(items), [], []
        put, direct = kind == H2D, H2D_DIRECT if kind == H2D else D2H_DIRECT
        for n, (key, buf) in enumerate(items):
            try:
                slots, nbytes = (self.slots.alloc(key, buf.size), buf.size) if put else self.slots.lookup(key)
            except Exception as e:  # noqa: BLE001 - this block's result
                out[n] = e
                continue
            addr = address(buf)  # NOTE: once a block (buffers.address: a third of .ctypes.data's cost)
            if not self._is_pinned(addr, nbytes):
                if put:
                    self.slots.release(key)
                out[n] = one_by_one(self.put if put else self.get, [(key, buf)])[0]
                continue
            lane.counts[direct] += 1
            todo.append((slots, self._split(addr, nbytes, len(slots))))
            queued.append(n)
        undo = (lambda key: self.slots.release(key)) if put else (lambda key: None)
        return self._together(kind, lane, todo, queued, out, [items[n][0] for n in queued], undo)

    def _together(self, kind: int, lane: _Lane, todo: list, queued: list[int], out: list, keys: list[int],
                  undo) -> list:
        """Queue a batch's copies (todo: each block's slots and host pieces) and synchronise once: each queued
        block's result (out[n]) is that sync's time, or, should the copies fail, their error (undo(key) each)."""
        used: set = set()
        try:
            self._queue(kind, todo, lane, used)
            for d in used:
                self.backend.sync(lane.streams[d])
        except Exception as e:  # noqa: BLE001 - the batch's copies failed together
            for n, key in zip(queued, keys):
                out[n] = e
                undo(key)
            return out
        done = time.monotonic_ns()
        for n in queued:
            out[n] = done
        return out

    def _staged(self, lane: _Lane, which: int, nbytes: int, direction: str) -> None:
        lane.counts[which] += 1
        if not self.staged_why:
            self.staged_why = (f"{direction}: a {nbytes / 2**20:.2f} MiB host buffer that is not page-locked "
                               f"(the workers' buffers, the CPU tier's arena and the payload pool are registered; "
                               f"this one is not among them)")

    # ---------------------------------------------------------------- tier protocol

    def put(self, key: int, buf: np.ndarray) -> None:
        lane = self._lane()
        slots = self.slots.alloc(key, buf.size)
        try:
            addr, nbytes = address(buf), buf.size
            if self._is_pinned(addr, nbytes):
                lane.counts[H2D_DIRECT] += 1
            else:
                self._staged(lane, H2D_STAGED, nbytes, "host -> HBM")
                np.copyto(lane.staging[:nbytes], buf)
                addr = lane.staging_addr
            self._copy(H2D, slots, self._split(addr, nbytes, len(slots)), lane)
        except BaseException:
            self.slots.release(key)
            raise

    def get(self, key: int, out: np.ndarray) -> None:
        slots, nbytes = self.slots.lookup(key)
        lane = self._lane()
        addr = out.ctypes.data
        if self._is_pinned(addr, nbytes):
            lane.counts[D2H_DIRECT] += 1
            self._copy(D2H, slots, self._split(addr, nbytes, len(slots)), lane)
            return
        self._staged(lane, D2H_STAGED, nbytes, "HBM -> host")
        self._copy(D2H, slots, self._split(lane.staging_addr, nbytes, len(slots)), lane)
        np.copyto(out[:nbytes], lane.staging[:nbytes])

    def move_to(self, key: int, dst) -> bool:
        """Demote a block straight into a host tier's slots (one D2H copy into its registered arena, as an
        offloading engine's pinned CPU pool takes it); False for any other tier (the cache copies then)."""
        if HOST_SLOTS not in dst.flags:
            return False
        slots, nbytes = self.slots.lookup(key)
        views = dst.alloc_views(key, nbytes)
        try:
            lane = self._lane()
            pieces = [(address(v), v.nbytes) for v in views]
            if all(self._is_pinned(a, n) for a, n in pieces):
                lane.counts[D2H_DIRECT] += 1
                self._copy(D2H, slots, pieces, lane)
            else:
                self._staged(lane, D2H_STAGED, nbytes, "HBM -> host")
                self._copy(D2H, slots, self._split(lane.staging_addr, nbytes, len(slots)), lane)
                pos = 0
                for v in views:
                    np.copyto(v, lane.staging[pos:pos + v.nbytes])
                    pos += v.nbytes
        except BaseException:
            dst.release(key)
            raise
        return True

    def move_many_to(self, items: list[tuple[int, int]], dst) -> list | None:
        """A batch's demotions straight into a host tier's slots: every block's D2H copies queued on the worker's
        stream(s) and synchronised once (one offload job, as vLLM's connector submits a request's blocks); a block
        whose slots are not page-locked goes alone (move_to). None for any other tier."""
        if HOST_SLOTS not in dst.flags:
            return None
        lane, out, todo, queued = self._lane(), [None] * len(items), [], []
        for n, (key, _) in enumerate(items):
            try:
                slots, nbytes = self.slots.lookup(key)
                pieces = [(address(v), v.nbytes) for v in dst.alloc_views(key, nbytes)]
            except Exception as e:  # noqa: BLE001 - this block's result
                out[n] = e
                continue
            if not all(self._is_pinned(a, m) for a, m in pieces):
                dst.release(key)
                out[n] = one_by_one(lambda k, _: self.move_to(k, dst), [(key, None)])[0]
                continue
            lane.counts[D2H_DIRECT] += 1
            todo.append((slots, pieces))
            queued.append(n)
        return self._together(D2H, lane, todo, queued, out, [items[n][0] for n in queued], dst.release)

    def transfers(self) -> dict[str, dict[str, int]]:
        """Host <-> HBM copies of the whole run: direct (a page-locked host buffer) or staged (through a lane's
        pinned buffer plus a host copy, inside the timed operation)."""
        c = [sum(lane.counts[i] for lane in self._lanes) for i in range(4)]
        return {"host_to_device": {"direct": c[H2D_DIRECT], "staged": c[H2D_STAGED]},
                "device_to_host": {"direct": c[D2H_DIRECT], "staged": c[D2H_STAGED]}}

    def put_from_device(self, key: int, src, nbytes: int) -> None:
        """Store a block that is already in device memory (a GDS landing buffer): device -> device copies."""
        lane = self._lane()
        slots = self.slots.alloc(key, nbytes)
        try:
            if self.hbm is not None:  # scattered into the layer tensors, device to device
                self._copy(H2D, slots, [(self.backend.address(src), nbytes)], lane)
                return
            used = set()
            for i, slot in enumerate(slots):
                d, off = self._place(slot)
                self.backend.copy_device(self.slabs[d], off, src, i * self.slot_bytes,
                                         min(self.slot_bytes, nbytes - i * self.slot_bytes), lane.streams[d])
                used.add(d)
            for d in used:
                self.backend.sync(lane.streams[d])
        except BaseException:
            self.slots.release(key)
            raise

    def gather_to_device(self, key: int, dst) -> int:
        """Gather a block's pieces into a device buffer (a GDS write's staging, as LMCache's GDS backend does);
        its bytes."""
        slots, nbytes = self.slots.lookup(key)
        self._copy(D2H, slots, [(self.backend.address(dst), nbytes)], self._lane())
        return nbytes

    def hbm_layout(self) -> dict:
        return self.paging.as_dict() if self.paging else {"kind": "contiguous"}

    def delete(self, key: int) -> None:
        self.slots.release(key)

    def close(self, remove: bool = True) -> None:
        for arr in self._owned:
            self.backend.unregister_host(arr)
        self._owned, self._pinned_lo, self._pinned_hi = [], [], []
        for d, slab in zip(self.devices, self.slabs):
            self.backend.free(d, slab)
        self.slabs = []
        for lane in self._lanes:
            for d, stage in zip(self.devices, lane.stage):
                self.backend.free(d, stage)
            lane.stage = []
        if self.hbm is not None:
            self.hbm.free(self.devices)


def _most_bytes(s) -> int:
    return 0 if s.gpu == "off" else int(s.gpu_mem_gb * GiB)


def make_for_test(variant: str, directory: str, capacity_bytes: int, slot_bytes: int, server=None, engines=None):
    """simulated (the bandwidth model), fake1 / fake2 (GpuTier over one or two fake devices), cupy (a real one,
    or None when there is none: the test skips)."""
    if variant == "simulated":
        return SimulatedTier("gpu", capacity_bytes, slot_bytes, gbps=100.0)
    from kv_cache.tiers.devices import FakeDevice, open_cupy

    backend = open_cupy()[0] if variant == "cupy" else FakeDevice(count=int(variant[-1]))
    if backend is None:
        return None
    devices = list(range(1 if variant == "cupy" else backend.count()))
    return GpuTier(backend, capacity_bytes, slot_bytes, devices, lanes=4, staging_bytes=4 * slot_bytes)


def build(ctx: StackContext) -> tuple[SlottedTier | None, str]:
    """HBM: simulated (a bandwidth model, labelled), real (CuPy found a device), or off with the reason."""
    s, slot = ctx.settings, ctx.slot_bytes
    want = int(s.gpu_mem_gb * GiB)
    if s.gpu_mem_gb and want < slot and (s.gpu == "simulated" or ctx.gpu is not None):
        raise UserError(holds_no_slot("--gpu-mem-gb", s.gpu_mem_gb, slot, "GPU"))
    if s.gpu == "simulated" and want >= slot:
        note = (f"--gpus {s.gpus} is ignored: the simulated GPU tier models one pool of {s.gpu_mem_gb:g} GiB."
                if s.gpus != 1 else "")
        if ctx.null_io:
            return NullTier("gpu", want, slot), note
        return SimulatedTier("gpu", want, slot, s.gpu_sim_gbps, ctx.payloads), note
    if ctx.gpu is None:
        return None, ""
    if not want:
        return None, "GPU tier off: --gpu-mem-gb 0."
    count = ctx.gpu.count()
    n = s.gpus or count
    if n > count:
        raise UserError(f"--gpus {n} asks for more GPUs than the {count} CuPy sees; lower --gpus.")
    devices = list(range(n))
    total = capacity_of(s.gpu_mem_gb, slot)
    stages = ctx.lanes * ctx.paging.stage_bytes() if ctx.paging else 0  # --gpu-kernel-path hbm's staging
    check_fits(ctx.gpu, devices, -(-total // n), stages)
    return (GpuTier(ctx.gpu, total, slot, devices, ctx.lanes, ctx.io_bytes or ctx.max_object_bytes, ctx.paging),
            ctx.paging_note)


MEDIUM = TierKind("gpu", 0, build, most_bytes=_most_bytes, contract=("simulated", "fake1", "fake2", "cupy"),
                  make_for_test=make_for_test)
