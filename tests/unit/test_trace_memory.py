"""A replayed trace's records in the memory budget: 2-7 times its files once loaded, up to 10 while they are read.

The budget said "a trace's records take about what its file does": measured, a Mooncake trace held 4.5 times its
file, an Azure one 6.8, and 9.3 while it was read. Each format's factor (sources/trace_io.py) holds what its loader
really takes, the budget counts it, and a trace too large to read is refused before a byte of it is."""

import gc
import json
import random
import tracemalloc
from dataclasses import replace

import pytest
from conftest import SHARED_TRACES, needs_shared_traces
from found import REGISTRY, SECTIONS
from helpers import sparse_trace

from kv_cache.config import resolve
from kv_cache.errors import UserError
from kv_cache.run.budget import MemoryBudget, check_fits
from kv_cache.run.geometry import geometry
from kv_cache.run.sizing import check_traffic_fits, memory_budget
from kv_cache.run.traffic import build_traffic
from kv_cache.sources.trace_io import MEMORY_PER_FILE_BYTE

GiB = 2**30
HASH_IDS = ("mooncake", "bailian", "burstgpt", "azure")  # numbers only: many records to a MiB


def _bailian(path, records: int) -> None:
    """Bailian records of 200-4,000 tokens in 16-token blocks, some sharing a prefix (the real trace's shape)."""
    rng, fresh, rows = random.Random(1), 100_000, []
    for i in range(records):
        tokens = rng.randint(200, 4000)
        blocks, shared = -(-tokens // 16), rng.randint(0, 40)
        shared = min(shared, blocks)
        ids = [*range(1000, 1000 + shared), *range(fresh, fresh + blocks - shared)]
        fresh += blocks - shared
        rows.append(json.dumps({"chat_id": i, "parent_chat_id": -1, "timestamp": i / 100, "input_length": tokens,
                                "output_length": 100, "type": "text", "turn": 1, "hash_ids": ids}))
    path.write_text("\n".join(rows) + "\n")


def _burstgpt(src, path, copies: int) -> None:
    """The BurstGPT slice's rows `copies` times over, each copy after the one before (the slice is 16 KB: too little
    to tell a factor from what a run holds whatever its trace)."""
    head, *rows = src.read_text().splitlines()
    span = int(rows[-1].split(",")[0]) + 1
    out = [head]
    for k in range(copies):
        for row in rows:
            at, rest = row.split(",", 1)
            out.append(f"{int(at) + k * span},{rest}")
    path.write_text("\n".join(out) + "\n")


def _halves(src, tmp_path, most: int = 6000):
    """A trace file's first `most` records, and the first half of them (a JSON array's elements; lines otherwise, the
    header kept)."""
    text = src.read_text()
    if src.suffix == ".json":
        items = json.loads(text)[:most]
        parts = [json.dumps(items[:len(items) // 2]), json.dumps(items)]
    else:
        lines = text.splitlines()
        head, body = (lines[:1], lines[1:most + 1]) if src.suffix == ".csv" else ([], lines[:most])
        parts = ["\n".join(head + body[:len(body) // 2]) + "\n", "\n".join(head + body) + "\n"]
    out = []
    for name, part in zip(("half", "whole"), parts, strict=True):
        p = tmp_path / f"{name}{src.suffix}"
        p.write_text(part)
        out.append(p)
    return out


def _traffic_bytes(path, arrival: str, semantic: bool) -> tuple[int, int]:
    """tracemalloc's (held, peak) over building the traffic of a run replaying path (semantic: its text)."""
    s = resolve(None, [], {"trace.path": str(path), "schedule.arrival": arrival, "semantic.enabled": str(semantic),
                           "schedule.request_rate": "1"}, media_sections=SECTIONS)
    gc.collect()  # the garbage of what ran before is not freed inside the measurement
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        traffic = build_traffic(s, REGISTRY)
        held, peak = tracemalloc.get_traced_memory()
        del traffic
        return held - base, peak - base
    finally:
        tracemalloc.stop()


@needs_shared_traces
@pytest.mark.parametrize("name,fmt", [("mooncake/conversation_trace.jsonl", "mooncake"), ("bailian", "bailian"),
                                      ("burstgpt/BurstGPT_1.first400.csv", "burstgpt"),
                                      ("azure/AzureLLMInferenceTrace_conv.csv", "azure"),
                                      ("sharegpt/ShareGPT_V3_filtered_1000.json", "sharegpt"),
                                      ("sharegpt/ShareGPT_V3_filtered_1000.json", "text")])
def test_each_format_s_records_take_what_its_factor_says(tmp_path, name, fmt):
    if fmt == "bailian":
        src = tmp_path / "bailian.jsonl"
        _bailian(src, 3000)
    elif fmt == "burstgpt":
        src = tmp_path / "burstgpt.csv"
        _burstgpt(SHARED_TRACES / name, src, 16)
    else:
        src = SHARED_TRACES / name
    half, whole = _halves(src, tmp_path, 6000 if fmt in HASH_IDS else 600)
    semantic = fmt == "text"  # --semantic reads a ShareGPT file's conversations as text
    _traffic_bytes(half, "closed", semantic)  # a tokenizer's tables, made once: not the records'
    grown = whole.stat().st_size - half.stat().st_size
    held_factor, loading_factor = MEMORY_PER_FILE_BYTE[fmt]
    for arrival in ("closed", "poisson" if semantic else "trace"):  # closed-loop users hold the records again
        (h0, p0), (h1, p1) = _traffic_bytes(half, arrival, semantic), _traffic_bytes(whole, arrival, semantic)
        held, peak = (h1 - h0) / grown / held_factor, (p1 - p0) / grown / loading_factor
        assert 0.25 < held <= 1 and peak <= 1, (arrival, held, peak)


def _mooncake(path, records: int) -> int:
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 2048, "output_length": 10,
                                        "hash_ids": list(range(4 * i, 4 * i + 4))}) + "\n" for i in range(records)))
    return path.stat().st_size


def test_the_budget_counts_a_trace_s_records_and_says_how_to_replay_less(tmp_path):
    size = _mooncake(tmp_path / "m.jsonl", 200)
    s = resolve(None, [], {"trace.path": str(tmp_path / "m.jsonl")}, media_sections=SECTIONS)
    b = memory_budget(s, geometry(s), REGISTRY)
    assert b.trace_bytes == int(size * MEMORY_PER_FILE_BYTE["mooncake"][0]) > 0 and b.traffic_bytes == 0
    assert b.to_dict()["trace"] == b.trace_bytes
    assert b.total_bytes == replace(b, trace_bytes=0).total_bytes + b.trace_bytes
    semantic = resolve(None, [], {"trace.path": str(tmp_path / "m.jsonl"), "semantic.enabled": "true"},
                       media_sections=SECTIONS)
    assert memory_budget(semantic, geometry(semantic), REGISTRY).trace_bytes == int(size * 1.5)  # read as text
    with pytest.raises(UserError) as e:
        check_fits(MemoryBudget(GiB, GiB, 128 << 20, trace_bytes=30 * GiB), 4, 2 << 20, available=16 * GiB)
    text = " ".join(str(e.value).split())
    assert "the trace's records 30.00" in text and "replay a part of the trace (its first lines" in text


def test_a_trace_too_large_to_read_is_refused_before_it_is_read(tmp_path):
    """A sparse file: its first line a record, then a hole to 64 GiB. Reading it would take 448 GiB."""
    path = sparse_trace(tmp_path / "huge.jsonl", 64 * GiB)
    s = resolve(None, [], {"trace.path": str(path)}, media_sections=SECTIONS)
    with pytest.raises(UserError) as e:
        check_traffic_fits(s, 1, available=16 * GiB)
    text = " ".join(str(e.value).split())
    assert f"trace {path} (65,536 MiB of mooncake) takes about 448.00 GiB of memory while it is read" in text
    assert "(7.0 bytes a byte of it)" in text and "head -n N FILE > PART" in text
    check_traffic_fits(s, 1, available=512 * GiB)  # room for it: no refusal
