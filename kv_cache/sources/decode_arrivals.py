"""Decode-node traffic: the requests a prefill node hands over, read from the handoff manifest.

The manifest (see lifecycle/handoff/folder.py) is followed like ``tail -f``: whole
lines only, each request line becomes a Request carrying its Handoff record,
due when the line is seen. While nothing new arrives the follower yields an
idle tick every 50 ms so the scheduler keeps checking its deadline; it ends
at the prefill node's end line, or after ``wait_s`` without a new line.
"""

from __future__ import annotations

import json
import os
import stat
import time
from time import monotonic_ns as now_ns

import numpy as np

from kv_cache.errors import RunFault, UserError
from kv_cache.types import Handoff, Request

POLL_S = 0.005
IDLE_TICK_S = 0.05
EMPTY = np.zeros(0, dtype=np.int64)
MAX_LINE = 16 << 20  # one manifest line: a request's keys and digests (a million-token prompt's is a few MiB)


def open_manifest(path: str):
    """The manifest, opened for reading as a regular file only: never through a link, and never a FIFO (whose
    open and reads would wait past --disagg-wait-s) nor a device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UserError(f"{path} is not a prefill node's manifest ({e.strerror}: a link planted there?); remove "
                        f"it, or pass the folder a prefill node writes.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{path} is not a prefill node's manifest (not a regular file: a FIFO or a device planted "
                        f"there?); remove it, or pass the folder a prefill node writes.")
    return os.fdopen(fd, "rb")


def _record(line: bytes, path: str) -> dict:
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise RunFault(f"{path} holds a line that is not a manifest record ({line[:60]!r}...): not a prefill "
                       f"node's manifest, or a damaged one.")
    return record


def wait_for_manifest(path: str, wait_s: float) -> dict:
    """Block until a prefill node has written the manifest's header; return it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open_manifest(path) as f:
                line = f.readline(MAX_LINE)
            if line.endswith(b"\n"):
                try:
                    return _record(line, path)
                except RunFault as e:
                    raise UserError(str(e)) from None
            if len(line) >= MAX_LINE:
                raise UserError(f"{path}: its first line runs past {MAX_LINE:,} bytes without an end; not a "
                                f"prefill node's manifest.")
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            raise UserError(f"no prefill node published into {os.path.dirname(path)} within {wait_s:g} s; start "
                            f"a --role prefill run with the same --handoff-dir (or raise --disagg-wait-s).")
        time.sleep(0.05)


class RecordFollower:
    """Open-loop arrivals from manifest records a link delivers (next_record(timeout) -> dict or None): the
    NIXL handoff's side channel. A link lost before the manifest's end stops the run as a fault."""

    def __init__(self, next_record, wait_s: float):
        self.next_record, self.wait_s = next_record, wait_s
        self._origin = now_ns()
        self._last_news = time.monotonic()
        self.records = 0
        self.ended = False

    def start(self, origin_ns: int) -> None:
        self._origin = origin_ns

    def close(self) -> None:
        """The source is done with (its end, or no news for wait_s)."""

    def __iter__(self):
        return self

    def __next__(self):
        rec = self.next_record(IDLE_TICK_S)
        offset = (now_ns() - self._origin) / 1e9
        if rec is None:
            if time.monotonic() - self._last_news > self.wait_s:
                self.close()
                raise StopIteration
            return offset, None
        self._last_news = time.monotonic()
        if rec["kind"] == "lost":
            raise RunFault(rec["why"])
        if rec["kind"] == "end":
            self.ended = True
            self.close()
            raise StopIteration
        if rec["kind"] != "request":
            return offset, None
        self.records += 1
        h = Handoff.from_dict(rec)
        return offset, lambda h=h, n=self.records: _request(h, n)


class ManifestFollower(RecordFollower):
    """Open-loop arrivals from a growing manifest file (the folder handoff): its lines as records."""

    def __init__(self, path: str, wait_s: float):
        self.path = path
        self._f = open_manifest(path)  # kept open while following
        self._f.readline(MAX_LINE)  # the header, checked by the composition root
        self._partial = b""
        super().__init__(self._next_line, wait_s)

    def _next_line(self, timeout: float) -> dict | None:
        """The next whole line, or None when none came within timeout (a line still being written is kept)."""
        give_up = time.monotonic() + timeout
        while True:
            line = self._f.readline(MAX_LINE)
            if line.endswith(b"\n"):
                line, self._partial = self._partial + line, b""
                return _record(line, self.path)
            self._partial += line
            if len(self._partial) > MAX_LINE:  # a line that never ends: not a prefill node writing
                raise RunFault(f"{self.path}: a line runs past {MAX_LINE:,} bytes without an end; not a prefill "
                               f"node's manifest, or a damaged one.")
            if time.monotonic() >= give_up:
                return None
            time.sleep(POLL_S)

    def close(self) -> None:
        self._f.close()


def _request(h: Handoff, n: int) -> Request:
    return Request(user_id=n, seq=n, turn=0, prompt_tokens=EMPTY, output_tokens=EMPTY, spans=(), handoff=h)
