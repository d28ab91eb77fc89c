"""One contract, every tier: put/get/delete round-trip, accounting, missing keys, multi-slot objects."""

import os

import numpy as np
import pytest
from found import REGISTRY

from kv_cache.buffers import aligned_buffer
from kv_cache.lifecycle.payload import PayloadPool
from kv_cache.tiers.base import FAKE_IO, Tier
from kv_cache.tiers.cpu import CpuTier
from kv_cache.tiers.engines import DirectEngine
from kv_cache.tiers.null import NullTier
from kv_cache.tiers.slots import TierFull

SLOT = 64 * 1024
SLOTS = 8


def make(kind, tmp_path, request=None, media=REGISTRY.media):
    """The tier of a contract case: "null", or <medium>/<variant> as the medium's module declares it (its
    contract variants and make_for_test, found by the registry: a new medium or engine brings its own cases)."""
    if kind == "null":
        return NullTier("nvme", SLOTS * SLOT, SLOT)
    medium, variant = kind.split("/", 1)
    k = media.by_name()[medium]
    server = request.getfixturevalue(f"{medium}_server") if k.local_server else None  # its real one, started here
    d = tmp_path / "data"
    d.mkdir()
    t = k.make_for_test(variant, str(d), SLOTS * SLOT, SLOT, server, media.engines)
    if t is None:
        pytest.skip(f"{kind}: not on this machine")
    return t


KINDS = ["null"] + [pytest.param(case, marks=pytest.mark.gpu) if case.endswith("/cupy") else case
                    for case in REGISTRY.media.contract_cases()]  # computed from the registry when tests collect


@pytest.fixture(params=KINDS)
def tier(request, tmp_path):
    t = make(request.param, tmp_path, request)
    yield t
    t.close()


@pytest.fixture(scope="module")
def pool():
    return PayloadPool(seed=1, span_bytes=1 << 20)


def payload(pool, key, nbytes):
    buf = aligned_buffer(nbytes)
    pool.fill(key, buf)
    return buf[:nbytes]


def test_is_a_tier(tier):
    assert isinstance(tier, Tier)
    assert tier.capacity_bytes == SLOTS * SLOT
    assert tier.description


@pytest.mark.parametrize("nbytes", [4096, SLOT, 3 * SLOT + 8192])
def test_round_trip_and_accounting(tier, pool, nbytes):
    data = payload(pool, 77, nbytes)
    tier.put(77, data)
    assert tier.contains(77)
    assert tier.used_bytes == tier.slots_for(nbytes) * SLOT
    out = aligned_buffer(nbytes)[:nbytes]
    tier.get(77, out)
    if FAKE_IO not in tier.flags and "simulated" not in tier.flags:
        assert pool.check(77, out, "full")
    tier.delete(77)
    assert not tier.contains(77)
    assert tier.used_bytes == 0


def _moved(results: list) -> None:
    for r in results:
        if isinstance(r, BaseException):
            raise r


@pytest.mark.parametrize("way", ["one by one", "batch"])
def test_many_blocks_do_not_overlap_either_way(tier, pool, way):
    """Issue 48: every medium moves a batch (put_many / get_many: natively, or the inherited loop) to the same
    bytes as one block at a time, each item's result its completion time."""
    keys = list(range(100, 100 + SLOTS))
    sizes = [SLOT if k % 3 else 4096 for k in keys]  # whole slots and a short one: runs of every length
    datas = [payload(pool, k, n) for k, n in zip(keys, sizes)]
    if way == "batch":
        done = tier.put_many(list(zip(keys, datas)))
        _moved(done)
        assert all(isinstance(t, int) and t > 0 for t in done)
    else:
        for k, d in zip(keys, datas):
            tier.put(k, d)
    assert tier.used_bytes == sum(tier.slots_for(n) for n in sizes) * SLOT
    outs = [aligned_buffer(n)[:n] for n in sizes]
    if way == "batch":
        _moved(tier.get_many(list(zip(keys, outs))))
    else:
        for k, o in zip(keys, outs):
            tier.get(k, o)
    if FAKE_IO in tier.flags or "simulated" in tier.flags:
        return
    for k, o in zip(keys, outs):
        assert pool.check(k, o, "full"), f"block {k} came back wrong ({way})"


def test_a_batch_s_bad_item_fails_alone(tier, pool):
    """A missing key in a get batch, a key already there in a put batch: that item's result is its error, the
    others move (a whole batch failing for one block would lose what the cache must account)."""
    tier.put(1, payload(pool, 1, SLOT))
    got = tier.put_many([(1, payload(pool, 1, SLOT)), (2, payload(pool, 2, SLOT))])
    assert isinstance(got[0], KeyError) and isinstance(got[1], int)
    outs = [aligned_buffer(SLOT) for _ in range(3)]
    got = tier.get_many([(2, outs[0]), (12345, outs[1]), (1, outs[2])])
    assert isinstance(got[1], KeyError) and isinstance(got[0], int) and isinstance(got[2], int)
    assert tier.used_bytes == 2 * SLOT
    if FAKE_IO not in tier.flags and "simulated" not in tier.flags:
        assert pool.check(2, outs[0], "full") and pool.check(1, outs[2], "full")


def test_many_blocks_do_not_overlap(tier, pool):
    keys = list(range(100, 100 + SLOTS))
    for k in keys:
        tier.put(k, payload(pool, k, SLOT))
    assert tier.used_bytes == tier.capacity_bytes
    if FAKE_IO in tier.flags or "simulated" in tier.flags:
        return
    out = aligned_buffer(SLOT)
    for k in keys:
        tier.get(k, out)
        assert pool.check(k, out, "full"), f"block {k} came back wrong"


def test_full_tier_refuses(tier, pool):
    for k in range(SLOTS):
        tier.put(k, payload(pool, k, SLOT))
    with pytest.raises(TierFull):
        tier.put(999, payload(pool, 999, SLOT))


def test_missing_key(tier):
    out = aligned_buffer(SLOT)
    with pytest.raises(KeyError):
        tier.get(12345, out)
    with pytest.raises(KeyError):
        tier.delete(12345)


def test_duplicate_put_is_refused(tier, pool):
    tier.put(5, payload(pool, 5, SLOT))
    with pytest.raises(KeyError):
        tier.put(5, payload(pool, 5, SLOT))


class ThrowawayEngine(DirectEngine):
    """An engine no module of kv_cache declares: O_DIRECT, each I/O counted."""

    name = "throwaway"
    moved = 0

    def write(self, t, off, data, unit, times):
        ThrowawayEngine.moved += 1
        super().write(t, off, data, unit, times)

    def read(self, t, off, out, unit, times):
        ThrowawayEngine.moved += 1
        super().read(t, off, out, unit, times)


def test_an_engine_added_to_the_registry_gets_contract_cases_and_passes_them(tmp_path, pool):
    """Contract cases come from the registry the test is handed, whatever module an engine lives in (issue 47)."""
    media = REGISTRY.media.with_engine(ThrowawayEngine())
    cases = [c for c in media.contract_cases() if "/throwaway/" in c]
    assert cases == ["nvme/throwaway/slab", "nvme/throwaway/file-per-block"]
    assert not [c for c in REGISTRY.media.contract_cases() if "/throwaway/" in c]  # the copy, not the registry
    for n, case in enumerate(cases):
        where = tmp_path / str(n)
        where.mkdir()
        t = make(case, where, media=media)
        data = payload(pool, 9, 3 * SLOT)
        t.put(9, data)
        out = aligned_buffer(3 * SLOT)
        t.get(9, out)
        assert np.array_equal(out, data) and t.ops.name == "throwaway"
        t.close()
    assert ThrowawayEngine.moved >= 4


def test_nvme_close_removes_its_files(tmp_path, pool):
    t = make("nvme/direct/slab", tmp_path)
    t.put(1, payload(pool, 1, SLOT))
    assert os.listdir(t.directory)
    t.close()
    assert not (tmp_path / "data").exists()


def test_cpu_arena_is_aligned_and_pretouched():
    t = CpuTier(4 * SLOT, SLOT)
    assert t.arena.ctypes.data % 4096 == 0
    assert np.all(t.arena[::4096] == 0)
