"""GPU section of `make bench`: the GPU tier's per-block H2D / D2H bandwidth against a raw CuPy
copy of the same size from pinned host memory on one stream (the physical limit of this path).

Both sides move the same blocks between the same pinned host buffer and device memory, one block
per operation, waiting for their own stream after each: the tier's overhead (slot lookup, lane,
placement, Python) is the only difference. Skipped, with the reason, when CuPy finds no device.
"""

from __future__ import annotations

import time


def gpu_round(block: int, blocks: int) -> dict | None:
    from kv_cache.tiers.devices import D2H, H2D, open_cupy
    from kv_cache.tiers.gpu import GpuTier

    backend, why = open_cupy()
    if backend is None:
        return {"skipped": why}
    tier = GpuTier(backend, blocks * block, block, [0], lanes=1, staging_bytes=block)
    host = backend.alloc_pinned(block)
    host[:] = 7
    raw_dev = backend.alloc_device(0, block)
    stream = backend.stream(0)

    def timed(op) -> float:
        op(0)  # first touch outside the clock
        start = time.perf_counter()
        for k in range(blocks):
            op(k)
        return blocks * block / (time.perf_counter() - start) / 1e9

    def raw(kind):
        def op(_k):
            backend.copy(kind, raw_dev, 0, host, stream)
            backend.sync(stream)
        return op

    tier.pin_host(host)
    put = timed(lambda k: (tier.delete(k) if tier.contains(k) else None, tier.put(k, host)))
    get = timed(lambda k: tier.get(k, host))
    out = {"model": backend.model(0), "put_gbps": put, "get_gbps": get, "raw_h2d_gbps": timed(raw(H2D)),
           "raw_d2h_gbps": timed(raw(D2H))}
    tier.close()
    return out


def lines(result: dict | None) -> list[str]:
    if not result or "skipped" in result:
        return [f"| GPU tier (no GPU here: {result['skipped'] if result else 'not run'}) | - | - | - |"]
    return [f"| GPU tier {op} ({d}) vs raw CuPy pinned copy, {result['model']} | {result[op + '_gbps']:.2f} GB/s | "
            f"{result['raw_' + d.lower() + '_gbps']:.2f} GB/s | "
            f"{result[op + '_gbps'] / result['raw_' + d.lower() + '_gbps']:.2f} |"
            for op, d in (("put", "H2D"), ("get", "D2H"))]


if __name__ == "__main__":
    import sys

    mib = float(sys.argv[1]) if len(sys.argv) > 1 else 80.0
    res = gpu_round(int(mib * 2**20) // 4096 * 4096, 200)
    print("\n".join(lines(res)))
