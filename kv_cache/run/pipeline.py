"""One benchmark run, as a pipeline: build -> warm-up -> measure -> write results -> report. Part of the
composition root (run/): with prepare.py it builds every stage from the settings and passes them down explicitly."""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kv_cache import counters as C
from kv_cache import runlog, signals
from kv_cache.cache.cache import BlockCache
from kv_cache.cache.hashing import chain_root
from kv_cache.cache.parts import Parts
from kv_cache.config import Settings, replace
from kv_cache.errors import UserError
from kv_cache.lifecycle.analysis import Analysis, analyse
from kv_cache.lifecycle.executor import Lifecycle, LifecycleOptions
from kv_cache.recorder.access_log import AccessLog
from kv_cache.recorder.iotrace import IOTraceWriter, marked_trace_path
from kv_cache.recorder.merge import merge_ranks
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.results import RunFacts, build_results
from kv_cache.recorder.results_schema import Results
from kv_cache.recorder.telemetry import Telemetry
from kv_cache.report.console import render
from kv_cache.run import capacity_curve, outfolder
from kv_cache.run.budget import peak_rss_bytes
from kv_cache.run.describe import banner, nothing_measured, run_info, running_line, warnings_of
from kv_cache.run.distributed import Dist
from kv_cache.run.geometry import chain_id
from kv_cache.run.handoff import clock_started, finish_role, wait_for_decode
from kv_cache.run.prepare import Prepared, RunSpec, close, prepare
from kv_cache.run.progress import Progress
from kv_cache.run.serving import autoscaler, qos_policy, semantic_reuse
from kv_cache.run.site import fio_of
from kv_cache.run.sizing import batch_depth, demotion_depth, recorded_tiers, window_seconds
from kv_cache.run.stack import RunContext, agreed_settings_of, device_latency_mode, resolved, worker_state
from kv_cache.run.submission import RULES, rule_violations, validate, with_rule_defaults, write_package
from kv_cache.run.trials import conclude
from kv_cache.scheduler.autoscale import Autoscaler
from kv_cache.scheduler.openloop import OpenLoopRunner
from kv_cache.scheduler.runner import ClosedLoopRunner, RunOutcome
from kv_cache.tiers.base import FAKE_IO, PINS_HOST, PRECONDITIONS, REMOTE, STORAGE

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130  # interrupted: 128 + the signal (130 for Ctrl-C)
ANALYSIS_LIMIT = 100_000  # requests analysed before the run at most


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"


def execute(s: Settings, reg, say=print) -> int:
    """Run the benchmark with settings s (N trials) and the registry reg (run/registry.py: media, engines,
    policies, transports); return the exit status (the same on every rank)."""
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
        broken = rule_violations(s.to_dict(), rules, reg.engines)
        if broken:
            raise UserError(f"--submission {rules.name} refuses these settings: " + "; ".join(broken) + ".")
    error, made = None, []
    if dist.rank == 0:  # checked and reserved before anything is measured: results are never lost at the end
        try:
            with signals.deferred(quiet=True):  # a signal now must not leave a reserved folder nobody removes
                made = outfolder.reserve(folder, run_id, outfolder.reserve_bytes(
                    window_seconds(s), recorded_tiers(s, reg, s.tiers.gpu != "off"), dist.size))
        except UserError as e:
            error = str(e)
    try:
        signals.raise_pending()  # one arrived while the folder was reserved: stop now, the finally removes it
        dist.agree(error)
        if dist.rank == 0:
            runlog.open_log(folder / outfolder.LOG)  # created only if something goes wrong
        return _trials(RunSpec(s, say, dist, run_id, folder, reg), rules)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as e:  # a bug: its traceback into the run's log while the folder is still there
        runlog.internal("internal error", e)
        raise
    finally:
        signals.resume()
        if dist.rank == 0 and error is None:
            with signals.deferred():
                outfolder.abandon(folder, made)  # removes it only if nothing was written into it (a log is kept)


def _trials(run: RunSpec, rules) -> int:
    """One run, or N trials of the same schedule with the median and spread of their headline numbers."""
    s, say, dist = run.s, run.say, run.dist
    if s.run.trials == 1:
        return _one_run(run)[0]
    statuses, trials = [], []
    for k in range(1, s.run.trials + 1):
        say(f"== trial {k} of {s.run.trials} (same seed, same schedule)")
        status, merged = _one_run(RunSpec(s, say, dist, f"{run.run_id}-t{k}", run.folder / f"trial-{k}", run.reg, k))
        statuses.append(status)
        trials.append(merged)
        # the trial's stages hold one another in cycles (the runner's callbacks, the cache and its tiers): left to
        # the collector, its CPU tier and buffers were still resident when the next trial allocated its own, and
        # the second of --submission smoke's trials peaked at 9.6 GiB against a 5.6 GiB budget
        gc.collect()
        if k == 1 and not s.schedule.workers:  # one set-up: the probe's choice in trial 1, kept for every trial
            s = replace(s, "schedule.workers", dist.bcast(merged.run.workers if merged is not None else 0))
            say(f"  workers: {s.schedule.workers}, chosen in trial 1, kept for every trial")
        if signals.received() is not None:
            break
        signals.resume()
    if dist.rank == 0:
        best = conclude(trials, run.folder, say)
        if rules is not None:
            cache_dir = best.run.cache_dir or s.run.output_dir
            outfolder.finish(run.folder)  # the marker and reserve are not part of the package
            manifest = write_package(run.folder, s.to_dict(), rules, cache_dir)
            failures, _ = validate(run.folder, run.reg.engines)
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


def _io_trace_path(run: RunSpec) -> str:
    """--io-trace's file for this trial and rank: <name>[.trial<k>][.rank<r>][.csv][.zst] (none overwrites another)."""
    return marked_trace_path(run.s.run.io_trace, (f".trial{run.trial}" if run.trial else "")
                             + (f".rank{run.dist.rank}" if run.dist.active else ""))


def _stages(run: RunSpec, p: Prepared) -> Stages:
    s, b, dist, traffic = run.s, p.ctx, run.dist, p.traffic
    recorder = Recorder()
    recorder.accesses = AccessLog(s.run.capacity_log_accesses) if s.run.capacity_curve else None  # the curve's input
    if s.run.io_trace:
        recorder.io_trace = IOTraceWriter(_io_trace_path(run), time.monotonic_ns(), b.tiers[-1].name,
                                          s.run.io_trace_schema)
    policy = run.reg.policies[s.cache.policy]
    cache = BlockCache(b.tiers, policy, s.cache.promote, recorder, b.gds, Parts(b.geo.part_bytes))
    fake = all(FAKE_IO in t.flags for t in b.tiers)
    options = LifecycleOptions(s.model.block_tokens, b.geo.bytes_per_token,
                               chain_root(chain_id(s, b.geo)), s.run.verify,
                               fake, s.workload.generation_ms_per_token, s.rag.enabled and s.rag.reuse == "chunk",
                               s.workload.decode_writes, batch_depth(s, b.geo.io_bytes))
    life = Lifecycle(cache, b.payloads, recorder, options, handoff=b.handoff, semantic=semantic_reuse(s, recorder))
    limit = min(ANALYSIS_LIMIT, s.run.max_requests or ANALYSIS_LIMIT)  # what the run can issue
    total = traffic.analysis_total if not s.run.max_requests else min(s.run.max_requests,
                                                                        traffic.analysis_total or limit)
    if traffic.analysis_total != 0:  # a wait of seconds at small blocks: said, so that it reads as work, not a hang
        run.say("  analysing the traffic before the clock (its lengths, an infinite cache's hit rate)")
    analysis = analyse(traffic.analysis_items, life, limit, total)
    tracer = dist.first_rank_here()  # collective: before any rank may skip telemetry
    mode = device_latency_mode(s, b, None if tracer == dist.rank else tracer)
    tele = Telemetry(b.site.cache_dir if b.site else None, device_latency=mode) if s.run.telemetry else None
    progress = Progress(s, recorder, cache, b, s.run.quiet or dist.rank > 0, tele)
    moves = demotion_depth(s, b.geo.io_bytes, PINS_HOST in b.tiers[0].flags)
    args = (b.workers, life.execute, worker_state(b.tiers, b.geo.io_bytes, fake, batch_depth(s, b.geo.io_bytes),
                                                moves), recorder, progress, dist if dist.active else None)
    scaler = autoscaler(s, traffic.users, recorder)
    pace = s.schedule.admission == "paced" and scaler is None  # the autoscaler sets the users itself
    runner = ClosedLoopRunner(traffic.users, *args, qos=qos_policy(s), controller=scaler, pace=pace) \
        if traffic.users is not None else OpenLoopRunner(traffic.arrivals, *args, qos=qos_policy(s))
    runner.stop_after, runner.drain_s = life.stop_after, s.run.drain_s
    if traffic.users is None:  # an open loop: requests come on their own clock (a closed loop's users wait)
        runner.backlog_limit = int(s.schedule.max_backlog_gb * 2**30)
    return Stages(recorder, cache, life, analysis, runner, progress, scaler, tele)


def _load_phase(run: RunSpec, p: Prepared, st: Stages) -> tuple[RunOutcome, dict | None]:
    """Precondition, the barrier, warm-up + window: how the load phase ended, and the preconditioning's figures."""
    for line in banner(run.s, p.ctx, p.traffic, st.analysis, run.dist):
        run.say(line)
    precondition = _precondition(run.s, p.ctx, run.say) if run.s.tiers.precondition else None
    run.dist.barrier()  # every rank starts its clock together
    _wait_for_start(run.s.run.start_at, run.say)
    wait_for_decode(p.ctx.handoff, run.s.disagg.wait_s, run.say)  # a prefill node starts with its decode node
    running = running_line(run.s, p.ctx, p.traffic, run.dist)

    def started() -> None:
        run.say(running)
        clock_started(p.ctx.handoff)

    outcome = st.runner.run(run.s.run.warmup_s, run.s.run.duration_s, run.s.run.max_requests, started=started)
    st.progress.close()
    return outcome, precondition


def _wait_for_start(at: float, say) -> None:
    """--start-at: hold the clock until that wall-clock time (independent runs starting together: a fleet's
    engines, whose traces' arrivals are offsets from it); a set-up that ended after it is refused."""
    if not at:
        return
    early = at - time.time()
    if early < 0:
        raise UserError(f"--start-at {at:.3f}: this run's set-up ended {-early:.1f} s after it, so it cannot start "
                        f"with the runs it was meant to start with; give a time further ahead.")
    say(f"  waiting {early:.1f} s for --start-at {at:.3f}")
    time.sleep(early)


def _close_io_trace(run: RunSpec, b: RunContext, st: Stages) -> None:
    trace = st.recorder.io_trace
    if trace is None:
        return
    trace.close()
    if trace.failed:  # a side output fails alone: the run measured, and its results are written
        runlog.tell(f"warning: --io-trace {trace.path} stopped ({trace.failed}): it is cut there and no fio job "
                    f"was written; the run's results are complete.")
        return
    job = "none (the storage tier is remote: network + server, no fio job replays it)"
    try:
        if REMOTE not in b.tiers[-1].flags:
            job = trace.fio_job(b.site.cache_dir if b.site else ".", fio_of(b.site, run.reg.engines), b.workers,
                                run.s.run.duration_s, b.tiers[-1].capacity_bytes, getattr(b.tiers[-1], "io_depth", 1))
    except UserError as e:
        job = f"not written ({e})"
    run.say(f"  I/O trace: {trace.rows:,} operations in {trace.path}; fio job: {job}")


def _telemetry(b: RunContext, st: Stages, counters: dict[str, int]) -> dict | None:
    """The block layer of the cache directory's disk beside the disk tier's own bytes (those in the window)."""
    if st.tele is None:
        return None
    disk = next((t.name for t in reversed(b.tiers) if STORAGE in t.flags and REMOTE not in t.flags), None)
    moved = {d: counters.get(C.BYTES(disk, d), 0) for d in ("read", "write")} if disk else None
    try:
        return st.tele.summary(moved)
    finally:
        st.tele.close()


def _results(run: RunSpec, p: Prepared, st: Stages, outcome: RunOutcome, precondition: dict | None,
             role: dict | None) -> Results:
    """This process's Results: the recorder's snapshot and what the run knew beside it."""
    b, traffic = p.ctx, p.traffic
    snap = st.recorder.snapshot(final=True)
    facts = RunFacts(
        workload={"source": traffic.source, "arrival": traffic.arrival, "notes": traffic.notes,
                  "trace": traffic.trace.log.to_dict() if traffic.trace else None,
                  "tokenizer": traffic.trace.tokenizer if traffic.trace else None, **st.analysis},
        memory={"peak_rss_bytes": peak_rss_bytes(), "budget_bytes": b.budget.total_bytes,
                "budget": b.budget.to_dict()},
        occupancy=st.cache.occupancy(), scheduled=RunFacts.scheduled_of(outcome),
        shared_storage=st.cache.shared is not None, adopted_blocks=st.cache.adopted, precondition=precondition,
        autoscale=st.scaler.to_dict() if st.scaler is not None else None, role=role,
        telemetry=_telemetry(b, st, snap.counters))
    info = run_info(run.s, b, run.run_id, outcome, run.dist, traffic)
    return build_results(snap, info, resolved(run.s, b, run.reg).to_dict(), facts)


def _one_run(run: RunSpec) -> tuple[int, Results | None]:
    """One measured run into run.folder; (exit status, merged results on rank 0)."""
    s, agreed = agreed_settings_of(run.s, run.dist, run.reg)
    run = dataclasses.replace(run, s=s)
    dist, say = run.dist, run.say
    p = prepare(run)
    p.ctx.notes[:0] = agreed
    role_open = True  # until the role ends: a run failing before ends the manifest and removes its space
    try:
        st = _stages(run, p)
        outcome, precondition = _load_phase(run, p, st)
        role = finish_role(p.ctx.handoff, s, say)
        role_open = False
        _close_io_trace(run, p.ctx, st)
        results = _results(run, p, st, outcome, precondition, role)
        capacity_curve.attach(results, st.recorder, p.ctx.tiers, run.folder, s.cache.policy, run.reg.policies)
    finally:  # a shared namespace is removed by rank 0 alone, once every rank is done with it
        with signals.deferred():  # a signal now must not leave the data directory half removed
            close(p.ctx, not s.run.keep_data and not run.shared, role_open)
    status = _status_of(results)
    gathered = dist.gather(results)
    if run.shared and dist.rank == 0 and p.ctx.site and not s.run.keep_data:
        shutil.rmtree(p.ctx.site.data_dir, ignore_errors=True)
    merged = None
    if dist.rank == 0:
        merged = results if not dist.active else merge_ranks(gathered)
        merged.warnings = warnings_of(merged)
        extra = {f"rank-{r.run.rank}.json": r for r in gathered} if dist.active else {}
        written, failed = outfolder.write_results(merged, run.folder, extra)
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
