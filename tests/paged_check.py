"""The paged GPU layout's round trip, for the fake device (tests/unit) and a real one (tests/gpu): blocks written,
demoted into a CPU tier, evicted, loaded back into other slots and read again, byte-identical; and every piece at
the place the engine's layout gives it, read out of the layer tensors by its own address arithmetic."""

from __future__ import annotations

import numpy as np

from kv_cache.tiers.cpu import CpuTier
from kv_cache.tiers.gpu import GpuTier
from kv_cache.tiers.paged import Paging

# A small model: 4 layers, K and V of 2 heads x 64 x bf16 (256 B a token), 32-token blocks of 2 pages
PAGING = dict(layers=4, parts=2, token_bytes=256, block_tokens=32)
SLOTS = 6


def _piece_at(tier: GpuTier, slot: int, part: int, layer: int, page: int) -> bytes:
    """A piece's bytes read out of its layer's tensor: the tensor [parts, pages, page_tokens, hidden] of the
    slot's device, page index page * (slots of that device) + local slot."""
    pg, n = tier.paging, len(tier.devices)
    d, local = slot % n, slot // n
    step = -(-(tier.num_slots - d) // n)
    tensor = tier.hbm.tensors[d][layer]
    at = part * step * pg.pages * pg.page_bytes + (page * step + local) * pg.page_bytes
    out = np.zeros(pg.page_bytes, np.uint8)
    tier.backend.copy_any(out.ctypes.data, tier.backend.address(tensor) + at, pg.page_bytes,
                          tier._lane().streams[d])
    tier.backend.sync(tier._lane().streams[d])
    return out.tobytes()


def _placed_as_the_engine_lays_out(tier: GpuTier, slot: int, block: np.ndarray) -> list[str]:
    pg, wrong = tier.paging, []
    for part in range(pg.parts):
        for layer in range(pg.layers):
            for page in range(pg.pages):
                at = ((part * pg.layers + layer) * pg.pages + page) * pg.page_bytes
                if _piece_at(tier, slot, part, layer, page) != block[at:at + pg.page_bytes].tobytes():
                    wrong.append(f"slot {slot} part {part} layer {layer} page {page}")
    return wrong


def round_trip(backend, copy: str, devices: list[int], kernel_path: str = "host") -> list[str]:
    """What went wrong (empty: nothing) moving 4 blocks through every path of a paged tier with this copy method
    (kernel_path: the kernel's way across the link, --gpu-kernel-path)."""
    pg = Paging(copy=copy, kernel_path=kernel_path, **PAGING)
    block = pg.block_bytes
    gpu = GpuTier(backend, SLOTS * block, block, devices, lanes=1, staging_bytes=block, paging=pg)
    cpu = CpuTier(SLOTS * block, block)
    host = backend.alloc_pinned(4 * block)  # page-locked, as the workers' buffers are
    gpu.pin_host(cpu.arena)
    rng = np.random.default_rng(7)
    blocks = [rng.integers(0, 256, block, dtype=np.uint8) for _ in range(4)]
    views = [host[i * block:(i + 1) * block] for i in range(4)]
    wrong = []
    try:
        for v, b in zip(views, blocks):
            v[:] = b
        done = gpu.put_many([(k, v) for k, v in enumerate(views)])  # one batch: scattered together
        wrong += [f"put {k}: {r!r}" for k, r in enumerate(done) if not isinstance(r, int)]
        for k, b in enumerate(blocks):
            wrong += _placed_as_the_engine_lays_out(gpu, gpu.slots.lookup(k)[0][0], b)
            if not gpu.move_to(k, cpu):  # demoted: gathered into the CPU tier's registered slot
                wrong.append(f"block {k} not demoted")
            gpu.delete(k)  # evicted from HBM
        gpu.put(99, views[3])  # another block takes a freed slot, so the reloads land elsewhere
        before = {k: None for k in range(4)}
        for k in range(4):
            views[k][:] = 0
            cpu.get(k, views[k])  # promoted back: scattered from host memory into new slots
            gpu.put(k, views[k])
            before[k] = gpu.slots.lookup(k)[0][0]
            views[k][:] = 0
        got = gpu.get_many([(k, v) for k, v in enumerate(views)])  # one batch: gathered together
        wrong += [f"get {k}: {r!r}" for k, r in enumerate(got) if not isinstance(r, int)]
        for k, (v, b) in enumerate(zip(views, blocks)):
            if not np.array_equal(v, b):
                wrong.append(f"block {k} read back different ({int(np.count_nonzero(v != b))} bytes)")
            wrong += _placed_as_the_engine_lays_out(gpu, before[k], b)
        land = backend.alloc_device(devices[0], block)  # the GDS path: gathered into a device buffer and back
        gpu.gather_to_device(0, land)
        gpu.delete(0)
        gpu.put_from_device(0, land, block)
        views[0][:] = 0
        gpu.get(0, views[0])
        if not np.array_equal(views[0], blocks[0]):
            wrong.append("block 0 changed through the device landing buffer")
    finally:
        gpu.close()
    return wrong
