"""What the GPU tier's two device backends share: the copy kinds, the paged layout's kernel table and descriptor
scratch, and when cudaMemcpyBatchAsync is there (devices.py: the fake device; cupy_device.py: CUDA)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

H2D, D2H, D2D = 1, 2, 3  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice
DEFAULT = 4  # cudaMemcpyDefault: the direction read from the addresses (UVA)
BATCH_CUDA = (12, 8)  # cudaMemcpyBatchAsync's first CUDA release


@dataclass
class PageTable:
    """A paged tier's tensors on one device, as its copy kernel reads them (cupy_device.KERNEL_SOURCE)."""

    bases: object       # each layer's tensor address: a numpy array (fake) or a device array (CuPy)
    part_stride: int    # bytes from a layer's K tensor to its V tensor
    page_bytes: int
    parts: int
    layers: int
    pages: int          # pages of one block
    step: int           # page index of a block's page p at slot s: p * step + s
    device: int = 0
    args: tuple = ()    # the CuPy kernel's fixed arguments


@dataclass
class Scratch:
    """A lane's descriptors of one kernel launch (slot, host-side address per block): page-locked host memory
    written by the tier, and its copy in HBM that the kernel reads (None on the fake device)."""

    host: np.ndarray
    dev: object


def batch_why_not(runtime: tuple[int, int], driver: tuple[int, int], bound: bool) -> str:
    if min(runtime, driver) < BATCH_CUDA:
        return (f"--gpu-copy batch uses cudaMemcpyBatchAsync, new in CUDA {BATCH_CUDA[0]}.{BATCH_CUDA[1]}, and this "
                f"host has runtime {runtime[0]}.{runtime[1]} with driver {driver[0]}.{driver[1]}; use --gpu-copy "
                f"kernel or per-piece")
    if not bound:
        return ("--gpu-copy batch uses cudaMemcpyBatchAsync through cuda-bindings (pip install "
                "'cuda-bindings>=12.8'), which is not installed; use --gpu-copy kernel or per-piece")
    return ""
