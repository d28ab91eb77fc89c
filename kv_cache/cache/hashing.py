"""Chained block hashing: a block's key is a hash of (parent key, token ids, extra keys).

Vocabulary: the *root* is a constant derived from the model identity (not
from the seed), so the same tokens give the same keys in every process and on
every host; only full blocks get keys, as in vLLM. blake2b is used because
Python's ``hash()`` is salted per process.
"""

from __future__ import annotations

import hashlib

import numpy as np

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
    blake2b, out, parent = hashlib.blake2b, [], root
    for at in range(0, len(raw), stride):
        parent = blake2b(parent + raw[at:at + stride], digest_size=DIGEST_BYTES).digest()
        out.append(parent)
    return out


def to_key(digest: bytes) -> BlockKey:
    return BlockKey(int.from_bytes(digest[:8], "little"))


def block_keys(tokens: np.ndarray, block_tokens: int, root: bytes) -> list[BlockKey]:
    """Keys of every full block of tokens (see block_digests): each digest's first 8 bytes, little-endian."""
    digests = block_digests(tokens, block_tokens, root)
    # NOTE: one numpy pass instead of a to_key() call per block: planning a request runs on every request.
    return np.frombuffer(b"".join(digests), dtype="<u8")[::DIGEST_BYTES // 8].tolist() if digests else []


def prefix_key(tokens: np.ndarray, root: bytes) -> BlockKey:
    """Key of a whole token sequence as one object (whole-request mode)."""
    data = np.ascontiguousarray(tokens, dtype=np.int32).tobytes()
    return to_key(hashlib.blake2b(root + data, digest_size=DIGEST_BYTES).digest())
