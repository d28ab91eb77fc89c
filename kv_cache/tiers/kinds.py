"""What a medium declares: its ``TierKind`` (how it is built, how much it may hold, its settings section, its
contract cases), and what a builder reads (``StackContext``).

As fio's ioengines declare themselves with their flags and leave the hooks they lack empty, each tier module
declares one ``MEDIUM = TierKind(...)``: its name, its level in the stack (fastest first), a builder that reads
the settings, the most it may hold, what an automatic choice resolved to, its settings section and the variants
the contract test runs. Nothing registers on import: ``catalog.find_media()`` lists the package once and reads
each module's declarations, and the entry points hand the result down (nothing reads a table as a global).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kv_cache.config import media
from kv_cache.model import GiB

__all__ = ["GiB", "StackContext", "StorageSite", "TierKind", "capacity_of", "holds_no_slot", "scheme_of"]


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
    made: list[str] = field(default_factory=list)  # folders made for the default cache directory, innermost first


@dataclass(frozen=True)
class StackContext:
    """What a builder may read: the tier settings and the sizes the model fixed."""

    settings: object            # config TierSettings (s.tiers)
    slot_bytes: int             # one slot: a block rounded up to 4 KiB
    max_object_bytes: int       # the largest object a worker stages
    lanes: int                  # threads that may move bytes at once (workers + the demoter)
    site: StorageSite | None    # the cache directory of a local disk tier (None: --null-io, or no disk tier)
    payloads: object = None     # the payload pool (simulated.Payloads): a simulated tier rebuilds what it hands back
    writer: str = "r0"          # this process's name in a shared namespace
    gpu: object = None          # the device backend of a real GPU tier, or None
    io_unit_bytes: int = 0      # --io-unit layer: the most one I/O of the bottom tier moves (0: a whole block)
    null_io: bool = False       # --null-io: every tier is the null tier
    run_id: str = ""            # the run's name: a remote tier's namespace
    media: dict = field(default_factory=dict)  # Settings.media: each medium's own section
    io_bytes: int = 0           # the largest single I/O (an object, or a part of a larger one): a GPU lane's staging
    engines: dict = field(default_factory=dict)  # the disk engines found (catalog.Media.engines), by name
    paging: object = None       # a real GPU tier's paged geometry (paged.Paging), or None: contiguous slots
    paging_note: str = ""       # why --gpu-layout auto kept contiguous slots
    batch: int = 0              # the blocks one worker's batch holds (run/sizing.batch_depth; 0: one at a time)

    def section(self, kind: TierKind):
        """The settings section a medium declared (its defaults when the settings hold none)."""
        return media.of(self.media, kind.name, kind.section)


def _holds_nothing(_settings) -> int:
    return 0


def _chose_nothing(_settings, _tier) -> dict:
    return {}


@dataclass(frozen=True)
class TierKind:
    """One medium.

    build(ctx) -> (tier or None, note); most_bytes(tier settings) -> the most it may hold, known before it is
    built (the memory budget counts the bookkeeping of every block the stack can hold); resolved(tier settings,
    its tier) -> {dotted key: value} of what an automatic setting chose (settings.yaml repeats the run);
    section: its settings section (a config.media.section dataclass), or None; contract: the variants the
    contract test builds, or contract(engines) -> them where they depend on the engines found;
    make_for_test(variant, directory, capacity, slot, server, engines) -> its tier (None: not on this machine),
    and local_server(folder, **options) -> localserver.LocalServer: the real server its tests and bench start
    (the fixture <name>_server of tests/conftest.py, made for every medium that declares one; None: it needs
    none). A remote medium names the URL schemes it serves and open_store(url, its settings section) -> its
    store (clean --remote-url opens one). shared_files(engine, slot_bytes, name) -> open(directory, capacity,
    writer): a tier of files other processes read by name (the handoff folder), from the medium that has one.
    """

    name: str
    level: int
    build: Callable[[StackContext], tuple[object | None, str]]
    most_bytes: Callable[[object], int] = _holds_nothing
    resolved: Callable[[object, object], dict] = _chose_nothing
    contract: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = ()
    make_for_test: Callable | None = None
    local_server: Callable | None = None
    schemes: tuple[str, ...] = ()
    open_store: Callable | None = None
    agree: Callable | None = None  # agree(tier settings, ranks, cache dir) -> ({dotted: value}, note): rank 0's choice
    section: type | None = None
    shared_files: Callable | None = None

    def contract_variants(self, engines: dict) -> tuple[str, ...]:
        return self.contract(engines) if callable(self.contract) else self.contract

    def settings_section(self):
        """Its settings section's defaults (a remote store opened outside a run: clean --remote-url)."""
        return self.section() if self.section else None


def scheme_of(url: str) -> str:
    return urlsplit(url).scheme.lower() if "://" in url else ""


def holds_no_slot(flag: str, gib: float, slot_bytes: int, tier: str) -> str:
    """The sentence for a capacity above 0 that holds no slot: a typo, not a way to turn the tier off."""
    return (f"{flag} {gib:g} holds no {slot_bytes / 2**20:.2f} MiB block; give at least "
            f"{slot_bytes / GiB:.4g} GiB, or 0 to turn the {tier} tier off.")


def capacity_of(gib: float, slot_bytes: int) -> int:
    """GiB of a setting rounded down to whole slots."""
    return int(gib * GiB) // slot_bytes * slot_bytes


