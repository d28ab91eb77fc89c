"""Decode-node traffic: the requests a prefill node hands over, read from the handoff manifest.

The manifest (see lifecycle/handoff.py) is followed like ``tail -f``: whole
lines only, each request line becomes a Request carrying its Handoff record,
due when the line is seen. While nothing new arrives the follower yields an
idle tick every 50 ms so the scheduler keeps checking its deadline; it ends
at the prefill node's end line, or after ``wait_s`` without a new line.
"""

from __future__ import annotations

import json
import os
import time
from time import monotonic_ns as now_ns

import numpy as np

from kv_cache.errors import RunFault, UserError
from kv_cache.types import Handoff, Request

POLL_S = 0.005
IDLE_TICK_S = 0.05
EMPTY = np.zeros(0, dtype=np.int64)


def wait_for_manifest(path: str, wait_s: float) -> dict:
    """Block until a prefill node has written the manifest's header; return it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path, "rb") as f:
                line = f.readline()
            if line.endswith(b"\n"):
                return json.loads(line)
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
        self._f = open(path, "rb")  # noqa: SIM115 - kept open while following
        self._f.readline()  # the header, checked by the composition root
        self._partial = b""
        super().__init__(self._next_line, wait_s)

    def _next_line(self, timeout: float) -> dict | None:
        """The next whole line, or None when none came within timeout (a line still being written is kept)."""
        give_up = time.monotonic() + timeout
        while True:
            line = self._f.readline()
            if line.endswith(b"\n"):
                line, self._partial = self._partial + line, b""
                return json.loads(line)
            self._partial += line
            if time.monotonic() >= give_up:
                return None
            time.sleep(POLL_S)

    def close(self) -> None:
        self._f.close()


def _request(h: Handoff, n: int) -> Request:
    return Request(user_id=n, seq=n, turn=0, prompt_tokens=EMPTY, output_tokens=EMPTY, spans=(), handoff=h)
