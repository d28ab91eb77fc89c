"""Console lines of load control: QoS attainment per class, the autoscaler's curve, a disaggregated
node's own figures and steady-state detection (pure functions of the Results)."""

from __future__ import annotations

import math

from kv_cache.recorder.results_schema import Latency, ReadWrite, Results
from kv_cache.report.table import format_table, pct_ms
from kv_cache.report.table import ms as _ms


def _yes(v) -> str:
    return "n/a" if v is None else "yes" if v else "NO"


def qos_section(results: Results) -> list[str]:
    q = results.qos
    if not any(c.requests for c in q.classes.values()):
        return []
    rows = [["class", "prio", "requests", "TTFT p95", "target", "TTFT p99", "target", "e2e p95", "target",
             "attained", "met"]]
    for name, c in q.classes.items():
        t, lat, e2e = c.targets_ms, c.ttft_ms, c.e2e_ms  # '-' where the class has too few requests for it
        rows.append([name, str(c.priority), f"{c.requests:,}", pct_ms(lat, "p95"), _ms(t.ttft_p95),
                     pct_ms(lat, "p99"), _ms(t.ttft_p99), pct_ms(e2e, "p95"), _ms(t.e2e_p95),
                     "-" if c.attainment is None else f"{c.attainment:.1%}", _yes(c.met)])
    return (["", f"QoS (storage part of TTFT = queue wait + prefix load + prefill write, ms; attained = share within "
                 f"the p95 target, goal {q.attainment_goal:.0%}; e2e p99 judged too): all met: "
                 f"{_yes(q.all_met)}"] + format_table(rows, 2, "  "))


def autoscale_section(results: Results) -> list[str]:
    a = results.autoscale
    if a is None:
        return []
    rows = [["step", "users", "offered/s", "done/s", "tokens/s", "TTFT p95", "attained", "SLAs met"]]
    for i, p in enumerate(a.curve, 1):
        rows.append([str(i), str(p.users), f"{p.offered_per_s:.2f}", f"{p.requests_per_s:.2f}",
                     f"{p.tokens_per_s:,.0f}", _ms(p.ttft_p95_ms),
                     "-" if p.attainment is None else f"{p.attainment:.1%}", _yes(p.sla_met)])
    best = a.best
    answer = ("none" if best is None else f"{best.users} users ({best.tokens_per_s:,.0f} tokens/s, "
              f"TTFT p95 {_ms(best.ttft_p95_ms)} ms)")
    what = "largest user count meeting every SLA" if a.mode == "qos" else _capacity_answer(a)
    return ["", f"Autoscaler ({a.mode}): {what}: {answer}; {a.verdict}"] + format_table(rows, 2, "  ")


def _capacity_answer(a) -> str:
    """capacity's answer is the fewest users within min_gain of the peak (a later step a few % higher is no
    reason for more users): said so where that step is not the peak itself, which the table shows beside it."""
    peak = max(a.curve, key=lambda p: p.tokens_per_s, default=None)
    if peak is None or a.best is None or peak is a.best or peak.tokens_per_s == a.best.tokens_per_s:
        return "peak throughput"
    return (f"the fewest users within {a.settings.get('min_gain', 0):.0%} of the peak throughput "
            f"({peak.tokens_per_s:,.0f} tokens/s at {peak.users} users)")


def role_section(results: Results) -> list[str]:
    r = results.role
    if r is None:
        return []
    lat = results.latency_ms.get("handoff", {})
    bw = results.bandwidth_gbps.get("handoff", ReadWrite())
    blocks = results.blocks.get("handoff", ReadWrite())
    if r.role == "prefill":
        w = lat.get("write", Latency())
        return ["", f"Prefill node: published {blocks.write:,} blocks into "
                    f"{r.handoff_dir} ({r.engine}): {bw.write:.3f} GB/s, write p50 {_ms(w.p50)}"
                    f" / p99 {_ms(w.p99)} ms; decode nodes attached: {', '.join(r.decode_nodes or []) or 'none'}"]
    h, rd = r.prefill_done_to_decode_loaded_ms or Latency(), lat.get("read", Latency())
    return ["", f"Decode node: loaded {blocks.read:,} blocks from "
                f"{r.handoff_dir}: {bw.read:.3f} GB/s, read p50 {_ms(rd.p50)} / p99 "
                f"{_ms(rd.p99)} ms; {r.missing_blocks or 0:,} missing",
            f"  prefill complete -> decode loaded: p50 {_ms(h.p50)} / p95 {_ms(h.p95)} / p99 {_ms(h.p99)} ms "
            f"({h.count:,} requests; wall clocks of both nodes)"]


def _by_chance(per_s: float, tolerance: float) -> str:
    """Why a tolerance cannot be met at this rate: a second's count of requests varies by 1 / sqrt(n) of its mean by
    chance alone (a Poisson count), and every second of a window must stay within the tolerance (about 2 of those)."""
    if not per_s or 2 / math.sqrt(per_s) <= tolerance:
        return ""
    chance = 1 / math.sqrt(per_s)
    fits = math.ceil(2 * chance * 20) / 20
    return (f"; at {per_s:.1f} requests a second, a second's count varies by about {chance:.0%} by chance alone "
            f"(1/\u221an, a Poisson count), so {tolerance:.0%} is met only by luck: --steady-state {fits:g} or more, "
            f"or a busier run, can show one")


def steady_section(results: Results) -> list[str]:
    st = results.steady_state
    if st is None:
        return []
    if not st.detected:
        return [f"Steady     not reached: no {st.window_s} s window of requests/s within {st.tolerance:.0%} "
                f"of its mean{_by_chance(results.requests.per_s, st.tolerance)}"]
    return [f"Steady     from t = {st.from_s} s ({st.window_s} s within {st.tolerance:.0%}): "
            f"{st.requests_per_s:.2f} requests/s, {st.tokens_per_s:,.0f} prompt tokens/s from there on"]


def sections(results: Results) -> list[str]:
    return steady_section(results) + qos_section(results) + autoscale_section(results) + role_section(results)
