"""Donor discovery: a store of earlier prompts, top-k cosine search, and block alignment.

Vocabulary: a *donor* is an earlier request whose KV blocks are (maybe
still) cached; the *recipient* is the request being served. Following
SemBlend: the recipient's embedding is searched among the donors' (cosine
>= threshold, top k); each candidate is *aligned* at block granularity with
position-free chunk hashes: the recipient's windows of block_tokens tokens,
at every offset, are looked up among the donor's block hashes. A recipient
block is covered when its tokens are exactly a donor block (aligned) or
span two consecutive donor blocks matched at the same shift (straddling);
either way one donor, contiguous positions (SemBench's *eligible*). The
*context gate* keeps a covered block only if a neighbour is covered at the
same shift, so a lone matching chunk in the wrong place is not reused.
Donors are accepted when together they cover at least min_reuse of the
blocks the exact prefix cache missed. Optional *fuzzy chunks*: a block still
uncovered next to the donor's predicted position is taken when MinHash says
at least fuzzy_overlap of its distinct tokens are in the two donor blocks.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from kv_cache.lifecycle.sketch import block_hashes, mix64, window_hashes

MINHASH_K = 16
# Chunk index: one block hash in max(4, 256 / block_tokens) is sampled (by value: the same ones on both sides);
# a donor needs 3 sampled hits to become a candidate.
FAST_PATH_TOKENS, FAST_PATH_MIN_SAMPLE, FAST_PATH_MIN_HITS = 256, 4, 3
_SEEDS = mix64(np.arange(1, MINHASH_K + 1, dtype=np.uint64) * np.uint64(0x632BE59BD9B4E019))


@dataclass(frozen=True)
class Donor:
    """What the store keeps of a request: block hashes (sorted) and its blocks' cache keys."""

    rid: str
    item: str | None        # semantic item id: tells whether a recipient's intended donor was found
    role: str
    hashes: np.ndarray      # sorted content hashes of its full prompt blocks
    order: np.ndarray       # block index of each sorted hash
    keys: np.ndarray        # cache key of each block (uint64), by block index
    tokens: int
    minhash: np.ndarray | None = None   # (blocks, MINHASH_K) for fuzzy chunks
    distinct: np.ndarray | None = None  # distinct tokens per block


def block_minhash(tokens: np.ndarray, block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """MinHash signature and distinct-token count of every full block."""
    n = tokens.size // block_tokens
    blocks = tokens[: n * block_tokens].reshape(n, block_tokens).astype(np.uint64)
    with np.errstate(over="ignore"):
        sig = mix64(blocks[:, :, None] ^ _SEEDS[None, None, :]).min(axis=1)
    srt = np.sort(blocks, axis=1)
    distinct = 1 + (srt[:, 1:] != srt[:, :-1]).sum(axis=1)
    return sig, distinct


def make_donor(rid: str, item: str | None, role: str, tokens: np.ndarray, keys, block_tokens: int,
               skip=(), fuzzy: bool = False, hashes: np.ndarray | None = None) -> Donor:
    """A donor from a served prompt: its full blocks except those in skip (not cached under its keys).

    hashes: its blocks' content hashes when the caller has them already (see block_hashes).
    """
    hashes = (block_hashes(tokens, block_tokens) if hashes is None else hashes)[: len(keys)]
    keep = np.ones(hashes.size, dtype=bool)
    keep[list(skip)] = False
    idx = np.flatnonzero(keep)
    order = idx[np.argsort(hashes[idx], kind="stable")]
    sig = distinct = None
    if fuzzy:
        sig, distinct = block_minhash(tokens, block_tokens)
    return Donor(rid, item, role, hashes[order], order.astype(np.int32), np.asarray(keys, dtype=np.uint64),
                 int(tokens.size), sig, distinct)


def store_bytes(max_donors: int, dims: int, max_prompt_tokens: int, block_tokens: int, fuzzy: bool) -> int:
    """Bound of the store's memory: every donor at the longest prompt (hash, order, key, chunk-index share
    per block; MinHash and distinct count with fuzzy chunks), its embedding and object overheads."""
    per_block = 8 + 4 + 8 + 100 // FAST_PATH_MIN_SAMPLE + (MINHASH_K * 8 + 8 if fuzzy else 0)
    return max_donors * (dims * 4 + 600 + max_prompt_tokens // block_tokens * per_block)


class DonorStore:
    """Up to max_donors embeddings in one matrix, and a chunk index; the least recently used donor makes room.

    The chunk index (SemBlend's fast path) maps a content-defined sample of
    donor block hashes (one in max(4, 256 / block_tokens): about one entry per
    256 tokens with small blocks, one block in four with large ones) to the
    donor holding it: a recipient assembled from pieces of several donors
    (none similar enough as a whole) still finds them.
    """

    def __init__(self, dims: int, max_donors: int, block_tokens: int):
        self.vectors = np.zeros((max_donors, dims), dtype=np.float32)
        self.donors: list[Donor | None] = [None] * max_donors
        self.used = np.zeros(max_donors, dtype=np.int64)
        self.count = self.clock = self.evicted = 0
        self.sample = np.uint64(max(FAST_PATH_MIN_SAMPLE, FAST_PATH_TOKENS // max(block_tokens, 1)))
        self.chunks: dict[int, int] = {}
        self._lock = threading.Lock()

    def _sampled(self, hashes: np.ndarray) -> np.ndarray:
        return hashes[hashes % self.sample == 0]

    def add(self, vec: np.ndarray, donor: Donor) -> None:
        with self._lock:
            if self.count < len(self.donors):
                slot, self.count = self.count, self.count + 1
            else:
                slot = int(np.argmin(self.used))
                self.evicted += 1
                for h in self._sampled(self.donors[slot].hashes).tolist():
                    if self.chunks.get(h) == slot:
                        del self.chunks[h]
            self.clock += 1
            self.vectors[slot], self.donors[slot], self.used[slot] = vec, donor, self.clock
            self.chunks.update(dict.fromkeys(self._sampled(donor.hashes).tolist(), slot))

    def by_chunks(self, windows: np.ndarray, vec: np.ndarray, exclude: set[int], limit: int) -> list:
        """Donors holding at least FAST_PATH_MIN_HITS of the recipient's sampled chunks, most hits first."""
        hits: dict[int, int] = {}
        with self._lock:
            for slot in map(self.chunks.get, self._sampled(windows).tolist()):
                if slot is not None:
                    hits[slot] = hits.get(slot, 0) + 1
            best = sorted((s for s, n in hits.items() if n >= FAST_PATH_MIN_HITS and id(self.donors[s]) not in exclude),
                          key=lambda s: -hits[s])[:limit]
            self.clock += 1
            self.used[best] = self.clock  # found is used: least recently used means least recently found
            return [(self.donors[s], float(self.vectors[s] @ vec)) for s in best]

    def search(self, vec: np.ndarray, top_k: int, threshold: float) -> list[tuple[Donor, float]]:
        """The top_k donors with cosine >= threshold, best first."""
        with self._lock:
            n = self.count
            if n == 0:
                return []
            sims = self.vectors[:n] @ vec
            k = min(top_k, n)
            top = np.argpartition(-sims, k - 1)[:k]
            top = top[np.argsort(-sims[top], kind="stable")]
            out = [(self.donors[i], float(sims[i])) for i in top if sims[i] >= threshold]
            self.clock += 1
            self.used[top[: len(out)]] = self.clock
            return out


@dataclass
class Cover:
    """One candidate donor's alignment with the recipient's prompt blocks."""

    donor: Donor
    covered: np.ndarray            # bool per recipient block, before the context gate
    gated: np.ndarray              # after it
    reads: dict[int, tuple[int, ...]] = field(default_factory=dict)  # recipient block -> donor blocks
    shift: np.ndarray | None = None  # donor token position - recipient token position, per block


class Windows:
    """A recipient's window hashes at every offset, sorted once so that each donor's few block hashes are
    looked up among them (not the other way round: a donor has tens of blocks, a prompt thousands of offsets)."""

    def __init__(self, tokens: np.ndarray, block_tokens: int):
        self.hashes = window_hashes(tokens, block_tokens)
        self.order = self.sorted = None  # sorted on first use: a request without candidates never pays for it

    def donor_blocks(self, donor: Donor) -> np.ndarray:
        """Per offset, the donor block whose content equals the window there (-1: none)."""
        if self.order is None:
            self.order = np.argsort(self.hashes)
            self.sorted = self.hashes[self.order]
        out = np.full(self.hashes.size, -1, dtype=np.int64)
        lo = np.searchsorted(self.sorted, donor.hashes, "left")
        n = np.searchsorted(self.sorted, donor.hashes, "right") - lo
        if n.any():
            first = np.repeat(lo, n)
            step = np.arange(first.size) - np.repeat(np.cumsum(n) - n, n)
            out[self.order[first + step]] = np.repeat(donor.order, n)
        return out


def cover(windows: Windows, n_blocks: int, bt: int, donor: Donor, gate: bool) -> Cover:
    """Align a recipient (the window hashes of its prompt at every offset) with one donor's block hashes."""
    empty = np.zeros(n_blocks, dtype=bool)
    size = windows.hashes.size
    if donor.hashes.size == 0 or size == 0 or n_blocks == 0:
        return Cover(donor, empty, empty.copy())
    dblock = windows.donor_blocks(donor)
    last = np.maximum.accumulate(np.where(dblock >= 0, np.arange(size), -1))
    starts = np.arange(n_blocks) * bt
    q = last[starts]
    valid = (q >= 0) & (q > starts - bt)
    aligned = valid & (q == starts)
    nxt = np.minimum(q + bt, size - 1)
    straddle = valid & ~aligned & (q + bt < size) & (dblock[nxt] == dblock[q] + 1) & (dblock[q] >= 0)
    covered = aligned | straddle
    shift = np.where(covered, dblock[q] * bt - q, np.iinfo(np.int64).min)
    gated = covered.copy()
    if gate:
        left = np.concatenate([[False], covered[:-1] & (shift[:-1] == shift[1:])])
        right = np.concatenate([covered[1:] & (shift[1:] == shift[:-1]), [False]])
        gated &= left | right
    reads = {int(r): (int(dblock[q[r]]),) if aligned[r] else (int(dblock[q[r]]), int(dblock[q[r]]) + 1)
             for r in np.flatnonzero(gated)}
    return Cover(donor, covered, gated, reads, shift)


def fuzzy_cover(tokens: np.ndarray, bt: int, c: Cover, todo: np.ndarray, overlap: float) -> dict[int, tuple]:
    """Donor blocks for uncovered recipient blocks near the donor's predicted position (MinHash containment)."""
    d = c.donor
    if d.minhash is None or not todo.any():
        return {}
    sig, distinct = block_minhash(tokens, bt)
    known = np.flatnonzero(c.gated)
    ratio = d.tokens / max(tokens.size, 1)
    out: dict[int, tuple] = {}
    for r in np.flatnonzero(todo):
        if known.size:  # the shift of the nearest covered block; otherwise proportional position
            near = known[np.argmin(np.abs(known - r))]
            pos = r * bt + int(c.shift[near])
        else:
            pos = int(r * bt * ratio)
        best, at = 0.0, -1
        for d1 in range(pos // bt - 1, pos // bt + 2):  # drift: the prediction may be a block off
            if 0 <= d1 and d1 + 1 < d.minhash.shape[0]:
                union = np.minimum(d.minhash[d1], d.minhash[d1 + 1])
                j = float(np.mean(union == sig[r]))
                size_u = int(d.distinct[d1] + d.distinct[d1 + 1])
                contained = j * (distinct[r] + size_u) / ((1 + j) * distinct[r])
                if contained > best:
                    best, at = contained, d1
        if best >= overlap:
            out[int(r)] = (at, at + 1)
    return out
