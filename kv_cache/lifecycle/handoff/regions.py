"""The prefill node's NIXL handoff region: slots of registered memory and their tags, in host memory or in GPU
memory; and what a decode node's results say of the region it reads."""

from __future__ import annotations

import threading

import numpy as np

from kv_cache.buffers import aligned_buffer
from kv_cache.errors import RunFault, UserError
from kv_cache.lifecycle.handoff.agent import ENGINE

H2D = 1  # cudaMemcpyHostToDevice (the device backends' copy kind)


class RegisteredSlots:
    """The prefill node's handoff space in host memory: slots of registered memory and their tags (the blocks
    interface the space uses: put, delete, slots_for, slot_bytes, capacity_bytes; and where, for the manifest)."""

    engine, name, flags = ENGINE, "handoff", frozenset()
    region_mem, region_dev = "DRAM", 0  # what a decode node's READ names as the remote memory
    memory = place = "host memory"  # place: the short name

    def __init__(self, agent, capacity_bytes: int, slot_bytes: int):
        self.slot_bytes = slot_bytes
        self.nslots = max(capacity_bytes // slot_bytes, 1)
        self.capacity_bytes = self.nslots * slot_bytes
        self.agent = agent
        self.tags = np.zeros(self.nslots, np.uint64)
        self.regs = [agent.register_memory([(self.tags.ctypes.data, self.tags.nbytes, 0, "")], "DRAM")]
        self.region_addr = self._region()
        try:
            self.regs.append(agent.register_memory([(self.region_addr, self.capacity_bytes, self.region_dev, "")],
                                                   self.region_mem))
        except Exception as e:  # NIXL raises its own types (nixlBackendError ...)
            self.close()
            if self.region_mem != "VRAM":
                raise
            raise UserError(f"NIXL could not register the handoff region in {self.place} ({type(e).__name__}: "
                            f"{str(e).strip()[:80]}): its UCX has no transport to GPU memory on this host "
                            f"(nixl-cu12's UCX needs CUDA 12 libraries); use --disagg-handoff-memory host.") from None
        self.tags_addr = self.tags.ctypes.data
        self.free = list(range(self.nslots - 1, -1, -1))
        self.slot_of: dict[int, int] = {}
        self.lock = threading.Lock()
        self.description = (f"registered {self.memory} read by decode nodes with NIXL (UCX), {self.nslots} slots "
                            f"of {slot_bytes / 2**20:.2f} MiB")


    def _region(self) -> int:
        self.region = aligned_buffer(self.capacity_bytes)
        return self.region.ctypes.data

    def slots_for(self, nbytes: int) -> int:
        if nbytes > self.slot_bytes:
            raise RunFault(f"a block of {nbytes} bytes exceeds the handoff slot of {self.slot_bytes}.")
        return 1

    def put(self, key: int, data) -> None:
        with self.lock:
            slot = self.free.pop()
            self.slot_of[key] = slot
        self.tags[slot] = 0  # 0 while the bytes are copied in: a reader whose stamps differ then sees a reuse
        self._copy_in(slot * self.slot_bytes, data)
        self.tags[slot] = key

    def _copy_in(self, offset: int, data) -> None:
        self.region[offset:offset + data.nbytes] = np.frombuffer(data, np.uint8)

    def delete(self, key: int) -> None:
        with self.lock:
            slot = self.slot_of.pop(key)
            self.free.append(slot)

    def where(self, keys) -> list[int]:
        with self.lock:
            return [self.slot_of.get(k, -1) for k in keys]

    def close(self, remove: bool = True) -> None:
        for reg in self.regs:
            self.agent.deregister_memory(reg)
        self.regs = []
        self._wipe()

    def _wipe(self) -> None:
        self.region[:] = 0  # nothing of the run's blocks stays in memory a later owner of these pages could read


class DeviceSlots(RegisteredSlots):
    """The handoff space in GPU memory (NIXL VRAM): each block is copied in from the worker's host buffer with
    one H2D copy on this space's stream, and decode nodes READ it from HBM (GPUDirect RDMA where UCX has it).
    backend: the GPU tier's device backend (CuPy, or the fake device in tests, whose "HBM" is host memory and
    is registered as such)."""

    def __init__(self, agent, capacity_bytes: int, slot_bytes: int, backend, gpu: int):
        self.backend, self.gpu = backend, gpu
        self.region_mem = getattr(backend, "nixl_mem", "VRAM")
        self.region_dev = gpu if self.region_mem == "VRAM" else 0
        # a slot holds a block gathered (LMCache's transfer channel sends a chunk so): NIXL's descriptors are whole
        # blocks, not the paged layout's pieces
        self.place = f"GPU {gpu}'s memory"
        self.memory = f"GPU {gpu} memory ({backend.model(gpu)}; each slot a gathered block, one descriptor)"
        self.stream = backend.stream(gpu)
        self.copy_lock = threading.Lock()  # one stream: one copy in flight, synchronised before the tag is set
        super().__init__(agent, capacity_bytes, slot_bytes)

    def _region(self) -> int:
        self.region = self.backend.alloc_device(self.gpu, self.capacity_bytes)
        return self.backend.address(self.region)

    def _copy_in(self, offset: int, data) -> None:
        host = np.frombuffer(data, np.uint8)
        with self.copy_lock:
            self.backend.copy_ptr(H2D, self.region_addr + offset, host.ctypes.data, host.nbytes, self.stream)
            self.backend.sync(self.stream)

    def _wipe(self) -> None:
        zeros = np.zeros(min(self.capacity_bytes, 64 * 2**20), np.uint8)
        for off in range(0, self.capacity_bytes, zeros.nbytes):
            self._copy_in(off, zeros[:min(zeros.nbytes, self.capacity_bytes - off)])
        self.backend.free(self.gpu, self.region)

