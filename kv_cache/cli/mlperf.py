"""The MLPerf front door: command lines of the MLPerf Storage KV-cache benchmark (kv-cache.py, v3.0) run here.

A command line that uses any of the reference's own flags is translated into our settings before it is
parsed: each flag maps to the setting with the same meaning; where the meaning cannot be the same, one
line says what the run does here instead. The reference's defaults apply to what its flags leave out
(100 users, realistic generation, 32 GiB CPU tier, no warm-up). Its config.yaml is read too: keys that map
onto ours are applied, the others are named and not applied. ``--output FILE`` writes, after the run, a
JSON with the fields its result tables read, computed by our measurement rules (report/mlperf/output.py).
The flags the reference shares with us by name and meaning (--model, --duration, --cpu-mem-gb, --cache-dir,
--seed, --max-requests, --trace-speedup, --replay-cycles, --precondition) pass through unchanged.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from kv_cache.cli.args import Parser, amount
from kv_cache.cli.mlperf_config import apply_config, is_reference_config
from kv_cache.cli.mlperf_files import check_output, check_xlsx, make_cache_dir
from kv_cache.cli.mlperf_load import load_model, our_flag, our_trace_timed, trace_at_its_times, typed_value, value_of
from kv_cache.config import read_config_file
from kv_cache.errors import UserError

GENERATION_MS = {"none": 0.0, "fast": 2.0, "realistic": 30.0}  # the reference's sleep per output token
DEFAULTS = {"model.name": "llama3.1-8b", "workload.users": 100, "workload.generation_ms_per_token": 30.0,
            "tiers.cpu_mem_gb": 32.0, "run.warmup_s": 0.0,  # what the reference does when its flags are left out
            # its qos_profiles: the end-to-end p95 / p99 targets its summary judges (ours are 2 / 5 / 30 s at p95)
            "qos.interactive.e2e_p95_ms": 50.0, "qos.interactive.e2e_p99_ms": 100.0,
            "qos.responsive.e2e_p95_ms": 100.0, "qos.responsive.e2e_p99_ms": 200.0,
            "qos.batch.e2e_p95_ms": 1000.0, "qos.batch.e2e_p99_ms": 5000.0}
REFUSED = {  # reference flags with no honest equivalent here: one sentence each
    "--validation-trace": "its validation engine compares a hit rate to a trace; here "
                          "tests/scenario/test_hit_rate_reference.py checks hits against a reference simulator",
    "--precondition-threads": "preconditioning here writes the tier sequentially with one writer per slab",
}


def _parser() -> Parser:
    p = Parser(prog="kv_cache_benchmark.py", add_help=False, allow_abbrev=False)
    add = p.add_argument
    add("--num-users", type=int)
    add("--gpu-mem-gb", type=amount)
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
    add("--request-rate", type=amount)
    add("--precondition-size-gb", type=amount)
    add("--prefill-only", action="store_true")
    add("--decode-only", action="store_true")
    add("--io-trace-log")
    add("--storage-capacity-gb", type=amount)
    add("--log-level")
    add("--target-saturation", type=amount)
    add("--enable-latency-tracing", action="store_true")
    add("--xlsx-output")
    for flag in REFUSED:
        add(flag, nargs="?")
    return p


REFERENCE_FLAGS = {a.option_strings[0] for a in _parser()._actions}
# ours too, by the same name: alone they do not make a reference command line
SHARED_FLAGS = {"--gpu-mem-gb", "--request-rate", "--max-conversations"}
# the reference's flags that are ours too, by name and meaning: they pass through to our parser
PASS_THROUGH = {"--model", "--duration", "--cpu-mem-gb", "--cache-dir", "--seed", "--max-requests",
                "--trace-speedup", "--replay-cycles", "--precondition", "--config"}


def expand_prefixes(argv: list[str], ours: set[str]) -> tuple[list[str], list[str]]:
    """The reference's argparse takes an unambiguous prefix of its flags (--num-user 6); ours takes none (a typo
    is refused). A prefix of a flag only the reference has makes the command line a reference one; in one,
    prefixes of all its flags expand, and an ambiguous one is refused naming the candidates. Returns the command
    line and a note per expansion."""
    argv, notes = _expand(argv, ours, REFERENCE_FLAGS - SHARED_FLAGS, strict=False)
    if not speaks_reference(argv):
        return argv, notes
    argv, more = _expand(argv, ours, REFERENCE_FLAGS | PASS_THROUGH, strict=True)
    return argv, notes + more


def _expand(argv: list[str], ours: set[str], targets: set[str], strict: bool) -> tuple[list[str], list[str]]:
    out, notes = [], []
    for i, a in enumerate(argv):
        if a == "--":
            return out + argv[i:], notes
        name, eq, value = a.partition("=")
        if not name.startswith("--") or name in ours or name in REFERENCE_FLAGS or name in PASS_THROUGH:
            out.append(a)
            continue
        found = sorted(f for f in targets if f.startswith(name))
        if len(found) == 1:
            out.append(found[0] + eq + value)
            notes.append(f"{name}: taken as {found[0]} (the MLPerf reference accepts an unambiguous prefix)")
            continue
        if len(found) > 1 and strict:
            raise UserError(f"{name} is a prefix of several MLPerf reference flags ({', '.join(found)}); spell "
                            f"out the one you mean.")
        out.append(a)
    return out, notes


@dataclass
class Translation:
    """Our command line for a reference one, the lines that say what differs, and --output's file; origins: our
    key -> what the user typed for it (a reference flag, a key of its config file), for error messages."""

    argv: list[str]
    notes: list[str] = field(default_factory=list)
    output: str | None = None
    profile: str = "latency"
    origins: dict[str, str] = field(default_factory=dict)
    xlsx: str | None = None  # --xlsx-output FILE: the reference's spreadsheet of the --output fields
    made_dirs: list[str] = field(default_factory=list)  # folders made for --cache-dir, deepest first (removed
    # again, where still empty, when the run is refused)
    typed: dict = field(default_factory=dict)  # the reference's run parameters that only its flags hold (xlsx.py)


class Sets(dict):
    """Our settings (dotted key -> value) and, for each, what the user typed that set it."""

    def __init__(self):
        super().__init__()
        self.origin: dict[str, str] = {}
        self.source = ""  # while a config file is applied: its name, the origin of what it sets
        self.timing = dict(GENERATION_MS)  # ms per output token of each --generation-mode (its generation_timing)

    def __setitem__(self, dotted: str, value) -> None:
        super().__setitem__(dotted, value)
        if self.source:
            self.origin[dotted] = self.source

    def put(self, dotted: str, value, origin: str) -> None:
        super().__setitem__(dotted, value)
        self.origin[dotted] = origin

    def drop(self, dotted: str) -> None:
        del self[dotted]
        self.origin.pop(dotted)


def speaks_reference(argv: list[str]) -> bool:
    """True when the command line uses a flag only the reference has, or --config names a reference file."""
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if flags & (REFERENCE_FLAGS - SHARED_FLAGS):
        return True
    config = value_of(argv, "--config")
    return bool(config) and Path(config).is_file() and is_reference_config(read_config_file(Path(config)))


def translate(argv: list[str]) -> Translation:
    """The reference's flags (and config file) as our flags and --set values; ours pass through."""
    ns, rest = _parser().parse_known_args(argv)
    for flag, why in REFUSED.items():
        if getattr(ns, flag[2:].replace("-", "_")) is not None or flag in argv:
            raise UserError(f"{flag} (MLPerf reference) is not supported here: {why}; drop it.")
    sets, notes = Sets(), []
    if not ns.output:  # the reference always writes its results file: benchmark_results_<time>.json, here
        ns.output = f"benchmark_results_{time.strftime('%Y%m%d_%H%M%S')}.json"
        notes.append(f"no --output: the reference's fields go to {ns.output} in this folder, as the reference "
                     f"writes them by default")
    check_output(ns.output)
    if ns.xlsx_output:
        if os.path.abspath(ns.xlsx_output) == os.path.abspath(ns.output):
            raise UserError(f"--xlsx-output {ns.xlsx_output} is --output's file too: the spreadsheet would replace "
                            f"the JSON results; name another file.")
        check_xlsx(ns.xlsx_output)
    made = make_cache_dir(value_of(rest, "--cache-dir"), notes)
    given = {a.split("=", 1)[0] for a in rest if a.startswith("--")}
    _config(rest, sets, notes)
    _load(ns, sets, notes)
    _tiers(ns, sets, notes, given)
    _traffic(ns, sets, notes)
    _speedup(ns, rest, sets, notes)
    _roles(ns, rest, sets, notes)
    _refuse_twice(sets, rest)
    idle = [k for k in sets if k.startswith("rag.") and k != "rag.enabled"] if not sets.get("rag.enabled") else []
    if idle:  # the reference ignores its RAG keys (config or flags) while RAG is off: here they would refuse the run
        notes.append(f"{', '.join(sorted({sets.origin[k] for k in idle}))}: not applied, RAG is off (--enable-rag "
                     f"turns it on)")
    for k in idle:
        sets.drop(k)
    timed = our_trace_timed(rest)
    no_users = trace_at_its_times(ns, rest, sets, notes, timed)
    user_sets = {rest[i + 1].split("=", 1)[0] for i, a in enumerate(rest[:-1]) if a == "--set"}
    defaults = {**DEFAULTS, "workload.generation_ms_per_token": sets.timing["realistic"]}  # its default mode
    for dotted, value in defaults.items():  # the reference's defaults for what its command line left out
        if dotted not in sets and dotted not in user_sets and not given & _OUR_FLAGS.get(dotted, set()) \
                and not (no_users and dotted == "workload.users"):
            sets.put(dotted, value, f"the MLPerf reference's default {dotted}")
    load_model(ns, rest, sets, notes, DEFAULTS["workload.users"], timed)
    if ns.log_level:
        notes.append(f"--log-level {ns.log_level}: there are no log levels here; the summary is printed, "
                     f"--quiet prints nothing but errors")
    argv_out = list(rest)
    for dotted, value in sets.items():
        argv_out += ["--set", f"{dotted}={json.dumps(value)}"]  # JSON is YAML: --set parses it back
    if ns.output and not value_of(rest, "--run-id"):  # --output reads the run's folder: name it
        argv_out += ["--run-id", f"{Path(ns.output).stem or 'mlperf'}-{time.strftime('%Y%m%dT%H%M%S')}"]
    typed = {"Generation Mode": ns.generation_mode or "realistic", "Multi-turn": not ns.disable_multi_turn,
             "Prefix Caching": not ns.disable_prefix_caching, "Max Concurrent Allocs": ns.max_concurrent_allocs or 0,
             "Precondition Size (GiB)": ns.precondition_size_gb or 0}  # the reference's defaults where not typed
    return Translation(argv_out, notes, ns.output, ns.performance_profile or "latency", sets.origin,
                       ns.xlsx_output, made, typed)


def blame(e: UserError, t: Translation, typed: set[str]) -> UserError:
    """An error a later check raised naming our flag for a value the reference's flag, config key or default gave
    (--storage-capacity-gb 2 refused as "--nvme-gb 2 holds no ..."): what set it named first, so that the user
    changes what they typed (our flag beside theirs is refused as setting the key twice)."""
    text, named = str(e), []
    for dotted, origin in t.origins.items():
        flag = our_flag(dotted)
        if flag and flag not in typed and not text.startswith(origin) and re.search(re.escape(flag) + r"(?![\w-])",
                                                                                      text):
            named.append(f"{origin} sets {flag} here")
    return UserError(f"{'; '.join(named)}: {text}") if named else e


def _refuse_twice(sets: Sets, rest: list[str]) -> None:
    """A reference flag and our own flag (or --set) for the same setting: neither may win silently."""
    for dotted, origin in sets.origin.items():
        ours = our_flag(dotted)
        typed = [a for a in rest if ours and (a == ours or a.startswith(ours + "="))] or \
                [f"--set {a.split('=')[0]}" for a in rest if a.split("=")[0] == dotted]
        if typed:
            raise UserError(f"{origin} and {typed[0]} both set {dotted}; give one of them.")


_OUR_FLAGS = {"model.name": {"--model"}, "workload.users": {"--users"}, "workload.generation_ms_per_token": set(),
              "tiers.cpu_mem_gb": {"--cpu-mem-gb"}, "run.warmup_s": {"--warmup"}}


def _load(ns, sets: dict, notes: list[str]) -> None:
    if ns.num_users is not None:
        sets.put("workload.users", ns.num_users, "--num-users")
    if ns.generation_mode is not None:
        sets.put("workload.generation_ms_per_token", sets.timing[ns.generation_mode], "--generation-mode")
    if ns.disable_multi_turn:
        sets.put("workload.max_turns", 1, "--disable-multi-turn")
    if ns.disable_prefix_caching:
        sets.put("workload.num_system_prompts", 0, "--disable-prefix-caching")
    if ns.enable_rag:
        sets.put("rag.enabled", True, "--enable-rag")
    if ns.rag_num_docs is not None:
        sets.put("rag.num_documents", ns.rag_num_docs, "--rag-num-docs")
    if ns.enable_autoscaling:
        sets.put("autoscale.mode", ns.autoscaler_mode or "qos", "--enable-autoscaling")
        notes.append("--enable-autoscaling: the autoscaler really activates and parks users, in steps of "
                     "autoscale.step_s seconds (the reference samples every 10 s and never applies its count)")
    if ns.max_concurrent_allocs:
        sets.put("schedule.workers", ns.max_concurrent_allocs, "--max-concurrent-allocs")
        notes.append(f"--max-concurrent-allocs {ns.max_concurrent_allocs}: here {ns.max_concurrent_allocs} worker "
                     f"threads issue all block I/O (the reference bounds only allocation and writes)")
    if ns.request_rate:
        sets.put("schedule.arrival", "poisson", "--request-rate")
        sets.put("schedule.request_rate", ns.request_rate, "--request-rate")
        notes.append(f"--request-rate {ns.request_rate:g}: Poisson arrivals at that mean rate (the reference sleeps "
                     f"1/rate between ShareGPT requests)")
    if ns.enable_latency_tracing:
        sets.put("run.device_latency", "auto", "--enable-latency-tracing")
        notes.append("--enable-latency-tracing: the storage disk's latency per block request is measured with "
                     "bpftrace on the block layer's tracepoints (telemetry.device_latency; the *_device_* fields of "
                     "--output); the reference's whole-stack bpftrace histograms are not drawn")
    if ns.target_saturation is not None:
        notes.append(f"--target-saturation {ns.target_saturation:g}: accepted, not used: the QoS autoscaler here "
                     f"searches the largest user count whose SLA targets hold (qos.<class>.*), not a saturation "
                     f"level")
    if ns.performance_profile:
        notes.append(f"--performance-profile {ns.performance_profile}: no pass/fail here; --output writes the "
                     f"reference's {ns.performance_profile} criteria judged on our figures (storage_health)")


def _tiers(ns, sets: dict, notes: list[str], given: set[str]) -> None:
    gpus = ns.num_gpus or 1
    if ns.num_gpus is not None and ns.gpu_mem_gb == 0:  # the reference's pool is num_gpus x 0: no GPU tier
        notes.append(f"--num-gpus {ns.num_gpus}: no GPU tier with --gpu-mem-gb 0 (the reference's pool is "
                     f"{ns.num_gpus} x 0 GiB), so there is nothing to spread")
    elif ns.num_gpus is not None:
        sets.put("tiers.gpus", ns.num_gpus, "--num-gpus")
    if ns.gpu_mem_gb is not None:  # the reference's budget is per GPU; ours is over all of them
        if ns.gpu_mem_gb == 0:
            sets.put("tiers.gpu", "off", "--gpu-mem-gb")
        else:
            sets.put("tiers.gpu_mem_gb", ns.gpu_mem_gb * gpus, "--gpu-mem-gb")
    if ns.tensor_parallel is not None:
        sets.put("model.tp", ns.tensor_parallel, "--tensor-parallel")
    if ns.storage_capacity_gb:
        sets.put("tiers.nvme_gb", ns.storage_capacity_gb, "--storage-capacity-gb")
    if ns.precondition_size_gb:
        cap = ns.storage_capacity_gb
        passes = max(1, math.ceil(ns.precondition_size_gb / cap)) if cap else 2
        if "--precondition" not in given:  # with it (its DESIGN.md's form) the pass-through flag turns it on
            sets.put("tiers.precondition", True, "--precondition-size-gb")
        sets.put("tiers.precondition_passes", passes, "--precondition-size-gb")
        notes.append(f"--precondition-size-gb {ns.precondition_size_gb:g}: {passes} pass(es) over the storage tier"
                     + ("" if cap else " (its size is chosen at start: the reference's default of 2 x capacity)"))
    if ns.io_trace_log:
        sets.put("run.io_trace", ns.io_trace_log, "--io-trace-log")
        sets.put("run.io_trace_schema", "mlperf", "--io-trace-log")
        notes.append("--io-trace-log: every object operation is logged in the reference's columns (Timestamp, "
                     "Operation, Object_Size_Bytes, Tier, Key, Phase) as measured on the real tiers (the reference "
                     "replaces every tier by a null backend; add --null-io for that)")


def _traffic(ns, sets: dict, notes: list[str]) -> None:
    if ns.dataset_path:  # ShareGPT wins over the burst trace, as in the reference
        sets.put("trace.path", ns.dataset_path, "--dataset-path")
        sets.put("trace.format", "sharegpt", "--dataset-path")
        sets.put("trace.max_conversations", ns.max_conversations if ns.max_conversations is not None else 500,
                 "--max-conversations" if ns.max_conversations is not None else "--dataset-path")
    elif ns.use_burst_trace:
        sets.put("trace.path", ns.burst_trace_path or "BurstGPT/data/BurstGPT_1.csv", "--use-burst-trace")
        sets.put("trace.format", "burstgpt", "--use-burst-trace")
    elif ns.max_conversations is not None:  # the reference reads it only with a dataset: ignored, as there
        notes.append(f"--max-conversations {ns.max_conversations}: not applied, no --dataset-path (as in the "
                     f"reference)")


def _speedup(ns, rest: list[str], sets: dict, notes: list[str]) -> None:
    """--trace-speedup, which the reference reads for its BurstGPT trace alone (ours refuses it where no timestamp is
    used): 0 is its "no delay", requests back to back, not at their timestamps. Beside our --trace it is ours."""
    value = value_of(rest, "--trace-speedup")
    try:
        if value is None or typed_value("trace.path", rest) or (float(value) != 0 and ns.use_burst_trace
                                                                and not ns.dataset_path):
            return
    except ValueError:
        return  # our parser says what is wrong with it
    _drop(rest, "--trace-speedup")
    if float(value) != 0 or not (ns.dataset_path or ns.use_burst_trace):
        notes.append(f"--trace-speedup {value}: not applied, no BurstGPT trace (it times --use-burst-trace's "
                     f"requests only, as in the reference)")
        return
    sets.put("schedule.arrival", "closed", "--trace-speedup 0")
    sets.put("schedule.think_time_s", [0.0, 0.0], "--trace-speedup 0")
    notes.append("--trace-speedup 0 (the reference's no delay): the trace's requests are issued back to back as "
                 "workers free up (closed loop, no think time), not at their timestamps")


def _drop(rest: list[str], flag: str) -> None:
    """Remove flag and its value from rest (read here: our parser must not see it)."""
    i = next(i for i, a in enumerate(rest) if a == flag or a.startswith(flag + "="))
    del rest[i:i + (2 if rest[i] == flag else 1)]


def _roles(ns, rest: list[str], sets: dict, notes: list[str]) -> None:
    if ns.prefill_only and ns.decode_only:
        raise UserError("--prefill-only and --decode-only exclude each other (as in the reference); keep one.")
    handoff = value_of(rest, "--handoff-dir")
    if ns.prefill_only:
        if handoff:
            sets.put("disagg.role", "prefill", "--prefill-only")
        else:
            sets.put("workload.decode_writes", False, "--prefill-only")
            notes.append("--prefill-only: requests write their prompt blocks and no decode blocks; with "
                         "--handoff-dir DIR this node also publishes them for a --decode-only node")
    if ns.decode_only:
        if not handoff:
            raise UserError("--decode-only: a decode node here reads the blocks a prefill node published (the "
                            "reference reads entries it wrote itself before the clock); run a --prefill-only "
                            "node with --handoff-dir DIR and give this one the same --handoff-dir.")
        sets.put("disagg.role", "decode", "--decode-only")


def _config(rest: list[str], sets: Sets, notes: list[str]) -> None:
    """A --config file of the reference's: read here (our own defaults stay the base), mapped onto our keys."""
    path = value_of(rest, "--config")
    if not path:
        return
    data = read_config_file(Path(path))
    if not is_reference_config(data):
        return
    _drop(rest, "--config")
    apply_config(path, data, value_of(rest, "--model") or DEFAULTS["model.name"], sets, notes)
