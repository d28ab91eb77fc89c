"""The composition root's seams: the tier registry, capability hooks, per-rank seeds, runner gauges, flags."""

import dataclasses
import os

import numpy as np
import pytest
from found import REGISTRY, SECTIONS

from kv_cache.buffers import aligned_buffer
from kv_cache.cache.cache import BlockCache
from kv_cache.cache.policies.lru import LRUPolicy
from kv_cache.config import resolve
from kv_cache.recorder.recorder import Recorder
from kv_cache.run.geometry import geometry
from kv_cache.run.stack import build_tiers
from kv_cache.run.traffic import rank_seed
from kv_cache.tiers.base import PINS_HOST, PRECONDITIONS, STORAGE, SlottedTier
from kv_cache.tiers.catalog import Media
from kv_cache.tiers.kinds import StackContext, TierKind

MiB = 2**20


class ObjectStoreTier(SlottedTier):
    """A stand-in for a new bottom medium: bytes in a dict, as a remote object store would keep them."""

    name = "objectstore"
    flags = frozenset({STORAGE})

    def __init__(self, capacity_bytes: int, slot_bytes: int):
        super().__init__(capacity_bytes // slot_bytes, slot_bytes)
        self.objects: dict[int, bytes] = {}
        self.description = "objects in a dict"

    def put(self, key, buf):
        self.slots.alloc(key, len(buf))
        self.objects[key] = bytes(buf)

    def get(self, key, out):
        out[: len(self.objects[key])] = np.frombuffer(self.objects[key], np.uint8)

    def delete(self, key):
        self.slots.release(key)
        del self.objects[key]


def test_a_new_bottom_tier_is_one_declaration():
    """A medium is its TierKind: handed to the registry (a copy here), the stack is built with it."""
    kind = TierKind("objectstore", 2, lambda ctx: (ObjectStoreTier(8 * MiB, ctx.slot_bytes), ""))
    reg = dataclasses.replace(REGISTRY, media=REGISTRY.media.with_kind(kind, without=("nvme",)))
    s = resolve(None, [], {"tiers.cpu_mem_gb": 0.004, "tiers.gpu": "off", "model.block_tokens": 16,
                           "model.name": "llama8b"}, media_sections=SECTIONS)
    geo = geometry(s)
    tiers, _ = build_tiers(s, geo, None, reg)
    assert [t.name for t in tiers] == ["cpu", "objectstore"]
    assert "objectstore" not in REGISTRY.media.by_name()  # a copy: the registry handed to others is unchanged
    cache = BlockCache(tiers, LRUPolicy, True, Recorder())
    assert cache.verifiable == [True, True]  # the cpu arena and ours move real bytes
    data = np.arange(4096, dtype=np.uint32).view(np.uint8)
    tiers[-1].put(7, data)
    out = np.zeros_like(data)
    tiers[-1].get(7, out)
    assert (out == data).all()


def test_tiers_declare_optional_hooks_with_flags():
    s = resolve(None, [], {"tiers.gpu": "simulated", "tiers.gpu_mem_gb": 0.01, "tiers.cpu_mem_gb": 0.004,
                           "model.block_tokens": 16, "model.name": "llama8b", "tiers.null_io": True},
       media_sections=SECTIONS)
    tiers, _ = build_tiers(s, geometry(s), None, REGISTRY)
    assert [t.name for t in tiers] == ["gpu", "cpu", "nvme"]
    buf = aligned_buffer(4096)
    for t in tiers:  # the NULL hooks: callable on every tier, doing nothing where the flag is absent
        assert PINS_HOST not in t.flags and PRECONDITIONS not in t.flags
        t.pin_host(buf)
        assert t.adopt(1) is None
        with pytest.raises(NotImplementedError):
            t.precondition(1)


def test_a_refused_tier_releases_the_ones_built_before_it():
    closed = []

    class Probe(ObjectStoreTier):
        def close(self, remove=True):
            closed.append(self.name)

    def refuse(ctx):
        raise RuntimeError("no room")
    media = Media((TierKind("a", 0, lambda ctx: (Probe(4 * MiB, MiB), "")), TierKind("b", 1, refuse)))
    with pytest.raises(RuntimeError):
        media.build_stack(StackContext(None, MiB, MiB, 1, None))
    assert closed == ["objectstore"]


def test_rank_seeds_are_independent_and_rank_0_keeps_the_seed():
    assert rank_seed(42, 0) == 42
    assert rank_seed(42, 1) != rank_seed(43, 0)  # seed + rank made these the same schedule
    assert len({rank_seed(42, r) for r in range(64)}) == 64
    assert rank_seed(42, 3) == rank_seed(42, 3)


def test_negative_flags_say_they_turn_the_feature_off():
    from kv_cache.cli.main import run_parser

    helps = {a.option_strings[0]: a.help for a in run_parser(REGISTRY)._actions if a.option_strings}
    for flag in ("--no-telemetry", "--no-promote"):
        assert helps[flag].startswith("Turn off"), (flag, helps[flag])


@pytest.mark.parametrize("where", ["write_marker", "probe_direct"])
def test_a_signal_while_the_data_folder_is_made_leaves_no_folder(tmp_path, monkeypatch, where):
    """Issue 37, item 6: a signal at start-up said "temporary data was removed" but left kvbench-<id>/ (empty, or
    holding only its marker; the empty one had no marker, so clean could not find it)."""
    from kv_cache.config import resolve
    from kv_cache.run import site

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(site, where, interrupted)
    s = resolve(None, [f"tiers.cache_dir={tmp_path}"], {"tiers.null_io": False}, media_sections=SECTIONS)
    with pytest.raises(KeyboardInterrupt):
        site.storage_site(s, "sig", REGISTRY.engines)
    assert os.listdir(tmp_path) == []


def test_every_capability_flag_is_read_somewhere():
    """Issue 47, item 3: DIRECT_IO, NEEDS_ALIGNMENT and DEVICE_MEMORY were set by five modules and read by none. A
    flag is declared in tiers/base.py only if some code asks a tier for it (`FLAG in ...flags`)."""
    import re
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[2] / "kv_cache"
    declared = re.findall(r"^([A-Z_]+) = \"\w+\"", (pkg / "tiers" / "base.py").read_text(), re.M)
    code = "\n".join(p.read_text() for p in pkg.rglob("*.py"))
    unread = [f for f in declared if not re.search(rf"\b{f} (not )?in\b|\bin \({f}\b|{f}\)? in \w", code)]
    assert declared and not unread, unread
