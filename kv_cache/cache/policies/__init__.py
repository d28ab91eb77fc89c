"""Eviction policies, one class each, behind four verbs.

A policy orders the blocks of one tier: ``on_insert``, ``on_hit``,
``on_remove`` keep its structure, ``candidates()`` yields keys in eviction
order. It never sees pins or tiers; the cache skips blocks it cannot evict.
"""

from __future__ import annotations

from kv_cache.cache.policies.lru import LRUPolicy
from kv_cache.cache.policies.s3fifo import S3FIFOPolicy
from kv_cache.cache.policies.semantic import SemanticAdaptivePolicy, SemanticStaticPolicy
from kv_cache.cache.policies.simple import FIFOPolicy, LFUPolicy, SizeLRUPolicy
from kv_cache.errors import UserError

POLICIES = {p.name: p for p in (LRUPolicy, LFUPolicy, FIFOPolicy, SizeLRUPolicy, S3FIFOPolicy, SemanticStaticPolicy,
                                SemanticAdaptivePolicy)}


def make_policy(name: str):
    try:
        return POLICIES[name]()
    except KeyError:
        raise UserError(f"unknown eviction policy '{name}'; known: {', '.join(POLICIES)}.") from None
