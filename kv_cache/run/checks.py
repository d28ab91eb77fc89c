"""The checks that refuse contradictory options before anything is built: a flag that would do nothing in this
mode, an engine or medium not known, traffic its arrival cannot drive (part of the composition root)."""

from __future__ import annotations

import os
import time

from kv_cache.config import Settings, flag_name, iter_keys
from kv_cache.config.keys import DAY_S
from kv_cache.config.load import iter_media_keys
from kv_cache.errors import UserError
from kv_cache.recorder.iotrace import fio_job_path
from kv_cache.run.handoff import handoff_target
from kv_cache.run.traffic import makes_users
from kv_cache.safefiles import refuse_link
from kv_cache.tiers.fsinfo import FILES, refuse_system_dir
from kv_cache.tiers.remote import medium_of
from kv_cache.tiers.remote_shared import check_name

# Settings that act only in some modes: (keys or "section." prefixes, is the mode on?, what turns it on). A key
# given (changed from its default, and not 0 / off, which ask for nothing) while its mode is off would do nothing:
# the run says which flag and stops. The storage keys under --null-io are the exception: they are said in one
# line and ignored, as fio's null engine ignores its directory, so that a real run's command line measures the
# generator alone with --null-io added.
# the local disk tier's own keys: without it (--nvme off) they do nothing; under --null-io they are ignored
DISK_KEYS = ("tiers.io_engine", "tiers.nvme_layout", "tiers.slab_file_gb", "tiers.io_unit", "tiers.layers_per_io",
             "tiers.allow_tmpfs", "tiers.cache_dir", "tiers.precondition", "tiers.shared_storage", "tiers.gds")
ONLY_WHEN = (
    (("trace.", "schedule.think_time_s"), lambda s, mpi: bool(s.trace.path), "a replayed trace (--trace FILE)"),
    (("rag.",), lambda s, mpi: s.rag.enabled, "--rag"),
    (("semantic.",), lambda s, mpi: s.semantic.enabled, "--semantic"),
    (("autoscale.",), lambda s, mpi: s.autoscale.mode != "off", "--autoscale qos or capacity"),
    (("disagg.wait_s", "disagg.handoff_gb", "disagg.peer_timeout_s", "disagg.handoff_memory"),
     lambda s, mpi: s.disagg.role != "both",
     "--role prefill or decode"),
    (("tiers.precondition_passes", "tiers.precondition_steady"), lambda s, mpi: s.tiers.precondition,
     "--precondition"),
    (("schedule.max_inflight",), lambda s, mpi: s.schedule.request_io == "batched" and s.model.block_tokens > 0,
     "a request's blocks moved in batches (--request-io batched, --block-tokens > 0)"),
    (("tiers.layers_per_io",), lambda s, mpi: s.tiers.io_unit == "layer", "--io-unit layer"),
    (("tiers.slab_file_gb",), lambda s, mpi: s.tiers.nvme_layout == "slab", "--nvme-layout slab"),
    (("tiers.gpu_sim_gbps",), lambda s, mpi: s.tiers.gpu == "simulated", "--gpu simulated"),
    (("tiers.gpu_copy",), lambda s, mpi: s.tiers.gpu in ("auto", "real"), "a real GPU tier (--gpu auto or real)"),
    (("tiers.gpu_kernel_path",), lambda s, mpi: s.tiers.gpu in ("auto", "real") and s.tiers.gpu_copy == "kernel"
     and s.tiers.gpu_layout != "contiguous", "the paged layout's kernel (--gpu-copy kernel, a real GPU tier)"),
    (("tiers.gpu_mem_gb", "tiers.gpus"), lambda s, mpi: s.tiers.gpu != "off",
     "a GPU tier (--gpu auto, real or simulated)"),
    (("tiers.shared_storage",), lambda s, mpi: mpi, "several MPI ranks (mpirun, or --processes N)"),
    (("run.steady_window_s",), lambda s, mpi: s.run.steady_tolerance > 0, "--steady-state FRACTION"),
    (("tiers.remote_gb", "tiers.remote_namespace"), lambda s, mpi: bool(s.tiers.remote_url), "--remote-url URL"),
    ((*DISK_KEYS, "tiers.nvme_gb"), lambda s, mpi: s.tiers.nvme == "on" or s.tiers.null_io,
     "the NVMe tier (--nvme on)"),
    ((*DISK_KEYS, "run.keep_data", "tiers.remote_namespace"), lambda s, mpi: not s.tiers.null_io, None),
)
NULL_IO = "{flag} has no effect with --null-io (no byte moves, no file is made): ignored"
ENABLERS = {"trace.path", "rag.enabled", "semantic.enabled", "autoscale.mode", "disagg.role", "disagg.handoff_dir",
            "disagg.handoff"}


def _given(s: Settings, media) -> list[tuple[str, str]]:
    """(dotted key, flag) of every flag-level key changed from its default to something that asks for more than
    0 / off / nothing (media: the registry's, whose sections hold the media's keys)."""
    out = []
    for dotted, f, _ in iter_keys(Settings):
        if dotted.count(".") != 1 or dotted in ENABLERS:  # models / profiles: tables, not flags
            continue
        section, leaf = dotted.split(".")
        value = getattr(getattr(s, section), leaf)
        if value != f.default and value not in (0, "", False, "off"):
            out.append((dotted, flag_name(dotted, f)))
    for dotted, f, _ in iter_media_keys(media.sections()):
        _, medium, leaf = dotted.split(".")
        if medium in s.media and getattr(s.media[medium], leaf) != f.default:
            out.append((dotted, flag_name(dotted, f)))
    return out


def _media_rules(s: Settings, media) -> list:
    """A medium's own keys act only when the stack has that medium: --remote-url names it by its scheme."""
    chosen = media.remote_kind(s.tiers.remote_url) if s.tiers.remote_url else None
    return [((f"media.{name}.",), lambda s, mpi, name=name: chosen is not None and chosen.name == name,
             f"a --remote-url the {name} medium serves ({', '.join(kind.schemes) or name}://)")
            for name, kind in media.by_name().items() if name in s.media]


def _without_effect(s: Settings, mpi: bool, media) -> list[str]:
    """Refuse a flag that would do nothing here; the lines for those that are ignored (--null-io's)."""
    given, ignored = _given(s, media), []
    for keys, on, what in (*ONLY_WHEN, *_media_rules(s, media)):
        if on(s, mpi):
            continue
        for dotted, flag in given:
            if dotted in keys or any(k.endswith(".") and dotted.startswith(k) for k in keys):
                if what is None:
                    ignored.append(NULL_IO.format(flag=flag))
                    continue
                raise _without(flag, what)
    return ignored


def _without(flag: str, what: str) -> UserError:
    return UserError(f"{flag} acts only with {what}, which this run does not have; add it or drop {flag}.")


def _whole_objects_in_parts(s: Settings) -> None:
    """Objects larger than --io-chunk-mb move as parts (cache/parts.py), which a rank adopting another's object
    (--shared-storage) or a handoff (one object per published block) do not read: one sentence."""
    from kv_cache.run.geometry import geometry

    if s.model.block_tokens or not (s.tiers.shared_storage or s.disagg.role != "both"):
        return
    geo = geometry(s)
    if geo.max_object_bytes > geo.part_bytes:
        what = "--shared-storage" if s.tiers.shared_storage else f"--role {s.disagg.role}"
        raise UserError(f"{what} moves whole objects, and this run's largest ({geo.max_object_bytes / 2**20:.0f} MiB, "
                        f"--block-tokens 0) is larger than --io-chunk-mb {s.tiers.io_chunk_mb}; raise --io-chunk-mb "
                        f"to {-(-geo.max_object_bytes // 2**24) * 16} or give --block-tokens N.")


def _registered(s: Settings, reg) -> None:
    """--io-engine names an engine found that this host can run, --policy a policy of the table (one sentence
    each way)."""
    if s.cache.policy not in reg.policies:
        raise UserError(f"--policy {s.cache.policy}: no such eviction policy; use one of "
                        f"{', '.join(reg.policies)}.")
    table = reg.engines
    if s.tiers.io_engine not in table:
        raise UserError(f"--io-engine {s.tiers.io_engine}: no such engine; use one of {', '.join(sorted(table))}.")
    if s.tiers.nvme == "on" and not s.tiers.null_io and (why := table[s.tiers.io_engine].unavailable()):
        raise UserError(f"--io-engine {s.tiers.io_engine}: {why}; use --io-engine direct.")


def _start_at(at: float, trials: int) -> None:
    """--start-at already past, or more than a day ahead (a time in ms, or a typo), or with trials after the first
    (each would wait for a time gone by): one sentence before set-up."""
    if not at:
        return
    if trials > 1:
        raise UserError(f"--start-at starts one run's window, and --trials {trials} starts each trial as the one "
                        f"before ends; drop one of them.")
    ahead = at - time.time()
    if ahead <= 0 or ahead > DAY_S:
        when = "is already past" if ahead <= 0 else "is more than a day ahead"
        raise UserError(f"--start-at {at:.3f} {when} (now is {time.time():.3f}); give a time in seconds since the "
                        f"epoch a little after this run's set-up, e.g. $(( $(date +%s) + 30 )).")


def check_options(s: Settings, mpi: bool, reg) -> list[str]:
    """One clear sentence per contradiction between options (a flag without effect here is one); returns the
    lines saying which flags are ignored (said before the run and kept in its notes). reg: the registry."""
    ignored = _without_effect(s, mpi, reg.media)
    if s.tiers.remote_url:
        medium_of(reg.media, s.tiers.remote_url)  # an unknown scheme: one sentence
        if s.tiers.remote_namespace:
            check_name(s.tiers.remote_namespace)
    if s.tiers.remote_url and s.tiers.shared_storage:
        raise UserError("--shared-storage shares the NVMe tier's directory between ranks; a remote tier gives each "
                        "rank a namespace of its own unless they name one to share (--remote-namespace NAME): "
                        "drop --shared-storage.")
    _whole_objects_in_parts(s)
    _registered(s, reg)
    if not s.trace.shuffle and not s.trace.path:  # off is "nothing" to the rules above, but asks for file order
        raise _without("--no-shuffle", "a replayed trace (--trace FILE)")
    _start_at(s.run.start_at, s.run.trials)
    if s.run.io_trace:
        trace = os.path.abspath(s.run.io_trace)
        refuse_system_dir(os.path.dirname(trace), "--io-trace", FILES)
        refuse_link(trace, "--io-trace")
        refuse_link(fio_job_path(trace), "--io-trace's fio job")
        if not os.path.isdir(os.path.dirname(trace)):  # said before anything is built, not after
            raise UserError(f"--io-trace {s.run.io_trace}: its folder {os.path.dirname(trace)} does not exist; "
                            f"create it or name a file in an existing one.")
        if os.path.exists(trace) and not mpi and s.run.trials == 1:  # else <name>.trial<k>.rank<r>: the writer refuses
            raise UserError(f"--io-trace {s.run.io_trace} exists; pass a new file name (a trace is never written "
                            f"over an existing file).")
    a, d = s.autoscale, s.disagg
    if a.mode != "off":
        if s.run.max_requests:
            raise UserError("--autoscale searches over time, step by step; drop --max-requests (--duration "
                            "bounds the search).")
        if a.start_users > s.workload.users:
            raise UserError(f"--autoscale-start-users {a.start_users} exceeds the pool of --users "
                            f"{s.workload.users}; the pool is the most users the autoscaler may activate.")
        if mpi:
            raise UserError("--autoscale runs in one process: it decides from its own measurements; run it "
                            "without mpirun.")
        if d.role == "decode":
            raise UserError("--autoscale cannot drive --role decode: a decode node serves what prefill nodes "
                            "publish; autoscale the prefill node instead.")
    kind, _ = handoff_target(s, reg.transports)
    if d.role != "both" and not kind:
        raise UserError(f"--role {d.role} needs --handoff-dir DIR, the directory prefill and decode nodes share "
                        f"(blocks and manifest), or --handoff nixl://HOST:PORT (NIXL READs from the prefill node).")
    if d.role == "both" and kind:
        raise UserError("--handoff / --handoff-dir are for disaggregated nodes; add --role prefill or --role decode.")
    if d.role != "both" and mpi:
        raise UserError(f"--role {d.role} runs one process per role (start the prefill and the decode node "
                        f"separately); run it without mpirun.")
    if d.role == "decode" and (s.trace.path or s.rag.enabled):
        raise UserError("--role decode replays what the prefill node publishes; give --trace / --rag to the "
                        "prefill node instead.")
    if d.role != "both" and s.tiers.null_io:
        raise UserError(f"--role {d.role} hands real blocks over through --handoff-dir; drop --null-io.")
    if d.role != "both" and s.model.block_tokens == 0:
        raise UserError("--role prefill/decode hand over KV blocks; use --block-tokens > 0.")
    if s.run.capacity_curve and (s.model.block_tokens == 0 or mpi):
        raise UserError("--capacity-curve follows one process's blocks through its cache: use --block-tokens > 0 "
                        "(whole-request objects are no stack of slots) and one process; for several, run each with "
                        "it and merge them with `kv_cache_benchmark.py capacity RUN RUN ...`.")
    if s.semantic.enabled and s.model.block_tokens == 0:
        raise UserError("--semantic aligns donors block by block; use --block-tokens > 0 (not whole-request mode).")
    if s.semantic.enabled and d.role == "decode":
        raise UserError("--role decode replays what the prefill node publishes; give --semantic to the prefill "
                        "node instead.")
    if s.run.steady_tolerance and s.run.steady_window_s > s.run.duration_s:
        raise UserError(f"--steady-window-s {s.run.steady_window_s} is longer than --duration "
                        f"{s.run.duration_s:g}; steady state could never be detected.")
    return ignored


def check_traffic(s: Settings, arrival: str, source: str) -> list[str]:
    """Refuse a traffic flag this run's arrival (closed, poisson, trace, sequence, handoff) would not use; say --users
    where its source (synthetic, semantic, a trace's format, handoff) makes no user: the lines to say."""
    unset = Settings()  # what each setting is when nobody gives it
    ignored = []
    if s.workload.users != unset.workload.users and not makes_users(source, arrival):  # a config's, often: said
        came = {"trace": "at the trace's times", "poisson": "at --request-rate", "sequence": "one after another, in "
                "the trace's order", "handoff": "from the prefill node's manifest"}.get(arrival, f"by {arrival}")
        instead = "the prefill node's users ask" if arrival == "handoff" else \
            "--arrival closed replays the trace's conversations as users"
        ignored.append(f"--users {s.workload.users} makes no user here: requests come {came} ({instead}): ignored")
    if s.trace.speedup != unset.trace.speedup and arrival != "trace":  # no timestamp it would scale is used
        raise UserError(f"--trace-speedup scales the timestamps of trace arrivals (--arrival trace, a trace that "
                        f"has them), and this run's arrival is {arrival}; drop --trace-speedup.")
    if s.schedule.think_time_s != unset.schedule.think_time_s and arrival != "closed":  # only a closed-loop user thinks
        raise UserError(f"--think-time-s is the pause of closed-loop users between an answer and the next question, "
                        f"and this run's arrival is {arrival} (no user waits); drop --think-time-s or use --arrival "
                        f"closed.")
    if s.schedule.request_rate and arrival != "poisson":
        raise UserError(f"--request-rate paces --arrival poisson only, and this run's arrival is {arrival}; add "
                        f"--arrival poisson or drop --request-rate.")
    if s.autoscale.mode != "off" and arrival != "closed":
        raise UserError(f"--autoscale changes the number of closed-loop users; it cannot drive --arrival "
                        f"{arrival} (requests come at the trace's or the rate's pace). Use --arrival closed.")
    return ignored
