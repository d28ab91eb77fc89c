"""What a run says about itself: the banner before the clock, the run section of the Results, warnings."""

from __future__ import annotations

import socket
import time

from kv_cache import __version__
from kv_cache.config import Settings
from kv_cache.recorder.results_schema import Results
from kv_cache.recorder.verdict import arrival_of, load_knob, workers_said
from kv_cache.run.distributed import Dist
from kv_cache.run.sizing import batch_depth
from kv_cache.run.stack import RunContext
from kv_cache.run.traffic import Traffic, makes_users
from kv_cache.scheduler.runner import RunOutcome
from kv_cache.sources.sharegpt import CHANGED
from kv_cache.tiers.base import FAKE_IO, SIMULATED


def _describe(traffic: Traffic, analysis: dict) -> list[str]:
    p, o, th = analysis["prompt_tokens"], analysis["output_tokens"], analysis["theoretical_hit_rate"]
    src = traffic.source if traffic.trace is None else f"{traffic.source} trace"  # its source is its format
    total = analysis["requests_total"]
    lines = [f"  traffic: {src}, arrival {traffic.arrival}, {f'{total:,}' if total else 'unbounded'} requests"]
    if traffic.trace is not None:
        skipped = traffic.trace.log.skipped
        if skipped:
            lines.append("  trace records skipped: " + ", ".join(f"{k} {v}" for k, v in skipped.items()))
        changed = traffic.trace.log.changed
        if changed:
            lines.append("  trace turns kept with a change: " + ", ".join(f"{k} {v:,} ({CHANGED[k]})"
                                                                        for k, v in changed.items()))
        lines += [f"    {e}" for e in traffic.trace.log.examples[:3]]
        if traffic.trace.tokenizer:
            lines.append(f"  tokenizer: {traffic.trace.tokenizer}")
    if p["count"]:
        lines.append(f"  prompt tokens p50 {p['p50']:,.0f} / p90 {p['p90']:,.0f} / max {p['max']:,}; output tokens "
                     f"p50 {o['p50']:,.0f} / max {o['max']:,}; theoretical hit rate (infinite cache) "
                     f"{th['tokens']:.1%}" if th["tokens"] is not None else "")
    if th["tokens"] == 0 and analysis["requests_analysed"]:
        lines.append("  note: no two requests of this traffic share a prefix (a length-only trace's tokens are all "
                     "new): the possible hit rate is 0 %, so the storage sees writes and demotions, no reuse; for "
                     "reuse replay a hash-id trace (Mooncake, Bailian) or conversations (ShareGPT)")
    return lines + [f"  note: {n}" for n in traffic.notes]


def _tier_info(t) -> dict:
    """A tier's line in results.json (the handoff's block space is not a tier: it has no transfer counts)."""
    transfers = getattr(t, "transfers", None)
    return {"capacity_bytes": t.capacity_bytes, "description": t.description, "simulated": SIMULATED in t.flags,
            "null": FAKE_IO in t.flags, "transfers": transfers() if transfers else None,
            "staged_why": getattr(t, "staged_why", ""), "batches": t.batch_path() if hasattr(t, "batch_path") else "",
            "hbm_layout": t.hbm_layout() if hasattr(t, "hbm_layout") else None,
            "io_depth": getattr(t, "io_depth", None), "io_unit_bytes": getattr(t, "io_unit_bytes", None)}


def _users(s: Settings, traffic: Traffic) -> int:
    """The users made: --users of synthetic or semantic ones, a closed-loop trace's (one a conversation at most), and
    none where requests come at a trace's times, a rate or in its order, or from a prefill node."""
    if traffic.users_made is not None:
        return traffic.users_made
    return s.workload.users if makes_users(traffic.source, traffic.arrival) else 0


def run_info(s: Settings, b: RunContext, run_id: str, outcome: RunOutcome, dist: Dist, traffic: Traffic) -> dict:
    site = b.site
    return {
        "rank": dist.rank, "ranks": dist.size, "hosts": [dist.host], "wall_offset_ns": dist.wall_offset_ns,
        "tool_version": __version__, "run_id": run_id, "host": socket.gethostname(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - (time.monotonic_ns()
                                     - outcome.start_ns) / 1e9)),
        "model": b.geo.model.name, "kv_dtype": s.model.kv_dtype, "tp": s.model.tp,
        "bytes_per_token": b.geo.bytes_per_token, "block_tokens": s.model.block_tokens,
        "block_bytes": b.geo.block_bytes, "slot_bytes": b.geo.slot_bytes,
        "users": _users(s, traffic),
        "workers": b.workers, "workers_probe": [{"threads": k, "gbps": g} for k, g in b.probe] or None,
        "seed": s.run.seed, "warmup_s": s.run.warmup_s,
        "io_engine": site.engine if site else ("null" if s.tiers.null_io else "none"),
        "io_engine_requested": s.tiers.io_engine,
        "io_engine_note": site.engine_note if site else "", "nvme_layout": s.tiers.nvme_layout,
        "cache_dir": site.cache_dir if site else None, "fs_type": site.fs_type if site else None,
        "tiers": {t.name: _tier_info(t) for t in b.tiers + ([b.handoff.blocks] if b.handoff is not None else [])},
        "bottom_tier": "handoff" if s.disagg.role == "decode" else b.tiers[-1].name,  # what it loads prefixes from
        "gds": None if b.gds is None else {"mode": b.gds.mode, "demoted_blocks": b.gds.demoted,
                                           "loaded_blocks": b.gds.loaded},
        "request_io": "batched" if batch_depth(s, b.geo.io_bytes) else "serial",
        "max_inflight": batch_depth(s, b.geo.io_bytes) or 1,
        "notes": b.notes, "partial": outcome.partial, "stopped_reason": outcome.stopped_reason,
        "issuing_s": outcome.issuing_s,
        "fault": outcome.fault,
    }


def _decode_node(results: Results) -> bool:
    """A disaggregated decode node: its load and its end are its prefill node's, not its own flags'."""
    return arrival_of(results) == "handoff"


def nothing_measured(results: Results) -> str:
    """Why no request completed in the window, or '' when some did (or the run was cut short)."""
    if results.requests.completed or results.run.partial:
        return ""
    if results.run.stopped_reason == "trace_end" and _decode_node(results):
        when = (f"{results.run.duration_s:.1f} s into this decode node's window" if results.run.duration_s >= 0.05
                else "before this decode node's window opened")
        return (f"nothing was measured: the prefill node ended its manifest {when}, before any request completed in "
                f"the window (the warm-up took the rest); give the prefill node a longer --duration, or lower this "
                f"node's --warmup")
    if results.run.stopped_reason == "trace_end":
        return (f"nothing was measured: the trace ran out {results.run.duration_s:.1f} s into the window, before "
                f"any request completed in it (the warm-up took the rest); lower --warmup or --trace-speedup")
    req = results.requests
    if results.run.stopped_reason == "max_requests" and req.warmup_completed == req.issued:
        return (f"nothing was measured: all {req.issued:,} requests of --max-requests completed inside the "
                f"{results.run.warmup_s:g} s warm-up; raise --max-requests or lower --warmup")
    return (f"nothing was measured: no request completed in the {results.run.duration_s:.1f} s window; raise "
            f"--duration or lower the load")


def warnings_of(results: Results) -> list[str]:
    out = [why] if (why := nothing_measured(results)) else []
    moved = results.bytes.get(results.bottom)
    if results.requests.completed and not (moved and (moved.read or moved.write)):
        arrival = arrival_of(results)
        fix = load_knob(arrival) + ("" if arrival == "handoff" else " or lower --cpu-mem-gb")
        out.append(f"the {results.bottom} tier saw no traffic in the window: the numbers describe memory tiers "
                   f"only; {fix}.")
    for name, tier in results.run.tiers.items():
        staged = sum(t.staged for t in (tier.transfers or {}).values())
        if staged:
            total = staged + sum(t.direct for t in tier.transfers.values())
            out.append(f"{staged:,} of {total:,} {name} transfers were staged through a pinned bounce buffer (a "
                       f"host copy inside the timed operation): {tier.staged_why}.")
    if results.verification.failures:
        out.append(f"{results.verification.failures} blocks read back wrong (stamp mismatch): the storage "
                   f"returned torn, stale or foreign data.")
    if results.run.stopped_reason == "backlog":
        req = results.requests
        out.append(f"the run stopped issuing {req.issued:,} requests in: those issued and not yet done held "
                   f"{req.backlog_bytes_at_stop / 2**20:,.1f} MiB, past --max-backlog-gb, with {req.per_s:.2f} served "
                   f"a second; the load offered is more than the storage serves (an open loop's queue grows until "
                   f"memory runs out): lower --request-rate, or raise --max-backlog-gb to measure a longer queue.")
    if results.run.partial:
        out.append(f"partial results: the run stopped early ({results.run.stopped_reason}).")
    return out


def planned_writes(s: Settings, b: RunContext, analysis: dict) -> str:
    """What the run will write, said before it writes: new KV per request from the analysed traffic, and, where
    the probe measured the storage, about how much it writes at the probe's pace in the time the run lasts."""
    counts, n = analysis.get("counts") or {}, analysis.get("requests_analysed") or 0
    out = analysis.get("output_tokens") or {}
    if not n or not counts.get("prompt"):
        return ""
    new_tokens = (counts["prompt"] - counts.get("cached", 0)) / n + (out.get("mean") or 0)
    bottom = b.tiers[-1]
    line = (f"  writes: about {new_tokens * b.geo.bytes_per_token / 2**20:,.1f} MiB of new KV per request (the "
            f"analysed traffic's misses and answers, {b.geo.bytes_per_token:,} B/token), into tiers of "
            + ", ".join(f"{t.name} {t.capacity_bytes / 2**30:.2f} GiB" for t in b.tiers)
            + f"; once the {bottom.name} tier is full, new blocks replace old ones there")
    if b.probe:  # the device's own pace bounds what the run can write into it
        best = max(g for _, g in b.probe)
        seconds = s.run.warmup_s + s.run.duration_s + s.run.drain_s
        # NOTE: not a bound: the probe keeps one object a thread in flight, reads and writes, and a run measured
        # on a 2-core VM (mmap engine, batched) wrote 3.2 GB where this said "at most about 1 GB"
        line += (f"; at the probe's best {best:.2f} GB/s (reads and writes together) the {seconds:g} s of warm-up, "
                 f"window and drain write about {best * seconds:,.0f} GB there (an estimate, not a bound: deeper "
                 f"queues and the page cache move more; what it wrote is in the summary)")
    return line


def banner(s: Settings, b: RunContext, traffic: Traffic, analysis: dict, dist: Dist) -> list[str]:
    lines = [f"  tier {t.name}: {t.capacity_bytes / 2**30:.2f} GiB, {t.description}" for t in b.tiers]
    lines += [f"  note: {n}" for n in b.notes] + _describe(traffic, analysis)
    writes = planned_writes(s, b, analysis)
    return lines + ([writes] if writes else [])


def running_line(s: Settings, b: RunContext, traffic: Traffic, dist: Dist) -> str:
    """Said as the clock starts (from inside the runner's watch for Ctrl-C), so a signal after it always keeps
    results: the preconditioning and the workers' buffers come before it."""
    who = f"{len(traffic.users)} users" if traffic.users is not None else f"open loop ({traffic.arrival})"
    ranks = f" on each of {dist.size} MPI ranks (rank 0 shown)" if dist.active else ""
    return (f"  running: {s.run.warmup_s:g} s warm-up + {s.run.duration_s:g} s measured, {who}, "
            f"{workers_said(b.workers)}{ranks} (Ctrl-C stops cleanly)")
