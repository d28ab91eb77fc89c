"""GPU section of `make bench` and `make device-check`: the GPU tier against the physical limit of its path.

For each block size (80, 32, 2 and 0.5 MiB by default):
- put (host -> HBM) and get (HBM -> host) of the tier against a raw copy of the same size from the *same
  registered host buffer* on one stream (cudaMemcpyAsync + that stream's synchronisation): the tier's own cost
  (slot lookup, lane, placement, Python) is the only difference;
- the demotion GPU -> CPU (the tier's move into the CPU tier's registered arena, as the cache runs it) against a
  raw D2H copy into pinned memory.

The raw copy visits as many device places as the tier has slots, in the same order. Rounds alternate ours
and the raw copy (a shared machine drifts); each figure is the median of the rounds' ratios (raw time / ours:
1.0 is the copy's own speed). `--fake` runs the same on the fake device (host memory standing in for HBM): what
it shows is the tier's fixed cost per operation against a memmove, which decides small blocks; it needs no
GPU. Without a GPU (and without --fake) it says so in one line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SIZES_MIB = (80.0, 32.0, 2.0, 0.5)


def _timed(op, n: int) -> float:
    """Seconds per operation of n back-to-back calls op(i)."""
    start = time.perf_counter()
    for i in range(n):
        op(i)
    return (time.perf_counter() - start) / n


def size_round(backend, block: int, ops: int, rounds: int) -> dict:
    from kv_cache.buffers import aligned_buffer
    from kv_cache.tiers.cpu import CpuTier
    from kv_cache.tiers.devices import D2H, H2D
    from kv_cache.tiers.gpu import GpuTier

    tier = GpuTier(backend, ops * block, block, [0], lanes=1, staging_bytes=block)
    cpu = CpuTier(ops * block, block)
    host = aligned_buffer(block)
    host[:] = 7
    tier.pin_host(host)  # registered, as the run registers the workers' buffers
    tier.pin_host(cpu.arena)
    raw_dev = backend.alloc_device(0, ops * block)  # as many places as the tier's slots, visited in turn
    raw_pinned = backend.alloc_pinned(ops * block)  # as large as the CPU tier's arena, visited in turn
    stream = backend.stream(0)

    base = backend.address(raw_dev)

    def raw(kind, buf, step=0):
        addr = buf.ctypes.data  # the copy alone: addresses taken once, as a C loop would

        def op(i):
            backend.copy_ptr(kind, base + i * block, addr + i * step, block, stream)
            backend.sync(stream)
        return op

    def put(i):
        tier.put(i, host)

    def get(i):
        tier.get(i, host)

    def demote(i):
        tier.move_to(i, cpu)
        tier.delete(i)

    ratios: dict[str, list[float]] = {"put": [], "get": [], "demote": []}
    times: dict[str, list[float]] = {k: [] for k in ("put", "get", "demote", "raw_h2d", "raw_d2h", "raw_d2h_pinned")}
    for i in range(2):  # first touch of the slots and the copy engines, outside the clock
        put(i)
        get(i)
        tier.delete(i)
    for _ in range(rounds):
        t = {"put": _timed(put, ops), "raw_h2d": _timed(raw(H2D, host), ops),
             "get": _timed(get, ops), "raw_d2h": _timed(raw(D2H, host), ops),
             "demote": _timed(demote, ops), "raw_d2h_pinned": _timed(raw(D2H, raw_pinned, block), ops)}
        for i in range(ops):
            cpu.delete(i)
        for k, v in t.items():
            times[k].append(v)
        ratios["put"].append(t["raw_h2d"] / t["put"])
        ratios["get"].append(t["raw_d2h"] / t["get"])
        ratios["demote"].append(t["raw_d2h_pinned"] / t["demote"])
    staged = sum(v["staged"] for v in tier.transfers().values())
    tier.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"block_mib": block / 2**20, "staged": staged,
            **{f"{k}_ratio": statistics.median(v) for k, v in ratios.items()},
            **{f"{k}_gbps": block / v / 1e9 for k, v in med.items()},
            "fixed_us": {k: (med[k] - med[r]) * 1e6 for k, r in (("put", "raw_h2d"), ("get", "raw_d2h"))}}


def gpu_round(block: int | None = None, blocks: int = 0, fake: bool = False, sizes=SIZES_MIB,
              rounds: int = 5) -> dict:
    """The table's data: {"model", "sizes": [...]}, or {"skipped": why} without a device."""
    from kv_cache.tiers.devices import FakeDevice, open_cupy

    backend, why = (FakeDevice(hbm_bytes=8 << 30), "") if fake else open_cupy()
    if backend is None:
        return {"skipped": why}
    chosen = [block / 2**20] if block else list(sizes)
    rows = []
    for mib in chosen:
        size = int(mib * 2**20) // 4096 * 4096
        ops = blocks or max(8, min(200, int((2 << 30) // size)))  # about 2 GiB a phase, 8 to 200 blocks
        rows.append(size_round(backend, size, ops, rounds))
    return {"model": backend.model(0), "sizes": rows}


def lines(result: dict | None) -> list[str]:
    if not result or "skipped" in result:
        return [f"| GPU tier (no GPU here: {result['skipped'] if result else 'not run'}) | - | - | - |"]
    out = []
    for r in result["sizes"]:
        for op, raw, what in (("put", "raw_h2d", "H2D"), ("get", "raw_d2h", "D2H"),
                              ("demote", "raw_d2h_pinned", "D2H into pinned")):
            out.append(f"| GPU tier {op} {r['block_mib']:g} MiB vs raw {what} copy, {result['model']} | "
                       f"{r[op + '_gbps']:.2f} GB/s | {r[raw + '_gbps']:.2f} GB/s | {r[op + '_ratio']:.2f} |")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=float, nargs="+", default=list(SIZES_MIB), help="block sizes, MiB")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--fake", action="store_true", help="the fake device: the tier's fixed cost, no GPU needed")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args()
    res = gpu_round(fake=a.fake, sizes=a.sizes, rounds=a.rounds)
    if "skipped" in res:
        print(f"gpu_bench: no GPU here ({res['skipped']}); nothing measured.")
        return 0
    print("| what | ours | the copy alone | ratio (median of rounds) |\n|---|---|---|---|")
    print("\n".join(lines(res)))
    for r in res["sizes"]:
        print(f"  {r['block_mib']:g} MiB: fixed cost per op over the raw copy: put {r['fixed_us']['put']:.1f} us, "
              f"get {r['fixed_us']['get']:.1f} us; staged transfers {r['staged']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
