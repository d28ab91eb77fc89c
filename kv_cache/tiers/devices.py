"""Device backends of the GPU tier: a fake device in host memory here, CuPy on a real GPU (cupy_device.py).

One small interface (the GPU tier knows nothing else): device slabs,
pinned host buffers, registering existing host memory as pinned, one stream
per (worker, device), asynchronous copies on a stream (by array, or by
address on the tier's hot path), the paged layout's three copy methods
(paged.py: a gather / scatter kernel, a batch of copies, a copy per piece),
and waiting for *one stream* — there is
deliberately no device-wide synchronisation in it (the MLPerf reference timed
every transfer with a device-wide sync, which couples all workers' transfers).

The fake device keeps the same contract on the CPU (numpy copies, streams
that count their synchronisations), so CI, which has no GPU, tests the tier's
slot management, staging, stream use and demotion logic. It is never offered
as a run mode: a run has ``real``, ``simulated`` or no GPU tier.
"""

from __future__ import annotations

import ctypes
import os
import threading
from time import monotonic_ns as now_ns

import numpy as np

from kv_cache.buffers import aligned_buffer
from kv_cache.errors import UserError
from kv_cache.tiers.base import in_flight
from kv_cache.tiers.device_api import D2D, D2H, DEFAULT, H2D, PageTable, Scratch, batch_why_not
from kv_cache.tiers.posix_io import pread_all, pwrite_all

__all__ = ["D2D", "D2H", "DEFAULT", "H2D", "FakeDevice", "check_fits", "fake_from_env", "open_cupy"]

class FakeStream:
    def __init__(self, device: int):
        self.device = device
        self.syncs = 0
        self.copies = 0
        self.threads: set[int] = set()


class FakeDevice:
    """Host-memory stand-in for CUDA devices, with the CuPy backend's interface."""

    name = "fake"
    runtime_bytes = 0  # no CUDA runtime in this process's memory
    nixl_mem = "DRAM"  # its "HBM" is host memory: NIXL registers it as such

    def __init__(self, count: int = 1, hbm_bytes: int = 1 << 30, cuda: tuple[int, int] = (13, 0)):
        self._count, self.hbm_bytes, self.cuda = count, hbm_bytes, cuda
        self.allocated = [0] * count
        self.registered: list[np.ndarray] = []
        self.pinned_bytes = 0  # alloc_pinned's total (CUDA's page-locked host allocations)
        self._pinned: list[tuple[int, int]] = []  # host ranges page-locked by alloc_pinned or register_host
        self.streams: list[FakeStream] = []
        self._lock = threading.Lock()

    def count(self) -> int:
        return self._count

    def model(self, device: int) -> str:
        return f"fake device {device} (host memory)"

    def free_bytes(self, device: int) -> int:
        return self.hbm_bytes - self.allocated[device]

    def total_bytes(self, device: int) -> int:
        return self.hbm_bytes

    def alloc_device(self, device: int, nbytes: int):
        self.allocated[device] += nbytes
        return aligned_buffer(nbytes)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        arr = aligned_buffer(nbytes)
        self.pinned_bytes += arr.nbytes
        self._pinned.append((arr.ctypes.data, arr.ctypes.data + arr.nbytes))
        return arr

    def is_pinned(self, arr: np.ndarray) -> bool:
        lo = arr.ctypes.data
        return any(a <= lo < b for a, b in self._pinned)

    def register_host(self, arr: np.ndarray) -> None:
        """As cudaHostRegister: memory already page-locked (pinned or registered) is an error."""
        lo, hi = arr.ctypes.data, arr.ctypes.data + arr.nbytes
        if any(a < hi and lo < b for a, b in self._pinned):
            raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered: part of this range is already page-locked")
        self._pinned.append((lo, hi))
        self.registered.append(arr)

    def unregister_host(self, arr: np.ndarray) -> None:
        """As cudaHostUnregister: memory this process did not register is an error."""
        if not any(a is arr for a in self.registered):
            raise RuntimeError("cudaErrorHostMemoryNotRegistered: this range was not registered")
        self.registered = [a for a in self.registered if a is not arr]
        self._pinned.remove((arr.ctypes.data, arr.ctypes.data + arr.nbytes))

    def stream(self, device: int) -> FakeStream:
        s = FakeStream(device)
        with self._lock:
            self.streams.append(s)
        return s

    def copy(self, kind: int, dev, dev_offset: int, host: np.ndarray, stream: FakeStream) -> None:
        self._count_copy(stream)
        if kind == H2D:
            np.copyto(dev[dev_offset:dev_offset + host.size], host)
        else:
            np.copyto(host, dev[dev_offset:dev_offset + host.size])

    def address(self, dev) -> int:
        return dev.ctypes.data

    def copy_ptr(self, kind: int, dev_addr: int, host_addr: int, nbytes: int, stream: FakeStream) -> None:
        """copy() by addresses (the GPU tier's hot path: no array views made per transfer)."""
        self._count_copy(stream)
        if kind == H2D:
            ctypes.memmove(dev_addr, host_addr, nbytes)
        else:
            ctypes.memmove(host_addr, dev_addr, nbytes)

    def copy_device(self, dst, dst_offset: int, src, src_offset: int, nbytes: int, stream: FakeStream) -> None:
        stream.copies += 1
        np.copyto(dst[dst_offset:dst_offset + nbytes], src[src_offset:src_offset + nbytes])

    def sync(self, stream: FakeStream) -> None:
        stream.syncs += 1

    # The paged layout's three copy methods (paged.py), with the semantics of the real ones.
    def copy_why_not(self, method: str) -> str:
        return batch_why_not(self.cuda, self.cuda, True) if method == "batch" else ""

    def page_table(self, device: int, bases: np.ndarray, part_stride: int, paging, slots: int) -> PageTable:
        return PageTable(bases, part_stride, paging.page_bytes, paging.parts, paging.layers, paging.pages, slots)

    def kernel_scratch(self, device: int, blocks: int) -> Scratch:
        return Scratch(np.zeros(2 * blocks, np.uint64), None)

    def paged_kernel(self, table: PageTable, scatter: bool, scratch: Scratch, blocks: int, stream,
                     first: int = 0) -> None:
        """The gather / scatter kernel's index arithmetic (cupy_device.KERNEL_SOURCE), one piece per 'thread block';
        its descriptors from the first-th on."""
        self._count_copy(stream)
        t, desc = table, scratch.host[2 * first:]
        i = np.arange(blocks * t.parts * t.layers * t.pages, dtype=np.int64)
        page, rest = i % t.pages, i // t.pages
        layer, rest = rest % t.layers, rest // t.layers
        part, b = rest % t.parts, rest // t.parts
        slot = desc[2 * b].astype(np.int64)
        dev = t.bases[layer] + (part * t.part_stride + (page * t.step + slot) * t.page_bytes).astype(np.uint64)
        host = desc[2 * b + 1] + (((part * t.layers + layer) * t.pages + page) * t.page_bytes).astype(np.uint64)
        for d, h in zip(dev.tolist(), host.tolist()):
            dst, src = (d, h) if scatter else (h, d)
            ctypes.memmove(dst, src, t.page_bytes)

    def copy_batch(self, dsts: np.ndarray, srcs: np.ndarray, nbytes: int, stream) -> None:
        """As cudaMemcpyBatchAsync: one call, every (dst, src) of nbytes, in no particular order."""
        self._count_copy(stream)
        for d, s in zip(dsts.tolist(), srcs.tolist()):
            ctypes.memmove(d, s, nbytes)

    def copy_any(self, dst: int, src: int, nbytes: int, stream) -> None:
        """As cudaMemcpyAsync with cudaMemcpyDefault (the direction read from the addresses)."""
        self._count_copy(stream)
        ctypes.memmove(dst, src, nbytes)

    def _count_copy(self, stream: FakeStream) -> None:
        stream.copies += 1
        stream.threads.add(threading.get_ident())

    def free(self, device: int, dev) -> None:
        self.allocated[device] -= dev.size

    # GDS (see gds.py): the fake device's "HBM" is host memory, so its file I/O is plain O_DIRECT.
    def gds_mode(self) -> str:
        return "fake device: O_DIRECT between files and host memory standing in for HBM (tests only)"

    def open_file(self, path: str) -> int:
        return os.open(path, os.O_RDWR | os.O_DIRECT | os.O_NOFOLLOW)

    def file_write(self, fd: int, dev, dev_offset: int, nbytes: int, file_offset: int) -> None:
        pwrite_all(fd, dev[dev_offset:dev_offset + nbytes], file_offset, "gds")

    def file_read(self, fd: int, dev, dev_offset: int, nbytes: int, file_offset: int) -> None:
        pread_all(fd, dev[dev_offset:dev_offset + nbytes], file_offset, "gds")

    def file_write_many(self, items: list[tuple]) -> list:
        """Each (fd, dev, dev_offset, nbytes, file_offset) written: its completion ns or its exception (one after
        another here; kvikio's futures run them together on a GPU)."""
        return self._each(self.file_write, items)

    def file_read_many(self, items: list[tuple]) -> list:
        """As file_write_many, each read."""
        return self._each(self.file_read, items)

    @staticmethod
    def _each(io, items: list[tuple]) -> list:
        done: list = []
        spent = 0
        for item in items:
            start = now_ns()
            try:
                io(*item)
                done.append(now_ns())
            except OSError as e:
                done.append(e)
            spent += now_ns() - start
        in_flight(spent)  # one at a time
        return done

    def close_file(self, fd: int) -> None:
        os.close(fd)


FAKE_GPU_ENV = "KVBENCH_FAKE_GPU"  # tests only: --gpu real opens N fake devices (host memory), said as such


def fake_from_env() -> FakeDevice | None:
    """KVBENCH_FAKE_GPU=N[:HBM_GIB[:CUDA]] (tests only; CUDA: the version it plays, default 13.0): the GPU
    tier's fake devices behind --gpu real, so that a GPU feature's test runs the command line a user types,
    through the same settings path. Every output names the device "fake device N (host memory)"."""
    spec = os.environ.get(FAKE_GPU_ENV, "")
    if not spec:
        return None
    count, _, rest = spec.partition(":")
    hbm, _, cuda = rest.partition(":")
    try:
        major, _, minor = (cuda or "13.0").partition(".")
        return FakeDevice(count=int(count), hbm_bytes=int(float(hbm or 4) * 2**30), cuda=(int(major), int(minor or 0)))
    except ValueError:
        raise UserError(f"{FAKE_GPU_ENV}={spec}: expected N, N:HBM_GIB or N:HBM_GIB:CUDA (fake devices for tests); "
                        f"unset it.") from None


def open_cupy() -> tuple[object | None, str]:
    """The CuPy backend (or the tests' fake devices, fake_from_env), or None and one sentence saying what is
    missing."""
    fake = fake_from_env()
    if fake is not None:
        return fake, ""
    from kv_cache.tiers.cupy_device import CupyDevice

    try:
        backend = CupyDevice()
    except ImportError:
        return None, "CuPy is not installed (install the gpu extra: pip install -e '.[gpu]')"
    try:
        n = backend.count()
    except Exception as e:  # CUDARuntimeError, or no driver at all
        return None, f"CuPy found no CUDA device ({type(e).__name__}: {e})"
    if n == 0:
        return None, "CuPy found no CUDA device"
    return backend, ""


def check_fits(backend, devices: list[int], per_device: int, stages: int = 0) -> None:
    """stages: HBM each device needs beyond the tier's slots (--gpu-kernel-path hbm's staging buffers)."""
    for d in devices:
        free, want = backend.free_bytes(d), per_device + stages
        if want > free:
            beyond = (f" (with {stages / 2**30:.2f} GiB of --gpu-kernel-path hbm's staging buffers, one per worker)"
                      if stages else "")
            raise UserError(f"--gpu-mem-gb asks for {want / 2**30:.2f} GiB on GPU {d} ({backend.model(d)}){beyond} "
                            f"but {free / 2**30:.2f} GiB of its HBM is free; lower --gpu-mem-gb"
                            + (" or use --gpu-kernel-path host." if stages else "."))
