"""The GPU tier's backend on a real GPU: CUDA through CuPy (copies, the paged layout's kernel and batch copies,
GDS through kvikio), with the interface of devices.py's fake device."""

from __future__ import annotations

import contextlib
from time import monotonic_ns as now_ns

import numpy as np

from kv_cache.errors import UserError
from kv_cache.tiers.base import in_flight
from kv_cache.tiers.device_api import D2D, DEFAULT, H2D, PageTable, Scratch, batch_why_not

CAN_USE_HOST_POINTER = 91  # cudaDevAttrCanUseHostPointerForRegisteredMem
KERNEL_THREADS = 256  # threads of one thread block of the paged copy kernel (one piece each)
_SCATTER = {False: np.int32(0), True: np.int32(1)}
_NO_CONTEXT = contextlib.nullcontext()

# One thread block per piece; each thread moves 16 bytes at a time where the piece allows it. The piece of
# thread block i is (block b, part, layer, page p), i = ((b * parts + part) * layers + layer) * pages + p;
# its place in HBM is the layer's tensor + part's offset + page index (p * step + slot) pages; its place on the
# host side is the gathered block's offset of that piece.
KERNEL_SOURCE = r"""
#define UNROLL 8
struct alignas(16) v16 { unsigned long long lo, hi; };

extern "C" __global__ void paged_copy(const unsigned long long* layer_base, unsigned long long part_stride,
        unsigned long long page_bytes, int parts, int layers, int pages, long long step,
        const unsigned long long* desc, int scatter) {
    long long i = blockIdx.x;
    const int p = (int)(i % pages); i /= pages;
    const int layer = (int)(i % layers); i /= layers;
    const int part = (int)(i % parts);
    const long long b = i / parts;
    const long long slot = (long long)desc[2 * b];
    char* dev = (char*)(layer_base[layer] + part * part_stride + (unsigned long long)(p * step + slot) * page_bytes);
    char* host = (char*)(desc[2 * b + 1] + ((unsigned long long)((part * layers + layer) * pages + p)) * page_bytes);
    const char* src = scatter ? host : dev;
    char* dst = scatter ? dev : host;
    if ((((unsigned long long)src | (unsigned long long)dst | page_bytes) & 15ULL) == 0) {
        // each thread loads UNROLL 16-byte words before storing them: several reads in flight per thread, which
        // a read across the link (the scatter's zero-copy source) needs to keep the link busy
        const v16* __restrict__ s = (const v16*)src;
        v16* __restrict__ d = (v16*)dst;
        const unsigned long long n = page_bytes / 16, stride = blockDim.x;
        for (unsigned long long base = threadIdx.x; base < n; base += stride * UNROLL) {
            v16 r[UNROLL];
            #pragma unroll
            for (int k = 0; k < UNROLL; k++) {
                if (base + k * stride < n) r[k] = s[base + k * stride];
            }
            #pragma unroll
            for (int k = 0; k < UNROLL; k++) {
                if (base + k * stride < n) d[base + k * stride] = r[k];
            }
        }
    } else {
        for (unsigned long long j = threadIdx.x; j < page_bytes; j += blockDim.x) dst[j] = src[j];
    }
}
"""


def _version(v: int) -> tuple[int, int]:
    """CUDA's 12080 as (12, 8)."""
    return v // 1000, v % 1000 // 10


class CupyDevice:
    """CUDA through CuPy: raw cudaMemcpyAsync on per-worker streams, cudaStreamSynchronize to wait."""

    name = "cupy"
    # host memory the CUDA runtime itself takes (CuPy imported, a context, the copy kernel compiled, the pinned
    # pool): 354 MiB measured on an H200 with CuPy 14.2 and CUDA 13 (2026-11-27); the memory budget counts it
    runtime_bytes = 384 << 20
    nixl_mem = "VRAM"  # a NIXL handoff region in its memory is read as GPU memory (GPUDirect RDMA where UCX has it)

    def __init__(self):
        import cupy  # imported only when a GPU tier is built

        self.cp = cupy
        self.rt = cupy.cuda.runtime
        self._pinned: list = []  # keep pinned allocations alive
        self._devices = 0  # known once count() is asked (the paged kernel sets no device where there is one)

    def count(self) -> int:
        self._devices = self.rt.getDeviceCount()
        return self._devices

    def model(self, device: int) -> str:
        name = self.rt.getDeviceProperties(device)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    def free_bytes(self, device: int) -> int:
        with self.cp.cuda.Device(device):
            return self.rt.memGetInfo()[0]

    def total_bytes(self, device: int) -> int:
        """The device's HBM: a fixed fact (what is free changes with other processes)."""
        with self.cp.cuda.Device(device):
            return self.rt.memGetInfo()[1]

    def alloc_device(self, device: int, nbytes: int):
        with self.cp.cuda.Device(device):
            return self.cp.empty(nbytes, dtype=self.cp.uint8)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        mem = self.cp.cuda.alloc_pinned_memory(nbytes)
        self._pinned.append(mem)
        arr = np.frombuffer(mem, np.uint8, nbytes)
        arr[::4096] = 0  # touch every page before the clock starts
        return arr

    def is_pinned(self, arr: np.ndarray) -> bool:
        """Page-locked already (CuPy's pinned allocations, or registered): registering it again is an error."""
        try:
            return self.rt.pointerGetAttributes(arr.ctypes.data).type == 1  # cudaMemoryTypeHost
        except self.rt.CUDARuntimeError:  # pageable memory, on older drivers
            return False

    def register_host(self, arr: np.ndarray) -> None:
        # portable (every device) and mapped: the paged layout's kernel reads and writes it at its host address
        self.rt.hostRegister(arr.ctypes.data, arr.nbytes, 3)

    def unregister_host(self, arr: np.ndarray) -> None:
        self.rt.hostUnregister(arr.ctypes.data)

    def stream(self, device: int):
        with self.cp.cuda.Device(device):
            return self.cp.cuda.Stream(non_blocking=True)

    def copy(self, kind: int, dev, dev_offset: int, host: np.ndarray, stream) -> None:
        d, h = dev.data.ptr + dev_offset, host.ctypes.data
        dst, src = (d, h) if kind == H2D else (h, d)
        self.rt.memcpyAsync(dst, src, host.nbytes, kind, stream.ptr)

    def address(self, dev) -> int:
        return dev.data.ptr

    def copy_ptr(self, kind: int, dev_addr: int, host_addr: int, nbytes: int, stream) -> None:
        dst, src = (dev_addr, host_addr) if kind == H2D else (host_addr, dev_addr)
        self.rt.memcpyAsync(dst, src, nbytes, kind, stream.ptr)

    def copy_device(self, dst, dst_offset: int, src, src_offset: int, nbytes: int, stream) -> None:
        self.rt.memcpyAsync(dst.data.ptr + dst_offset, src.data.ptr + src_offset, nbytes, D2D, stream.ptr)

    def sync(self, stream) -> None:
        stream.synchronize()  # this stream only: other workers' copies go on

    # The paged layout's three copy methods (paged.py).
    def copy_why_not(self, method: str) -> str:
        if method == "kernel":
            # the kernel reads and writes page-locked host memory at its host address (UVA)
            if not all(self.rt.deviceGetAttribute(CAN_USE_HOST_POINTER, d) for d in range(self.count())):
                return ("--gpu-copy kernel writes page-locked host memory at its host address, which this GPU "
                        "cannot (cudaDevAttrCanUseHostPointerForRegisteredMem is 0); use --gpu-copy batch or "
                        "per-piece")
            return ""
        if method != "batch":
            return ""
        cbr = self._bindings()
        runtime = _version(self.rt.runtimeGetVersion())
        if cbr is not None:
            runtime = _version(cbr.cudaRuntimeGetVersion()[1])
        return batch_why_not(runtime, _version(self.rt.driverGetVersion()),
                              cbr is not None and hasattr(cbr, "cudaMemcpyBatchAsync"))

    @staticmethod
    def _bindings():
        try:
            from cuda.bindings import runtime as cbr
        except ImportError:
            return None
        return cbr

    def page_table(self, device: int, bases: np.ndarray, part_stride: int, paging, slots: int) -> PageTable:
        """The tensors' addresses in HBM for the kernel, and the kernel compiled for this device (before the
        clock: NVRTC takes a second)."""
        with self.cp.cuda.Device(device):
            dev_bases = self.cp.asarray(bases)
            if not hasattr(self, "_kernel"):
                self._kernel = self.cp.RawKernel(KERNEL_SOURCE, "paged_copy")
            self._kernel.attributes  # noqa: B018 - compiles and loads it for this device, before the clock
        t = PageTable(dev_bases, part_stride, paging.page_bytes, paging.parts, paging.layers, paging.pages, slots,
                       device)
        # the launch's fixed arguments, made once (numpy scalars: the kernel's parameter types; pointers as 64 bits)
        t.args = (np.uint64(dev_bases.data.ptr), np.uint64(part_stride), np.uint64(paging.page_bytes),
                  np.int32(paging.parts), np.int32(paging.layers), np.int32(paging.pages), np.int64(slots))
        return t

    def kernel_scratch(self, device: int, blocks: int) -> Scratch:
        with self.cp.cuda.Device(device):
            return Scratch(self.alloc_pinned(16 * blocks).view(np.uint64), self.cp.empty(2 * blocks, np.uint64))

    def paged_kernel(self, table: PageTable, scatter: bool, scratch: Scratch, blocks: int, stream,
                     first: int = 0) -> None:
        """The descriptors (the first-th on) to HBM (one small copy), then one thread block per piece, on this
        stream (on its device: a stream's device is current while it is)."""
        desc = scratch.dev.data.ptr + 16 * first
        self.rt.memcpyAsync(desc, scratch.host.ctypes.data + 16 * first, 16 * blocks, H2D, stream.ptr)
        t = table
        with self.cp.cuda.Device(t.device) if self._devices > 1 else _NO_CONTEXT, stream:
            self._kernel((blocks * t.parts * t.layers * t.pages,), (KERNEL_THREADS,),
                         t.args + (np.uint64(desc), _SCATTER[scatter]))

    def copy_batch(self, dsts: np.ndarray, srcs: np.ndarray, nbytes: int, stream) -> None:
        """One cudaMemcpyBatchAsync over every (dst, src) of nbytes, ordered after the stream's earlier work."""
        cbr = self._bindings()
        if not hasattr(self, "_batch_attrs"):
            attrs = cbr.cudaMemcpyAttributes()
            attrs.srcAccessOrder = cbr.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
            self._batch_attrs = [attrs]
        n = len(dsts)
        err = cbr.cudaMemcpyBatchAsync(dsts.tolist(), srcs.tolist(), [nbytes] * n, n, self._batch_attrs, [0], 1,
                                       stream.ptr)[0]
        if err != cbr.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaMemcpyBatchAsync: {err.name}")

    def copy_any(self, dst: int, src: int, nbytes: int, stream) -> None:
        self.rt.memcpyAsync(dst, src, nbytes, DEFAULT, stream.ptr)

    def free(self, device: int, dev) -> None:
        del dev  # CuPy's pool frees it; the slab's last reference goes with the tier

    # GDS through kvikio (the gds extra): CuFile reads and writes device memory at a file offset.
    def _kvikio(self):
        try:
            import kvikio
            import kvikio.defaults  # noqa: F401 - a submodule: kvikio 26.x no longer imports it with the package
        except ImportError as e:
            raise UserError(f"--gds needs kvikio, and importing it failed ({e}): install the gds extra (make "
                            f"install picks the wheel of this driver's CUDA: kvikio-cu12 or kvikio-cu13).") from None
        return kvikio

    def gds_mode(self) -> str:
        """Which path kvikio will really take: cuFile (GPUDirect Storage) or its POSIX compatibility mode."""
        if kvikio_compat_preferred(self._kvikio().defaults):
            return ("kvikio compatibility mode: POSIX I/O through host bounce buffers (cuFile unavailable: no "
                    "libcufile, no /run/udev, or KVIKIO_COMPAT_MODE=ON) - not GPUDirect")
        try:
            from kvikio import cufile_driver

            gds = cufile_driver.get("is_gds_available")
        except Exception:  # noqa: BLE001 - older kvikio, or a driver query that failed
            gds = None
        if gds is False:
            return "cuFile without GPUDirect (its own compatibility mode: nvidia-fs not loaded)"
        return "cuFile (GPUDirect Storage" + (")" if gds else ", driver properties not readable)")

    def open_file(self, path: str):
        return self._kvikio().CuFile(path, "r+")

    def file_write(self, handle, dev, dev_offset: int, nbytes: int, file_offset: int) -> None:
        handle.pwrite(dev[dev_offset:dev_offset + nbytes], nbytes, file_offset).get()

    def file_read(self, handle, dev, dev_offset: int, nbytes: int, file_offset: int) -> None:
        handle.pread(dev[dev_offset:dev_offset + nbytes], nbytes, file_offset).get()

    def file_write_many(self, items: list[tuple]) -> list:
        """Each (handle, dev, dev_offset, nbytes, file_offset) submitted at once (kvikio's futures: its thread pool
        runs them together, as gdsio's threads do), then each waited for in order: its completion ns (when its wait
        returned: never before it completed) or its exception."""
        return self._together("pwrite", items)

    def file_read_many(self, items: list[tuple]) -> list:
        """As file_write_many, each read."""
        return self._together("pread", items)

    @staticmethod
    def _together(op: str, items: list[tuple]) -> list:
        """The I/Os' time in flight (in_flight) runs from each one's submission to its wait's return: an I/O waited
        for behind a slower one counts until then, so the depth it gives may read above the device's."""
        futures: list = []
        submitted = 0
        for handle, dev, off, n, file_off in items:
            submitted += now_ns()
            try:
                futures.append(getattr(handle, op)(dev[off:off + n], n, file_off))
            except Exception as e:  # noqa: BLE001 - this I/O's failure, judged with the others
                futures.append(e)
        done: list = []
        for f in futures:
            if not isinstance(f, BaseException):
                try:
                    f.get()
                    f = now_ns()
                except Exception as e:  # noqa: BLE001 - as above
                    f = e
            done.append(f)
        ended = sum(d if isinstance(d, int) else now_ns() for d in done)
        in_flight(ended - submitted)
        return done

    def close_file(self, handle) -> None:
        handle.close()


def kvikio_compat_preferred(defaults) -> bool:
    """Whether kvikio will use its POSIX compatibility mode, through the API its version has: 24.12 to 26.x
    answer is_compat_mode_preferred(); 24.x before it, compat_mode() (a bool, or a CompatMode where ON is 1)."""
    preferred = getattr(defaults, "is_compat_mode_preferred", None)
    if preferred is not None:
        return bool(preferred())
    mode = defaults.compat_mode()
    return mode if isinstance(mode, bool) else int(mode) == 1
