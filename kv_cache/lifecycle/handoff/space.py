"""The prefill node's handoff space, whatever carries it (files, registered memory): which blocks are published
and their digests, which requests hold them, and the wait for room.

A block is published once and shared by every request that hands it over. Each request handed over holds its
blocks until a decode node acknowledges that it loaded it; a held block is never replaced, so no reader ever
meets another block's bytes in its slot. A full space makes the publisher wait (timed: op ``wait`` on tier
``handoff``) for an acknowledgement; only when no decode node is (or may yet be) there, or after ``wait_s``, or
when the run's drain ran out, do the oldest held blocks go, each counted as ``handoff.dropped_unread``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from time import monotonic_ns as now_ns

from kv_cache import counters as C
from kv_cache.lifecycle.payload import block_digest

WAITED_NS = 1_000_000  # a wait shorter than this is a lock's hiccup, not backpressure: not recorded


class HandoffSpace:
    """blocks: the store the transport writes into (put, delete, slots_for, slot_bytes, capacity_bytes)."""

    def __init__(self, blocks, keep_released: bool):
        """keep_released: a block no request holds stays until its room is needed (a folder's later readers may
        still find it); else it leaves at once (a slot of registered memory is reused sooner)."""
        self.blocks, self.keep_released = blocks, keep_released
        self._published: OrderedDict[int, int] = OrderedDict()  # key -> bytes (in slots), oldest first
        self._digests: dict[int, int] = {}  # key -> XXH3-64 of the bytes published, while published
        self._writing: dict[int, threading.Event] = {}
        self._holds: dict[int, int] = {}  # key -> requests handed over with it, not yet acknowledged
        self._pins: dict[int, int] = {}   # key -> requests being published with it (not handed over yet)
        self._used = 0
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self.wait_s = 60.0  # the most a publisher waits for room before it drops the oldest unread blocks
        self.readers = lambda: True  # whether a decode node is (or may soon be) there to acknowledge
        self.stopping = lambda: False  # the run's drain ran out: no more waiting
        self.waited_out = False  # a wait ran to its deadline (with no decode node yet: none is coming)

    def publish(self, keys, nbytes, fill, buf, recorder) -> int:
        """Publish the blocks of keys not yet published (fill(key, view) makes their bytes); storage ns."""
        spent = 0
        for key, size in zip(keys, nbytes):
            mine, waiting = self._claim(key, size, recorder)
            if waiting is not None:
                waiting.wait()
            if not mine:
                continue
            data = buf[:size]
            made = now_ns()
            fill(key, data)
            # NOTE: the decode node compares with this (one hash of the block it just read, hot in its cache)
            # instead of regenerating the payload: a 2 MiB block checked in 0.06 ms, not 0.28
            self._digests[key] = block_digest(data)
            recorder.own(now_ns() - made)  # the generator's work: out of the request's latencies
            start = now_ns()
            try:
                self.blocks.put(key, data)
            finally:
                with self._lock:
                    self._writing.pop(key).set()
            spent += now_ns() - start
            recorder.op("handoff", "write", "prefill", start, now_ns() - start, size, key)
        return spent

    def _claim(self, key: int, size: int, recorder=None) -> tuple[bool, threading.Event | None]:
        """(write it myself, event to wait for when another worker is writing it); the request being published
        pins the block until it is handed over."""
        size = self.blocks.slots_for(size) * self.blocks.slot_bytes  # the space is counted in slots
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1
            if key in self._writing:
                return False, self._writing[key]
            if key in self._published:
                self._published.move_to_end(key)  # still referenced: not the oldest any more
                return False, None
            self._make_room(size, recorder)
            self._published[key] = size
            self._used += size
            self._writing[key] = threading.Event()
            return True, None

    def _fits(self, size: int) -> bool:
        return self._used + size <= self.blocks.capacity_bytes

    def _make_room(self, size: int, recorder) -> None:
        """Lock held: free room for size bytes from blocks no request holds; else wait for an acknowledgement (at
        most wait_s, while a decode node is or may be there), then the oldest held blocks go."""
        start = now_ns()
        deadline = time.monotonic() + self.wait_s
        while True:
            for old in list(self._published):  # oldest first; never one a worker is writing now
                if self._fits(size):
                    break
                if old not in self._writing and not self._holds.get(old) and not self._pins.get(old):
                    self._drop(old)
            if self._fits(size):
                break
            left = deadline - time.monotonic()
            # waiting helps only while a decode node is (or may yet be) there and a block waits for its acknowledgement
            if left <= 0 or not self.readers() or not any(self._holds.values()) or self.stopping():
                self.waited_out = self.waited_out or left <= 0
                self._drop_unread(size, recorder)
                break
            self._space.wait(min(left, 0.5))
        if recorder is not None and now_ns() - start > WAITED_NS:
            recorder.op("handoff", "wait", "prefill", start, now_ns() - start, size, 0)

    def _drop_unread(self, size: int, recorder) -> None:
        for old in [k for k in self._published if k not in self._writing]:
            if self._fits(size):
                return
            self._holds.pop(old, None)
            self._drop(old)
            if recorder is not None:
                recorder.count(C.HANDOFF_DROPPED_UNREAD)

    def _drop(self, key: int) -> None:
        self._used -= self._published.pop(key)
        self._digests.pop(key, None)
        self.blocks.delete(key)

    def announce(self, keys, write_line) -> None:
        """A request is handed over with these keys: each is held (no longer pinned) until it is acknowledged, and
        write_line() (its manifest line) runs under the same lock: a line never names a block about to go."""
        with self._lock:
            for key in keys:
                pins = self._pins.get(key, 0) - 1
                if pins > 0:
                    self._pins[key] = pins
                else:
                    self._pins.pop(key, None)
                self._holds[key] = self._holds.get(key, 0) + 1
            write_line()

    def release(self, keys) -> None:
        """A decode node loaded the request these keys were handed over with: its holds go (a block no request
        holds may then be replaced, or leaves at once), and a waiting publisher is woken."""
        with self._lock:
            for key in keys:
                left = self._holds.get(key, 0) - 1
                if left > 0:
                    self._holds[key] = left
                    continue
                self._holds.pop(key, None)
                if (not self.keep_released and key in self._published and key not in self._writing
                        and not self._pins.get(key)):
                    self._drop(key)
            self._space.notify_all()

    def digests(self, keys) -> tuple[int, ...]:
        """The published blocks' digests (0: one not published any more)."""
        with self._lock:
            return tuple(self._digests.get(k, 0) for k in keys)

    @property
    def published(self) -> int:
        return len(self._published)


class OnSpace:
    """What a publisher hands straight to its space (self.space): the lifecycle's publish and digests, and the
    run's drain deadline it stops waiting at."""

    space: HandoffSpace

    @property
    def stopping(self):
        return self.space.stopping

    @stopping.setter
    def stopping(self, due) -> None:
        self.space.stopping = due

    def publish(self, keys, nbytes, fill, buf, recorder) -> int:
        return self.space.publish(keys, nbytes, fill, buf, recorder)

    def run_alone(self) -> None:
        """No decode node came before the clock: a full space drops its oldest unread blocks instead of waiting."""
        self.space.waited_out = True

    def digests(self, keys) -> tuple[int, ...]:
        return self.space.digests(keys)
