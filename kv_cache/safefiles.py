"""The one way this program writes a file of its own: never through a symbolic link, never half-written.

A path the user names (--output, --xlsx-output, compare --output, ...) or one inside a folder the user names
(the report folder, the cache directory) may be a link placed there on purpose: `ln -s /etc/passwd x.json;
--output x.json` replaced the system file behind it. Every file is written as a new temporary file in the same
folder, created with O_EXCL | O_NOFOLLOW (never an existing file, never through a link), then renamed over the
name: a rename replaces a link itself, not what it points to, and a reader never sees half a file. A final
component that is a link is refused in one sentence; the folders on the way are resolved by the callers' own
checks (tiers/fsinfo.refuse_system_dir resolves links).
"""

from __future__ import annotations

import io
import os
import stat
import threading
from pathlib import Path

from kv_cache.errors import UserError


def refuse_link(path, flag: str) -> None:
    """One sentence when the file's own name is a symbolic link: nothing is written through one."""
    p = Path(path)
    if p.is_symlink():
        raise UserError(f"{flag} {path} is a symbolic link (to {os.readlink(p)}); nothing is written through a "
                        f"link: name a regular file.")


def write_file(path, data: str | bytes, flag: str = "output") -> Path:
    """Write data to path as a new file renamed over the name (see the module's docstring)."""
    p = Path(path)
    refuse_link(p, flag)
    blob = data.encode() if isinstance(data, str) else data
    tmp = p.with_name(f".{p.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UserError(f"{flag} {path}: cannot write there ({e.strerror}).") from None
    return p


def write_with(path, writer, flag: str = "output", binary: bool = False) -> Path:
    """write_file for a writer that fills a stream (csv, matplotlib, openpyxl): writer(stream)."""
    buf = io.BytesIO() if binary else io.StringIO(newline="")
    writer(buf)
    return write_file(path, buf.getvalue(), flag)


def create_marker(path) -> None:
    """An empty marker file of this process's own (its name is this process's), made without following a link:
    one already there as a regular file is the same marker (made again); a link or anything but a regular file
    there is FileExistsError (a planted link truncated its target before)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    except FileExistsError:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise
