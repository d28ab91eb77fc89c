"""Device backends of the GPU tier: CuPy on a real GPU, and a fake device in host memory.

One small interface (the GPU tier knows nothing else): device slabs,
pinned host buffers, registering existing host memory as pinned, one stream
per (worker, device), asynchronous copies on a stream (by array, or by
address on the tier's hot path), and waiting for *one stream* — there is
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

import numpy as np

from kv_cache.buffers import aligned_buffer
from kv_cache.errors import UserError
from kv_cache.tiers.posix_io import pread_all, pwrite_all

H2D, D2H, D2D = 1, 2, 3  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice


class FakeStream:
    def __init__(self, device: int):
        self.device = device
        self.syncs = 0
        self.copies = 0
        self.threads: set[int] = set()


class FakeDevice:
    """Host-memory stand-in for CUDA devices, with the CuPy backend's interface."""

    name = "fake"
    nixl_mem = "DRAM"  # its "HBM" is host memory: NIXL registers it as such

    def __init__(self, count: int = 1, hbm_bytes: int = 1 << 30):
        self._count, self.hbm_bytes = count, hbm_bytes
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
        stream.copies += 1
        stream.threads.add(threading.get_ident())
        if kind == H2D:
            np.copyto(dev[dev_offset:dev_offset + host.size], host)
        else:
            np.copyto(host, dev[dev_offset:dev_offset + host.size])

    def address(self, dev) -> int:
        return dev.ctypes.data

    def copy_ptr(self, kind: int, dev_addr: int, host_addr: int, nbytes: int, stream: FakeStream) -> None:
        """copy() by addresses (the GPU tier's hot path: no array views made per transfer)."""
        stream.copies += 1
        stream.threads.add(threading.get_ident())
        if kind == H2D:
            ctypes.memmove(dev_addr, host_addr, nbytes)
        else:
            ctypes.memmove(host_addr, dev_addr, nbytes)

    def copy_device(self, dst, dst_offset: int, src, src_offset: int, nbytes: int, stream: FakeStream) -> None:
        stream.copies += 1
        np.copyto(dst[dst_offset:dst_offset + nbytes], src[src_offset:src_offset + nbytes])

    def sync(self, stream: FakeStream) -> None:
        stream.syncs += 1

    def free(self, device: int, dev) -> None:
        self.allocated[device] -= dev.size

    # GDS (see gds.py): the fake device's "HBM" is host memory, so its file I/O is plain O_DIRECT.
    def gds_mode(self) -> str:
        return "fake device: O_DIRECT between files and host memory standing in for HBM (tests only)"

    def open_file(self, path: str) -> int:
        return os.open(path, os.O_RDWR | os.O_DIRECT)

    def file_write(self, fd: int, dev, dev_offset: int, nbytes: int, file_offset: int) -> None:
        pwrite_all(fd, dev[dev_offset:dev_offset + nbytes], file_offset, "gds")

    def file_read(self, fd: int, dev, dev_offset: int, nbytes: int, file_offset: int) -> None:
        pread_all(fd, dev[dev_offset:dev_offset + nbytes], file_offset, "gds")

    def close_file(self, fd: int) -> None:
        os.close(fd)


class CupyDevice:
    """CUDA through CuPy: raw cudaMemcpyAsync on per-worker streams, cudaStreamSynchronize to wait."""

    name = "cupy"
    nixl_mem = "VRAM"  # a NIXL handoff region in its memory is read as GPU memory (GPUDirect RDMA where UCX has it)

    def __init__(self):
        import cupy  # imported only when a GPU tier is built

        self.cp = cupy
        self.rt = cupy.cuda.runtime
        self._pinned: list = []  # keep pinned allocations alive

    def count(self) -> int:
        return self.rt.getDeviceCount()

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
        self.rt.hostRegister(arr.ctypes.data, arr.nbytes, 0)

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

    def free(self, device: int, dev) -> None:
        del dev  # CuPy's pool frees it; the slab's last reference goes with the tier

    # GDS through kvikio (the gds extra): CuFile reads and writes device memory at a file offset.
    def _kvikio(self):
        try:
            import kvikio
            import kvikio.defaults  # noqa: F401 - a submodule: kvikio 26.x no longer imports it with the package
        except ImportError:
            raise UserError("--gds needs kvikio: install the gds extra (make install picks the wheel of this "
                            "driver's CUDA: kvikio-cu12 or kvikio-cu13).") from None
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


FAKE_GPU_ENV = "KVBENCH_FAKE_GPU"  # tests only: --gpu real opens N fake devices (host memory), said as such


def fake_from_env() -> FakeDevice | None:
    """KVBENCH_FAKE_GPU=N[:HBM_GIB] (tests only): the GPU tier's fake devices behind --gpu real, so that a GPU
    feature's test runs the command line a user types, through the same settings path. Every output names the
    device "fake device N (host memory)"."""
    spec = os.environ.get(FAKE_GPU_ENV, "")
    if not spec:
        return None
    count, _, hbm = spec.partition(":")
    try:
        return FakeDevice(count=int(count), hbm_bytes=int(float(hbm or 4) * 2**30))
    except ValueError:
        raise UserError(f"{FAKE_GPU_ENV}={spec}: expected N or N:HBM_GIB (fake devices for tests); unset it.") from None


def open_cupy() -> tuple[CupyDevice | FakeDevice | None, str]:
    """The CuPy backend (or the tests' fake devices, fake_from_env), or None and one sentence saying what is
    missing."""
    fake = fake_from_env()
    if fake is not None:
        return fake, ""
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


def check_fits(backend, devices: list[int], per_device: int) -> None:
    for d in devices:
        free = backend.free_bytes(d)
        if per_device > free:
            raise UserError(f"--gpu-mem-gb asks for {per_device / 2**30:.2f} GiB on GPU {d} ({backend.model(d)}) "
                            f"but {free / 2**30:.2f} GiB of its HBM is free; lower --gpu-mem-gb.")
