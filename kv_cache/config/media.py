"""Settings sections that belong to one storage medium, declared in that medium's own module.

A medium (``tiers/<medium>.py``) declares its section with ``@section("valkey")`` on a frozen dataclass of
``key()`` fields. The schema finds it here: config.yaml holds it under ``media.<medium>``, every key gets a flag
``--<medium>-<key>``, and ``--set media.<medium>.<key>=...`` sets it. The schema never names a medium, so a
new one is its module alone. The medium's ``TierKind`` names its section; ``config.resolve`` takes every section
as an argument (``tiers.catalog.Media.sections()``, from the media found once), so settings are never read
against whatever modules happen to be imported yet, and no table here is filled by an import.

A shared leaf: it imports nothing of the stages.
"""

from __future__ import annotations

import dataclasses


def section(name: str):
    """Class decorator: the settings section of medium `name` (a frozen dataclass of key() fields)."""
    def wrap(cls):
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"the settings section of {name} must be a dataclass")
        cls.medium = name
        return cls
    return wrap


def defaults(sections: dict[str, type]) -> dict:
    """media.<medium> -> the section's defaults, as a plain mapping (config.yaml's media section)."""
    return {name: dataclasses.asdict(cls()) for name, cls in sorted(sections.items())}


def of(media: dict, name: str, cls: type | None):
    """The section of medium `name` from resolved settings (cls's defaults where settings came from elsewhere)."""
    got = media.get(name)
    return got if got is not None or cls is None else cls()
