"""How many workers a run has (--workers 0: a rule of fixed facts, within the memory's ceiling) and the memory
budget of a run of that size, checked before anything is allocated (part of the composition root)."""

from __future__ import annotations

import math
import os

import psutil

from kv_cache.buffers import direct_aligned
from kv_cache.config import Settings, replace
from kv_cache.errors import RunFault, UserError
from kv_cache.hostmemory import available_bytes, where_from
from kv_cache.lifecycle.donors import store_bytes
from kv_cache.lifecycle.payload import SEGMENT_BYTES, pool_bytes, pool_copies, stamp_bytes
from kv_cache.lifecycle.sketch import ShingleSketch
from kv_cache.lifecycle.worker import buffer_bytes
from kv_cache.model import GiB
from kv_cache.recorder.verdict import workers_said
from kv_cache.run.budget import (
    ACCESS_LOG_BYTES,
    ACCESS_LOG_FIXED_BYTES,
    BOOKKEEPING_BYTES,
    HEADROOM,
    USER_BYTES,
    MemoryBudget,
    fits,
    timeseries_bytes,
)
from kv_cache.run.geometry import Geometry
from kv_cache.run.handoff import nixl_region_bytes
from kv_cache.sources.synthetic import longest_history_bytes
from kv_cache.sources.trace_io import MEMORY_PER_FILE_BYTE, trace_format
from kv_cache.tiers.base import BATCHES, HOST_SLOTS, PINS_HOST, moves_real_bytes
from kv_cache.tiers.probe import concurrency

AUTO_MAX = 16  # --workers 0 (auto): the most the rule gives, halved until the machine's memory holds them


def default_workers(s: Settings) -> int:
    """--workers 0 (auto): 2 per core, at least 4, at most 16: a fixed fact of the machine, so the same command
    runs the same workers whatever a neighbour does (the probe's bandwidth did not: 4 and 32 on one machine).
    --null-io: one. The null tier has no I/O for a second worker to overlap, and the interpreter runs one thread at
    a time: more workers only queue on the cache's lock, each handing the interpreter over as it waits (the
    Mooncake trace's analysis served 558 requests/s with one worker, 226 with four, on 2 cores)."""
    return 1 if s.tiers.null_io else max(4, min(16, 2 * (os.cpu_count() or 1)))


def workers_rule(s: Settings) -> str:
    """How --workers 0 chose (the banner's note)."""
    return ("one on the null tier, which has no I/O for more to overlap" if s.tiers.null_io else
            f"2 per core of {os.cpu_count() or 1}, at least 4, at most 16")


BATCH_ARENA_BYTES = 160 << 20  # a worker's in-flight blocks at most: llama70b's 80 MiB blocks go 2 at a time (3, at
# 256 MiB, took the README's 4 MPI ranks of 4 workers past a 24 GiB machine's memory), 2 MiB blocks 32 at a time


def batch_depth(s: Settings, io_bytes: int) -> int:
    """The blocks one worker has in flight together: --max-inflight under --request-io batched in block mode,
    within a worker's BATCH_ARENA_BYTES of buffers (at least one); 0: one at a time (serial, or whole-request
    objects)."""
    if s.schedule.request_io != "batched" or not s.model.block_tokens:
        return 0
    return max(1, min(s.schedule.max_inflight, BATCH_ARENA_BYTES // max(io_bytes, 1)))


def demotion_depth(s: Settings, io_bytes: int, gpu_tier: bool) -> int:
    """The blocks a worker's scratch buffer holds (1: one). A batch's demotions out of a tier that holds no host copy
    of a block into a batching tier below it land through it, up to a batch at a time: one read batch into it, then
    one write batch out of it, as an engine offloads through its bounce buffers. Two stacks have such a pair: HBM
    (real, gpu_tier, or simulated) with no CPU tier below it (whose page-locked slots take a D2H batch straight), and
    the NVMe tier over a remote tier. The settings' prediction, before any tier exists (the memory budget needs it),
    of what through_scratch finds in the built stack: tests/unit/test_budget.py holds the two to one answer."""
    if s.tiers.null_io:
        return 1
    hbm = gpu_tier or (s.tiers.gpu == "simulated" and s.tiers.gpu_mem_gb > 0)
    hbm_over_storage = hbm and s.tiers.cpu_mem_gb <= 0 and not s.tiers.gds  # --gds: its own link (gds.py)
    disk_over_remote = s.tiers.nvme == "on" and bool(s.tiers.remote_url)
    return max(1, batch_depth(s, io_bytes)) if hbm_over_storage or disk_over_remote else 1


def through_scratch(tiers: list, gds=None) -> list[tuple[str, str]]:
    """(from, into) of each pair of tiers whose demotions land through the workers' scratch: the upper holds no host
    copy (not the CPU tier's slots) and neither copies straight into the lower's host slots (HBM into the CPU tier),
    nor does the GDS link carry them (gds: the run's, or None), and the lower takes batches."""
    return [(a.name, b.name) for a, b in zip(tiers, tiers[1:])
            if HOST_SLOTS not in a.flags and not (PINS_HOST in a.flags and HOST_SLOTS in b.flags)
            and not (gds is not None and gds.links(a, b)) and BATCHES in b.flags]


def io_shape(s: Settings, tiers: list, n: int, io_bytes: int, gds=None) -> str:
    """The request I/O's shape in one line: batched or serial, how deep, and how each tier takes a batch (gds: the
    run's GDS link, or None)."""
    depth = batch_depth(s, io_bytes)
    if not depth:
        why = ("whole-request objects (--block-tokens 0): one object a request" if not s.model.block_tokens else
               "--request-io serial: the MLPerf reference's way; batched moves a request's blocks together")
        return f"request I/O: serial, one block at a time per worker ({why})"
    paths = "; ".join(f"{t.name}: {t.batch_path()}" for t in tiers)
    gpu = bool(tiers) and PINS_HOST in tiers[0].flags
    moves = demotion_depth(s, io_bytes, gpu)
    if moves > 1:
        scratch = "pinned scratch" if gpu else "scratch"
        paths += "".join(f"; demotions out of {a} land in {b} through each worker's {scratch}, {moves} at a time"
                         for a, b in through_scratch(tiers, gds))
    bound = (f"--max-inflight {s.schedule.max_inflight} bounded by {BATCH_ARENA_BYTES >> 20} MiB of batch buffers "
             f"a worker" if depth < s.schedule.max_inflight else "--max-inflight sets it")
    return (f"request I/O: batched, up to {depth} blocks of a request handed to a tier together per worker ("
            f"{workers_said(n)}: up to {n * depth}; {bound}; how many each medium keeps in flight: its path here, "
            f"measured in the summary's queue depth); {paths}")


def _lent(s: Settings, io_bytes: int) -> int:
    """The payload bytes the workers lend at once: a batch's blocks (one, serial), each an I/O of io_bytes, while
    they are written; none is lent past a pool segment (payload.py: LARGE), nor counted for whole-request objects
    (--block-tokens 0: an object of more than a segment, the reference's usual, is made part by part, not lent)."""
    if io_bytes > SEGMENT_BYTES or not s.model.block_tokens:
        return 0
    return workers(s) * max(1, batch_depth(s, io_bytes)) * io_bytes


def payload_copies(s: Settings, io_bytes: int) -> int:
    """Copies of the payload pool for the payloads the workers lend at once (payload.pool_copies)."""
    return pool_copies(_lent(s, io_bytes))


def pool_note(s: Settings, io_bytes: int) -> str:
    """The banner's line on a payload pool of more than one copy: why the run holds that memory."""
    copies, one = payload_copies(s, io_bytes), pool_bytes() >> 20
    if copies == 1:
        return ""
    return (f"payload pool: {copies * one:,} MiB, {copies} copies of {one} MiB, for the {_lent(s, io_bytes) >> 20:,} "
            f"MiB of new blocks the workers write at once: each is lent from it where its pages are free, not copied")


def workers(s: Settings) -> int:
    return s.schedule.workers or default_workers(s)


def worker_ceiling(s: Settings, geo: Geometry, reg, gpu=None) -> int:
    """--workers 0: the most threads the run may have, halved from AUTO_MAX until their staging fits in the
    machine's memory (its total, not what is free now: a fixed fact), down to one (whole-request objects of GiBs,
    the MLPerf reference's shape, fit few at a time). The run's memory check against what is free follows."""
    if s.schedule.workers:
        return s.schedule.workers
    total, n = psutil.virtual_memory().total, AUTO_MAX
    while n > 1 and not fits(memory_budget(replace(s, "schedule.workers", n), geo, reg, gpu), total):
        n //= 2
    return n


def probe_workers(s: Settings, tiers: list, geo: Geometry, n: int, ceiling: int,
                  fill) -> tuple[list, str]:
    """(the probe's steps, the line that says the workers' rule) for n workers. --workers 0 runs default_workers(s)
    within the memory's ceiling; on a real storage tier its bandwidth at 1, 2, 4, ... up to n threads is probed
    first, as information (said beside the choice; the run's most-writes estimate reads it)."""
    if s.schedule.workers:
        return [], ""
    rule = (f"workers: {n} (auto: {workers_rule(s)}"
            + (f", as memory allows at most {ceiling}" if ceiling < default_workers(s) else "")
            + "; --workers N pins it)")
    bottom = tiers[-1]
    if not moves_real_bytes(bottom):
        return [], rule
    try:
        saturated, steps = concurrency(bottom, geo.io_bytes, n, fill=fill)
    except RunFault as e:  # before the clock: a sentence, not a traceback
        raise UserError(f"--workers 0 (auto) probes the {bottom.name} tier before the run, and it failed: {e} "
                        f"Fix the device, or pass --workers N to skip the probe.") from None
    seen = " / ".join(f"{g:.2f}" for _, g in steps)
    counts = " / ".join(str(k) for k, _ in steps)
    return steps, (f"{rule}; the {bottom.name} tier moved {seen} GB/s with {counts} threads (each writing and "
                   f"reading one {geo.io_bytes / 2**20:.1f} MiB object, 0.5 s a step), within 10 % of its best "
                   f"from {saturated}")


def memory_budget(s: Settings, geo: Geometry, reg, gpu=None, ranks: int = 1, rank: int = 0) -> MemoryBudget:
    """reg: the registry (the most blocks its media may hold); gpu: the GPU backend when a real GPU tier will be
    built (its lanes' pinned staging is host memory); ranks: the processes the users are shared among (MPI), whose
    results rank 0 merges at the end."""
    fake = s.tiers.null_io
    cpu = 0 if fake else int(s.tiers.cpu_mem_gb * GiB) // geo.slot_bytes * geo.slot_bytes
    each = direct_aligned(geo.io_bytes)
    arena = batch_depth(s, geo.io_bytes) * each  # the in-flight blocks' buffers
    scratch = max(buffer_bytes(geo.io_bytes), demotion_depth(s, geo.io_bytes, gpu is not None) * each)
    staging = 0 if fake else workers(s) * (buffer_bytes(geo.io_bytes) + scratch + arena + _mapped(s, reg, each))
    # the GPU tier's lanes (StackContext.lanes) and the CUDA runtime's own host memory
    lanes = 0 if gpu is None else (workers(s) + 1) * geo.io_bytes + getattr(gpu, "runtime_bytes", 0)
    pool = 0 if fake else pool_bytes(payload_copies(s, geo.io_bytes))
    # the pool's tags (for the largest object, and each place's) and each worker's check rows in flight (one I/O)
    stamps = 0 if fake else stamp_bytes(geo.max_object_bytes, geo.io_bytes * workers(s))
    return MemoryBudget(cpu, staging, pool, donor_store_bytes=_donor_store_bytes(s),
                        bookkeeping_bytes=sum(k.most_bytes(s.tiers) // geo.slot_bytes
                                              for k in built_media(s, reg, gpu is not None)) * BOOKKEEPING_BYTES,
                        handoff_bytes=nixl_region_bytes(s, reg.transports), gpu_staging_bytes=lanes,
                        payload_stamps_bytes=stamps,
                        access_log_bytes=_access_log_bytes(s), backlog_bytes=_backlog_bytes(s),
                        traffic_bytes=traffic_bytes(s, ranks), trace_bytes=trace_memory(s)[1],
                        timeseries_bytes=timeseries_bytes(window_seconds(s), recorded_tiers(s, reg, gpu is not None),
                                                          workers(s), ranks if rank == 0 else 1))


def _mapped(s: Settings, reg, each: int) -> int:
    """The pages of the NVMe tier's mapping a worker holds resident while it moves a block (an engine that maps the
    slab, mmap: one I/O at a time, unmapped after it; a test's run measured 0.3 GiB over the budget without it)."""
    engine = reg.engines.get(s.tiers.io_engine) if s.tiers.nvme == "on" else None
    return each if engine is not None and engine.maps else 0


def window_seconds(s: Settings) -> int:
    """The most seconds the recorder's time series may hold: the window and its drain, and a second they end in."""
    return math.ceil(s.run.duration_s + s.run.drain_s) + 1


def built_media(s: Settings, reg, gpu: bool) -> list:
    """The media the run may build: those its settings give room, the GPU's only where one may be built (gpu) or is
    simulated (with no GPU, --gpu auto builds none: its 16 GiB of blocks were budgeted all the same)."""
    return [k for k in reg.media.kinds if k.most_bytes(s.tiers)
            and (k.name != "gpu" or gpu or s.tiers.gpu == "simulated")]


def recorded_tiers(s: Settings, reg, gpu: bool) -> int:
    """How many tiers the run may record: the media it may build, and a disaggregated node's handoff."""
    return len(built_media(s, reg, gpu)) + (s.disagg.role != "both")


def traffic_bytes(s: Settings, ranks: int = 1) -> int:
    """Synthetic users' conversations at their longest: each of this process's users (every ranks-th) holds its last
    prompt and answer and itself. Other traffic is not synthetic users (a trace, semantic texts, a
    decode node's handoff)."""
    if s.trace.path or s.semantic.enabled or s.disagg.role == "decode":
        return 0
    longest = longest_history_bytes(s.workload, s.profiles, s.rag, s.model.block_tokens)
    return _users_here(s, ranks) * (longest + USER_BYTES)


def trace_memory(s: Settings) -> tuple[int, int, int, str]:
    """A --trace's (files' bytes, its records' bytes once loaded, their bytes while loading, its format), each rank's
    (each loads all of it): its records, or under --semantic its conversations' text; zeros without one or on a
    decode node (its requests come from the prefill node)."""
    if not s.trace.path or s.disagg.role == "decode":
        return 0, 0, 0, ""
    files, fmt = trace_format(s.trace.path, s.trace.format)
    size = sum(os.path.getsize(f) for f in files)
    held, loading = MEMORY_PER_FILE_BYTE["text" if s.semantic.enabled else fmt]
    return size, int(size * held), int(size * loading), fmt


def _users_here(s: Settings, ranks: int) -> int:
    """The most users one of ranks processes has (user u is rank u mod ranks's)."""
    return -(-s.workload.users // ranks)


def check_traffic_fits(s: Settings, ranks: int, available: int | None = None, ranks_here: int = 1) -> None:
    """Before a user is made or a trace read: the users' conversations alone, or the trace's records while they are
    read, must fit (the whole budget is checked once the run's size is known, after the traffic is built: a million
    users took 167 s and 2.5 GiB to make, then were refused)."""
    need = traffic_bytes(s, ranks)
    available = available_bytes() if available is None else available
    check_trace_fits(s, available, ranks_here)
    if need <= int(available * HEADROOM):
        return
    users = _users_here(s, ranks)
    raise UserError(f"{users:,} users' conversations need {need / GiB:.2f} GiB at their longest "
                    f"({need // users / 1024:,.0f} KiB a user: its last prompt and answer), "
                    f"{_more_than_room(available, ranks_here)}; lower --users (or the profiles' max_context_tokens).")


def check_trace_fits(s: Settings, available: int | None = None, ranks_here: int = 1) -> None:
    """Before a --trace is read: its records must fit while they are read (trace_memory)."""
    available = available_bytes() if available is None else available
    size, _held, loading, fmt = trace_memory(s)
    if loading <= int(available * HEADROOM):
        return
    raise UserError(f"trace {s.trace.path} ({size / 2**20:,.0f} MiB of {fmt}) takes about {loading / GiB:.2f} GiB "
                    f"of memory while it is read ({loading / size:.1f} bytes a byte of it), "
                    f"{_more_than_room(available, ranks_here)}; replay a part of it (its first lines: head -n N FILE "
                    f"> PART).")


def _more_than_room(available: int, ranks_here: int) -> str:
    """The refusals' "more than 90 % of what this process may use": available, its share when ranks_here ranks
    share the host."""
    return (f"more than {HEADROOM:.0%} of the {available / GiB:.2f} GiB available{where_from(available * ranks_here)}"
            + (f" to each of the {ranks_here} ranks on this host" if ranks_here > 1 else ""))


def _backlog_bytes(s: Settings) -> int:
    """--max-backlog-gb where requests may arrive on their own clock (an open loop: poisson, a trace's timestamps;
    auto with a trace, before the trace says whether it has them); a closed loop's users wait for their answers,
    so its backlog is one request a user at most (and the run does not bound it: pipeline._stages)."""
    arrival = s.schedule.arrival
    open_loop = arrival in ("poisson", "trace") or (arrival == "auto" and bool(s.trace.path))
    return int(s.schedule.max_backlog_gb * GiB) if open_loop else 0


def _access_log_bytes(s: Settings) -> int:
    """--capacity-curve's log at its bound, its rows included, and the curve computed from it (budget.py)."""
    return s.run.capacity_log_accesses * ACCESS_LOG_BYTES + ACCESS_LOG_FIXED_BYTES if s.run.capacity_curve else 0


def _donor_store_bytes(s: Settings) -> int:
    sem = s.semantic
    if not sem.enabled or s.model.block_tokens == 0:
        return 0
    longest = (s.trace.max_prompt_tokens or 32768) if s.trace.path else int(sem.doc_tokens[1] * 1.25) + 256
    dims = 384 if sem.embedder == "minilm" else ShingleSketch.dims
    return store_bytes(sem.max_donors, dims, longest, s.model.block_tokens, sem.fuzzy)
