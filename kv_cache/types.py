"""Small records shared by every stage: block keys, requests, I/O events.

Vocabulary: a *block* is ``block_tokens`` consecutive tokens of a sequence;
its *key* is a chained hash of its tokens and its parent block's key, so two
sequences with the same prefix share the keys of that prefix's blocks. A
*span* labels a token range of a prompt with where it came from (system
prompt, conversation history, new user message), so hits can be credited to
their source.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import NewType

import numpy as np

from kv_cache import counters as C

# A block's 64-bit chained hash: a distinct type for type checkers, a plain int at run time (keys are
# dict keys on every block operation: an int subclass costs a constructor call per key and slower lookups).
BlockKey = NewType("BlockKey", int)


# Span labels: where the tokens of a prompt come from. Their one home: the plan, the policies, the console and the
# capacity curve read them here (a label spelled elsewhere landed under "other" in the curve).
SYSTEM, HISTORY, USER = "system", "history", "user"
TRACE_HASH, RAG = "trace_hash", "rag"
TEMPLATE = "template"  # an instruction wrapper around retrieved evidence (semantic traffic)
RAG_CHUNK = "rag_chunk"  # a retrieved document's block looked up on its own (--rag-reuse chunk)
INJECTED = "system_injected"  # a shared system prompt the benchmark put before a trace's conversation that had none
GENERATED = "generated"  # a decode block's label: the answer's tokens, no prompt source
SOURCES = (SYSTEM, INJECTED, HISTORY, USER, RAG, RAG_CHUNK, TRACE_HASH, TEMPLATE)  # every source, in the order shown
OTHER = "other"  # the capacity curve's column for a label outside SOURCES (none today: a test holds it so)


@dataclass(frozen=True, slots=True)
class SemanticTag:
    """What a semantic-traffic request is: a donor seeded first, or the recipient measured after it.

    item: the donor(s) and recipient of one transform share it, so a search can tell whether the
    intended donor was found; source: the text it was built from (negative controls' donors come
    from another source).
    """

    item: str
    transform: str
    role: str  # donor | recipient
    source: int


@dataclass(slots=True)
class Request:
    """One user request: the prompt the server would see and the answer it will generate.

    ``spans`` is a tuple of (end_token, label) in increasing order covering the prompt.
    ``intended_ns`` is when the request was meant to start (monotonic ns), set by the
    scheduler; every latency of the request is measured from it.
    """

    user_id: int
    seq: int
    turn: int
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    spans: tuple[tuple[int, str], ...]
    think_s: float = 0.0
    qos: str = "batch"
    profile: str = ""
    arrival_s: float | None = None  # offset in a timestamped trace (before --trace-speedup)
    session: int = -1               # requests of one session (conversation) run in order
    docs: tuple[tuple[int, int, int], ...] = ()  # (start, end, document id) of retrieved documents
    handoff: Handoff | None = None  # decode node: the blocks a prefill node published for this request
    semantic: SemanticTag | None = None  # semantic traffic: which transform, donor or recipient
    text: str = ""                       # semantic traffic: the prompt's text (for a text embedder)
    intended_ns: int = 0
    dequeued_ns: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return int(self.prompt_tokens.size)

    @property
    def num_output_tokens(self) -> int:
        return int(self.output_tokens.size)

    def tokens_by_label(self, start: int, end: int) -> list[tuple[str, int]]:
        """How the tokens [start, end) split over the spans' sources (a block can straddle two spans)."""
        out, lo = [], 0
        for span_end, label in self.spans:
            a, b = max(start, lo), min(end, span_end)
            if b > a:
                out.append((label, b - a))
            lo = max(lo, span_end)
        return out

    def labels_at(self, token_indices: np.ndarray) -> list[str]:
        """The source label of the token at each index: the span it falls in (past the last span, the last one's;
        without spans, USER). One search over the spans' ends: a plan labels every block by its last token,
        thousands of blocks a request with small blocks (a loop over the spans a block was a sixth of the pre-run
        analysis)."""
        if not self.spans:
            return [USER] * len(token_indices)
        names = np.array([label for _, label in self.spans], dtype=object)
        at = np.searchsorted(np.fromiter((end for end, _ in self.spans), np.int64, len(self.spans)),
                             token_indices, side="right")
        return names[np.minimum(at, names.size - 1)].tolist()


@dataclass(slots=True)
class RequestOutcome:
    """What one request did, as the lifecycle reports it to the recorder (Recorder.request): tokens and blocks,
    by tier and by source, whether it found its prefix, system prompt and history, and its semantic reuse. The
    recorder keeps it as counters (counts(): names from counters.py only)."""

    prompt_tokens: int
    generated_tokens: int
    cached_tokens: int = 0
    infinite_cache_tokens: int | None = 0  # what an infinite cache would have served it (None: not tracked)
    blocks_looked_up: int = 0
    blocks_hit: int = 0
    write_skipped: list[str] = field(default_factory=list)  # why each new block not written was refused
    keys_refused: set[int] = field(default_factory=set)     # those blocks' keys (but those cached already)
    prompt_tokens_by_source: dict[str, int] = field(default_factory=dict)
    cached_tokens_by_source: dict[str, int] = field(default_factory=dict)
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    blocks_hit_by_source: dict[str, int] = field(default_factory=dict)
    found: dict[str, bool] = field(default_factory=dict)           # prefix / system / history -> found
    donor_blocks_missing: int = 0
    donor_bytes_by_tier: dict[str, int] = field(default_factory=dict)
    donor_blocks_by_tier: dict[str, int] = field(default_factory=dict)
    semantic: dict[str, dict[str, int]] = field(default_factory=dict)  # transform -> its metrics

    def refused(self, key: int, parent: int | None, why: str) -> None:
        """A new block the cache did not write, and why (counters.WRITE_SKIPPED_WHY): a parent refused in this
        request is the chain's earlier cut, not a parent that left the cache."""
        if why == "parent_gone" and parent in self.keys_refused:
            why = "after_cut"
        self.write_skipped.append(why)
        if why != "cached":  # another worker's block: it may still be written
            self.keys_refused.add(key)

    def counts(self) -> list[tuple[str, int]]:
        """The counters this request adds (zeros left out but the semantic metrics': a counter absent reads 0)."""
        out = [(C.TOKENS_PROMPT, self.prompt_tokens), (C.TOKENS_GENERATED, self.generated_tokens),
               (C.TOKENS_CACHED, self.cached_tokens), (C.BLOCKS_LOOKUP, self.blocks_looked_up),
               (C.BLOCKS_HIT, self.blocks_hit), (C.BLOCKS_WRITE_SKIPPED, len(self.write_skipped)),
               (C.DONOR_MISSING, self.donor_blocks_missing), (C.TOKENS_INFINITE, self.infinite_cache_tokens or 0),
               (C.INFINITE_UNTRACKED, int(self.infinite_cache_tokens is None))]
        for family, by in ((C.TOKENS_PROMPT_BY_SOURCE, self.prompt_tokens_by_source),
                           (C.TOKENS_CACHED_BY_SOURCE, self.cached_tokens_by_source),
                           (C.TOKENS_CACHED_BY_TIER, self.cached_tokens_by_tier),
                           (C.BLOCKS_HIT_BY_SOURCE, self.blocks_hit_by_source),
                           (C.DONOR_BYTES, self.donor_bytes_by_tier), (C.DONOR_BLOCKS, self.donor_blocks_by_tier)):
            out += [(family(label), n) for label, n in by.items()]
        out += [(C.BLOCKS_WRITE_SKIPPED_BY(why), self.write_skipped.count(why)) for why in C.WRITE_SKIPPED_WHY]
        out += [(C.found(label, hit), 1) for label, hit in self.found.items()]
        out = [(name, n) for name, n in out if n]
        # a transform's metrics, zeros included: its section lists every metric it counted
        return out + [(C.SEMANTIC(t, k), n) for t, metrics in self.semantic.items() for k, n in metrics.items()]


class StopAfter:
    """When requests still in flight at a run's end are abandoned: the scheduler sets it once it stops issuing,
    the lifecycle reads it between two block operations (a run ends within --duration + --drain-s)."""

    __slots__ = ("at_ns",)

    def __init__(self) -> None:
        self.at_ns = 0

    def due(self) -> bool:
        return bool(self.at_ns) and time.monotonic_ns() > self.at_ns


@dataclass(frozen=True, slots=True)
class Handoff:
    """One request handed from a prefill node to a decode node: a line of the manifest.

    keys / nbytes: the prompt's blocks, published in the handoff directory; decode_keys /
    decode_nbytes: the blocks the decode node appends; done_wall: when the prefill node finished
    (time.time(), to measure prefill-complete -> decode-loaded); digests: each prompt block's XXH3-64 as the
    prefill node published it (0: not known), what the decode node's checksum verification compares with.
    """

    rid: str
    keys: tuple[int, ...]
    nbytes: tuple[int, ...]
    decode_keys: tuple[int, ...]
    decode_nbytes: tuple[int, ...]
    prompt_tokens: int
    output_tokens: int
    block_tokens: int
    done_wall: float
    digests: tuple[int, ...] = ()

    def to_line(self) -> bytes:
        d = {"kind": "request", "rid": self.rid, "keys": [f"{k:016x}" for k in self.keys], "nbytes": self.nbytes,
             "decode_keys": [f"{k:016x}" for k in self.decode_keys], "decode_nbytes": self.decode_nbytes,
             "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
             "block_tokens": self.block_tokens, "done_wall": self.done_wall,
             "digests": [f"{x:016x}" for x in self.digests]}
        return (json.dumps(d, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_dict(cls, d: dict) -> Handoff:
        return cls(d["rid"], tuple(int(k, 16) for k in d["keys"]), tuple(d["nbytes"]),
                   tuple(int(k, 16) for k in d["decode_keys"]), tuple(d["decode_nbytes"]), d["prompt_tokens"],
                   d["output_tokens"], d["block_tokens"], d["done_wall"],
                   tuple(int(x, 16) for x in d.get("digests", ())))
