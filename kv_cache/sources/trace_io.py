"""Reading trace files: paths, format detection, and records that are malformed.

Vocabulary: a *trace* is one file, a directory of files or a glob; its
*records* are lines (JSONL), rows (CSV) or array elements (JSON). A record
that cannot be used is reported with file:line and what was wrong, then
skipped and counted — or, with ``--strict``, it stops the run.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from kv_cache.errors import UserError
from kv_cache.inputs import check_text_file

FORMATS = ("sharegpt", "burstgpt", "azure", "mooncake", "bailian")
# What a format's records take in memory for each byte of its files: (once loaded, while loading, its peak).
# Measured with tracemalloc over this project's trace slices and twice their length (tests/unit/test_trace_memory.py
# holds the loaders to it): hash ids 4.4-4.7 and 4.4-5.1 (Python ints in lists), BurstGPT 4.7-5.4 and 4.7-7.5,
# Azure 6.0-6.8 and 6.0-9.3 (a timestamp string parsed per row), ShareGPT 2.0-2.4 and 3.8-4.6 (its tokens, as
# arrays), and ShareGPT read as text for --semantic 0.9-1.1 and 0.9-2.7; with room.
MEMORY_PER_FILE_BYTE = {"mooncake": (5.5, 7.0), "bailian": (5.5, 7.0), "burstgpt": (6.0, 10.0), "azure": (7.5, 12.5),
                        "sharegpt": (3.0, 6.0), "text": (1.5, 3.5)}
MAX_TOKENS = 1 << 24  # 16.7 M tokens: beyond any model's context; a larger count in a trace is an error
# Files are read with errors="surrogateescape": a byte that is not UTF-8 becomes one of these, so the
# record holding it is counted as malformed instead of being silently altered.
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


def not_utf8(text: str) -> bool:
    return _NOT_UTF8.search(text) is not None
SUFFIXES = (".json", ".jsonl", ".csv")


@dataclass
class TraceLog:
    """What loading a trace skipped, and why, and what it kept with a change (shown before the run, kept in the
    results)."""

    strict: bool = False
    skipped: Counter = field(default_factory=Counter)
    changed: Counter = field(default_factory=Counter)  # kept, amended: e.g. a missing answer given a fixed length
    examples: list[str] = field(default_factory=list)
    detected: str = ""

    def bad(self, where: str, why: str, kind: str = "malformed") -> None:
        if self.strict:
            raise UserError(f"{where}: {why} (--strict stops at the first bad record; drop it to skip and count).")
        self.skipped[kind] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {why}")

    def to_dict(self) -> dict:
        return {"format": self.detected, "skipped": dict(self.skipped), "examples": self.examples,
                "changed": dict(self.changed)}


def trace_files(path: str) -> list[str]:
    """The files a --trace argument names: a file, a directory (its trace files) or a glob; each a regular file
    whose first bytes are text (a FIFO would hang the run, a binary or UTF-16 file would print mojibake)."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(SUFFIXES))
        if not files:
            raise UserError(f"trace directory {path} holds no .json, .jsonl or .csv file.")
    elif os.path.exists(path):
        files = [path]
    else:
        files = [m for m in sorted(glob.glob(path)) if not os.path.isdir(m)]
        if not files:
            raise UserError(f"trace {path} matches no file; pass a file, a directory or a glob.")
    for f in files:
        check_text_file(f, "trace file", "pass a UTF-8 JSON, JSONL or CSV trace")
    return files


def trace_format(path: str, fmt: str) -> tuple[list[str], str]:
    """The files a --trace argument names and their format (fmt, or detected from the first file where "auto")."""
    files = trace_files(path)
    if fmt != "auto":
        return files, fmt
    found = {f: detect_format(f) for f in files}  # each file's first record: one line a file
    kinds = sorted(set(found.values()))
    if len(kinds) > 1:
        each = ", ".join(f"{next(f for f, k in found.items() if k == kind)} is {kind}" for kind in kinds)
        raise UserError(f"--trace {path} holds files of {len(kinds)} formats ({each}); its files play as one trace "
                        f"of one format: pass the files of one (a glob such as *.jsonl, or a folder of them).")
    return files, kinds[0]


def _first_line(path: str) -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            if line.strip():
                return line.strip()
    raise UserError(f"trace file {path} is empty.")


def opens_an_array(path: str) -> bool:
    """The file's first character past white space is '[' (a ShareGPT JSON array), read from its first 64 KiB:
    such a file is often one line of hundreds of MB, which _first_line would read whole each time it is asked."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return f.read(1 << 16).lstrip().startswith("[")


def detect_format(path: str) -> str:
    """Guess a file's format from its first record; a clear error when nothing fits."""
    if opens_an_array(path):
        return "sharegpt"
    first = _first_line(path)
    if first.startswith("{"):
        try:
            rec = json.loads(first)
        except json.JSONDecodeError:
            rec = {}
        if "conversations" in rec:
            return "sharegpt"
        if "chat_id" in rec or "parent_chat_id" in rec:
            return "bailian"
        if "hash_ids" in rec or "input_length" in rec:
            return "mooncake"
    header = {h.strip().lower() for h in first.split(",")}
    if {"request tokens", "response tokens"} <= header:
        return "burstgpt"
    if {"contexttokens", "generatedtokens"} <= header:
        return "azure"
    raise UserError(f"cannot tell the format of {path} from its first record ({first[:80]!r}); "
                    f"pass --trace-format {'|'.join(FORMATS)}.")


def jsonl_records(path: str, log: TraceLog) -> Iterator[tuple[str, dict]]:
    """(file:line, object) for each JSON line; malformed lines go to the log."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            if not_utf8(line):
                log.bad(where, "the line is not valid UTF-8")
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                log.bad(where, f"not valid JSON ({e.msg})")
                continue
            if not isinstance(rec, dict):
                log.bad(where, "a record must be a JSON object")
                continue
            yield where, rec


def csv_rows(path: str, required: tuple[str, ...], log: TraceLog) -> Iterator[tuple[str, dict]]:
    """(file:line, row) for each CSV row, after checking the header has the required columns."""
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in required if c not in header]
        if missing:
            raise UserError(f"{path}: missing column {missing[0]!r} (header: {', '.join(header) or 'none'}).")
        reader.fieldnames = header
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if any(isinstance(v, str) and not_utf8(v) for v in row.values()):
                log.bad(where, "the row is not valid UTF-8")
                continue
            yield where, row


def need_time(rec: dict, name: str, parse, hint: str, where: str, log: TraceLog) -> float | None:
    """parse(rec[name]) as seconds, or None (logged with hint) when it does not parse."""
    try:
        t = float(parse(rec[name]))
        if not math.isfinite(t) or abs(t) > 1e12:  # past year 33,000 in epoch seconds: not a time
            raise ValueError
        return t
    except (TypeError, ValueError, AttributeError, OverflowError):
        log.bad(where, f"{name} must be {hint}, got {rec.get(name)!r}")
        return None


def need_int(rec: dict, name: str, where: str, log: TraceLog, minimum: int = 0) -> int | None:
    """rec[name] as an int >= minimum, or None (logged) when absent or wrong."""
    value = rec.get(name)
    try:
        out = int(value)
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        log.bad(where, f"field {name!r} must be an integer, got {value!r}")
        return None
    if out < minimum or out > MAX_TOKENS:
        log.bad(where, f"field {name!r} must be within {minimum}..{MAX_TOKENS:,}, got {out}")
        return None
    return out


MAX_SPAN_S = 365 * 86400.0  # a year: a later timestamp is a broken record, and the run would wait for it


class ArrivalClock:
    """Checks that a file's timestamps never go backwards and plays several files one after another."""

    def __init__(self) -> None:
        self.offset_s = 0.0
        self.last_s: float | None = None
        self.path = ""

    def arrival(self, path: str, where: str, t_s: float) -> float:
        if path != self.path:  # a new file starts where the previous one ended
            self.offset_s = self.last_s if self.last_s is not None else 0.0
            self.path, self._file_last, self._file_first = path, None, t_s
        if not math.isfinite(t_s) or t_s - self._file_first > MAX_SPAN_S:
            raise UserError(f"{where}: timestamp {t_s:g} s is {t_s - self._file_first:g} s after the file's first: "
                            f"a trace spans at most {MAX_SPAN_S / 86400:g} days here (is the field in the unit its "
                            f"format says?); fix the record or drop it.")
        if self._file_last is not None and t_s < self._file_last:
            raise UserError(f"{where}: timestamp goes backwards ({t_s:g} s after {self._file_last:g} s); "
                            f"a trace must be sorted by time.")
        self._file_last = t_s
        self.last_s = self.offset_s + t_s
        return self.last_s
