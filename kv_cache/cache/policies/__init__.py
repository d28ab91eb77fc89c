"""Eviction policies, one class each, behind four verbs.

A policy orders the blocks of one tier: ``on_insert``, ``on_hit``,
``on_remove`` keep its structure, ``candidates()`` yields keys in eviction
order. It never sees pins or tiers; the cache skips blocks it cannot evict.
"""

from __future__ import annotations

from kv_cache.cache.policies.lru import LRUPolicy
from kv_cache.errors import UserError

POLICIES = {"lru": LRUPolicy}


def make_policy(name: str):
    try:
        return POLICIES[name]()
    except KeyError:
        raise UserError(f"unknown eviction policy '{name}'; known: {', '.join(POLICIES)}.") from None
