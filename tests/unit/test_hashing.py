"""Chained block hashes: equal prefixes share keys, anything else does not."""

import subprocess
import sys

import numpy as np

from kv_cache.cache.hashing import block_keys, chain_root, prefix_key

ROOT = chain_root("llama3.1-8b/bf16/tp1")


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 128_000, n, dtype=np.int32)


def test_equal_prefixes_share_blocks_and_diverge_after():
    common = tokens(64, 1)
    a = np.concatenate([common, tokens(40, 2)])
    b = np.concatenate([common, tokens(40, 3)])
    ka, kb = block_keys(a, 16, ROOT), block_keys(b, 16, ROOT)
    assert ka[:4] == kb[:4]
    assert not set(ka[4:]) & set(kb[4:])
    assert len(ka) == 104 // 16  # only full blocks get keys


def test_a_block_key_depends_on_its_parent():
    x, y = tokens(16, 1), tokens(16, 2)
    # The same 16 tokens as the second block behind different first blocks -> different keys.
    k1 = block_keys(np.concatenate([x, y]), 16, ROOT)[1]
    k2 = block_keys(np.concatenate([y, y]), 16, ROOT)[1]
    assert k1 != k2


def test_roots_separate_models():
    t = tokens(32, 5)
    assert block_keys(t, 16, ROOT) != block_keys(t, 16, chain_root("llama3.1-70b/bf16/tp1"))


def test_keys_are_stable_across_processes():
    t = tokens(48, 9)
    here = [int(k) for k in block_keys(t, 16, ROOT)]
    code = ("import numpy as np; from kv_cache.cache.hashing import block_keys, chain_root;"
            "t=np.random.default_rng(9).integers(0,128_000,48,dtype=np.int32);"
            "print([int(k) for k in block_keys(t,16,chain_root('llama3.1-8b/bf16/tp1'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(out) == here


def test_whole_sequence_key_covers_every_token():
    t = tokens(100, 3)
    u = t.copy()
    u[-1] += 1
    assert prefix_key(t, ROOT) != prefix_key(u, ROOT)
    assert prefix_key(t, ROOT) == prefix_key(t.copy(), ROOT)


def test_block_keys_are_each_digests_first_eight_bytes():
    """block_keys folds the digests with numpy: the same keys as to_key() of each digest, any block size."""
    from kv_cache.cache.hashing import block_digests, to_key

    tokens = np.arange(1001, dtype=np.int32)
    for bt in (1, 4, 16, 1000, 1001, 2000):
        digests = block_digests(tokens, bt, ROOT)
        assert block_keys(tokens, bt, ROOT) == [to_key(d) for d in digests]
        assert len(digests) == 1001 // bt
