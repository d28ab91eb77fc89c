"""The telemetry of a run merged over MPI ranks, said per host: every rank samples its whole host, so ranks that
share one see the same CPU and the same disk, and a disk's bytes are held against all of its ranks' bytes (a
rank's own ratio read 2.0x with two ranks on one disk)."""

from __future__ import annotations

from kv_cache.model import GiB
from kv_cache.recorder.results_schema import Results
from kv_cache.report.device_latency import device_latency_lines


def _ranks(ranks: list[int | None]) -> str:
    known = sorted(r for r in ranks if r is not None)
    if len(known) > 1 and known == list(range(known[0], known[-1] + 1)):
        return f"ranks {known[0]}-{known[-1]}"
    return ("rank " if len(known) == 1 else "ranks ") + ", ".join(map(str, known))


def _disk(group: list) -> str:
    """One disk's bytes (the most any of its ranks saw in its window) beside the sum of its ranks' own."""
    disks = [t.disk for _, t in group]
    read, write = max(d.read_bytes for d in disks), max(d.write_bytes for d in disks)
    ours = [(d.benchmark_read_bytes, d.benchmark_write_bytes) for d in disks]
    text = f"disk {disks[0].device} (block layer): read {read / 1e9:.2f} GB, written {write / 1e9:.2f} GB"
    if any(r is None or w is None for r, w in ours):
        return text
    shown = [f"{k} {dev / sum(x):.2f}x" for k, dev, x in (("read", read, [r for r, _ in ours]),
                                                          ("write", write, [w for _, w in ours])) if sum(x)]
    return text + (f" = {', '.join(shown)} its {len(group)} rank(s)' bytes" if shown else "")


def _device_latency(group: list) -> list[str]:
    """The host's disk latency from one rank's trace: each rank traces every request of the disk, its own and the
    other ranks', so two ranks' histograms added would count each request twice."""
    traced = [(r, t.device_latency) for r, t in group if t.device_latency is not None]
    rank, d = next(((r, d) for r, d in traced if not d.unavailable), traced[0] if traced else (None, None))
    whose = f"rank {rank}'s trace, every rank's requests: " if len(group) > 1 and rank is not None else ""
    return device_latency_lines(d, "    device ", "      ", whose)


def per_host_lines(results: Results) -> list[str]:
    """Telemetry lines of a merged run (its own telemetry is None), one a host and one a disk of it."""
    per_rank, detail = results.telemetry_per_rank, results.ranks_detail
    if results.telemetry is not None or not per_rank or not detail or len(per_rank) != len(detail):
        return []
    hosts: dict[str, list] = {}
    for d, t in zip(detail, per_rank):
        if t is not None:
            hosts.setdefault(d.host, []).append((d.rank, t))
    lines = []
    for host, group in hosts.items():
        cpu = [t.host_cpu_pct_mean for _, t in group if t.host_cpu_pct_mean is not None]
        mem = [t.host_mem_used_bytes_max for _, t in group if t.host_mem_used_bytes_max is not None]
        said = []
        if cpu:
            peak = max(mem or [0]) / GiB
            said.append(f"host CPU {sum(cpu) / len(cpu):.0f}% busy (mean), memory used peak {peak:.2f} GiB")
        disks: dict[str, list] = {}
        for r, t in group:
            if t.disk is not None:
                disks.setdefault(t.disk.device, []).append((r, t))
        said += [_disk(g) for g in disks.values()]
        lines.append(f"{host} ({_ranks([r for r, _ in group])}): " + ("; ".join(said) or "nothing sampled"))
        lines += _device_latency(group)
    if not lines:
        return []
    head = "Telemetry  per host (each rank samples its whole host over its window: ranks on one share its figures)"
    return [head] + [f"           {line}" for line in lines]
