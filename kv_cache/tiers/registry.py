"""The tier registry: every medium registers how it is built, and the stack is built from that data.

As fio's ioengines register themselves with their flags and leave the hooks
they lack empty, each tier module declares one ``TierKind`` (its name, its
level in the stack, fastest first, and a builder that reads the tier settings)
and registers it on import. ``build_stack`` asks each kind in level order
for its tier; a kind that is off says why in one line. The composition root
hands in a ``StackContext`` and gets an ordered list back: nothing above this
package names a medium, and a new bottom tier (a remote object store, say)
is one module with its builder, its contract test and its settings.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

GiB = 2**30
# The modules that register a kind. Importing them is what fills KINDS (one line here per medium).
MEDIA = ("kv_cache.tiers.gpu", "kv_cache.tiers.cpu", "kv_cache.tiers.nvme")


@dataclass
class StorageSite:
    """The directory under test: where the bottom tier's files live and which engine really runs there."""

    cache_dir: str
    data_dir: str
    fs_type: str
    mount_point: str
    engine: str
    engine_note: str = ""
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StackContext:
    """What a builder may read: the tier settings and the sizes the model fixed."""

    settings: object            # config TierSettings (s.tiers)
    slot_bytes: int             # one slot: a block rounded up to 4 KiB
    max_object_bytes: int       # the largest object a worker stages
    lanes: int                  # threads that may move bytes at once (workers + the demoter)
    site: StorageSite | None    # None with --null-io: no byte moves
    fill: Callable | None = None  # fill(key, out) rebuilds a payload (a simulated tier hands back real bytes)
    writer: str = "r0"          # this process's name in a shared namespace
    gpu: object = None          # the device backend of a real GPU tier, or None
    io_unit_bytes: int = 0      # --io-unit layer: the most one I/O of the bottom tier moves (0: a whole block)

    @property
    def null_io(self) -> bool:
        return self.site is None


def _holds_nothing(_settings) -> int:
    return 0


@dataclass(frozen=True)
class TierKind:
    """One medium: its name, its level (0 = fastest), build(ctx) -> (tier or None, note), and most_bytes(tier
    settings) -> the most it may hold, known before it is built (the memory budget counts the bookkeeping of
    every block the stack can hold)."""

    name: str
    level: int
    build: Callable[[StackContext], tuple[object | None, str]]
    most_bytes: Callable[[object], int] = _holds_nothing


KINDS: dict[str, TierKind] = {}


def register(name: str, level: int, most_bytes: Callable[[object], int] = _holds_nothing):
    """Decorator of a tier module's builder; the highest level is the bottom tier, the storage under test."""
    def wrap(build):
        KINDS[name] = TierKind(name, level, build, most_bytes)
        return build
    return wrap


def most_blocks(settings, slot_bytes: int) -> int:
    """The most blocks the whole stack may hold with these tier settings (an upper bound, before building)."""
    return sum(kind.most_bytes(settings) // slot_bytes for kind in kinds())


def holds_no_slot(flag: str, gib: float, slot_bytes: int, tier: str) -> str:
    """The sentence for a capacity above 0 that holds no slot: a typo, not a way to turn the tier off."""
    return (f"{flag} {gib:g} holds no {slot_bytes / 2**20:.2f} MiB block; give at least "
            f"{slot_bytes / GiB:.4g} GiB, or 0 to turn the {tier} tier off.")


def kinds_by_name() -> dict[str, TierKind]:
    """Every registered kind (importing the media modules registers them)."""
    for module in MEDIA:
        importlib.import_module(module)
    return dict(KINDS)


def kinds() -> list[TierKind]:
    return sorted(kinds_by_name().values(), key=lambda k: k.level)


def build_stack(ctx: StackContext) -> tuple[list, list[str]]:
    """The ordered tier list (fastest first) and the lines saying which tiers are off and why."""
    tiers, notes = [], []
    try:
        for kind in kinds():
            tier, note = kind.build(ctx)
            if tier is not None:
                tiers.append(tier)
            if note:
                notes.append(note)
    except BaseException:
        for t in tiers:  # a later tier refused: release what the earlier ones allocated
            t.close()
        raise
    return tiers, notes


def capacity_of(gib: float, slot_bytes: int) -> int:
    """GiB of a setting rounded down to whole slots."""
    return int(gib * GiB) // slot_bytes * slot_bytes


def shared_files(engine: str, slot_bytes: int, name: str = "handoff"):
    """open(directory, capacity_bytes, writer): a file-per-block tier other processes read by name (the
    handoff folder of disaggregated nodes)."""
    from kv_cache.tiers.nvme import NvmeTier

    def open_blocks(directory: str, capacity_bytes: int, writer: str):
        tier = NvmeTier(directory, max(capacity_bytes, slot_bytes), slot_bytes, engine, shared=True, writer=writer)
        tier.name = name
        return tier
    return open_blocks
