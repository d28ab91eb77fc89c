"""A Valkey batch's GETs keep --valkey-read-ahead-mb of replies outstanding, one GET at least: a real server."""

import time

import numpy as np

from kv_cache.tiers.base import in_flight_take
from kv_cache.tiers.resp import outstanding
from kv_cache.tiers.valkey import ValkeySettings, open_store


def test_values_larger_than_the_read_ahead_are_read_one_get_at_a_time(valkey_server):
    """Two GETs at least had a second 32 MiB reply buffered in the server while the first was read: a batch of 16
    read at 0.40 of the same GETs one by one (`bench/remote_bench.py --block-mib 32 --batch-only`); one at a time
    0.99. Here 4 values of 8 MiB under 4 MiB of read-ahead: each GET is sent once the reply before it is read, so
    the GETs' time outstanding (the batch's depth, as the run records it) never overlaps: at most the batch's."""
    assert (outstanding(4 << 20, 32 << 20, 16), outstanding(4 << 20, 2 << 20, 16), outstanding(0, 2 << 20, 16)) == \
        (1, 2, 16)
    store = open_store(valkey_server.url, ValkeySettings(read_ahead_mb=4.0))
    store.check()  # as a run does before its clock: the server's largest value
    try:
        blocks = [np.full(8 << 20, n, np.uint8) for n in range(4)]
        store.put_many([(f"ahead-{n}", b) for n, b in enumerate(blocks)])
        outs = [np.zeros(8 << 20, np.uint8) for _ in blocks]
        in_flight_take()
        start = time.monotonic_ns()
        store.get_many_into([(f"ahead-{n}", o) for n, o in enumerate(outs)])
        wall, busy = time.monotonic_ns() - start, in_flight_take()
        assert all((o == n).all() for n, o in enumerate(outs))
        assert busy <= wall, (busy, wall)  # one GET outstanding at a time: depth at most 1
        store.remove([f"ahead-{n}" for n in range(4)])
    finally:
        store.close()
