"""The fleet's requests: the traffic a run would issue (synthetic users or any trace the benchmark reads), each
planned once into the blocks the lifecycle would look up and write, with its arrival time and conversation.

Planned once and kept compact, the same stream is replayed for every engine count and router of a sweep. Arrival
times: a timestamped trace's own (over --trace-speedup), else a Poisson process at --request-rate (seeded, as a
run's open loop). The conversation a request belongs to is what the session router keeps on one engine: a synthetic
user, a ShareGPT conversation, a Bailian chain, a BurstGPT session.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kv_cache.cache.hashing import chain_root
from kv_cache.config import Settings
from kv_cache.errors import UserError
from kv_cache.fleet.memory import PROBE, check_points, check_stream
from kv_cache.lifecycle.by_source import source_tokens, span_ranges
from kv_cache.lifecycle.plan import Planner
from kv_cache.sources.replay import TraceSet, poisson_arrivals, trace_arrivals, trace_builds
from kv_cache.sources.synthetic import make_users
from kv_cache.types import Request

PROGRESS_EVERY = 20_000  # requests planned between two progress lines


@dataclass(frozen=True, slots=True)
class Planned:
    """One request as the fleet replays it: its plan's keys and lookup groups, and each prompt block's tokens by
    source (the access log's COLUMNS)."""

    at_s: float
    conversation: int
    keys: tuple[int, ...]
    parents: tuple[int, ...]       # the block a lookup must hit before this one (0: none)
    groups: tuple[tuple[int, int, bool], ...]
    prompt_blocks: int
    block_sources: tuple[tuple[int, ...], ...]  # per prompt block: its prompt tokens by COLUMNS
    labels: tuple[str, ...]
    prompt_tokens: int
    output_tokens: int
    prompt_sources: tuple[int, ...]  # the whole prompt's tokens by COLUMNS (a trailing partial block's too)


class PlannedStore:
    """The planned requests kept compact (about 25 B a block: typed arrays, the per-block source rows, labels and
    lookup groups as indexes into tables of the few distinct ones); each read back as a Planned."""

    def __init__(self) -> None:
        self.keys, self.parents = array("Q"), array("Q")
        self.rows, self.labels = array("i"), array("h")
        self.at_s, self.conversation = array("d"), array("q")
        self.first = array("q", [0])
        self.meta = array("q")  # per request: groups index, prompt blocks, prompt tokens, output tokens, spans row
        self._tables: dict[str, dict] = {"rows": {}, "labels": {}, "groups": {}}
        self._lists: dict[str, list] = {"rows": [], "labels": [], "groups": []}

    def _code(self, table: str, value) -> int:
        codes = self._tables[table]
        code = codes.get(value)
        if code is None:
            code = codes[value] = len(self._lists[table])
            self._lists[table].append(value)
        return code

    def append(self, p: Planned) -> None:
        self.keys.extend(p.keys)
        self.parents.extend(p.parents)
        self.rows.extend(self._code("rows", r) for r in p.block_sources)
        self.rows.extend([-1] * (len(p.keys) - len(p.block_sources)))  # decode blocks: no prompt tokens
        self.labels.extend(self._code("labels", x) for x in p.labels)
        self.at_s.append(p.at_s)
        self.conversation.append(p.conversation)
        self.first.append(len(self.keys))
        self.meta.extend((self._code("groups", p.groups), p.prompt_blocks, p.prompt_tokens, p.output_tokens,
                          self._code("rows", p.prompt_sources)))

    def __len__(self) -> int:
        return len(self.at_s)

    def __getitem__(self, r: int) -> Planned:
        a, b = self.first[r], self.first[r + 1]
        g, n, tokens, output, spans = self.meta[5 * r: 5 * r + 5]
        rows, labels = self._lists["rows"], self._lists["labels"]
        return Planned(self.at_s[r], self.conversation[r], tuple(self.keys[a:b]), tuple(self.parents[a:b]),
                       self._lists["groups"][g], n, tuple(rows[i] for i in self.rows[a:a + n]),
                       tuple(labels[i] for i in self.labels[a:b]), tokens, output, rows[spans])

    def __iter__(self):
        return (self[r] for r in range(len(self)))


@dataclass
class Stream:
    """The planned requests, in arrival order, and what they came from."""

    requests: PlannedStore
    source: str              # synthetic, or the trace's format
    timing: str              # where the arrival times come from (said in the output)
    span_s: float            # first arrival to last
    conversations: bool      # whether some conversation has more than one request (the session router needs it)
    slot_bytes: int
    block_tokens: int
    longest: int             # blocks of the longest request


def _arrivals(s: Settings, trace: TraceSet | None) -> tuple[Iterator, str, str, int | None]:
    """(at_s, build) pairs, the source, where the times come from, and how many requests there are (None: as many
    as asked); trace: the loaded --trace (None: synthetic users)."""
    if trace is None:
        if s.schedule.request_rate <= 0:
            raise UserError("fleet needs arrival times to give the shared tier's rates and the engines' load: with "
                            "synthetic users give --request-rate R (requests per second of the whole fleet).")
        users = make_users(s.workload.users, s.workload, s.profiles, s.run.seed, None, s.rag, s.model.block_tokens)
        return (poisson_arrivals(_interleaved(users, s.run.seed), s.schedule.request_rate, s.run.seed), "synthetic",
                f"Poisson arrivals at --request-rate {s.schedule.request_rate:g}/s (modelled)", None)
    cycles = s.trace.replay_cycles
    total = None if cycles == 0 else len(trace.records) * cycles
    if trace.timestamped and s.schedule.request_rate <= 0:
        return (trace_arrivals(trace, s.workload.vocab_size, s.trace.speedup, cycles), trace.fmt,
                f"the trace's timestamps over --trace-speedup {s.trace.speedup:g}", total)
    if s.schedule.request_rate <= 0:
        raise UserError(f"fleet needs arrival times, and trace {s.trace.path} ({trace.fmt}) has no timestamps; "
                        f"give --request-rate R (requests per second of the whole fleet).")
    return (poisson_arrivals(trace_builds(trace, s.workload.vocab_size, cycles), s.schedule.request_rate, s.run.seed),
            trace.fmt, f"Poisson arrivals at --request-rate {s.schedule.request_rate:g}/s (modelled)", total)


def _interleaved(users: list, seed: int) -> Iterator:
    """The users' requests in a seeded random interleaving (each user's turns in order): a run's open loop deals
    them round-robin, which would make the round-robin router keep every user on one engine."""
    rng = np.random.default_rng([seed, 0xF1EE7])
    while True:
        for u in rng.integers(len(users), size=4096):
            yield users[u].next_request


def planned_stream(s: Settings, trace: TraceSet | None, slot_bytes: int, model_id: str, say) -> Stream:
    """The traffic of s, planned: --max-requests of it (a trace: all of it by default). trace: the loaded --trace
    (None: synthetic users); model_id: what names the blocks' chains (model, dtype, TP: as a run's)."""
    if not s.model.block_tokens:
        raise UserError("fleet follows blocks through the engines' tiers: give --block-tokens N (N > 0); "
                        "whole-request objects (--block-tokens 0) have no prefix to route by.")
    arrivals, source, timing, total = _arrivals(s, trace)
    count = s.run.max_requests or total
    if count is None:
        raise UserError("fleet needs to know how many requests to replay: give --max-requests N (synthetic users "
                        "and --replay-cycles 0 never end).")
    planner = Planner(s.model.block_tokens, chain_root(model_id),
                      s.rag.enabled and s.rag.reuse == "chunk", s.workload.decode_writes)
    out = PlannedStore()
    seen: set[int] = set()
    distinct: set[int] = set()
    repeated, blocks, longest = False, 0, 0
    for at_s, build in itertools.islice(arrivals, count):
        req = build()
        p = plan_of(planner, req, at_s)
        repeated = repeated or p.conversation in seen
        seen.add(p.conversation)
        distinct.update(p.keys)
        blocks += len(p.keys)
        longest = max(longest, len(p.keys))
        out.append(p)
        if len(out) == PROBE:
            check_stream(PROBE, blocks, count)
        if len(out) % PROGRESS_EVERY == 0:
            say(f"  planned {len(out):,} of {count:,} requests")
    if not len(out):
        raise UserError("fleet: the traffic gave no request; check --trace and --max-requests.")
    check_points(blocks, len(distinct))
    return Stream(out, source, timing, out.at_s[-1] - out.at_s[0], repeated, slot_bytes, s.model.block_tokens,
                  longest)


def plan_of(planner: Planner, req: Request, at_s: float) -> Planned:
    """A request planned as the lifecycle plans it."""
    plan = planner.plan(req)
    n, keys = plan.num_prompt_blocks, tuple(plan.keys)
    one_chain = plan.chained and len(plan.groups) == 1 and plan.groups[0][0] == 0
    if one_chain:  # the common shape: the parent of a block is the block before it (the same int objects)
        parents = (0, *keys[:-1]) if keys else ()
    else:
        parents = tuple(plan.parent(i) or 0 for i in range(len(keys)))
    rows = _chain_rows(req, n, plan.tokens_per_key[0]) if one_chain and req.spans and n else \
        [source_tokens(plan.cached_by_source(req, i)) for i in range(n)]
    spans = source_tokens([(label, end - start) for end, start, label in span_ranges(req.spans)])
    return Planned(float(at_s), int(req.user_id), keys, parents, plan.groups, n, tuple(rows), plan.labels,
                   req.num_prompt_tokens, req.num_output_tokens, spans)


def _chain_rows(req: Request, n: int, bt: int) -> list[tuple[int, ...]]:
    """The first n blocks' prompt tokens by COLUMNS, in one pass over the spans (what KVPlan.cached_by_source gives
    block by block for one chain from the prompt's start)."""
    rows, spans, s, lo = [], req.spans, 0, 0
    for i in range(n):
        start, end = i * bt, (i + 1) * bt
        parts = []
        while s < len(spans):
            span_end, label = spans[s]
            a, b = max(start, lo), min(end, span_end)
            if b > a:
                parts.append((label, b - a))
            if span_end > end:
                break
            lo = max(lo, span_end)
            s += 1
        rows.append(source_tokens(parts))
    return rows
