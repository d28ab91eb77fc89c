"""PNG plots of load control, from the results dict alone.

- qos_attainment.png: per QoS class, storage-TTFT p95 / p99 against their targets and the share of
  requests within the p95 target
- autoscale_curve.png: the autoscaler's steps: users -> offered and completed requests/s,
  throughput, TTFT p95 and whether the SLAs held
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from kv_cache.recorder.schema import Results
from kv_cache.report.figure import save


def qos_attainment(results: Results, folder: Path) -> Path | None:
    q = results.qos
    classes = {n: c for n, c in (q or {}).get("classes", {}).items() if c["requests"]}
    if not classes:
        return None
    names = list(classes)
    x = np.arange(len(names))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    for i, (pct, shift) in enumerate((("p95", -0.2), ("p99", 0.2))):
        ax1.bar(x + shift, [classes[n]["ttft_ms"][pct] for n in names], 0.4, label=f"TTFT {pct} (measured)",
                color=f"C{i}")
        ax1.scatter(x + shift, [classes[n]["targets_ms"][f"ttft_{pct}"] for n in names], marker="_", s=600,
                    color="k", zorder=3, label="target" if pct == "p95" else None)
    ax1.set_xticks(x, names)
    ax1.set_yscale("log")
    ax1.set_ylabel("storage part of TTFT (ms, log)")
    ax1.set_title("Storage TTFT against the SLA targets")
    ax1.legend(fontsize=8)
    ax2.bar(x, [100 * classes[n]["attainment"] for n in names],
            color=["C2" if classes[n]["met"] else "C3" for n in names])
    ax2.axhline(100 * q["attainment_goal"], color="k", ls="--", lw=1, label=f"goal {q['attainment_goal']:.0%}")
    ax2.set_xticks(x, names)
    ax2.set_ylim(0, 105)
    ax2.set_ylabel("requests within the p95 target (%)")
    ax2.set_title("Attainment (green: every target met)")
    ax2.legend(fontsize=8)
    return save(fig, folder, "qos_attainment.png")


def autoscale_curve(results: Results, folder: Path) -> Path | None:
    a = results.autoscale
    if not a or not a["curve"]:
        return None
    steps = a["curve"]
    users = [p["users"] for p in steps]
    order = np.argsort(users, kind="stable")
    u = [users[i] for i in order]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    ax1.plot(u, [steps[i]["offered_per_s"] for i in order], "o-", label="offered requests/s")
    ax1.plot(u, [steps[i]["requests_per_s"] for i in order], "s--", label="completed requests/s")
    ax1.set_xlabel("active users")
    ax1.set_ylabel("requests/s")
    t = ax1.twinx()
    t.plot(u, [steps[i]["tokens_per_s"] for i in order], "^:", color="C2", label="prompt tokens/s")
    t.set_ylabel("prompt tokens/s")
    ax1.legend(loc="upper left", fontsize=8)
    t.legend(loc="lower right", fontsize=8)
    ax1.set_title(f"Autoscaler ({a['mode']}): load and throughput per step")
    ax2.plot(u, [steps[i]["ttft_p95_ms"] or np.nan for i in order], "k-", alpha=0.4)
    for i in order:
        p = steps[i]
        ax2.scatter(p["users"], p["ttft_p95_ms"] or np.nan, color="C2" if p["sla_met"] else "C3", zorder=3)
    ax2.set_xlabel("active users")
    ax2.set_ylabel("storage TTFT p95, worst class (ms, log)")
    ax2.set_yscale("log")
    ax2.set_title("Latency per step (green: SLAs met, red: not)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    return save(fig, folder, "autoscale_curve.png")
