"""Everything that can refuse a run, agreed on by all ranks before any of them measures: the traffic, the payload
pool, the tiers and sizes (build), and their undoing (close). Part of the composition root (run/)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kv_cache.config import Settings, replace
from kv_cache.errors import UserError
from kv_cache.lifecycle.payload import PayloadPool
from kv_cache.lifecycle.worker import buffer_bytes
from kv_cache.run.budget import check_fits
from kv_cache.run.checks import check_options, check_traffic
from kv_cache.run.distributed import Dist
from kv_cache.run.geometry import geometry
from kv_cache.run.handoff import abandon_role, open_handoff, size_handoff
from kv_cache.run.leftovers import set_state
from kv_cache.run.serving import qos_policy
from kv_cache.run.site import check_dir, storage_site
from kv_cache.run.sizing import (
    check_traffic_fits,
    default_workers,
    io_shape,
    memory_budget,
    payload_copies,
    pool_note,
    probe_workers,
    trace_memory,
    worker_ceiling,
)
from kv_cache.run.stack import RunContext, build_tiers, gds_link, open_gpu, pin_host_memory
from kv_cache.run.traffic import Traffic, build_traffic


def build(s: Settings, reg, run_id: str, *, rank: int = 0, ranks: int = 1, join: bool = False,
           probe: bool = True, link=None, memory: tuple[int, int] | None = None, building=None) -> RunContext:
    """reg: the registry (run/registry.py); probe: --workers 0 may step the storage tier's concurrency (not under
    MPI: ranks would probe each other); link: the traffic's handoff link (a NIXL decode node's); memory: (the
    memory available to this process, the ranks sharing its host: Dist.host_memory), read now when not given;
    building: called once the run is known to fit, before anything is made (it says what is made)."""
    if not probe and not s.schedule.workers:
        s = replace(s, "schedule.workers", default_workers(s))
    geo = geometry(s)
    gpu, gpu_note = open_gpu(s)
    ceiling = worker_ceiling(s, geo, reg, gpu)
    n = s.schedule.workers or min(default_workers(s), ceiling)  # a rule of fixed facts: known before the tiers
    s, n, handoff_size_note = _sized_handoff(s, reg, geo, gpu, n, ranks)
    sized = replace(s, "schedule.workers", n)  # buffers, lanes, connections and the budget for the threads that run
    budget = memory_budget(sized, geo, reg, gpu, ranks, rank)
    check_fits(budget, n, buffer_bytes(geo.io_bytes), *(memory or ()))
    if building:
        building()
    payloads = None if s.tiers.null_io else PayloadPool(s.run.seed, copies=payload_copies(sized, geo.io_bytes))
    fill = payloads.fill if payloads else None
    tiers, site = [], None
    try:
        site = None if s.tiers.null_io or s.tiers.nvme == "off" else storage_site(s, run_id, reg.engines, join)
        tiers, notes = build_tiers(sized, geo, site, reg, payloads, f"r{rank}", gpu, run_id)
        pin_host_memory(tiers, payloads)
        gds = gds_link(sized, tiers, gpu, geo)
        handoff, handoff_note = open_handoff(s, reg, geo.model.name, geo.slot_bytes, link, gpu)
        steps, probe_note = probe_workers(s, tiers, geo, n, ceiling, fill)
    except BaseException:
        for t in tiers:  # registered host memory and device slabs go back, files go
            t.close()
        if site and not join:
            shutil.rmtree(site.data_dir, ignore_errors=True)
            _remove_empty(site.made)  # a refused first run leaves no empty reports/cache behind either
        raise
    gds_note = f"GDS path: {gds.mode}; its landing and gather buffers take {gds.buffer_bytes / 2**20:,.0f} MiB of " \
        f"HBM beside the GPU tier. GDS: {gds.batch_path()}" if gds else ""
    notes += [x for x in (io_shape(sized, tiers, n, geo.io_bytes, gds), pool_note(sized, geo.io_bytes)) if x]
    notes += [x for x in (gpu_note, gds_note, *(site.warnings if site else []), handoff_size_note, handoff_note,
                          probe_note) if x]
    return RunContext(geo, site, tiers, notes, budget, n, handoff, probe=steps, gds=gds,
                      handoff_gb=s.disagg.handoff_gb, payloads=payloads)


def _sized_handoff(s: Settings, reg, geo, gpu, n: int, ranks: int) -> tuple[Settings, int, str]:
    """A prefill node's handoff space, sized for the n workers that would run and written into the settings (auto
    sized): (the settings, the workers it holds, the line saying it lowered them)."""
    rest = memory_budget(replace(s, "schedule.workers", n), geo, reg, gpu, ranks).total_bytes  # without an auto space
    size = size_handoff(s, reg.transports, geo.slot_bytes, n, rest, gpu)
    if size is None:
        return s, n, ""
    s = replace(s, "disagg.handoff_gb", size.space_bytes / 2**30)
    if size.workers == n:
        return s, n, ""
    return (replace(s, "schedule.workers", size.workers), size.workers,  # fewer run, said in one line
            f"{size.note}, so this prefill node runs {size.workers} workers, not {n}")


def _remove_empty(folders: list[str]) -> None:
    """The folders a run made, innermost first, each removed only while empty."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            return


def close(b: RunContext, remove: bool, role_open: bool) -> None:
    """role_open: the run failed before its role ended: its manifest is ended here, its folder removed."""
    if role_open:
        abandon_role(b.handoff, remove)
    if b.gds is not None:
        b.gds.close()
    for t in b.tiers:
        t.close(remove=remove)
    if b.site and remove:
        shutil.rmtree(b.site.data_dir, ignore_errors=True)
        _remove_empty(b.site.made)  # the default reports/cache goes with the run that made it, once empty
    elif b.site and os.path.isdir(b.site.data_dir):
        set_state(b.site.data_dir, "kept")  # on purpose (--keep-data): not a killed run's leftover


@dataclass(frozen=True)
class RunSpec:
    """One run to make: its settings, who speaks for it, the ranks, its id, its folder, its trial (0: the only
    one)."""

    s: Settings
    say: Callable[[str], None]
    dist: Dist
    run_id: str
    folder: Path
    reg: object       # the registry (run/registry.py): media, engines, policies, transports
    trial: int = 0

    @property
    def shared(self) -> bool:
        """Ranks share one storage namespace (--shared-storage under MPI): rank 0 makes and removes it."""
        return bool(self.s.tiers.shared_storage and self.dist.active)


@dataclass
class Prepared:
    """What a run is made of before it measures, agreed on by every rank: its traffic, and the built tiers, sizes
    and the payloads its blocks are made of (ctx.payloads)."""

    traffic: Traffic
    ctx: RunContext


def _what_is_built(s: Settings) -> str:
    if s.tiers.null_io:
        return "no data: --null-io"
    parts = [f"{s.tiers.cpu_mem_gb:g} GiB of CPU memory pre-touched"] if s.tiers.cpu_mem_gb else []
    if s.tiers.nvme == "on":
        parts.append("the NVMe tier's files")
    return ", ".join(parts or ["memory pre-touched"])


def _reading(s: Settings) -> str:
    """What a --trace is, said as it is read: text is tokenized then (a 216 MB ShareGPT file took 35 s, silent)."""
    size, _, _, fmt = trace_memory(s)
    text = fmt == "sharegpt" or s.semantic.enabled
    amount = f"{size / 2**20:,.1f} MiB" if size >= 2**20 else f"{size / 2**10:,.0f} KiB"
    return (f"  reading the trace: {amount} of {'text' if s.semantic.enabled else fmt}"
            + (", tokenized now, before the clock (--max-conversations N reads fewer)" if text else ""))


def prepare(run: RunSpec) -> Prepared:
    """Everything that can refuse the run, agreed on by all ranks before any of them measures."""
    s, dist = run.s, run.dist
    error, b, ignored = None, None, []
    memory = dist.host_memory()  # before any rank allocates: the host's ranks share what it has
    try:
        ignored = check_options(s, dist.active, run.reg)
        check_traffic_fits(s, dist.size, *memory)  # before a user is made
        if s.trace.path and s.disagg.role != "decode":  # a large trace takes a while: said, not a silent wait
            run.say(_reading(s))
        traffic = build_traffic(s, run.reg, dist.rank, dist.size)  # bad traces are refused before any data is written
        ignored += check_traffic(s, traffic.arrival, traffic.source)
        qos_policy(s)  # a bad --qos-mix is refused here, before any data is written
        if not s.tiers.null_io and s.tiers.nvme == "on" and s.tiers.cache_dir:
            check_dir(os.path.abspath(s.tiers.cache_dir))  # a wrong folder is said before the payload pool is made
        # NOTE: said before the build, once the run is known to fit: pre-touching a CPU tier's memory takes 0.1-2.5 s
        # a GiB by the host's fragmentation (4 GiB took 10 s here), the NVMe tier and the workers' probe seconds
        # more: silence read as a hang
        def building() -> None:
            run.say(f"  building the tiers: {_what_is_built(s)}, the workers' buffers")

        if not run.shared:
            b = build(s, run.reg, f"{run.run_id}-r{dist.rank}" if dist.active else run.run_id,
                      rank=dist.rank, ranks=dist.size, probe=not dist.active, link=traffic.handoff_link,
                      memory=memory, building=building)
        elif dist.rank == 0:  # rank 0 makes the shared namespace; the others join it
            b = build(s, run.reg, run.run_id, ranks=dist.size, probe=False, memory=memory, building=building)
    except UserError as e:
        error = str(e)
    if run.shared and dist.bcast(error is None and b is not None) and dist.rank and error is None:
        try:
            b = build(s, run.reg, run.run_id, rank=dist.rank, ranks=dist.size, join=True, probe=False, memory=memory)
        except UserError as e:
            error = str(e)
    try:
        dist.agree(error)
    except BaseException:
        if b is not None:
            close(b, not s.run.keep_data and not (run.shared and dist.rank), role_open=True)
        raise
    b.notes[:0] = ignored
    return Prepared(traffic, b)
