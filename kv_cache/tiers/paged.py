"""The GPU tier's HBM in the engine's own layout: a block is 2 x layers x pages pieces.

vLLM allocates each layer's KV as its own tensor ``[2, num_pages, page_tokens, kv_heads, head_dim]`` (MLA: one
latent per token, ``[num_pages, page_tokens, kv_lora_rank + rope_dim]``), a page holding 16 tokens. A block of
the benchmark (``--block-tokens``, a multiple of 16: LMCache's 256-token chunk is 16 pages) is therefore spread
over parts x layers x pages separate *pieces* of one page of one part (K or V) of one layer. Offloading it means
gathering them; loading it back, scattering them. The pieces of one block sit at page indices ``p * step +
slot`` (step: the slots of its device), so no two of its pages are adjacent, as in an engine whose free pages
are scattered over its pool.

The host side of a block (a worker's buffer, the CPU tier's slot, a GDS landing buffer) is the gathered block,
in LMCache's chunk order ``[parts, layers, tokens, hidden]``: piece (part, layer, page) at byte
``((part * layers + layer) * pages + page) * page_bytes``.

Three ways to move the pieces (``--gpu-copy``), each a method of the device backend:
- ``kernel``: one gather (or scatter) kernel per batch, writing (reading) page-locked host memory directly,
  one thread block per piece (LMCache's ``multi_layer_kv_transfer`` design);
- ``batch``: one ``cudaMemcpyBatchAsync`` over the pieces (vLLM's offloading connector, CUDA >= 12.8);
- ``per-piece``: one ``cudaMemcpyAsync`` per piece (vLLM's old ``swap_blocks``), the reference point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kv_cache.errors import RunFault, UserError
from kv_cache.tiers.devices import D2H, H2D

PAGE_TOKENS = 16  # vLLM's page (its block_size): the unit of the paged KV cache
COPIES = ("kernel", "batch", "per-piece")
KERNEL_BLOCKS = 256  # blocks one launch of the copy kernel takes (a larger batch: launches in turn)
KERNEL_PATHS = ("host", "hbm")  # --gpu-kernel-path: see the setting's help
HBM_STAGE_BYTES = 64 << 20  # a lane's HBM staging buffer per device (at least one block) where "hbm" is used


@dataclass(frozen=True)
class Paging:
    """A block's geometry in the paged layout, and how its pieces are copied."""

    layers: int
    parts: int          # 2: a K and a V tensor per layer; 1: MLA's one latent
    token_bytes: int    # one token of one part of one layer (kv_heads / tp x head_dim x dtype)
    block_tokens: int
    copy: str           # one of COPIES
    kernel_path: str = "host"  # how the kernel crosses the link: one of KERNEL_PATHS
    page_tokens: int = PAGE_TOKENS

    @property
    def page_bytes(self) -> int:
        return self.page_tokens * self.token_bytes

    @property
    def pages(self) -> int:
        """Pages of one block."""
        return self.block_tokens // self.page_tokens

    @property
    def pieces(self) -> int:
        return self.parts * self.layers * self.pages

    @property
    def block_bytes(self) -> int:
        return self.pieces * self.page_bytes

    def tensor(self) -> str:
        shape = f"[{self.parts}, pages, {self.page_tokens}, {self.token_bytes} B]" if self.parts == 2 else \
            f"[pages, {self.page_tokens}, {self.token_bytes} B]"
        return f"{self.layers} tensors {shape}"

    def describe(self) -> str:
        chunk = f" ({self.pages} pages of {self.page_tokens} tokens)" if self.pages > 1 else ""
        how = f" ({'zero copy' if self.kernel_path == 'host' else 'through HBM staging'})" \
            if self.copy == "kernel" else ""
        return (f"paged as vLLM's KV cache: {self.tensor()}, a block{chunk} = {self.pieces:,} pieces of "
                f"{self.page_bytes / 1024:g} KiB, copied by {self.copy}{how}")

    def as_dict(self) -> dict:
        return {"kind": "paged", "copy": self.copy, "kernel_path": self.kernel_path if self.copy == "kernel" else None,
                "page_tokens": self.page_tokens, "layers": self.layers, "parts": self.parts,
                "pieces_per_block": self.pieces, "piece_bytes": self.page_bytes,
                "host_order": "[parts, layers, tokens, hidden] (LMCache's chunk)"}

    def stage_bytes(self) -> int:
        """A lane's HBM staging buffer per device: only where the kernel goes through HBM."""
        return max(self.block_bytes, HBM_STAGE_BYTES) if self.copy == "kernel" and self.kernel_path == "hbm" else 0

    def host_offsets(self) -> np.ndarray:
        """Each piece's byte offset in the gathered block, in (part, layer, page) order."""
        return np.arange(self.pieces, dtype=np.uint64) * np.uint64(self.page_bytes)


def plan(tiers, model, block_tokens: int, bytes_per_token: int) -> tuple[Paging | None, str]:
    """The paged geometry a real GPU tier takes (None: contiguous slots) and a note where --gpu-layout auto
    falls back. A layout or copy the model, block size or tier cannot have is one sentence."""
    layout, copy = tiers.gpu_layout, tiers.gpu_copy
    if layout == "paged" and tiers.gpu == "simulated":
        raise UserError("--gpu-layout paged lays out a real GPU's HBM as the engine's per-layer tensors, and "
                        "--gpu simulated has no HBM (a bandwidth model); drop --gpu-layout paged or use --gpu real.")
    if layout == "contiguous" or tiers.gpu in ("simulated", "off"):
        if copy != "kernel" and layout == "contiguous":
            raise UserError(f"--gpu-copy {copy} moves the pieces of the paged layout, and --gpu-layout contiguous "
                            f"keeps a block in one piece; drop --gpu-copy or use --gpu-layout paged.")
        return None, ""
    why = _not_paged(model, block_tokens, bytes_per_token)
    if why:
        if layout == "paged" or copy != "kernel":
            flag = "--gpu-layout paged" if layout == "paged" else f"--gpu-copy {copy} (the paged layout)"
            raise UserError(f"{flag} keeps a block as pages of {PAGE_TOKENS} tokens per layer, and {why}; "
                            f"{_fix(why)} or use --gpu-layout contiguous.")
        return None, f"GPU tier in contiguous slots (--gpu-layout auto): {why}."
    parts = 1 if model.attention == "mla" else 2
    return Paging(model.layers, parts, bytes_per_token // (parts * model.layers), block_tokens, copy,
                  tiers.gpu_kernel_path), ""


def _not_paged(model, block_tokens: int, bytes_per_token: int) -> str:
    """Why a block of this model and size has no paged layout ('' when it has one)."""
    parts = 1 if model.attention == "mla" else 2
    if model.layers <= 0 or (parts == 2 and (model.kv_heads <= 0 or model.head_dim <= 0)):
        return (f"model {model.name} gives no layers, KV heads and head dimension (layers {model.layers}, kv_heads "
                f"{model.kv_heads}, head_dim {model.head_dim})")
    if not block_tokens:
        return "--block-tokens 0 stores one object per request, not pages"
    if block_tokens % PAGE_TOKENS:
        return f"--block-tokens {block_tokens} is not a whole number of {PAGE_TOKENS}-token pages"
    if bytes_per_token % (parts * model.layers):
        return (f"model {model.name}'s {bytes_per_token} bytes per token do not split into {parts} x "
                f"{model.layers} layers")
    return ""


def _fix(why: str) -> str:
    if why.startswith("model"):
        return "give the model its layers, kv_heads and head_dim (--list-models shows the table)"
    return f"use --block-tokens {PAGE_TOKENS} (vLLM) or 256 (LMCache), a multiple of {PAGE_TOKENS},"


class PagedHbm:
    """A paged GPU tier's HBM: per device, one tensor per layer holding `slots` blocks' pages; the address of
    every piece of a block, gathered-block order, and the moves of a batch of blocks by the copy method."""

    def __init__(self, backend, paging: Paging, devices: list[int], slots_per_device: list[int]):
        self.paging, self.backend, self.ndev = paging, backend, len(devices)
        pg = paging
        self.tensors, self.tables, self._rel = [], [], []
        for d, slots in zip(devices, slots_per_device):
            part_stride = slots * pg.pages * pg.page_bytes
            layers = [backend.alloc_device(d, pg.parts * part_stride) for _ in range(pg.layers)]
            bases = np.array([backend.address(t) for t in layers], dtype=np.uint64)
            self.tensors.append(layers)
            self.tables.append(backend.page_table(d, bases, part_stride, pg, slots))
            part, layer, page = np.meshgrid(np.arange(pg.parts, dtype=np.uint64), np.arange(pg.layers),
                                            np.arange(pg.pages, dtype=np.uint64), indexing="ij")
            rel = bases[layer] + part * np.uint64(part_stride) + page * np.uint64(slots * pg.page_bytes)
            self._rel.append(rel.reshape(-1).astype(np.uint64))
        self._host = pg.host_offsets()

    def pieces(self, device: int, local: int, host_addr: int) -> tuple[np.ndarray, np.ndarray]:
        """(HBM addresses, host-side addresses) of a block's pieces at local slot `local` of `device`."""
        dev = self._rel[device] + np.uint64(local * self.paging.page_bytes)
        return dev, self._host + np.uint64(host_addr)

    def move(self, scatter: bool, blocks: list, lane, used: set) -> None:
        """The pieces of blocks (each (its one slot, [(host-side address, bytes)]): the gathered bytes) scattered
        into the layer tensors (from host memory or a device buffer) or gathered out of them, by the copy method;
        queued on the lane's streams, not waited for; used gets the devices touched."""
        n, want = self.ndev, self.paging.block_bytes
        by_device: dict[int, list[tuple[int, int]]] = {}
        for slots, pieces in blocks:
            if len(slots) != 1 or pieces[0][1] != want:
                raise RunFault(f"a block of {sum(p[1] for p in pieces)} bytes is not the paged layout's "
                               f"{want}-byte block")
            slot = slots[0]
            by_device.setdefault(slot % n, []).append((slot // n, pieces[0][0]))
        copy, page = self.paging.copy, self.paging.page_bytes
        for d, todo in by_device.items():
            stream = lane.streams[d]
            used.add(d)
            if copy == "kernel":
                self._launch(d, todo, scatter, lane, stream)
                continue
            dev, host = zip(*(self.pieces(d, local, addr) for local, addr in todo))
            dev, host = np.concatenate(dev), np.concatenate(host)
            dsts, srcs = (dev, host) if scatter else (host, dev)
            if copy == "batch":
                self.backend.copy_batch(dsts, srcs, page, stream)
            else:
                for dst, src in zip(dsts.tolist(), srcs.tolist()):
                    self.backend.copy_any(dst, src, page, stream)

    def _launch(self, d: int, todo: list[tuple[int, int]], scatter: bool, lane, stream) -> None:
        """The copy kernel over these blocks (local slot, host-side address), KERNEL_BLOCKS at a time: the
        descriptors are written for the next launch only once the stream has read them for the last."""
        scratch, table = lane.scratch[d], self.tables[d]
        via_hbm = self.paging.kernel_path == "hbm"
        for at in range(0, len(todo), KERNEL_BLOCKS):
            if at:
                self.backend.sync(stream)
            part = todo[at:at + KERNEL_BLOCKS]
            if via_hbm:
                self._through_stage(d, part, scatter, lane, stream)
                continue
            scratch.host[:2 * len(part)] = np.array(part, dtype=np.uint64).reshape(-1)
            self.backend.paged_kernel(table, scatter, scratch, len(part), stream)

    def _through_stage(self, d: int, part: list[tuple[int, int]], scatter: bool, lane, stream) -> None:
        """The kernel between the layer tensors and the lane's HBM staging buffer, one DMA copy per block between
        that buffer and host memory, as many blocks at a time as the buffer holds; stream order keeps a chunk's
        copies and kernel apart from the next's (no host wait inside the window)."""
        block, scratch, table = self.paging.block_bytes, lane.scratch[d], self.tables[d]
        stage = self.backend.address(lane.stage[d])
        fits = max(1, lane.stage[d].size // block)
        scratch.host[:2 * len(part)] = np.array(
            [(local, stage + (j % fits) * block) for j, (local, _) in enumerate(part)], dtype=np.uint64).reshape(-1)
        kind = H2D if scatter else D2H
        for first in range(0, len(part), fits):
            chunk = part[first:first + fits]
            if scatter:
                for j, (_, addr) in enumerate(chunk):
                    self.backend.copy_ptr(kind, stage + j * block, addr, block, stream)
            self.backend.paged_kernel(table, scatter, scratch, len(chunk), stream, first)
            if not scatter:
                for j, (_, addr) in enumerate(chunk):
                    self.backend.copy_ptr(kind, stage + j * block, addr, block, stream)

    def free(self, devices: list[int]) -> None:
        for d, layers in zip(devices, self.tensors):
            for t in layers:
                self.backend.free(d, t)
        self.tensors = []
