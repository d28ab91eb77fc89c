"""What filesystem a directory is on, and whether it accepts O_DIRECT.

NOTE: tmpfs accepts O_DIRECT since Linux 6.6, so EINVAL cannot be used to
detect RAM-backed directories: we read the filesystem type from mountinfo.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from kv_cache.buffers import aligned_buffer
from kv_cache.errors import UserError

RAM_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"}


@dataclass(frozen=True)
class MountInfo:
    mount_point: str
    fs_type: str
    source: str
    options: str


def _unescape(s: str) -> str:
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_of(path: str) -> MountInfo:
    """The mount holding path (longest mount point that prefixes its real path)."""
    real = os.path.realpath(path)
    best = MountInfo("/", "unknown", "", "")
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 2:
            continue
        point = _unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.mount_point):
            best = MountInfo(point, tail[0], tail[1], fields[5] + ("," + tail[2] if len(tail) > 2 else ""))
    return best


def probe_direct(directory: str) -> str | None:
    """Try one aligned O_DIRECT write and read; return None if it works, else why not."""
    if not hasattr(os, "O_DIRECT"):
        return "this platform has no O_DIRECT"
    path = os.path.join(directory, ".odirect-probe")
    buf = aligned_buffer(4096)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_DIRECT, 0o600)
    except OSError as e:
        return f"open with O_DIRECT failed ({e.strerror})"
    try:
        os.pwritev(fd, [memoryview(buf)], 0)
        os.preadv(fd, [memoryview(buf)], 0)
        return None
    except OSError as e:
        return f"O_DIRECT I/O failed ({errno.errorcode.get(e.errno, e.errno)}: {e.strerror})"
    finally:
        os.close(fd)
        os.unlink(path)


# System folders: a 4 GiB slab there can break the host. /dev is refused but for /dev/shm (a RAM
# folder: refused by the tmpfs rule unless --allow-tmpfs). The user's own folders below / are fine.
SYSTEM_TREES = ("/etc", "/usr", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sys",
                "/dev", "/var/lib", "/var/log", "/var/cache", "/var/spool", "/run", "/snap")
SYSTEM_ROOTS = ("/", "/root", "/home", "/var", "/opt", "/srv")
ALLOWED_IN_SYSTEM = ("/dev/shm",)


BULK = ("the benchmark writes GiB of data there: pass a folder of its own on the device under test (e.g. "
        "/mnt/nvme/kvbench)")
FILES = "pass a folder of your own (e.g. under reports/)"


def refuse_system_dir(path: str, flag: str = "--cache-dir", advice: str = BULK) -> None:
    """Refuse a system folder (or the top of a shared one) as the place to write data."""
    real = os.path.realpath(path)
    inside = [t for t in SYSTEM_TREES if real == t or real.startswith(t + "/")]
    allowed = any(real == a or real.startswith(a + "/") for a in ALLOWED_IN_SYSTEM)
    if (inside and not allowed) or real in SYSTEM_ROOTS:
        what = f"{path} (= {real})" if real != os.path.abspath(path) else path
        raise UserError(f"{flag} {what} is a system folder; {advice}.")
