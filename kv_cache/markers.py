"""The marker a run leaves on everything it creates outside its own memory, and whether that run still lives.

A run's data directory, report folder and remote namespace each carry a small JSON record naming the run,
its pid, host and process start time, and a state (running, kept). A run that ends removes what it made;
one killed with SIGKILL, or on a host that crashed, leaves it marked ``running``: a later run finds it, says
how much it holds, and ``clean`` removes exactly such leftovers, never anything without our marker.
A shared leaf: the run's folders (run/leftovers.py) and the remote tiers (tiers/remote.py) both write it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import psutil

TOOL = "kv-cache-bench"


def marker_body(run_id: str, state: str = "running") -> dict:
    return {"tool": TOOL, "run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(),
            "started": psutil.Process().create_time(), "state": state}


def is_ours(marker) -> bool:
    return isinstance(marker, dict) and marker.get("tool") == TOOL


def is_alive(marker: dict) -> bool | None:
    """True/False for a marker of this host; None when it names another host (cannot tell)."""
    if marker.get("host") != socket.gethostname():
        return None
    try:
        proc = psutil.Process(int(marker.get("pid", -1)))
        return abs(proc.create_time() - float(marker.get("started", 0))) < 2.0  # not a reused pid
    except (psutil.Error, ValueError, TypeError):
        return False


def leftover(m: dict | None, kept: bool = False) -> bool | None:
    """Is marker m a leftover? None: no; else whether its run was on another host (maybe alive there). A
    leftover is a run marked running whose process is gone, or, with kept, one kept on purpose (--keep-data)."""
    if not is_ours(m) or m.get("state") not in ("running", "kept"):
        return None
    if m.get("state") == "kept":
        return False if kept else None
    alive = is_alive(m)
    return None if alive else alive is None


@dataclass
class Swept:
    """What a clean removed (or would), by why, and the kept-on-purpose ones it left."""

    killed: int = 0
    kept: int = 0
    kept_left: int = 0  # kept with --keep-data, not asked for (clean --kept)

    def __iadd__(self, other: Swept) -> Swept:
        self.killed, self.kept, self.kept_left = (self.killed + other.killed, self.kept + other.kept,
                                                  self.kept_left + other.kept_left)
        return self

    def line(self, what: str, dry_run: bool, where: str = "") -> str:
        """One sentence: 'removed 2 folder(s): 1 left by a killed run, 1 kept with --keep-data.'"""
        parts = [f"{self.killed} left by killed runs"] + ([f"{self.kept} kept with --keep-data"] if self.kept else [])
        out = (f"{'would remove' if dry_run else 'removed'} {self.killed + self.kept} {what}{where}: "
               f"{', '.join(parts)}")
        if self.kept_left:
            out += f"; {self.kept_left} kept with --keep-data stay (clean --kept removes them too)"
        return out + "."


def sweep(leftovers, other_hosts: bool, dry_run: bool, say, remove, describe, kept: bool = False) -> Swept:
    """Remove (with dry_run: list) what dead runs left, and with kept what runs kept on purpose (--keep-data; else
    counted as left); another host's run (maybe alive) only with other_hosts. remove(x) removes one leftover,
    describe(x) names it."""
    out = Swept()
    for x in leftovers:
        if x.kept and not kept:
            out.kept_left += 1
            continue
        if x.other_host and not other_hosts:
            say(f"kept (another host's run; pass --other-hosts once it is surely over): {describe(x)}")
            continue
        if not dry_run:
            remove(x)
        say(f"{'would remove' if dry_run else 'removed'} {describe(x)}")
        if x.kept:
            out.kept += 1
        else:
            out.killed += 1
    return out
