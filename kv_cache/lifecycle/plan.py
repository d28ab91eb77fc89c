"""KVPlan: which blocks a request touches, and how its cached blocks are looked up.

A plan names every full block of prompt + answer::

    prompt tokens  |=========== prompt ===========|~~|
    answer tokens                                  |------- answer -------|~~|
    blocks         [ hit ][ hit ][miss ][miss ]  [ decode ][ decode ]
                   |-- load --|--- prefill ---|  |--- decode append ---|

A trailing partial block (~~) is never stored, as in vLLM. The prompt's
blocks fall into lookup *groups*: a prefix group hits up to its first miss
(chained keys: a block is reusable only after the same prefix); an
independent group (RAG documents with ``--rag-reuse chunk``) looks each block
up on its own, since its keys hash the document's content alone::

    [system prefix][doc A chunks][doc B chunks][question + history ...]
     prefix group   independent   independent   prefix group, chained after
                                                 everything before it

With ``block_tokens == 0`` (whole-request mode) a request is one object: it
loads the object of its history (previous prompt + answer) if cached, then
writes one object of prompt + answer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from kv_cache.cache.hashing import DIGEST_BYTES, ChainMemo, block_digests, prefix_key, to_key
from kv_cache.types import GENERATED, HISTORY, RAG_CHUNK, BlockKey, Request


@dataclass(frozen=True)
class KVPlan:
    """Keys of a request's blocks, where the prompt ends, and the lookup groups of its prompt."""

    keys: tuple[BlockKey, ...]
    tokens_per_key: tuple[int, ...]
    num_prompt_blocks: int
    labels: tuple[str, ...]
    groups: tuple[tuple[int, int, bool], ...]  # (first, end, independent) over prompt blocks
    chained: bool = True  # False in whole-request mode: its objects are no chain of blocks

    def cached_by_source(self, req: Request, i: int) -> list[tuple[str, int]]:
        """The prompt tokens hit block i brings, by source: split over the spans it straddles where its
        token positions are known (one chained group of equal blocks), else all to its label."""
        bt = self.tokens_per_key[i]
        if self.chained and len(self.groups) == 1 and req.spans:
            return req.tokens_by_label(i * bt, min((i + 1) * bt, req.num_prompt_tokens))
        if not self.chained and self.labels[i] == HISTORY and req.spans:  # whole-request mode: the prompt's prefix
            return req.tokens_by_label(0, min(bt, req.num_prompt_tokens))
        return [(self.labels[i], min(bt, req.num_prompt_tokens))]

    def hit_tokens(self, req: Request, hits: list[int]) -> tuple[list[int], dict[str, int]]:
        """The prompt tokens each hit block brings, and all of them by source. A chained prefix [0, k) whose
        spans cover the prompt is split over the sources in one pass (each of its blocks holds block_tokens
        prompt tokens); anything else block by block (cached_by_source)."""
        by_source: dict[str, int] = {}
        bt = self.tokens_per_key[0] if self.tokens_per_key else 0
        if (self.chained and len(self.groups) == 1 and req.spans and req.spans[-1][0] >= req.num_prompt_tokens
                and hits == list(range(len(hits)))):
            for label, tokens in req.tokens_by_label(0, min(len(hits) * bt, req.num_prompt_tokens)):
                by_source[label] = by_source.get(label, 0) + tokens
            return [bt] * len(hits), by_source
        per_block = []
        for i in hits:
            parts = self.cached_by_source(req, i)
            per_block.append(sum(t for _, t in parts))
            for label, tokens in parts:
                by_source[label] = by_source.get(label, 0) + tokens
        return per_block, by_source

    def parent(self, i: int) -> BlockKey | None:
        """The block a lookup must hit before it can reach block i; None where a lookup starts (a group's
        first block, an independent chunk) or in whole-request mode. Decode blocks extend the last group."""
        if not self.chained or i == 0:
            return None
        for first, end, independent in self.groups:
            if first <= i < end:
                return None if independent or i == first else self.keys[i - 1]
        return self.keys[i - 1]

    def lookup(self, present, monotone: bool = False) -> list[int]:
        """Indices of the prompt blocks that hit, given present(key) -> bool. monotone: present() never holds a
        chained block without its parent (a cache that never evicts and adds whole plans: the ceiling), so a
        prefix group's first miss is found by bisection, a dozen lookups instead of one per block."""
        hits: list[int] = []
        for first, end, independent in self.groups:
            if monotone and self.chained and not independent:
                hits.extend(range(first, _first_miss(self.keys, first, end, present)))
                continue
            for i in range(first, end):
                if present(self.keys[i]):
                    hits.append(i)
                elif not independent:
                    break
        return hits


def _first_miss(keys, first: int, end: int, present) -> int:
    """The first i in [first, end) whose key present() lacks (end if none), present() holding a prefix of them."""
    lo, hi = first, end
    while lo < hi:
        mid = (lo + hi) // 2
        if present(keys[mid]):
            lo = mid + 1
        else:
            hi = mid
    return lo


class Planner:
    """Request -> KVPlan for one model identity (root) and block size."""

    def __init__(self, block_tokens: int, root: bytes, rag_chunk: bool = False, decode: bool = True):
        self.block_tokens, self.root, self.rag_chunk, self.decode = block_tokens, root, rag_chunk, decode
        self.chains = ChainMemo(root, block_tokens)  # a follow-up hashes only what its history lacks

    def plan(self, req: Request) -> KVPlan:
        # decode off (a prefill-only node): the plan holds the prompt's blocks only, nothing is appended
        seq = np.concatenate([req.prompt_tokens, req.output_tokens]) if self.decode else req.prompt_tokens
        if self.block_tokens == 0:
            return self._whole(req, seq)
        if self.rag_chunk and req.docs:
            return self._chunked(req, seq)
        bt = self.block_tokens
        keys = self.chains.keys(req.user_id, seq)
        n_prompt = req.num_prompt_tokens // bt
        labels = tuple(req.labels_at(np.arange(1, n_prompt + 1) * bt - 1)) + (GENERATED,) * (len(keys) - n_prompt)
        return KVPlan(tuple(keys), (bt,) * len(keys), n_prompt, labels, ((0, n_prompt, False),))

    def _whole(self, req: Request, seq: np.ndarray) -> KVPlan:
        history_end = next((end for end, label in req.spans if label == HISTORY), 0)
        keys, tokens, labels = [], [], []
        if history_end:
            keys.append(prefix_key(req.prompt_tokens[:history_end], self.root))
            tokens.append(history_end)
            labels.append(HISTORY)
        keys.append(prefix_key(seq, self.root))
        tokens.append(seq.size)
        labels.append("request")
        n = len(keys) - 1
        return KVPlan(tuple(keys), tuple(tokens), n, tuple(labels), ((0, n, False),), chained=False)

    def _chunked(self, req: Request, seq: np.ndarray) -> KVPlan:
        """Prefix before the documents, position-independent document chunks, chained suffix."""
        bt, plen = self.block_tokens, req.num_prompt_tokens
        digests = block_digests(seq[: req.docs[0][0]], bt, self.root)
        keys = [to_key(d) for d in digests]
        labels = req.labels_at(np.arange(1, len(keys) + 1) * bt - 1)
        groups = [(0, len(keys), False)]
        chained = digests[-1] if digests else self.root
        for start, end, _doc in req.docs:
            first = len(keys)
            for at in range(start, end - bt + 1, bt):
                d = hashlib.blake2b(b"chunk" + self.root + seq[at:at + bt].tobytes(), digest_size=DIGEST_BYTES)
                chained = hashlib.blake2b(chained + d.digest(), digest_size=DIGEST_BYTES).digest()
                keys.append(to_key(d.digest()))
                labels.append(RAG_CHUNK)
            groups.append((first, len(keys), True))
        tail_at = req.docs[-1][1]
        first = len(keys)
        tail = block_digests(seq[tail_at:], bt, chained)
        keys.extend(to_key(d) for d in tail)
        in_prompt = max(0, (plen - tail_at) // bt)  # the tail's blocks that end within the prompt
        labels.extend(req.labels_at(tail_at + np.arange(1, in_prompt + 1) * bt - 1))
        labels.extend([GENERATED] * (len(tail) - in_prompt))
        n_prompt = first + in_prompt
        groups.append((first, n_prompt, False))
        return KVPlan(tuple(keys), (bt,) * len(keys), n_prompt, tuple(labels), tuple(groups))
