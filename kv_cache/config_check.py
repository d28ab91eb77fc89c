"""Settings values: conversion to the schema's types and bounds, with errors that name the key."""

from __future__ import annotations

import typing

from kv_cache.errors import UserError


def coerce(name: str, typ, value, meta: dict, where: str):
    """Return value converted to typ, or raise UserError naming the key."""
    def bad(what: str):
        return UserError(f"{where}: {name} {what}; got {value!r}. "
                         f"See config.yaml for what it means ({meta.get('help', '')})")

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
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if lo is not None and v < lo:
                raise bad(f"must be >= {lo}")
            if hi is not None and v > hi:
                raise bad(f"must be <= {hi}")
