"""The sizes a model's geometry fixes: a block, a slot, the largest object and the largest single I/O."""

from __future__ import annotations

from dataclasses import dataclass

from kv_cache.buffers import direct_aligned
from kv_cache.config import Settings
from kv_cache.model import ModelSpec, find_model, slot_bytes

WHOLE_REQUEST_SLOT_BYTES = 16 << 20  # slot size of every tier in whole-request mode


@dataclass
class Geometry:
    """Sizes that follow from the model and the block settings."""

    model: ModelSpec
    bytes_per_token: int
    block_bytes: int        # logical bytes of one full block (0 in whole-request mode)
    slot_bytes: int         # bytes one tier slot holds (block rounded up to 4 KiB)
    max_object_bytes: int   # largest object (a tier must hold one)
    part_bytes: int = 0     # whole-request objects larger than this move as parts of it (0: every object is one I/O)

    @property
    def io_bytes(self) -> int:
        """The largest single I/O, which every per-worker buffer and GPU lane is sized for."""
        return min(self.max_object_bytes, self.part_bytes) if self.part_bytes else self.max_object_bytes


def geometry(s: Settings) -> Geometry:
    model = find_model(s.model.name, s.models)
    bpt = model.bytes_per_token(s.model.kv_dtype, s.model.tp)
    if s.model.block_tokens:
        block = bpt * s.model.block_tokens
        return Geometry(model, bpt, block, slot_bytes(block), slot_bytes(block))
    profiles = [getattr(s.profiles, n) for n in s.profiles.__dataclass_fields__]
    longest = max(p.max_context_tokens + p.output_tokens[1] for p in profiles)
    part = max(1, (s.tiers.io_chunk_mb << 20) // WHOLE_REQUEST_SLOT_BYTES) * WHOLE_REQUEST_SLOT_BYTES
    return Geometry(model, bpt, 0, WHOLE_REQUEST_SLOT_BYTES, slot_bytes(longest * bpt), part)


def chain_id(s: Settings, geo: Geometry) -> str:
    """What names a run's block chains (their root): the model, its KV dtype and TP, so that blocks of another
    identity never match (chain_root hashes it)."""
    return f"{geo.model.name}/{s.model.kv_dtype}/tp{s.model.tp}"


def io_unit_bytes(s: Settings, geo: Geometry) -> int:
    """--io-unit layer: a block's bytes over its layer groups, rounded up to 4 KiB (O_DIRECT's alignment)."""
    if s.tiers.io_unit != "layer" or not geo.block_bytes:
        return 0
    groups = max(1, -(-geo.model.layers // s.tiers.layers_per_io))
    return direct_aligned(-(-geo.block_bytes // groups))
