"""The tier protocol: one medium per module, behind one small interface.

Vocabulary: a *tier* stores blocks by key in fixed-size slots; it knows
nothing of users, requests or eviction. The cache asks a tier to ``put`` a
block (after making room), ``get`` it into a caller's buffer, or ``delete``
it. Capability flags tell the core what a tier is without testing its name
(fio's ioengine flags).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

import numpy as np

# Capability flags: each is read somewhere above the tier that sets it (tests/unit/test_composition.py checks).
FAKE_IO = "fake_io"                # moves no bytes (null tier): payloads need not be built
SIMULATED = "simulated"            # timing comes from a model, not a device
SHARED = "shared"                  # other processes write and evict blocks here too (hook: adopt)
PINS_HOST = "pins_host"            # registers host buffers for direct DMA (hooks: pin_host, move_to, move_many_to,
                                   # transfers)
HOST_SLOTS = "host_slots"          # its slots are host memory a device copies into directly (hooks: host_memory,
                                   # alloc_views, held_view)
PRECONDITIONS = "preconditions"    # can write its whole space before the run (hook: precondition)
IO_UNITS = "io_units"              # moves a block as several timed I/Os (hook: io_times)
STORAGE = "storage"                # holds blocks outside the process's memory (a disk, a remote store): a stack's
                                   # bottom must be one
REMOTE = "remote"                  # behind a network: latency is network + server, never a device
BATCHES = "batches"                # moves a batch of blocks together (hooks: get_many, put_many); without it a
                                   # batch goes one block after another (the summary says which path ran)
SPLITS = "splits"                  # times its device calls apart inside an operation (device_begin / device_ns)

# The MLPerf reference's split of a storage operation: "device" the calls that reach the device (pread / pwrite
# with O_DIRECT, fdatasync after a buffered write, a read after the page cache was dropped), "host" the rest (a
# buffered write into the page cache, the advice call before a read, a copy into or out of a mapping). A SPLITS
# tier's engine adds each device call's time to its thread's count; the cache reads it around one operation.
_DEVICE = threading.local()


def device_begin() -> None:
    _DEVICE.ns = 0


def device_ns() -> int:
    """This thread's time in device calls since device_begin()."""
    return getattr(_DEVICE, "ns", 0)


def device_call(start_ns: int) -> None:
    """A device call that began at start_ns has ended: its time counts as device time."""
    _DEVICE.ns = getattr(_DEVICE, "ns", 0) + time.monotonic_ns() - start_ns


# The queue depth a batch achieved (results' queue_depth.*.in_flight_*), by Little's law: the time its I/Os spent in
# flight, each from the call that submitted it to the moment the engine saw it complete, summed, over the batch's
# own time. A medium that times its batch's I/Os adds their sum to the worker's count (the NVMe engines: a pool's
# threads, a ring; a Valkey pipeline: each request outstanding from the send until its reply is read; S3: each request
# from its thread's start to its reply; GDS: each cuFile I/O from its submission to its wait's return); the cache
# takes it around one tier's batch call. One that does not adds nothing, and its depth is not measured (the GPU's
# copies, queued on a stream that runs them in order; the CPU tier).
_IN_FLIGHT = threading.local()


def in_flight(ns: int) -> None:
    """A batch's I/Os spent ns in flight in all (added up by the engine that moved them)."""
    _IN_FLIGHT.ns = (getattr(_IN_FLIGHT, "ns", None) or 0) + ns


def in_flight_take() -> int | None:
    """This thread's I/O time in flight since the last take (None: no engine timed any), and a fresh count."""
    ns, _IN_FLIGHT.ns = getattr(_IN_FLIGHT, "ns", None), None
    return ns


def slots_of(n: int, slot_bytes: int) -> str:
    """A tier's slots in its description: '12 slots of 80.00 MiB', '1 slot of 32.00 MiB'."""
    return f"{n} slot{'' if n == 1 else 's'} of {slot_bytes / 2**20:.2f} MiB"


def moves_real_bytes(tier) -> bool:
    """Bytes really go to a device and come back (neither the null tier nor a simulated one): its reads can be
    verified and its speed probed."""
    return tier.flags.isdisjoint({FAKE_IO, SIMULATED})


@runtime_checkable
class Tier(Protocol):
    """What every tier implements."""

    name: str           # its medium's name (the registry's kinds: gpu, cpu, nvme, valkey, s3, ...; "handoff")
    flags: frozenset    # capability flags above
    slot_bytes: int
    num_slots: int
    description: str    # one line for the output: engine, layout, why

    def slots_for(self, nbytes: int) -> int: ...
    def put(self, key: int, buf: np.ndarray) -> None: ...
    def get(self, key: int, out: np.ndarray) -> None: ...
    def put_many(self, items: list[tuple[int, np.ndarray]]) -> list: ...  # each: completion ns, or its exception
    def get_many(self, items: list[tuple[int, np.ndarray]]) -> list: ...
    def delete(self, key: int) -> None: ...
    def contains(self, key: int) -> bool: ...
    @property
    def used_bytes(self) -> int: ...
    @property
    def capacity_bytes(self) -> int: ...
    def close(self, remove: bool = True) -> None: ...


class SlottedTier:
    """Shared bookkeeping of tiers that keep a SlotMap; subclasses move the bytes."""

    name = "?"
    flags: frozenset = frozenset()
    description = ""

    def __init__(self, num_slots: int, slot_bytes: int):
        from kv_cache.tiers.slots import SlotMap

        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self.slots = SlotMap(num_slots, slot_bytes)

    def slots_for(self, nbytes: int) -> int:
        return self.slots.slots_for(nbytes)

    def contains(self, key: int) -> bool:
        return key in self.slots

    @property
    def used_bytes(self) -> int:
        return self.slots.used_slots * self.slot_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.num_slots * self.slot_bytes

    def release(self, key: int) -> None:
        """Free key's slots without touching the bytes (a block whose copy elsewhere is the one kept)."""
        self.slots.release(key)

    # Batch verbs: a batch of (key, buffer) in flight together; each item's result is its completion time
    # (monotonic ns) or the exception it raised (one block failing does not take the batch's others with it). A
    # medium without BATCHES inherits these loops: one block after another.
    def put_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        return one_by_one(self.put, items)

    def batch_path(self) -> str:
        """How a batch of its blocks reaches the medium, in words (the summary and results say it)."""
        return "one block after another (this medium has no batch path)"

    def get_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        return one_by_one(self.get, items)

    # Optional hooks: a tier that has the capability overrides the hook and declares the flag.
    def pin_host(self, arr: np.ndarray) -> None:
        """PINS_HOST: register a host buffer for direct DMA; nothing to do elsewhere."""

    def move_to(self, key: int, dst) -> bool:
        """PINS_HOST: move a block's bytes straight into dst's slots when the two can; False: the cache copies
        it through a worker's buffer (get, then put)."""
        return False

    def move_many_to(self, items: list[tuple[int, int]], dst) -> list | None:
        """PINS_HOST: move a batch of (key, nbytes) straight into dst's slots together (each item's completion ns,
        or its exception; src keeps its copies); None where the two cannot (the cache moves them otherwise)."""
        return None

    def transfers(self) -> dict[str, dict[str, int]] | None:
        """PINS_HOST: host <-> device copies by direction, direct or staged; None elsewhere."""
        return None

    def host_memory(self) -> list[np.ndarray]:
        """HOST_SLOTS: the long-lived host buffers holding its slots (registered with a GPU tier before the clock)."""
        return []

    def alloc_views(self, key: int, nbytes: int) -> list[np.ndarray]:
        """HOST_SLOTS: allocate key's slots and return a writable host view of each (a device copies into them)."""
        raise NotImplementedError(f"the {self.name} tier has no host slots")

    def held_view(self, key: int) -> np.ndarray | None:
        """HOST_SLOTS: key's bytes where they lie (one run of slots), for another tier to write from; else None."""
        return None

    def io_times(self) -> list[tuple[int, int]]:
        """IO_UNITS: (ns, bytes) of each I/O of this thread's last put or get; none elsewhere."""
        return []

    def batch_io_times(self) -> list[list[tuple[int, int]]]:
        """IO_UNITS: for each item of this thread's last put_many or get_many, (completion ns, bytes) of each of its
        I/Os (none for an item that failed); none elsewhere."""
        return []

    def adopt(self, key: int) -> int | None:
        """SHARED: take over a block another process published here (its bytes), or None."""
        return None

    def precondition(self, passes: int, steady: float = 0.0, on_pass=None) -> dict:
        """PRECONDITIONS: write the whole space before the run."""
        raise NotImplementedError(f"the {self.name} tier cannot be preconditioned")

    def close(self, remove: bool = True) -> None:
        """Nothing to release by default; remove: also delete the tier's files, if it has any."""


def one_by_one(verb, items: list) -> list:
    """verb(key, buf) on each item in turn: each item's completion time, or the exception it raised."""
    out: list = []
    for key, buf in items:
        try:
            verb(key, buf)
            out.append(time.monotonic_ns())
        except Exception as e:  # noqa: BLE001 - the item's own failure, handed back to the cache to judge
            out.append(e)
    return out


class PerThread:
    """Things prepared before the clock starts, one handed to each thread on its first use (no allocation then)."""

    def __init__(self, items, what: str):
        self.free = list(items)
        self.what = what
        self._local = threading.local()
        self._lock = threading.Lock()

    def mine(self):
        item = getattr(self._local, "item", None)
        if item is None:
            with self._lock:
                if not self.free:
                    raise RuntimeError(f"more threads use {self.what} than were prepared")
                item = self._local.item = self.free.pop()
        return item
