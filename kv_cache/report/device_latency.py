"""The disk's own latency per block request (the block layer's, traced), beside the per-block latency: fio's clat
against the device's. Said for a run, and for each host of a run merged over MPI ranks."""

from __future__ import annotations

from kv_cache.report.table import ms, pct_ms


def device_latency_lines(d, first: str = "Device     ", more: str = "           ", whose: str = "") -> list[str]:
    """first: the first line's lead, more: the op lines'; whose: whose trace it is, said before its source."""
    if d is None:
        return []
    if d.unavailable:
        return [f"{first}latency per block request: not measured ({d.unavailable})"]
    lines = [f"{first}latency per block request, ms ({whose}{d.source}; a block may be several requests; "
             f"{sum(d.requests_whole_run.values()):,} requests in the whole run, {d.lost_events} lost)"]
    for op in ("read", "write"):
        s = getattr(d, op)
        if s is not None and s.count:
            lines.append(f"{more}{op:<5} {s.count:>9,} requests  p50 {pct_ms(s, 'p50')}  p95 {pct_ms(s, 'p95')}"
                         f"  p99 {pct_ms(s, 'p99')}  max {ms(s.max)}")
    return lines
