"""The ``fleet`` sub-command: one traffic through N engines and a router, for every N of --engines and every router
of --router, on paper (fleet/: nothing moves a byte); fleet.json, fleet.png and a table.

The traffic is planned once (fleet/stream.py) and replayed for every point, so the routers and engine counts are
compared on exactly the same requests.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from kv_cache.config import Settings
from kv_cache.errors import UserError
from kv_cache.fleet.export import (
    EXPORT_FILE,
    check_exportable,
    check_free,
    export_point,
    launched_runs,
    read_export,
)
from kv_cache.fleet.results import FLEET_FILE, FLEET_LIMIT, FLEET_SCHEMA, FleetFile, FleetStreamInfo, point
from kv_cache.fleet.simulate import EngineSpec, simulate
from kv_cache.fleet.stream import Stream, planned_stream
from kv_cache.inputs import read_text
from kv_cache.model import GiB
from kv_cache.recorder.typed import SchemaError
from kv_cache.report.fleet import export_comparison, fleet_plot, fleet_table
from kv_cache.run import outfolder
from kv_cache.run.geometry import chain_id, geometry
from kv_cache.run.outfolder import write_json
from kv_cache.run.pipeline import new_run_id
from kv_cache.run.sizing import check_trace_fits
from kv_cache.run.traffic import load_trace

MODEL = {
    "demote": "each engine is the benchmark's own cache (policy, waterfall, promotion, prefix-held blocks) on "
              "accounting tiers over the shared tier, which holds what the engines demote into it: each engine's own "
              "blocks in its share of the capacity, everyone's readable (the --shared-storage semantics)",
    "through": "each engine is the benchmark's own cache (policy, promotion, prefix-held blocks) on accounting HBM "
               "and CPU tiers; every block an engine makes is stored in the shared tier as it is made (unless there "
               "already), a lookup goes on there past the engine's own tiers, and the shared tier evicts its least "
               "recently used blocks for itself"}
STACK = {
    "demote": "each engine's HBM and CPU tiers are an LRU waterfall (promotion on a hit, a request's blocks touched "
              "deepest first) over one shared LRU pool holding what the engines evict from their CPU tiers (written "
              "again when it is there: a rewrite)",
    "through": "each engine's HBM and CPU tiers are an LRU waterfall (promotion on a hit, a request's blocks touched "
               "deepest first) over one shared LRU pool storing every block as it is made (unless there already)"}
MODELLED = ("modelled: the engines' load (service time = computed prefill tokens x {prefill:g} ms + output tokens x "
            "{decode:g} ms), and the shared tier's capacity curve, from its access stream's LRU stack distances (one "
            "pool)")


@dataclass(frozen=True)
class FleetAsk:
    """What the command line asked beside the run's settings."""

    engines: tuple[int, ...]
    routers: tuple[str, ...]      # empty: every router the traffic allows
    shared_gib: float             # 0: unbounded
    slack: float
    prefill_ms_per_token: float
    decode_ms_per_token: float
    writes: str                   # demote | through
    engine_model: str             # auto | cache | stack
    export: str = ""              # --export-assignment DIR (empty: none)


def _routers(ask: FleetAsk, stream: Stream, table: dict, say) -> list[str]:
    if not ask.routers:
        names = [n for n in table if stream.conversations or not table[n].needs_conversations]
        if len(names) < len(table):
            say(f"  session router left out: no conversation of this {stream.source} traffic has a second request")
        return names
    for name in ask.routers:
        if table[name].needs_conversations and not stream.conversations:
            raise UserError(f"--router {name} keeps a conversation on one engine, and no conversation of this "
                            f"{stream.source} traffic has a second request (its trace names none); use "
                            f"{', '.join(n for n in table if not table[n].needs_conversations)}.")
    return list(ask.routers)


def _engine_model(s: Settings, ask: FleetAsk) -> str:
    """auto: the LRU waterfall's own model where the policy is LRU (exact for it, and fast) and nothing is exported,
    the cache otherwise."""
    if ask.engine_model == "stack" and s.cache.policy != "lru":
        raise UserError(f"--engine-model stack is the LRU waterfall, and --policy is {s.cache.policy}; use "
                        f"--engine-model cache (the benchmark's cache runs any policy) or --policy lru.")
    if ask.engine_model != "auto":
        return ask.engine_model
    # an export is held against real runs, which are the cache itself
    return "stack" if s.cache.policy == "lru" and not ask.export else "cache"


def _spec(s: Settings, ask: FleetAsk, stream: Stream, policy: type) -> EngineSpec:
    hbm = 0 if s.tiers.gpu == "off" else int(s.tiers.gpu_mem_gb * GiB)
    cpu = int(s.tiers.cpu_mem_gb * GiB)
    model = _engine_model(s, ask)
    shared, slot = int(ask.shared_gib * GiB), stream.slot_bytes
    split = model == "cache" and ask.writes == "demote"  # each engine's share of it (else one pool)
    most = max(ask.engines) if split else 1
    share = shared // most // slot
    upper = hbm // slot + cpu // slot
    if ask.writes == "through" and not upper:
        raise UserError(f"--shared-writes through loads what the shared tier serves into the engine's own tiers, and "
                        f"HBM {hbm / GiB:g} + CPU {cpu / GiB:g} GiB hold no block of {slot / 2**20:.2f} MiB; raise "
                        f"--gpu-mem-gb or --cpu-mem-gb.")
    if shared and not share:
        over = f" split over {most} engines" if split else ""
        raise UserError(f"--shared-gb {ask.shared_gib:g}{over} holds less than one block ({slot / 2**20:.2f} MiB)"
                        f"{' each' if split else ''}; raise --shared-gb, or 0 for unbounded.")
    if shared and upper + share < stream.longest:
        raise UserError(f"each engine's tiers (HBM {hbm / GiB:g} + CPU {cpu / GiB:g} GiB + --shared-gb "
                        f"{ask.shared_gib:g}{f' over {most} engines' if split else ''}: {upper + share:,} blocks of "
                        f"{slot / 2**20:.2f} MiB) cannot hold the longest request's {stream.longest:,} blocks; "
                        f"raise --shared-gb (0: unbounded), --gpu-mem-gb or --cpu-mem-gb.")
    return EngineSpec(hbm, cpu, shared, policy, ask.prefill_ms_per_token, ask.decode_ms_per_token, ask.slack,
                      ask.writes, model)


def run_fleet(s: Settings, ask: FleetAsk, reg, say) -> int:
    """The sweep into a report folder reserved before anything is planned (as a run's: refused in one sentence if it
    cannot be made, removed again if nothing was written into it)."""
    outfolder.check_run_id(s.run.run_id)
    folder = Path(s.run.output_dir) / (s.run.run_id or new_run_id())
    if s.semantic.enabled:  # before the trace is read: its texts are not what the fleet plans
        raise UserError("fleet replays synthetic users or a trace; --semantic traffic is built for a run's own "
                        "donors: drop --semantic.")
    made = outfolder.reserve(folder, folder.name)
    try:
        _sweep(s, ask, reg, folder, say)
    finally:
        outfolder.abandon(folder, made)  # written: its marker and reserve go; nothing written: the folder goes
    return 0


def _sweep(s: Settings, ask: FleetAsk, reg, folder: Path, say) -> None:
    say(f"fleet: planning the traffic ({s.model.name}, {s.model.block_tokens}-token blocks)")
    geo = geometry(s)
    check_trace_fits(s)  # before a byte of it is read
    trace = load_trace(s) if s.trace.path else None
    if ask.export:
        check_exportable(ask.export, s, trace, _engine_model(s, ask), ask.writes)
    stream = planned_stream(s, trace, geo.slot_bytes, chain_id(s, geo), say)
    routers = _routers(ask, stream, reg.routers, say)
    spec = _spec(s, ask, stream, reg.policies[s.cache.policy])
    if ask.export:  # before any point is simulated
        check_free(ask.export, [f"{name}-{n}" for n in ask.engines for name in routers])
    say(f"  {len(stream.requests):,} {stream.source} requests over {stream.span_s:,.1f} s ({stream.timing}); "
        f"engines {', '.join(map(str, ask.engines))}; routers {', '.join(routers)}")
    points = []
    for n in ask.engines:
        for name in routers:
            sim = simulate(stream, n, reg.routers[name], spec, say)
            points.append(point(sim, stream.span_s, stream.slot_bytes))
            if ask.export:
                share = spec.share_slots(n, stream.slot_bytes) * stream.slot_bytes if spec.shared_bytes else 0
                where = export_point(ask.export, sim, stream, trace, s, asdict(points[-1]), share)
                say(f"    {n} engines, {name}: assignment in {where} (sh {where / 'run.sh'} URL runs it)")
    info = FleetStreamInfo(stream.source, stream.timing, len(stream.requests), stream.span_s,
                           len(stream.requests) / stream.span_s if stream.span_s > 0 else None, stream.block_tokens,
                           stream.slot_bytes)
    what = (MODEL if spec.model == "cache" else STACK)[ask.writes]
    model = f"{what}; " + MODELLED.format(prefill=ask.prefill_ms_per_token, decode=ask.decode_ms_per_token)
    tiers = {"hbm_gib": spec.hbm_bytes / GiB, "cpu_gib": spec.cpu_bytes / GiB, "shared_gib": ask.shared_gib}
    result = FleetFile(FLEET_SCHEMA, model, ask.writes, spec.model, info, tiers, s.cache.policy, points, s.to_dict())
    outfolder.spend_reserve(folder)
    write_json(folder / FLEET_FILE, result.to_dict())
    plot = fleet_plot(result, folder)
    shared = f"{ask.shared_gib:g} GiB" if ask.shared_gib else "unbounded"
    say(f"\nFleet: each engine {spec.hbm_bytes / GiB:g} GiB HBM + {spec.cpu_bytes / GiB:g} GiB CPU, shared tier "
        f"{shared} (--shared-writes {ask.writes}), policy {s.cache.policy}, --engine-model {spec.model}")
    for line in fleet_table(result):
        say(line)
    say(f"  model: {result.model}")
    say(f"  results: {folder / FLEET_FILE}; plot: {plot}")


def is_export(arg: str) -> bool:
    """Is arg a fleet point folder --export-assignment wrote (compare POINT)?"""
    return (Path(arg) / EXPORT_FILE).is_file()


def export_comparison_lines(point: Path, load) -> list[str]:
    """compare POINT: its simulation (engines.json) against the latest launch of its run.sh; load(folder) ->
    Results."""
    sim, folders = read_export(point), launched_runs(point)
    return export_comparison(sim, [load(f) for f in folders], str(folders[0].parent))


def fleet_folders(args: list[str]) -> list[tuple[str, FleetFile]] | None:
    """compare's arguments as fleet runs (folders holding fleet.json, or the files), or None when none is one;
    a mix of fleet runs and benchmark runs is refused."""
    paths = [Path(a) / FLEET_FILE if Path(a).is_dir() else Path(a) for a in args]
    fleet = [p.name == FLEET_FILE and p.exists() for p in paths]
    if not any(fleet):
        return None
    if not all(fleet):
        odd = args[fleet.index(False)]
        raise UserError(f"compare: {odd} is no fleet run, and {args[fleet.index(True)]} is one; compare fleet runs "
                        f"with fleet runs (folders holding fleet.json) and benchmark runs with benchmark runs.")
    return [(p.parent.name, load_fleet(p)) for p in paths]


def load_fleet(path: Path) -> FleetFile:
    fix = "pass a folder the fleet sub-command wrote, or its fleet.json"
    text = read_text(str(path), "fleet file", FLEET_LIMIT, fix)
    try:
        return FleetFile.from_dict(json.loads(text))
    except (ValueError, SchemaError) as e:  # JSONDecodeError is a ValueError
        raise UserError(f"{path} is not a readable fleet file ({e}); {fix}.") from None
