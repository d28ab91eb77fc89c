"""Numbers that explain the traffic, before the run: lengths and the infinite-cache hit rate.

The *theoretical hit rate* replays the lifecycle's own plan of each request
against a cache that never evicts and where every write has finished: the
tokens of the longest prefix of prompt blocks seen before, over all prompt
tokens (token-weighted), overall and by source. The run's achieved hit rate
sits beside it, so capacity and concurrency effects are visible.
Hash-id trace records are analysed from their ids without building tokens.
"""

from __future__ import annotations

import itertools
from typing import TypedDict

import numpy as np

from kv_cache.lifecycle.ceiling import MAX_BLOCKS, Ceiling
from kv_cache.lifecycle.plan import KVPlan
from kv_cache.recorder.results import rates_by_source
from kv_cache.types import TRACE_HASH


class Analysis(TypedDict):
    """analyse()'s answer; results.json's workload section holds it beside the traffic's source (sections.Workload)."""

    requests_analysed: int
    requests_total: int | None  # None: the duration decides (closed-loop synthetic users, no --max-requests)
    prompt_tokens: dict       # count, mean, p50, p90, p99, max (count only when nothing was analysed)
    output_tokens: dict
    counts: dict              # cached, prompt, cached_by_source, prompt_by_source
    theoretical_hit_rate: dict  # tokens, by_source


def _stats(values: list[int]) -> dict:
    if not values:
        return {"count": 0}
    a = np.asarray(values)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"count": int(a.size), "mean": float(a.mean()), "p50": float(p50), "p90": float(p90),
            "p99": float(p99), "max": int(a.max())}


def _rate(num, den):
    return num / den if den else None


def analyse(items, lifecycle, limit: int = 100_000, total: int | None = None, max_blocks: int = MAX_BLOCKS) -> Analysis:
    """Analyse up to `limit` items (built Requests, or hash records with prefix_ids) in dispatch order, until the
    infinite cache holds max_blocks distinct blocks (its memory is in the budget's fixed allowance; unbounded, 5,000
    synthetic users' samples took 1.3 GiB and two minutes)."""
    infinite = Ceiling(max_blocks)
    prompts, outputs = [], []
    cached = prompt_total = 0
    by_source_prompt: dict[str, int] = {}
    by_source_cached: dict[str, int] = {}
    bt = lifecycle.block_tokens
    for item in itertools.islice(items, limit):
        req = None
        if bt and hasattr(item, "prefix_ids"):
            # each block's identity as a 64-bit int, as the ceiling keeps its keys (hash(): one process's, the
            # same identity the same int; two of 2,000,000 blocks share one with odds of about 1 in 10 million)
            ids = [hash(i) % 2**64 for i in item.prefix_ids(bt)]
            plen, olen = item.input_length, item.output_length
            plan = KVPlan(tuple(ids), (bt,) * len(ids), len(ids), (TRACE_HASH,) * len(ids), ((0, len(ids), False),))
            spans = {TRACE_HASH: plen}
        else:
            req = item
            plan = lifecycle.plan(req)
            plen, olen = req.num_prompt_tokens, req.num_output_tokens
            spans, start = {}, 0
            for end, label in req.spans:
                spans[label] = spans.get(label, 0) + max(0, end - start)
                start = max(start, end)
        hits = infinite.hits(plan)
        if hits is None:  # past the bound: the sample ends before this item
            break
        tokens, labels = plan.tokens_per_key, plan.labels
        prompts.append(plen)
        outputs.append(olen)
        prompt_total += plen
        for label, n in spans.items():
            by_source_prompt[label] = by_source_prompt.get(label, 0) + n
        parts = plan.hit_tokens(req, hits)[1].items() if req is not None else \
            [(labels[i], min(tokens[i], plen)) for i in hits]
        for label, t in parts:
            cached += t
            by_source_cached[label] = by_source_cached.get(label, 0) + t
    n = len(prompts)
    return {
        "requests_analysed": n, "requests_total": total,
        "prompt_tokens": _stats(prompts), "output_tokens": _stats(outputs),
        "counts": {"cached": cached, "prompt": prompt_total, "cached_by_source": by_source_cached,
                   "prompt_by_source": by_source_prompt},
        "theoretical_hit_rate": {
            "tokens": _rate(cached, prompt_total),
            "by_source": rates_by_source(by_source_cached, by_source_prompt),
        },
    }
