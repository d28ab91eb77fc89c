"""A remote namespace shared by independent runs (--remote-namespace): two members over one real Valkey server,
each its own store and tier, as two processes have them."""

from __future__ import annotations

import numpy as np
import pytest
from servers import valkey_keys

from kv_cache.buffers import aligned_buffer
from kv_cache.errors import BlockVanished
from kv_cache.lifecycle.payload import PayloadPool
from kv_cache.tiers.base import SHARED
from kv_cache.tiers.remote_shared import SharedRemoteTier
from kv_cache.tiers.valkey import ValkeySettings, open_store

SLOT = 64 << 10


def member(url: str, run_id: str, part_kib: int) -> SharedRemoteTier:
    store = open_store(url, ValkeySettings(part_mb=part_kib / 1024))
    store.check()
    return SharedRemoteTier("valkey", store, run_id, 16 * SLOT, SLOT, "test")


@pytest.mark.parametrize("part_kib", [0, 20])  # whole values, and blocks in parts
def test_members_read_each_other_s_blocks_and_the_last_out_removes_the_namespace(valkey_server, part_kib):
    run_id = f"shared-test-{part_kib}"
    pool = PayloadPool(7)
    a, b = member(valkey_server.url, run_id, part_kib), member(valkey_server.url, run_id, part_kib)
    assert SHARED in a.flags and a.members == 1 and b.members == 2
    data = aligned_buffer(SLOT)
    pool.fill(1, data)
    a.put(1, data)
    assert b.adopt(1) == SLOT and b.adopt(2) is None
    out = aligned_buffer(SLOT)
    b.get(1, out)  # a block b never wrote: read at out's size
    assert np.array_equal(out, data) and 1 not in b.slots
    outs = [aligned_buffer(SLOT) for _ in range(2)]
    got = b.get_many([(1, outs[0]), (2, outs[1])])  # 2: nobody wrote it
    assert isinstance(got[0], int) and isinstance(got[1], BlockVanished)
    a.delete(1)  # its writer evicts it: gone for everyone, a miss for b
    with pytest.raises(BlockVanished):
        b.get(1, out)
    a.put(3, data)
    a.close()  # b is still in: a's blocks stay for it
    assert b.adopt(3) == SLOT
    assert valkey_keys(valkey_server.url, f"kvbench-{run_id}:*")
    b.close()  # the last out
    assert valkey_keys(valkey_server.url, f"kvbench-{run_id}:*") == []
