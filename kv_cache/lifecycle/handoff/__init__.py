"""The prefill -> decode handoff: one home, two sides, two transports.

    __init__   the sides' interfaces (Publisher: a prefill node; Loader: a decode node) and the identity both
               nodes must share
    space.py   the transport-free bookkeeping of the prefill node's handoff space: which blocks are published,
               their digests, which requests hold them until a decode node acknowledges, the wait for room
    folder.py  file://DIR: block files and a manifest in a shared folder, acknowledgements as files beside it
    nixl.py    nixl://HOST:PORT: registered memory (host or GPU) read with NIXL READs, over channel.py's side
               channel (the manifest, assignments, acknowledgements, heartbeats)

A transport is composed from the space and its own blocks store (put / delete / slots_for, slot_bytes,
capacity_bytes): none subclasses another. The decode node's traffic (the manifest's requests as Requests) is a
traffic source, sources/decode_arrivals.py, as every source is. Each transport's module declares its ``TRANSPORT`` (its
scheme and the form a user types), found with the other extension points (run/registry.py); the composition root
(run/handoff.py) picks the one a --handoff URL names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kv_cache.errors import UserError
from kv_cache.types import Handoff

IDENTITY = ("model", "kv_dtype", "tp", "block_tokens", "seed")  # what both nodes must agree on


@dataclass(frozen=True)
class Transport:
    """A handoff transport as a --handoff URL names it."""

    name: str     # "file", "nixl"
    scheme: str   # what its URL starts with: "file://"
    form: str     # the URL as a user types it, with what it is: "file://DIR (a folder both nodes share)"

    def address(self, url: str) -> str:
        return url[len(self.scheme):]


class HandoffBlocks(Protocol):
    """What the results' tier table says of a handoff space (a row named "handoff")."""

    name: str
    engine: str
    capacity_bytes: int
    description: str


class PeerSpace:
    """A decode node's row for the handoff space it reads (HandoffBlocks): the space is the prefill node's, its
    capacity there (0: not known here)."""

    name, flags = "handoff", frozenset()

    def __init__(self, engine: str, capacity_bytes: int, description: str):
        self.engine, self.capacity_bytes, self.description = engine, capacity_bytes, description


class Publisher(Protocol):
    """A prefill node's side: publishes a request's prompt blocks, then hands the request over."""

    role: str  # "prefill"
    engine: str
    where: str  # the folder or the URL (the results' role section)
    blocks: HandoffBlocks
    stopping: object  # () -> bool: the run's drain ran out, no more waiting for room

    def publish(self, keys, nbytes, fill, buf, recorder) -> int: ...
    def digests(self, keys) -> tuple[int, ...]: ...
    def hand_over(self, record: Handoff) -> None: ...
    def attached(self) -> set[str]: ...  # every decode node that attached
    def ready_nodes(self) -> set[str]: ...  # those of them whose clock runs (and have not left or finished)
    def run_alone(self) -> None: ...  # none came before the clock: a full space stops waiting for one
    def finish(self, wait_s: float, remove: bool, say) -> dict: ...
    def abandon(self, remove: bool) -> None: ...


class Loader(Protocol):
    """A decode node's side: loads a handed-over request's blocks, then acknowledges it."""

    role: str  # "decode"
    engine: str
    where: str
    blocks: HandoffBlocks

    def load_many(self, items: list[tuple[int, object]]) -> list[bool]: ...  # each block read, or gone
    def loaded(self, record: Handoff) -> None: ...
    def ready(self) -> None: ...  # its tiers are built and its clock starts: the prefill node may start its own
    def detach(self) -> None: ...


def check_header(header: dict, identity: dict, where: str) -> None:
    for k in IDENTITY:
        if header.get(k) != identity[k]:
            raise UserError(f"{where} was written for {k} {header.get(k)!r} but this decode node runs "
                            f"{identity[k]!r}; start both nodes with the same --model, --kv-dtype, --tp, "
                            f"--block-tokens and --seed.")
