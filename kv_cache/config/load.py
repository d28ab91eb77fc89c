"""Loading settings: walking the schema, reading a config file, merging defaults < file < --set < flags.

Every error names what the user typed: the flag, the ``--set`` item or the config file and its key.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from pathlib import Path
from typing import Any

import yaml

from kv_cache.config import media
from kv_cache.config.keys import coerce, flag_name
from kv_cache.config.schema import REPO_CONFIG, Settings
from kv_cache.errors import UserError
from kv_cache.inputs import read_text
from kv_cache.model import check_model


@functools.cache
def _hints(cls) -> dict[str, Any]:
    """A dataclass's resolved field types (typing resolves the annotations' strings anew at each call)."""
    return typing.get_type_hints(cls)


def iter_keys(cls=Settings, prefix: str = ""):
    """Yield (dotted name, field, type) for every leaf key of the schema."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        typ = hints[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(typ):
            yield from iter_keys(typ, name + ".")
        else:
            yield name, f, typ


def iter_media_keys(sections: dict[str, type]):
    """Yield (media.<medium>.<key>, field, type) for every key of every medium's section (sections: the
    registry's, medium -> its settings section)."""
    for name, cls in sorted(sections.items()):
        yield from iter_keys(cls, f"media.{name}.")


def default_dict(sections: dict[str, type]) -> dict:
    out = _to_plain(Settings().to_dict())
    out["media"] = _to_plain(media.defaults(sections))
    return out


def _to_plain(obj):
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return [_to_plain(v) for v in obj]
    return obj


def _origin(origins: dict, dotted: str, where: str) -> str:
    """What the user typed that gave dotted its value: its own flag or --set, else that of the section it is in
    (--set run={...}), else the config file."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in origins:
            return origins[".".join(parts[:n])]
    below = sorted(k for k in origins if k.startswith(dotted + "."))  # --set nosuch.key=1 made the section
    return origins[below[0]] if below else where


def _build(cls, data: dict, where: str, prefix: str = "", origins: dict | None = None,
           sections: dict[str, type] | None = None):
    """Build dataclass cls from a plain mapping, refusing unknown keys.

    origins: dotted key -> the flag or --set that gave its value (errors name it, not the file); sections: the
    media's settings sections (Settings' media).
    """
    origins = origins or {}
    section = prefix.rstrip(".")
    if not isinstance(data, dict):
        raise UserError(f"{_origin(origins, section, where)}: section {section or '(top)'} must be a mapping, got "
                        f"{data!r}.")
    hints = _hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        near = difflib.get_close_matches(unknown[0], list(names), 3)
        hint = (f"did you mean {' or '.join(prefix + n for n in near)}?" if near else
                f"known here: {', '.join(prefix + n for n in names)}" if len(names) <= 16 else
                f"{len(names)} keys are known here (config.yaml lists them)")
        raise UserError(f"{_origin(origins, prefix + unknown[0], where)}: unknown key '{prefix}{unknown[0]}' "
                        f"({hint}).")
    kwargs = {}
    for fname, value in data.items():
        typ = hints[fname]
        if cls is Settings and fname == "media":
            kwargs[fname] = _media(value, where, origins, sections or {})
        elif dataclasses.is_dataclass(typ):
            kwargs[fname] = _build(typ, value, where, f"{prefix}{fname}.", origins)
        else:
            dotted = prefix + fname
            kwargs[fname] = coerce(dotted, typ, value, dict(names[fname].metadata), _origin(origins, dotted, where))
    return cls(**kwargs)


def _media(data, where: str, origins: dict, sections: dict[str, type]) -> dict:
    """media.<medium> sections, each built by the section its medium's module declared."""
    if not isinstance(data, dict):
        raise UserError(f"{_origin(origins, 'media', where)}: section media must be a mapping, got {data!r}.")
    unknown = sorted(set(data) - set(sections))
    if unknown:
        raise UserError(f"{_origin(origins, 'media.' + unknown[0], where)}: unknown medium 'media.{unknown[0]}' "
                        f"(known: {', '.join(sorted(sections)) or 'none'}).")
    return {name: _build(cls, data.get(name) or {}, where, f"media.{name}.", origins)
            for name, cls in sorted(sections.items())}


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "models":
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _set_dotted(tree: dict, dotted: str, value, where: str = "", origin: str = "") -> None:
    parts = dotted.split(".")
    node = tree
    for i, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):  # a settings file made it a scalar: that file is what is wrong
            section = ".".join(parts[:i + 1])
            raise UserError(f"{where}: section {section} must be a mapping, got {node!r} (so {origin or dotted} "
                            f"cannot set a key in it)." if where else f"--set {dotted}: '{p}' is not a section.")
    node[parts[-1]] = value


CONFIG_LIMIT = 4 << 20  # config.yaml is 20 KB; a settings file of megabytes is not one


def read_config_file(path: Path, flag: str = "--config", what: str = "config file") -> dict:
    """Read a YAML settings file; a missing, special, huge, binary or malformed file is a UserError naming it as
    `what` and the flag that gave it."""
    text = read_text(str(path), what, CONFIG_LIMIT, f"pass a YAML file to {flag}")
    try:
        data = yaml.safe_load(text)
    except RecursionError:  # a hostile file nests lists thousands deep: the parser's recursion runs out
        raise UserError(f"{what} {path} ({flag}) nests deeper than a settings file can; give a flat YAML mapping "
                        f"of keys.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}" if mark else ""
        raise UserError(f"{what} {path}{at} ({flag}) is not valid YAML ({getattr(e, 'problem', e)}).") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} ({flag}) must hold a mapping of keys, not {type(data).__name__}.")
    return data


def resolve(config_path: str | None, sets: list[str], flags: dict[str, Any], typed: dict[str, str] | None = None,
            *, media_sections: dict[str, type]) -> Settings:
    """Merge defaults < config file < --set < flags into one validated Settings.

    typed: dotted key -> what the user typed for a --set made on their behalf (an MLPerf reference flag);
    media_sections: medium -> its settings section (the registry's sections(): every medium found), given,
    not read from whatever modules happen to be imported."""
    typed = typed or {}
    tree = default_dict(media_sections)
    path = Path(config_path) if config_path else (REPO_CONFIG if REPO_CONFIG.exists() else None)
    if path is not None:
        tree = _deep_merge(tree, read_config_file(path))
    where = f"config file {path}" if path else "settings"
    origins: dict[str, str] = {}
    for item in sets:
        if "=" not in item:
            raise UserError(f"--set {item}: expected section.key=value.")
        dotted, value = item.split("=", 1)
        dotted = dotted.strip()
        try:
            parsed = yaml.safe_load(value) if value else ""
        except yaml.YAMLError as e:
            raise UserError(f"--set {item}: the value is not valid YAML ({getattr(e, 'problem', e)}); quote it "
                            f"or write it as in config.yaml.") from None
        if _section(dotted) and not isinstance(parsed, dict):
            raise UserError(f"--set {item}: {dotted} is a section; set one of its keys (--set {dotted}.KEY=VALUE) "
                            f"or give a mapping ({{key: value, ...}}).")
        origins[dotted] = typed.get(dotted, f"--set {dotted}")
        _set_dotted(tree, dotted, parsed, where if path is not None else "", origins[dotted])
    fields = {d: f for d, f, _ in (*iter_keys(Settings), *iter_media_keys(media_sections))}
    for dotted, value in flags.items():
        origins[dotted] = flag_name(dotted, fields[dotted]) if dotted in fields else f"--{dotted}"
        _set_dotted(tree, dotted, value, where if path is not None else "", origins[dotted])
    settings = _build(Settings, tree, where, origins=origins, sections=media_sections)
    for name, spec in settings.models.items():  # checked here, where what set them is known
        check_model(name, spec, _origin(origins, f"models.{name}", where))
    return settings


def _section(dotted: str) -> bool:
    """Whether dotted names a section of the schema (run, profiles.chatbot), not a key."""
    cls = Settings
    for part in dotted.split("."):
        hints = _hints(cls) if dataclasses.is_dataclass(cls) else {}
        if part not in hints:
            return False
        cls = hints[part]
    return dataclasses.is_dataclass(cls)


def replace(settings: Settings, dotted: str, value) -> Settings:
    """Return settings with one key changed (used by the runner's resolved defaults)."""
    section, name = dotted.split(".")
    sec = dataclasses.replace(getattr(settings, section), **{name: value})
    return dataclasses.replace(settings, **{section: sec})
