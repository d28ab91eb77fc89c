"""The counters' vocabulary: every name a stage counts under and the results read back, built here only.

A counter is kept by name: a flat name -> int map that worker shards, trials and MPI ranks sum without knowing
what it holds (recorder/snapshot.py), and that results.json keeps in its snapshot. Its names are spelled once,
here, so the stage that counts and the results that read cannot drift apart: a plain counter is a constant, a
counter per label (per tier, per source, per transform) is a ``Family``, whose ``of(counters)`` reads it back
as {label: n}. The lifecycle reports a finished request as a typed ``types.RequestOutcome``, which the recorder
turns into these names (``RequestOutcome.counts``).
"""

from __future__ import annotations


class Family(str):
    """Counters sharing a prefix, one per label: ``TOKENS_CACHED_BY_TIER("cpu")`` is "tokens.cached_by_tier.cpu"."""

    __slots__ = ()

    def __call__(self, *labels: str) -> str:
        return ".".join((self, *labels))

    def under(self, label: str) -> Family:
        """The family one level down: ``OPS.under("cpu").of(counters)`` is {op: n} of the cpu tier."""
        return Family(self(label))

    def of(self, counters: dict[str, int]) -> dict[str, int]:
        """{label: n} of this family (a label may hold dots: "<tier>.<op>" of OPS.of)."""
        head = self + "."
        return {k[len(head):]: v for k, v in counters.items() if k.startswith(head)}


# a request's tokens (the per-second series keeps these three too)
TOKENS_PROMPT, TOKENS_CACHED, TOKENS_GENERATED = "tokens.prompt", "tokens.cached", "tokens.generated"
SERIES_TOKENS = (TOKENS_PROMPT, TOKENS_CACHED, TOKENS_GENERATED)
TOKENS_CACHED_BY_TIER = Family("tokens.cached_by_tier")
TOKENS_CACHED_BY_SOURCE = Family("tokens.cached_by_source")
TOKENS_PROMPT_BY_SOURCE = Family("tokens.prompt_by_source")
# the prompt tokens an infinite cache would have served (the run's own ceiling, lifecycle/ceiling.py), and the
# requests it could not judge (past its bound on distinct blocks)
TOKENS_INFINITE, INFINITE_UNTRACKED = "tokens.infinite_cache", "requests.infinite_cache_untracked"

# a request's blocks
BLOCKS_LOOKUP, BLOCKS_HIT, BLOCKS_WRITE_SKIPPED = "blocks.lookup", "blocks.hit", "blocks.write_skipped"
BLOCKS_HIT_BY_SOURCE = Family("blocks.hit_by_source")
# why a new block was not written (blocks.write_skipped is their sum): no room in any tier (every slot holds a
# block a chain needs, or one in flight); its parent left the cache before it was written (evicted, often to make
# room for the chain itself, or dropped); an earlier block of its own request was refused (the chain cut there: no
# lookup could reach the rest); already cached or being written (by another worker)
BLOCKS_WRITE_SKIPPED_BY = Family("blocks.write_skipped_by")
WRITE_SKIPPED_WHY = ("no_room", "parent_gone", "after_cut", "cached")

# requests
REQUESTS_COMPLETED = "requests.completed"
REQUESTS_ISSUED_IN_WINDOW = "requests.issued_in_window"  # the offered load, window only

# a tier's traffic in the window (bytes and blocks per direction, ops per op), and the warm-up's
BYTES, BLOCKS, OPS = Family("bytes"), Family("blocks"), Family("ops")  # BYTES(tier, "read")
WARMUP_OPS, WARMUP_REQUESTS = "warmup.ops", "warmup.requests"
WARMUP_BYTES = Family("warmup.bytes")  # WARMUP_BYTES(tier, "write")

# correctness (whole run, warm-up included)
VERIFIED = "verification.blocks_checked"
VERIFY_FAILED = "verification.failures"
VERIFY_FAILED_IN_WARMUP = "verification.failures_in_warmup"
VERIFY_DISCARDED = "verification.blocks_discarded"

# semantic reuse: donors read per tier, and each transform's metrics (SEMANTIC(transform, metric))
DONOR_MISSING = "semantic.donor_missing"
DONOR_BYTES, DONOR_BLOCKS = Family("semantic.donor_bytes"), Family("semantic.donor_blocks")
SEMANTIC = Family("semantic")

# the rest of the run
HANDOFF_MISSING = "handoff.missing_blocks"      # decode node: a handed-over block not there
HANDOFF_DROPPED_UNREAD = "handoff.dropped_unread"  # prefill node: a block dropped before a decode node read it
SHARED_VANISHED = "shared.vanished"             # shared storage: a block another rank evicted under our read
CASCADE_DROPS = "cache.cascade_drops"           # a chain's descendants dropped with an evicted parent
PROCESS_CPU_US = "process.cpu_us"               # every thread of the process, over the window


PREFIX = "prefix"  # found(PREFIX, ...): whether a request found any of its prompt cached

# Histogram keys: (scope, what, phase). A block operation's is (tier, op, phase), op one of the recorder's ops; these
# spell the others once, as the counters' names are spelled once (the recorder writes them, results and reports
# read them).
ALL = "all"  # the phase of a histogram that has none


def request_hist(what: str) -> tuple[str, str, str]:
    """A request-level latency (recorder.results.REQUEST_LATENCIES: storage, queue, ttft, e2e, ...)."""
    return ("request", what, ALL)


def split_hist(tier: str, op: str, part: str) -> tuple[str, str, str]:
    """A storage operation's device or host part (part: device | host; the MLPerf reference's split)."""
    return (f"split.{tier}", op, part)


def qos_hist(qos: str, what: str) -> tuple[str, str, str]:
    """A QoS class's ttft or e2e."""
    return (f"qos.{qos}", what, ALL)


def semantic_hist(stage: str) -> tuple[str, str, str]:
    """A stage of semantic donor search (recorder.semantic_metrics.STAGES)."""
    return ("semantic", stage, ALL)


# a batch as a whole: a request's hit blocks read, its new blocks written, the demotions that made their room, the
# read blocks promoted into the top tier
BATCH_KINDS = LOAD_BATCH, STORE_BATCH, DEMOTE_BATCH, PROMOTE_BATCH = ("load", "store", "demotions", "promotions")


def depth_hist(tier: str, kind: str) -> tuple[str, str, str]:
    """The blocks of each batch of kind (BATCH_KINDS) on tier: the queue depth one worker asked of it."""
    return ("depth", tier, kind)


IN_FLIGHT_SCALE = 100  # in_flight_hist holds hundredths of an I/O (a histogram holds integers)


def in_flight_hist(tier: str, kind: str) -> tuple[str, str, str]:
    """The I/Os each batch of kind on tier had in flight, on average over its time (Little's law: their time in
    flight summed over the batch's), in 1 / IN_FLIGHT_SCALE: the queue depth the medium was given (a pool of
    threads or a ring may hold fewer than the batch's blocks, a block in layer units more)."""
    return ("in_flight_ios", tier, kind)


def io_op(op: str) -> str:
    """The op of each device I/O of a block operation (read -> read_io): one block may be several I/Os."""
    return f"{op}_io"


def found(label: str, hit: bool) -> str:
    """requests.<label>_hit or requests.<label>_miss: whether a request found its prefix / system / history."""
    return f"requests.{label}_{'hit' if hit else 'miss'}"
