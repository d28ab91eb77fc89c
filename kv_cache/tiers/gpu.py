"""GPU HBM tier: preallocated device slabs of fixed slots, over one or more GPUs.

Everything that allocates happens before the clock starts: one device slab
per GPU, and one *lane* per worker — a stream per GPU and a pinned staging
buffer of the largest block. A worker takes its lane on its first transfer
(no allocation then). Slot s lives on GPU s mod N (blocks spread over the
devices; consecutive slots alternate).

A put copies host -> device on the worker's own stream(s) and waits for
those streams only; a get copies device -> host the same way. A host buffer
registered as pinned (the workers' block and move buffers are, see
``pin_host``) is copied directly; any other goes through the lane's pinned
staging buffer, and that host copy is inside the timed operation. The cache
times each operation from issue to the completion of its own stream(s): no
device-wide synchronisation anywhere.
"""

from __future__ import annotations

import numpy as np

from kv_cache.errors import UserError
from kv_cache.tiers.base import DEVICE_MEMORY, PINS_HOST, PerThread, SlottedTier
from kv_cache.tiers.devices import D2H, H2D, check_fits
from kv_cache.tiers.null import NullTier
from kv_cache.tiers.registry import GiB, StackContext, capacity_of, holds_no_slot, register
from kv_cache.tiers.simulated import SimulatedTier


class _Lane:
    __slots__ = ("streams", "staging")

    def __init__(self, backend, devices: list[int], staging_bytes: int):
        self.streams = [backend.stream(d) for d in devices]
        self.staging = backend.alloc_pinned(staging_bytes)


class GpuTier(SlottedTier):
    name = "gpu"
    flags = frozenset({DEVICE_MEMORY, PINS_HOST})

    def __init__(self, backend, capacity_bytes: int, slot_bytes: int, devices: list[int], lanes: int,
                 staging_bytes: int):
        super().__init__(capacity_bytes // slot_bytes, slot_bytes)
        self.backend, self.devices = backend, devices
        n = len(devices)
        self.slabs = [backend.alloc_device(d, -(-(self.num_slots - i) // n) * slot_bytes)
                      for i, d in enumerate(devices)]
        self.lanes = PerThread((_Lane(backend, devices, staging_bytes) for _ in range(lanes)), "the GPU tier's lanes")
        self._pinned: list[tuple[int, int, np.ndarray]] = []  # registered host ranges
        models = sorted({backend.model(d) for d in devices})
        self.description = (f"{backend.name}: {n} x {', '.join(models)}, {self.num_slots} slots of "
                            f"{slot_bytes / 2**20:.2f} MiB, {lanes} lanes (stream per GPU + pinned staging)")

    # ---------------------------------------------------------------- host memory and lanes

    def pin_host(self, arr: np.ndarray) -> None:
        """Register a long-lived host buffer as pinned, so transfers to and from it skip the staging copy."""
        self.backend.register_host(arr)
        self._pinned.append((arr.ctypes.data, arr.ctypes.data + arr.nbytes, arr))

    def _is_pinned(self, arr: np.ndarray) -> bool:
        start = arr.ctypes.data
        return any(lo <= start and start + arr.nbytes <= hi for lo, hi, _ in self._pinned)

    def _lane(self) -> _Lane:
        return self.lanes.mine()

    def _place(self, slot: int) -> tuple[int, int]:
        """(device index, byte offset in its slab) of a slot."""
        n = len(self.devices)
        return slot % n, (slot // n) * self.slot_bytes

    def _copy(self, kind: int, slots: list[int], host: np.ndarray, lane: _Lane) -> None:
        used = set()
        for i, slot in enumerate(slots):
            pos = i * self.slot_bytes
            length = min(self.slot_bytes, host.size - pos)
            if length <= 0:
                break
            d, off = self._place(slot)
            self.backend.copy(kind, self.slabs[d], off, host[pos:pos + length], lane.streams[d])
            used.add(d)
        for d in used:
            self.backend.sync(lane.streams[d])

    # ---------------------------------------------------------------- tier protocol

    def put(self, key: int, buf: np.ndarray) -> None:
        lane = self._lane()
        slots = self.slots.alloc(key, buf.size)
        try:
            src = buf
            if not self._is_pinned(buf):
                src = lane.staging[:buf.size]
                np.copyto(src, buf)
            self._copy(H2D, slots, src, lane)
        except BaseException:
            self.slots.release(key)
            raise

    def get(self, key: int, out: np.ndarray) -> None:
        lane = self._lane()
        slots, nbytes = self.slots.lookup(key)
        view = out[:nbytes]
        if self._is_pinned(view):
            self._copy(D2H, slots, view, lane)
            return
        self._copy(D2H, slots, lane.staging[:nbytes], lane)
        np.copyto(view, lane.staging[:nbytes])

    def put_from_device(self, key: int, src, nbytes: int) -> None:
        """Store a block that is already in device memory (a GDS landing buffer): device -> device copies."""
        lane = self._lane()
        slots = self.slots.alloc(key, nbytes)
        try:
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

    def delete(self, key: int) -> None:
        self.slots.release(key)

    def close(self, remove: bool = True) -> None:
        for _, _, arr in self._pinned:
            self.backend.unregister_host(arr)
        self._pinned = []
        for d, slab in zip(self.devices, self.slabs):
            self.backend.free(d, slab)
        self.slabs = []


def _most_bytes(s) -> int:
    return 0 if s.gpu == "off" else int(s.gpu_mem_gb * GiB)


def make_for_test(variant: str, directory: str, capacity_bytes: int, slot_bytes: int, server=None):
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


@register("gpu", level=0, most_bytes=_most_bytes, contract=("simulated", "fake1", "fake2", "cupy"),
          make_for_test=make_for_test)
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
        return SimulatedTier("gpu", want, slot, s.gpu_sim_gbps, ctx.fill), note
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
    check_fits(ctx.gpu, devices, -(-total // n))
    return GpuTier(ctx.gpu, total, slot, devices, ctx.lanes, ctx.max_object_bytes), ""
