"""Every extension point, found once and handed down: ``discover()`` -> ``Registry``.

The media and disk engines (tiers/: each module's MEDIUM and ENGINES), the media's settings sections, the
eviction policies (cache/policies/: the table the --policy flag reads), the handoff transports
(lifecycle/handoff/: each module's TRANSPORT) and the fleet's routers (fleet/routers/: each module's ROUTER).
The entry points (the command line, the MLPerf wrapper, the benches, the tests' conftest) call ``discover()``
once and pass the registry down; nothing below them reads a table as a global, so what is found does not depend
on which modules happen to be imported first.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field, replace

from kv_cache.cache.policies import POLICIES
from kv_cache.tiers.catalog import Media, find_media


@dataclass(frozen=True)
class Registry:
    media: Media
    policies: dict = field(default_factory=dict)     # name -> policy class (cache.policies.base.Policy)
    transports: dict = field(default_factory=dict)   # name -> lifecycle.handoff.Transport
    routers: dict = field(default_factory=dict)      # name -> fleet.routers.base.Router subclass

    @property
    def engines(self) -> dict:
        return self.media.engines

    def sections(self) -> dict[str, type]:
        return self.media.sections()

    def with_engine(self, engine) -> Registry:
        return replace(self, media=self.media.with_engine(engine))

    def transport_of(self, url: str):
        """The transport whose scheme url starts with, or None."""
        return next((t for t in self.transports.values() if url.startswith(t.scheme)), None)


def _named(package, attribute: str) -> dict:
    """name -> the object each module of package names as attribute, sorted by name."""
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if (t := getattr(module, attribute, None)) is not None:
            found[t.name] = t
    return dict(sorted(found.items()))


def discover() -> Registry:
    """The media, engines, sections, policies, transports and routers of this installation."""
    import kv_cache.fleet.routers as routers
    import kv_cache.lifecycle.handoff as handoff

    return Registry(find_media(), dict(POLICIES), _named(handoff, "TRANSPORT"), _named(routers, "ROUTER"))
