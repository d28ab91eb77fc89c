"""--xlsx-output FILE under a reference command line: the MLPerf reference's spreadsheet (its sheets, columns and
units) of the fields --output holds. Written with openpyxl (the xlsx extra), as the reference writes it with
pandas over openpyxl: Summary (one row: run parameters and metrics), Run Parameters, Performance Metrics and QoS
Metrics."""

from __future__ import annotations

import time
from pathlib import Path

from kv_cache.report.mlperf.fields import TIERS
from kv_cache.safefiles import write_with

PCT_NAMES = (("p50", "P50"), ("p95", "P95"), ("p99", "P99"), ("p999", "P99.9"), ("p9999", "P99.99"))


def _dig(d, *keys):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _latency_columns(summary: dict) -> dict:
    out = {}
    for field, name, pcts in (("end_to_end_latency_ms", "E2E Latency", PCT_NAMES),
                              ("storage_io_latency_ms", "Storage Latency", PCT_NAMES),
                              ("generation_latency_ms", "Gen Latency", PCT_NAMES[:3])):
        out[f"{name} Mean (ms)"] = _dig(summary, field, "mean")
        out.update({f"{name} {label} (ms)": _dig(summary, field, k) for k, label in pcts})
    cache = summary.get("cache_stats") or {}
    for kind, infix in (("Total", ""), ("Device", "_device"), ("Host", "_host")):
        for op in ("read", "write"):
            out.update({f"Storage Tier {op.title()} {kind} {label} (ms)": cache.get(f"storage_{op}{infix}_{k}_ms")
                        for k, label in PCT_NAMES})
    return out


def _metrics(summary: dict) -> dict:
    cache = summary.get("cache_stats") or {}
    out = {"Total Requests": summary.get("total_requests"), "Total Tokens": summary.get("total_tokens"),
           "Elapsed Time (s)": summary.get("elapsed_time"),
           "Avg Throughput (tok/s)": summary.get("avg_throughput_tokens_per_sec"),
           "Storage Throughput (tok/s)": summary.get("storage_throughput_tokens_per_sec"),
           "Requests/sec": summary.get("requests_per_second"), **_latency_columns(summary),
           "Cache Hit Rate": cache.get("cache_hit_rate"), "Read/Write Ratio": cache.get("read_write_ratio"),
           "Total Read (GiB)": cache.get("total_read_gb"), "Total Write (GiB)": cache.get("total_write_gb")}
    for word, key in (("Written", "written"), ("Read", "read")):
        out.update({f"Tier {label} KV Bytes {word} (GiB)": cache.get(f"tier_{t}_kv_bytes_{key}_gb")
                    for label, t in TIERS})
    for label, t in TIERS:
        out.update({f"Tier {label} {op.title()} Bandwidth (GiB/s)": cache.get(f"tier_{t}_{op}_bandwidth_gbps")
                    for op in ("read", "write")})
    out.update({"GPU Entries": cache.get("gpu_entries"), "CPU Entries": cache.get("cpu_entries"),
                "Storage Entries": cache.get("storage_entries"),
                "Multi-turn Hit Rate": _dig(summary, "multi_turn_stats", "hit_rate")})
    return out


def write_xlsx(path: str, reference: dict, params: dict, profile: str) -> Path:
    """The spreadsheet of one run's --output fields; params: the run's parameters as the reference names them."""
    from openpyxl import Workbook

    summary = reference.get("summary") or {}
    run_params = {"Timestamp": time.strftime("%Y-%m-%d %H:%M:%S"), **params}
    metrics = _metrics(summary)
    wb = Workbook()
    sheet = wb.active
    sheet.title = "Summary"
    row = {**run_params, **metrics}
    sheet.append(list(row))
    sheet.append(list(row.values()))
    for title, pairs, head in (("Run Parameters", run_params, ("Parameter", "Value")),
                               ("Performance Metrics", metrics, ("Metric", "Value"))):
        ws = wb.create_sheet(title)
        ws.append(list(head))
        for k, v in pairs.items():
            ws.append([k, v])
    qos = {k: v for k, v in (summary.get("qos_metrics") or {}).items() if isinstance(v, dict) and not v.get("no_data")}
    if qos:
        ws = wb.create_sheet("QoS Metrics")
        ws.append(["QoS Level", "Total Requests", "Latency P95 (ms)", "Latency P99 (ms)", "SLA Met", "SLA Compliance"])
        for level, d in qos.items():
            judged = [_dig(d, "sla", k) for k in ("met", "compliance")]
            if profile == "throughput":
                judged = ["N/A (throughput mode)"] * 2
            ws.append([level, d.get("total_requests"), _dig(d, "latency_ms", "p95"), _dig(d, "latency_ms", "p99"),
                       *judged])
    return write_with(path, wb.save, "--xlsx-output", binary=True)
