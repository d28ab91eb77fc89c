"""The typed Results: its JSON schema is versioned, and a results file is read back field for field."""

import dataclasses
import json

import pytest
from results_fixture import results

from kv_cache.recorder.results_schema import SCHEMA_VERSION, Results, render_schema, stored_schema
from kv_cache.recorder.typed import SchemaError
from kv_cache.report.console import render


def test_the_schema_of_this_version_is_stored_and_unchanged():
    """An unannounced change fails here: bump SCHEMA_VERSION and store the new schema
    (python -m kv_cache.recorder.results_schema), keeping the old ones."""
    stored = stored_schema(SCHEMA_VERSION)
    assert stored is not None, (f"no schemas/results-v{SCHEMA_VERSION}.json: run python -m "
                                "kv_cache.recorder.results_schema")
    assert json.loads(render_schema()) == stored, (
        "the Results dataclasses changed without a new schema_version: bump SCHEMA_VERSION in "
        "kv_cache/recorder/results_schema.py, run python -m kv_cache.recorder.results_schema, and say what changed in "
        "the README")


def test_a_renamed_field_is_caught_by_the_schema_test():
    """The check above can fail: a Results with a field renamed no longer matches the stored schema."""
    from kv_cache.recorder import results_schema as schema

    fields = [(f.name if f.name != "completed" else "done", f.type, f) for f in dataclasses.fields(schema.Requests)]
    renamed = dataclasses.make_dataclass("Requests", [(n, t, dataclasses.field(default=f.default))
                                                      for n, t, f in fields])
    changed = json.loads(json.dumps(schema.json_schema(renamed)))
    assert changed != stored_schema()["properties"]["requests"]
    assert stored_schema()["properties"]["requests"] == schema.json_schema(schema.Requests)


def test_round_trip_through_json():
    r = results()
    data = json.loads(json.dumps(r.to_dict()))
    back = Results.from_dict(data)
    assert back.to_dict() == data and back.requests == r.requests and back.latency_ms == r.latency_ms
    assert back.bottom == "nvme" and back.latency("nvme", "read", "count") == 1
    assert back.mlperf_compatible.storage_read_p95_ms is None  # one sample has no p95 (issue 39: null + count)


def test_the_storage_figures_follow_the_bottom_tier_whatever_its_name():
    r = results(tiers=("cpu", "objectstore"))
    assert r.bottom == "objectstore"
    assert r.mlperf_compatible.storage_read_gbps > 0 and r.latency("objectstore", "read", "count") == 1
    assert "objectstore" in render(r)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d["requests"].update(done=d["requests"].pop("completed")), "does not know: done"),
    (lambda d: d["run"].pop("bottom_tier"), "lacks the key bottom_tier"),
    (lambda d: d.update(run=5), "run is not an object"),
    (lambda d: d.update(schema_version=1), "schema_version 1"),
    (lambda d: d["latency_ms"]["nvme"]["read"].update(p95="x", p99_9=1), "does not know: p99_9"),
])
def test_a_damaged_or_renamed_key_is_refused_by_name(damage, message):
    d = results().to_dict()
    damage(d)
    with pytest.raises(SchemaError, match=message):
        Results.from_dict(d)


# Mappings of untyped values on purpose: the settings trees (checked by the config schema when reused).
PLAIN = {"Results.settings", "Autoscale.settings", "Semantic.settings"}


def _untyped(cls, seen: set) -> list[str]:
    """Fields of cls (and of the dataclasses it holds) typed object, bare dict / list, or with Any inside."""
    import typing

    if cls in seen:
        return []
    seen.add(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        name = f"{cls.__name__}.{f.name}"
        stack = [tp]
        while stack:
            t = stack.pop()
            if dataclasses.is_dataclass(t):
                out += _untyped(t, seen)
            elif t in (object, dict, list) or (t is typing.Any and name not in PLAIN):
                out.append(name)
            else:
                stack += list(typing.get_args(t))
    return out


def test_every_field_of_the_results_and_of_a_run_is_typed():
    """Issue 28: 17 of 37 Results fields were bare dicts read by string keys; RunContext and Stages held object."""
    from kv_cache.run.pipeline import Stages
    from kv_cache.run.stack import RunContext

    assert _untyped(Results, set()) == []
    assert _untyped(RunContext, set()) == [] and _untyped(Stages, set()) == []
