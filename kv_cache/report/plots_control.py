"""PNG plots of load control, from the results dict alone.

- qos_attainment.png: per QoS class, storage-TTFT p95 / p99 against their targets and the share of
  requests within the p95 target
- autoscale_curve.png: the autoscaler's steps: users -> offered and completed requests/s,
  throughput, TTFT p95 and whether the SLAs held
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from kv_cache.recorder.results_schema import Results
from kv_cache.report.table import PERCENTILE_OF, supported


def draw_qos(results: Results):
    q = results.qos
    classes = {n: c for n, c in q.classes.items() if c.requests}
    if not classes:
        return None
    names = list(classes)
    x = np.arange(len(names))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    for i, (pct, shift) in enumerate((("p95", -0.2), ("p99", 0.2))):
        # a bar only where the table shows the percentile: too few requests to support it draw none
        shown = [supported(PERCENTILE_OF[pct], classes[n].ttft_ms.count) for n in names]
        ax1.bar(x + shift, [getattr(classes[n].ttft_ms, pct) if ok else np.nan for n, ok in zip(names, shown)], 0.4,
                label=f"TTFT {pct} (measured)" if any(shown) else None, color=f"C{i}")  # no bar: no legend entry
        # the target as a line across its bar, as wide as the bar: visible at any scale; one legend entry for both
        ax1.hlines([getattr(classes[n].targets_ms, f"ttft_{pct}") for n in names], x + shift - 0.2, x + shift + 0.2,
                   colors="k", linewidth=2.5, zorder=3, label="target" if i == 0 else None)
        for xi, ok, n in zip(x + shift, shown, names):
            if not ok:
                ax1.text(xi, getattr(classes[n].targets_ms, f"ttft_{pct}"), "too few\nrequests", ha="center",
                         va="bottom", fontsize=7)
    ax1.set_xticks(x, names)
    ax1.set_yscale("log")
    ax1.set_ylabel("storage part of TTFT (ms, log)")
    ax1.set_title("Storage TTFT against the SLA targets (black: target)")
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.1), ncol=3)
    attained = [classes[n].attainment for n in names]
    ax2.bar(x, [100 * (a or 0) for a in attained], color=["C2" if classes[n].met else "C3" for n in names])
    for xi, a in zip(x, attained):  # the value on every bar: a 0 % bar has no height but its label
        ax2.text(xi, 100 * (a or 0) + 1.5, "n/a" if a is None else f"{100 * a:.1f}%", ha="center", fontsize=9)
    ax2.axhline(100 * q.attainment_goal, color="k", ls="--", lw=1, label=f"goal {q.attainment_goal:.0%}")
    ax2.set_xticks(x, names)
    ax2.set_ylim(0, 112)
    ax2.set_ylabel("requests within the p95 target (%)")
    ax2.set_title("Attainment (green: every target met, red: not)")
    ax2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.1))
    return fig


def draw_autoscale(results: Results):
    a = results.autoscale
    if a is None or not a.curve:
        return None
    steps = a.curve
    users = [p.users for p in steps]
    order = np.argsort(users, kind="stable")
    u = [users[i] for i in order]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    ax1.plot(u, [steps[i].offered_per_s for i in order], "o-", label="offered requests/s")
    ax1.plot(u, [steps[i].requests_per_s for i in order], "s--", label="completed requests/s")
    ax1.set_xlabel("active users")
    ax1.set_ylabel("requests/s")
    t = ax1.twinx()
    t.plot(u, [steps[i].tokens_per_s for i in order], "^:", color="C2", label="prompt tokens/s")
    t.set_ylabel("prompt tokens/s")
    ax1.legend(loc="upper left", fontsize=8)
    t.legend(loc="lower right", fontsize=8)
    ax1.set_title(f"Autoscaler ({a.mode}): load and throughput per step")
    ttft = [steps[i].ttft_p95_ms for i in order]
    ax2.plot(u, [v or np.nan for v in ttft], "k-", alpha=0.4)
    for i in order:
        p = steps[i]
        ax2.scatter(p.users, p.ttft_p95_ms or np.nan, color="C2" if p.sla_met else "C3", zorder=3)
    ax2.set_xlabel("active users")
    if any(v for v in ttft):  # a log axis needs one positive value; a step without a TTFT has none
        ax2.set_ylabel("storage TTFT p95, worst class (ms, log)")
        ax2.set_yscale("log")
    else:
        ax2.set_ylabel("storage TTFT p95, worst class (ms)")
        ax2.text(0.5, 0.5, "no step measured a TTFT", transform=ax2.transAxes, ha="center")
    ax2.set_title("Latency per step (green: SLAs met, red: not)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    return fig
