"""The ``policies`` sub-command: one deterministic request sequence through several eviction policies.

Each policy gets a real run (same tiers, same capacities, same seed) with
arrival ``sequence``: the traffic's requests in one fixed order, one in flight,
so every policy sees exactly the same requests in the same order and only its
eviction decisions differ. Then one table and one plot compare them.

Modelled TTFT (stated in the output): the measured storage part of TTFT (prefix load +
prefill write; nothing queues with one request in flight) + the prompt tokens that missed x
``--prefill-ms-per-token`` (default 0.08 ms, SemanticKV's slope) of recomputation, per request,
averaged. Only the recomputation term is modelled.
"""

from __future__ import annotations

import json
from pathlib import Path

from kv_cache import signals
from kv_cache.config import Settings, replace
from kv_cache.errors import UserError
from kv_cache.recorder.results_schema import Results
from kv_cache.report.policies import FILE, policy_plot, policy_table, unequal
from kv_cache.report.table import fit
from kv_cache.run.outfolder import write_json
from kv_cache.run.pipeline import new_run_id


def summarize(name: str, r: Results, ms_per_token: float) -> dict:
    """One row of policies.json (plain data: written as JSON, read by the policies table and plot)."""
    req = r.requests.completed
    ttft = r.request_latency_ms.get("ttft")
    mean = ttft.mean if ttft is not None else None
    missed = r.tokens.prompt - r.tokens.cached
    block = r.run.block_bytes
    full = r.to_dict()
    return {
        "policy": name, "requests": req, "stopped_reason": r.run.stopped_reason,
        "hit_rate_tokens": r.hit_rate.tokens, "hit_rate_blocks": r.hit_rate.blocks,
        "hit_rate_by_type": r.hit_rate.by_source,
        "bytes": full["bytes"],
        "demoted_bytes": {t: ops.get("demote", 0) * block for t, ops in r.ops.items()},
        "latency_ms": full["latency_ms"],
        "storage_ttft_mean_ms": mean,
        "modelled_ttft_mean_ms": (mean + ms_per_token * missed / req) if req and mean is not None else None,
        "verification_failures": r.verification.failures,
        # a policy that evicts a chain's ancestors leaves its later blocks unwritten (unreachable): less storage time
        "blocks_written": sum(ops.get("write", 0) for ops in r.ops.values()),
        "blocks_not_written": None if r.blocks_write_skipped_by is None else sum(r.blocks_write_skipped_by.values()),
    }


def compare_policies(s: Settings, names: list[str], ms_per_token: float, say, reg) -> int:
    rid = s.run.run_id or new_run_id()
    root = Path(s.run.output_dir) / rid
    if root.exists():
        raise UserError(f"report folder {root} already exists; choose another --run-id.")
    from kv_cache.run.pipeline import execute  # imported late: run imports the whole pipeline

    rows, status = [], 0
    for name in names:
        say(f"== policy {name} (same request sequence, one request in flight)")
        sp = s
        for dotted, value in (("cache.policy", name), ("schedule.arrival", "sequence"), ("run.run_id", name),
                              ("run.output_dir", str(root)), ("run.quiet", True)):
            sp = replace(sp, dotted, value)
        status = max(status, execute(sp, reg, lambda *a, **k: None))
        if signals.received() is not None:
            return status
        signals.resume()
        done = Results.from_dict(json.loads((root / name / "results.json").read_text()))
        rows.append(summarize(name, done, ms_per_token))
        hit = "-" if done.hit_rate.tokens is None else f"{done.hit_rate.tokens:.1%}"
        say(f"   {done.requests.completed:,} requests in {done.run.duration_s:.1f} s, {hit} of prompt tokens hit")
    if unequal(rows):  # said under the table: the policies did not see the same requests
        status = max(status, 1)
    model = f"modelled TTFT = measured storage TTFT + missed prompt tokens x {ms_per_token:g} ms (recompute)"
    write_json(root / FILE, {"policies": rows, "ttft_model": model, "settings": s.to_dict()})
    plot = policy_plot(rows, root, model)
    say(policy_table(rows) + "\n" + fit(f"  {model}\n  per-policy runs in {root}/<policy>/; plot: {plot}"))
    return status
