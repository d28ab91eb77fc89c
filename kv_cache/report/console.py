"""Console summary: a pure function of the Results.

Its centre is the table of per-block latency percentiles for each tier and
operation; simulated tiers are labelled as such on every line they appear.
"""

from __future__ import annotations

from kv_cache import counters as C
from kv_cache.recorder.results_schema import Results
from kv_cache.recorder.verdict import arrival_of, null_bottom, pace, workers_said
from kv_cache.report.capacity import capacity_lines
from kv_cache.report.device_latency import device_latency_lines
from kv_cache.report.load_lines import sections
from kv_cache.report.ranks_telemetry import per_host_lines
from kv_cache.report.semantic_lines import semantic_section
from kv_cache.report.table import format_table, pct_ms
from kv_cache.report.table import ms as _ms
from kv_cache.report.trials import section as trials_section
from kv_cache.types import INJECTED, SOURCES

OP_ORDER = ("read", C.io_op("read"), "donor_read", "write", C.io_op("write"), "promote", "demote", C.io_op("demote"),
            "evict")
MiB, GiB = 2**20, 2**30


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _table(rows: list[list[str]]) -> list[str]:
    return format_table(rows, 2, "  ")


def source_order(results: Results) -> list[str]:
    """The sources of this traffic in one fixed order: those the pre-run analysis saw and those the run
    measured, so a source without hits in this run shows 'n/a' instead of vanishing."""
    theory = results.workload.theoretical_hit_rate.by_source
    seen = set(theory) | set(results.hit_rate.by_source) | set(results.tokens.prompt_by_source)
    return [s for s in SOURCES if s in seen] + sorted(seen - set(SOURCES))


def tier_label(results: Results, tier: str) -> str:
    info = results.run.tiers.get(tier)
    if info is None:
        return tier
    return f"{tier} (SIMULATED)" if info.simulated else (f"{tier} (null)" if info.null else tier)


def _who(results: Results) -> str:
    """Who asks: users where they exist (synthetic and semantic ones, a trace's closed-loop users: one a conversation
    at most); a trace's requests at their times or a rate, or a prefill node's, have none (--users is not used)."""
    w = results.workload
    if w.source == "handoff":
        return "the prefill node's requests"
    if w.source in ("synthetic", "semantic") or w.arrival == "closed":
        return f"{results.run.users:,} users"
    opened = {"trace": "open loop at the trace's times", "poisson": "open loop (poisson)", "sequence": "one sequence"}
    return opened.get(w.arrival, f"arrival {w.arrival}")


def run_state(results: Results) -> str:
    """complete, PARTIAL (why it stopped early) or NOTHING MEASURED: the header's word, and compare's."""
    run = results.run
    if run.partial:
        return f"PARTIAL ({run.stopped_reason})"
    return "complete" if results.requests.completed else "NOTHING MEASURED"


def header(results: Results) -> list[str]:
    run = results.run
    state = run_state(results)
    size = run.block_bytes / MiB if run.block_tokens else None
    block = f"block {run.block_tokens} tokens = {size:.2f} MiB" if size else "whole-request objects"
    lines = [f"kv-cache-bench {run.tool_version}  run {run.run_id}  [{state}]",
             f"  model {run.model} ({run.kv_dtype}, tp {run.tp}, {run.bytes_per_token:,} B/token), "
             f"{block}; {_who(results)}, {workers_said(run.workers)}{' a rank' if run.ranks > 1 else ''}, "
             f"seed {run.seed}, "
             f"window {run.duration_s:.1f} s{_drain(results)} after {run.warmup_s:g} s warm-up"]
    if run.ranks > 1:
        spread = (results.rank_spread or {}).get(results.bottom, {})
        detail = ", ".join(f"{d} {v.min:.3f}-{v.max:.3f} GB/s" for d, v in spread.items() if v.spread is not None)
        lines.append(f"  {run.ranks} MPI ranks on {', '.join(run.hosts)}; histograms merged exactly; tier "
                     f"capacities summed over ranks" + (f"; {results.bottom} per rank: {detail}" if detail else ""))
    for name, t in run.tiers.items():
        size = f"{t.capacity_bytes / GiB:8.2f}" if t.capacity_bytes else f"{'-':>8}"  # a space of another node's
        lines.append(f"  tier {tier_label(results, name):<16} {size} GiB  {t.description}")
    lines += _preconditioned(results)
    lines += _injected(results)
    lines += [f"  note: {n}" for n in run.notes]
    if run.fault:
        lines.append(f"  FAULT: {run.fault}")
    return lines


def _preconditioned(results: Results) -> list[str]:
    """--precondition's passes: the state the device was measured in (said before the run, and in results.json;
    the summary a reader keeps said nothing of it)."""
    pre = results.precondition
    if pre is None:
        return []
    rates = ", ".join(f"{g:.2f}" for g in pre.gbps)
    steady = ("" if pre.steady is None else f"; steady within {pre.steady_tolerance:.0%}" if pre.steady
              else f"; not steady within {pre.passes} passes")
    return [f"  preconditioned: the {pre.tier or results.bottom} tier written whole in {pre.passes} pass"
            f"{'es' if pre.passes != 1 else ''} before the clock ({pre.bytes_per_pass / GiB:.2f} GiB each, at {rates} "
            f"GB/s{steady})"]


def _injected(results: Results) -> list[str]:
    """What the benchmark added to a trace's prompts (a shared system prompt before each conversation that had none)
    and how much of the hit rate it made: a modelling choice the user must see first."""
    tok = results.tokens
    injected = tok.prompt_by_source.get(INJECTED, 0)
    if not injected or not tok.prompt:
        return []
    served, own = tok.cached_by_source.get(INJECTED, 0), tok.prompt - injected
    own_rate = f"{(tok.cached - served) / own:.1%}" if own else "-"
    return [f"  injected: a shared system prompt the benchmark put before each trace conversation that had none makes "
            f"{injected / tok.prompt:.1%} of the prompt tokens and {served / tok.prompt:.1%} of the "
            f"{_pct(results.hit_rate.tokens)} hit rate (the trace's own tokens: {own_rate} hit); "
            f"--set workload.num_system_prompts=0 replays the trace as it is"]


def latency_section(results: Results) -> list[str]:
    run = results.run
    unit = f"{run.block_bytes / MiB:.2f} MiB blocks" if run.block_tokens else "whole-request objects"
    rows = [["tier", "op", "count", "p50", "p90", "p95", "p99", "p99.9", "max"]]
    for tier, ops in results.latency_ms.items():
        for op in sorted(ops, key=lambda o: OP_ORDER.index(o) if o in OP_ORDER else 99):
            s = ops[op]
            rows.append([tier_label(results, tier), op, f"{s.count:,}", *(pct_ms(s, k) for k in
                         ("p50", "p90", "p95", "p99", "p999")), _ms(s.max)])
    if len(rows) == 1:
        return ["", "Per-block latency: no block operation in the measurement window."]
    return (["", f"Per-block latency, ms ({unit}; demote/promote = whole move into the tier named; '-': fewer "
                 f"samples than the percentile needs, e.g. 1,000 for p99.9)"] + _table(rows))


def bandwidth_section(results: Results) -> list[str]:
    window = results.run.duration_s
    rows = [["tier", "", "read GB/s", "write GB/s", "read IOPS", "write IOPS", "read GiB", "written GiB"]]
    for tier, bw in results.bandwidth_gbps.items():
        b = results.bytes[tier]
        info = results.run.tiers.get(tier)
        if info is not None and info.null:
            rows.append([tier_label(results, tier), "", "-", "-", "-", "-", "no bytes move", ""])
            continue
        n = results.blocks.get(tier)
        iops = [f"{getattr(n, d) / window:,.0f}" if n is not None and window else "-" for d in ("read", "write")]
        rows.append([tier_label(results, tier), "", f"{bw.read:.3f}", f"{bw.write:.3f}", *iops,
                     f"{b.read / GiB:.2f}", f"{b.write / GiB:.2f}"])
    layers = results.settings.get("tiers", {}).get("io_unit") == "layer"
    unit = "blocks per second, each moved as one I/O" if not layers else "blocks per second (each several I/Os)"
    return (["", f"Bandwidth over the {window:.1f} s window (demotions included; IOPS: {unit}; GB = 10^9 B, "
                 f"GiB = 2^30 B)"] + _table(rows) + _whole_run(results) + _depths(results))


def _depths(results: Results) -> list[str]:
    """Per tier and batch kind (--request-io batched): the blocks a worker's batches asked for, and the I/Os its
    medium had in flight, measured ('-' where the medium does not time a batch's I/Os)."""
    parts = []
    for tier, kinds in results.queue_depth.items():
        for kind, q in kinds.items():
            flying = (f"{q.in_flight_mean:.1f} I/Os in flight (p95 {q.in_flight_p95:g})"
                      if q.in_flight_mean is not None else "I/Os in flight -")
            parts.append(f"{tier_label(results, tier)} {kind} {q.mean:.1f} blocks a batch (p95 {q.p95:g}), {flying}")
    if not parts:
        return []
    return ["  queue depth per worker, mean over its batches ('-': the medium does not time a batch's I/Os): "
            + "; ".join(parts)]


def _whole_run(results: Results) -> list[str]:
    """What the run really wrote and read, warm-up and drain included (the device's wear, the disk's use)."""
    moved = [(t, b) for t, b in results.bytes_whole_run.items()
             if not results.run.tiers[t].null and (b.read or b.write)] if results.run.tiers else []
    if not moved:
        return []
    return ["  whole run (warm-up and drain included): " + ", ".join(
        f"{tier_label(results, t)} wrote {b.write / GiB:,.2f} GiB, read {b.read / GiB:,.2f} GiB" for t, b in moved)]


def traffic_section(results: Results) -> list[str]:
    req, tok, hit = results.requests, results.tokens, results.hit_rate
    lat = results.request_latency_ms

    def pcts(name):
        s = lat.get(name)
        return "-" if not s or not s.count else (f"p50 {pct_ms(s, 'p50')} / p95 {pct_ms(s, 'p95')} / p99 "
                                                  f"{pct_ms(s, 'p99')} ms ({s.count:,} requests)")

    cached_tiers = ", ".join(f"{t} {n:,}" for t, n in tok.cached_by_tier.items() if n)
    sources = ", ".join(f"{k} {_pct(hit.by_source.get(k))}" for k in source_order(results))
    ver = results.verification
    mem = results.memory
    lines = ["",
             f"Requests   {req.issued:,} issued = {req.warmup_completed:,} completed in warm-up + {req.completed:,} "
             f"completed in the window ({req.per_s:.2f}/s) + {req.dropped_at_stop:,} queued at stop (dropped) + "
             + (f"{req.abandoned_at_stop:,} abandoned after --drain-s + " if req.abandoned_at_stop else "")
             + f"{req.in_flight_at_end:,} in flight",
             *_verdict(results),
             *_pacing(results), *_turn_order(results),
             f"  storage time per request {pcts('storage')}",
             f"  queue wait               {pcts('queue')}",
             f"  storage part of TTFT     {pcts('ttft')}",
             f"  end to end               {pcts('e2e')}",
             f"Tokens     prompt {tok.prompt:,} ({tok.per_s:,.0f}/s), served from cache {tok.cached:,} "
             f"({tok.cached_per_s:,.0f}/s{'; ' + cached_tiers if cached_tiers else ''}), generated "
             f"{tok.generated:,}",
             f"Hit rate   {_pct(hit.tokens)} of prompt tokens, {_pct(hit.blocks)} of "
             + ("prompt blocks" if results.run.block_tokens else
                "the history objects looked up (whole-request objects: a first turn looks up none)")
             + (f"; by source (each of its own prompt tokens): {sources}" if sources else ""),
             f"           with an infinite cache: {_infinite(results)}",
             f"           estimated before the run ({_analysed(results)}): {_theoretical(results)}",
             *_not_written(results),
             f"Verify     {ver.mode}: {ver.blocks_checked:,} blocks checked, {ver.failures:,} failures"
             + (f" ({ver.failures_in_warmup:,} in warm-up; {ver.blocks_discarded:,} blocks "
                f"discarded from the cache)  <-- DATA ERRORS" if ver.failures else "")
             + " (whole run, warm-up included)",
             f"Memory     peak RSS {mem.peak_rss_bytes / GiB:.2f} GiB, budget {mem.budget_bytes / GiB:.2f} GiB; CPU "
             f"{results.cpu.process_s:.2f} s in the window (all threads)"
             + (f" = {results.cpu.per_gib_moved:.3f} s per GiB moved" if results.cpu.per_gib_moved else "")]
    m = results.mlperf_compatible
    storage = (f"storage read {m.storage_read_gbps:.3f} GB/s, write {m.storage_write_gbps:.3f} GB/s; storage read "
               f"p95 {_ms(m.storage_read_p95_ms)} ms" if results.storage_gbps("read") is not None else
               "storage: none measured (a null tier: no byte moves)")
    lines.append(f"MLPerf table names: cached tokens/s {m.cached_tokens_per_s:,.0f}; {storage}")
    return lines


WHY_NOT_WRITTEN = {"no_room": "no room in any tier {n} (each slot held for a chain, or in flight)",
                   "parent_gone": "their parent left the cache first {n} (evicted, often for the chain's own room)",
                   "after_cut": "after an earlier block of their request was refused {n} (no lookup reaches them)",
                   "cached": "already cached or being written {n}"}


def _not_written(results: Results) -> list[str]:
    """The new blocks of the window's requests left unwritten, and why: tiers too small for a chain show here."""
    if not results.blocks_write_skipped:
        return []
    by = results.blocks_write_skipped_by
    why = "why not recorded: a results file of schema 19" if by is None else \
        "; ".join(text.format(n=f"{by[k]:,}") for k, text in WHY_NOT_WRITTEN.items() if by.get(k))
    return [f"           new blocks not written: {results.blocks_write_skipped:,} ({why})"]


def telemetry_section(results: Results) -> list[str]:
    t = results.telemetry
    if not t:
        return per_host_lines(results)
    parts = []
    if t.host_cpu_pct_mean is not None:
        parts.append(f"host CPU {t.host_cpu_pct_mean:.0f}% busy (mean), memory used peak "
                     f"{(t.host_mem_used_bytes_max or 0) / GiB:.2f} GiB")
    d = t.disk
    if d is not None and d.device_over_benchmark is not None:
        ratio = {"read": d.device_over_benchmark.read, "write": d.device_over_benchmark.write}
        shown = [f"{k} {v:.2f}x" for k, v in ratio.items() if v is not None]
        parts.append(f"disk {d.device} (block layer): read {d.read_bytes / 1e9:.2f} GB, written "
                     f"{d.write_bytes / 1e9:.2f} GB" + (f" = {', '.join(shown)} the benchmark's" if shown else
                                                        " (the benchmark moved nothing there to compare with)"))
    gpus = "; ".join(f"GPU {g['index']} {g['name']}: util {g.get('util_pct_mean', float('nan')):.0f}%, "
                     f"PCIe rx {g.get('pcie_rx_mbps_mean', float('nan')):.0f} / tx "
                     f"{g.get('pcie_tx_mbps_mean', float('nan')):.0f} MB/s" for g in t.gpus)
    parts.append(gpus or f"GPUs: {t.nvml}")
    return [f"Telemetry  {parts[0]}"] + [f"           {p}" for p in parts[1:]] + device_latency_lines(t.device_latency)


def _infinite(results: Results) -> str:
    """The run's own ceiling (measured on the window's requests) and how close the cache came to it."""
    hit = results.hit_rate
    if hit.infinite_cache is None:
        why = (f"{hit.infinite_cache_untracked:,} requests of the window not tracked" if hit.infinite_cache_untracked
               else "no prompt tokens")
        return f"- ({why})"
    if results.shared_storage.adopted_blocks:  # other processes' blocks served too: this process's own is no bound
        return (f"{_pct(hit.infinite_cache)} (the window's own requests as if alone, measured; "
                f"{results.shared_storage.adopted_blocks:,} blocks other processes wrote in the shared tier were "
                f"served too, so it bounds nothing)")
    steady = ""
    if hit.infinite_cache and hit.tokens is not None:  # how far the cache is from all the reuse the requests offered
        steady = (f"; achieved / infinite {hit.tokens / hit.infinite_cache:.2f} (1.00: the cache held all the reuse "
                  f"these requests offered; far below: too small a cache, or blocks still being written when asked "
                  f"for)")
    return f"{_pct(hit.infinite_cache)} (the window's own requests, measured: a ceiling)" + steady


def _analysed(results: Results) -> str:
    """Which requests the pre-run estimate saw: all of a trace's, or a sample (then it is no bound)."""
    w = results.workload
    if w.trace is not None and w.requests_total and w.requests_analysed >= w.requests_total:
        return f"all {w.requests_total:,} requests of the trace, an infinite cache"
    return f"a sample of {w.requests_analysed:,} requests, an infinite cache: an estimate, not a bound"


def _theoretical(results: Results) -> str:
    th = results.workload.theoretical_hit_rate
    if th.tokens is None and not th.by_source:
        return "n/a"
    sources = ", ".join(f"{k} {_pct(th.by_source.get(k))}" for k in source_order(results))
    return f"{_pct(th.tokens)}" + (f" (by source, each of its own tokens: {sources})" if sources else "")


def _pacing(results: Results) -> list[str]:
    """Users who started, who waited first, and who never started: the three add up to the users."""
    req = results.requests
    if not req.users_paced and not req.users_waiting_at_stop:
        return []
    users = results.run.users
    never = users - req.users_started
    return [f"  users: {req.users_started:,} of {users:,} started ({req.users_paced:,} of them after waiting for a "
            f"short queue: their latency counts from admission); {never:,} never started, "
            f"{req.users_waiting_at_stop:,} of them still waiting at the stop (--admission paced holds a first turn "
            f"while the queue is as long as the workers: that load was offered and not served; --admission all "
            f"queues it)"]


def _drain(results: Results) -> str:
    """The window runs until the requests in flight at --duration have finished: say by how much."""
    asked = results.settings.get("run", {}).get("duration_s")
    extra = results.run.duration_s - asked if asked else 0.0
    return f" (--duration {asked:g} + {extra:.1f} s drain of the requests in flight)" if extra >= 0.05 else ""


def _verdict(results: Results) -> list[str]:
    v = results.load
    if not v:
        return []
    storage = "bound by the generator's per-block work (a null tier)" if null_bottom(results) else "storage-bound"
    kind = {"queue": "QUEUE-BOUND", "users": f"bound by {pace(arrival_of(results))}", "storage": storage}[v.kind]
    if v.kind == "queue" and v.cause:  # what the queue was made of: the storage at this concurrency, or the CPU
        kind += {"storage": " on storage", "cpu": " on CPU", "generator": " on the generator"}[v.cause]
    wait = (f"; queue wait p50 {_ms(v.queue_wait_p50_ms)} / p95 {_ms(v.queue_wait_p95_ms)} ms vs storage time p50 "
            f"{_ms(v.storage_p50_ms)} ms per request; {v.dropped_at_stop:,} queued at the stop")
    return [f"  load: {kind}: issued in the window {v.offered_per_s:.2f} req/s, completed {v.served_per_s:.2f} req/s"
            f"{wait}: {v.advice}"]


def _turn_order(results: Results) -> list[str]:
    held = results.requests.held_for_previous_turn
    wait = results.request_latency_ms.get("turn_wait")
    if not held:
        return []
    pct = f": held p50 {_ms(wait.p50)} / p99 {_ms(wait.p99)} ms" if wait is not None and wait.count else ""
    return [f"  {held:,} turns arrived before their session's previous answer and waited for it (a turn's prompt "
            f"holds that answer); their latency counts from the answer{pct}"]


def render(results: Results, results_path: str | None = None) -> str:
    lines = (header(results) + latency_section(results) + bandwidth_section(results) + traffic_section(results)
             + telemetry_section(results) + semantic_section(results) + sections(results) + capacity_lines(results)
             + trials_section(results))
    for w in results.warnings:
        lines.append(f"WARNING: {w}")
    if results_path:
        lines.append(f"Results    {results_path}")
    return "\n".join(lines)
