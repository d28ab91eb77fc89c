"""What a worker thread's request does beside its storage operations, a part of ``Recorder`` (recorder.py): the
generator's own work on its blocks (kept out of its latencies) and the device / host split of its operations.

The state is the calling thread's (``Recorder._request``, a thread-local): a worker runs one request at a time."""

from __future__ import annotations

from kv_cache import counters as C
from kv_cache.recorder.histogram import record


class RequestWork:
    """begin_request, own and the splits of a Recorder (its _request, _second and _shard)."""

    def begin_request(self, intended_ns: int) -> None:
        """The calling thread now works for a request meant to start at intended_ns (for the I/O trace)."""
        self._request.intended_ns = intended_ns
        self._request.own_ns = 0

    def own(self, ns: int) -> None:
        """The generator's own work for the calling thread's request, beside its storage operations: a block's
        payload made and stamped, its checksum taken, a block read verified. An engine does none of it, so it is
        kept out of the request's TTFT and end-to-end latency (the queue wait of the requests behind it keeps it:
        a worker busy with it serves none)."""
        self._request.own_ns = getattr(self._request, "own_ns", 0) + ns

    def own_so_far(self) -> int:
        """The calling thread's request's own work so far (own())."""
        return getattr(self._request, "own_ns", 0)

    def defer_split(self) -> None:
        """This thread's split records wait for end_split: the lifecycle adds the host work around the operation."""
        self._request.splits = []

    def end_split(self, host_extra_ns: int) -> None:
        """Record this thread's deferred splits, each with host_extra_ns more host time: the block's payload made,
        stamped and checksummed around its operation (the reference's host part holds its own serialisation)."""
        pending, self._request.splits = getattr(self._request, "splits", None) or [], None
        self.own(host_extra_ns)
        for tier, op, start_ns, device_ns, host_ns in pending:
            self.split(tier, op, start_ns, device_ns, host_ns + host_extra_ns)

    def split(self, tier: str, op: str, start_ns: int, device_ns: int, host_ns: int) -> None:
        """A storage operation's time in its device calls and the rest (tiers/base.py SPLITS), window only."""
        pending = getattr(self._request, "splits", None)
        if pending is not None:
            pending.append((tier, op, start_ns, device_ns, host_ns))
            return
        if self._second(start_ns) is None:
            return
        shard = self._shard()
        with shard.lock:
            record(shard.hist(C.split_hist(tier, op, "device")), device_ns)
            record(shard.hist(C.split_hist(tier, op, "host")), host_ns)

