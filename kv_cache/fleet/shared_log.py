"""The shared tier's access stream, request by request, in the access log's layout (recorder/stack_distances.py):
what its capacity curve is computed from.

Bounded: past SAMPLE_ABOVE blocks in the whole planned stream, only the accesses whose key SHARDS keeps at a rate
of SAMPLE_ABOVE / blocks are recorded (the hash stack_distances.sample uses, so the same blocks are kept wherever
they come from), with every lookup's tokens by source summed beside them for SHARDS' adjustment; the requests
themselves are all kept, in typed arrays (24 B each).
"""

from __future__ import annotations

from array import array

import numpy as np

from kv_cache.recorder.access_log import Rows
from kv_cache.recorder.stack_distances import COLUMNS, GOLDEN, MASK, SAMPLE_ABOVE


def rate_for(blocks: int) -> float:
    """The sampling rate for a stream of `blocks` planned blocks (1.0: every access)."""
    return 1.0 if blocks <= SAMPLE_ABOVE else SAMPLE_ABOVE / blocks


class SharedLog:
    def __init__(self, rate: float = 1.0) -> None:
        self.rate = rate
        self._below = int(rate * (1 << 24))
        self.keys, self.lookup, self.rows = array("Q"), array("b"), array("i")  # rows: codes into the table
        self.table = Rows()
        self.requests = array("q")  # first access, prompt tokens, arrival ns: per request
        self.lookup_tokens = np.zeros(len(COLUMNS), np.int64)  # every lookup's, sampled or not

    def _kept(self, key: int) -> bool:
        return self.rate >= 1.0 or ((key * GOLDEN) & MASK) >> 40 < self._below

    def request(self, p, reached: list[int], written: list[int]) -> None:
        """written first, then the lookups deepest first: a chain's head ends up the most recent, as the stack
        distances' prefix rule wants. A key once a request (the stack distances take each against the stack as its
        request found it): a block looked up and then written (a miss the engine computed and stored) is its lookup."""
        self.requests.extend((len(self.keys), p.prompt_tokens, int(p.at_s * 1e9)))
        looked = {p.keys[i] for i in reached}
        for key in dict.fromkeys(written):
            if key not in looked and self._kept(key):
                self.keys.append(key)
                self.lookup.append(0)
                self.rows.append(0)
        for i in reversed(reached):
            row = p.block_sources[i]
            self.lookup_tokens[: len(row)] += row
            if self._kept(p.keys[i]):
                self.keys.append(p.keys[i])
                self.lookup.append(1)
                self.rows.append(self.table.code(row))

    def arrays(self) -> dict:
        return {"keys": np.frombuffer(self.keys, np.uint64).copy(), "parents": np.zeros(len(self.keys), np.uint64),
                "lookup": np.frombuffer(self.lookup, np.int8).astype(bool), "tokens": self.table.expand(self.rows),
                "source_names": np.array(COLUMNS, dtype=str),
                "requests": np.frombuffer(self.requests, np.int64).reshape(-1, 3).copy()}
