"""The GDS path (NVMe <-> HBM without the host bounce) through the fake device: same link, same cache code."""

from __future__ import annotations

import pytest
from found import ENGINES

from kv_cache.buffers import aligned_buffer
from kv_cache.cache.cache import BlockCache
from kv_cache.cache.policies.lru import LRUPolicy
from kv_cache.errors import UserError
from kv_cache.lifecycle.payload import PayloadPool
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.devices import FakeDevice
from kv_cache.tiers.fsinfo import probe_direct
from kv_cache.tiers.gds import GdsLink
from kv_cache.tiers.gpu import GpuTier
from kv_cache.tiers.nvme import NvmeTier

SLOT = 64 * 1024


@pytest.fixture
def tiers(tmp_path):
    if probe_direct(str(tmp_path)):
        pytest.skip("no O_DIRECT in the test directory")
    dev = FakeDevice(count=2)
    gpu = GpuTier(dev, 4 * SLOT, SLOT, [0, 1], lanes=2, staging_bytes=2 * SLOT)
    nvme = NvmeTier(str(tmp_path), 64 * SLOT, SLOT, ENGINES["direct"], slab_file_bytes=16 * SLOT)
    yield dev, gpu, nvme
    nvme.close(remove=True)
    gpu.close()



def test_demotions_skip_host_memory_and_reads_land_in_device_memory(tiers):
    dev, gpu, nvme = tiers
    pool = PayloadPool(seed=5, span_bytes=1 << 20)
    link = GdsLink(dev, gpu, nvme, lanes=2, max_bytes=2 * SLOT)
    rec = Recorder()
    rec.start_measuring(0)
    cache = BlockCache([gpu, nvme], LRUPolicy, False, rec, link)
    scratch = aligned_buffer(2 * SLOT)
    scratch[:] = 0xAB  # the host bounce buffer of moves: untouched when moves go through the link
    sizes = {k: SLOT if k % 2 else 2 * SLOT - 4096 for k in range(1, 9)}  # one- and two-slot blocks
    for k, n in sizes.items():
        buf = aligned_buffer(n)
        pool.fill(k, buf)
        cache.commit_write(cache.reserve_write(k, n, "user"), buf, "prefill", scratch)
    on_nvme = [k for k, e in cache.index.items() if cache.names[e.tier] == "nvme"]
    assert on_nvme and link.demoted == len(on_nvme) == rec.counters()["ops.nvme.demote"]
    assert (scratch == 0xAB).all()
    out = aligned_buffer(2 * SLOT)
    for k in on_nvme:  # read back from the slab files through device memory, byte-exact
        (e,) = cache.pin_prefix([k])
        cache.read(e, out, "load")
        assert pool.check(k, out[:sizes[k]], "full"), k
        cache.unpin([e])
    assert link.loaded == len(on_nvme)
    link.close()


def test_a_batch_of_demotions_fails_block_by_block_and_keeps_no_slot_of_a_failed_one(tiers):
    """demote_many: a block the GPU tier does not hold fails alone; a write that fails releases its new NVMe slots;
    the others are written, byte-exact, each with its own completion time."""
    dev, gpu, nvme = tiers
    pool = PayloadPool(seed=5, span_bytes=1 << 20)
    link = GdsLink(dev, gpu, nvme, lanes=2, max_bytes=2 * SLOT)
    for k in (1, 2, 3):
        buf = aligned_buffer(SLOT)
        pool.fill(k, buf)
        gpu.put(k, buf)
    real = dev.file_write_many

    def third_fails(items):
        done = real(items)
        return [*done[:2], OSError(5, "Input/output error")]
    dev.file_write_many = third_fails
    done = link.demote_many([1, 99, 2, 3])
    assert isinstance(done[1], KeyError) and isinstance(done[3], OSError)
    assert done[0] <= done[2] and 1 in nvme.slots and 2 in nvme.slots and 3 not in nvme.slots
    assert link.demoted == 2 and len(nvme.slots) == 2
    out = aligned_buffer(SLOT)
    for k in (1, 2):
        nvme.get(k, out)
        assert pool.check(k, out, "full"), k
    link.close()


def test_a_batch_of_reads_lands_each_block_in_its_own_buffer_and_promotes_from_it(tiers):
    """load_many: each block of the window in a landing buffer of its own (a block the NVMe tier lacks fails alone),
    byte-exact, each promoted device to device from its buffer; a later read batch replaces them."""
    dev, gpu, nvme = tiers
    pool = PayloadPool(seed=5, span_bytes=1 << 20)
    link = GdsLink(dev, gpu, nvme, lanes=2, max_bytes=2 * SLOT, window=4)
    buf = aligned_buffer(SLOT)
    for k in (1, 2, 3):
        pool.fill(k, buf)
        nvme.put(k, buf)
    done = link.demote_many([]) + link.load_many([1, 99, 3])
    assert isinstance(done[1], KeyError) and done[0] > 0 and done[2] > 0 and link.loaded == 2
    out = aligned_buffer(SLOT)
    for k in (1, 3):
        link.to_host(link.landed(k), out)
        assert pool.check(k, out, "full"), k
    assert link.landed(1) is not link.landed(3) and link.landed(99) is None
    assert link.promote(1, SLOT) and link.promote(3, SLOT)
    gpu.get(3, out)
    assert pool.check(3, out, "full")
    link.load_many([2])  # the window's first buffer now holds block 2: block 1 is no longer landed there
    assert link.landed(1) is None and link.landed(3) is not None and not link.promote(1, SLOT)
    link.close()


def test_gds_refuses_what_it_cannot_do(tiers, tmp_path):
    dev, gpu, _ = tiers
    other = tmp_path / "files"
    other.mkdir()
    per_block = NvmeTier(str(other), 8 * SLOT, SLOT, ENGINES["direct"], layout="file-per-block")
    with pytest.raises(UserError, match="--nvme-layout slab"):
        GdsLink(dev, gpu, per_block, lanes=1, max_bytes=SLOT)
    from kv_cache.tiers.gds import open_link

    with pytest.raises(UserError, match="no real GPU tier"):
        open_link([per_block], None, 1, SLOT)
    assert "fake device" in dev.gds_mode()


def test_cli_refuses_gds_without_a_real_gpu(small_run):
    from conftest import run_cli
    from helpers import assert_clean_error

    assert_clean_error(run_cli(small_run("g", "--gds", "--gpu", "off", "--duration", "1")), "no real GPU tier")


def test_a_block_loaded_through_gds_is_promoted_device_to_device(tiers, monkeypatch):
    dev, gpu, nvme = tiers
    pool = PayloadPool(seed=6, span_bytes=1 << 20)
    link = GdsLink(dev, gpu, nvme, lanes=2, max_bytes=SLOT)
    rec = Recorder()
    rec.start_measuring(0)
    cache = BlockCache([gpu, nvme], LRUPolicy, True, rec, link)
    scratch = aligned_buffer(SLOT)
    for k in range(1, 9):
        buf = aligned_buffer(SLOT)
        pool.fill(k, buf)
        cache.commit_write(cache.reserve_write(k, SLOT, "user"), buf, "prefill", scratch)
    host_puts = []
    monkeypatch.setattr(gpu, "put", lambda key, buf: host_puts.append(key))  # the host -> device path
    out = aligned_buffer(SLOT)
    (e,) = cache.pin_prefix([1])  # the oldest block: demoted to NVMe
    assert cache.names[e.tier] == "nvme"
    cache.read(e, out, "load")
    cache.release(e, out, scratch)
    assert cache.names[cache.index[1].tier] == "gpu" and host_puts == []
    out[:] = 0
    (e,) = cache.pin_prefix([1])
    cache.read(e, out, "load")  # now from HBM: the device-to-device copy carried the right bytes
    assert pool.check(1, out, "full")
    cache.unpin([e])


def test_kvikios_compatibility_mode_is_read_through_the_api_its_version_has():
    """kvikio 24.12 to 26.x answer is_compat_mode_preferred(); earlier 24.x compat_mode(), a bool or a CompatMode
    (OFF 0, ON 1, AUTO 2). 26.10's `kvikio.defaults` must be imported as a submodule (the AttributeError of
    issue 35): CupyDevice imports it."""
    import inspect
    from types import SimpleNamespace

    from kv_cache.tiers.cupy_device import CupyDevice, kvikio_compat_preferred

    assert kvikio_compat_preferred(SimpleNamespace(is_compat_mode_preferred=lambda: True))
    assert not kvikio_compat_preferred(SimpleNamespace(is_compat_mode_preferred=lambda: False))
    assert kvikio_compat_preferred(SimpleNamespace(compat_mode=lambda: True))
    assert not kvikio_compat_preferred(SimpleNamespace(compat_mode=lambda: 0))
    assert kvikio_compat_preferred(SimpleNamespace(compat_mode=lambda: 1))
    assert "import kvikio.defaults" in inspect.getsource(CupyDevice._kvikio)
