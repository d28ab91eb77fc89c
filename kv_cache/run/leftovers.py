"""Markers on the folders a run creates, and what killed runs left behind.

Every data directory (``<cache-dir>/kvbench-<run-id>``) and every reserved
report folder carries a small JSON *marker* naming its run, pid, host and
start time. A run that ends normally removes its data directory (or, with
--keep-data, marks it ``kept``); one killed with SIGKILL, or on a host that
crashed, leaves it with the marker still saying ``running``. A later run in
the same cache directory finds such *leftovers* (the pid is gone, or belongs
to a younger process) and says how much they hold; ``clean`` removes exactly
those folders, never a folder without our marker.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kv_cache.markers import Swept, is_alive, is_ours, leftover, marker_body, sweep
from kv_cache.safefiles import write_file

MARKER = ".kvbench-run.json"
DATA_PREFIX = "kvbench-"


def write_marker(folder: str | os.PathLike, run_id: str, state: str = "running") -> None:
    """Write (atomically) the marker that says which run made folder and whether it is still running."""
    write_file(Path(folder) / MARKER, json.dumps(marker_body(run_id, state)), "marker")


def read_marker(folder: str | os.PathLike) -> dict | None:
    try:
        data = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if is_ours(data) else None


@dataclass(frozen=True)
class Leftover:
    path: str
    run_id: str
    pid: int
    host: str
    started: float
    nbytes: int
    other_host: bool  # a run of another host: maybe alive, never removed without --other-hosts
    kept: bool = False  # kept on purpose (--keep-data): listed only by clean --kept

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started)) if self.started else "?"
        who = f"pid {self.pid} on {self.host}, started {when}" + (", kept with --keep-data" if self.kept else "")
        return f"{self.path}: {self.nbytes / 2**30:.2f} GiB of run {self.run_id} ({who})"


def folder_bytes(path: str) -> int:
    """Bytes a folder really occupies (allocated blocks: preallocated slabs count in full)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def describe_dead(folder: str | os.PathLike) -> str | None:
    """One phrase for a folder a dead (or other-host) run left, or None when it is not such a folder."""
    m = read_marker(folder)
    if m is None or m.get("state") != "running":
        return None
    alive = is_alive(m)
    if alive:
        return f"it belongs to a run that is still running (pid {m.get('pid')})"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(m.get("started") or 0)))
    if alive is None:
        return f"it was made by a run on host {m.get('host')} (pid {m.get('pid')}, started {started}) that may " \
               f"still be running"
    return f"it was left by a run that was killed before it finished (pid {m.get('pid')}, started {started})"


def find_leftovers(parent: str, prefix: str = DATA_PREFIX, kept: bool = False) -> list[Leftover]:
    """Folders under parent (data directories; report folders with prefix '') whose run is gone or on
    another host (with kept: or kept with --keep-data), with their size. Only folders carrying our marker are
    ever listed."""
    out = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return out
    for name in names:
        path = os.path.join(parent, name)
        if not name.startswith(prefix) or not os.path.isdir(path) or os.path.islink(path):
            continue
        m = read_marker(path)
        other_host = leftover(m, kept)
        if other_host is None:  # not ours, alive, or kept on purpose (--keep-data) without kept
            continue
        out.append(Leftover(path, str(m.get("run_id")), int(m.get("pid", -1)), str(m.get("host")),
                            float(m.get("started") or 0), folder_bytes(path), other_host, m.get("state") == "kept"))
    return out


def leftovers_note(cache_dir: str) -> str:
    """One line about what dead runs left in cache_dir, or ''."""
    dead = [x for x in find_leftovers(cache_dir) if not x.other_host]
    if not dead:
        return ""
    gib = sum(x.nbytes for x in dead) / 2**30
    runs = ", ".join(x.run_id for x in dead[:3]) + (" ..." if len(dead) > 3 else "")
    return (f"{len(dead)} killed run(s) left {gib:.2f} GiB in {cache_dir} ({runs}); remove them with "
            f"`kv_cache_benchmark.py clean --cache-dir {cache_dir}`.")


def clean(parent: str, other_hosts: bool, dry_run: bool, say, prefix: str = DATA_PREFIX, kept: bool = False) -> Swept:
    """Remove the folders dead runs left under parent (of other hosts too with other_hosts, kept ones too with
    kept); what it removed, and the kept ones it left."""
    return sweep(find_leftovers(parent, prefix, kept=True), other_hosts, dry_run, say,
                 lambda x: shutil.rmtree(x.path, ignore_errors=True), lambda x: x.describe(), kept)


def set_state(folder: str | os.PathLike, state: str) -> None:
    """Rewrite folder's marker with a new state (kept: --keep-data left it on purpose)."""
    m = read_marker(folder)
    if m is not None:
        m["state"] = state
        write_file(Path(folder) / MARKER, json.dumps(m), "marker")
