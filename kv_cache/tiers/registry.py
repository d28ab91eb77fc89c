"""The tier registry: every medium registers how it is built, and the stack is built from that data.

As fio's ioengines register themselves with their flags and leave the hooks
they lack empty, each tier module declares one ``TierKind`` (its name, its
level in the stack, fastest first, a builder that reads the settings, the
most it may hold, what an automatic choice resolved to, and the variants the
contract test runs) and registers it on import; a medium with settings of its
own declares their section in the same module (config/media.py). The media
are found by listing this package: no list names them. ``build_stack`` asks
each kind in level order for its tier; a kind that is off says why in one
line. The composition root hands in a ``StackContext`` and gets an ordered
list back: nothing above this package names a medium, and a new bottom tier
(a remote object store, say) is one module plus its tests.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kv_cache.config import media
from kv_cache.model import GiB


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
    fill: Callable | None = None  # fill(key, out) rebuilds a payload (a simulated tier hands back real bytes)
    writer: str = "r0"          # this process's name in a shared namespace
    gpu: object = None          # the device backend of a real GPU tier, or None
    io_unit_bytes: int = 0      # --io-unit layer: the most one I/O of the bottom tier moves (0: a whole block)
    null_io: bool = False       # --null-io: every tier is the null tier
    run_id: str = ""            # the run's name: a remote tier's namespace
    media: dict = field(default_factory=dict)  # Settings.media: each medium's own section
    io_bytes: int = 0           # the largest single I/O (an object, or a part of a larger one): a GPU lane's staging

    def section(self, medium: str):
        """The settings section a medium declared (its defaults when the settings hold none)."""
        return media.of(self.media, medium)


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
    contract: the variants the contract test builds (make_for_test(variant, directory, capacity, slot, server)),
    and local_server(folder, **options) -> localserver.LocalServer: the real server its tests and bench start
    (the fixture <name>_server of tests/conftest.py, made for every medium that declares one; None: it needs
    none). A remote medium names the URL schemes it serves and open_store(url, its settings section) -> its
    store (clean --remote-url opens one).
    """

    name: str
    level: int
    build: Callable[[StackContext], tuple[object | None, str]]
    most_bytes: Callable[[object], int] = _holds_nothing
    resolved: Callable[[object, object], dict] = _chose_nothing
    contract: tuple[str, ...] = ()
    make_for_test: Callable | None = None
    local_server: Callable | None = None
    schemes: tuple[str, ...] = ()
    open_store: Callable | None = None
    agree: Callable | None = None  # agree(tier settings, ranks, cache dir) -> ({dotted: value}, note): rank 0's choice


KINDS: dict[str, TierKind] = {}


def register(name: str, level: int, **hooks):
    """Decorator of a tier module's builder; the highest level is the bottom tier, the storage under test.
    hooks: most_bytes, resolved, contract, make_for_test, local_server (see TierKind)."""
    def wrap(build):
        KINDS[name] = TierKind(name, level, build, **hooks)
        return build
    return wrap


def most_blocks(settings, slot_bytes: int) -> int:
    """The most blocks the whole stack may hold with these tier settings (an upper bound, before building)."""
    return sum(kind.most_bytes(settings) // slot_bytes for kind in kinds())


def scheme_of(url: str) -> str:
    return urlsplit(url).scheme.lower() if "://" in url else ""


def remote_kind(url: str) -> TierKind | None:
    """The medium that serves url's scheme (redis://, s3://, ...), or None."""
    scheme = scheme_of(url)
    return next((k for k in kinds() if scheme in k.schemes), None)


def schemes_served() -> str:
    """Every scheme a medium serves, as a user types it: 'redis://, rediss://, s3://, ...'."""
    return ", ".join(f"{x}://" for x in sorted(x for k in kinds() for x in k.schemes))


def resolved_settings(settings, tiers: list) -> dict:
    """{dotted key: value} of what each built tier's automatic settings chose (its size, say)."""
    by_name = {t.name: t for t in tiers}
    out: dict = {}
    for kind in kinds():
        if kind.name in by_name:
            out.update(kind.resolved(settings, by_name[kind.name]))
    return out


def agreed_settings(settings, ranks: int, cache_dir: str) -> tuple[dict, list[str]]:
    """Under MPI, what rank 0 chooses for every rank's automatic settings (a rank choosing alone would see what
    its peers already took): {dotted key: value} and the lines that say so."""
    values, notes = {}, []
    for kind in kinds():
        if kind.agree is not None:
            chosen, note = kind.agree(settings, ranks, cache_dir)
            values.update(chosen)
            notes += [note] if note else []
    return values, notes


def holds_no_slot(flag: str, gib: float, slot_bytes: int, tier: str) -> str:
    """The sentence for a capacity above 0 that holds no slot: a typo, not a way to turn the tier off."""
    return (f"{flag} {gib:g} holds no {slot_bytes / 2**20:.2f} MiB block; give at least "
            f"{slot_bytes / GiB:.4g} GiB, or 0 to turn the {tier} tier off.")


_DISCOVERED: list[bool] = []  # the package's modules imported (once: an import registers only the first time)


def kinds_by_name() -> dict[str, TierKind]:
    """Every registered kind: importing each module of this package registers the media among them (and the
    engines of their own modules); the package is listed once, not on every call."""
    if not _DISCOVERED:
        import kv_cache.tiers as package

        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
        _DISCOVERED.append(True)
    return dict(KINDS)


def media_sections() -> dict[str, type]:
    """Every medium's settings section (config.media's @section), once every medium is found: what
    config.resolve takes."""
    kinds_by_name()
    return dict(media.SECTIONS)


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


_SHARED_FILES: list = []  # the opener of a file-per-block tier, registered by the medium that has one (nvme.py)


def register_shared_files(opener) -> None:
    """opener(engine, slot_bytes, name) -> open(directory, capacity_bytes, writer): how the disk medium makes a
    tier of files other processes read by name (the handoff folder). A hook, so that this module never imports
    a medium's (no import circle)."""
    _SHARED_FILES[:] = [opener]


def shared_files(engine: str, slot_bytes: int, name: str = "handoff"):
    """open(directory, capacity_bytes, writer): a file-per-block tier other processes read by name (the
    handoff folder of disaggregated nodes)."""
    if not _SHARED_FILES:
        kinds_by_name()  # the media register on import
    return _SHARED_FILES[0](engine, slot_bytes, name)


def accounting_stack(capacities: list[tuple[str, int]], slot_bytes: int) -> list:
    """Tiers that keep the slot accounting and move no byte, one per (name, capacity in bytes): the stack a
    policy is replayed on (the capacity curve of a policy other than LRU)."""
    from kv_cache.tiers.null import NullTier

    return [NullTier(name, capacity, slot_bytes) for name, capacity in capacities if capacity >= slot_bytes]
