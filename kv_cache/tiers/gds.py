"""GPUDirect Storage: blocks between the GPU tier's HBM and the NVMe tier's slab files, no host bounce.

With ``--gds`` the cache uses this link for the two moves that cross it:

- a demotion GPU -> NVMe (when the NVMe tier is the next one down, i.e. no CPU
  tier between) writes from the block's device slots straight into its
  NVMe slots (cuFile write); in the paged layout its pieces are first
  gathered into the lane's device landing buffer, then written in one
  cuFile write, as LMCache's GDS backend does;
- a read of a block held by the NVMe tier lands in a device buffer (cuFile
  read): that is the timed operation, as an engine loading KV into HBM would
  do; then, outside the clock, the bytes are copied to the worker's host
  buffer only so that their stamps can be verified; a promotion then moves
  the landed block into GPU slots device to device.

Under ``--request-io batched`` both go a batch at a time (``demote_many``,
``load_many``): every block's cuFile I/Os submitted together (kvikio's
futures, then each waited for), each block of the window in a device
buffer of its own (a read's landing buffer, kept for its promotion; a
paged demotion's gather buffer), each block's completion its own.

The backend does the file I/O (devices.py: kvikio's CuFile on a real GPU,
O_DIRECT from host memory on the fake device of the tests) and says which
path really ran: cuFile, or kvikio's compatibility mode (POSIX I/O through
host bounce buffers, which is not GPUDirect). Both tiers must use the same
slot size and the NVMe tier the direct engine with the slab layout.
"""

from __future__ import annotations

import threading

from kv_cache.errors import UserError
from kv_cache.tiers.base import PerThread
from kv_cache.tiers.devices import D2H


class GdsLink:
    """The NVMe <-> HBM path of one GPU tier and one NVMe tier, with device buffers per lane (buffer_bytes)."""

    def __init__(self, backend, gpu, nvme, lanes: int, max_bytes: int, window: int = 1):
        """window: the most blocks of a batch read or written together (--request-io batched's depth; 1: serial)."""
        if nvme.layout != "slab" or not nvme.ops.direct:
            raise UserError(f"--gds moves blocks between HBM and the NVMe tier's slab files with O_DIRECT; use "
                            f"--io-engine direct and --nvme-layout slab (not {nvme.engine}, {nvme.layout}).")
        if gpu.slot_bytes != nvme.slot_bytes:
            raise ValueError("the GPU and NVMe tiers must share one slot size")
        self.backend, self.gpu, self.nvme = backend, gpu, nvme
        self.mode = backend.gds_mode()
        self.handles = [backend.open_file(slab.path) for slab in nvme.slabs]
        self.landing = PerThread((backend.alloc_device(gpu.devices[0], max_bytes) for _ in range(lanes)),
                                 "GDS landing buffers")
        # a batch's demotions in the paged layout gather into buffers of their own, a window at a time (the landing
        # buffer keeps the block a read left there for its promotion)
        self.window = max(1, window)
        self.gathers = None if gpu.hbm is None or self.window < 2 else PerThread(
            ([backend.alloc_device(gpu.devices[0], max_bytes) for _ in range(self.window)] for _ in range(lanes)),
            "GDS gather buffers")
        # a batch's reads land in buffers of their own, one a block of the window, kept until the window's promotions
        self.arrivals = None if self.window < 2 else PerThread(
            ([backend.alloc_device(gpu.devices[0], max_bytes) for _ in range(self.window)] for _ in range(lanes)),
            "GDS batch landing buffers")
        self._local = threading.local()  # which block each of this thread's landing buffers holds (_held)
        self.buffer_bytes = buffer_bytes(gpu, lanes, max_bytes, window)  # HBM, said in the banner
        self.demoted = self.loaded = 0

    def links(self, src, dst) -> bool:
        """A demotion src -> dst goes through the link (HBM straight into the slab files)."""
        return src is self.gpu and dst is self.nvme

    def lands(self, tier) -> bool:
        """A read of a block held by tier lands in HBM through the link."""
        return tier is self.nvme

    def promotes(self, src, dst) -> bool:
        """A block read from src is already in HBM: its promotion into dst is device to device."""
        return src is self.nvme and dst is self.gpu

    def _at(self, nvme_slot: int) -> tuple[object, int]:
        """(the slab file's handle, the offset in it) of an NVMe slot."""
        return self.handles[nvme_slot // self.nvme.per_file], (nvme_slot % self.nvme.per_file) * self.nvme.slot_bytes

    def _pieces(self, gpu_slots, nvme_slots, nbytes: int):
        """(device, offset in its slab, NVMe file handle, file offset, length) of each slot of a block."""
        slot = self.gpu.slot_bytes
        for i, (g, n) in enumerate(zip(gpu_slots, nvme_slots)):
            d, off = self.gpu._place(g)
            yield d, off, *self._at(n), min(slot, nbytes - i * slot)

    def demote(self, key: int) -> None:
        """Write a block from its GPU slots into new NVMe slots (the caller then frees the GPU slots)."""
        gpu_slots, nbytes = self.gpu.slots.lookup(key)
        nvme_slots = self.nvme.slots.alloc(key, nbytes)
        try:
            if self.gpu.hbm is not None:  # paged: the pieces gathered into the landing buffer, then one write
                self._write_gathered(key, nvme_slots, nbytes)
            else:
                for d, off, handle, file_off, length in self._pieces(gpu_slots, nvme_slots, nbytes):
                    self.backend.file_write(handle, self.gpu.slabs[d], off, length, file_off)
        except BaseException:
            self.nvme.slots.release(key)
            raise
        self.demoted += 1

    def batches(self) -> bool:
        """Demotions go together: from contiguous slots, or through gather buffers (paged, a batch deeper than 1)."""
        return self.gpu.hbm is None or self.gathers is not None

    def batch_path(self) -> str:
        """How a batch crosses the link each way, from the buffers it holds (the banner's line)."""
        if self.gpu.hbm is None:
            writes = "every block's cuFile writes submitted together"
        elif self.gathers is not None:
            writes = (f"{self.window} blocks' cuFile writes at a time, each block gathered into a device buffer of "
                      f"its own first")
        else:
            writes = "one block at a time (a paged block is gathered into the lane's one landing buffer)"
        reads = (f"{self.window} blocks' cuFile reads at a time, each block into a device buffer of its own"
                 if self.loads_batch() else "one block at a time")
        return (f"demotions out of {self.gpu.name} into {self.nvme.name}'s slab files, {writes}; reads of "
                f"{self.nvme.name} land in HBM {reads}, promoted from there device to device")

    def demote_many(self, keys: list[int]) -> list:
        """A batch's demotions (as demote, each): every block's cuFile writes submitted together, a window of
        blocks at a time in the paged layout (each gathered into a buffer of its own first), all at once from the
        contiguous slots. Each block's completion ns or its exception (its new NVMe slots then released)."""
        done: list = []
        step = self.window if self.gathers is not None else len(keys) or 1
        for w in range(0, len(keys), step):
            done += self._demote_window(keys[w:w + step])
        self.demoted += sum(not isinstance(d, BaseException) for d in done)
        return done

    def _demote_window(self, keys: list[int]) -> list:
        allocated: list[int] = []

        def writes(j: int, key: int) -> list[tuple]:
            gpu_slots, nbytes = self.gpu.slots.lookup(key)
            nvme_slots = self.nvme.slots.alloc(key, nbytes)
            allocated.append(j)
            if self.gathers is not None:
                return self._gathered(key, self.gathers.mine()[j], nvme_slots, nbytes)
            return [(h, self.gpu.slabs[d], off, n, file_off)
                    for d, off, h, file_off, n in self._pieces(gpu_slots, nvme_slots, nbytes)]
        done = self._together(keys, writes, self.backend.file_write_many)
        for j in allocated:
            if isinstance(done[j], BaseException):
                self.nvme.slots.release(keys[j])
        return done

    @staticmethod
    def _together(keys: list[int], ios_of, submit) -> list:
        """Every block's I/Os (ios_of(j, key): a list of (handle, buffer, offset, length, file offset), or it
        raises) handed to submit at once: each block's completion (its last I/O's) or its first exception."""
        done: list = [0] * len(keys)
        items, owner = [], []
        for j, key in enumerate(keys):
            try:
                mine = ios_of(j, key)
            except Exception as e:  # noqa: BLE001 - this block's failure; the others go on
                done[j] = e
                continue
            items += mine
            owner += [j] * len(mine)
        for j, d in zip(owner, submit(items)):
            if not isinstance(done[j], BaseException):
                done[j] = d if isinstance(d, BaseException) else max(done[j], d)
        return done

    def _gathered(self, key: int, buf, nvme_slots: list[int], nbytes: int):
        """A paged block's pieces gathered into buf: (file handle, buf, offset in it, length, file offset) of each
        NVMe slot's write."""
        self.gpu.gather_to_device(key, buf)
        return self._slot_ios(nvme_slots, nbytes, buf)

    def _slot_ios(self, nvme_slots: list[int], nbytes: int, buf) -> list[tuple]:
        """(file handle, buf, offset in it, length, file offset) of each NVMe slot of a block held in buf."""
        slot, out = self.nvme.slot_bytes, []
        for i, n in enumerate(nvme_slots):
            handle, file_off = self._at(n)
            out.append((handle, buf, i * slot, min(slot, nbytes - i * slot), file_off))
        return out

    def _write_gathered(self, key: int, nvme_slots: list[int], nbytes: int) -> None:
        land = self.landing.mine()
        self._hold(None, land)  # the landing buffer no longer holds the block this thread last loaded
        for item in self._gathered(key, land, nvme_slots, nbytes):
            self.backend.file_write(*item)

    def _held(self) -> dict:
        """This thread's landed blocks: key -> the device buffer holding it."""
        held = getattr(self._local, "held", None)
        if held is None:
            held = self._local.held = {}
        return held

    def _hold(self, key: int | None, buf) -> None:
        """buf now holds key (None: nothing): whatever it held before is gone."""
        held = self._held()
        for k in [k for k, b in held.items() if b is buf]:
            del held[k]
        if key is not None:
            held[key] = buf

    def _reads(self, key: int, buf) -> list[tuple]:
        """(file handle, buf, offset in it, length, file offset) of each NVMe slot of a block, read into buf."""
        return self._slot_ios(*self.nvme.slots.lookup(key), buf)

    def load(self, key: int):
        """Read a block from its NVMe slots into this thread's device landing buffer; return the buffer."""
        land = self.landing.mine()
        self._hold(None, land)
        for item in self._reads(key, land):
            self.backend.file_read(*item)
        self.loaded += 1
        self._hold(key, land)
        return land

    def loads_batch(self) -> bool:
        """A batch's reads land together (a batch deeper than one: buffers of their own)."""
        return self.arrivals is not None

    def load_many(self, keys: list[int]) -> list:
        """A window's reads (at most --max-inflight blocks, as load each) into this thread's batch landing buffers,
        every cuFile read submitted together: each block's completion ns or its exception. A block read stays in
        its buffer (landed) until this thread's next batch, for its promotion."""
        bufs = self.arrivals.mine()
        if len(keys) > len(bufs):
            raise ValueError(f"a GDS read batch of {len(keys)} blocks, over its {len(bufs)} landing buffers")
        for buf in bufs[:len(keys)]:
            self._hold(None, buf)  # overwritten now
        done = self._together(keys, lambda j, key: self._reads(key, bufs[j]), self.backend.file_read_many)
        for j, (key, d) in enumerate(zip(keys, done)):
            if not isinstance(d, BaseException):
                self._hold(key, bufs[j])
                self.loaded += 1
        return done

    def landed(self, key: int):
        """The device buffer this thread's last read of key landed in, or None."""
        return self._held().get(key)

    def promote(self, key: int, nbytes: int) -> bool:
        """Move a block this thread just loaded from its landing buffer into GPU slots (device to device);
        False when no buffer of this thread holds it any more (the caller copies from host memory then)."""
        land = self.landed(key)
        if land is None:
            return False
        self.gpu.put_from_device(key, land, nbytes)
        return True

    def to_host(self, land, out) -> None:
        """Copy a landed block to host memory (for stamp verification; not part of the timed read)."""
        stream = self.gpu._lane().streams[0]
        self.backend.copy(D2H, land, 0, out, stream)
        self.backend.sync(stream)

    def close(self) -> None:
        for h in self.handles:
            self.backend.close_file(h)
        self.handles = []


def buffer_bytes(gpu, lanes: int, max_bytes: int, window: int) -> int:
    """The HBM a link's buffers take: per lane one landing buffer, and with batches (window > 1) a landing buffer a
    block of the window, and as many gather buffers in the paged layout."""
    batched = window if window > 1 else 0
    return lanes * max_bytes * (1 + batched + (batched if gpu.hbm is not None else 0))


def open_link(tiers: list, backend, lanes: int, max_bytes: int, window: int = 1) -> GdsLink:
    """The --gds path between the stack's real GPU tier and its NVMe bottom tier, or one sentence why not."""
    from kv_cache.tiers.gpu import GpuTier
    from kv_cache.tiers.nvme import NvmeTier

    gpu = next((t for t in tiers if isinstance(t, GpuTier)), None)
    if gpu is None:
        raise UserError("--gds moves blocks between a real GPU tier and the NVMe tier, and this run has no real "
                        "GPU tier (CuPy found no device, or --gpu is not auto/real); drop --gds.")
    nvme = next((t for t in tiers if isinstance(t, NvmeTier)), None)  # the bottom, or over a remote tier
    if nvme is None:
        raise UserError("--gds needs the NVMe tier (a --cache-dir on a real device); drop --null-io.")
    need, d = buffer_bytes(gpu, lanes, max_bytes, window), gpu.devices[0]
    if need > backend.free_bytes(d):
        raise UserError(f"--gds needs {need / 2**20:,.0f} MiB of HBM on GPU {d} for its landing and gather buffers "
                        f"({lanes} lanes x {need // lanes // max_bytes} buffers of {max_bytes / 2**20:,.1f} MiB: "
                        f"--max-inflight {window} blocks in flight), beyond the GPU tier, and "
                        f"{backend.free_bytes(d) / 2**20:,.0f} MiB of it is free; lower --max-inflight or "
                        f"--gpu-mem-gb.")
    return GdsLink(backend, gpu, nvme, lanes, max_bytes, window)
