"""Settings values: conversion to the schema's types and bounds, with errors that name the key."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import field

from kv_cache.errors import UserError

# Upper bounds of every number a user can give: what a machine and a day can hold. A value past them is a typo,
# not a run (a 1e30 s duration never ends, a 1e30 GiB tier never finishes allocating its bookkeeping).
DAY_S = 86_400            # durations, waits, think times: a day
MAX_TOKENS = 1 << 24      # token counts: 16.7 M, beyond any model's context
MAX_GIB = 1 << 20         # capacities: 1 PiB
MAX_COUNT = 1_000_000_000  # counts of requests, conversations, cycles


def coerce(name: str, typ, value, meta: dict, where: str):
    """Return value converted to typ, or raise UserError naming the key."""
    def bad(what: str):
        # where: the flag or --set that gave the value, else the config file: the user fixes it there
        see = "see config.yaml" if where.startswith("config file") else "see --help"
        return UserError(f"{where}: {name} {what}; got {value!r} ({see}: {meta.get('help', '')})")

    origin = typing.get_origin(typ)
    if typ is bool:
        if isinstance(value, bool):
            out = value
        elif isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            out = value.lower() in ("true", "yes", "1", "on")
        else:
            raise bad("must be true or false")
    elif typ is int:
        if isinstance(value, bool):
            raise bad("must be an integer")
        try:
            out = int(value) if isinstance(value, (int, str)) else _int_from_float(value)
        except (TypeError, ValueError):
            raise bad("must be an integer") from None
    elif typ is float:
        if isinstance(value, bool):
            raise bad("must be a number")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise bad("must be a number") from None
    elif typ is str:
        if isinstance(value, bool) and {"off", "on"} & set(meta.get("choices") or ()):
            value = "on" if value else "off"  # YAML reads a bare off / on as a boolean
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise bad("must be a string")
        out = str(value)
    elif origin is tuple:
        item_t = typing.get_args(typ)[0]
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or len(items) != 2:
            raise bad("must be a range of two values [low, high]")
        out = tuple(coerce(name, item_t, v, meta, where) for v in items)
        if out[0] > out[1]:
            raise bad("must have low <= high")
    elif typ is dict or origin is dict:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise bad("must be a mapping")
        out = dict(value)
    else:  # pragma: no cover - schema error, not user error
        raise TypeError(f"unsupported schema type {typ} for {name}")
    _check_bounds(name, out, meta, bad)
    return out


def _int_from_float(value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError


def _check_bounds(name, out, meta, bad):
    choices, lo, hi = meta.get("choices"), meta.get("lo"), meta.get("hi")
    if choices and out not in choices:
        raise bad(f"must be one of {', '.join(choices)}")
    values = out if isinstance(out, tuple) else (out,)
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):  # NaN passes every comparison below
            raise bad("must be a finite number")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if lo is not None and v < lo:
                raise bad(f"must be >= {lo}")
            if hi is not None and v > hi:
                raise bad(f"must be <= {hi}")


def key(default, help: str, flag: str | None = None, choices=None, lo=None, hi=None):
    """A schema field with its documentation and bounds."""
    meta = {"help": help, "flag": flag, "choices": choices, "lo": lo, "hi": hi}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def parse_mix(text: str, known: tuple[str, ...], setting: str) -> dict[str, float]:
    """'chatbot=1,coding=2' -> normalised weights; names must be among known; setting: the flag, as the user
    wrote it (--qos-mix)."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in known:
            raise UserError(f"{setting}: '{part}' is not name=weight with a name among {', '.join(known)}.")
        try:
            w = float(value)
        except ValueError:
            raise UserError(f"{setting}: weight of {name} must be a number, got {value!r}.") from None
        if not math.isfinite(w) or w < 0:
            raise UserError(f"{setting}: weight of {name} must be a finite number >= 0, got {value!r}.")
        weights[name.strip()] = w
    total = sum(weights.values())
    if total <= 0:
        raise UserError(f"{setting}: at least one name needs a positive weight.")
    return {k: v / total for k, v in weights.items()}


# Their flags carry the section's name: --autoscale-step-s, --semantic-threshold.
PREFIXED_SECTIONS = ("qos", "autoscale", "disagg", "semantic")


def flag_name(dotted: str, f: dataclasses.Field) -> str:
    if dotted.startswith("media."):  # a medium's own section: --<medium>-<key>
        _, medium, leaf = dotted.split(".")
        return f.metadata.get("flag") or f"--{medium}-{leaf}".replace("_", "-")
    section, leaf = dotted.split(".")[0], dotted.split(".")[-1]
    prefix = f"{section}-" if section in PREFIXED_SECTIONS else ""
    return f.metadata.get("flag") or "--" + (prefix + leaf).replace("_", "-")


def is_flag_key(dotted: str, typ) -> bool:
    """Keys that get a dedicated CLI flag (nested profiles and models go through --set)."""
    return dotted.count(".") == 1 and typ is not dict
