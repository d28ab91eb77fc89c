"""Reading a file the user named: a regular file, of bounded size, holding text.

A FIFO or a terminal would make a read wait forever, /dev/zero would fill the memory, a binary or UTF-16
file would print mojibake in an error. Each is refused in one sentence before it is read. A shared leaf.
"""

from __future__ import annotations

import os
import stat

from kv_cache.errors import UserError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
SNIFF_BYTES = 4096
_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")  # UTF-16 LE / BE, UTF-32 BE (its LE form starts as 16's)


def runs_inside(folder, name: str) -> list[str]:
    """The subfolders of folder (a Path) holding a file name: the runs of a --trials or a policies folder, which
    holds none of its own."""
    return sorted(d.name for d in folder.iterdir() if (d / name).is_file())


def check_regular(path: str, what: str, fix: str) -> int:
    """Refuse anything but an existing regular file; return its size. what: 'config file'; fix: what to pass."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist; {fix}.") from None
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({e.strerror}); {fix}.") from None
    for test, kind in _KINDS:
        if test(st.st_mode):
            raise UserError(f"{what} {path} is {kind}, not a regular file; {fix}.")
    return st.st_size


def not_text(head: bytes) -> bool:
    """True for bytes no UTF-8 text file starts with: a NUL (binary, UTF-16/32) or a UTF-16/32 byte-order mark."""
    return b"\x00" in head or head.startswith(_BOMS)


def read_text(path: str, what: str, limit: int, fix: str) -> str:
    """The file's text (UTF-8), refused in one sentence if it is not a regular file, larger than limit bytes,
    binary or UTF-16, or not UTF-8."""
    size = check_regular(path, what, fix)
    if size > limit:
        raise UserError(f"{what} {path} is {size:,} bytes, more than the {limit:,} such a file can be; {fix}.")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)  # a file that grew (or a /proc file that reports size 0) is still bounded
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({e.strerror}); {fix}.") from None
    if len(data) > limit:
        raise UserError(f"{what} {path} holds more than the {limit:,} bytes such a file can be; {fix}.")
    if not_text(data[:SNIFF_BYTES]):
        raise UserError(f"{what} {path} is not text (binary or UTF-16); {fix}.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {e.start}); {fix}.") from None


def check_text_file(path: str, what: str, fix: str) -> None:
    """A regular file whose first bytes are text (for files read as a stream, of any size)."""
    check_regular(path, what, fix)
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({e.strerror}); {fix}.") from None
    if not_text(head):
        raise UserError(f"{what} {path} is not text (binary or UTF-16); {fix}.")
