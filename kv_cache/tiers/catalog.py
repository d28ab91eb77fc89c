"""The media and disk engines found in this package, once, as one object handed down (``Media``).

``find_media()`` lists the package and reads each module's declarations: ``MEDIUM`` (a ``kinds.TierKind``) and
``ENGINES`` (the disk engines it defines). No list names them and no module registers anything on import, so
the order files are imported in cannot hide an engine from a medium (the contract cases of the disk tier are
computed from the engines found, whatever their module's name). The entry points call it once (through
``run.registry.discover``) and pass the result down: the stack is built from it, the flags' choices and the
settings sections are read from it, a test adds a throwaway engine to a copy and sees it covered.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field, replace

from kv_cache.tiers.kinds import StackContext, TierKind, scheme_of


@dataclass(frozen=True)
class Media:
    """Every medium (level order, fastest first) and every disk engine (by name)."""

    kinds: tuple[TierKind, ...]
    engines: dict = field(default_factory=dict)

    def by_name(self) -> dict[str, TierKind]:
        return {k.name: k for k in self.kinds}

    def sections(self) -> dict[str, type]:
        """medium -> its settings section: what config.resolve takes."""
        return {k.name: k.section for k in self.kinds if k.section is not None}

    def with_engine(self, engine) -> Media:
        """A copy with one more engine (a test's throwaway engine, covered like the others)."""
        return replace(self, engines={**self.engines, engine.name: engine})

    def with_kind(self, kind: TierKind, without: tuple[str, ...] = ()) -> Media:
        """A copy with one more medium (and some left out): a test's own bottom tier."""
        kept = [k for k in self.kinds if k.name not in without and k.name != kind.name]
        return replace(self, kinds=tuple(sorted([*kept, kind], key=lambda k: k.level)))

    def contract_cases(self) -> list[str]:
        """<medium>/<variant> of every contract case each medium declares, from the engines found."""
        return [f"{k.name}/{v}" for k in self.kinds for v in k.contract_variants(self.engines)]

    def remote_kind(self, url: str) -> TierKind | None:
        """The medium that serves url's scheme (redis://, s3://, ...), or None."""
        scheme = scheme_of(url)
        return next((k for k in self.kinds if scheme in k.schemes), None)

    def schemes_served(self) -> str:
        """Every scheme a medium serves, as a user types it: 'redis://, rediss://, s3://, ...'."""
        return ", ".join(f"{x}://" for x in sorted(x for k in self.kinds for x in k.schemes))

    def resolved_settings(self, settings, tiers: list) -> dict:
        """{dotted key: value} of what each built tier's automatic settings chose (its size, say)."""
        by_name = {t.name: t for t in tiers}
        out: dict = {}
        for kind in self.kinds:
            if kind.name in by_name:
                out.update(kind.resolved(settings, by_name[kind.name]))
        return out

    def agreed_settings(self, settings, ranks: int, cache_dir: str) -> tuple[dict, list[str]]:
        """Under MPI, what rank 0 chooses for every rank's automatic settings (a rank choosing alone would see
        what its peers already took): {dotted key: value} and the lines that say so."""
        values, notes = {}, []
        for kind in self.kinds:
            if kind.agree is not None:
                chosen, note = kind.agree(settings, ranks, cache_dir)
                values.update(chosen)
                notes += [note] if note else []
        return values, notes

    def build_stack(self, ctx: StackContext) -> tuple[list, list[str]]:
        """The ordered tier list (fastest first) and the lines saying which tiers are off and why."""
        ctx = replace(ctx, engines=ctx.engines or self.engines)
        tiers, notes = [], []
        try:
            for kind in self.kinds:
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

    def shared_files(self, engine: str, slot_bytes: int, name: str = "handoff"):
        """open(directory, capacity_bytes, writer): a file-per-block tier other processes read by name (the
        handoff folder of disaggregated nodes), from the medium that declares one."""
        kind = next(k for k in self.kinds if k.shared_files is not None)
        return kind.shared_files(self.engines[engine], slot_bytes, name)


def find_media() -> Media:
    """Every module of this package imported once (Python keeps it), its MEDIUM and ENGINES read."""
    import kv_cache.tiers as package

    kinds, engines = [], {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if isinstance(getattr(module, "MEDIUM", None), TierKind):
            kinds.append(module.MEDIUM)
        for engine in getattr(module, "ENGINES", ()):
            engines[engine.name] = engine
    return Media(tuple(sorted(kinds, key=lambda k: k.level)), dict(sorted(engines.items())))


def accounting_stack(capacities: list[tuple[str, int]], slot_bytes: int) -> list:
    """Tiers that keep the slot accounting and move no byte, one per (name, capacity in bytes): the stack a
    policy is replayed on (the capacity curve of a policy other than LRU)."""
    from kv_cache.tiers.null import NullTier

    return [NullTier(name, capacity, slot_bytes) for name, capacity in capacities if capacity >= slot_bytes]
