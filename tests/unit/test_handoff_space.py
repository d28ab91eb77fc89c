"""The prefill node's handoff space (lifecycle/handoff/space.py), transport-free, over a real CPU tier."""

import queue
import threading
import time

import numpy as np

from kv_cache.lifecycle.handoff.space import HandoffSpace
from kv_cache.lifecycle.payload import PayloadPool, block_digest
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.cpu import CpuTier

SLOT = 64 * 1024


def _space(slots: int) -> tuple[HandoffSpace, Recorder]:
    rec = Recorder()
    rec.start_measuring(1)
    return HandoffSpace(CpuTier(slots * SLOT, SLOT), keep_released=False), rec


def test_a_fast_publisher_and_a_slow_reader_never_meet_a_replaced_block():
    """Issue 38, items 1-2: a publisher flat out into 4 slots and a reader 20x slower. Every block the reader
    reads is the one published under its key (its digest), none is missing, and the publisher waited (recorded
    as the handoff's "wait") instead of replacing what the reader had not read."""
    space, rec = _space(4)
    pool, handed = PayloadPool(seed=1, span_bytes=SLOT), queue.Queue()
    buf = np.empty(SLOT, np.uint8)

    def prefill():
        for r in range(30):
            keys = (1000 + 2 * r, 1001 + 2 * r)
            space.publish(keys, (SLOT, SLOT), pool.fill, buf, rec)
            digests = space.digests(keys)
            space.announce(keys, lambda keys=keys, digests=digests: handed.put((keys, digests)))
        handed.put(None)

    threading.Thread(target=prefill, daemon=True).start()
    out, read, bad = np.empty(SLOT, np.uint8), 0, []
    while (item := handed.get(timeout=30)) is not None:
        keys, digests = item
        time.sleep(0.005)  # the slow decode node
        for key, digest in zip(keys, digests):
            space.blocks.get(key, out)
            if block_digest(out) != digest or digest == 0:
                bad.append(key)
            read += 1
        space.release(keys)
    assert read == 60 and bad == []
    assert rec.counters().get("handoff.dropped_unread", 0) == 0
    assert rec.counters()["ops.handoff.wait"] > 0


def test_with_no_reader_the_publisher_drops_the_oldest_held_blocks_and_counts_them():
    """No decode node is (or will be) there: waiting helps nobody, so the oldest held blocks go at once, each
    counted as dropped unread (never a hang)."""
    space, rec = _space(2)
    space.readers = lambda: False
    buf = np.empty(SLOT, np.uint8)
    pool = PayloadPool(seed=1, span_bytes=SLOT)
    for r in range(3):
        keys = (10 * r + 1, 10 * r + 2)
        space.publish(keys, (SLOT, SLOT), pool.fill, buf, rec)
        space.announce(keys, lambda: None)
    assert rec.counters()["handoff.dropped_unread"] == 4
    assert space.published == 2


def test_a_waiting_publisher_gives_up_after_wait_s_and_says_so():
    """A decode node that stopped acknowledging (dead, or frozen) holds its blocks only wait_s: then they go."""
    space, rec = _space(2)
    space.wait_s = 0.2
    buf = np.empty(SLOT, np.uint8)
    pool = PayloadPool(seed=1, span_bytes=SLOT)
    space.publish((1, 2), (SLOT, SLOT), pool.fill, buf, rec)
    space.announce((1, 2), lambda: None)
    start = time.monotonic()
    space.publish((3,), (SLOT,), pool.fill, buf, rec)
    assert 0.2 <= time.monotonic() - start < 5
    assert space.waited_out and rec.counters()["handoff.dropped_unread"] == 1
