"""One benchmark run, as a pipeline: build -> warm-up -> measure -> write results -> report. Part of the
composition root (run/): with compose.py it builds every stage from the settings and passes them down explicitly."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kv_cache import runlog, signals
from kv_cache.cache.cache import BlockCache
from kv_cache.cache.hashing import chain_root
from kv_cache.cache.parts import Parts
from kv_cache.config import Settings, replace
from kv_cache.errors import UserError
from kv_cache.lifecycle.analysis import Analysis, analyse
from kv_cache.lifecycle.executor import Lifecycle, LifecycleOptions, buffer_bytes
from kv_cache.lifecycle.payload import PayloadPool
from kv_cache.recorder.capacity import AccessLog
from kv_cache.recorder.iotrace import IOTraceWriter
from kv_cache.recorder.merge import merge_ranks
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.results import build_results
from kv_cache.recorder.schema import Results
from kv_cache.recorder.sections import TelemetrySummary
from kv_cache.recorder.telemetry import Telemetry
from kv_cache.recorder.typed import load_section
from kv_cache.report.console import render
from kv_cache.report.live import LiveLine
from kv_cache.run import capacity, outfolder
from kv_cache.run.budget import check_fits, peak_rss_bytes
from kv_cache.run.compose import (
    RunContext,
    agreed_settings_of,
    build_tiers,
    check_dir,
    choose_workers,
    default_workers,
    device_latency_mode,
    fio_of,
    gds_link,
    geometry,
    memory_budget,
    open_gpu,
    pin_host_memory,
    resolved,
    semantic_reuse,
    storage_site,
    worker_ceiling,
    worker_state,
    workers,
)
from kv_cache.run.describe import banner, nothing_measured, run_info, warnings_of
from kv_cache.run.distributed import Dist, launched_by_mpi
from kv_cache.run.handoff import abandon_role, finish_role, open_handoff
from kv_cache.run.leftovers import set_state
from kv_cache.run.roles import autoscaler, check_options, check_traffic, qos_policy
from kv_cache.run.submission import RULES, rule_violations, validate, with_rule_defaults, write_package
from kv_cache.run.traffic import Traffic, build_traffic
from kv_cache.run.trials import conclude
from kv_cache.scheduler.autoscale import Autoscaler
from kv_cache.scheduler.runner import ClosedLoopRunner, OpenLoopRunner
from kv_cache.tiers.base import FAKE_IO, PRECONDITIONS, REMOTE, STORAGE

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130  # interrupted: 128 + the signal (130 for Ctrl-C)
ANALYSIS_LIMIT = 100_000  # requests analysed before the run at most


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"


def _build(s: Settings, run_id: str, payloads: PayloadPool | None, rank: int = 0, join: bool = False,
           probe: bool = True, link=None) -> RunContext:
    """probe: --workers 0 may step the storage tier's concurrency (not under MPI: ranks would probe each other);
    link: the traffic's handoff link (a NIXL decode node's)."""
    if not probe and not s.schedule.workers:
        s = replace(s, "schedule.workers", default_workers())
    geo = geometry(s)
    gpu, gpu_note = open_gpu(s)
    ceiling = worker_ceiling(s, geo, gpu)
    sized = replace(s, "schedule.workers", ceiling)  # buffers, lanes and the budget for the most threads
    budget = memory_budget(sized, geo, gpu)
    check_fits(budget, ceiling, buffer_bytes(geo.io_bytes))
    fill = payloads.fill if payloads else None
    tiers, site = [], None
    try:
        site = None if s.tiers.null_io or s.tiers.nvme == "off" else storage_site(s, run_id, join)
        tiers, notes = build_tiers(sized, geo, site, fill, f"r{rank}", gpu, run_id)
        pin_host_memory(tiers, payloads)
        gds = gds_link(sized, tiers, gpu, geo)
        handoff, handoff_note = open_handoff(s, geo.model.name, geo.slot_bytes, workers(s), link, gpu)
        n, steps, probe_note = choose_workers(s, tiers, geo, ceiling, fill)
    except BaseException:
        for t in tiers:  # registered host memory and device slabs go back, files go
            t.close()
        if site and not join:
            shutil.rmtree(site.data_dir, ignore_errors=True)
        raise
    gds_note = f"GDS path: {gds.mode}" if gds else ""
    notes += [x for x in (gpu_note, gds_note, *(site.warnings if site else []), handoff_note, probe_note) if x]
    return RunContext(geo, site, tiers, notes, budget, n, handoff, probe=steps, gds=gds)


def _close(b: RunContext, remove: bool) -> None:
    abandon_role(None if b.role_done else b.handoff, remove)  # a failed run ends its manifest, leaves no folder
    if b.gds is not None:
        b.gds.close()
    for t in b.tiers:
        t.close(remove=remove)
    if b.site and remove:
        shutil.rmtree(b.site.data_dir, ignore_errors=True)
    elif b.site and os.path.isdir(b.site.data_dir):
        set_state(b.site.data_dir, "kept")  # on purpose (--keep-data): not a killed run's leftover


class Progress:
    """The dispatcher's tick: sample the gauges of the time series (and telemetry), and draw the live line."""

    def __init__(self, s: Settings, recorder: Recorder, cache: BlockCache, b: RunContext, quiet: bool,
                 tele: Telemetry | None):
        self.recorder, self.cache, self.tele = recorder, cache, tele
        self.live = None if quiet else LiveLine(recorder, s.run.warmup_s + s.run.duration_s, b.tiers[-1].name,
                                                refresh=not launched_by_mpi())
        self.slots = [(t.name, t.slot_bytes) for t in b.tiers]

    def __call__(self, runner: ClosedLoopRunner | OpenLoopRunner) -> None:
        levels = runner.levels()
        levels.update({f"{name}_used_bytes": used * size for (name, size), used in zip(self.slots, self.cache.used)})
        now = time.monotonic_ns()
        self.recorder.gauge(levels, now)
        row = self.tele.sample(self.recorder.measure_start_ns is not None) if self.tele is not None else None
        if row:
            self.recorder.gauge(row, now)
        if self.live is not None:
            self.live(runner.outcome.completed, runner.draining)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()


def _prepare(s: Settings, run_id: str, dist: Dist) -> tuple[Traffic, PayloadPool | None, RunContext]:
    """Everything that can refuse the run, agreed on by all ranks before any of them measures."""
    error, b, ignored = None, None, []
    shared = s.tiers.shared_storage and dist.active
    try:
        ignored = check_options(s, dist.active)
        traffic = build_traffic(s, dist.rank, dist.size)  # bad traces are refused before any data is written
        check_traffic(s, traffic.arrival)
        qos_policy(s)  # a bad --qos-mix is refused here, before any data is written
        if not s.tiers.null_io and s.tiers.nvme == "on" and s.tiers.cache_dir:
            check_dir(os.path.abspath(s.tiers.cache_dir))  # a wrong folder is said before the payload pool is made
        payloads = None if s.tiers.null_io else PayloadPool(s.run.seed)
        if not shared:
            b = _build(s, f"{run_id}-r{dist.rank}" if dist.active else run_id, payloads, dist.rank,
                       probe=not dist.active, link=traffic.handoff_link)
        elif dist.rank == 0:  # rank 0 makes the shared namespace; the others join it
            b = _build(s, run_id, payloads, 0, probe=False)
    except UserError as e:
        error = str(e)
    if shared and dist.bcast(error is None and b is not None) and dist.rank and error is None:
        try:
            b = _build(s, run_id, payloads, dist.rank, join=True, probe=False)
        except UserError as e:
            error = str(e)
    try:
        dist.agree(error)
    except BaseException:
        if b is not None:
            _close(b, remove=not s.run.keep_data and not (shared and dist.rank))
        raise
    b.notes[:0] = ignored
    return traffic, payloads, b


def execute(s: Settings, say=print) -> int:
    """Run the benchmark with settings s (N trials); return the exit status (the same on every rank)."""
    dist = Dist.detect()
    if dist.rank:
        say = _silent
    outfolder.check_run_id(s.run.run_id)
    run_id = dist.bcast(s.run.run_id or new_run_id())
    folder = Path(s.run.output_dir) / run_id
    rules = RULES.get(s.run.submission)
    if rules is not None:
        s, applied = with_rule_defaults(s, rules)
        if applied:
            say(f"--submission {rules.name}: {', '.join(applied)} (its rules; a flag of yours chooses otherwise)")
        broken = rule_violations(s.to_dict(), rules)
        if broken:
            raise UserError(f"--submission {rules.name} refuses these settings: " + "; ".join(broken) + ".")
    error = None
    if dist.rank == 0:  # checked and reserved before anything is measured: results are never lost at the end
        try:
            with signals.deferred(quiet=True):  # a signal now must not leave a reserved folder nobody removes
                outfolder.reserve(folder, run_id)
        except UserError as e:
            error = str(e)
    try:
        signals.raise_pending()  # one arrived while the folder was reserved: stop now, the finally removes it
        dist.agree(error)
        if dist.rank == 0:
            runlog.open_log(folder / outfolder.LOG)  # created only if something goes wrong
        return _trials(s, say, dist, run_id, folder, rules)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as e:  # a bug: its traceback into the run's log while the folder is still there
        runlog.internal("internal error", e)
        raise
    finally:
        signals.resume()
        if dist.rank == 0 and error is None:
            with signals.deferred():
                outfolder.abandon(folder)  # removes it only if nothing was written into it (a log is kept)


def _trials(s: Settings, say, dist: Dist, run_id: str, folder: Path, rules) -> int:
    """One run, or N trials of the same schedule with the median and spread of their headline numbers."""
    if s.run.trials == 1:
        return _one_run(s, say, dist, run_id, folder)[0]
    statuses, trials = [], []
    for k in range(1, s.run.trials + 1):
        say(f"== trial {k} of {s.run.trials} (same seed, same schedule)")
        status, merged = _one_run(s, say, dist, f"{run_id}-t{k}", folder / f"trial-{k}", k)
        statuses.append(status)
        trials.append(merged)
        if k == 1 and not s.schedule.workers:  # one set-up: the probe's choice in trial 1, kept for every trial
            s = replace(s, "schedule.workers", dist.bcast(merged.run.workers if merged is not None else 0))
            say(f"  workers: {s.schedule.workers}, chosen in trial 1, kept for every trial")
        if signals.received() is not None:
            break
        signals.resume()
    if dist.rank == 0:
        best = conclude(trials, folder, say)
        if rules is not None:
            cache_dir = best.run.cache_dir or s.run.output_dir
            outfolder.finish(folder)  # the marker and reserve are not part of the package
            manifest = write_package(folder, s.to_dict(), rules, cache_dir)
            failures, _ = validate(folder)
            say(f"Submission package ({rules.name} rules): {manifest}; validate: "
                + ("conforms" if not failures else "; ".join(failures)))
    return dist.bcast(max(statuses))


@dataclass
class Stages:
    """The stages of one run, wired from the settings: recorder, cache, lifecycle, scheduler."""

    recorder: Recorder
    cache: BlockCache
    life: Lifecycle
    analysis: Analysis           # the traffic before the run: lengths and the infinite-cache hit rate
    runner: ClosedLoopRunner | OpenLoopRunner
    progress: Progress
    scaler: Autoscaler | None
    tele: Telemetry | None


def _io_trace_path(s: Settings, dist: Dist, trial: int) -> str:
    """--io-trace's file for this trial and rank: <name>[.trial<k>][.rank<r>][.zst] (none overwrites another)."""
    zst = ".zst" if s.run.io_trace.endswith(".zst") else ""
    return (s.run.io_trace.removesuffix(".zst") + (f".trial{trial}" if trial else "")
            + (f".rank{dist.rank}" if dist.active else "") + zst)


def _stages(s: Settings, b: RunContext, traffic: Traffic, payloads: PayloadPool | None, dist: Dist,
            trial: int) -> Stages:
    recorder = Recorder()
    recorder.accesses = AccessLog() if s.run.capacity_curve else None  # the capacity curve's input
    if s.run.io_trace:
        recorder.io_trace = IOTraceWriter(_io_trace_path(s, dist, trial), time.monotonic_ns(), b.tiers[-1].name,
                                          s.run.io_trace_schema)
    cache = BlockCache(b.tiers, s.cache.policy, s.cache.promote, recorder, b.gds, Parts(b.geo.part_bytes))
    fake = all(FAKE_IO in t.flags for t in b.tiers)
    options = LifecycleOptions(s.model.block_tokens, b.geo.bytes_per_token,
                               chain_root(f"{b.geo.model.name}/{s.model.kv_dtype}/tp{s.model.tp}"), s.run.verify,
                               fake, s.workload.generation_ms_per_token, s.rag.enabled and s.rag.reuse == "chunk",
                               s.workload.decode_writes)
    life = Lifecycle(cache, payloads, recorder, options, handoff=b.handoff, semantic=semantic_reuse(s, recorder))
    limit = min(ANALYSIS_LIMIT, s.run.max_requests or ANALYSIS_LIMIT)  # what the run can issue
    total = traffic.analysis_total if not s.run.max_requests else min(s.run.max_requests,
                                                                        traffic.analysis_total or limit)
    analysis = analyse(traffic.analysis_items, life, limit, total)
    tele = Telemetry(b.site.cache_dir if b.site else None, device_latency=device_latency_mode(s, b)) \
        if s.run.telemetry else None
    progress = Progress(s, recorder, cache, b, s.run.quiet or dist.rank > 0, tele)
    args = (b.workers, life.execute, worker_state(b.tiers, b.geo.io_bytes, fake), recorder, progress,
            dist if dist.active else None)
    scaler = autoscaler(s, traffic.users, recorder)
    pace = s.schedule.admission == "paced" and scaler is None  # the autoscaler sets the users itself
    runner = ClosedLoopRunner(traffic.users, *args, qos=qos_policy(s), controller=scaler, pace=pace) \
        if traffic.users is not None else OpenLoopRunner(traffic.arrivals, *args, qos=qos_policy(s))
    runner.stop_after, runner.drain_s = life.stop_after, s.run.drain_s
    return Stages(recorder, cache, life, analysis, runner, progress, scaler, tele)


def _measure(s: Settings, say, dist: Dist, b: RunContext, traffic: Traffic, st: Stages, run_id: str) -> Results:
    """Precondition, the barrier, warm-up + window, the role's end, then the Results of this process."""
    for line in banner(s, b, traffic, st.analysis, dist):
        say(line)
    precondition = _precondition(s, b, say) if s.tiers.precondition else None
    dist.barrier()  # every rank starts its clock together
    outcome = st.runner.run(s.run.warmup_s, s.run.duration_s, s.run.max_requests)
    st.progress.close()
    role = finish_role(b.handoff, s, say)
    b.role_done = True
    trace = st.recorder.io_trace
    if trace is not None:
        trace.close()
        job = "none (the storage tier is remote: network + server, no fio job replays it)"
        if REMOTE not in b.tiers[-1].flags:
            job = trace.fio_job(b.site.cache_dir if b.site else ".", fio_of(b.site),
                                b.workers, s.run.duration_s, b.tiers[-1].capacity_bytes)
        say(f"  I/O trace: {trace.rows:,} operations in {trace.path}; fio job: {job}")
    results = build_results(st.recorder.snapshot(), run_info(s, b, run_id, outcome, dist), resolved(s, b).to_dict(), {
        "requests": {"issued": outcome.issued, "dropped_at_stop": outcome.dropped_at_stop,
                     "abandoned_at_stop": outcome.abandoned,
                     "users_started": outcome.users_started, "users_paced": outcome.users_paced,
                     "users_waiting_at_stop": outcome.users_waiting,
                     "held_for_previous_turn": outcome.held_for_turn},
        "memory": {"peak_rss_bytes": peak_rss_bytes(),
                   "budget_bytes": b.budget.total_bytes, "budget": b.budget.to_dict()},
        "occupancy": st.cache.occupancy(),
        "shared_storage": {"enabled": s.tiers.shared_storage, "adopted_blocks": st.cache.adopted},
        "precondition": precondition,
        "autoscale": st.scaler.to_dict() if st.scaler is not None else None,
        "role": role,
        "workload": {"source": traffic.source, "arrival": traffic.arrival, "notes": traffic.notes,
                     "trace": traffic.trace.log.to_dict() if traffic.trace else None,
                     "tokenizer": traffic.trace.tokenizer if traffic.trace else None, **st.analysis}})
    if st.tele is not None:  # the block layer of the cache directory's disk beside the disk tier's own bytes
        disk = next((t.name for t in reversed(b.tiers) if STORAGE in t.flags and REMOTE not in t.flags), None)
        moved = results.bytes.get(disk) if disk else None
        results.telemetry = load_section(TelemetrySummary, st.tele.summary(
            None if moved is None else {"read": moved.read, "write": moved.write}), "telemetry")
        st.tele.close()
    return results


def _one_run(s: Settings, say, dist: Dist, run_id: str, report_dir: Path, trial: int = 0) -> tuple[int, Results | None]:
    """One measured run (trial: its number when there are several) into report_dir; (exit status, merged results
    on rank 0)."""
    s, agreed = agreed_settings_of(s, dist)
    traffic, payloads, b = _prepare(s, run_id, dist)
    b.notes[:0] = agreed
    try:
        st = _stages(s, b, traffic, payloads, dist, trial)
        results = _measure(s, say, dist, b, traffic, st, run_id)
        capacity.attach(results, st.recorder, b.tiers, report_dir, s.cache.policy)
    finally:  # a shared namespace is removed by rank 0 alone, once every rank is done with it
        shared = s.tiers.shared_storage and dist.active
        with signals.deferred():  # a signal now must not leave the data directory half removed
            _close(b, remove=not s.run.keep_data and not shared)
    status = _status_of(results)
    gathered = dist.gather(results)
    if shared and dist.rank == 0 and b.site and not s.run.keep_data:
        shutil.rmtree(b.site.data_dir, ignore_errors=True)
    merged = None
    if dist.rank == 0:
        merged = results if not dist.active else merge_ranks(gathered)
        merged.warnings = warnings_of(merged)
        extra = {f"rank-{r.run.rank}.json": r for r in gathered} if dist.active else {}
        written, failed = outfolder.write_results(merged, report_dir, extra)
        say(render(merged, str(written / "results.json")))
        status = max(status, *(_status_of(r) for r in gathered), EXIT_FAILED if failed else EXIT_OK)
        outfolder.tell_faults(merged, written)
    return dist.bcast(status), merged


def _precondition(s: Settings, b: RunContext, say) -> dict | None:
    """Write the NVMe tier's space before the clock starts; nothing here enters a statistic."""
    bottom = b.tiers[-1]
    if PRECONDITIONS not in bottom.flags:
        say(f"  precondition: skipped (the {bottom.name} tier cannot be preconditioned: {bottom.description})")
        return None
    say(f"  precondition: writing {bottom.capacity_bytes / 2**30:.2f} GiB x {s.tiers.precondition_passes} passes"
        + (f", until 3 passes agree within {s.tiers.precondition_steady:.0%}" if s.tiers.precondition_steady else ""))

    def on_pass(k: int, gbps: float, nbytes: int) -> None:
        say(f"    pass {k}: {nbytes / 2**30:.2f} GiB at {gbps:.2f} GB/s")
    out = bottom.precondition(s.tiers.precondition_passes, s.tiers.precondition_steady, on_pass)
    if out["steady"] is False:
        say("    no steady state within 10 passes (reported in results.json under precondition)")
    return out


def _silent(*_args, **_kw) -> None:
    """Ranks other than 0 print nothing; rank 0 speaks for the run."""


def _status_of(results: Results) -> int:
    if results.run.stopped_reason == "interrupted" or signals.received() is not None:
        # a signal during the drain or while the results were written: they are complete and kept, and the
        # caller (a scheduler, timeout) still learns that the run was signalled
        return signals.exit_status(EXIT_INTERRUPTED)
    failed = results.run.fault or results.verification.failures or nothing_measured(results)
    return EXIT_FAILED if failed else EXIT_OK
