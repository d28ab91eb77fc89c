"""A policy replayed at one capacity: the block accesses of a run (recorder/capacity.AccessLog) through this
cache, on tiers that keep the slot accounting and move no byte, as the lifecycle drives it: each request's lookup
groups pinned as prefixes, the hits read (promoted as a run promotes them), the prompt's other blocks and the
decode blocks written, each with its plan label, the policy's clock reading each request's completion time. The
capacity curve of a policy without the stack property (policies/protocol.py) is this replay at a grid of capacities."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kv_cache import counters as C
from kv_cache.cache.cache import BlockCache
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.stack_distances import in_window


class Replayed(NamedTuple):
    """What the window's requests did to the cache in a replay."""

    hit_rate: float         # of prompt tokens, any tier
    bottom_hit_rate: float  # of prompt tokens, served from the bottom tier
    reads: int              # blocks read from the bottom tier (hits there, promoted up)
    writes: int             # blocks written into it (new blocks placed there, demotions into it)


def replay(log: dict[str, np.ndarray], tiers: list, policy: type, window=(0, None), bottom: str = "") -> Replayed:
    """The window's requests when the log is replayed on tiers with policy (a POLICIES class); bottom: the name of
    the bottom tier (absent from tiers when it holds no slot; default the last)."""
    recorder = Recorder()
    recorder.start_measuring(0)  # every operation counted; the window's are picked below
    now = [0.0]  # the run's time of the request being replayed (its completion, in s): the policies' clock
    cache = BlockCache(tiers, policy, True, recorder, clock=lambda: now[0])
    names = log["label_names"][log["labels"]] if "labels" in log else None
    bottom = bottom or tiers[-1].name
    at_bottom = next((t for t, tier in enumerate(tiers) if tier.name == bottom), -1)
    moved = (C.BLOCKS(bottom, "read"), C.BLOCKS(bottom, "write"))
    reads = writes = 0
    buf = np.zeros(tiers[0].slot_bytes, np.uint8)
    req = log["requests"]
    ends = np.append(req[1:, 0], len(log["keys"]))
    hit_tokens = bottom_tokens = prompt = 0
    for (first, tokens_in_prompt, done), end in zip(req, ends):
        now[0] = done / 1e9
        before = [recorder.counters().get(k, 0) for k in moved]
        rows = _plan_order(log, first, end)
        keys = [int(log["keys"][i]) for i in rows]
        parents = [int(log["parents"][i]) for i in rows]
        looked = [bool(log["lookup"][i]) for i in rows]
        tokens = [int(log["tokens"][i].sum()) for i in rows]
        labels = [str(names[i]) if names is not None else "" for i in rows]
        hit = serve(cache, keys, parents, looked, labels, buf)
        if in_window(done, window):
            hit_tokens += sum(tokens[i] for i in hit)
            bottom_tokens += sum(tokens[i] for i, t in hit.items() if t == at_bottom)
            prompt += tokens_in_prompt
            after = [recorder.counters().get(k, 0) for k in moved]
            reads, writes = reads + after[0] - before[0], writes + after[1] - before[1]
    prompt = prompt or 1
    return Replayed(hit_tokens / prompt, bottom_tokens / prompt, reads, writes)


def serve(cache: BlockCache, keys, parents, looked, labels, buf: np.ndarray) -> dict[int, int]:
    """One request through the cache as the lifecycle drives it: its lookup groups pinned and their hits read
    (promoted), then every other block written, each with its label. Returns block index -> the tier it was read
    from. (The fleet's engines serve their requests through it too.)"""
    hit = _lookups(cache, keys, parents, looked, buf)
    for i, key in enumerate(keys):
        if i not in hit:
            write_block(cache, key, labels[i], parents[i], "prefill" if looked[i] else "decode", buf)
    return hit


def read_prefix(cache: BlockCache, keys, buf: np.ndarray) -> list[int]:
    """One lookup: pin the cached prefix of keys, read each block (promoted as a run promotes it); the tier each
    came from."""
    tiers = []
    for e in cache.pin_prefix(keys):
        tiers.append(cache.read(e, buf, "load", "read"))
        cache.release(e, buf, buf)
    return tiers


def write_block(cache: BlockCache, key: int, label: str, parent: int, phase: str, buf: np.ndarray) -> None:
    """A block written as the lifecycle writes it (not at all if the cache will not take it: see reserve_write)."""
    res = cache.reserve_write(key, buf.size, label, parent or None)
    if res is not None:
        cache.commit_write(res, buf, phase, buf)


def _plan_order(log: dict[str, np.ndarray], first: int, end: int):
    """A request's accesses in plan order: the log holds them in the stack's order (plan_pos says each one's place;
    a log of an older version held them deepest first, the reverse)."""
    if "plan_pos" not in log:
        return range(end - 1, first - 1, -1)
    return first + np.argsort(log["plan_pos"][first:end], kind="stable")


def _lookups(cache: BlockCache, keys, parents, looked, buf) -> dict[int, int]:
    """Pin each lookup group's cached prefix (a group starts where a block has no parent), read the hits."""
    hit: dict[int, int] = {}
    start = 0
    n = sum(looked)
    for i in range(1, n + 1):
        if i == n or not parents[i]:
            for j, t in enumerate(read_prefix(cache, keys[start:i], buf)):
                hit[start + j] = t
            start = i
    return hit
