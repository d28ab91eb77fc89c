"""Typed data from plain JSON: dataclasses built from mappings with every value's type checked, and the JSON
schema of those dataclasses (what results.json and its sections are checked against).

A value of the wrong type, a number that is not finite or not within 64 bits, a key the dataclass does not
know or lacks: a SchemaError naming the key path. A shared piece of the recorder: results_schema.py and the loaders
of the Results use it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import types
import typing
from typing import Any, Union


class SchemaError(ValueError):
    """A results file that does not follow the schema this tool reads."""


class SchemaVersionError(SchemaError):
    """A whole results file of another schema version: not damaged, written by another version of the tool."""

    def __init__(self, where: str, version, reads: int):
        self.version, self.reads = version, reads
        super().__init__(self.of(where))

    def of(self, where: str) -> str:
        age = "an older" if isinstance(self.version, int) and self.version < self.reads else "another"
        return (f"{where} has schema_version {self.version} ({age} version of kv-cache-bench wrote it), and this "
                f"version reads {self.reads}: re-run that run with this version, or read it with the version that "
                f"wrote it")


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def load_section(tp, data, where: str = "results"):
    """A section (a dataclass of sections.py, or any schema type) built from plain data, its types checked."""
    return load(tp, data, where)


def _optional(tp) -> tuple[bool, Any]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return True, rest[0] if len(rest) == 1 else functools.reduce(operator.or_, rest)
    return False, tp


def load(tp, value, where: str):
    optional, tp = _optional(tp)
    if value is None:
        if optional or tp is Any:
            return None
        raise SchemaError(f"{where} is null where the schema needs a value")
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SchemaError(f"{where} is not an object")
        hints = _hints(tp)
        unknown = set(value) - set(hints)
        if unknown:
            raise SchemaError(f"{where} has keys the schema does not know: {', '.join(sorted(unknown))}")
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = load(hints[f.name], value[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SchemaError(f"{where} lacks the key {f.name}")
        return tp(**kwargs)
    if origin is dict:
        _, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise SchemaError(f"{where} is not an object")
        return {k: load(vt, v, f"{where}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise SchemaError(f"{where} is not an array")
        (vt,) = typing.get_args(tp) or (Any,)
        return [load(vt, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return load(option, value, where)
            except SchemaError:
                continue
        raise SchemaError(f"{where} is none of {' | '.join(_name(a) for a in typing.get_args(tp))}: {value!r:.40}")
    return _scalar(tp, value, where)


def _name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _scalar(tp, value, where: str):
    """A leaf value of the type the schema says, a number finite and within 64 bits (a file with Infinity or
    10^400 in it was not written by this tool)."""
    if tp is Any or tp in (dict, list):  # a plain JSON value: its numbers are still checked
        _plain_numbers(value, where)
        return value
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str)}.get(tp)
    if ok is None or not ok(value):
        raise SchemaError(f"{where} is {_kind(value)} where the schema needs {_JSON.get(tp, _name(tp))}")
    _plain_numbers(value, where)
    return value


def _kind(value) -> str:
    return "null" if value is None else _JSON.get(type(value), type(value).__name__) + f" {value!r:.40}"


def _plain_numbers(value, where: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, float) and not math.isfinite(value) or isinstance(value, (int, float)) \
            and abs(value) >= 2**63:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:20]}... ({len(repr(value))} characters)"
        raise SchemaError(f"{where} is {shown}, not a finite number within 64 bits")
    if isinstance(value, dict):
        for k, v in value.items():
            _plain_numbers(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _plain_numbers(v, f"{where}[{i}]")


_JSON = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object", list: "array"}


def json_schema(tp) -> dict:
    """The JSON schema of a type (draft 2020-12 subset), generated from the dataclasses."""
    optional, tp = _optional(tp)
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        out = {"type": "object", "title": tp.__name__, "additionalProperties": False,
               "properties": {f.name: json_schema(hints[f.name]) for f in dataclasses.fields(tp)},
               "required": [f.name for f in dataclasses.fields(tp)]}
    elif typing.get_origin(tp) is dict:
        out = {"type": "object", "additionalProperties": json_schema(typing.get_args(tp)[1])}
    elif typing.get_origin(tp) is list:
        args = typing.get_args(tp)
        out = {"type": "array", **({"items": json_schema(args[0])} if args else {})}
    elif typing.get_origin(tp) in (Union, types.UnionType):
        out = {"anyOf": [json_schema(a) for a in typing.get_args(tp)]}
    else:
        out = {"type": _JSON.get(tp, "object")} if tp is not Any else {}
        if tp is float:
            out = {"type": ["number", "integer"]}
    if optional:
        return {"anyOf": [out, {"type": "null"}]}
    return out
