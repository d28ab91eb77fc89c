"""The memory this process may use: the host's available memory, or its memory cgroup's room if smaller.

NOTE: in a container (Docker, a Kubernetes pod, a systemd slice) /proc/meminfo is the host's: a pod limited to
8 GiB on a 512 GiB host would pass every check and be killed by the cgroup's OOM killer mid-run. The cgroup's
room is its limit less what it uses that cannot be reclaimed (its usage less its inactive file pages, as
`docker stats` counts it), the smallest over the cgroup and its ancestors (cgroup v2: memory.max / memory.current;
v1: memory.limit_in_bytes / memory.usage_in_bytes).
"""

from __future__ import annotations

from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
V2 = ("memory.max", "memory.current", "inactive_file")
V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
UNLIMITED = 1 << 60  # v1 writes "no limit" as a page-rounded 2^63 - 1


def available_bytes(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """The memory this process may still take: min(the host's available memory, its memory cgroup's room)."""
    host = psutil.virtual_memory().available
    room = cgroup_room(root, proc_cgroup)
    return host if room is None else min(host, room)


def where_from(available: int) -> str:
    """What limits available (for a refusal's sentence): "" for the host, or the cgroup's words."""
    room = cgroup_room()
    return (" (this process's memory cgroup: its limit less what it uses; the host has "
            f"{psutil.virtual_memory().available / 2**30:.2f} GiB)") if room is not None and room <= available else ""


def cgroup_room(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """The memory cgroup's room (None: no limit found, or no cgroup to read)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "" and (root / "cgroup.controllers").exists():
            rooms += _rooms(root, path, V2)
        elif "memory" in controllers.split(","):
            rooms += _rooms(root / "memory", path, V1)
    return min(rooms) if rooms else None


def _rooms(mount: Path, path: str, names: tuple[str, str, str]) -> list[int]:
    """Each limited cgroup's room from the process's own up to the mount (in a container, whose cgroup namespace
    shows "/", the mount itself is its cgroup)."""
    out, here = [], (mount / path.strip("/")) if path.strip("/") else mount
    while True:
        room = _room(here, names)
        if room is not None:
            out.append(room)
        if here == mount or mount not in here.parents:
            return out
        here = here.parent


def _room(folder: Path, names: tuple[str, str, str]) -> int | None:
    limit_name, usage_name, inactive_name = names
    try:
        limit = (folder / limit_name).read_text().strip()
        if limit == "max" or int(limit) >= UNLIMITED:
            return None
        usage = int((folder / usage_name).read_text().strip())
    except (OSError, ValueError):
        return None
    inactive = 0
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_name:
                inactive = int(value)
    except (OSError, ValueError):
        pass
    return max(0, int(limit) - max(0, usage - inactive))
