"""Eviction policies, one class each, behind the verbs of ``base.Policy`` (read it first).

``POLICIES`` is their one table: the --policy flag's choices and help, the check of a config file's value, the
``policies`` sub-command and the capacity curve (exact for a policy with the stack property, replayed otherwise)
read it, handed down by the registry (run/registry.py).
"""

from __future__ import annotations

from kv_cache.cache.policies.lru import LRUPolicy
from kv_cache.cache.policies.protocol import Policy, make
from kv_cache.cache.policies.s3fifo import S3FIFOPolicy
from kv_cache.cache.policies.semantickv import SemanticAdaptivePolicy, SemanticStaticPolicy
from kv_cache.cache.policies.simple import FIFOPolicy, LFUPolicy, SizeLRUPolicy
from kv_cache.errors import UserError

POLICIES = {p.name: p for p in (LRUPolicy, LFUPolicy, FIFOPolicy, SizeLRUPolicy, S3FIFOPolicy, SemanticStaticPolicy,
                                SemanticAdaptivePolicy)}


__all__ = ["POLICIES", "Policy", "make", "policy_class"]


def policy_class(name: str, table: dict = POLICIES) -> type:
    """The class of policy name in table (one sentence for a name it lacks)."""
    try:
        return table[name]
    except KeyError:
        raise UserError(f"unknown eviction policy '{name}'; known: {', '.join(table)}.") from None
