"""Deterministic token content for traces that carry only lengths or hash ids.

Vocabulary: a *stream* is an endless token sequence named by (namespace,
ident); token i of it is a counter-based hash (splitmix64) of (namespace,
ident, i), so it is the same on every run and host, costs no RNG state, and
two different streams share no block by accident. A hash-id trace block with
id h becomes the first L tokens of stream (HASHED, h): equal ids give equal
tokens, so re-blocking at any block size shares exactly the prefixes the trace
shares.
"""

from __future__ import annotations

import numpy as np

# Namespaces: what a stream stands for.
HASHED, UNIQUE, OUTPUT, SYSTEM_PROMPT, DOCUMENT, SESSION = range(1, 7)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _seed(namespace: int, ident: int) -> np.uint64:
    word = np.array([(namespace << 56) ^ (int(ident) & 0x00FF_FFFF_FFFF_FFFF)], dtype=np.uint64)
    return _mix(word)[0]


def stream(namespace: int, ident: int, n: int, vocab: int, start: int = 0) -> np.ndarray:
    """Tokens start .. start+n-1 of stream (namespace, ident), as int32 ids in [0, vocab)."""
    with np.errstate(over="ignore"):
        idx = np.arange(start, start + n, dtype=np.uint64) + (_seed(namespace, ident) << np.uint64(20))
    return (_mix(idx) % np.uint64(vocab)).astype(np.int32)


def hashed_prompt(hash_ids: list[int], input_length: int, trace_block: int, vocab: int,
                  tail_ident: int) -> np.ndarray:
    """Prompt tokens of a hash-id trace record: block j is the first tokens of stream (HASHED, id_j).

    With ceil(input/trace_block) ids the last, partial block has an id of its own (Mooncake);
    with floor(...) ids a partial tail gets unique tokens (stream (UNIQUE, tail_ident)).
    """
    parts = []
    left = input_length
    for h in hash_ids:
        n = min(trace_block, left)
        parts.append(stream(HASHED, h, n, vocab))
        left -= n
    if left > 0:
        parts.append(stream(UNIQUE, tail_ident, left, vocab))
    return np.concatenate(parts) if parts else np.empty(0, np.int32)
