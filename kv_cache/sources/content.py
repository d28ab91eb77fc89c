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
    """splitmix64's finaliser over an array (array arithmetic wraps modulo 2^64 without a warning; numpy scalars
    would warn, so a lone word goes as a one-element array)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _bases(namespace: int, idents: list[int]) -> np.ndarray:
    """Each stream's index base: its seed (namespace, ident mixed) shifted past the 2^20 tokens a stream indexes
    apart."""
    words = np.array([(namespace << 56) ^ (int(i) & 0x00FF_FFFF_FFFF_FFFF) for i in idents], dtype=np.uint64)
    return _mix(words) << np.uint64(20)


def _tokens(idx: np.ndarray, vocab: int) -> np.ndarray:
    """Token ids in [0, vocab) of stream positions idx."""
    return (_mix(idx) % np.uint64(vocab)).astype(np.int32)


def stream(namespace: int, ident: int, n: int, vocab: int, start: int = 0) -> np.ndarray:
    """Tokens start .. start+n-1 of stream (namespace, ident), as int32 ids in [0, vocab)."""
    return _tokens(np.arange(start, start + n, dtype=np.uint64) + _bases(namespace, [ident]), vocab)


def heads(namespace: int, idents: list[int], lengths: list[int], vocab: int) -> np.ndarray:
    """The first lengths[j] tokens of stream (namespace, idents[j]) for each j, concatenated: stream()'s tokens,
    every stream's in one pass (a prompt of 24 hash ids took 24 passes of a dozen small array operations each)."""
    n = np.asarray(lengths, dtype=np.int64)
    if not n.size:
        return np.empty(0, np.int32)
    first = np.repeat(np.cumsum(n) - n, n).astype(np.uint64)  # each token's stream's first position
    return _tokens(np.arange(int(n.sum()), dtype=np.uint64) - first + np.repeat(_bases(namespace, idents), n), vocab)


def hashed_prompt(hash_ids: list[int], input_length: int, trace_block: int, vocab: int,
                  tail_ident: int) -> np.ndarray:
    """Prompt tokens of a hash-id trace record: block j is the first tokens of stream (HASHED, id_j).

    With ceil(input/trace_block) ids the last, partial block has an id of its own (Mooncake);
    with floor(...) ids a partial tail gets unique tokens (stream (UNIQUE, tail_ident)).
    """
    covered = max(0, min(len(hash_ids), -(-input_length // trace_block)))  # the ids the prompt reaches
    lengths = [min(trace_block, input_length - j * trace_block) for j in range(covered)]
    prompt = heads(HASHED, hash_ids[:covered], lengths, vocab)
    left = input_length - sum(lengths)
    return np.concatenate([prompt, stream(UNIQUE, tail_ident, left, vocab)]) if left > 0 else prompt
