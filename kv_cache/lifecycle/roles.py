"""The disaggregated roles' request paths, a part of ``Lifecycle`` (executor.py): a prefill node publishes a
request's prompt blocks and hands the request over; a decode node loads what was handed over, then appends its
decode blocks to its own tiers."""

from __future__ import annotations

import time
from time import monotonic_ns as now_ns

from kv_cache import counters as C
from kv_cache.lifecycle.plan import KVPlan
from kv_cache.lifecycle.worker import WorkerBuffers
from kv_cache.types import GENERATED, Handoff, Request, RequestOutcome


class HandoffPaths:
    """The prefill node's publish and the decode node's path (a Lifecycle's handoff, cache, recorder, payloads)."""

    def _publish(self, req: Request, plan: KVPlan, bufs: WorkerBuffers) -> int:
        n = plan.num_prompt_blocks
        sizes = [self.object_bytes(t) for t in plan.tokens_per_key]
        spent = self.handoff.publish(plan.keys[:n], sizes[:n], self.payloads.fill, bufs.scratch, self.recorder)
        self.handoff.hand_over(Handoff(f"{req.user_id}.{req.seq}", plan.keys[:n], tuple(sizes[:n]), plan.keys[n:],
                                       tuple(sizes[n:]), req.num_prompt_tokens, req.num_output_tokens,
                                       self.block_tokens, time.time(), self.handoff.digests(plan.keys[:n])))
        return spent

    def _decode_node(self, req: Request, bufs: WorkerBuffers) -> None:
        """Load the blocks a prefill node handed over, then append the decode blocks to our own tiers."""
        h = req.handoff
        out = RequestOutcome(h.prompt_tokens, h.output_tokens, blocks_looked_up=len(h.keys),
                             prompt_tokens_by_source={"handoff": h.prompt_tokens},
                             infinite_cache_tokens=None)  # its blocks come from another node: no ceiling of ours
        storage_ns = loaded = 0
        blocks = list(zip(h.keys, h.nbytes, h.digests or (0,) * len(h.keys)))
        for w in range(0, len(blocks), self.batch or 1):  # batched: a window's blocks in one transfer
            window = blocks[w:w + (self.batch or 1)]
            self._check_stop()
            datas = [bufs.batch_view(j, size) if self.batch else bufs.view(size) for j, (_, size, _) in
                     enumerate(window)]
            start = now_ns()
            got = self.handoff.load_many([(key, data) for (key, _, _), data in zip(window, datas)])
            spent = now_ns() - start
            storage_ns += spent
            if self.batch:
                self.recorder.batch("handoff", C.LOAD_BATCH, "load", start, spent, len(window))
            for (key, size, digest), data, ok in zip(window, datas, got):
                if not ok:
                    self.recorder.count(C.HANDOFF_MISSING, start_ns=start)
                    continue
                self.recorder.op("handoff", "read", "load", start, spent, size, key)
                checked = now_ns()
                self._check(key, data, start, digest or None)
                self.recorder.own(now_ns() - checked)
                loaded += 1
        ttft_ns, own_ttft_ns = now_ns(), self.recorder.own_so_far()
        self.handoff.loaded(h)  # its blocks may go (the NIXL prefill node holds them until now)
        self.recorder.handoff(ttft_ns, int((time.time() - h.done_wall) * 1e9))
        tokens = min(loaded * h.block_tokens, h.prompt_tokens)
        out.blocks_hit, out.cached_tokens = loaded, tokens
        out.cached_tokens_by_tier["handoff"] = out.cached_tokens_by_source["handoff"] = tokens
        n = len(h.keys)
        # the handed-over prompt blocks are not in this node's cache: its decode blocks start a chain here
        plan = KVPlan(h.keys + h.decode_keys, (h.block_tokens,) * (n + len(h.decode_keys)), n,
                      ("handoff",) * n + (GENERATED,) * len(h.decode_keys), ((0, n, False),
                                                                               (n, n + len(h.decode_keys), False)))
        storage_ns += self._write(plan, range(n, len(plan.keys)), bufs, "decode", out)
        self._finish(req, h.output_tokens, storage_ns, out, ttft_ns, own_ttft_ns)
