"""Device backends of the GPU tier: CuPy on a real GPU, and a fake device in host memory.

One small interface (the GPU tier knows nothing else): device slabs,
pinned host buffers, registering existing host memory as pinned, one stream
per (worker, device), asynchronous copies on a stream, and waiting for *one
stream* — there is deliberately no device-wide synchronisation in it (the
MLPerf reference timed every transfer with a device-wide sync, which couples
all workers' transfers).

The fake device keeps the same contract on the CPU (numpy copies, streams
that count their synchronisations), so CI, which has no GPU, tests the tier's
slot management, staging, stream use and demotion logic. It is never offered
as a run mode: a run has ``real``, ``simulated`` or no GPU tier.
"""

from __future__ import annotations

import threading

import numpy as np

from kv_cache.errors import UserError
from kv_cache.tiers.aligned import aligned_buffer

H2D, D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


class FakeStream:
    def __init__(self, device: int):
        self.device = device
        self.syncs = 0
        self.copies = 0
        self.threads: set[int] = set()


class FakeDevice:
    """Host-memory stand-in for CUDA devices, with the CuPy backend's interface."""

    name = "fake"

    def __init__(self, count: int = 1, hbm_bytes: int = 1 << 30):
        self._count, self.hbm_bytes = count, hbm_bytes
        self.allocated = [0] * count
        self.registered: list[np.ndarray] = []
        self.streams: list[FakeStream] = []
        self._lock = threading.Lock()

    def count(self) -> int:
        return self._count

    def model(self, device: int) -> str:
        return f"fake device {device} (host memory)"

    def free_bytes(self, device: int) -> int:
        return self.hbm_bytes - self.allocated[device]

    def alloc_device(self, device: int, nbytes: int):
        self.allocated[device] += nbytes
        return aligned_buffer(nbytes)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        return aligned_buffer(nbytes)

    def register_host(self, arr: np.ndarray) -> None:
        self.registered.append(arr)

    def unregister_host(self, arr: np.ndarray) -> None:
        self.registered = [a for a in self.registered if a is not arr]

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

    def sync(self, stream: FakeStream) -> None:
        stream.syncs += 1

    def free(self, device: int, dev) -> None:
        self.allocated[device] -= dev.size


class CupyDevice:
    """CUDA through CuPy: raw cudaMemcpyAsync on per-worker streams, cudaStreamSynchronize to wait."""

    name = "cupy"

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

    def alloc_device(self, device: int, nbytes: int):
        with self.cp.cuda.Device(device):
            return self.cp.empty(nbytes, dtype=self.cp.uint8)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        mem = self.cp.cuda.alloc_pinned_memory(nbytes)
        self._pinned.append(mem)
        arr = np.frombuffer(mem, np.uint8, nbytes)
        arr[::4096] = 0  # touch every page before the clock starts
        return arr

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

    def sync(self, stream) -> None:
        stream.synchronize()  # this stream only: other workers' copies go on

    def free(self, device: int, dev) -> None:
        del dev  # CuPy's pool frees it; the slab's last reference goes with the tier


def open_cupy() -> tuple[CupyDevice | None, str]:
    """The CuPy backend, or None and one sentence saying what is missing."""
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
