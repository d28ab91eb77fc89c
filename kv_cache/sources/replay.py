"""Turning loaded traces into traffic: closed-loop users, or open-loop arrivals.

Vocabulary: a *record* is a loaded trace request (HashRecord, LengthRecord,
ShareGPTTurn) that builds its Request on demand; a *session* is the records
that must run in order (one conversation). A *cycle* is one pass over the
trace; later cycles replay the same content (so they can hit), with
timestamps shifted by the trace's span.

- closed: session s goes to user s mod users; a user replays its sessions'
  records in order, thinking between them.
- trace: records at their timestamps / speed-up.
- poisson: records in trace order (sessions keep their order), gaps drawn
  from an exponential distribution with the seed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from kv_cache.errors import UserError
from kv_cache.types import Request


@dataclass
class TraceSet:
    """A loaded trace: its records in order, what it is, and what loading skipped."""

    fmt: str
    records: list
    log: object
    tokenizer: str = ""

    @property
    def timestamped(self) -> bool:
        return bool(self.records) and self.records[0].arrival_s is not None

    def sessions(self) -> list[list]:
        out: dict[int, list] = {}
        for r in self.records:
            out.setdefault(r.session, []).append(r)
        return list(out.values())


def cycles(n: int) -> Iterator[int]:
    return itertools.count() if n == 0 else iter(range(n))


class TraceUser:
    """A closed-loop user replaying its sessions; next_request() is None when it is done."""

    def __init__(self, user_id: int, sessions: list[list], vocab: int, think_s: tuple[float, float],
                 replay_cycles: int, seed: int):
        self.user_id = user_id
        self.records = [r for s in sessions for r in s]
        self.vocab = vocab
        self.rng = np.random.default_rng([seed, 0x7A5E, user_id])
        self.think = think_s
        self._order = ((c, r) for c in cycles(replay_cycles) for r in self.records) if self.records else iter(())
        self.first_delay_s = float(self.rng.uniform(*think_s))
        self.seq = 0

    def next_request(self) -> Request | None:
        item = next(self._order, None)
        if item is None:
            return None
        _, rec = item
        req = rec.build(self.vocab)
        self.seq += 1
        req.user_id, req.seq = self.user_id, self.seq
        req.think_s = float(self.rng.uniform(*self.think))
        return req


def closed_users(trace: TraceSet, num_users: int, vocab: int, think_s, replay_cycles: int,
                 seed: int, owns=None) -> list[TraceUser]:
    """Session s goes to user s mod users; only the users owns(u) accepts are built (MPI ranks)."""
    sessions = trace.sessions()
    users = min(num_users, len(sessions))
    return [TraceUser(u, sessions[u::users], vocab, think_s, replay_cycles, seed) for u in range(users)
            if owns is None or owns(u)]


def partition(trace: TraceSet, owns) -> TraceSet:
    """The records of the sessions this rank owns (sessions stay whole)."""
    return TraceSet(trace.fmt, [r for r in trace.records if owns(r.session)], trace.log, trace.tokenizer)


Arrival = tuple[float, Callable[[], Request]]


def trace_arrivals(trace: TraceSet, vocab: int, speedup: float, replay_cycles: int) -> Iterator[Arrival]:
    """(offset s, build) at the trace's timestamps divided by speedup, cycle after cycle."""
    if not trace.timestamped:
        raise UserError(f"--arrival trace needs timestamps, and a {trace.fmt} trace has none; "
                        f"use --arrival closed or --arrival poisson --request-rate R.")
    first = trace.records[0].arrival_s
    span = trace.records[-1].arrival_s - first
    gap = span / max(len(trace.records) - 1, 1)
    for c in cycles(replay_cycles):
        shift = c * (span + gap)
        for r in trace.records:
            yield (r.arrival_s - first + shift) / speedup, _builder(r, vocab)


def trace_span_s(trace: TraceSet, speedup: float, replay_cycles: int) -> float | None:
    """Seconds from the first arrival to the last at this speed-up (None: it repeats until the run ends)."""
    if not replay_cycles or not trace.timestamped or not trace.records:
        return None
    span = trace.records[-1].arrival_s - trace.records[0].arrival_s
    gap = span / max(len(trace.records) - 1, 1)
    return ((replay_cycles - 1) * (span + gap) + span) / speedup


def poisson_arrivals(builds: Iterator[Callable[[], Request]], rate: float, seed: int) -> Iterator[Arrival]:
    """Open-loop arrivals at `rate` per second with exponential gaps (seeded)."""
    rng = np.random.default_rng([seed, 0x9015])
    t = 0.0
    for build in builds:
        t += float(rng.exponential(1.0 / rate))
        yield t, build


def trace_builds(trace: TraceSet, vocab: int, replay_cycles: int) -> Iterator[Callable[[], Request]]:
    for _ in cycles(replay_cycles):
        for r in trace.records:
            yield _builder(r, vocab)


def every_nth(builds: Iterator, n: int, first: int) -> Iterator:
    """builds first, first + n, first + 2n, ... (one rank's share of an open-loop stream)."""
    return itertools.islice(builds, first, None, n)


def synthetic_builds(users) -> Iterator[Callable[[], Request]]:
    """Synthetic users' requests round-robin: user 0's first, user 1's first, ..., user 0's second, ..."""
    while True:
        for u in users:
            yield u.next_request


def _builder(rec, vocab: int) -> Callable[[], Request]:
    def build() -> Request:
        req = rec.build(vocab)
        req.user_id = rec.session
        req.seq = rec.index + 1
        return req
    return build


class SequenceUser:
    """One user issuing a fixed request sequence back to back (arrival ``sequence``).

    One request is in flight at a time, so the order of requests — and every cache decision — is
    the same whatever the policy, the tiers' speed or the number of workers: what ``policies``
    needs to compare eviction policies on one request sequence.
    """

    user_id = 0
    first_delay_s = 0.0

    def __init__(self, requests):
        self._requests = iter(requests)
        self.seq = 0

    def next_request(self) -> Request | None:
        req = next(self._requests, None)
        if req is None:
            return None
        self.seq += 1
        req.user_id, req.seq, req.think_s = 0, self.seq, 0.0
        return req
