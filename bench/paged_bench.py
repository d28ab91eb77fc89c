"""The paged GPU layout against the link (`make device-check`, issue 49): a batch of blocks gathered out of (D2H)
and scattered into (H2D) the engine's per-layer tensors by each copy method, against one large copy of the same
bytes between the same page-locked host buffer and HBM, in the same run.

For each model (llama3.1-8b and llama3.1-70b, 16-token blocks by default) and copy method (kernel: zero copy;
kernel-hbm: the kernel through a staging buffer in HBM and one DMA copy per block; batch; per-piece): the GPU
tier's get_many / put_many of a batch of 16 blocks, as a worker's batched request I/O calls them (slot lookup,
descriptors, one synchronisation per batch included). Rounds alternate the tier and the raw
copy (a shared machine drifts); each figure is the median over the rounds of GB/s, and the ratio the median of
the rounds' (tier GB/s / raw GB/s). `--fake` runs the same on the fake device (no GPU): the methods' semantics
and the tier's own cost, not the link.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

MODELS = ("llama3.1-8b", "llama3.1-70b")
# (name, --gpu-copy, the kernel's way across the link): zero copy, or through an HBM staging buffer + DMA copies
VARIANTS = (("kernel", "kernel", "host"), ("kernel-hbm", "kernel", "hbm"), ("batch", "batch", None),
            ("per-piece", "per-piece", None))


def _gbps(nbytes: int, op, n: int) -> float:
    """GB/s of n calls of op(i), each returning the seconds of its own transfer (a put's deletes outside)."""
    return nbytes * n / sum(op(i) for i in range(n)) / 1e9


def _batch(verb, items: list) -> float:
    """Seconds of one get_many / put_many; every block of it must have completed."""
    start = time.perf_counter()
    out = verb(items)
    took = time.perf_counter() - start
    assert all(isinstance(x, int) for x in out), out
    return took


def _clocked(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def model_rows(backend, model: str, block_tokens: int, batch: int, batches: int, rounds: int) -> list[dict]:
    from kv_cache.model import find_model
    from kv_cache.tiers.devices import D2H, H2D
    from kv_cache.tiers.gpu import GpuTier
    from kv_cache.tiers.paged import Paging

    m = find_model(model)
    bpt = m.bytes_per_token("bf16")
    block = bpt * block_tokens
    host = backend.alloc_pinned(batch * block)
    host[::4096] = 7
    raw_dev = backend.alloc_device(0, batch * block)
    base, stream = backend.address(raw_dev), backend.stream(0)

    def raw(kind):
        def op(_i):
            start = time.perf_counter()
            backend.copy_ptr(kind, base, host.ctypes.data, batch * block, stream)
            backend.sync(stream)
            return time.perf_counter() - start
        return op

    rows = []
    for name, copy, via in VARIANTS:
        paging = Paging(m.layers, 2, bpt // (2 * m.layers), block_tokens, copy, via or "host")
        slots = 4 * batch  # the batch's blocks land on different slots each time, their pages spread over the pool
        why = backend.copy_why_not(copy)
        if why:
            rows.append({"model": model, "copy": name, "skipped": why})
            continue
        tier = GpuTier(backend, slots * block, block, [0], lanes=1, staging_bytes=block, paging=paging)
        tier.pin_host(host)  # page-locked already: recorded as a direct source and target, as the run's buffers are
        views = [host[i * block:(i + 1) * block] for i in range(batch)]

        def put(i, tier=tier, views=views):
            keys = [(i % 4) * batch + j for j in range(batch)]
            for k in keys:  # the slots freed outside the clock
                if tier.contains(k):
                    tier.delete(k)
            return _batch(tier.put_many, list(zip(keys, views)))

        def get(i, tier=tier, views=views):
            return _batch(tier.get_many, [((i % 4) * batch + j, v) for j, v in enumerate(views)])

        def kernel_only(scatter, tier=tier, views=views):
            """The launch and the kernel alone (descriptors written once): what the tier's Python adds is the rest."""
            lane = tier._lane()
            lane.scratch[0].host[:2 * batch] = np.array([(j, views[j].ctypes.data) for j in range(batch)],
                                                         dtype=np.uint64).reshape(-1)

            def op(_i):
                return _clocked(lambda: (backend.paged_kernel(tier.hbm.tables[0], scatter, lane.scratch[0], batch,
                                                              lane.streams[0]), backend.sync(lane.streams[0])))
            return op

        for i in range(4):  # every slot written once, the kernel and the copy engines warm, outside the clock
            put(i)
            get(i)
        n = batches if copy != "per-piece" else max(2, batches // 4)
        got: dict[str, list[float]] = {k: [] for k in ("h2d", "d2h", "raw_h2d", "raw_d2h")}
        if via == "host":
            got.update(kernel_alone_h2d=[], kernel_alone_d2h=[])
        for _ in range(rounds):
            got["h2d"].append(_gbps(batch * block, put, n))
            got["raw_h2d"].append(_gbps(batch * block, raw(H2D), n))
            got["d2h"].append(_gbps(batch * block, get, n))
            got["raw_d2h"].append(_gbps(batch * block, raw(D2H), n))
            if via == "host":
                got["kernel_alone_h2d"].append(_gbps(batch * block, kernel_only(True), n))
                got["kernel_alone_d2h"].append(_gbps(batch * block, kernel_only(False), n))
        staged = sum(v["staged"] for v in tier.transfers().values())  # 0: every block went direct
        tier.close()
        med = {k: statistics.median(v) for k, v in got.items()}
        rows.append({"model": model, "copy": name, "block_mib": block / 2**20, "pieces": paging.pieces,
                     "piece_kib": paging.page_bytes / 1024, "batch": batch, "staged": staged,
                     **{f"{k}_gbps": v for k, v in med.items()},
                     "h2d_ratio": statistics.median(a / b for a, b in zip(got["h2d"], got["raw_h2d"])),
                     "d2h_ratio": statistics.median(a / b for a, b in zip(got["d2h"], got["raw_d2h"]))})
    backend.free(0, raw_dev)
    return rows


def paged_round(fake: bool = False, models=MODELS, block_tokens: int = 16, batch: int = 16, batches: int = 20,
                rounds: int = 3) -> dict:
    from kv_cache.tiers.devices import FakeDevice, open_cupy

    backend, why = (FakeDevice(hbm_bytes=8 << 30), "") if fake else open_cupy()
    if backend is None:
        return {"skipped": why}
    rows = [r for m in models for r in model_rows(backend, m, block_tokens, batch, batches, rounds)]
    return {"device": backend.model(0), "rows": rows}


def lines(res: dict) -> list[str]:
    out = []
    for r in res["rows"]:
        if "skipped" in r:
            out.append(f"| {r['model']} {r['copy']} | - | - | - ({r['skipped']}) |")
            continue
        for d in ("d2h", "h2d"):
            alone = f" (launch + kernel alone {r['kernel_alone_' + d + '_gbps']:.1f} GB/s)" \
                if f"kernel_alone_{d}_gbps" in r else ""
            out.append(f"| {r['model']} {r['copy']} {d.upper()} ({r['batch']} blocks of {r['block_mib']:g} MiB, "
                       f"{r['pieces']} pieces of {r['piece_kib']:g} KiB each){alone} | {r[d + '_gbps']:.1f} GB/s | "
                       f"{r['raw_' + d + '_gbps']:.1f} GB/s | {r[d + '_ratio']:.2f} |")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fake", action="store_true", help="the fake device: semantics and own cost, no GPU needed")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args()
    res = paged_round(a.fake, a.models, a.block_tokens, rounds=a.rounds)
    if "skipped" in res:
        print(f"paged_bench: no GPU here ({res['skipped']}); nothing measured.")
        return 0
    print(f"paged layout on {res['device']}\n| what | ours | one large copy | ratio (median of rounds) |\n"
          "|---|---|---|---|")
    print("\n".join(lines(res)))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
