"""The recorder: the only place numbers are kept.

Vocabulary: an *op* is one timed block operation, keyed by (tier, op, phase)
- op: read | donor_read (a semantic donor's block) | write | demote | promote | evict
- phase: the request stage that caused it: load (prefix read), prefill,
  decode, or evict (background waterfall moves).
Each thread records into its own *shard* (no shared lock on the hot path);
``snapshot()`` merges shards into one plain Snapshot. Operations that start
before the measurement window (warm-up) are counted apart and kept out of
every statistic.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import numpy as np

from kv_cache import counters as C
from kv_cache.recorder.histogram import (
    SECOND_HIGHEST_US,
    at_ms,
    merged,
    new_histogram,
    new_second_histogram,
    record,
    record_many,
)
from kv_cache.recorder.request_work import RequestWork
from kv_cache.recorder.snapshot import Snapshot, copy_second
from kv_cache.recorder.step import StepMeter
from kv_cache.types import RequestOutcome

# Which byte direction an op moves into the tier it is recorded under.
OP_DIRECTION = {"read": "read", "donor_read": "read", "write": "write", "demote": "write", "promote": "write",
                "evict": None, "wait": None}  # wait: a NIXL prefill node's wait for room in its handoff space


_OP_NAMES: dict[tuple[str, str], tuple[str, str | None, str | None, str | None]] = {}


def _op_names(tier: str, op: str) -> tuple[str, str | None, str | None, str | None]:
    """The counter names of (tier, op): its ops, bytes and blocks in the window, its bytes in the warm-up; made
    once (not f-strings per block operation)."""
    d = OP_DIRECTION[op]
    names = _OP_NAMES[(tier, op)] = (C.OPS(tier, op), *((C.BYTES(tier, d), C.BLOCKS(tier, d), C.WARMUP_BYTES(tier, d))
                                                        if d else (None, None, None)))
    return names


FOLD_AT = 512  # block latencies a thread buffers before folding them into its histograms in one numpy pass


class _Shard:
    """One thread's numbers. Block latencies wait in ``pending`` ((tier, op, phase, second) -> ns) until a fold:
    every FOLD_AT values, and before anyone reads (snapshot, live percentiles): the lock guards only that."""

    __slots__ = ("hists", "counters", "series", "pending", "npending", "lock")

    def __init__(self) -> None:
        self.hists: dict[tuple, object] = {}
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.series: defaultdict[tuple[int, str], int] = defaultdict(int)
        self.pending: dict[tuple, list[int]] = {}
        self.npending = 0
        self.lock = threading.Lock()

    def hist(self, key: tuple):
        h = self.hists.get(key)
        if h is None:
            h = self.hists[key] = new_histogram()
        return h


class Recorder(RequestWork):
    """Thread-safe collection of per-block and per-request measurements."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._shards: list[_Shard] = []
        self._lock = threading.Lock()
        self.measure_start_ns: int | None = None
        self.measure_end_ns: int | None = None
        # Time-series percentiles: one coarse histogram per (second, tier, op), shared under one lock
        # (not per thread: memory stays ~2 KB per second and tier, whatever the number of workers).
        self._second_hists: dict[tuple, object] = {}
        self._gauges: dict[int, dict[str, float]] = {}
        self._second_lock = threading.Lock()
        self.io_trace = None  # an IOTraceWriter, when --io-trace is set
        self.accesses = None  # a capacity.AccessLog, when --capacity-curve is set
        self._step: StepMeter | None = None  # the autoscaler's current step, when one is open
        self._request = threading.local()

    def _shard(self) -> _Shard:
        try:
            return self._local.shard
        except AttributeError:
            shard = self._local.shard = _Shard()
            with self._lock:
                self._shards.append(shard)
            return shard

    # ------------------------------------------------------------------ window

    def start_measuring(self, now_ns: int | None = None) -> None:
        self.measure_start_ns = now_ns or time.monotonic_ns()
        if self.accesses is not None:  # the curve's window: its log folds no requests across it
            self.accesses.cut(self.measure_start_ns)
        self._cpu_start = time.process_time()  # every thread of this process: the generator's own cost

    def stop_measuring(self, now_ns: int | None = None) -> None:
        self.measure_end_ns = now_ns or time.monotonic_ns()
        if self.accesses is not None:
            self.accesses.cut(self.measure_end_ns)
        start = getattr(self, "_cpu_start", None)
        if start is not None:  # a counter, so ranks' CPU time adds up in a merge
            self.count(C.PROCESS_CPU_US, int((time.process_time() - start) * 1e6))

    def _second(self, start_ns: int) -> int | None:
        """Index of the measured second start_ns falls in, or None during warm-up."""
        m = self.measure_start_ns
        if m is None or start_ns < m:
            return None
        return (start_ns - m) // 1_000_000_000

    def in_window(self, start_ns: int) -> bool:
        """Whether an operation that started at start_ns falls in the measurement window (not warm-up)."""
        return self._second(start_ns) is not None

    # ------------------------------------------------------------------ recording

    def op(self, tier: str, op: str, phase: str, start_ns: int, dur_ns: int, nbytes: int, key: int = 0) -> None:
        """One timed block operation on a tier (an eviction, a demotion, a serial read or write): counted as ops()
        counts a batch's, without making its lists (an eviction a written block, once the cache is full)."""
        if self.io_trace is not None:
            self.ops(tier, op, phase, start_ns, [(dur_ns, nbytes, key)])
        else:
            self._count(tier, op, phase, self._second(start_ns), 1, nbytes, (dur_ns,))

    def ops(self, tier: str, op: str, phase: str, start_ns: int, done: list[tuple[int, int, int]]) -> None:
        """Timed block operations on a tier that all started at start_ns (a batch's submission), (ns, bytes, key)
        each: one window decision, one lock and one count for all (a call a block was about 3 us of a batch's)."""
        sec = self._second(start_ns)
        if self.io_trace is not None:  # the trace's "measured" is this very decision, not a later one
            intended = getattr(self._request, "intended_ns", start_ns)
            for dur_ns, nbytes, key in done:
                self.io_trace.op(intended, start_ns, op, tier, nbytes, key, dur_ns, phase, sec is not None)
        self._count(tier, op, phase, sec, len(done), sum(b for _, b, _ in done), [d for d, _, _ in done])

    @property
    def in_order(self) -> bool:
        """Each op must be recorded as it happens (an I/O trace keeps their order): none gathered for ops_each."""
        return self.io_trace is not None

    def ops_each(self, tier: str, op: str, phase: str, done: list[tuple[int, int, int, int]]) -> None:
        """Timed block operations on a tier that each started at its own time, (start ns, ns, bytes, key) each:
        counted as op() counts each one, those of one second of the window together."""
        if self.io_trace is not None:
            for start_ns, dur_ns, nbytes, key in done:
                self.ops(tier, op, phase, start_ns, [(dur_ns, nbytes, key)])
            return
        by_second: dict[int | None, tuple[list[int], list[int]]] = {}
        for start_ns, dur_ns, nbytes, _ in done:
            sec = self._second(start_ns)
            got = by_second.get(sec)
            if got is None:
                got = by_second[sec] = ([], [])
            got[0].append(dur_ns)
            got[1].append(nbytes)
        for sec, (durations, sizes) in by_second.items():
            self._count(tier, op, phase, sec, len(durations), sum(sizes), durations)

    def _count(self, tier: str, op: str, phase: str, sec: int | None, n: int, nbytes: int, durations) -> None:
        """n operations of nbytes in all, their latencies (ns) durations, in second sec of the window (None: the
        warm-up)."""
        shard = self._shard()
        names = _OP_NAMES.get((tier, op)) or _op_names(tier, op)
        if sec is None:
            shard.counters[C.WARMUP_OPS] += n
            if names[3]:  # what the run wrote and read outside the window too (results.bytes_whole_run)
                shard.counters[names[3]] += nbytes
            return
        self._pend(shard, (tier, op, phase, sec), durations)
        shard.counters[names[0]] += n
        if names[1]:
            shard.counters[names[1]] += nbytes
            shard.counters[names[2]] += n
            shard.series[(sec, names[1])] += nbytes
        shard.series[(sec, "ops")] += n

    def _pend(self, shard: _Shard, key: tuple, values: list[int] | tuple[int, ...]) -> None:
        """Latencies (ns) of (tier, op, phase, second) key into shard's buffer; folded when FOLD_AT wait."""
        with shard.lock:  # uncontended but for a reader's fold
            waiting = shard.pending.get(key)
            if waiting is None:
                waiting = shard.pending[key] = []
            waiting.extend(values)
            shard.npending += len(values)
            if shard.npending >= FOLD_AT:
                self._fold(shard)

    def _fold(self, shard: _Shard) -> None:
        """shard.lock held: its pending latencies into its histograms and the per-second read / write ones
        (demotions and promotions write into the tier; evictions and a handoff's wait move no bytes and have
        none, nor have I/O units: a block's latency is its own op's)."""
        pending, shard.pending, shard.npending = shard.pending, {}, 0
        seconds: dict[tuple, list[int]] = {}
        for (tier, op, phase, sec), values in pending.items():
            record_many(shard.hist((tier, op, phase)), values)
            direction = OP_DIRECTION.get(op)  # none for an eviction, a handoff's wait, an I/O unit
            if direction:
                seconds.setdefault((sec, tier, direction), []).extend(values)
        with self._second_lock:
            for key, values in seconds.items():
                h = self._second_hists.get(key)
                if h is None:
                    h = self._second_hists[key] = new_second_histogram()
                record_many(h, np.asarray(values) // 1000, 1, SECOND_HIGHEST_US)

    def _fold_all(self) -> list[_Shard]:
        with self._lock:
            shards = list(self._shards)
        for shard in shards:
            with shard.lock:
                self._fold(shard)
        return shards

    def io_units(self, tier: str, op: str, phase: str, start_ns: int, times: list[tuple[int, int]]) -> None:
        """The I/Os one block operation was cut into (--io-unit layer): their latencies as <op>_io; their
        bytes are the block's, already counted by op()."""
        sec = self._second(start_ns)
        if sec is not None:  # buffered as block latencies are: a numpy pass a block was ~20 us (issue 48)
            self._pend(self._shard(), (tier, C.io_op(op), phase, sec), [ns for ns, _nbytes in times])

    def batch(self, tier: str, kind: str, phase: str, start_ns: int, dur_ns: int, blocks: int,
              in_flight_ns: int | None = None) -> None:
        """One batch of blocks on a tier as a whole (kind: load or store): its time from submission to its last
        completion, as op <kind> beside the blocks' own, how many blocks it held (the depth it asked for) and, where
        the tier's engine timed its I/Os (in_flight_ns: their time in flight, summed), the depth the medium was
        given: that time over the batch's (Little's law), in hundredths."""
        if self._second(start_ns) is None:
            return
        shard = self._shard()
        dur_ns = max(dur_ns, 1)
        record(shard.hist((tier, kind, phase)), dur_ns)
        record(shard.hist(C.depth_hist(tier, kind)), blocks)
        if in_flight_ns is not None:
            record(shard.hist(C.in_flight_hist(tier, kind)), round(C.IN_FLIGHT_SCALE * in_flight_ns / dur_ns))

    def add_bytes(self, tier: str, direction: str, start_ns: int, nbytes: int) -> None:
        """One block's bytes moved as part of another op (the source side of a demotion): its bytes and the block
        count toward the tier's GB/s and IOPS, as the op's own do."""
        sec = self._second(start_ns)
        if sec is None:
            return
        shard = self._shard()
        shard.counters[C.BYTES(tier, direction)] += nbytes
        shard.counters[C.BLOCKS(tier, direction)] += 1
        shard.series[(sec, C.BYTES(tier, direction))] += nbytes

    def handoff(self, done_ns: int, latency_ns: int) -> None:
        """Decode node: prefill-complete -> decode-loaded of one request (wall clocks of both nodes)."""
        if self._second(done_ns) is not None:
            record(self._shard().hist(C.request_hist("handoff")), max(latency_ns, 1))

    def turn_wait(self, due_ns: int, wait_ns: int) -> None:
        """Open loop: how long a session's turn was held after its arrival for the previous turn's answer."""
        if self._second(due_ns) is not None:
            record(self._shard().hist(C.request_hist("turn_wait")), max(wait_ns, 1))

    def lookup(self, stage: str, start_ns: int, dur_ns: int) -> None:
        """One step of a semantic donor lookup (embed, search, align): CPU time, not block I/O."""
        if self._second(start_ns) is not None:
            record(self._shard().hist(C.semantic_hist(stage)), max(dur_ns, 1))

    def open_step(self, now_ns: int) -> None:
        """Start collecting the requests that complete from now on (one autoscaler step)."""
        self._step = StepMeter(now_ns)

    def close_step(self, now_ns: int) -> StepMeter:
        step, self._step = self._step, None
        step.end_ns = now_ns
        return step

    def recent_percentile(self, tier: str, op: str, pct: float) -> float | None:
        """pct of the last complete second's (tier, op) latencies in ms, or None (live progress)."""
        sec = self._second(time.monotonic_ns())
        self._fold_all()
        with self._second_lock:
            return at_ms(self._second_hists.get((sec - 1, tier, op)) if sec else None, pct, 1e3)

    def gauge(self, values: dict[str, float], now_ns: int) -> None:
        """Levels sampled at now_ns (queue depth, occupancy, ...): the last sample of a second wins."""
        sec = self._second(now_ns)
        if sec is not None:
            with self._second_lock:
                self._gauges.setdefault(sec, {}).update(values)

    def count(self, name: str, n: int = 1, start_ns: int | None = None) -> None:
        """A plain counter; with start_ns, only inside the measurement window."""
        if start_ns is not None and self._second(start_ns) is None:
            return
        self._shard().counters[name] += n

    def request(self, intended_ns: int, dequeued_ns: int, done_ns: int, storage_ns: int,
                outcome: RequestOutcome, ttft_ns: int | None = None, qos: str = "", generation_ns: int = 0,
                own_ttft_ns: int = 0, own_ns: int = 0) -> None:
        """One finished request: its latencies (from the intended start) and what it did (kept as counters).

        ttft_ns: when its storage part of time-to-first-token ended (prefix loaded, prefill
        written); qos: its class; own_ttft_ns, own_ns: the generator's own work for it (own()) before
        ttft_ns and in all, kept out of its TTFT and end-to-end latency. A request counts when it
        completes inside the window, whenever it was issued: under overload the requests finishing in
        the window were issued long before it, and their queueing is exactly what must be seen.
        """
        shard = self._shard()
        ttft = (ttft_ns - own_ttft_ns if ttft_ns else done_ns - own_ns) - intended_ns
        e2e = done_ns - own_ns - intended_ns
        step = self._step
        if step is not None and done_ns >= step.start_ns:
            step.add(qos, ttft, e2e, outcome)
        sec = self._second(done_ns)
        if sec is None:
            shard.counters[C.WARMUP_REQUESTS] += 1
            return
        record(shard.hist(C.request_hist("storage")), storage_ns)
        record(shard.hist(C.request_hist("queue")), dequeued_ns - intended_ns)
        record(shard.hist(C.request_hist("e2e")), e2e)
        record(shard.hist(C.request_hist("ttft")), ttft)
        if generation_ns:  # modelled decode time (--generation-ms-per-token), as slept
            record(shard.hist(C.request_hist("generation")), generation_ns)
        if qos:
            record(shard.hist(C.qos_hist(qos, "ttft")), ttft)
            record(shard.hist(C.qos_hist(qos, "e2e")), e2e)
        shard.counters[C.REQUESTS_COMPLETED] += 1
        shard.series[(sec, "requests")] += 1
        for name, n in outcome.counts():
            shard.counters[name] += n
        for name, n in zip(C.SERIES_TOKENS, (outcome.prompt_tokens, outcome.cached_tokens, outcome.generated_tokens)):
            if n:
                shard.series[(sec, name)] += n

    # ------------------------------------------------------------------ reading

    def counters(self) -> dict[str, int]:
        """Counters summed over shards, without merging histograms (cheap, for progress lines)."""
        with self._lock:
            shards = list(self._shards)
        out: defaultdict[str, int] = defaultdict(int)
        for shard in shards:
            for k, v in list(shard.counters.items()):
                out[k] += v
        return dict(out)

    def snapshot(self, final: bool = False) -> Snapshot:
        """The statistics so far, copied. final: the run's end, where the per-second histograms are handed over
        instead (the recorder starts a new time series): a copy would double the largest part of a long run's
        memory (memory budget: timeseries_bytes)."""
        shards = self._fold_all()
        hists: dict[tuple, list] = defaultdict(list)
        counters: defaultdict[str, int] = defaultdict(int)
        series: dict[int, dict[str, int]] = defaultdict(dict)
        for shard in shards:
            for k, h in list(shard.hists.items()):
                hists[k].append(h)
            for k, v in list(shard.counters.items()):
                counters[k] += v
            for (sec, name), v in list(shard.series.items()):
                series[sec][name] = series[sec].get(name, 0) + v
        end = self.measure_end_ns or time.monotonic_ns()
        with self._second_lock:
            if final:
                seconds, self._second_hists = self._second_hists, {}
            else:
                seconds = {k: copy_second(h) for k, h in self._second_hists.items()}
            gauges = {s: dict(v) for s, v in self._gauges.items()}
        return Snapshot({k: merged(v) for k, v in hists.items()}, dict(counters), dict(series),
                        self.measure_start_ns or 0, end, seconds, gauges)

