"""The tier stack of a run: the GPU backend, the media's tiers built from the registry (run/registry.py), host
memory pinned for direct copies, the GDS link, and the settings as the run ran them (what auto chose)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kv_cache.config import Settings, replace
from kv_cache.errors import UserError
from kv_cache.lifecycle.handoff import Loader, Publisher
from kv_cache.lifecycle.payload import PayloadPool
from kv_cache.lifecycle.worker import WorkerBuffers
from kv_cache.model import GiB
from kv_cache.run.budget import MemoryBudget
from kv_cache.run.geometry import Geometry, io_unit_bytes
from kv_cache.run.sizing import batch_depth, workers
from kv_cache.tiers import paged
from kv_cache.tiers.base import PINS_HOST, REMOTE, STORAGE, SlottedTier
from kv_cache.tiers.devices import FAKE_GPU_ENV, open_cupy
from kv_cache.tiers.gds import GdsLink, open_link
from kv_cache.tiers.kinds import StackContext, StorageSite
from kv_cache.tiers.remote import redact


@dataclass
class RunContext:
    """What the composition root built for one run and hands down: sizes, the storage site, the tier stack."""

    geo: Geometry
    site: StorageSite | None
    tiers: list[SlottedTier]       # fastest first; the last is the storage under test
    notes: list[str]
    budget: MemoryBudget | None
    workers: int
    handoff: Publisher | Loader | None = None  # a prefill node's side of the handoff, or a decode node's
    probe: list[tuple[int, float]] = field(default_factory=list)  # --workers 0: (threads, GB/s) of each step
    gds: GdsLink | None = None           # --gds: NVMe <-> HBM without the host bounce
    handoff_gb: float = 0.0              # a prefill node's handoff space as sized (auto: 0 in the settings)
    payloads: PayloadPool | None = None  # the blocks' bytes (none where no bytes move: --null-io)


def resolved(s: Settings, b: RunContext, reg) -> Settings:
    """The settings as the run ran them: what 0 or empty chose (workers, cache directory, the bottom tier's
    size) written in, so settings.yaml given back to --config repeats this run and not a new choice."""
    if not s.schedule.workers:
        s = replace(s, "schedule.workers", b.workers)
    if not s.disagg.handoff_gb and b.handoff_gb:
        s = replace(s, "disagg.handoff_gb", b.handoff_gb)
    if b.site is not None and not s.tiers.cache_dir:
        s = replace(s, "tiers.cache_dir", b.site.cache_dir)
    if not s.tiers.null_io:  # what each tier's automatic settings chose (its size): the medium says which key
        for dotted, value in reg.media.resolved_settings(s.tiers, b.tiers).items():
            s = replace(s, dotted, value)
    if s.tiers.remote_url:  # a password never reaches results.json nor settings.yaml
        s = replace(s, "tiers.remote_url", redact(s.tiers.remote_url))
    return s


def open_gpu(s: Settings) -> tuple[object | None, str]:
    """The device backend for a real GPU tier, or None and the one line that says why there is none."""
    if s.tiers.gpu not in ("auto", "real") or s.tiers.null_io or not s.tiers.gpu_mem_gb:
        return None, ""
    backend, why = open_cupy()
    if backend is not None and backend.name == "fake":  # KVBENCH_FAKE_GPU: a test's stand-in, never a measurement
        return backend, f"GPU tier: {FAKE_GPU_ENV} set: fake devices in host memory (tests only), not a GPU."
    if backend is None and s.tiers.gpu == "real":
        raise UserError(f"--gpu real: {why}; use --gpu simulated or --gpu off on a machine without one.")
    return backend, f"GPU tier off: {why} (--gpu simulated models one)." if backend is None else ""


def gds_link(s: Settings, tiers: list, backend, geo: Geometry) -> GdsLink | None:
    """The NVMe <-> HBM path of --gds, between the real GPU tier and the NVMe tier."""
    if not s.tiers.gds:
        return None
    return open_link(tiers, backend, workers(s) + 1, geo.io_bytes, batch_depth(s, geo.io_bytes))


def pin_host_memory(tiers: list, payloads) -> None:
    """Before the clock, register with a GPU tier every long-lived host buffer its transfers touch: the CPU tier's
    arena (demotions land there, promotions leave from it) and the payload pool (new blocks are written from it).
    The workers' buffers follow as each is made (worker_state). What is left is staged, counted and said."""
    pinning = [t for t in tiers if PINS_HOST in t.flags]
    if not pinning:
        return
    host = [arr for t in tiers for arr in t.host_memory()] + ([payloads.host_memory] if payloads is not None else [])
    for t in pinning:
        for arr in host:
            try:
                t.pin_host(arr)
            except Exception as e:  # noqa: BLE001 - CUDA's refusal (a locked-memory limit, no room) is one sentence
                raise UserError(f"the {t.name} tier could not register {arr.nbytes / GiB:.2f} GiB of host memory "
                                f"for direct copies ({type(e).__name__}: {e}); lower --cpu-mem-gb, or raise the "
                                f"locked-memory limit (ulimit -l).") from None


def worker_state(tiers: list, max_object_bytes: int, fake_io: bool, batch: int = 0, moves: int = 1):
    """Factory of a worker's buffers (batch: the blocks it may have in flight together; moves: the demotions its
    scratch lands at once), registered as pinned with a GPU tier (direct DMA, no staging copy)."""
    def make() -> WorkerBuffers:
        bufs = WorkerBuffers(max_object_bytes, fake_io, batch, moves)
        for t in tiers:
            if not fake_io:  # a no-op for tiers without PINS_HOST
                for arr in bufs.pinned():
                    t.pin_host(arr)
        return bufs
    return make


def build_tiers(s: Settings, geo: Geometry, site: StorageSite | None, reg, payloads=None,
                writer: str = "r0", gpu=None, run_id: str = "") -> tuple[list, list[str]]:
    """The ordered tier list (fastest first) and lines saying what is off and why.

    payloads: the payload pool; a simulated tier rebuilds the bytes it hands back with it.
    gpu: the device backend of a real GPU tier (see open_gpu), or None. run_id: a remote tier's namespace.
    """
    paging, paging_note = paged.plan(s.tiers, geo.model, s.model.block_tokens, geo.bytes_per_token)
    ctx = StackContext(s.tiers, geo.slot_bytes, geo.max_object_bytes, workers(s) + 1, site, payloads, writer, gpu,
                       io_unit_bytes(s, geo), s.tiers.null_io, run_id, s.media, geo.io_bytes, reg.engines, paging,
                       paging_note, batch_depth(s, geo.io_bytes))
    tiers, notes = reg.media.build_stack(ctx)
    if not s.tiers.null_io and (not tiers or STORAGE not in tiers[-1].flags):
        for t in tiers:
            t.close()
        raise UserError("--nvme off leaves no storage tier below the memory tiers; give --remote-url URL (a Valkey "
                        "or S3 server) or drop --nvme off.")
    return tiers, notes


def agreed_settings_of(s: Settings, dist, reg) -> tuple[Settings, list[str]]:
    """Under MPI every rank runs rank 0's choice of the automatic settings (Media.agreed_settings), and says so."""
    if not dist.active or s.tiers.null_io:
        return s, []
    picked: tuple[dict, list[str]] = ({}, [])
    if dist.rank == 0:
        cache_dir = os.path.abspath(s.tiers.cache_dir or os.path.join(s.run.output_dir, "cache"))
        try:
            picked = reg.media.agreed_settings(s.tiers, dist.size, cache_dir)
        except OSError:  # the folder's own check says what is wrong with it
            pass
    values, notes = dist.bcast(picked)
    for dotted, value in values.items():
        s = replace(s, dotted, value)
    return s, notes


def device_latency_mode(s: Settings, b: RunContext, tracer: int | None = None) -> str:
    """'on' where the storage tier is a local disk whose block requests eBPF can time; else why not (tracer: the rank
    that traces this host's disk, when not this one: its trace holds every rank's requests, a second would only take
    the CPU the ranks share)."""
    if s.run.device_latency == "off":
        return "off (--device-latency off)"
    if tracer is not None:
        return f"rank {tracer} traces this host's disk, every rank's requests"
    if s.tiers.null_io:
        return "the null tier moves no bytes"
    if REMOTE in b.tiers[-1].flags:
        return f"the storage tier {b.tiers[-1].name} is network + server, not a block device"
    return "on" if b.site is not None else "no local disk tier"
