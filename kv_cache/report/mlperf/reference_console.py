"""Under a reference command line, after our summary: the MLPerf reference's own summary sections, with its names
and units (GiB, GiB/s, its official storage_throughput_tokens_per_sec, "SLA Met"), read from the --output fields
(output.py), and its PASS/FAIL line (its storage_health criteria, judged on our figures)."""

from __future__ import annotations

from kv_cache.report.mlperf.fields import TIERS

PASS, FAIL = "[OK]", "[X]"


def _latency(title: str, lat: dict, keys=("mean", "p50", "p95", "p99")) -> list[str]:
    return [f"\n### {title} ###"] + [f"  {k.upper() if k != 'mean' else 'Mean'}: {lat.get(k, 0.0):.2f} ms"
                                     for k in keys]


def _ms(v: float, none: str) -> str:
    """A latency of the file, or '-' and why where it holds the 0.0 written for no sample (a histogram's value is
    never exactly 0: its lowest is 1 ns): never a figure the run did not measure (issue 51)."""
    if v == 0.0:
        return f"- ({none})"
    return f"{v:.2f} ms" if v >= 0.01 else f"{v:.4f} ms"  # a host part of a few microseconds is not 0.00


def _criterion(c: dict) -> str:
    mark = PASS if c.get("passed") else FAIL
    if c.get("unit") == "ratio":
        return f"  {mark} {c['name']}: {c['actual']:.1%} (target: {c['target']:.1%})"
    unit = c.get("unit") or ""

    def show(v):
        return f"{v:.2f}" if isinstance(v, (int, float)) else str(v)
    return f"  {mark} {c['name']}: {show(c.get('actual'))}{unit} (target: {show(c.get('target'))}{unit})"


def reference_summary(fields: dict) -> list[str]:
    """The reference's console sections for one run's --output fields."""
    s = fields["summary"]
    c = s["cache_stats"]
    elapsed = s["elapsed_time"] or 1.0
    out = ["", "=" * 80, "BENCHMARK RESULTS - MLPerf KV Cache Storage Benchmark (the reference's sections and units,",
           "computed by our rules: docs/mlperf.md)", "=" * 80,
           "\n### OVERALL PERFORMANCE ###", f"Requests Completed: {s['total_requests']}",
           f"Total Tokens Generated: {s['total_tokens']}",
           f"Throughput (wall-clock): {s['avg_throughput_tokens_per_sec']:.2f} tokens/sec",
           f"Throughput (storage I/O): {s['storage_throughput_tokens_per_sec']:.2f} tokens/sec",
           f"Requests/sec: {s['requests_per_second']:.2f}"]
    out += _latency("END-TO-END LATENCY (Queue Wait + Storage I/O + Generation)", s["end_to_end_latency_ms"])
    out += _latency("PER-REQUEST STORAGE LATENCY (All I/O ops for one request)", s["storage_io_latency_ms"])
    if fields.get("total_generation_latency"):
        out += _latency("TOKEN GENERATION LATENCY (Simulated)", s["generation_latency_ms"], ("mean", "p50", "p95"))
    out += ["\n### STORAGE PERFORMANCE ###",
            f"  Cache Hit Rate: {c['cache_hit_rate'] * 100:.1f}% (of the prompts' block lookups; our summary's hit "
            f"rate is of prompt tokens)",
            f"  Total Read: {c['total_read_gb']:.2f}GiB", f"  Total Write: {c['total_write_gb']:.2f}GiB",
            f"  Read/Write Ratio: {c['read_write_ratio']:.2f}",
            f"  Storage KV Read Operations/sec: {c['read_iops'] / elapsed:.2f}",
            f"  Storage KV Write Operations/sec: {c['write_iops'] / elapsed:.2f}",
            "\n### CACHE TIER DISTRIBUTION ###",
            f"  GPU Entries: {c['gpu_entries']} ({c['gpu_memory_used_gb']:.2f}GiB)",
            f"  CPU Entries: {c['cpu_entries']} ({c['cpu_memory_used_gb']:.2f}GiB)",
            f"  Storage Entries: {c['storage_entries']}", "\n### TIER-SPECIFIC KV BYTES ###"]
    for label, t in TIERS:
        out += [f"  {label} KV Bytes Written: {c[f'tier_{t}_kv_bytes_written_gb']:.2f}GiB",
                f"  {label} KV Bytes Read: {c[f'tier_{t}_kv_bytes_read_gb']:.2f}GiB"]
    out.append("\n### STORAGE KV BANDWIDTH ###")
    for label, t in TIERS:
        out += [f"  {label} KV Read Bandwidth: {c[f'tier_{t}_read_bandwidth_gbps']:.2f}GiB/s",
                f"  {label} KV Write Bandwidth: {c[f'tier_{t}_write_bandwidth_gbps']:.2f}GiB/s"]
    out.append("\n### TIER-SPECIFIC LATENCIES (Total = Host + Device) ###")
    none = "no such operation timed in the window; bytes a demotion reads are timed as the next tier's write"
    out += [f"  {label} {op.title()} P95 (Total): {_ms(c[f'{t}_{op}_p95_ms'], none)}" for label, t in TIERS
            for op in ("read", "write")]
    out.append("\n### STORAGE TIER LATENCY BREAKDOWN (Device = the storage call, Host = the rest) ###")
    for op in ("read", "write"):
        out += [f"  Storage {op.title()}:",
                f"    - Device P95 (Disk I/O): {_ms(c[f'storage_{op}_device_p95_ms'], 'no such operation')}",
                f"    - Host P95 (Serialization): {_ms(c[f'storage_{op}_host_p95_ms'], 'not timed apart here')}",
                f"    - Total P95: {_ms(c[f'storage_{op}_p95_ms'], 'no such operation')}"]
    p, m = s["prefix_cache_stats"], s["multi_turn_stats"]
    out += ["\n### CACHE TYPE BREAKDOWNS ###", f"  System Prompt Hits: {c['system_prompt_hits']}",
            f"  Common Phrase Hits: {c['common_phrase_hits']}", f"  User Cache Hits: {c['user_cache_hits']}",
            f"  Multi-turn Hits: {c['multi_turn_hits']}", "\n### PREFIX CACHING ###",
            f"  Prefix Hits: {p['prefix_hits']} (requests that found a cached prefix)",
            f"  Prefix Misses: {p['prefix_misses']} (requests that found none)",
            f"  System Prompt Reuse: {p['system_prompt_reuse']}", f"  Bytes Saved: {p['bytes_saved'] / 2**30:.2f}GiB",
            "\n### MULTI-TURN CONVERSATIONS ###", f"  Multi-turn Cache Hits: {m['cache_hits']}",
            f"  Multi-turn Cache Misses: {m['cache_misses']}", f"  Multi-turn Hit Rate: {m['hit_rate'] * 100:.1f}%",
            "\n### QOS LATENCY METRICS (Informational - includes simulated generation) ###"]
    for level, q in s["qos_metrics"].items():
        if q["no_data"]:
            continue
        sla = q["sla"]
        out += [f"\n  {level.upper()}:", f"    Requests: {q['total_requests']}",
                f"    Latency P95: {q['latency_ms']['p95']:.2f} ms",
                f"    Latency P99: {q['latency_ms']['p99']:.2f} ms",
                f"    SLA Met: {PASS if sla['met'] else FAIL} (compliance: {sla['compliance'] or 0.0:.1%}, target "
                f"P95 {sla['target_p95_ms']:g} ms)"]
    if s.get("autoscaling_summary"):
        a = s["autoscaling_summary"]
        out += ["\n### AUTOSCALING ###", f"  Scaling Events: {a['total_scale_events']}",
                f"  Final User Count: {a['final_users']}"]
        if "peak_throughput_tokens_per_sec" in a:
            out.append(f"  Peak Capacity Found: {a['peak_throughput_tokens_per_sec']:.2f} tok/s at "
                       f"{a['peak_user_count']} users")
    return out + _assessment(c["storage_health"]) + ["=" * 80]


def _assessment(health: dict) -> list[str]:
    """Its storage_health criteria and the PASS / FAIL line (informative: MLPerf v3.0 publishes no pass/fail)."""
    status = health["overall_status"]
    mark = PASS if status == "PASS" else FAIL
    return ([f"\n### STORAGE PERFORMANCE ASSESSMENT: {status} {mark} ###",
             f"  Criteria Passed: {health['passed_count']}/{health['total_count']} ({health['profile']} profile)"]
            + [_criterion(c) for c in health["criteria"]]
            + [f"MLPerf reference assessment: {status}"])
