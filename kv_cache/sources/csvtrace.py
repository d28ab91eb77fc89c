"""Length-only CSV traces: BurstGPT and the Azure LLM inference traces.

They carry arrival times and token counts, no content: every request's
tokens are unique (stream (UNIQUE, row)), except that BurstGPT rows of one
``Session ID`` (its v3 layout) carry the session's history as their prefix.
BurstGPT rows that failed (0 response tokens) are skipped and counted unless
asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from kv_cache.sources.content import OUTPUT, UNIQUE, stream
from kv_cache.sources.trace_io import ArrivalClock, TraceLog, csv_rows, need_int, need_time
from kv_cache.types import HISTORY, USER, Request

BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(slots=True)
class LengthRecord:
    """A request known by its lengths; history_of is the record whose prompt + answer it extends."""

    index: int
    arrival_s: float
    session: int
    input_length: int
    output_length: int
    fmt: str
    history_of: LengthRecord | None = None

    def output(self, vocab: int) -> np.ndarray:
        return stream(OUTPUT, self.index, self.output_length, vocab)

    def prompt(self, vocab: int) -> tuple[np.ndarray, int]:
        """Prompt tokens and how many of them are history."""
        kept = np.empty(0, np.int32)
        if self.history_of is not None:
            prev, _ = self.history_of.prompt(vocab)
            kept = np.concatenate([prev, self.history_of.output(vocab)])[: self.input_length]
        return np.concatenate([kept, stream(UNIQUE, self.index, self.input_length - kept.size, vocab)]), kept.size

    def build(self, vocab: int) -> Request:
        prompt, history = self.prompt(vocab)
        spans = ((history, HISTORY), (prompt.size, USER)) if history else ((prompt.size, USER),)
        return Request(0, self.index + 1, 1, prompt, self.output(vocab), spans, arrival_s=self.arrival_s,
                       session=self.session, profile=self.fmt)


def load_burstgpt(files: list[str], log: TraceLog, model: str = "", log_type: str = "",
                  include_failed: bool = False) -> list[LengthRecord]:
    out: list[LengthRecord] = []
    clock = ArrivalClock()
    last_of: dict[str, LengthRecord] = {}
    for path in files:
        for where, row in csv_rows(path, BURSTGPT_COLUMNS, log):
            if model and row.get("Model", "") != model:
                log.bad(where, "other model", "filtered_model")
                continue
            if log_type and row.get("Log Type", "") != log_type:
                log.bad(where, "other log type", "filtered_log_type")
                continue
            ts = need_time(row, "Timestamp", float, "a number of seconds", where, log)
            if ts is None:
                continue
            resp = need_int(row, "Response tokens", where, log, 0)
            if resp == 0 and not include_failed:  # a failed request (BurstGPT keeps them in its files)
                log.skipped["failed_rows"] += 1
                continue
            req = need_int(row, "Request tokens", where, log, 1)
            if req is None or resp is None:
                continue
            sid = (row.get("Session ID") or "").strip()
            prev = last_of.get(sid) if sid else None
            rec = LengthRecord(len(out), clock.arrival(path, where, ts), prev.session if prev else len(out), req,
                               resp, "burstgpt", prev)
            if sid:
                last_of[sid] = rec
            out.append(rec)
    return out


def _azure_time(text: str) -> float:
    """Seconds since the epoch of '2023-11-16 18:15:46.6805900' (any number of fraction digits)."""
    main, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(main).timestamp() + (float("0." + frac) if frac else 0.0)


def load_azure(files: list[str], log: TraceLog) -> list[LengthRecord]:
    out: list[LengthRecord] = []
    clock = ArrivalClock()
    first: float | None = None
    for path in files:
        for where, row in csv_rows(path, AZURE_COLUMNS, log):
            t = need_time(row, "TIMESTAMP", _azure_time, "like 2023-11-16 18:15:46.68", where, log)
            if t is None:
                continue
            ctx = need_int(row, "ContextTokens", where, log, 1)
            gen = need_int(row, "GeneratedTokens", where, log, 0)
            if ctx is None or gen is None:
                continue
            first = t if first is None else first
            out.append(LengthRecord(len(out), clock.arrival(path, where, t - first), len(out), ctx, gen, "azure"))
    return out
