"""The fleet sub-command's table and fleet.png (pure functions of fleet.json's typed points)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from kv_cache.report.figure import save
from kv_cache.report.table import format_table


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def fleet_table(f) -> list[str]:
    """A row per (engines, router) in four tables: where the prompt tokens came from and the engines' imbalance;
    the shared tier's demand; its capacity; the hit rate by source."""
    hits = [["engines", "router", "HBM", "CPU", "shared", "total", "requests max/mean", "prefill max/mean"]]
    demand = [["engines", "router", "read GB/s", "write GB/s", "rewrites", "read IOPS", "write IOPS", "MB/request"]]
    size = [["engines", "router", "held GiB", "pool hit", "90 % at GiB", "99 % at GiB"]]
    sources = sorted({c for p in f.points for t in p.hit_rate_by_source.values() for c in t})
    by_source = [["engines", "router", *sources]]
    for p in f.points:
        d, who = p.shared, [str(p.engines), p.router]
        hits.append([*who, *(_pct(p.hit_rate[t]) for t in ("hbm", "cpu", "shared", "total")),
                     f"{p.requests_max_over_mean:.2f}", _num(p.prefill_max_over_mean)])
        demand.append([*who, _num(d.read_gbps, ".3f"), _num(d.write_gbps, ".3f"),
                       _pct(d.rewrite_blocks / d.write_blocks if d.write_blocks else None),
                       _num(d.read_iops, ",.0f"), _num(d.write_iops, ",.0f"), f"{d.bytes_per_request / 1e6:,.1f}"])
        size.append([*who, f"{d.peak_gib:,.2f}", _pct(d.infinite_hit_rate), _num(d.knee_90_gib, ",.2f"),
                     _num(d.knee_99_gib, ",.2f")])
        by_source.append([*who, *(_pct(sum(t.get(c, 0.0) for t in p.hit_rate_by_source.values()))
                                  for c in sources)])
    sampled = {p.shared.sample_rate for p in f.points if p.shared.sample_rate < 1}
    note = (f"; its stack distances SHARDS-sampled at {min(sampled):.3g} (the capacity bench's error: 0.87 points "
            f"at 0.1, 1.65 at 0.01)") if sampled else ""
    return (["Prompt tokens served, by tier"] + format_table(hits, 2, "  ")
            + ["", "The shared tier's demand at the traffic's rate (rewrites: writes of a block already there)"]
            + format_table(demand, 2, "  ")
            + ["", "The shared tier's capacity: held at most, and as one LRU pool its hit rate unbounded and the "
                   "capacities reaching 90 % and 99 % of it" + note] + format_table(size, 2, "  ")
            + ["", "Hit rate by source (all tiers)"] + format_table(by_source, 2, "  "))


def fleet_plot(f, folder: Path) -> Path:
    """Hit rate (total and shared) and the shared tier's demand against the engine count, one line per router."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    for router in dict.fromkeys(p.router for p in f.points):
        pts = sorted((p for p in f.points if p.router == router), key=lambda p: p.engines)
        n = [p.engines for p in pts]
        line, = ax1.plot(n, [100 * p.hit_rate["total"] for p in pts], marker="o", label=f"{router}: total")
        ax1.plot(n, [100 * p.hit_rate["shared"] for p in pts], marker="x", ls="--", color=line.get_color(),
                 label=f"{router}: shared tier")
        ax2.plot(n, [(p.shared.read_gbps or 0) + (p.shared.write_gbps or 0) for p in pts], marker="o",
                 color=line.get_color(), label=router)
    ax1.set_ylabel("prompt tokens served from cache (%)")
    ax1.set_title("Hit rate against the engine count")
    ax2.set_ylabel("shared tier read + write GB/s")
    ax2.set_title(f"Shared-tier demand at the traffic's rate ({f.stream.timing})", fontsize=8)
    for ax in (ax1, ax2):
        ax.set_xlabel("engines")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, folder, "fleet.png")


def fleet_comparison(runs: list[tuple[str, object]]) -> list[str]:
    """Fleet runs side by side: each (engines, router) the first run has, its hit rates and the shared tier's
    demand in every run, and the settings that differ (a comparison of unlike fleets says so)."""
    (base_name, base), rest = runs[0], runs[1:]
    out = [f"Fleet runs against {base_name} (hit rates: percentage points; demand: ratio to {base_name})"]
    differ = []
    for name, f in rest:
        for what, a, b in (("--shared-writes", base.shared_writes, f.shared_writes), ("policy", base.policy, f.policy),
                           ("engine tiers", base.engine_tiers, f.engine_tiers),
                           ("requests", base.stream.requests, f.stream.requests)):
            if a != b:
                differ.append(f"  {name}: {what} {b} (against {a})")
    rows = [["engines", "router", "run", "total hit", "shared hit", "read GB/s", "write GB/s", "99 % at GiB"]]
    for p in base.points:
        rows.append([str(p.engines), p.router, base_name, _pct(p.hit_rate["total"]), _pct(p.hit_rate["shared"]),
                     _num(p.shared.read_gbps, ".3f"), _num(p.shared.write_gbps, ".3f"), _num(p.shared.knee_99_gib)])
        for name, f in rest:
            q = next((x for x in f.points if (x.engines, x.router) == (p.engines, p.router)), None)
            if q is None:
                rows.append(["", "", name, "-", "-", "-", "-", "-"])
                continue
            a, b = p.shared, q.shared
            rows.append(["", "", name, _pp(q.hit_rate["total"] - p.hit_rate["total"]),
                         _pp(q.hit_rate["shared"] - p.hit_rate["shared"]), _ratio(b.read_gbps, a.read_gbps),
                         _ratio(b.write_gbps, a.write_gbps), _ratio(b.knee_99_gib, a.knee_99_gib)])
    return out + format_table(rows, 2, "  ") + (["", "Settings that differ:"] + differ if differ else [])


def _pp(v: float) -> str:
    return f"{100 * v:+.1f} pp"


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"x{a / b:.2f}"


def export_comparison(sim: dict, runs: list, where: str) -> list[str]:
    """A fleet point's simulation (engines.json's fleet) against the runs its run.sh launched (typed Results): the
    prompt tokens each tier served, the shared tier's bytes, the blocks the engines took from each other."""
    prompt = sum(r.tokens.prompt for r in runs)
    served = [sum(x) for x in zip(*(list(r.tokens.cached_by_tier.values()) for r in runs))]
    names = list(runs[0].tokens.cached_by_tier)  # the runs' tiers, top to bottom: the simulation's, by position
    tiers = [(f"{t} ({n})", t, x) for t, n, x in zip(sim["tiers"], names, served)] + [("total", "total", sum(served))]
    rows = [["tier", "simulated", "real", "difference"]]
    for label, t, x in tiers:
        got = x / prompt if prompt else None
        rows.append([label, _num(100 * sim["hit_rate"][t]) + "%", "-" if got is None else f"{100 * got:.2f}%",
                     "-" if got is None else f"{100 * (got - sim['hit_rate'][t]):+.2f} pp"])
    demand = [["shared tier", "simulated GB", "real GB", "real / simulated"]]
    for what, d in (("read", "read"), ("written", "write")):
        got = sum(getattr(r.bytes_whole_run[names[-1]], d) for r in runs)
        want = sim[f"shared_{d}_blocks"] * sim["slot_bytes"]
        demand.append([what, f"{want / 1e9:,.3f}", f"{got / 1e9:,.3f}", _num(got / want if want else None, ".4f")])
    adopted = sum(r.shared_storage.adopted_blocks for r in runs)
    return ([f"Fleet point {sim['router']} over {sim['engines']} engines against {len(runs)} real runs", f"  ({where})",
             "Prompt tokens served, by tier"] + format_table(rows, 2, "  ")
            + ["", "The shared tier's bytes"] + format_table(demand, 2, "  ")
            + [f"  {adopted:,} blocks one engine read from another's writes in the shared tier", kept_up(sim, runs)])


def kept_up(sim: dict, runs: list) -> str:
    """Whether the engines kept up with the trace: the simulation serves each request before the next arrives, so
    a request that took longer, from its arrival to its end, than the fleet's arrivals are apart may have read or
    written the shared tier after a later one, on another engine (another order than the simulation's: its figures
    may differ). Judged by its wait for a worker alone, a request that outlasted the gap in storage passed: two S3
    engines kept up by their waits on CI (2026-12-06), yet the shared tier's hit rate was 29.5 % against the
    simulation's 30.8 (their requests' times were not printed)."""
    took = [t for r in runs if (t := _longest(r)) is not None]
    if not took:
        return "  Kept up with the trace: - (no request's time was recorded)"
    (worst, what), gap = max(took), sim.get("arrival_gap_ms")
    behind = sum(r.load is not None and r.load.kind == "queue" for r in runs)
    apart = "-" if gap is None else f"{gap:,.1f} ms"
    said = f"the longest a request {what} was {worst:,.1f} ms"
    if behind or (gap is not None and worst > gap):
        return (f"  Behind the trace: {said}, the fleet's arrivals {apart} apart at the median ({behind} of "
                f"{len(runs)} runs' load verdict: queue); the engines may have served the shared tier in another "
                f"order than the simulation, which serves each request before the next arrives, and the differences "
                f"above may come from it: export the point again at a lower --trace-speedup (the requests further "
                f"apart), or use faster storage")
    return (f"  Kept up with the trace: {said}, the fleet's arrivals {apart} apart at the median: the engines served "
            f"the requests in the simulation's order")


# what each latency kept_up may judge by measures, as its sentence names it (the first a run has is taken)
_LONGEST = {"e2e": "took from its arrival to its end (its wait for a worker in it)",
            "queue": "waited for its engine's worker (its run kept no time to its end)"}


def _longest(run) -> tuple[float, str] | None:
    """A run's longest request from its arrival to its end, ms, and what that measures (its wait for a worker
    where that alone was kept: the figure printed is named as what it is)."""
    for kind, what in _LONGEST.items():
        got = run.request_latency_ms.get(kind)
        if got is not None and got.max is not None:
            return got.max, what
    return None
