"""Position-free token hashes and prompt embeddings for donor discovery (numpy only, same in every process).

Vocabulary: a *window hash* hashes tokens[i : i + w] alone — not its
position, not what came before — so the same run of tokens gets the same
hash wherever it sits (SemBlend's content-only chunk hash, computed at every
offset). It is a polynomial hash mod 2^64 evaluated for all offsets at once:
with x_j the mixed tokens and INV the inverse of an odd base,
C = cumsum(x_j * INV^j) gives sum_{j=i}^{i+w-1} x_j * INV^(j-i) as
(C[i+w] - C[i]) * BASE^i, all in wrapping uint64 arithmetic.

The default embedder is a *shingle sketch*: every distinct 3-token shingle
of a content-defined quarter of them (hash mod 4 == 0, so two prompts keep
the same shingles and sorting stays cheap) adds +1 or -1 (its hash's sign
bit) to one of 256 dimensions (bits 8-15 of its hash); the vector is
L2-normalised. Its cosine estimates the overlap
of two prompts' shingle sets (|A & B| / sqrt(|A| |B|), noise about
1/sqrt(256)); its signs are the prompt's SimHash.
"""

from __future__ import annotations

import threading

import numpy as np

_BASE = 0x9E3779B97F4A7C15  # odd, so invertible mod 2^64
_INV = pow(_BASE, -1, 1 << 64)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
SKETCH_DIMS, SHINGLE = 256, 3
SAMPLE_MASK = 3  # keep the shingles whose hash ends in two zero bits: the same ones in every prompt


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads every input bit over the output word."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class _Powers:
    """BASE^i and INV^i mod 2^64, grown on demand and shared by every thread."""

    def __init__(self) -> None:
        self.fwd = self.inv = np.ones(1, dtype=np.uint64)
        self._lock = threading.Lock()

    def upto(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        fwd, inv = self.fwd, self.inv
        if fwd.size >= n:
            return fwd, inv
        with self._lock:
            size = max(n, 2 * self.fwd.size, 1 << 14)
            one = np.ones(1, dtype=np.uint64)
            with np.errstate(over="ignore"):
                self.fwd = np.concatenate([one, np.cumprod(np.full(size - 1, _BASE, dtype=np.uint64))])
                self.inv = np.concatenate([one, np.cumprod(np.full(size - 1, _INV, dtype=np.uint64))])
            return self.fwd, self.inv


_POWERS = _Powers()


def window_hashes(tokens: np.ndarray, width: int) -> np.ndarray:
    """Content hash of tokens[i : i + width] for every i (len(tokens) - width + 1 of them)."""
    n = tokens.size - width + 1
    if n <= 0:
        return np.empty(0, dtype=np.uint64)
    fwd, inv = _POWERS.upto(tokens.size)
    with np.errstate(over="ignore"):
        x = mix64(tokens.astype(np.uint64) + np.uint64(1)) * inv[: tokens.size]
        c = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(x, dtype=np.uint64)])
        h = (c[width:] - c[:n]) * fwd[:n]
    return mix64(h ^ np.uint64(width))


def block_hashes(tokens: np.ndarray, block_tokens: int) -> np.ndarray:
    """Content-only hash of every full block (window hashes at block boundaries)."""
    full = tokens.size // block_tokens * block_tokens
    return window_hashes(tokens[:full], block_tokens)[::block_tokens]


class ShingleSketch:
    """Default embedder: signed feature hashing of the prompt's distinct 3-token shingles."""

    name = "sketch"
    dims = SKETCH_DIMS

    def embed(self, tokens: np.ndarray, req=None) -> np.ndarray:
        h = window_hashes(tokens, SHINGLE)
        shingles = np.unique(h[(h & np.uint64(SAMPLE_MASK)) == 0])
        if shingles.size == 0:
            return np.zeros(self.dims, dtype=np.float32)
        signs = np.where(shingles >> np.uint64(63), -1.0, 1.0)
        buckets = ((shingles >> np.uint64(8)) % np.uint64(self.dims)).astype(np.intp)
        vec = np.bincount(buckets, weights=signs, minlength=self.dims)
        norm = np.linalg.norm(vec)
        return (vec / norm if norm else vec).astype(np.float32)
