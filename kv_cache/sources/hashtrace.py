"""Hash-id traces: Mooncake (512-token blocks) and Alibaba Bailian (16-token blocks).

A record's ``hash_ids`` name its prompt's blocks; equal leading ids mean a
shared prefix. Each id becomes real tokens (see content.py) when the record
is dispatched, so the trace's block identities turn into the benchmark's
blocks at any ``--block-tokens``, sharing exactly the prefixes the trace
shares. Records stay compact (ids and lengths) until then. Bailian records
chain into conversations through ``parent_chat_id``; a chain is one session.
"""

from __future__ import annotations

from dataclasses import dataclass

from kv_cache.sources.content import OUTPUT, hashed_prompt, stream
from kv_cache.sources.trace_io import ArrivalClock, TraceLog, jsonl_records, need_int
from kv_cache.types import TRACE_HASH, Request

TRACE_BLOCK = {"mooncake": 512, "bailian": 16}
TIME_UNIT_S = {"mooncake": 1e-3, "bailian": 1.0}


@dataclass(slots=True)
class HashRecord:
    """One request of a hash-id trace, before its tokens exist."""

    index: int
    arrival_s: float
    session: int
    turn: int
    input_length: int
    output_length: int
    hash_ids: list[int]
    trace_block: int
    fmt: str

    def build(self, vocab: int) -> Request:
        prompt = hashed_prompt(self.hash_ids, self.input_length, self.trace_block, vocab, tail_ident=self.index)
        return Request(0, self.index + 1, self.turn, prompt, stream(OUTPUT, self.index, self.output_length, vocab),
                       ((self.input_length, TRACE_HASH),), arrival_s=self.arrival_s, session=self.session,
                       profile=self.fmt)

    def prefix_ids(self, block_tokens: int) -> list[tuple]:
        """Identities of the prompt's full blocks at block_tokens, without building tokens.

        Block j holds tokens up to n = (j+1) * block_tokens: equal for two records exactly when
        the trace ids up to the trace block holding token n-1 are equal (content.py's streams
        make partial trace blocks agree on their common start). A tail without an id of its own
        is unique to its record.
        """
        chain, prefix = [], 0  # chain[m-1] names ids[:m] (hash() is consistent within one process)
        for h in self.hash_ids:
            prefix = hash((prefix, h))
            chain.append(prefix)
        out, tb = [], self.trace_block
        covered = len(self.hash_ids) * tb
        for j in range(self.input_length // block_tokens):
            n = (j + 1) * block_tokens
            out.append((chain[-(-n // tb) - 1], n) if n <= covered else ("tail", self.index, n))
        return out


def _hash_ids(rec: dict, input_length: int, block: int, where: str, log: TraceLog) -> list[int] | None:
    ids = rec.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        log.bad(where, "field 'hash_ids' must be a list of integers")
        return None
    full, ceil = input_length // block, -(-input_length // block)
    if len(ids) not in (full, ceil):
        log.bad(where, f"{len(ids)} hash_ids do not fit input_length {input_length} in {block}-token blocks "
                       f"(expected {ceil})")
        return None
    return ids


def _source_index(rec: dict, position: int) -> int:
    """The record's index: its position here, or where a share of another trace came from (source_index, written by
    fleet --export-assignment: it names the tokens of the record's tail and output, so an engine's share of a fleet
    trace builds exactly the requests the fleet planned)."""
    given = rec.get("source_index")
    return given if isinstance(given, int) and not isinstance(given, bool) and given >= 0 else position


def load(files: list[str], fmt: str, log: TraceLog) -> list[HashRecord]:
    """Records of a Mooncake or Bailian trace, in file order, with arrival offsets in seconds."""
    block, unit = TRACE_BLOCK[fmt], TIME_UNIT_S[fmt]
    out: list[HashRecord] = []
    roots: dict[int, int] = {}  # Bailian chat_id -> its conversation's root
    clock = ArrivalClock()
    for path in files:
        for where, rec in jsonl_records(path, log):
            ts = rec.get("timestamp")
            if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0:
                log.bad(where, f"field 'timestamp' must be a number >= 0, got {ts!r}")
                continue
            inp = need_int(rec, "input_length", where, log, 1)
            outp = need_int(rec, "output_length", where, log, 0)
            ids = None if inp is None or outp is None else _hash_ids(rec, inp, block, where, log)
            if ids is None:
                continue
            index = _source_index(rec, len(out))
            session = index
            if fmt == "bailian":
                chat = need_int(rec, "chat_id", where, log, 0)
                if chat is None:
                    continue
                parent = rec.get("parent_chat_id", -1)
                session = roots.get(parent, chat) if isinstance(parent, int) and parent >= 0 else chat
                roots[chat] = session
            turn = rec.get("turn") if isinstance(rec.get("turn"), int) else 1
            out.append(HashRecord(index, clock.arrival(path, where, float(ts) * unit), session, turn, inp, outp,
                                  ids, block, fmt))
    return out
