"""The run's block accesses as the capacity curve reads them (stack_distances.py): each request's blocks in the order
the lifecycle used them, in typed arrays, bounded by a SHARDS sample past --capacity-log-accesses.

A request is a row (its first access, prompt tokens, completion time, lookup tokens by source). A row whose
accesses the sample all dropped carries only its tokens, which the curve sums over the window: it is folded into the
row before it (their tokens and request counts added) when both completed on the same side of the measured
window's start and SETTLE_NS before the latest completion (so a window opened late, as the dispatcher does by a few
ms, cannot fall between them). So the rows number at most the accesses kept, plus those of the last SETTLE_NS and
FOLD_SLACK: a run of any length stays within the bound, its requests included. For several runs merged (`capacity
RUN RUN`) a folded row counts where its first request completed."""

from __future__ import annotations

import threading
from array import array
from itertools import zip_longest

import numpy as np

from kv_cache.recorder.stack_distances import COLUMNS, FULL, GOLDEN, MASK, SAMPLE_ABOVE

SETTLE_NS = 10_000_000_000  # a row completed this long before the latest one is on a known side of the window
FOLD_SLACK = 65_536  # rows without a kept access gathered before they are folded (O(rows) a fold)
ROW_BYTES = 8 * (3 + len(COLUMNS) + 1)  # a row: first access, prompt tokens, completion; tokens by source; count


class Rows:
    """Token rows (tokens by COLUMNS) as codes into a table of the distinct ones: a log holds a handful of them."""

    def __init__(self) -> None:
        self._codes: dict[tuple[int, ...], int] = {(0,) * len(COLUMNS): 0}

    def code(self, row: tuple[int, ...]) -> int:
        code = self._codes.get(row)
        if code is None:
            code = self._codes[row] = len(self._codes)
        return code

    def expand(self, codes: array) -> np.ndarray:
        """The rows of codes, as an (n, COLUMNS) array."""
        table = np.zeros((len(self._codes), len(COLUMNS)), np.int32)
        for row, code in self._codes.items():
            table[code, : len(row)] = row
        return table[np.frombuffer(codes, np.int32)] if len(codes) else np.zeros((0, len(COLUMNS)), np.int32)


class AccessLog:
    """Each request's blocks in the order the lifecycle used them (thread-safe appends; arrays at the end). Kept in
    typed arrays, token rows and labels as codes: about 30 B an access (Python lists of tuples took about 150).

    Bounded: past `limit` accesses the log keeps a SHARDS sample of the blocks (sample()'s hash, so the same blocks
    wherever they come from), halving its rate each time it fills again, so a run of any length holds at most
    `limit` accesses; each request's lookup tokens by source are kept whole (SHARDS' adjustment needs them), 8 B a
    column, and a request none of whose accesses is kept is folded into the row before it (the module). A sampled
    log gives the curve at its rate; a replay, which needs every access, is not made from it."""

    def __init__(self, limit: int = SAMPLE_ABOVE) -> None:
        self._lock = threading.Lock()
        self.limit = limit
        self.below = FULL  # keys whose hash is below it are kept (FULL: every one)
        self.keys = array("Q")
        self.parents = array("Q")  # the block a lookup must hit first (0: none), for a replay in plan order
        self.lookup = array("b")
        self.tokens = array("i")  # per access: its tokens by COLUMNS as a code into rows (0: a decode block's)
        self.rows = Rows()
        self.plan_pos = array("i")  # per access: its index in the request's plan (a replay's order)
        self.labels = array("i")  # per access: its plan label, as a code into label_names (a replay's labels)
        self._codes: dict[str, int] = {}
        self.requests = array("q")  # per row: first access, prompt tokens, completion time ns (its first request's)
        self.request_tokens = array("q")  # per row: its lookups' tokens by COLUMNS, sampled or not
        self.counts = array("q")  # per row: the requests folded into it (1 unless sampled)
        self.starts = array("q")  # per row: when its request looked the cache up (ns): the rows' order at the end
        self.arrivals = array("q")  # per row: when its request arrived (ns), and
        self.dequeued = array("q")  # when it left the queue: how far the queue's order took it from its arrival order
        self.cuts: list[int] = []  # the measured window's start (and end): rows are never folded across one
        self._latest_ns = 0
        self._empty_rows = 0  # rows without a kept access since the last fold
        self._fold_at = FOLD_SLACK

    @property
    def rate(self) -> float:
        return self.below / FULL

    def request(self, prompt: list[tuple[int, tuple[int, ...], int, str]], groups, decode: list[tuple[int, int, str]],
                prompt_tokens: int, done_ns: int, started_ns: int | None = None,
                queued: tuple[int, int] | None = None) -> None:
        """prompt: (key, tokens by source, parent, label) of each prompt block in plan order; groups: the plan's
        lookup groups (first, end, independent); decode: (key, parent, label) of the decode blocks. Stored in the
        stack's order (see the module); a replay reads them back in plan order (plan_pos). started_ns: when the
        request looked the cache up (its completion where not given): arrays() orders the requests by it; queued:
        when it arrived and when it left the queue (its lookup where not given)."""
        rows = _stack_order(prompt, groups, decode)
        keys = [r[0] for r in rows]
        if len(set(keys)) < len(keys):  # a block twice in one request: counted once, where it is deepest
            first_use = {k: n for n, k in reversed(list(enumerate(keys)))}
            rows = [r for n, r in enumerate(rows) if first_use[r[0]] == n]
        looked = [sum(c) for c in zip_longest(*(r[3] for r in rows if r[2]), fillvalue=0)]  # by column, in C
        looked += [0] * (len(COLUMNS) - len(looked))
        with self._lock:
            kept = len(self.keys)
            self.requests.extend((kept, prompt_tokens, done_ns))
            self.request_tokens.extend(looked)
            self.counts.append(1)
            self.starts.append(done_ns if started_ns is None else started_ns)
            arrived, dequeued = queued or (self.starts[-1], self.starts[-1])
            self.arrivals.append(arrived)
            self.dequeued.append(dequeued)
            self._latest_ns = max(self._latest_ns, done_ns)
            for key, parent, looked_up, tokens, label, pos in rows:
                if self.below < FULL and ((key * GOLDEN) & MASK) >> 40 >= self.below:
                    continue
                self.keys.append(key)
                self.plan_pos.append(pos)
                self.parents.append(parent)
                self.lookup.append(looked_up)
                self.tokens.append(self.rows.code(tokens))
                self.labels.append(self._codes.setdefault(label, len(self._codes)))
            self._empty_rows += len(self.keys) == kept
            if len(self.keys) > self.limit:
                self._halve()
            if self._empty_rows > self._fold_at:
                self._fold()

    def cut(self, ns: int) -> None:
        """The measured window opens (or closes) at ns: no row is folded across it."""
        with self._lock:
            self.cuts.append(ns)

    def _fold(self, final: bool = False) -> None:
        """Lock held: each settled row without a kept access folded into the row before it (the module); final:
        the run is over, its window known, every row settled."""
        reqs = np.frombuffer(self.requests, np.int64).reshape(-1, 3)
        empty = np.append(reqs[1:, 0], len(self.keys)) == reqs[:, 0]
        done = reqs[:, 2]
        settled = np.full(len(reqs), True) if final else done < self._latest_ns - SETTLE_NS
        side = np.searchsorted(np.sort(np.array(self.cuts, np.int64)), done, side="right")
        fold = np.zeros(len(reqs), bool)
        fold[1:] = empty[1:] & settled[1:] & settled[:-1] & (side[1:] == side[:-1])
        heads = np.flatnonzero(~fold)
        if len(heads) < len(reqs):
            rows = reqs[heads].copy()
            rows[:, 1] = np.add.reduceat(reqs[:, 1], heads)
            self.requests = _typed("q", rows)
            self.request_tokens = _typed("q", np.add.reduceat(np.frombuffer(self.request_tokens, np.int64)
                                                              .reshape(len(reqs), -1), heads, axis=0))
            self.counts = _typed("q", np.add.reduceat(np.frombuffer(self.counts, np.int64), heads))
            self.starts = _typed("q", np.frombuffer(self.starts, np.int64)[heads])
            self.arrivals = _typed("q", np.frombuffer(self.arrivals, np.int64)[heads])
            self.dequeued = _typed("q", np.frombuffer(self.dequeued, np.int64)[heads])
        self._empty_rows = int(empty[heads].sum())  # those not settled yet, or heading a side of a cut
        self._fold_at = self._empty_rows + FOLD_SLACK

    def _halve(self) -> None:
        """Lock held: the rate halved until the log holds at most limit accesses, the accesses of blocks it no
        longer keeps dropped (each request's first access moved to match)."""
        keys = np.frombuffer(self.keys, np.uint64)
        hashed = (keys * np.uint64(GOLDEN)) >> np.uint64(40)
        keep = hashed < np.uint64(self.below)
        while keep.sum() > self.limit and self.below > 1:
            self.below //= 2
            keep = hashed < np.uint64(self.below)
        first = np.cumsum(np.concatenate([[0], keep.astype(np.int64)]))
        reqs = np.frombuffer(self.requests, np.int64).reshape(-1, 3).copy()
        reqs[:, 0] = first[reqs[:, 0]]
        del keys, hashed
        for name, code in (("keys", "Q"), ("parents", "Q"), ("lookup", "b"), ("tokens", "i"), ("plan_pos", "i"),
                           ("labels", "i"), ("requests", "q")):
            setattr(self, name, _typed(code, reqs if name == "requests"
                                       else np.frombuffer(getattr(self, name), _DTYPES[code])[keep]))
        self._fold()  # the rows whose accesses were all dropped

    def arrays(self) -> dict[str, np.ndarray]:
        """The log at the end of the run (its window closed: every row without a kept access folded), its requests
        in the order they looked the cache up."""
        with self._lock:
            if self.below < FULL:
                self._fold(final=True)
            return in_order({
                    "keys": np.frombuffer(self.keys, np.uint64).copy(),
                    "parents": np.frombuffer(self.parents, np.uint64).copy(),
                    "lookup": np.frombuffer(self.lookup, np.int8).astype(bool), "tokens": self.rows.expand(self.tokens),
                    "source_names": np.array(COLUMNS, dtype=str),
                    "plan_pos": np.frombuffer(self.plan_pos, np.int32).copy(),
                    "requests": np.frombuffer(self.requests, np.int64).reshape(-1, 3).copy(),
                    "labels": np.frombuffer(self.labels, np.int32).copy(),
                    "label_names": np.array(sorted(self._codes, key=self._codes.get) or [""], dtype=str),
                    "request_tokens": np.frombuffer(self.request_tokens, np.int64).reshape(-1, len(COLUMNS)).copy(),
                    "request_counts": np.frombuffer(self.counts, np.int64).copy(),
                    "request_started": np.frombuffer(self.starts, np.int64).copy(),
                    "request_arrived": np.frombuffer(self.arrivals, np.int64).copy(),
                    "request_dequeued": np.frombuffer(self.dequeued, np.int64).copy(),
                    "sample_rate": np.array(self.rate)})


ACCESS_ARRAYS = ("keys", "parents", "lookup", "tokens", "plan_pos", "labels")  # an entry per access
REQUEST_ARRAYS = ("request_tokens", "request_counts", "request_started", "request_arrived",  # an entry per row
                  "request_dequeued")


def in_order(log: dict[str, np.ndarray], by: str = "request_started") -> dict[str, np.ndarray]:
    """The requests reordered by a time of theirs (by default when they looked the cache up; request_arrived: when
    they arrived), each with its accesses.

    NOTE: a request is logged when it completes. With several workers, requests that started after another's lookup
    and completed before it came ahead of it: its hits were taken against the stack after their writes, and a run of
    4 workers whose curve read 27.5 % at its own capacity had measured 46.2 % (one worker: equal)."""
    order = np.argsort(log[by], kind="stable")
    reqs = log["requests"]
    if (order == np.arange(len(order))).all():
        return log
    lengths = (np.append(reqs[1:, 0], len(log["keys"])) - reqs[:, 0])[order]
    firsts = np.cumsum(lengths) - lengths  # each request's first access in the new order
    picks = np.repeat(reqs[order, 0] - firsts, lengths) + np.arange(int(lengths.sum()))
    out = dict(log)
    for name in ACCESS_ARRAYS:
        out[name] = log[name][picks]
    out["requests"] = reqs[order]
    out["requests"][:, 0] = firsts
    for name in REQUEST_ARRAYS:
        if name in log:  # a log read back from its file (capacity RUN) may lack the optional ones
            out[name] = log[name][order]
    return out


_DTYPES = {"Q": np.uint64, "b": np.int8, "i": np.int32, "q": np.int64}


def _typed(code: str, values: np.ndarray) -> array:
    """values as a typed array of code, copied once (through bytes it would be twice)."""
    out = array(code)
    out.frombytes(np.ascontiguousarray(values, _DTYPES[code]).view(np.uint8))
    return out


def _stack_order(prompt, groups, decode) -> list[tuple[int, int, bool, tuple[int, ...], str, int]]:
    """(key, parent, lookup, tokens, label, plan index) of a request's blocks in the stack's order: the lookup
    groups in plan order, a chain deepest first (an independent group's blocks each alone, in plan order), the
    decode blocks deepest first ahead of the last group, whose chain they extend."""
    n = len(prompt)
    tail = [(key, parent, False, (0,) * len(COLUMNS), label, n + j) for j, (key, parent, label) in enumerate(decode)]
    rows = [] if groups else list(reversed(tail))
    for g, (first, end, independent) in enumerate(groups):
        order = range(first, end) if independent else range(end - 1, first - 1, -1)
        if g == len(groups) - 1:
            rows += reversed(tail)
        rows += [(prompt[i][0], prompt[i][2], True, prompt[i][1], prompt[i][3], i) for i in order]
    return rows
