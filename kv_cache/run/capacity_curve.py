"""--capacity-curve on a run, and `kv_cache_benchmark.py capacity RUN [RUN ...]`: the hit rate and storage demand at
every capacity of the bottom tier (recorder/stack_distances.py computes, report/capacity.py renders; this composes).

A run keeps its block accesses in capacity_access.npz beside results.json. `capacity` recomputes the curve from
one run, or from several runs' accesses merged in wall-clock order of their requests: the tier they would share
(a Valkey or S3 tier under N prefill nodes) seen by all of them, their own tiers above it pooled (modelled: each
node's upper tiers are its own; pooling them is the model, said in the output).
"""

from __future__ import annotations

import io
import json
import time
import zipfile
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from kv_cache.errors import UserError
from kv_cache.hostmemory import available_bytes
from kv_cache.inputs import check_regular, read_text, runs_inside
from kv_cache.model import GiB
from kv_cache.recorder.access_log import in_order
from kv_cache.recorder.results_schema import RESULTS_LIMIT, Results
from kv_cache.recorder.stack_distances import (
    CapacityCurve,
    Curve,
    capacity_grid,
    columns_of,
    curve,
    in_window,
    recorded_rate,
    request_counts,
    sample,
    served_order,
)
from kv_cache.recorder.typed import load_section
from kv_cache.run.replays import replay_many
from kv_cache.safefiles import write_file

ACCESS_FILE = "capacity_access.npz"


def attach(results: Results, recorder, tiers: list, folder: Path, policy: str, policies: dict) -> None:
    """The run's curve into results.capacity_curve, its accesses into folder/capacity_access.npz (policies: the
    registry's table: whether policy has the stack property, and its class to replay)."""
    if recorder.accesses is None:
        return
    log = recorder.accesses.arrays()
    bottom = tiers[-1]
    upper = sum(t.capacity_bytes // t.slot_bytes for t in tiers[:-1])
    meta = {"upper_slots": upper, "slot_bytes": bottom.slot_bytes,
            "run_slots": bottom.capacity_bytes // bottom.slot_bytes,
            "window_ns": [recorder.measure_start_ns or 0, recorder.measure_end_ns or 0],
            "window_s": results.run.duration_s, "requests_per_s": results.requests.per_s, "policy": policy,
            "tiers": [[t.name, t.capacity_bytes] for t in tiers], "workers": results.run.workers,
            "wall_minus_monotonic_ns": time.time_ns() - time.monotonic_ns()}
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.array(json.dumps(meta)), **log)
    folder.mkdir(parents=True, exist_ok=True)
    write_file(folder / ACCESS_FILE, buf.getvalue(), "--capacity-curve's access log")
    results.capacity_curve = section(log, meta, policies)


def section(log: dict, meta: dict, policies: dict, model: str = "LRU stack distances") -> CapacityCurve:
    """The curve of the log: LRU's stack distances (exact unless sampled) where the run's policy has the stack
    property (policies/protocol.py), else the policy replayed on accounting tiers. The bottom tier's share of the
    hits, its reads and its writes: the cache replayed (at every capacity of a replayed policy; for LRU at up to
    DEMAND_POINTS of them, the run's own and the knees first)."""
    upper, slot = meta["upper_slots"], meta["slot_bytes"]
    policy = policies.get(meta["policy"])
    sampled = recorded_rate(log) < 1.0
    replayed = policy is not None and not policy.stack_property and "tiers" in meta and not sampled
    if policy is not None and not policy.stack_property and sampled:
        model = (f"LRU stack distances ({meta['policy']}, the run's policy, is replayed only from a whole log: this "
                 f"one is a SHARDS sample)")
    if replayed:  # no stack for it: replayed at a coarser grid, the run's own in it
        grid = np.union1d(capacity_grid(log, upper, POLICY_POINTS), [meta["run_slots"]])
        c = _replayed(log, meta, grid, policy)
        model = f"{meta['policy']} replayed on accounting tiers at {len(grid)} capacities"
        demand = f"the same replays (each {meta['policy']} on the run's tiers)"
    else:  # the run's own capacity and the exact knees among the grid's
        grid = np.union1d(capacity_grid(log, upper), [meta["run_slots"]])
        c = curve(log, upper, grid, tuple(meta["window_ns"]), with_knees=True)
        demand = _replay_demand(c, log, meta, policy or policies["lru"])
    grid = c.capacities
    seconds = max(meta["window_s"], 1e-9)
    points = []
    for i, x in enumerate(grid):
        rd, wr = c.read_blocks[i], c.write_blocks[i]
        points.append({"slots": int(x), "gib": x * slot / GiB, "hit_rate": float(c.hit_rate[i]),
                       "bottom_hit_rate": _replayed_or_none(c.bottom_hit_rate[i]),
                       "by_source": {k: float(v[i]) for k, v in c.by_source.items()},
                       "read_gbps": _replayed_or_none(rd, slot / seconds / 1e9),
                       "write_gbps": _replayed_or_none(wr, slot / seconds / 1e9),
                       "read_iops": _replayed_or_none(rd, 1 / seconds),
                       "write_iops": _replayed_or_none(wr, 1 / seconds),
                       "bytes_per_request": _replayed_or_none(rd + wr, slot / max(c.requests, 1))})
    return load_section(CapacityCurve, {
        "model": model, "replayed": replayed, "sample_rate": c.sampled, "policy": meta["policy"],
        "tiers_above_slots": int(upper),
        "slot_bytes": int(slot), "requests": c.requests, "requests_per_s": meta["requests_per_s"],
        "run_slots": int(meta["run_slots"]), "infinite_hit_rate": c.infinite,
        "knee_90_slots": c.knees[0], "knee_99_slots": c.knees[1], "demand_model": demand, "points": points,
        "served_order": _served_order(log, meta)},
        "capacity_curve")


def _served_order(log: dict, meta: dict) -> dict | None:
    """How far from their arrival order the queue served the requests; where it left it, the LRU curve of the same
    requests in arrival order beside (its knees, its hit rate at the run's capacity): the arrivals' own answer."""
    window = tuple(meta["window_ns"])
    order = served_order(log, window, meta["workers"]) if "workers" in meta else None
    if order is None or not order.late:
        return None if order is None else asdict(order)
    upper, run = meta["upper_slots"], meta["run_slots"]
    grid = np.union1d(capacity_grid(log, upper), [run])
    arrival = curve(in_order(log, "request_arrived"), upper, grid, window, with_knees=True)
    at_run = float(arrival.hit_rate[np.searchsorted(arrival.capacities, run)])
    return asdict(replace(order, arrival_knee_90_slots=arrival.knees[0], arrival_knee_99_slots=arrival.knees[1],
                          arrival_hit_rate_at_run=at_run))


def _replayed_or_none(value: float, scale: float = 1.0) -> float | None:
    """A point's demand figure (value x scale), or None where its capacity was not replayed (NaN)."""
    return None if np.isnan(value) else float(value * scale)


POLICY_POINTS = 12  # capacities a policy other than LRU is replayed at (each a whole replay)
DEMAND_POINTS = 8  # capacities an LRU curve's bottom-tier demand is replayed at
REPLAY_BUDGET = 2_000_000  # accesses replayed for it in all (~85 us each on one core): fewer points past it


def _replay_demand(c: Curve, log: dict, meta: dict, policy: type) -> str:
    """Fill c's bottom-tier share, reads and writes by replaying the cache at some of its capacities (the run's own
    and the knees first, then spread over the grid); the others stay NaN. Returns what was done, in words."""
    if "tiers" not in meta:
        return "not modelled: this access log names no tiers (written by an older version)"
    if recorded_rate(log) < 1.0:
        return (f"not modelled: the access log is a SHARDS sample (rate {recorded_rate(log):.4g}: it passed "
                f"--capacity-log-accesses), and a replay needs every access")
    accesses = max(len(log["keys"]), 1)
    n = min(DEMAND_POINTS, len(c.capacities), REPLAY_BUDGET // accesses)
    if n == 0:
        return (f"not modelled: a replay of {accesses:,} accesses is past this tool's budget of {REPLAY_BUDGET:,} "
                f"(stack distances give the hit rate, not the waterfall's reads and writes)")
    chosen = _demand_slots(c.capacities, [meta["run_slots"], *c.knees], n)
    for x, r in zip(chosen, replay_many(log, meta, chosen, policy)):
        i = int(np.searchsorted(c.capacities, x))
        c.bottom_hit_rate[i], c.read_blocks[i], c.write_blocks[i] = r.bottom_hit_rate, r.reads, r.writes
    return (f"the cache replayed on accounting tiers at {len(chosen)} of the {len(c.capacities)} capacities (its "
            f"waterfall: prefix-held blocks, promotion out of the bottom tier, demotion into it); '-' at the others")


def _demand_slots(capacities: np.ndarray, first: list, n: int) -> list[int]:
    """n of the capacities: those of first that are among them, then evenly spread over the grid."""
    out = [int(x) for x in dict.fromkeys(first) if x is not None and x in capacities]
    for i in np.linspace(0, len(capacities) - 1, n).round().astype(int):
        if len(out) < n and int(capacities[i]) not in out:
            out.append(int(capacities[i]))
    return sorted(out[:n])


def _replayed(log: dict, meta: dict, grid: np.ndarray, policy: type) -> Curve:
    """The curve of the run's policy (its class) by replaying the log at each capacity of grid
    (cache/simulate.py)."""
    window = tuple(meta["window_ns"])
    *runs, room = replay_many(log, meta, [*grid, int(grid[-1] + 1) * 4], policy)
    top = room.hit_rate  # room for every block: its infinite cache
    rates_a = np.array([r.hit_rate for r in runs])
    knees = tuple(next((int(x) for x, r in zip(grid, rates_a) if r >= share * top - 1e-12), None)
                  for share in (0.90, 0.99))
    requests = int(request_counts(log)[in_window(log["requests"][:, 2], window)].sum())
    return Curve(grid, rates_a, np.array([r.bottom_hit_rate for r in runs]), {},
                 np.array([r.reads for r in runs], float), np.array([r.writes for r in runs], float), top, 1.0,
                 requests, knees)


def load_run(folder: Path) -> tuple[dict, dict]:
    """(access log, meta) of a run folder, or one sentence."""
    path = folder / ACCESS_FILE
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder; pass the run folder a --capacity-curve run wrote.")
    if not path.is_file():
        inside = runs_inside(folder, ACCESS_FILE)
        if inside:  # --trials' folder (trial-<k>/) or the policies sub-command's (one a policy)
            raise UserError(f"{folder} holds no {ACCESS_FILE} of its own but its runs' ({', '.join(inside)}): pass "
                            f"one of them ({folder / inside[0]}).")
        raise UserError(f"{folder} has no {ACCESS_FILE}: run it with --capacity-curve (add --null-io to analyse the "
                        f"traffic without moving bytes).")
    check_regular(str(path), "capacity access log", "run with --capacity-curve again")
    try:
        with np.load(path, allow_pickle=False) as z:
            _unpacked_fits(z, path)
            meta = json.loads(str(z["meta"]))
            log = {k: z[k] for k in ARRAYS}
            log.update({k: z[k] for k in OPTIONAL if k in z.files})  # a log of an older version lacks them
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile, AttributeError) as e:
        raise UserError(f"{path} is not a capacity access log this tool wrote ({type(e).__name__}).") from None
    why = _malformed(log, meta)
    if why:
        raise UserError(f"{path} is not a capacity access log this tool wrote ({why}).")
    return log, meta


ARRAYS = ("keys", "parents", "lookup", "tokens", "requests")
# each access's plan label (a replay's) as codes into the names, its place in the plan, the token columns' sources
OPTIONAL = ("labels", "label_names", "plan_pos", "source_names", "request_tokens", "request_counts", "request_started",
            "request_arrived", "request_dequeued", "sample_rate")
META = {"upper_slots": int, "slot_bytes": int, "run_slots": int, "window_ns": list, "window_s": (int, float),
        "requests_per_s": (int, float), "policy": str, "wall_minus_monotonic_ns": int}


def _unpacked_fits(z, path: Path) -> None:
    """An archive whose arrays would unpack past half the free memory is refused before any is read (a zip of
    zeros asked 12 GiB)."""
    need = sum(info.file_size for info in z.zip.infolist())
    room = available_bytes() // 2
    if need > room:
        raise UserError(f"{path} would unpack to {need / 2**30:.2f} GiB, more than half the {2 * room / 2**30:.2f} "
                        f"GiB of memory free; not a log this tool wrote on this scale (or free memory).")


def _malformed(log: dict, meta) -> str:
    """Why a log's arrays and meta are not what attach() writes ("" when they are): shapes, kinds, ranges."""
    if not isinstance(meta, dict):
        return "its meta is not a mapping"
    for key, kind in META.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            return f"meta {key} is {meta.get(key)!r}"
    if meta["slot_bytes"] <= 0 or meta["upper_slots"] < 0 or meta["run_slots"] < 0 or meta["requests_per_s"] < 0:
        return "a size or a rate in its meta is not positive"
    tiers = meta.get("tiers", [["bottom", 0]])
    if not isinstance(tiers, list) or not tiers or not all(
            isinstance(t, list) and len(t) == 2 and isinstance(t[0], str) and isinstance(t[1], int) and t[1] >= 0
            for t in tiers):
        return f"meta tiers is {str(tiers)[:80]}"
    n, reqs = len(log["keys"]), log["requests"]
    if log["keys"].ndim != 1 or any(len(log[k]) != n for k in ("parents", "lookup", "tokens")):
        return "its access arrays differ in length"
    if log["tokens"].ndim != 2 or reqs.ndim != 2 or reqs.shape[1] != 3 or not np.issubdtype(reqs.dtype, np.integer):
        return "its arrays are not of the shapes it writes"
    if len(reqs) and (reqs[0, 0] != 0 or (np.diff(reqs[:, 0]) < 0).any() or reqs[-1, 0] > n):
        return "its requests index past its accesses"
    if "plan_pos" in log and len(log["plan_pos"]) != n:
        return "its plan positions differ in length from its accesses"
    if len(columns_of(log)) != log["tokens"].shape[1]:
        return "its token columns do not match its source names"
    if "request_tokens" in log and (log["request_tokens"].shape != (len(reqs), log["tokens"].shape[1])
                                    or not np.issubdtype(log["request_tokens"].dtype, np.integer)):
        return "its requests' tokens differ in shape or kind from its requests"
    counts = log.get("request_counts")
    if counts is not None and (counts.shape != (len(reqs),) or not np.issubdtype(counts.dtype, np.integer)
                               or (len(counts) and counts.min() < 1)):
        return "its requests' counts differ in shape or kind from its requests"
    for name, what in (("request_started", "lookup"), ("request_arrived", "arrival"), ("request_dequeued", "dequeue")):
        times = log.get(name)
        if times is not None and (times.shape != (len(reqs),) or not np.issubdtype(times.dtype, np.integer)):
            return f"its requests' {what} times differ in shape or kind from its requests"
    rate = log.get("sample_rate")
    if rate is not None and (rate.shape != () or not np.issubdtype(rate.dtype, np.floating)
                             or not 0.0 < float(rate) <= 1.0):
        return "its sampling rate is not a number in (0, 1]"
    if "labels" in log and (len(log["labels"]) != n or (n and not 0 <= log["labels"].min() <= log["labels"].max()
                                                               < len(log.get("label_names", ())))):
        return "its labels index past its label names"
    return ""


def merged(runs: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """Several runs' accesses as one stream, their requests in wall-clock order of their lookups (of completion in
    a log written before it kept them); the tiers above the shared one pooled, the rates summed."""
    rate = min(recorded_rate(log) for log, _ in runs)
    if rate < 1.0:  # one is a SHARDS sample: each at the lowest rate (the same hash keeps the same blocks in all)
        runs = [(_at_rate(log, rate), meta) for log, meta in runs]
    rows = []  # (wall ns of its lookup, run, request index)
    for r, (log, meta) in enumerate(runs):
        wall = log.get("request_started", log["requests"][:, 2]) + meta["wall_minus_monotonic_ns"]
        rows += [(int(w), r, i) for i, w in enumerate(wall)]
    rows.sort()
    columns = {columns_of(log) for log, _ in runs}
    if len(columns) > 1:
        raise UserError("these runs' access logs count tokens by different sources (written by different versions); "
                        "rerun them with this version's --capacity-curve.")
    keys, parents, lookup, tokens, reqs, labels, places, looked, counts = [], [], [], [], [], [], [], [], []
    started = []
    each = [request_counts(log) for log, _ in runs]
    pos = 0
    for wall, r, i in rows:
        log = runs[r][0]
        first = log["requests"][i, 0]
        end = log["requests"][i + 1, 0] if i + 1 < len(log["requests"]) else len(log["keys"])
        keys.append(log["keys"][first:end])
        parents.append(log["parents"][first:end])
        lookup.append(log["lookup"][first:end])
        tokens.append(log["tokens"][first:end])
        if "plan_pos" in log:
            places.append(log["plan_pos"][first:end])
        if "labels" in log:
            labels.append(log["label_names"][log["labels"][first:end]])
        reqs.append((pos, log["requests"][i, 1], log["requests"][i, 2] + runs[r][1]["wall_minus_monotonic_ns"]))
        started.append(wall)
        if "request_tokens" in log:
            looked.append(log["request_tokens"][i])
        counts.append(each[r][i])
        pos += end - first
    windows = [(m["window_ns"][0] + m["wall_minus_monotonic_ns"], m["window_ns"][1] + m["wall_minus_monotonic_ns"])
               for _, m in runs]
    meta = {"upper_slots": sum(m["upper_slots"] for _, m in runs), "slot_bytes": runs[0][1]["slot_bytes"],
            "run_slots": runs[0][1]["run_slots"], "window_ns": [min(w[0] for w in windows), max(w[1] for w in windows)],
            "window_s": max(m["window_s"] for _, m in runs),
            "requests_per_s": sum(m["requests_per_s"] for _, m in runs),
            "policy": runs[0][1]["policy"], "wall_minus_monotonic_ns": 0}
    if all("tiers" in m for _, m in runs):  # the tiers above pooled into one (the model the output says)
        bottom = runs[0][1]["tiers"][-1][0]
        above = sum(m["upper_slots"] for _, m in runs) * meta["slot_bytes"]
        meta["tiers"] = ([["pooled", above]] if above else []) + [[bottom, 0]]
    out = {"keys": np.concatenate(keys), "parents": np.concatenate(parents), "lookup": np.concatenate(lookup),
           "tokens": np.concatenate(tokens), "requests": np.array(reqs, np.int64).reshape(len(reqs), 3),
           "request_counts": np.array(counts, np.int64), "request_started": np.array(started, np.int64)}
    out["source_names"] = np.array(columns.pop(), dtype=str)
    if all("request_tokens" in log for log, _ in runs):
        out["request_tokens"] = np.array(looked, np.int64).reshape(len(reqs), out["tokens"].shape[1])
    if rate < 1.0:
        out["sample_rate"] = np.array(rate)
    if all("plan_pos" in log for log, _ in runs):
        out["plan_pos"] = np.concatenate(places)
    if all("labels" in log for log, _ in runs):  # the runs' own label codes, as one set of names
        out["label_names"], out["labels"] = np.unique(np.concatenate(labels), return_inverse=True)
    return out, meta


def _at_rate(log: dict, rate: float) -> dict:
    """A log as a SHARDS sample at rate (at most its own), with each request's lookup tokens taken whole first."""
    if "request_tokens" in log:
        whole = log["request_tokens"]
    else:  # a whole log of an older version: its requests' lookup tokens from its accesses
        req_of = np.searchsorted(log["requests"][:, 0], np.arange(len(log["keys"])), side="right") - 1
        whole = np.zeros((len(log["requests"]), log["tokens"].shape[1]), np.int64)
        np.add.at(whole, req_of[log["lookup"]], log["tokens"][log["lookup"]])
    return {**sample(log, rate), "request_tokens": whole, "sample_rate": np.array(rate)}


def _results_of(folder: Path) -> Results:
    """The run's results.json, bounded and checked against its schema: one sentence for a damaged or foreign one."""
    path = folder / "results.json"
    text = read_text(str(path), "results file", RESULTS_LIMIT, "pass the run folder --capacity-curve wrote")
    try:
        return Results.from_dict(json.loads(text), str(path))
    except (ValueError, TypeError, AttributeError) as e:  # SchemaError is a ValueError
        raise UserError(f"{path} is not a results file this version reads ({str(e)[:200]}).") from None



def run_capacity(folders: list[str], output: str | None, say, policies: dict) -> int:
    """`capacity RUN [RUN ...]`: the table, and capacity_curve.png in --output (default: the first run's folder)."""
    from kv_cache.report.capacity import capacity_lines, draw_capacity
    from kv_cache.report.figure import save

    seen: dict[Path, str] = {}
    for f in folders:  # one run given twice would count as two nodes sharing the tier
        where = Path(f).resolve()
        if where in seen:
            raise UserError(f"capacity: {f} and {seen[where]} are the same run; a merged curve needs different "
                            f"runs (each node's own), each named once.")
        seen[where] = f
    runs = [load_run(Path(f)) for f in folders]
    slots = {m["slot_bytes"] for _, m in runs}
    if len(slots) > 1:
        raise UserError(f"these runs moved blocks of different sizes ({', '.join(str(s) for s in sorted(slots))} "
                        f"bytes): one tier holds one block size; compare runs of one --model and --block-tokens.")
    log, meta = merged(runs) if len(runs) > 1 else runs[0]
    model = "LRU stack distances" if len(runs) == 1 else (f"LRU stack distances of {len(runs)} runs merged in "
                                                          f"wall-clock order; their upper tiers pooled (modelled)")
    results = _results_of(Path(folders[0]))
    results.capacity_curve = section(log, meta, policies, model)
    for line in capacity_lines(results, own=len(runs) == 1):
        say(line)
    fig = draw_capacity(results)
    out = Path(output) if output else Path(folders[0])
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--output {out}: cannot make the folder ({e.strerror}); pass a writable folder.") from None
    if fig is not None:
        say(f"plot: {save(fig, out, 'capacity_curve.png')}")
    return 0
