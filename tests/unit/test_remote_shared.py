"""A remote namespace shared by independent runs (--remote-namespace): two members over one real server (Valkey,
and an S3 gateway), each its own store and tier, as two processes have them."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from servers import s3_objects, valkey_keys

from kv_cache.buffers import aligned_buffer
from kv_cache.errors import BlockVanished
from kv_cache.lifecycle.payload import PayloadPool
from kv_cache.markers import marker_body
from kv_cache.tiers import s3, valkey
from kv_cache.tiers.base import SHARED
from kv_cache.tiers.remote_shared import SharedRemoteTier

SLOT = 64 << 10


def opener(request, medium: str, part_kib: int):
    """(open a member's store, the names the server holds under a prefix) for medium's real server."""
    if medium == "valkey":
        server = request.getfixturevalue("valkey_server")
        return (lambda: valkey.open_store(server.url, valkey.ValkeySettings(part_mb=part_kib / 1024)),
                lambda prefix: valkey_keys(server.url, f"{prefix}*"))
    server = request.getfixturevalue("s3_server")
    return (lambda: s3.open_store(server.url, s3.S3Settings(), 4, server.env),
            lambda prefix: [n for n in s3_objects(server, "") if prefix in n])


@pytest.mark.parametrize("medium,part_kib", [("valkey", 0), ("valkey", 20), ("s3", 0)])
def test_members_read_each_other_s_blocks_and_the_last_out_removes_the_namespace(request, medium, part_kib):
    run_id = f"shared-test-{medium}-{part_kib}"
    open_store, held = opener(request, medium, part_kib)

    def member() -> SharedRemoteTier:
        store = open_store()
        store.check()
        return SharedRemoteTier(medium, store, run_id, 16 * SLOT, SLOT, "test")

    pool = PayloadPool(7)
    a, b = member(), member()
    assert SHARED in a.flags and a.members == 1  # both in one process here: one member marker (host, pid)
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
    a.put(4, data)  # both wrote block 4 before either saw the other's: one object, each holding it as its own
    b.put(4, data)
    a.delete(4)  # a promotes or evicts it: b's own block is gone too, a miss for b and not a fault (it stopped
    with pytest.raises(BlockVanished):  # a fleet's real run: "object ... the run wrote is gone")
        b.get(4, out)
    assert isinstance(b.get_many([(4, outs[0])])[0], BlockVanished)
    a.put(3, data)
    prefix = f"kvbench-{run_id}"
    b.store.write_small(b.store.namespace(run_id) + "member-elsewhere-1", b"{}")  # a member still running
    a.close()
    assert b.adopt(3) == SLOT and held(prefix)  # a's blocks stay for those still in
    b.store.remove([b.store.namespace(run_id) + "member-elsewhere-1"])
    dead = subprocess.Popen(["true"])  # a pid of this host whose process is gone: a member killed mid-run
    dead.wait()
    body = {**marker_body(run_id), "pid": dead.pid}
    b.store.write_small(b.store.namespace(run_id) + "member-killed", json.dumps(body).encode())
    b.close()  # the last live member out
    assert held(prefix) == []
