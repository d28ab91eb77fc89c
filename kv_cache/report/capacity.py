"""The capacity curve, rendered from Results alone: its table (console, `capacity`) and capacity_curve.png; the
overlay of several runs' curves for `compare`."""

from __future__ import annotations

from kv_cache.model import GiB
from kv_cache.recorder.results_schema import Results
from kv_cache.report.table import format_table


def _knee(c, slots: int | None) -> str:
    return "-" if slots is None else f"{slots:,} blocks = {slots * c.slot_bytes / GiB:,.2f} GiB"


def capacity_lines(results: Results, rows: int = 12, own: bool = True) -> list[str]:
    """The curve's table at a dozen capacities (the knees and the run's own among them) and its summary; own: the
    curve is of this run's accesses alone (not merged with others'), so it is held against what the run measured."""
    c = results.capacity_curve
    if c is None:
        return []
    # merged runs: the capacity marked is the first run's, the rate the runs' summed
    mark, whose, rate = ("this run", "this run's", "this run's") if own else ("run 1's", "run 1's", "the runs' summed")
    marks = {c.knee_90_slots: "90 % knee", c.knee_99_slots: "99 % knee", c.run_slots: mark}
    step = max(1, len(c.points) // rows)
    shown = [p for i, p in enumerate(c.points) if p.slots in marks or i == len(c.points) - 1
             or i % step == 0 or p.read_iops is not None]
    table = [["blocks", "GiB", "hit rate", "bottom", "read GB/s", "write GB/s", "IOPS r / w", "MB/req", ""]]
    for p in shown:
        table.append([f"{p.slots:,}", f"{p.gib:,.2f}", f"{p.hit_rate:.1%}", _or(p.bottom_hit_rate, "{:.1%}"),
                      _or(p.read_gbps, "{:.3f}"), _or(p.write_gbps, "{:.3f}"),
                      "-" if p.read_iops is None else f"{p.read_iops:,.0f} / {p.write_iops:,.0f}",
                      _or(p.bytes_per_request and p.bytes_per_request / 1e6, "{:,.1f}"), marks.get(p.slots, "")])
    how = "exact" if c.sample_rate >= 1 else f"SHARDS-sampled at {c.sample_rate:g}"
    lru = c.policy == "lru" or c.replayed
    policy = "" if lru else f"; this run's policy is {c.policy}: the curve is LRU's"
    sources = _sources(c)
    return (["", f"Capacity curve of the bottom tier ({c.model}, {how}; tiers above it: {c.tiers_above_slots:,} "
                 f"blocks; {c.requests:,} requests of the window at {c.requests_per_s:.2f}/s{policy}; hit rate: any "
                 f"tier; bottom: the hit rate the bottom tier serves; GB/s, IOPS and MB per request: its reads and "
                 f"writes)",
             f"  bottom, GB/s, IOPS, MB/req: {c.demand_model}"]
            + format_table(table, 2, "  ")
            + _held_against_the_run(results, own)
            + _served_order(c)
            + ([f"  by source at {whose} capacity (each a share of all prompt tokens; they sum to the hit rate): "
                f"{sources}"] if sources else [])
            + [f"  infinite cache: {c.infinite_hit_rate:.1%}; 90 % of it from {_knee(c, c.knee_90_slots)}, "
               f"99 % from {_knee(c, c.knee_99_slots)} (storage demand: at {rate} request rate, blocks of "
               f"{c.slot_bytes / 2**20:.2f} MiB)"])


def _held_against_the_run(results: Results, own: bool) -> list[str]:
    """The curve at the run's own capacity beside the hit rate the run measured over the same requests: the curve
    is exact for one request at a time, and a run of several workers can be far from it (4 workers with 76 slots
    and prompts of up to 123 blocks (31,572 tokens): the curve 31 %, the run 48 %), which a reader must see."""
    c, measured = results.capacity_curve, results.hit_rate.tokens
    here = _at_run(c)
    if not own or here is None or measured is None or c.sample_rate < 1:
        return []
    line = f"  at this run's capacity the curve reads {here.hit_rate:.1%}; the run measured {measured:.1%}"
    gap = measured - here.hit_rate
    if abs(gap) <= 0.01 or results.run.workers <= 1:
        return [line]
    return [f"{line}, {abs(gap) * 100:.1f} points {'above' if gap > 0 else 'below'} it: the curve replays the "
            f"requests one at a time in the order they looked the cache up, and the run had {results.run.workers} "
            f"workers' requests in flight together (their prefixes held where an LRU stack would evict them, a "
            f"block that found no free slot not stored); it is exact with one worker (--workers 1 or --arrival "
            f"sequence), and reads the run best where the tiers hold many requests' blocks"]


def _served_order(c) -> list[str]:
    """Where the run served requests far from their arrival order (a backlog served by QoS priority), the curve's
    reuse distances are those of the order served: Mooncake's trace at --trace-speedup 1000 queued all of it, and
    its 90 % knee read 94,846 blocks where the trace's own order needs 30,826. Said, with the arrival order's curve."""
    o = c.served_order
    if o is None or not o.late:
        return []
    arrival = "" if o.arrival_knee_90_slots is None and o.arrival_hit_rate_at_run is None else (
        f"; the same requests in arrival order (LRU): 90 % of the infinite cache's hit rate from "
        f"{_knee(c, o.arrival_knee_90_slots)}, 99 % from {_knee(c, o.arrival_knee_99_slots)}, at this run's "
        f"capacity {_or(o.arrival_hit_rate_at_run, '{:.1%}')}")
    return [f"  order: {o.late_requests:,} of the {o.requests:,} requests ({o.late_requests / o.requests:.0%}) left "
            f"the queue more than {o.beyond_places} place{'' if o.beyond_places == 1 else 's'} (the workers) after "
            f"their place in arrival order, up to "
            f"{o.most_places_late:,}: the run's queue served them by QoS priority, and the curve above is of the "
            f"order served{arrival} (one QoS class, --qos-mix batch=100, or a pace the run keeps up with serves them "
            f"in arrival order)"]


def _or(value, form: str) -> str:
    """A demand figure, or '-' where the capacity was not replayed."""
    return "-" if value is None else form.format(value)


def _at_run(c):
    """The curve's point at the run's own capacity (None in a curve without it)."""
    return next((p for p in c.points if p.slots == c.run_slots), None)


def _sources(c) -> str:
    here = _at_run(c)
    return "" if here is None else ", ".join(f"{k} {v:.1%}" for k, v in here.by_source.items())


def _hit_axis(ax, percents: list[float]) -> None:
    """A hit-rate axis scaled to the curves drawn: a 4-6 % curve on 0-100 % is a flat line."""
    top = max([*percents, 1.0])
    ax.set_ylim(0, min(105.0, top * 1.15))


def _title(ax, text: str, width: int = 70) -> None:
    """A title wrapped to the axis (a merged run's model name is long): never cut at the figure's edge."""
    import textwrap

    ax.set_title(textwrap.fill(text, width))


def draw_capacity(results: Results):
    c = results.capacity_curve
    if c is None or len(c.points) < 2:
        return None
    import matplotlib.pyplot as plt

    gib = [max(p.gib, 1e-3) for p in c.points]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    ax1.plot(gib, [100 * p.hit_rate for p in c.points], "k-", lw=2, label="hit rate, any tier (tokens)")
    for name in sorted({s for p in c.points for s in p.by_source}):
        ax1.plot(gib, [100 * p.by_source.get(name, 0.0) for p in c.points], "--",
                 label=f"of it: {name} (share of all prompt tokens)")
    ax1.axhline(100 * c.infinite_hit_rate, color="gray", ls=":", label=f"infinite cache {c.infinite_hit_rate:.1%}")
    for slots, text, color in ((c.knee_90_slots, "90 %", "C2"), (c.knee_99_slots, "99 %", "C3"),
                               (c.run_slots, "this run", "C1")):
        if slots:
            ax1.axvline(max(slots * c.slot_bytes / GiB, 1e-3), color=color, ls="--", lw=1, label=text)
    ax1.set_ylabel("token hit rate (%)")
    _hit_axis(ax1, [100 * v for p in c.points for v in (p.hit_rate, *p.by_source.values())]
              + [100 * c.infinite_hit_rate])
    _title(ax1, f"Hit rate by bottom-tier capacity ({c.model}; tiers above: {c.tiers_above_slots:,} blocks)")
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax1.grid(alpha=0.3)
    replayed = [(g, p) for g, p in zip(gib, c.points) if p.read_gbps is not None]  # the capacities replayed
    at = [g for g, _ in replayed]
    ax2.plot(at, [p.read_gbps for _, p in replayed], "o-", color="C0", label="read GB/s")
    ax2.plot(at, [p.write_gbps for _, p in replayed], "s--", color="C0", label="write GB/s")
    ax2.set_ylabel(f"GB/s at {c.requests_per_s:.2f} requests/s")
    ax2b = ax2.twinx()
    ax2b.plot(at, [p.bytes_per_request / 1e6 for _, p in replayed], "^:", color="C4", label="MB per request")
    ax2b.set_ylabel("MB per request (read + written)")
    ax2.set_xscale("symlog", linthresh=max(c.slot_bytes / GiB, 1e-3))
    ax2.set_xlabel("bottom-tier capacity (GiB)")
    ax2.set_title("Storage demand of the bottom tier (the cache replayed at the capacities marked)")
    lines = ax2.get_legend_handles_labels()[0] + ax2b.get_legend_handles_labels()[0]
    ax2.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="upper left", bbox_to_anchor=(1.08, 1.0))
    ax2.grid(alpha=0.3)
    return fig


def draw_capacity_overlay(runs: list[tuple[str, Results]]):
    """Several runs' curves on one axis (compare)."""
    curves = [(n, r.capacity_curve) for n, r in runs if r.capacity_curve is not None]
    if len(curves) < 2:
        return None
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    for name, c in curves:
        ax.plot([max(p.gib, 1e-3) for p in c.points], [100 * p.hit_rate for p in c.points], label=name)
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlabel("bottom-tier capacity (GiB)")
    ax.set_ylabel("token hit rate (%)")
    _hit_axis(ax, [100 * p.hit_rate for _, c in curves for p in c.points])
    ax.set_title("Capacity curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
