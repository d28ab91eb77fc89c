"""The serving-side stages built from settings: the QoS classes, the autoscaler, semantic donor discovery."""

from __future__ import annotations

from kv_cache.config import Settings
from kv_cache.lifecycle.donor_search import SemanticReuse
from kv_cache.lifecycle.sketch import ShingleSketch
from kv_cache.scheduler.autoscale import Autoscaler
from kv_cache.scheduler.qos import QosPolicy


def semantic_reuse(s: Settings, recorder) -> SemanticReuse | None:
    """Donor discovery for --semantic: the embedder named by --semantic-embedder and an empty donor store."""
    if not s.semantic.enabled:
        return None
    if s.semantic.embedder == "minilm":
        from kv_cache.lifecycle.minilm import MiniLMEmbedder

        return SemanticReuse(s.semantic, s.model.block_tokens, MiniLMEmbedder(), recorder)
    return SemanticReuse(s.semantic, s.model.block_tokens, ShingleSketch(), recorder)


def qos_policy(s: Settings) -> QosPolicy:
    return QosPolicy(s.qos, s.run.seed)


def autoscaler(s: Settings, users: list | None, recorder) -> Autoscaler | None:
    """The autoscaler of --autoscale (None: off): it sets the closed loop's users itself."""
    return None if s.autoscale.mode == "off" else Autoscaler(s.autoscale, s.qos, len(users), recorder)
