"""The NVMe tier's file-per-block layout: a block is a file of its own in the cache directory, named by its key,
created and opened a block at a time (and, for a batch, all opened before it and closed after it); a part of the disk
medium (nvme.py's NvmeTier takes these methods)."""

from __future__ import annotations

import errno
import os
import threading

import numpy as np

from kv_cache.errors import BlockVanished, RunFault
from kv_cache.tiers.base import SHARED
from kv_cache.tiers.engines import Target


class BlockFiles:
    """NvmeTier's file-per-block methods (its directory, writer, flags, ops, unit, and _times, _pieces, _moved)."""

    def _file(self, key: int) -> str:
        return os.path.join(self.directory, f"{key:016x}.kv")

    def _file_write(self, key: int, data: np.ndarray) -> None:
        t = self._create(key)
        try:
            self.ops.write(t, 0, data, self.unit, self._times())
        finally:
            os.close(t.fd)
        self._publish(key, t)

    def _create(self, key: int) -> Target:
        """key's file opened for writing: under a private name in a shared folder (renamed once written, so a
        reader in another process never sees half a block)."""
        final = self._file(key)
        path = f"{final}.{self.writer}-{threading.get_ident()}.tmp" if SHARED in self.flags else final
        try:
            # never through a link: a shared folder (the handoff's) is others' to write in too
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | self.ops.open_flags, 0o600)
        except OSError as e:
            raise RunFault(f"cannot create {path}: {e.strerror}"
                           f"{' (a link planted there?)' if e.errno == errno.ELOOP else ''}.") from None
        return Target(path, fd)

    def _publish(self, key: int, t: Target) -> None:
        """A written file under its block's name (a private one renamed)."""
        if t.path != self._file(key):
            os.rename(t.path, self._file(key))

    def _open(self, key: int) -> Target:
        path = self._file(key)
        try:
            return Target(path, os.open(path, os.O_RDONLY | self.ops.open_flags))
        except FileNotFoundError:
            raise BlockVanished(key) from None

    def _file_read(self, key: int, out: np.ndarray) -> None:
        t = self._open(key)
        try:
            self.ops.read(t, 0, out, self.unit, self._times())
        finally:
            os.close(t.fd)

    def _files_many(self, items: list, opener, verb, out: list) -> list:
        """A batch in file-per-block layout: each (n, key, buffer)'s file opened (opener), every I/O handed to the
        engine at once (verb: its write_many or read_many), each file closed; out[n] each one's result. Returns
        (n, key, target) of each block written whole."""
        opened = []
        for n, key, buf in items:
            try:
                opened.append((n, key, buf, opener(key)))
            except Exception as e:  # noqa: BLE001 - this block's result (its file gone, or not creatable)
                out[n] = e
        ios, owner = [], []
        for b, (_, _, buf, t) in enumerate(opened):
            for io in self._pieces(t, 0, buf):
                ios.append(io)
                owner.append(b)
        try:
            self._moved(verb, ios, owner, [n for n, *_ in opened], out)
        finally:
            for *_, t in opened:
                os.close(t.fd)
        return [(n, key, t) for n, key, _, t in opened if not isinstance(out[n], BaseException)]
