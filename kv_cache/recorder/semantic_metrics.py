"""SemBench's metric contract over the recorder's counters: the ``semantic`` key of results.json.

Denominators: a recipient's prompt blocks (full blocks) for block rates, its
prompt tokens for token-weighted rates. A rate over an empty denominator is
null, never 0; every rate is published with its numerator and denominator
(``counts``). Rates (per transform and overall, recipients only):

- exact_block_hit_rate:           exact prefix hits / blocks
- semantic_candidate_block_rate:  exact, or found in a candidate donor (before gate and reuse threshold)
- semantic_eligible_block_rate:   exact, or covered by an accepted donor
- semantic_eligible_lift:         eligible - exact
- semantic_loaded_block_rate:     blocks really read from donors (donor blocks still cached) / blocks
- fuzzy_block_rate:               blocks taken as fuzzy chunks / blocks
- donor_found_rate:               recipients whose intended donor was among the search results / recipients
- donor_accepted_rate:            recipients that accepted at least one donor / recipients
negative_control_semantic_eligible_rate counts semantic (not exact) eligible
blocks of negative controls: shared instruction text may still hit exactly.
"""

from __future__ import annotations

from kv_cache import counters as C
from kv_cache.recorder.histogram import summary_ms
from kv_cache.recorder.snapshot import Snapshot

STAGES = ("embed", "search", "align", "total")
_BLOCK_RATES = {"exact_block_hit_rate": "exact_blocks", "semantic_candidate_block_rate": "candidate_blocks",
                "semantic_eligible_block_rate": "eligible_blocks", "semantic_loaded_block_rate": "loaded_blocks",
                "fuzzy_block_rate": "fuzzy_blocks"}
_TOKEN_RATES = ("exact", "candidate", "eligible", "loaded")


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def _rates(c: dict) -> dict:
    """The contract's rates from one group's counts (a transform's, or all recipients')."""
    blocks, tokens, reqs = c.get("blocks", 0), c.get("tokens", 0), c.get("requests", 0)
    out = {name: _rate(c.get(num, 0), blocks) for name, num in _BLOCK_RATES.items()}
    exact, eligible = out["exact_block_hit_rate"], out["semantic_eligible_block_rate"]
    out["semantic_eligible_lift"] = None if exact is None or eligible is None else eligible - exact
    for k in _TOKEN_RATES:
        out[f"{k}_token_weighted_reuse_rate"] = _rate(c.get(f"{k}_tokens", 0), tokens)
    out["donor_found_rate"] = _rate(c.get("found", 0), reqs)
    out["donor_accepted_rate"] = _rate(c.get("accepted", 0), reqs)
    return {**out, "counts": dict(sorted(c.items()))}


def semantic_section(snap: Snapshot, settings: dict, tiers: list[str]) -> dict | None:
    s = settings["semantic"]
    if not s["enabled"]:
        return None
    by: dict[str, dict[str, int]] = {}
    for name, v in C.SEMANTIC.of(snap.counters).items():
        transform, _, metric = name.partition(".")
        if metric and "." not in metric and C.SEMANTIC(transform) not in (C.DONOR_BYTES, C.DONOR_BLOCKS):
            by.setdefault(transform, {})[metric] = v
    total: dict[str, int] = {}
    for counts in by.values():
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    neg = by.get("negative_control", {})
    c = snap.counters
    return {
        "settings": {k: s[k] for k in ("embedder", "threshold", "top_k", "min_reuse", "multi_donor", "context_gate",
                                       "fuzzy", "fuzzy_overlap", "max_donors", "mix")},
        "overall": _rates(total),
        "by_transform": {t: _rates(v) for t, v in sorted(by.items())},
        "negative_control_semantic_eligible_rate": _rate(neg.get("semantic_blocks", 0), neg.get("blocks", 0)),
        "donor_lookup_ms": {st: summary_ms(snap.hists[C.semantic_hist(st)]) for st in STAGES
                            if C.semantic_hist(st) in snap.hists},
        "donor_bytes_by_tier": {t: c.get(C.DONOR_BYTES(t), 0) for t in tiers},
        "donor_blocks_by_tier": {t: c.get(C.DONOR_BLOCKS(t), 0) for t in tiers},
        "donor_blocks_missing": c.get(C.DONOR_MISSING, 0),
    }
