"""The MLPerf front door: command lines of the MLPerf Storage KV-cache benchmark (kv-cache.py, v3.0) run here.

A command line that uses any of the reference's own flags is translated into our settings before it is
parsed: each flag maps to the setting with the same meaning; where the meaning cannot be the same, one
line says what the run does here instead. The reference's defaults apply to what its flags leave out
(100 users, realistic generation, 32 GiB CPU tier, no warm-up). Its config.yaml is read too: keys that map
onto ours are applied, the others are named and not applied. ``--output FILE`` writes, after the run, a
JSON with the fields its result tables read, computed by our measurement rules (see ``reference_output``).
The flags the reference shares with us by name and meaning (--model, --duration, --cpu-mem-gb, --cache-dir,
--seed, --max-requests, --trace-speedup, --replay-cycles, --precondition) pass through unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from kv_cache.config import Settings, read_config_file
from kv_cache.errors import UserError
from kv_cache.recorder.schema import Results

GENERATION_MS = {"none": 0.0, "fast": 2.0, "realistic": 30.0}  # the reference's sleep per output token
DEFAULTS = {"model.name": "llama3.1-8b", "workload.users": 100, "workload.generation_ms_per_token": 30.0,
            "tiers.cpu_mem_gb": 32.0, "run.warmup_s": 0.0}  # what the reference does when its flags are left out
REFUSED = {  # reference flags with no honest equivalent here: one sentence each
    "--xlsx-output": "spreadsheets are not written here; results.json, timeseries.csv and summary.md are",
    "--validation-trace": "its validation engine compares a hit rate to a trace; here "
                          "tests/scenario/test_hit_rate_reference.py checks hits against a reference simulator",
    "--enable-latency-tracing": "bpftrace is not run here; the run's telemetry reads the block layer's counters and "
                                "--io-trace writes every block operation with a fio job beside it",
    "--target-saturation": "the QoS autoscaler here searches the largest user count whose SLAs hold; set the SLA "
                           "targets (qos.<class>.*) instead of a saturation level",
    "--precondition-threads": "preconditioning here writes the tier sequentially with one writer per slab",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add = p.add_argument
    add("--num-users", type=int)
    add("--gpu-mem-gb", type=float)
    add("--num-gpus", type=int)
    add("--tensor-parallel", type=int)
    add("--generation-mode", choices=tuple(GENERATION_MS))
    add("--performance-profile", choices=("latency", "throughput"))
    add("--disable-multi-turn", action="store_true")
    add("--disable-prefix-caching", action="store_true")
    add("--enable-rag", action="store_true")
    add("--rag-num-docs", type=int)
    add("--enable-autoscaling", action="store_true")
    add("--autoscaler-mode", choices=("qos", "capacity"))
    add("--use-burst-trace", action="store_true")
    add("--burst-trace-path")
    add("--dataset-path")
    add("--max-conversations", type=int)
    add("--output")
    add("--max-concurrent-allocs", type=int)
    add("--request-rate", type=float)
    add("--precondition-size-gb", type=float)
    add("--prefill-only", action="store_true")
    add("--decode-only", action="store_true")
    add("--io-trace-log")
    add("--storage-capacity-gb", type=float)
    add("--log-level")
    for flag in REFUSED:
        add(flag, nargs="?")
    return p


REFERENCE_FLAGS = {a.option_strings[0] for a in _parser()._actions}
# ours too, by the same name: alone they do not make a reference command line
SHARED_FLAGS = {"--gpu-mem-gb", "--request-rate", "--max-conversations"}


@dataclass
class Translation:
    """Our command line for a reference one, the lines that say what differs, and --output's file."""

    argv: list[str]
    notes: list[str] = field(default_factory=list)
    output: str | None = None
    profile: str = "latency"


def speaks_reference(argv: list[str]) -> bool:
    """True when the command line uses a flag only the reference has, or --config names a reference file."""
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if flags & (REFERENCE_FLAGS - SHARED_FLAGS):
        return True
    config = _value_of(argv, "--config")
    return bool(config) and Path(config).is_file() and _is_reference_config(read_config_file(Path(config)))


def _value_of(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def translate(argv: list[str]) -> Translation:
    """The reference's flags (and config file) as our flags and --set values; ours pass through."""
    ns, rest = _parser().parse_known_args(argv)
    for flag, why in REFUSED.items():
        if getattr(ns, flag[2:].replace("-", "_")) is not None or flag in argv:
            raise UserError(f"{flag} (MLPerf reference) is not supported here: {why}; drop it.")
    sets: dict[str, object] = {}
    notes: list[str] = []
    given = {a.split("=", 1)[0] for a in rest if a.startswith("--")}
    _config(rest, sets, notes)
    _load(ns, sets, notes)
    _tiers(ns, sets, notes, given)
    _traffic(ns, sets, notes)
    _roles(ns, rest, sets, notes)
    for dotted, value in DEFAULTS.items():  # the reference's defaults for what its command line left out
        if dotted not in sets and not given & _OUR_FLAGS.get(dotted, set()):
            sets[dotted] = value
    if ns.log_level:
        notes.append(f"--log-level {ns.log_level}: there are no log levels here; the summary is printed, "
                     f"--quiet prints nothing but errors")
    argv_out = list(rest)
    for dotted, value in sets.items():
        argv_out += ["--set", f"{dotted}={json.dumps(value)}"]  # JSON is YAML: --set parses it back
    if ns.output and not _value_of(rest, "--run-id"):  # --output reads the run's folder: name it
        argv_out += ["--run-id", f"{Path(ns.output).stem or 'mlperf'}-{time.strftime('%Y%m%dT%H%M%S')}"]
    return Translation(argv_out, notes, ns.output, ns.performance_profile or "latency")


_OUR_FLAGS = {"model.name": {"--model"}, "workload.users": {"--users"}, "workload.generation_ms_per_token": set(),
              "tiers.cpu_mem_gb": {"--cpu-mem-gb"}, "run.warmup_s": {"--warmup"}}


def _load(ns, sets: dict, notes: list[str]) -> None:
    if ns.num_users is not None:
        sets["workload.users"] = ns.num_users
    if ns.generation_mode is not None:
        sets["workload.generation_ms_per_token"] = GENERATION_MS[ns.generation_mode]
    if ns.disable_multi_turn:
        sets["workload.max_turns"] = 1
    if ns.disable_prefix_caching:
        sets["workload.num_system_prompts"] = 0
    if ns.enable_rag:
        sets["rag.enabled"] = True
    if ns.rag_num_docs is not None:
        sets["rag.num_documents"] = ns.rag_num_docs
    if ns.enable_autoscaling:
        sets["autoscale.mode"] = ns.autoscaler_mode or "qos"
        notes.append("--enable-autoscaling: the autoscaler really activates and parks users, in steps of "
                     "autoscale.step_s seconds (the reference samples every 10 s and never applies its count)")
    if ns.max_concurrent_allocs:
        sets["schedule.workers"] = ns.max_concurrent_allocs
        notes.append(f"--max-concurrent-allocs {ns.max_concurrent_allocs}: here {ns.max_concurrent_allocs} worker "
                     f"threads issue all block I/O (the reference bounds only allocation and writes)")
    if ns.request_rate:
        sets["schedule.arrival"], sets["schedule.request_rate"] = "poisson", ns.request_rate
        notes.append(f"--request-rate {ns.request_rate:g}: Poisson arrivals at that mean rate (the reference sleeps "
                     f"1/rate between ShareGPT requests)")
    if ns.performance_profile:
        notes.append(f"--performance-profile {ns.performance_profile}: no pass/fail here; --output writes the "
                     f"reference's {ns.performance_profile} criteria judged on our figures (storage_health)")


def _tiers(ns, sets: dict, notes: list[str], given: set[str]) -> None:
    gpus = ns.num_gpus or 1
    if ns.num_gpus is not None:
        sets["tiers.gpus"] = ns.num_gpus
    if ns.gpu_mem_gb is not None:  # the reference's budget is per GPU; ours is over all of them
        sets["tiers.gpu_mem_gb"] = ns.gpu_mem_gb * gpus
        if ns.gpu_mem_gb == 0:
            sets["tiers.gpu"] = "off"
    if ns.tensor_parallel is not None:
        sets["model.tp"] = ns.tensor_parallel
    if ns.storage_capacity_gb:
        sets["tiers.nvme_gb"] = ns.storage_capacity_gb
    if ns.precondition_size_gb:
        cap = ns.storage_capacity_gb
        passes = max(1, math.ceil(ns.precondition_size_gb / cap)) if cap else 2
        sets["tiers.precondition"], sets["tiers.precondition_passes"] = True, passes
        notes.append(f"--precondition-size-gb {ns.precondition_size_gb:g}: {passes} pass(es) over the storage tier"
                     + ("" if cap else " (its size is chosen at start: the reference's default of 2 x capacity)"))
    if ns.io_trace_log:
        sets["run.io_trace"] = ns.io_trace_log
        notes.append("--io-trace-log: every block operation is logged as measured on the real tiers (the reference "
                     "replaces every tier by a null backend; add --null-io for that)")


def _traffic(ns, sets: dict, notes: list[str]) -> None:
    if ns.dataset_path:  # ShareGPT wins over the burst trace, as in the reference
        sets["trace.path"], sets["trace.format"] = ns.dataset_path, "sharegpt"
        sets["trace.max_conversations"] = ns.max_conversations if ns.max_conversations is not None else 500
    elif ns.use_burst_trace:
        sets["trace.path"] = ns.burst_trace_path or "BurstGPT/data/BurstGPT_1.csv"
        sets["trace.format"] = "burstgpt"
    elif ns.max_conversations is not None:
        sets["trace.max_conversations"] = ns.max_conversations


def _roles(ns, rest: list[str], sets: dict, notes: list[str]) -> None:
    if ns.prefill_only and ns.decode_only:
        raise UserError("--prefill-only and --decode-only exclude each other (as in the reference); keep one.")
    handoff = _value_of(rest, "--handoff-dir")
    if ns.prefill_only:
        if handoff:
            sets["disagg.role"] = "prefill"
        else:
            sets["workload.decode_writes"] = False
            notes.append("--prefill-only: requests write their prompt blocks and no decode blocks; with "
                         "--handoff-dir DIR this node also publishes them for a --decode-only node")
    if ns.decode_only:
        if not handoff:
            raise UserError("--decode-only: a decode node here reads the blocks a prefill node published (the "
                            "reference reads entries it wrote itself before the clock); run a --prefill-only "
                            "node with --handoff-dir DIR and give this one the same --handoff-dir.")
        sets["disagg.role"] = "decode"


# ---------------------------------------------------------------------------- the reference's config.yaml

REFERENCE_SECTIONS = {"user_templates", "generation_timing", "qos_profiles", "qos_distribution", "eviction",
                      "gpu_backend", "prefix_cache", "rag", "conversation", "autoscaler", "decode", "sharegpt",
                      "saturation_detection", "validation_limits", "model_configs"}
OUR_SECTIONS = {f.name for f in dataclasses.fields(Settings)}


def _is_reference_config(data: dict) -> bool:
    """Sections only the reference has, and none only ours has (rag is in both)."""
    keys = set(data)
    return bool(keys & (REFERENCE_SECTIONS - OUR_SECTIONS)) and not keys & (OUR_SECTIONS - REFERENCE_SECTIONS)


def _config(rest: list[str], sets: dict, notes: list[str]) -> None:
    path = _value_of(rest, "--config")
    if not path:
        return
    data = read_config_file(Path(path))
    if not _is_reference_config(data):
        return
    unknown = sorted(set(data) - REFERENCE_SECTIONS)
    if unknown:
        raise UserError(f"config file {path}: section {unknown[0]!r} is in neither the MLPerf reference's schema nor "
                        f"ours; remove it.")
    i = rest.index("--config") if "--config" in rest else next(i for i, a in enumerate(rest) if
                                                               a.startswith("--config="))
    del rest[i:i + (2 if rest[i] == "--config" else 1)]  # read here; our own defaults stay the base
    unused = _qos_mix(data.pop("qos_distribution", None) or {}, sets)
    for section, body in data.items():
        for k, v in (body or {}).items():
            unused += [f"{section}.{k}{'.' + sub if sub else ''}" for sub in _config_key(section, k, v, sets)]
    if unused:
        notes.append(f"config {path}: not applied here (no equivalent, or fixed by design): {', '.join(unused)}")


def _qos_mix(body: dict, sets: dict) -> list[str]:
    """qos_distribution -> qos.mix; a key it leaves out takes the reference's default (0.15, cumulative 0.50)."""
    if not body:
        return []
    a = body.get("interactive_probability", 0.15)
    b = body.get("responsive_threshold", 0.50)
    sets["qos.mix"] = f"interactive={a:g},responsive={b - a:g},batch={1 - b:g}"
    return [f"qos_distribution.{k}" for k in sorted(set(body) - {"interactive_probability", "responsive_threshold"})]


_TEMPLATE = {"context_range": "context_tokens", "generation_range": "output_tokens",
             "think_time_range": "think_time_s"}


def _nested(v: dict, names: dict, prefix: str, sets: dict) -> list[str]:
    """Apply the sub-keys of v named in names under prefix; the sub-keys with no equivalent."""
    for rk, ours in names.items():
        if rk in v:
            sets[f"{prefix}.{ours}"] = list(v[rk]) if isinstance(v[rk], list) else v[rk]
    return sorted(set(v) - set(names))


def _config_key(section: str, k: str, v, sets: dict) -> list[str]:
    """Apply one reference config key to our settings; what of it has no equivalent ('' = all of it)."""
    if section == "user_templates" and isinstance(v, dict) and k in ("chatbot", "coding", "document"):
        return _nested(v, _TEMPLATE, f"profiles.{k}", sets)
    if section == "qos_profiles" and isinstance(v, dict) and k in ("interactive", "responsive", "batch"):
        # the reference judges end-to-end latency against its p95 target; p99.9 / p99.99 are not judged here
        names = {"target_latency_p95_ms": "e2e_p95_ms", "target_latency_p99_ms": "e2e_p99_ms", "priority": "priority"}
        return _nested(v, names, f"qos.{k}", sets)
    simple = {("conversation", "max_turns_per_conv"): "workload.max_turns",
              ("conversation", "end_conversation_probability"): "workload.end_probability",
              ("rag", "top_k_chunks"): "rag.top_k", ("rag", "request_probability"): "rag.request_probability"}
    if (section, k) in simple:
        sets[simple[(section, k)]] = v
        return []
    if (section, k) == ("rag", "retrieval_distribution"):
        sets["rag.zipf"] = 1.0 if v == "zipfian" else 0.0
        return []
    return [""]


# ---------------------------------------------------------------------------- --output FILE

GB = 2**30  # the reference's "gb" fields are GiB (bytes / 1024^3)


def reference_output(r: Results, profile: str) -> dict:
    """The fields the reference's result tables read, computed by our rules (README: "MLPerf front door")."""
    bottom, window = r.bottom, r.run.duration_s
    moved = r.bytes.get(bottom)
    e2e = r.request_latency_ms.get("e2e")
    q = r.qos or {}
    read_p95, write_p95 = r.latency(bottom, "read", "p95"), r.latency(bottom, "write", "p95")
    summary = {
        "total_requests": r.requests.completed, "elapsed_time": window,
        "avg_throughput_tokens_per_sec": r.tokens.generated / window if window else None,
        "cached_tokens_per_sec": r.tokens.cached_per_s, "requests_per_second": r.requests.per_s,
        "end_to_end_latency_ms": {"mean": e2e.mean, "p50": e2e.p50, "p95": e2e.p95, "p99": e2e.p99} if e2e else None,
        "cache_stats": {"cache_hit_rate": r.hit_rate.blocks, "token_hit_rate": r.hit_rate.tokens,
                        "storage_read_bandwidth_gbps": r.storage_gbps("read") or 0.0,
                        "storage_write_bandwidth_gbps": r.storage_gbps("write") or 0.0,
                        "tier_storage_kv_bytes_read_gb": (moved.read if moved else 0) / GB,
                        "tier_storage_kv_bytes_written_gb": (moved.write if moved else 0) / GB,
                        "storage_health": _health(r, profile)},
        "qos_metrics": {name: {"total_requests": c["requests"], "latency_ms": c["e2e_ms"], "sla_met": c["met"],
                               "compliance": c["attainment"]} for name, c in q.get("classes", {}).items()},
        "autoscaling_stats": _autoscaling(r),
    }
    return {
        "source": "kv-cache-bench (MLPerf front door): per-block measurements, bytes counted at completion, "
                  "inside the measurement window",
        "results_json": f"{r.run.run_id}/results.json",
        "requests_completed": r.requests.completed, "seed": r.run.seed,
        "decode_bytes_read_gb": (moved.read if moved else 0) / GB,
        "prefill_bytes_written_gb": (moved.write if moved else 0) / GB,
        "avg_throughput_tokens_per_sec": summary["avg_throughput_tokens_per_sec"],
        "storage_read_bandwidth_gbps": summary["cache_stats"]["storage_read_bandwidth_gbps"],
        "storage_write_bandwidth_gbps": summary["cache_stats"]["storage_write_bandwidth_gbps"],
        "nvme_read_device_p95_ms": read_p95, "nvme_write_device_p95_ms": write_p95,
        "end_to_end_latency_p95_ms": e2e.p95 if e2e else None,
        "cache_hit_rate": r.hit_rate.blocks,
        "autoscaling_stats": summary["autoscaling_stats"],
        "qos_stats": summary["qos_metrics"],
        "summary": summary,
    }


def _health(r: Results, profile: str) -> dict:
    """The reference's pass/fail criteria judged on our figures (informative: MLPerf has no pass/fail)."""
    bottom = r.bottom
    if profile == "throughput":
        crit = [("storage bandwidth > 0", bool(r.storage_gbps("read") or r.storage_gbps("write")))]
    else:
        cpu = [r.latency(t, op, "p95") for t in r.run.tiers if t != bottom for op in ("read", "write")]
        cpu = [v for v in cpu if v is not None]
        checks = [("storage write p95 < 500 ms", r.latency(bottom, "write", "p95"), 500.0),
                  ("storage read p95 < 200 ms", r.latency(bottom, "read", "p95"), 200.0),
                  ("memory tier p95 < 150 ms", max(cpu) if cpu else None, 150.0)]
        crit = [(name, v < limit) for name, v, limit in checks if v is not None]
        if r.hit_rate.blocks is not None:
            crit.append(("cache hit rate > 30 %", r.hit_rate.blocks > 0.3))
    passed = sum(ok for _, ok in crit)
    return {"profile": profile, "overall_status": "PASS" if passed == len(crit) else "FAIL",
            "criteria": [{"name": n, "passed": ok} for n, ok in crit], "passed_count": passed,
            "total_count": len(crit)}


def _autoscaling(r: Results) -> list[dict]:
    a = r.autoscale or {}
    return [{"step": i, "mode": a.get("mode"), "users": p["users"], "throughput_tokens_per_sec": p["tokens_per_s"],
             "requests_per_sec": p["requests_per_s"], "ttft_p95_ms": p["ttft_p95_ms"], "sla_met": p["sla_met"]}
            for i, p in enumerate(a.get("curve", []), 1)]


def write_output(path: str, results_dir: Path, profile: str) -> Path:
    """--output FILE: the reference's fields from the run's results.json."""
    data = json.loads((results_dir / "results.json").read_text())
    out = reference_output(Results.from_dict(data), profile)
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(out, indent=1))
    except OSError as e:
        raise UserError(f"--output {path}: cannot write there ({e.strerror}); the run's results are in "
                        f"{results_dir}.") from None
    return target
