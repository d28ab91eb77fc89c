"""The run's block accesses as the capacity curve reads them (stack_distances.py): each request's blocks in the order
the lifecycle used them, in typed arrays, bounded by a SHARDS sample past --capacity-log-accesses."""

from __future__ import annotations

import threading
from array import array
from itertools import zip_longest

import numpy as np

from kv_cache.recorder.stack_distances import COLUMNS, FULL, GOLDEN, MASK, SAMPLE_ABOVE


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
    `limit` accesses; each request's lookup tokens by source are kept whole (SHARDS' adjustment needs them), 4 B a
    column. A sampled log gives the curve at its rate; a replay, which needs every access, is not made from it."""

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
        self.requests = array("q")  # per request: first access, prompt tokens, completion time ns
        self.request_tokens = array("i")  # per request: its lookups' tokens by COLUMNS, sampled or not

    @property
    def rate(self) -> float:
        return self.below / FULL

    def request(self, prompt: list[tuple[int, tuple[int, ...], int, str]], groups, decode: list[tuple[int, int, str]],
                prompt_tokens: int, done_ns: int) -> None:
        """prompt: (key, tokens by source, parent, label) of each prompt block in plan order; groups: the plan's
        lookup groups (first, end, independent); decode: (key, parent, label) of the decode blocks. Stored in the
        stack's order (see the module); a replay reads them back in plan order (plan_pos)."""
        rows = _stack_order(prompt, groups, decode)
        keys = [r[0] for r in rows]
        if len(set(keys)) < len(keys):  # a block twice in one request: counted once, where it is deepest
            first_use = {k: n for n, k in reversed(list(enumerate(keys)))}
            rows = [r for n, r in enumerate(rows) if first_use[r[0]] == n]
        looked = [sum(c) for c in zip_longest(*(r[3] for r in rows if r[2]), fillvalue=0)]  # by column, in C
        looked += [0] * (len(COLUMNS) - len(looked))
        with self._lock:
            self.requests.extend((len(self.keys), prompt_tokens, done_ns))
            self.request_tokens.extend(looked)
            for key, parent, looked_up, tokens, label, pos in rows:
                if self.below < FULL and ((key * GOLDEN) & MASK) >> 40 >= self.below:
                    continue
                self.keys.append(key)
                self.plan_pos.append(pos)
                self.parents.append(parent)
                self.lookup.append(looked_up)
                self.tokens.append(self.rows.code(tokens))
                self.labels.append(self._codes.setdefault(label, len(self._codes)))
            if len(self.keys) > self.limit:
                self._halve()

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
            kept = reqs if name == "requests" else np.frombuffer(getattr(self, name), _DTYPES[code])[keep]
            fresh = array(code)
            fresh.frombytes(kept.tobytes())
            setattr(self, name, fresh)

    def arrays(self) -> dict[str, np.ndarray]:
        with self._lock:
            return {"keys": np.frombuffer(self.keys, np.uint64).copy(),
                    "parents": np.frombuffer(self.parents, np.uint64).copy(),
                    "lookup": np.frombuffer(self.lookup, np.int8).astype(bool), "tokens": self.rows.expand(self.tokens),
                    "source_names": np.array(COLUMNS, dtype=str),
                    "plan_pos": np.frombuffer(self.plan_pos, np.int32).copy(),
                    "requests": np.frombuffer(self.requests, np.int64).reshape(-1, 3).copy(),
                    "labels": np.frombuffer(self.labels, np.int32).copy(),
                    "label_names": np.array(sorted(self._codes, key=self._codes.get) or [""], dtype=str),
                    "request_tokens": np.frombuffer(self.request_tokens, np.int32).reshape(-1, len(COLUMNS))
                    .astype(np.int64),
                    "sample_rate": np.array(self.rate)}


_DTYPES = {"Q": np.uint64, "b": np.int8, "i": np.int32, "q": np.int64}


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
