"""A request's tokens and block hits counted by where they came from (the plan's source labels): the console's
and the capacity curve's per-source figures, and the reference's hit counters (docs/mlperf.md)."""

from __future__ import annotations

from kv_cache import counters as C
from kv_cache.lifecycle.plan import KVPlan
from kv_cache.recorder.stack_distances import COLUMNS
from kv_cache.types import HISTORY, INJECTED, SYSTEM, RequestOutcome


def source_tokens(parts: list[tuple[str, int]]) -> tuple[int, ...]:
    """A block's prompt tokens by the access log's COLUMNS (a label not among them counts as "other")."""
    out = [0] * len(COLUMNS)
    for label, tokens in parts:
        out[COLUMNS.index(label) if label in COLUMNS else -1] += tokens
    return tuple(out)


def add_to(by: dict[str, int], label: str, n: int) -> None:
    by[label] = by.get(label, 0) + n


def span_ranges(spans):
    """(end, start, label) of each span."""
    start = 0
    for end, label in spans:
        if end > start:
            yield end, start, label
        start = max(start, end)


def count_hits_by_source(plan: KVPlan, hit: list[int], out: RequestOutcome) -> None:
    """The block hits by source, and per request whether its prefix, system prompt and history were found:
    the reference's hit counters (system prompt, multi-turn, prefix) counted on our blocks (docs/mlperf.md)."""
    labels = plan.labels[:plan.num_prompt_blocks]
    for i in hit:
        add_to(out.blocks_hit_by_source, labels[i], 1)
    out.found[C.PREFIX] = bool(hit)  # nothing to look up: a miss
    found = {labels[i] for i in hit}
    for label, spelled in ((SYSTEM, (SYSTEM, INJECTED)), (HISTORY, (HISTORY,))):  # injected: a system prompt too
        if any(s in labels for s in spelled):
            out.found[label] = any(s in found for s in spelled)
