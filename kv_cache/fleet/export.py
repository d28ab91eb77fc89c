"""fleet --export-assignment DIR: each point's router assignment as one trace per engine, with what runs those
engines for real, as processes sharing one remote tier (a Valkey or S3 namespace all of them name:
tiers/remote_shared.py).

A point (router, N) becomes DIR/<router>-<N>/:
    engine-<k>.jsonl   engine k's requests, in arrival order, in the trace's own format (hash ids; each record's
                       source_index names its tokens, so the engine builds exactly the requests the fleet planned)
    settings.yaml      the fleet's settings as one engine's run: its HBM and CPU tiers, the remote tier at the
                       bottom (no NVMe tier), one worker (the fleet serves a request at a time per engine), no
                       warm-up (every request counts, as in the simulation), the trace's arrivals
    run.sh URL [LEAD]  starts the N runs together (--start-at: each engine's first arrival after the fleet's first)
                       against the Valkey or S3 bucket at URL (S3: AWS_* from the environment), in a namespace of
                       this launch's own, and waits for them
    engines.json       the simulation's figures to hold the runs against, and each engine's share

Only what a run replays exactly can be exported: a hash-id trace (Mooncake, Bailian) at its own timestamps, once.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import numpy as np
import yaml

from kv_cache.config import Settings
from kv_cache.errors import UserError
from kv_cache.fleet.simulate import TIERS, Simulated
from kv_cache.fleet.stream import Stream
from kv_cache.inputs import read_text
from kv_cache.model import GiB
from kv_cache.safefiles import refuse_link, write_file
from kv_cache.sources.hashtrace import TIME_UNIT_S, TRACE_BLOCK
from kv_cache.sources.replay import TraceSet
from kv_cache.tiers.fsinfo import FILES, refuse_system_dir

FLAG = "--export-assignment"
EXPORT_FILE = "engines.json"
EXPORT_LIMIT = 16 << 20  # bytes of an engines.json read back: a larger one is not ours


def check_exportable(folder: str, s: Settings, trace: TraceSet | None, model: str, writes: str) -> None:
    """One sentence, before anything is planned, for a fleet a run cannot replay as simulated, or a folder that
    cannot take the traces. model, writes: --engine-model and --shared-writes as chosen."""
    fix = "or drop --export-assignment"
    if model != "cache" or writes != "demote":
        raise UserError(f"{FLAG} runs each engine as the benchmark's own cache over a shared tier it demotes into; "
                        f"simulate that: --engine-model cache --shared-writes demote, {fix}.")
    if trace is None:
        raise UserError(f"{FLAG} writes each engine's requests as a trace a run replays, and synthetic users are no "
                        f"trace; give --trace with a Mooncake or Bailian hash-id trace, {fix}.")
    if trace.fmt not in TRACE_BLOCK:
        raise UserError(f"{FLAG} writes hash-id traces (Mooncake, Bailian), and {s.trace.path} is a {trace.fmt} "
                        f"trace; use a hash-id trace, {fix}.")
    if not trace.timestamped or s.schedule.request_rate > 0:
        raise UserError(f"{FLAG}: the engines replay the trace's own timestamps; drop --request-rate, {fix}.")
    if s.trace.replay_cycles != 1:
        raise UserError(f"{FLAG}: an engine's trace is one pass of the fleet's; give --replay-cycles 1, {fix}.")
    refuse_link(folder, FLAG)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UserError(f"{FLAG} {folder} is a file; name a folder (made if missing).")
    refuse_system_dir(os.path.abspath(folder), FLAG, FILES)


def check_free(folder: str, points: list[str]) -> None:
    """One sentence when a point's folder holds files already (checked before the sweep, and as each is written)."""
    for point in points:
        out = Path(folder) / point
        if out.is_dir() and any(out.iterdir()):
            raise UserError(f"{FLAG} {folder}: {out} holds files already; name a new folder (nothing is written "
                            f"over an export).")


def _record(rec, fmt: str) -> dict:
    """A trace record as its format writes it, with its index in the fleet's trace (hashtrace.py reads it back)."""
    out = {"timestamp": rec.arrival_s / TIME_UNIT_S[fmt], "input_length": rec.input_length,
           "output_length": rec.output_length, "hash_ids": rec.hash_ids, "source_index": rec.index}
    if fmt == "bailian":
        out.update(chat_id=rec.session, turn=rec.turn)
    return out


def _engine_settings(s: Settings, point_dir: Path, remote_gb: float) -> dict:
    """The fleet's settings as one engine's run (see the module's docstring)."""
    d = s.to_dict()
    d["run"].update(warmup_s=0.0, max_requests=0, capacity_curve=False, run_id="", start_at=0.0,
                    output_dir=str(point_dir / "runs"), duration_s=max(d["run"]["duration_s"], 86_400.0))
    d["schedule"].update(workers=1, arrival="trace", request_rate=0.0)
    d["tiers"].update(nvme="off", remote_gb=remote_gb, remote_url="", remote_namespace="")
    d["trace"].update(path="")
    return d


def _program() -> str:
    """How run.sh calls this program: the kv_cache_benchmark.py beside this package (a checkout), else the package
    as a module (an installed one); the interpreter is the fleet's own unless PYTHON says otherwise."""
    script = Path(__file__).resolve().parents[2] / "kv_cache_benchmark.py"
    return shlex.quote(str(script)) if script.is_file() else "-m kv_cache"


def _script(point: str, engines: list[dict]) -> str:
    program = _program()
    lines = ["#!/bin/sh",
             f"# The {len(engines)} engines of fleet point {point}, for real: one run each, sharing the Valkey or S3 "
             f"bucket at URL in a namespace of this launch's own.",
             "# usage: sh run.sh URL [LEAD_S]   (LEAD_S: seconds the runs get for their set-up before the first "
             "arrival; default 20; PYTHON: another interpreter)",
             "set -e", 'URL="$1"; LEAD="${2:-20}"', 'HERE=$(cd "$(dirname "$0")" && pwd)',
             f'PY=${{PYTHON:-{shlex.quote(sys.executable)}}}',
             'T0=$(( $(date +%s) + LEAD ))', "pids=''"]
    for e in engines:
        run = " ".join([
            f'"$PY" {program} --config "$HERE/settings.yaml"', f'--trace "$HERE/{e["trace"]}"',
            '--remote-url "$URL"', f'--remote-namespace "fleet-{point}-$T0"', f'--run-id "engine-{e["engine"]}-$T0"',
            f'--start-at "$(awk -v t="$T0" \'BEGIN {{ printf "%.3f", t + {e["offset_s"]:.6f} }}\')"'])
        lines.append(f'{run} > "$HERE/engine-{e["engine"]}.log" 2>&1 & pids="$pids $!"')
    lines += ["rc=0", 'for p in $pids; do wait "$p" || rc=1; done',
              'echo "results: $HERE/runs/engine-*-$T0/results.json"',
              f'[ "$rc" = 0 ] && "$PY" {program} compare "$HERE"', "exit $rc"]
    return "\n".join(lines) + "\n"


def export_point(folder: str, sim: Simulated, stream: Stream, trace: TraceSet, s: Settings, figures: dict,
                 share_bytes: int) -> Path:
    """Write a point's engine traces, settings, launcher and figures into folder/<router>-<N>; that folder.
    figures: the point's (FleetPoint as a dict); share_bytes: each engine's share of the shared tier (0: unbounded)."""
    point = f"{sim.router}-{sim.engines}"
    out = Path(folder) / point
    check_free(folder, [point])
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{FLAG} {folder}: cannot make {out} ({e.strerror}).") from None
    rows: list[list[str]] = [[] for _ in range(sim.engines)]
    first: list[float | None] = [None] * sim.engines
    for r, e in enumerate(sim.assignment.tolist()):
        rows[e].append(json.dumps(_record(trace.records[r], trace.fmt)))
        if first[e] is None:
            first[e] = stream.requests.at_s[r]
    engines = []
    for e in range(sim.engines):
        name = f"engine-{e}.jsonl"
        write_file(out / name, "".join(x + "\n" for x in rows[e]), FLAG)
        engines.append({"engine": e, "trace": name, "requests": len(rows[e]), "offset_s": first[e] or 0.0})
    shared = figures["shared"]
    # each engine's share of the shared tier: the simulation's, or for an unbounded one room for every block the
    # fleet wrote there (no engine evicts, as in the simulation)
    share = share_bytes or (shared["write_blocks"] + 1) * stream.slot_bytes
    settings = _engine_settings(s, out, share / GiB)
    write_file(out / "settings.yaml", "# One engine of fleet point " + point + ": run.sh runs every engine\n"
               + yaml.safe_dump(settings, sort_keys=False), FLAG)
    write_file(out / "run.sh", _script(point, [e for e in engines if e["requests"]]), FLAG)
    fleet = {"router": sim.router, "engines": sim.engines, "tiers": list(TIERS), "hit_rate": figures["hit_rate"],
             "shared_read_blocks": shared["read_blocks"], "shared_write_blocks": shared["write_blocks"],
             "slot_bytes": stream.slot_bytes, "trace_format": trace.fmt, "speedup": s.trace.speedup,
             "arrival_gap_ms": arrival_gap_ms(stream.requests.at_s)}
    write_file(out / EXPORT_FILE, json.dumps({"fleet": fleet, "engines": engines,
                                                 "run": f"sh {shlex.quote(str(out / 'run.sh'))} URL"}, indent=1),
               FLAG)
    return out


def arrival_gap_ms(at_s) -> float | None:
    """The median time between two of the fleet's arrivals, ms (over --trace-speedup): a request that waited longer
    for its engine's worker may have reached the shared tier after the next one (compare POINT says so)."""
    return float(np.median(np.diff(np.sort(np.asarray(at_s, dtype=float))))) * 1e3 if len(at_s) > 1 else None


def read_export(point: Path) -> dict:
    """engines.json's simulated figures (compare POINT), checked for the fields the comparison reads."""
    fix = f"pass a folder {FLAG} wrote (DIR/<router>-<N>)"
    text = read_text(str(point / EXPORT_FILE), "fleet export", EXPORT_LIMIT, fix)
    try:
        sim = json.loads(text)["fleet"]
        for name in ("router", "engines", "tiers", "hit_rate", "slot_bytes", "shared_read_blocks",
                     "shared_write_blocks"):
            sim[name]  # noqa: B018 - each must be there
        if not all(t in sim["hit_rate"] for t in (*sim["tiers"], "total")):
            raise KeyError("hit_rate")
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{point / EXPORT_FILE} is not a readable fleet export ({type(e).__name__}: {e}); "
                        f"{fix}.") from None
    return sim


def launched_runs(point: Path) -> list[Path]:
    """The run folders of run.sh's latest launch (run ids engine-<k>-<launch time>)."""
    launches: dict[int, list[Path]] = {}
    for run in sorted((point / "runs").glob("engine-*-*")):
        engine, _, launch = run.name.removeprefix("engine-").partition("-")
        if engine.isdigit() and launch.isdigit() and (run / "results.json").is_file():
            launches.setdefault(int(launch), []).append(run)
    if not launches:
        raise UserError(f"compare {point}: no run of this fleet point has ended yet; `sh {point / 'run.sh'} URL` "
                        f"runs its engines.")
    return launches[max(launches)]
