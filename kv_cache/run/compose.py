"""Building a run from settings: geometry, cache directory, tiers, memory budget.

Part of the composition root (run/): it hands the tier registry a StackContext
and gets the stack back; the concrete tier classes stay in tiers/. Everything a
user can get wrong here ends in one UserError sentence before any data is written.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from kv_cache.config import Settings, replace
from kv_cache.errors import RunFault, UserError
from kv_cache.lifecycle.donors import store_bytes
from kv_cache.lifecycle.executor import WorkerBuffers, buffer_bytes
from kv_cache.lifecycle.handoff import Loader, Publisher
from kv_cache.lifecycle.payload import PAGE, POOL_SPAN_BYTES, SEGMENT_BYTES
from kv_cache.lifecycle.semantic import SemanticReuse
from kv_cache.lifecycle.sketch import ShingleSketch
from kv_cache.model import GiB, ModelSpec, find_model, slot_bytes
from kv_cache.run.budget import BOOKKEEPING_BYTES, MemoryBudget, fits
from kv_cache.run.handoff import nixl_region_bytes
from kv_cache.run.leftovers import DATA_PREFIX, describe_dead, leftovers_note, write_marker
from kv_cache.scheduler.autoscale import Autoscaler
from kv_cache.scheduler.qos import QosPolicy
from kv_cache.tiers.base import PINS_HOST, REMOTE, STORAGE, SlottedTier, moves_real_bytes
from kv_cache.tiers.devices import FAKE_GPU_ENV, open_cupy
from kv_cache.tiers.engines import engines
from kv_cache.tiers.fsinfo import RAM_FILESYSTEMS, mount_of, probe_direct, refuse_system_dir
from kv_cache.tiers.gds import GdsLink, open_link
from kv_cache.tiers.probe import concurrency
from kv_cache.tiers.registry import (
    StackContext,
    StorageSite,
    agreed_settings,
    build_stack,
    most_blocks,
    resolved_settings,
)
from kv_cache.tiers.remote import redact

WHOLE_REQUEST_SLOT_BYTES = 16 << 20  # slot size of every tier in whole-request mode


@dataclass
class Geometry:
    """Sizes that follow from the model and the block settings."""

    model: ModelSpec
    bytes_per_token: int
    block_bytes: int        # logical bytes of one full block (0 in whole-request mode)
    slot_bytes: int         # bytes one tier slot holds (block rounded up to 4 KiB)
    max_object_bytes: int   # largest object (a tier must hold one)
    part_bytes: int = 0     # whole-request objects larger than this move as parts of it (0: every object is one I/O)

    @property
    def io_bytes(self) -> int:
        """The largest single I/O, which every per-worker buffer and GPU lane is sized for."""
        return min(self.max_object_bytes, self.part_bytes) if self.part_bytes else self.max_object_bytes



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



def resolved(s: Settings, b: RunContext) -> Settings:
    """The settings as the run ran them: what 0 or empty chose (workers, cache directory, the bottom tier's
    size) written in, so settings.yaml given back to --config repeats this run and not a new choice."""
    if not s.schedule.workers:
        s = replace(s, "schedule.workers", b.workers)
    if not s.disagg.handoff_gb and b.handoff_gb:
        s = replace(s, "disagg.handoff_gb", b.handoff_gb)
    if b.site is not None and not s.tiers.cache_dir:
        s = replace(s, "tiers.cache_dir", b.site.cache_dir)
    if not s.tiers.null_io:  # what each tier's automatic settings chose (its size): the medium says which key
        for dotted, value in resolved_settings(s.tiers, b.tiers).items():
            s = replace(s, dotted, value)
    if s.tiers.remote_url:  # a password never reaches results.json nor settings.yaml
        s = replace(s, "tiers.remote_url", redact(s.tiers.remote_url))
    return s


def geometry(s: Settings) -> Geometry:
    model = find_model(s.model.name, s.models)
    bpt = model.bytes_per_token(s.model.kv_dtype, s.model.tp)
    if s.model.block_tokens:
        block = bpt * s.model.block_tokens
        return Geometry(model, bpt, block, slot_bytes(block), slot_bytes(block))
    profiles = [getattr(s.profiles, n) for n in s.profiles.__dataclass_fields__]
    longest = max(p.max_context_tokens + p.output_tokens[1] for p in profiles)
    part = max(1, (s.tiers.io_chunk_mb << 20) // WHOLE_REQUEST_SLOT_BYTES) * WHOLE_REQUEST_SLOT_BYTES
    return Geometry(model, bpt, 0, WHOLE_REQUEST_SLOT_BYTES, slot_bytes(longest * bpt), part)


AUTO_MAX = 16  # --workers 0 (auto): the most the rule gives, halved until the machine's memory holds them


def default_workers() -> int:
    """--workers 0 (auto): 2 per core, at least 4, at most 16: a fixed fact of the machine, so the same command
    runs the same workers whatever a neighbour does (the probe's bandwidth did not: 4 and 32 on one machine)."""
    return max(4, min(16, 2 * (os.cpu_count() or 1)))


def workers(s: Settings) -> int:
    return s.schedule.workers or default_workers()


def worker_ceiling(s: Settings, geo: Geometry, gpu=None) -> int:
    """--workers 0: the most threads the run may have, halved from AUTO_MAX until their staging fits in the
    machine's memory (its total, not what is free now: a fixed fact), down to one (whole-request objects of GiBs,
    the MLPerf reference's shape, fit few at a time). The run's memory check against what is free follows."""
    if s.schedule.workers:
        return s.schedule.workers
    total, n = psutil.virtual_memory().total, AUTO_MAX
    while n > 1 and not fits(memory_budget(replace(s, "schedule.workers", n), geo, gpu), total):
        n //= 2
    return n


def probe_workers(s: Settings, tiers: list, geo: Geometry, n: int, ceiling: int,
                  fill) -> tuple[list, str]:
    """(the probe's steps, the line that says the workers' rule) for n workers. --workers 0 runs default_workers()
    within the memory's ceiling; on a real storage tier its bandwidth at 1, 2, 4, ... up to n threads is probed
    first, as information (said beside the choice; the run's most-writes estimate reads it)."""
    if s.schedule.workers:
        return [], ""
    rule = (f"workers: {n} (auto: 2 per core of {os.cpu_count() or 1}, at least 4, at most 16"
            + (f", as memory allows at most {ceiling}" if ceiling < default_workers() else "")
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


def memory_budget(s: Settings, geo: Geometry, gpu=None) -> MemoryBudget:
    """gpu: the GPU backend when a real GPU tier will be built (its lanes' pinned staging is host memory)."""
    fake = s.tiers.null_io
    cpu = 0 if fake else int(s.tiers.cpu_mem_gb * GiB) // geo.slot_bytes * geo.slot_bytes
    staging = 0 if fake else workers(s) * 2 * buffer_bytes(geo.io_bytes)
    lanes = 0 if gpu is None else (workers(s) + 1) * geo.io_bytes  # the GPU tier's lanes (StackContext.lanes)
    pool = 0 if fake else POOL_SPAN_BYTES + SEGMENT_BYTES
    # the pool's templates (24 bytes a page of the largest object, one set) and each worker's stamp rows and key
    # column in flight (24 bytes a page of one I/O)
    stamps = 0 if fake else (geo.max_object_bytes + geo.io_bytes * workers(s)) // PAGE * 24
    return MemoryBudget(cpu, staging, pool, donor_store_bytes=_donor_store_bytes(s),
                        bookkeeping_bytes=most_blocks(s.tiers, geo.slot_bytes) * BOOKKEEPING_BYTES,
                        handoff_bytes=nixl_region_bytes(s), gpu_staging_bytes=lanes, payload_stamps_bytes=stamps)


def _donor_store_bytes(s: Settings) -> int:
    sem = s.semantic
    if not sem.enabled or s.model.block_tokens == 0:
        return 0
    longest = (s.trace.max_prompt_tokens or 32768) if s.trace.path else int(sem.doc_tokens[1] * 1.25) + 256
    dims = 384 if sem.embedder == "minilm" else ShingleSketch.dims
    return store_bytes(sem.max_donors, dims, longest, s.model.block_tokens, sem.fuzzy)


# ---------------------------------------------------------------------------- NVMe site

def check_dir(path: str) -> None:
    refuse_system_dir(path)
    if not os.path.exists(path):
        raise UserError(f"cache directory {path} does not exist; create it or pass another --cache-dir.")
    if not os.path.isdir(path):
        raise UserError(f"cache directory {path} is not a directory; pass a directory to --cache-dir.")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"cache directory {path} is not writable; fix its permissions or pass another --cache-dir.")


def storage_site(s: Settings, run_id: str, join: bool = False) -> StorageSite:
    """Check the cache directory, make the run's data directory and choose the engine.

    join: the directory is a shared namespace another rank already made (--shared-storage).
    """
    cache_dir, made = s.tiers.cache_dir, []
    if not cache_dir:
        cache_dir = os.path.join(s.run.output_dir, "cache")
        refuse_system_dir(cache_dir, "--output-dir")
        made = [p for p in (cache_dir, *map(str, Path(cache_dir).parents)) if not os.path.lexists(p)]
        try:
            os.makedirs(cache_dir, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create the default cache directory {cache_dir}: {e.strerror}; pass "
                            f"--cache-dir or another --output-dir.") from None
    cache_dir = os.path.abspath(cache_dir)
    check_dir(cache_dir)
    mount = mount_of(cache_dir)
    warnings = []
    if mount.fs_type in RAM_FILESYSTEMS:
        if not s.tiers.allow_tmpfs:
            raise UserError(f"cache directory {cache_dir} is on {mount.fs_type} (RAM), so the NVMe tier would "
                            f"measure memory; pass a directory on the device under test, or --allow-tmpfs.")
        warnings.append(f"the NVMe tier is on {mount.fs_type}: its numbers are RAM, not a storage device.")
    data_dir = os.path.join(cache_dir, f"{DATA_PREFIX}{run_id}")
    if not join:
        note = leftovers_note(cache_dir)
        if note:
            warnings.append(note)
    try:
        os.makedirs(data_dir, exist_ok=join)
    except FileExistsError:
        why = describe_dead(data_dir) or "a run with the same --run-id kept its data (--keep-data)"
        raise UserError(f"{data_dir} already exists: {why}; remove it (`kv_cache_benchmark.py clean --cache-dir "
                        f"{cache_dir}` removes what killed runs left) or choose another --run-id.") from None
    except OSError as e:
        raise UserError(f"cannot create {data_dir}: {e.strerror}; pass a writable --cache-dir with free "
                        f"space.") from None
    try:  # from here until the caller holds the site, anything that stops the run (a signal too) removes it
        if not join:
            write_marker(data_dir, run_id)
        engine, note = _engine(s.tiers.io_engine, data_dir, cache_dir, mount.fs_type, warnings)
    except BaseException as e:
        if not join:  # an empty folder, or one holding only its marker: a start-up signal left it (issue 37)
            shutil.rmtree(data_dir, ignore_errors=True)
        if isinstance(e, (OSError, UserError)):
            raise UserError(f"cannot create {data_dir}: {getattr(e, 'strerror', None) or e}; pass a writable "
                            f"--cache-dir with free space.") from None
        raise
    return StorageSite(cache_dir, data_dir, mount.fs_type, mount.mount_point, engine, note, warnings,
                       [os.path.abspath(p) for p in made])


def _engine(engine: str, data_dir: str, cache_dir: str, fs_type: str, warnings: list[str]) -> tuple[str, str]:
    """The NVMe engine that will run, and the note saying why when it is not the one asked for."""
    if not engines()[engine].direct:
        return engine, ""
    why = probe_direct(data_dir)
    if not why:
        return engine, ""
    warnings.append(f"O_DIRECT is not available in {cache_dir} ({why}); the buffered engine (write + fsync, page "
                    f"cache dropped before reads) runs instead.")
    return "buffered", f"fallback: {fs_type} refused O_DIRECT ({why})"



# ---------------------------------------------------------------------------- tiers

def fio_of(site) -> tuple[str, int, bool]:
    """What fio runs for the site's engine (its table's entry); fio's null engine without a site."""
    return engines()[site.engine].fio if site else ("null", 0, False)


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
    return open_link(tiers, backend, workers(s) + 1, geo.io_bytes)


def io_unit_bytes(s: Settings, geo: Geometry) -> int:
    """--io-unit layer: a block's bytes over its layer groups, rounded up to 4 KiB (O_DIRECT's alignment)."""
    if s.tiers.io_unit != "layer" or not geo.block_bytes:
        return 0
    groups = max(1, -(-geo.model.layers // s.tiers.layers_per_io))
    return -(-geo.block_bytes // groups // 4096) * 4096


def semantic_reuse(s: Settings, recorder) -> SemanticReuse | None:
    """Donor discovery for --semantic: the embedder named by --semantic-embedder and an empty donor store."""
    if not s.semantic.enabled:
        return None
    if s.semantic.embedder == "minilm":
        from kv_cache.lifecycle.minilm import MiniLMEmbedder

        return SemanticReuse(s.semantic, s.model.block_tokens, MiniLMEmbedder(), recorder)
    return SemanticReuse(s.semantic, s.model.block_tokens, ShingleSketch(), recorder)


def pin_host_memory(tiers: list, payloads) -> None:
    """Before the clock, register with a GPU tier every long-lived host buffer its transfers touch: the CPU tier's
    arena (demotions land there, promotions leave from it) and the payload pool (new blocks are written from it).
    The workers' buffers follow as each is made (worker_state). What is left is staged, counted and said."""
    pinning = [t for t in tiers if PINS_HOST in t.flags]
    if not pinning:
        return
    host = [arr for t in tiers for arr in t.host_memory()] + ([payloads.pool] if payloads is not None else [])
    for t in pinning:
        for arr in host:
            try:
                t.pin_host(arr)
            except Exception as e:  # noqa: BLE001 - CUDA's refusal (a locked-memory limit, no room) is one sentence
                raise UserError(f"the {t.name} tier could not register {arr.nbytes / GiB:.2f} GiB of host memory "
                                f"for direct copies ({type(e).__name__}: {e}); lower --cpu-mem-gb, or raise the "
                                f"locked-memory limit (ulimit -l).") from None


def worker_state(tiers: list, max_object_bytes: int, fake_io: bool):
    """Factory of a worker's buffers, registered as pinned with a GPU tier (direct DMA, no staging copy)."""
    def make() -> WorkerBuffers:
        bufs = WorkerBuffers(max_object_bytes, fake_io)
        for t in tiers:
            if not fake_io:  # a no-op for tiers without PINS_HOST
                t.pin_host(bufs.block)
                t.pin_host(bufs.scratch)
        return bufs
    return make


def build_tiers(s: Settings, geo: Geometry, site: StorageSite | None, fill=None,
                writer: str = "r0", gpu=None, run_id: str = "") -> tuple[list, list[str]]:
    """The ordered tier list (fastest first) and lines saying what is off and why.

    fill(key, out) rebuilds a block's payload; a simulated tier uses it to hand back real bytes.
    gpu: the device backend of a real GPU tier (see open_gpu), or None. run_id: a remote tier's namespace.
    """
    ctx = StackContext(s.tiers, geo.slot_bytes, geo.max_object_bytes, workers(s) + 1, site, fill, writer, gpu,
                       io_unit_bytes(s, geo), s.tiers.null_io, run_id, s.media, geo.io_bytes)
    tiers, notes = build_stack(ctx)
    if not s.tiers.null_io and (not tiers or STORAGE not in tiers[-1].flags):
        for t in tiers:
            t.close()
        raise UserError("--nvme off leaves no storage tier below the memory tiers; give --remote-url URL (a Valkey "
                        "or S3 server) or drop --nvme off.")
    return tiers, notes


def agreed_settings_of(s: Settings, dist) -> tuple[Settings, list[str]]:
    """Under MPI every rank runs rank 0's choice of the automatic settings (registry.agreed_settings), and says so."""
    if not dist.active or s.tiers.null_io:
        return s, []
    picked: tuple[dict, list[str]] = ({}, [])
    if dist.rank == 0:
        cache_dir = os.path.abspath(s.tiers.cache_dir or os.path.join(s.run.output_dir, "cache"))
        try:
            picked = agreed_settings(s.tiers, dist.size, cache_dir)
        except OSError:  # the folder's own check says what is wrong with it
            pass
    values, notes = dist.bcast(picked)
    for dotted, value in values.items():
        s = replace(s, dotted, value)
    return s, notes


def device_latency_mode(s: Settings, b: RunContext) -> str:
    """'on' where the storage tier is a local disk whose block requests eBPF can time; else why not."""
    if s.run.device_latency == "off":
        return "off (--device-latency off)"
    if s.tiers.null_io:
        return "the null tier moves no bytes"
    if REMOTE in b.tiers[-1].flags:
        return f"the storage tier {b.tiers[-1].name} is network + server, not a block device"
    return "on" if b.site is not None else "no local disk tier"


def qos_policy(s: Settings) -> QosPolicy:
    return QosPolicy(s.qos, s.run.seed)


def autoscaler(s: Settings, users: list | None, recorder) -> Autoscaler | None:
    """The autoscaler of --autoscale (None: off): it sets the closed loop's users itself."""
    return None if s.autoscale.mode == "off" else Autoscaler(s.autoscale, s.qos, len(users), recorder)
