"""What an eviction policy is (``Policy``): the verbs the cache calls, and what it declares of itself.

A policy orders the blocks of one tier. The cache tells it what happened (``on_insert``, ``on_hit``,
``on_remove``), which blocks have a dependent in the tier and so cannot leave before it (``hold`` / ``free``:
a prefix chain's tail leaves before its head), and asks it for ``candidates()`` in eviction order; ``keys()``
lists what it orders (checks only). It never sees pins or tiers: the cache skips what it cannot evict.

It declares its ``name`` (the --policy choice), a one-line ``summary`` (--help), whether it has the *stack
property* (a block hit at capacity C is hit at every larger capacity, so one pass of stack distances gives the
exact hit rate at every capacity: the capacity curve is exact for it, replayed otherwise), and whether its order
reads a clock (``uses_clock``: it is then made with the run's clock, and a replay hands it the run's times).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import ClassVar, Protocol, runtime_checkable


@runtime_checkable
class Policy(Protocol):
    name: ClassVar[str]
    summary: ClassVar[str]
    stack_property: ClassVar[bool]
    uses_clock: ClassVar[bool]

    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None: ...
    def on_hit(self, key: int) -> None: ...
    def on_remove(self, key: int) -> None: ...
    def hold(self, key: int) -> None: ...
    def free(self, key: int) -> None: ...
    def candidates(self) -> Iterator[int]: ...
    def keys(self) -> set[int]: ...


def make(policy: type, clock: Callable[[], float] | None = None) -> Policy:
    """One tier's instance of a policy class; clock: what a clock-reading policy reads (None: its own)."""
    return policy(clock) if policy.uses_clock and clock is not None else policy()
