"""Chained block hashing: a block's key is a hash of (parent key, token ids, extra keys).

Vocabulary: the *root* is a constant derived from the model identity (not
from the seed), so the same tokens give the same keys in every process and on
every host; only full blocks get keys, as in vLLM. Python's ``hash()`` is salted
per process, so a block's digest is XXH3-128 (xxhash, unseeded) of its parent's
digest and its tokens: no adversary picks the tokens here, so a cryptographic hash
buys nothing, and BLAKE2b cost 0.84 us a block where XXH3 costs 0.18 (a
15,000-token conversation is 3,750 blocks of 4 tokens, each hashed before the
clock and again as its request is planned; issue 48). The root is BLAKE2b of the
model's name, made once.
"""

from __future__ import annotations

import hashlib
import random
import threading

import numpy as np
import xxhash

from kv_cache.types import BlockKey

DIGEST_BYTES = 16


def chain_root(model_id: str) -> bytes:
    """The parent digest of a sequence's first block."""
    return hashlib.blake2b(f"kv-cache-bench/v1/{model_id}".encode(), digest_size=DIGEST_BYTES).digest()


def block_digests(tokens: np.ndarray, block_tokens: int, root: bytes) -> list[bytes]:
    """Digests of every full block of tokens, each chained to its parent."""
    data = np.ascontiguousarray(tokens, dtype=np.int32)
    stride = block_tokens * 4
    raw = data[: data.size // block_tokens * block_tokens].tobytes()
    digest, out, parent = xxhash.xxh3_128_digest, [], root  # 16 bytes: DIGEST_BYTES
    for at in range(0, len(raw), stride):
        parent = digest(parent + raw[at:at + stride])
        out.append(parent)
    return out


def to_key(digest: bytes) -> BlockKey:
    return BlockKey(int.from_bytes(digest[:8], "little"))


def block_keys(tokens: np.ndarray, block_tokens: int, root: bytes) -> list[BlockKey]:
    """Keys of every full block of tokens (see block_digests): each digest's first 8 bytes, little-endian."""
    # NOTE: one numpy pass instead of a to_key() call per block: planning a request runs on every request.
    return _keys_of(b"".join(block_digests(tokens, block_tokens, root)))


def _keys_of(joined: bytes) -> list[BlockKey]:
    """The keys of concatenated digests: each one's first 8 bytes, little-endian, in one numpy pass."""
    return np.frombuffer(joined, dtype="<u8")[::DIGEST_BYTES // 8].tolist() if joined else []


# NOTE: what the memo may hold: each owner's last sequence (4 B a token) and its digests (16 B a block); 200 users
# of 15,000-token conversations in 4-token blocks take about 20 MiB. Counted in the memory budget's fixed allowance.
MEMO_BYTES = 32 << 20


class ChainMemo:
    """Each owner's (a user's) last sequence and its blocks' digests: a follow-up request repeats its conversation's
    history, so its chain is the memo's up to the first token that differs and hashed on from there, instead of
    from the root (a request of 4-token blocks has thousands; hashing them all was most of its plan). The keys are
    exactly block_keys(tokens): a digest is reused only where every token up to its block's end is the same.
    Thread-safe; bounded by max_bytes: when full, a new owner's sequence replaces a random other's (a least recently
    used one would be the next one asked for under round-robin users: a memo slightly too small would never hit)."""

    def __init__(self, root: bytes, block_tokens: int, max_bytes: int = MEMO_BYTES):
        self.root, self.block_tokens, self.max_bytes = root, block_tokens, max_bytes
        self._last: dict[int, tuple[np.ndarray, bytes]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._evict = random.Random(0)

    def keys(self, owner: int, tokens: np.ndarray) -> list[BlockKey]:
        """block_keys(tokens, block_tokens, root); tokens are kept as owner's last sequence."""
        block_tokens, data = self.block_tokens, np.ascontiguousarray(tokens, dtype=np.int32)
        with self._lock:
            last = self._last.get(owner)
        reused = b""
        if last is not None:
            old, joined = last
            n = min(old.size, data.size)
            differ = np.flatnonzero(old[:n] != data[:n])
            same = int(differ[0]) if differ.size else n
            reused = joined[: min(same // block_tokens, len(joined) // DIGEST_BYTES) * DIGEST_BYTES]
        done = len(reused) // DIGEST_BYTES
        parent = reused[-DIGEST_BYTES:] if reused else self.root
        joined = reused + b"".join(block_digests(data[done * block_tokens:], block_tokens, parent))
        self._keep(owner, data.copy(), joined)  # a copy: the caller's array is its own to change
        return _keys_of(joined)

    def _keep(self, owner: int, data: np.ndarray, joined: bytes) -> None:
        size = data.nbytes + len(joined)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._last.pop(owner, None)
            if old is not None:
                self._bytes -= old[0].nbytes + len(old[1])
            while self._bytes + size > self.max_bytes and self._last:
                gone = self._last.pop(self._evict.choice(list(self._last)))
                self._bytes -= gone[0].nbytes + len(gone[1])
            self._last[owner] = (data, joined)
            self._bytes += size

    @property
    def nbytes(self) -> int:
        return self._bytes


def prefix_key(tokens: np.ndarray, root: bytes) -> BlockKey:
    """Key of a whole token sequence as one object (whole-request mode)."""
    data = np.ascontiguousarray(tokens, dtype=np.int32).tobytes()
    return to_key(hashlib.blake2b(root + data, digest_size=DIGEST_BYTES).digest())
