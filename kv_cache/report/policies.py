"""Table and plot of the ``policies`` sub-command (pure functions of its rows)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from kv_cache.errors import UserError
from kv_cache.inputs import read_text
from kv_cache.report.figure import save
from kv_cache.report.table import fit, format_table

FILE = "policies.json"  # the policies sub-command's comparison, in its folder beside a run folder a policy


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _ms(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _count(v) -> str:
    return "-" if v is None else f"{v:,}"


def unequal(rows: list[dict]) -> bool:
    """The policies did not all complete the same requests (a --duration ended some runs earlier than others)."""
    return len({r.get("requests") for r in rows}) > 1


def cut_lines(rows: list[dict]) -> list[str]:
    """What a typed --duration cut: a note where it ended every run at the same request, a warning where not."""
    cut = [f"{r['policy']} {r['requests']:,}" for r in rows if r.get("stopped_reason") == "duration"]
    if not cut:
        return []
    if not unequal(rows):
        return [fit(f"note: --duration ended every policy's run after {rows[0]['requests']:,} requests, before the "
                    f"sequence's end: the comparison is of those.")]
    return [fit(f"warning: --duration ended {len(cut)} of the {len(rows)} policies' runs before the sequence's end "
                f"(requests completed: {', '.join(cut)}): they did not see the same requests, so their figures do "
                f"not compare; raise --duration or lower --max-requests.")]


def policy_table(rows: list[dict]) -> str:
    """Tables of at most 100 columns, a tier a row (one table of every column was 150 wide with two tiers)."""
    types = sorted({t for r in rows for t, v in r["hit_rate_by_type"].items() if v is not None})
    hits = [["policy", "tokens hit", "blocks hit", "storage TTFT", "modelled TTFT", "written", "not written"]]
    sources = [["policy", *types]]
    moved = [["policy", "tier", "read GiB", "written GiB", "demoted into GiB"]]
    lat = [["policy", "tier", "op", "count", "p50 ms", "p99 ms"]]
    for r in rows:
        hits.append([r["policy"], _pct(r["hit_rate_tokens"]), _pct(r["hit_rate_blocks"]),
                     _ms(r["storage_ttft_mean_ms"]), _ms(r["modelled_ttft_mean_ms"]), _count(r.get("blocks_written")),
                     _count(r.get("blocks_not_written"))])
        sources.append([r["policy"], *(_pct(r["hit_rate_by_type"].get(t)) for t in types)])
        moved += [[r["policy"], t, f"{b['read'] / 2**30:.2f}", f"{b['write'] / 2**30:.2f}",
                   f"{r['demoted_bytes'].get(t, 0) / 2**30:.2f}"] for t, b in r["bytes"].items()]
        lat += [[r["policy"], tier, op, f"{st['count']:,}", _ms(st["p50"]), _ms(st["p99"])]
                for tier, ops in r["latency_ms"].items() for op, st in ops.items() if op in ("read", "write")]
    each = "cut short: see below" if unequal(rows) else f"{rows[0].get('requests') or 0:,} requests each"
    return "\n".join([fit(f"Policies on one request sequence ({each}): hit rates, TTFT (mean ms), new blocks "
                           "written and not (one a policy's evictions cut off from its chain is not written: less "
                           "storage time, fewer later hits)")]
                     + format_table(hits, 1, "  ")
                     + ["", "Hit rate by source (each of its own prompt tokens)"] + format_table(sources, 1, "  ")
                     + ["", "GiB moved"] + format_table(moved, 2, "  ")
                     + ["", "Per-block latency"] + format_table(lat, 3, "  ") + cut_lines(rows))


def policy_plot(rows: list[dict], folder: Path, model: str) -> Path:
    names = [r["policy"] for r in rows]
    x = np.arange(len(names))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    ax1.bar(x, [100 * (r["hit_rate_tokens"] or 0) for r in rows])
    ax1.set_xticks(x, names, rotation=30, ha="right")
    ax1.set_ylabel("token hit rate (%)")
    ax1.set_title("Hit rate per policy (same request sequence)")
    ax2.bar(x - 0.2, [r["storage_ttft_mean_ms"] or 0 for r in rows], 0.4, label="storage TTFT (measured)")
    ax2.bar(x + 0.2, [r["modelled_ttft_mean_ms"] or 0 for r in rows], 0.4, label="modelled TTFT")
    ax2.set_xticks(x, names, rotation=30, ha="right")
    ax2.set_ylabel("mean ms per request")
    ax2.set_title(model, fontsize=8)
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(axis="y", alpha=0.3)
    return save(fig, folder, "policies.png")


def policies_report(folder: Path, plots: bool) -> str:
    """The comparison a policies folder holds, said again (and its plot drawn again with plots)."""
    path = folder / FILE
    fix = "run the policies sub-command again, or pass one policy's run folder"
    try:
        data = json.loads(read_text(str(path), "policies file", 64 << 20, fix))
        rows, model = data["policies"], data["ttft_model"]
        table = policy_table(rows)
        plot = policy_plot(rows, folder, model) if plots else folder / "policies.png"
        drawn = f"; plot: {plot}" if plot.exists() else " (its plot is gone: --plots draws it again)"
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSON's errors, a field missing or of a wrong type
        raise UserError(f"{path} is not a policies comparison this tool reads ({type(e).__name__}: {e}); "
                        f"{fix}.") from None
    return table + "\n" + fit(f"  {model}\n  per-policy runs in {folder}/<policy>/{drawn}")
