"""How much KV storage does this traffic need: the hit rate and the storage demand at every capacity of the bottom
tier, from one run's block accesses (--capacity-curve; `kv_cache_benchmark.py capacity RUN ...`).

The lifecycle reports each request's blocks as the cache sees them (AccessLog): its prompt blocks, looked up in
lookup groups, and the decode blocks it writes. The cache is a waterfall of LRU tiers with promotion on a hit: as a
whole, one LRU stack of the tiers' slots together. So a lookup hits some tier at total capacity C exactly when its
*stack distance* (Mattson et al., 1970: the slots of the distinct blocks used since its last use, itself included)
is at most C: with `upper` slots above the bottom tier, at a bottom tier of x slots when distance <= upper + x.

Prefix-correct eviction: this cache never evicts a block whose child in its chain is cached (a lookup stops at
the first miss, so the child would be unreachable). LRU order gives the same protection when each chain's blocks
are used deepest first, its root last: a parent is then always more recent than its children, and the LRU victim
is a leaf. A request's lookup groups keep the plan's order (its system prompt's chain is older than the RAG chunks
after it, as the cache sees them), each chain deepest first, the decode blocks with the last group they extend.
Each block's distance is taken against the stack as the request found it (before any of its own blocks moved), as
its lookup does.

Only the total hit rate (and its split by source) follows from the distances. Which tier a hit comes from and what
the bottom tier reads and writes depend on the waterfall's own rules (a tier keeps a block whose child it holds;
a hit is promoted out of the bottom tier and demoted back into it): run/capacity_curve.py replays the cache for
those.

Distances are computed in chunks of whole requests: a Fenwick tree over positions holds the slots of each key's
latest use before the chunk (vectorised over the chunk's accesses), and a chunk x chunk comparison counts the
distinct blocks used inside the chunk. One million accesses take a few seconds on one core (bench/capacity_bench.py);
memory is linear in accesses. Past SAMPLE_ABOVE accesses, SHARDS spatial sampling (Waldspurger et al., FAST '15)
keeps the blocks whose key hashes below a fixed rate and scales their distances by its inverse; the bench measures
its error against the exact curve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kv_cache.types import OTHER, SOURCES

COLUMNS = (*SOURCES, OTHER)  # a log's token columns, by source (written into the log as source_names)
OLD_COLUMNS = ("system", "history", "user", "rag", "trace_hash", "other")  # a log written before source_names
CHUNK = 256  # accesses compared pairwise per chunk (a request longer than this is a chunk of its own)
SAMPLE_ABOVE = 4_000_000  # accesses: past this, spatial sampling at SAMPLE_RATE
SAMPLE_RATE = 0.1
INF = np.iinfo(np.int64).max // 4
FULL = 1 << 24          # sample()'s hash has 24 bits: a key is kept when its hash is below the log's threshold
GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def columns_of(log: dict) -> tuple[str, ...]:
    """The names of a log's token columns (a log of an older version has none: its fixed six)."""
    return tuple(str(s) for s in log["source_names"]) if "source_names" in log else OLD_COLUMNS


def previous_use(keys: np.ndarray) -> np.ndarray:
    """For each access, the index of the previous access to the same key, or -1."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    prev = np.full(len(keys), -1, np.int64)
    same = np.nonzero(sk[1:] == sk[:-1])[0]
    prev[order[same + 1]] = order[same]
    return prev


class _Fenwick:
    """Sums over positions, vectorised over a batch of updates or queries (about log2 n numpy steps each)."""

    def __init__(self, n: int):
        self.n, self.tree = n, np.zeros(n + 1, np.int64)

    def add(self, pos: np.ndarray, delta: np.ndarray) -> None:
        i = pos.astype(np.int64) + 1
        d = np.broadcast_to(delta, i.shape).astype(np.int64)
        while i.size:
            np.add.at(self.tree, i, d)
            i = i + (i & -i)
            keep = i <= self.n
            i, d = i[keep], d[keep]

    def prefix(self, pos: np.ndarray) -> np.ndarray:
        """Sum over positions [0, pos] (pos -1: 0)."""
        i = pos.astype(np.int64) + 1
        out = np.zeros(i.shape, np.int64)
        while np.any(i > 0):
            out += self.tree[i]
            i = i - (i & -i)
        return out


def stack_distances(keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each access's LRU stack distance in slots (itself included; INF for a first use: every block is one slot),
    taken against the stack as its request found it. starts: the first access index of each request (ascending,
    from 0)."""
    n = len(keys)
    prev = previous_use(keys)
    req_of = np.searchsorted(starts, np.arange(n), side="right") - 1
    s_of = starts[req_of]
    bounds = _chunks(starts, n)
    tree, out = _Fenwick(n), np.full(n, INF, np.int64)
    for c0, c1 in bounds:
        p, s = prev[c0:c1], s_of[c0:c1]
        known = p >= 0
        g = np.zeros(c1 - c0, np.int64)
        old = known & (p < c0)
        if old.any():  # slots of keys last used in (p, c0), as the tree holds them
            total = tree.prefix(np.array([c0 - 1]))[0]
            g[old] = total - tree.prefix(p[old])
        j = np.arange(c0, c1)
        pj = prev[c0:c1]
        # M[i, j]: block j (in this chunk, before i's request) is first used in i's window since p_i
        m = (j[None, :] > p[:, None]) & (j[None, :] < s[:, None]) & (pj[None, :] <= p[:, None])
        out[c0:c1] = np.where(known, 1 + g + m.sum(1), INF)
        first_here = known & (p < c0)  # the key's latest use before the chunk leaves the tree
        if first_here.any():
            tree.add(p[first_here], -1)
        tree.add(j[_last_in(keys[c0:c1])], 1)
    return out


def _last_in(keys: np.ndarray) -> np.ndarray:
    """Mask of each key's last occurrence in keys."""
    rev = keys[::-1]
    _, first_rev = np.unique(rev, return_index=True)
    mask = np.zeros(len(keys), bool)
    mask[len(keys) - 1 - first_rev] = True
    return mask


def _chunks(starts: np.ndarray, n: int) -> list[tuple[int, int]]:
    """[c0, c1) ranges of whole requests, each at least CHUNK accesses (but the last)."""
    out, c0 = [], 0
    ends = list(starts[1:]) + [n]
    for end in ends:
        if end - c0 >= CHUNK or end == n:
            if end > c0:
                out.append((c0, int(end)))
            c0 = int(end)
    return out


def sample(log: dict[str, np.ndarray], rate: float) -> dict[str, np.ndarray]:
    """SHARDS spatial sampling: the accesses whose key hashes below rate (the same keys in every run)."""
    h = (log["keys"] * np.uint64(GOLDEN)) >> np.uint64(40)  # 24 bits of a multiplicative hash
    keep = h < np.uint64(int(rate * FULL))
    first = np.cumsum(np.concatenate([[0], keep.astype(np.int64)]))  # new index of each old access
    req = log["requests"].copy()
    req[:, 0] = first[req[:, 0]]
    out = {**{k: log[k][keep] for k in ("keys", "parents", "lookup", "tokens")}, "requests": req,
           "source_names": np.array(columns_of(log), dtype=str), "request_counts": request_counts(log)}
    if "request_started" in log:  # a row a request, as requests: sampling keeps every one
        out["request_started"] = log["request_started"]
    return out


def request_counts(log: dict[str, np.ndarray]) -> np.ndarray:
    """The requests each row of a log's requests stands for (access_log.py folds a sampled log's requests without
    a kept access into the row before; a log of an older version has one a row)."""
    return log["request_counts"] if "request_counts" in log else np.ones(len(log["requests"]), np.int64)


@dataclass
class Curve:
    """Hit rates and demand over a grid of bottom-tier capacities (slots), for the requests of a window."""

    capacities: np.ndarray       # bottom-tier slots
    hit_rate: np.ndarray         # token hit rate, any tier
    bottom_hit_rate: np.ndarray  # token hit rate served by the bottom tier (NaN: not replayed at this capacity)
    by_source: dict[str, np.ndarray]
    read_blocks: np.ndarray      # blocks read from the bottom tier (hits, promoted up; NaN: not replayed)
    write_blocks: np.ndarray     # blocks written to it (new blocks, demotions out of the tiers above; NaN: idem)
    infinite: float              # the hit rate of an unbounded bottom tier
    sampled: float               # the sampling rate (1.0: exact)
    requests: int
    knees: tuple[int | None, int | None] = (None, None)  # bottom slots reaching 90 % / 99 % of the infinite rate


def in_window(done_ns, window) -> np.ndarray | bool:
    """Whether requests completed at done_ns count: window is (start, end) ns, an end of 0 or None open."""
    return (done_ns >= window[0]) & (done_ns < (window[1] or np.inf))


def curve(log: dict[str, np.ndarray], upper_slots: int, capacities: np.ndarray, window=(0, None),
          rate: float | None = None, with_knees: bool = False, sampled_from: np.ndarray | None = None) -> Curve:
    """The capacity curve of a log (AccessLog.arrays, or several merged); window: (start, end) ns of completion
    for the requests counted (their lookups decide the hit rates; every access shapes the stack). with_knees: the
    exact knees are among the capacities of the curve (one pass over the distances). rate: a log sampled as it was
    recorded (access_log.py) is taken at its own rate, a whole one past SAMPLE_ABOVE accesses at SAMPLE_RATE.
    sampled_from: the log was sampled at rate as it was recorded (sample()'s hash) without its requests' lookup
    tokens (the fleet's), and these are all its lookups' tokens by source."""
    recorded = recorded_rate(log)
    if rate is None:
        rate = recorded if recorded < 1.0 else SAMPLE_RATE if len(log["keys"]) > SAMPLE_ABOVE else 1.0
    counted_req = in_window(log["requests"][:, 2], window)
    if sampled_from is not None and rate < 1.0:
        full_src = sampled_from.astype(np.float64)
    else:  # the window's lookup tokens by source, before any sampling
        full_src = _window_tokens(log, counted_req)
        if rate < recorded:
            log = sample(log, rate)
    keys, req = log["keys"], log["requests"]
    d = stack_distances(keys, req[:, 0]).astype(np.float64)
    first_use = d >= INF
    d[~first_use] /= rate  # a sampled distance stands for 1 / rate as many slots
    req_of = np.searchsorted(req[:, 0], np.arange(len(keys)), side="right") - 1
    counted = counted_req[req_of] & log["lookup"]
    src = log["tokens"][counted].astype(np.float64)
    # SHARDS' adjustment: the sampled lookups carry rate x the window's tokens in expectation; what they carry more
    # or less (hot blocks sampled or not) counts at distance 0, a hit at every capacity
    src = np.vstack([rate * full_src - src.sum(0), src]) if rate < 1.0 else src
    dd = np.concatenate([[0.0], d[counted]]) if rate < 1.0 else d[counted]
    tok = src.sum(1)
    denom = max(req[counted_req, 1].sum(), 1) * rate
    order = np.argsort(dd, kind="stable")
    dd_sorted, tok_cum = dd[order], np.concatenate([[0.0], np.cumsum(tok[order])])
    src_cum = np.vstack([np.zeros(src.shape[1]), np.cumsum(src[order], 0)])

    def upto(c: float) -> int:
        return int(np.searchsorted(dd_sorted, c, side="right"))

    infinite = tok_cum[upto(INF / 2)] / denom
    knees = tuple(_knee(dd_sorted, tok_cum, share * infinite * denom, upper_slots) for share in (0.90, 0.99))
    if with_knees:
        capacities = np.union1d(capacities, [k for k in knees if k is not None]).astype(np.int64)
    total = np.array([tok_cum[upto(upper_slots + x)] for x in capacities]) / denom
    by = {name: np.array([src_cum[upto(upper_slots + x), k] for x in capacities]) / denom
          for k, name in enumerate(columns_of(log)) if full_src[k]}
    # which tier serves a hit, and the bottom tier's reads and writes, are the waterfall's (the module): not here
    def unknown() -> np.ndarray:
        return np.full(len(capacities), np.nan)
    return Curve(capacities, total, unknown(), by, unknown(), unknown(), float(infinite), rate,
                 int(request_counts(log)[counted_req].sum()), knees)


def _knee(dd_sorted: np.ndarray, tok_cum: np.ndarray, target: float, upper_slots: int) -> int | None:
    """The smallest bottom-tier capacity (slots) whose hits reach target tokens: exact, from the sorted distances."""
    if target <= 0:
        return None
    i = int(np.searchsorted(tok_cum, target - 1e-6))  # tok_cum[i] >= target: the first i distances suffice
    if i == 0 or i > len(dd_sorted):
        return None
    return max(0, int(np.ceil(dd_sorted[i - 1])) - upper_slots)


def recorded_rate(log: dict[str, np.ndarray]) -> float:
    """The SHARDS rate a log was recorded at (access_log.py; 1.0: every access, as a log of an older version)."""
    return float(log["sample_rate"]) if "sample_rate" in log else 1.0


def _window_tokens(log: dict[str, np.ndarray], counted_req: np.ndarray) -> np.ndarray:
    """The lookup tokens by source of the requests counted: from each request's, kept whole beside its accesses
    (which a sampled log lacks some of), or summed from its accesses (a log of an older version)."""
    if "request_tokens" in log:
        return log["request_tokens"][counted_req].sum(0).astype(np.float64)
    req_of = np.searchsorted(log["requests"][:, 0], np.arange(len(log["keys"])), side="right") - 1
    return log["tokens"][counted_req[req_of] & log["lookup"]].sum(0).astype(np.float64)


def capacity_grid(log: dict[str, np.ndarray], upper_slots: int, points: int = 40,
                  rate: float | None = None) -> np.ndarray:
    """Bottom-tier capacities (slots) from 0 to the one that holds every distinct block, log-spaced (rate: the log
    is a SHARDS sample at it, each of its blocks standing for 1 / rate; by default the rate it was recorded at)."""
    distinct = round(len(np.unique(log["keys"])) / (recorded_rate(log) if rate is None else rate))
    top = max(distinct - upper_slots, 1)
    grid = np.union1d(np.round(np.geomspace(1, top, points)), np.round(np.linspace(0, top, points // 2)))
    return np.union1d([0], grid).astype(np.int64)  # log-spaced for the small, linear for the large


LATE_SHARE = 0.01  # the share of the window's requests served late past which the curve is not the arrivals' order


def served_order(log: dict[str, np.ndarray], window, beyond: int) -> ServedOrder | None:
    """How far from their arrival order the run's queue served the window's requests (the curve takes them in about
    that order: as they looked the cache up): each one's places late, at least (the requests dequeued before it that
    arrived after it, less those arrived before it and dequeued after it: ties never count); late beyond `beyond`
    places (the workers). None for a sampled log (its rows are folded) or one without arrival times (an older
    version's, several runs merged)."""
    arrived, dequeued = log.get("request_arrived"), log.get("request_dequeued")
    if arrived is None or dequeued is None or recorded_rate(log) < 1.0 or not len(arrived):
        return None
    order = np.argsort(dequeued, kind="stable")
    late = np.empty(len(order), np.int64)
    late[order] = np.arange(len(order)) - (np.searchsorted(np.sort(arrived), arrived[order], side="right") - 1)
    late = late[in_window(log["requests"][:, 2], window)]
    return ServedOrder(beyond, len(late), int((late > beyond).sum()), int(late.max(initial=0)))


@dataclass
class ServedOrder:
    """The window's requests against their arrival order (a queue served by QoS priority reorders them, and the
    curve's reuse distances with them)."""

    beyond_places: int              # late means more places than this (the workers)
    requests: int
    late_requests: int              # served more than beyond_places later than their place in arrival order
    most_places_late: int
    # where more than LATE_SHARE of them were late: the LRU curve of the same requests in arrival order (null else)
    arrival_knee_90_slots: int | None = None
    arrival_knee_99_slots: int | None = None
    arrival_hit_rate_at_run: float | None = None  # at the run's own capacity

    @property
    def late(self) -> bool:
        """Enough of the requests left the queue late that the curve is of the order served, not the arrivals'."""
        return self.requests > 0 and self.late_requests >= LATE_SHARE * self.requests


@dataclass
class CapacityPoint:
    """One bottom-tier capacity of the capacity curve and what the run's traffic would ask of it there."""

    slots: int
    gib: float
    hit_rate: float                 # token hit rate, any tier (stack distances: exact unless sampled)
    by_source: dict[str, float]     # of it, by source: each a share of ALL prompt tokens (they sum to hit_rate)
    # What the bottom tier serves, reads and writes: the cache replayed at this capacity (null at a capacity not
    # replayed: the waterfall's own rules decide them, which stack distances do not model)
    bottom_hit_rate: float | None   # of hit_rate, served by the bottom tier
    read_gbps: float | None         # at the run's request rate (GB = 10^9 B)
    write_gbps: float | None
    read_iops: float | None         # blocks per second
    write_iops: float | None
    bytes_per_request: float | None  # read + written at the bottom tier


@dataclass
class CapacityCurve:
    """Hit rate and storage demand at every capacity of the bottom tier, from this run's block accesses (LRU stack
    distances, exact unless sampled; another policy replayed at a grid of capacities)."""

    model: str                      # what computed it, in words (LRU stack distances, or the policy replayed)
    replayed: bool                  # the run's policy replayed (it lacks the stack property); else stack distances
    sample_rate: float              # 1.0: exact; below: SHARDS spatial sampling at this rate
    policy: str                     # the run's policy
    tiers_above_slots: int          # the tiers above the bottom one, as configured
    slot_bytes: int
    requests: int                   # the window's requests whose lookups make the hit rates
    requests_per_s: float           # the run's rate the demand is taken at
    run_slots: int                  # the run's own bottom tier (its point)
    infinite_hit_rate: float
    knee_90_slots: int | None       # the smallest capacity reaching 90 % of the infinite-cache hit rate
    knee_99_slots: int | None
    demand_model: str               # how the bottom tier's share, reads and writes were had, in words
    points: list[CapacityPoint]
    served_order: ServedOrder | None = None  # the requests' order against their arrival order (null: not known)
