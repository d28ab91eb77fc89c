"""Objects larger than one I/O: moved as a sequence of parts through bounded buffers (--io-chunk-mb).

The MLPerf reference's unit is one object per request, up to GiBs (4,196 MiB at llama3.1-8b). Held whole, it
cost every worker two buffers of the largest object, and the reference's documented workloads did not fit a
24 GiB machine. Here an object larger than ``part_bytes`` is written and read as parts of at most that size,
each a tier object of its own under a key derived from the object's (part 0 keeps the object's key), each I/O
timed: the object's latency is the sum of its parts' I/O times, recorded once, and each part's beside it (as
--io-unit layer records its I/Os). Memory grows with workers x part, never with the largest object.

``part_bytes`` is a whole number of slots, so an object takes as many slots in parts as it would whole; 0 (block
mode, or objects no larger than one part) leaves every object one I/O.
"""

from __future__ import annotations

from time import monotonic_ns as now_ns

MASK = 0xFFFF_FFFF_FFFF_FFFF


def part_key(key: int, i: int) -> int:
    """The tier key of part i of an object (part 0 is the object's own key)."""
    if i == 0:
        return key
    mixed = ((key ^ (i * 0x9E3779B97F4A7C15)) * 0xBF58476D1CE4E5B9) & MASK
    return mixed ^ (mixed >> 31) or 1


class Parts:
    """How an object of nbytes is cut into I/Os, and those I/Os against one tier."""

    def __init__(self, part_bytes: int = 0):
        self.part_bytes = part_bytes

    def many(self, nbytes: int) -> bool:
        return bool(self.part_bytes) and nbytes > self.part_bytes

    def of(self, key: int, nbytes: int) -> list[tuple[int, int, int]]:
        """(tier key, offset in the object, length) of each part."""
        pb = self.part_bytes
        if not self.many(nbytes):
            return [(key, 0, nbytes)]
        return [(part_key(key, i), at, min(pb, nbytes - at)) for i, at in enumerate(range(0, nbytes, pb))]

    def write(self, tier, key: int, nbytes: int, buf, produce=None) -> list[tuple[int, int]]:
        """Write the object into tier: buf holds it whole, or (produce) each part is made into buf first,
        untimed; returns (ns, bytes) of each part's I/O. A part that fails takes the written ones with it."""
        times, done = [], []
        try:
            for k, at, n in self.of(key, nbytes):
                view = produce(at, buf[:n]) if produce is not None else buf[at:at + n]
                start = now_ns()
                tier.put(k, view)
                times.append((now_ns() - start, n))
                done.append(k)
        except BaseException:
            for k in done:  # nothing of a half-written object stays in the tier
                tier.delete(k)
            raise
        return times

    def read(self, tier, key: int, nbytes: int, out, consume=None) -> list[tuple[int, int]]:
        """Read the object from tier into out: whole, or (an object of parts) part by part into out's start,
        handing each part to consume(offset, view) outside its timing; returns (ns, bytes) of each part's I/O."""
        times, consume = [], consume if self.many(nbytes) else None
        for k, at, n in self.of(key, nbytes):
            view = out[:n] if consume is not None else out[at:at + n]
            start = now_ns()
            tier.get(k, view)
            times.append((now_ns() - start, n))
            if consume is not None:
                consume(at, view)
        return times

    def move(self, src, dst, key: int, nbytes: int, scratch) -> None:
        """Copy the object from src into dst part by part: straight where the two tiers can (HBM into a
        registered arena), else through scratch. src keeps its copy (the caller deletes it)."""
        for k, _, n in self.of(key, nbytes):
            if not src.move_to(k, dst):
                src.get(k, scratch[:n])
                dst.put(k, scratch[:n])

    def delete(self, tier, key: int, nbytes: int, present_only: bool = False) -> None:
        for k, _, _ in self.of(key, nbytes):
            if not present_only or tier.contains(k):
                tier.delete(k)
