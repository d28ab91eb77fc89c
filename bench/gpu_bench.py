"""GPU section of `make bench` and `make device-check`: the GPU tier against the physical limit of its path.

For each block size (80, 32, 2 and 0.5 MiB by default):
- batched, as `--request-io batched` moves them (the default in block mode): the tier's batches of --batch blocks
  (16 unless told) each way, put_many (host -> HBM), get_many (HBM -> host) and the demotion batch into the CPU
  tier's registered arena (move_many_to: one D2H batch, as the cache demotes a batch's victims), against the link:
  one copy of the same bytes each way between page-locked host memory and HBM, synchronised once, measured in the
  same rounds (the issue's targets: >= 0.95 of it from 2 MiB, >= 0.85 at 0.5 MiB). The tier's HBM is contiguous
  slots here; the paged layout's batches are paged_bench.py's;
- one block at a time, as `--request-io serial` moves them: put and get of the tier against a raw copy of the same
  size from the *same registered host buffer* on one stream (cudaMemcpyAsync + that stream's synchronisation):
  the tier's own cost (slot lookup, lane, placement, Python) is the only difference; the demotion GPU -> CPU (one
  block into the CPU tier's arena) against a raw D2H copy into pinned memory. A copy synchronised per block is
  itself below the link at small blocks (0.54-0.58 of it at 512 KiB on an H200): these rows say what the tier adds
  to that, not how near the link it is.

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
BATCH = 16  # blocks a batch: the target shape (2 MiB blocks in batches of 16)


def _timed(op, n: int) -> float:
    """Seconds per operation of n back-to-back calls op(i)."""
    start = time.perf_counter()
    for i in range(n):
        op(i)
    return (time.perf_counter() - start) / n


def _batches(call, n: int, batch: int, items) -> None:
    """Every batch of n blocks through call (a tier's batch verb); every block of each must have completed."""
    for w in range(0, n, batch):
        done = call(items(w))
        bad = [d for d in done if isinstance(d, BaseException) or d is None]
        if bad:
            raise RuntimeError(f"a batch's block failed: {bad[0]!r}")


def size_round(backend, block: int, ops: int, rounds: int, batch: int = BATCH) -> dict:
    from kv_cache.buffers import aligned_buffer
    from kv_cache.tiers.cpu import CpuTier
    from kv_cache.tiers.devices import D2H, H2D
    from kv_cache.tiers.gpu import GpuTier

    ops = max(ops, batch) // batch * batch  # whole batches
    tier = GpuTier(backend, ops * block, block, [0], lanes=1, staging_bytes=block)
    cpu = CpuTier(ops * block, block)
    host = aligned_buffer(block)
    host[:] = 7
    tier.pin_host(host)  # registered, as the run registers the workers' buffers
    hosts = aligned_buffer(batch * block)  # a batch's blocks, each in a buffer of its own (a worker's batch arena)
    tier.pin_host(hosts)
    views = [hosts[j * block:(j + 1) * block] for j in range(batch)]
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

    def link(kind):  # every byte of the phase in one copy, synchronised once: the link's own rate
        addr = raw_pinned.ctypes.data

        def op(_):
            backend.copy_ptr(kind, base, addr, ops * block, stream)
            backend.sync(stream)
        return op

    def many(verb):
        return lambda _: _batches(verb, ops, batch, lambda w: [(w + j, views[j]) for j in range(batch)])

    def demote_many(_):
        _batches(lambda items: tier.move_many_to(items, cpu), ops, batch,
                 lambda w: [(w + j, block) for j in range(batch)])
        for i in range(ops):
            tier.delete(i)

    pairs = {op: ref for op, ref, _ in ROWS}  # ours -> its reference (ROWS: the table's rows say the same)
    ratios: dict[str, list[float]] = {k: [] for k in pairs}
    times: dict[str, list[float]] = {k: [] for k in (*pairs, *pairs.values())}
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
        # the phase's blocks as batches, and the link once each way: seconds per block, as the rows above
        t.update({"put_many": _timed(many(tier.put_many), 1) / ops, "link_h2d": _timed(link(H2D), 1) / ops,
                  "get_many": _timed(many(tier.get_many), 1) / ops, "link_d2h": _timed(link(D2H), 1) / ops,
                  "demote_many": _timed(demote_many, 1) / ops})
        for i in range(ops):
            cpu.delete(i)
        for k, v in t.items():
            times[k].append(v)
        for k, ref in pairs.items():
            ratios[k].append(t[ref] / t[k])
    staged = sum(v["staged"] for v in tier.transfers().values())
    tier.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"block_mib": block / 2**20, "staged": staged, "batch": batch, "blocks": ops,
            **{f"{k}_ratio": statistics.median(v) for k, v in ratios.items()},
            **{f"{k}_gbps": block / v / 1e9 for k, v in med.items()},
            "fixed_us": {k: (med[k] - med[r]) * 1e6 for k, r in (("put", "raw_h2d"), ("get", "raw_d2h"))}}


def gpu_round(block: int | None = None, blocks: int = 0, fake: bool = False, sizes=SIZES_MIB,
              rounds: int = 5, batch: int = BATCH) -> dict:
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
        rows.append(size_round(backend, size, ops, rounds, batch))
    return {"model": backend.model(0), "sizes": rows}


# each row: the tier's operation, its reference, and how the row names the two
ROWS = (("put_many", "link_h2d", " in batches of {batch} vs the link (one H2D copy of the same bytes)"),
        ("get_many", "link_d2h", " in batches of {batch} vs the link (one D2H copy of the same bytes)"),
        ("demote_many", "link_d2h", " in batches of {batch} into the CPU tier vs the link (one D2H copy)"),
        ("put", "raw_h2d", " a block at a time vs a raw H2D copy synchronised per block"),
        ("get", "raw_d2h", " a block at a time vs a raw D2H copy synchronised per block"),
        ("demote", "raw_d2h_pinned", " a block at a time vs a raw D2H copy into pinned, synchronised per block"))


def lines(result: dict | None) -> list[str]:
    if not result or "skipped" in result:
        return [f"| GPU tier (no GPU here: {result['skipped'] if result else 'not run'}) | - | - | - |"]
    out = []
    for r in result["sizes"]:
        for op, ref, what in ROWS:
            out.append(f"| GPU tier {op} {r['block_mib']:g} MiB{what.format(batch=r['batch'])}, {result['model']} | "
                       f"{r[op + '_gbps']:.2f} GB/s | {r[ref + '_gbps']:.2f} GB/s | {r[op + '_ratio']:.2f} |")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=float, nargs="+", default=list(SIZES_MIB), help="block sizes, MiB")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--fake", action="store_true", help="the fake device: the tier's fixed cost, no GPU needed")
    p.add_argument("--batch", type=int, default=BATCH, help="blocks a batch (put_many, get_many, the demotions)")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args()
    if a.batch < 1:
        p.error(f"--batch {a.batch}: a batch holds at least one block")
    res = gpu_round(fake=a.fake, sizes=a.sizes, rounds=a.rounds, batch=a.batch)
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
