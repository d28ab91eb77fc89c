"""Console lines of semantic reuse: SemBench's rates per transform, donor lookup cost, donor bytes."""

from __future__ import annotations

from kv_cache.model import GiB
from kv_cache.recorder.results_schema import Results
from kv_cache.report.table import format_table
from kv_cache.report.table import ms as _ms


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def semantic_section(results: Results) -> list[str]:
    sem = results.semantic
    if sem is None:
        return []
    rows = [["transform", "recipients", "exact", "candidate", "eligible", "lift", "loaded", "fuzzy", "donor"]]
    for name, r in [*sem.by_transform.items(), ("all", sem.overall)]:
        rows.append([name, f"{r.counts.get('requests', 0):,}", _pct(r.exact_block_hit_rate),
                     _pct(r.semantic_candidate_block_rate), _pct(r.semantic_eligible_block_rate),
                     _pct(r.semantic_eligible_lift), _pct(r.semantic_loaded_block_rate),
                     _pct(r.fuzzy_block_rate), _pct(r.donor_found_rate)])
    s = sem.settings
    lines = ["", f"Semantic reuse (block rates over recipients' prompt blocks; embedder {s['embedder']}, cosine >= "
                 f"{s['threshold']}, top {s['top_k']}, min reuse {s['min_reuse']}, context gate "
                 f"{'on' if s['context_gate'] else 'off'}, fuzzy {'on' if s['fuzzy'] else 'off'}; donor: the "
                 f"recipients whose donor was found)"]
    lines += format_table(rows, 1, "  ")
    lines.append(f"  negative controls: semantic eligible {_pct(sem.negative_control_semantic_eligible_rate)} "
                 f"(should be 0)")
    if sem.donor_lookup_ms:
        lines.append("  donor lookup ms  " + ", ".join(f"{st} p50 {_ms(v.p50)} / p99 {_ms(v.p99)}"
                                                        for st, v in sem.donor_lookup_ms.items()))
    read = {t: b for t, b in sem.donor_bytes_by_tier.items() if b}
    lines.append("  donor blocks read: " + (", ".join(f"{t} {sem.donor_blocks_by_tier[t]:,} "
                                                      f"({b / GiB:.2f} GiB)" for t, b in read.items()) or "none")
                 + f"; {sem.donor_blocks_missing:,} evicted before they were read")
    return lines
