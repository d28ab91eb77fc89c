"""Whether a fleet fits in memory, checked before it grows: the planned stream is linear in the blocks of its
requests, each point's state (the engines' indexes, the shared tier, its access stream) in the distinct blocks.

The sizes per block were measured with tracemalloc on the Mooncake conversation trace (3,000 requests, 512-token
blocks, 8 engines): the stream 34 B a block (fleet/stream.PlannedStore; planning also holds a set of the distinct
keys), a point 1.6 KB (--engine-model stack) to 2.7 KB (cache) a block the shared tier held; the figures below round
them up.
"""

from __future__ import annotations

from kv_cache.errors import UserError
from kv_cache.hostmemory import available_bytes
from kv_cache.model import GiB

STREAM_BYTES_PER_BLOCK = 60
POINT_BYTES_PER_BLOCK = 3_000  # per distinct block: every engine's entries and the shared tier's together, at most
SHARE = 0.8  # of the memory available when the check runs
PROBE = 1_000  # requests planned before the stream's size is projected


def check_stream(planned: int, blocks: int, count: int) -> None:
    """After `planned` requests of `count` with `blocks` blocks so far: refuse if the whole stream cannot fit."""
    need = blocks / planned * count * STREAM_BYTES_PER_BLOCK
    free = available_bytes() * SHARE
    if need > free:
        raise UserError(f"fleet: {count:,} requests of about {blocks / planned:.0f} blocks each would take about "
                        f"{need / GiB:.1f} GiB planned ({STREAM_BYTES_PER_BLOCK} B a block), more than the "
                        f"{free / GiB:.1f} GiB free to use; lower --max-requests or raise --block-tokens.")


def check_points(stream_blocks: int, distinct: int) -> None:
    """Once planned: refuse if a point's state for `distinct` blocks cannot fit beside the stream."""
    stream = stream_blocks * STREAM_BYTES_PER_BLOCK
    point = distinct * POINT_BYTES_PER_BLOCK
    free = available_bytes() * SHARE
    if point > free:
        raise UserError(f"fleet: its {distinct:,} distinct blocks need up to {point / GiB:.1f} GiB for one engine "
                        f"count and router at a time ({POINT_BYTES_PER_BLOCK:,} B a block) beside the "
                        f"{stream / GiB:.1f} GiB planned stream, and {free / GiB:.1f} GiB is free to use; lower "
                        f"--max-requests or raise --block-tokens.")
