"""Request lifecycle: execute a KVPlan (see plan.py) as timed block I/O through the cache.

- load: the plan's cached prompt blocks (the longest prefix, plus independent
  RAG chunks), read block by block: each read timed, its stamps verified,
  then promoted to the top tier if due;
- prefill: the prompt's other full blocks, written;
- decode: the blocks that generated tokens fill, written as they fill;
- then optional simulated generation time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from time import monotonic_ns as now_ns

import numpy as np
import xxhash

from kv_cache import counters as C
from kv_cache.errors import Abandoned, BlockVanished
from kv_cache.lifecycle.batched import BatchedPaths
from kv_cache.lifecycle.by_source import add_to, count_hits_by_source, source_tokens, span_ranges
from kv_cache.lifecycle.ceiling import Ceiling
from kv_cache.lifecycle.handoff import Loader, Publisher
from kv_cache.lifecycle.payload import block_digest
from kv_cache.lifecycle.plan import KVPlan, Planner
from kv_cache.lifecycle.roles import HandoffPaths
from kv_cache.lifecycle.worker import PartsCheck, WorkerBuffers
from kv_cache.model import slot_bytes
from kv_cache.types import Request, RequestOutcome, StopAfter


@dataclass(frozen=True)
class LifecycleOptions:
    """How requests become block I/O: the block geometry, the hash chain's root, verification, reuse."""

    block_tokens: int                     # 0: whole-request objects
    bytes_per_token: int
    root: bytes                           # chain root: model, dtype and TP name the blocks
    verify: str = "checksum"              # off | stamps | checksum | full
    fake_io: bool = False                 # every tier is the null tier: no payload is built or checked
    generation_ms_per_token: float = 0.0  # modelled decode time (0: none)
    rag_chunk: bool = False               # RAG documents cached chunk by chunk (position-free)
    decode: bool = True                   # write the generated tokens' blocks too (off: a prefill-only node)
    batch: int = 0                        # blocks in flight together (--request-io batched); 0: one at a time


class Lifecycle(BatchedPaths, HandoffPaths):
    """Turns requests into plans and executes them."""

    def __init__(self, cache, payloads, recorder, options: LifecycleOptions, *,
                 handoff: Publisher | Loader | None = None, semantic=None):
        o = options
        self.cache, self.payloads, self.recorder = cache, payloads, recorder
        self.block_tokens, self.bytes_per_token = o.block_tokens, o.bytes_per_token
        self.planner = Planner(o.block_tokens, o.root, o.rag_chunk, o.decode)
        self.verify = "off" if o.fake_io else o.verify
        self.fake_io = o.fake_io
        self.batch = o.batch  # blocks in flight together (batched.py); 0: one at a time
        self.gen_s_per_token = o.generation_ms_per_token / 1000.0
        self.handoff = handoff  # a Publisher (a prefill node publishes into it) or a Loader (a decode node loads)
        self.semantic = semantic  # a SemanticReuse: donor discovery, when --semantic is on
        self.ceiling = Ceiling()  # the run's own infinite-cache hit rate (ceiling.py)
        self.stop_after = StopAfter()  # the scheduler's drain deadline: past it a request stops between blocks
        if handoff is not None and handoff.role == "prefill":  # waiting for room in the handoff space stops then too
            handoff.stopping = self.stop_after.due

    def object_bytes(self, tokens: int) -> int:
        return slot_bytes(tokens * self.bytes_per_token)

    def plan(self, req: Request) -> KVPlan:
        return self.planner.plan(req)

    # ------------------------------------------------------------------ execution

    def execute(self, req: Request, bufs: WorkerBuffers) -> None:
        """Load the cached prefix, write prefill and decode blocks, then simulate generation."""
        self.recorder.begin_request(req.intended_ns)
        if req.handoff is not None:
            return self._decode_node(req, bufs)
        plan = self.plan(req)
        out = RequestOutcome(req.num_prompt_tokens, req.num_output_tokens)
        out.infinite_cache_tokens = self.ceiling.tokens(req, plan)
        for end, start, label in span_ranges(req.spans):
            add_to(out.prompt_tokens_by_source, label, end - start)
        looked_ns = now_ns()  # the capacity curve orders requests by their lookups, not their completions
        storage_ns, hit = self._load(req, plan, bufs, out)
        donors, loaded = None, set()
        if self.semantic is not None:
            donors = self.semantic.find(req, plan.num_prompt_blocks, hit)
            spent, loaded = self._donor_load(donors.reads, bufs, out)
            storage_ns += spent
        # Whole-request mode never rewrites a missed history object; it writes its one
        # object (prompt + answer) in the prefill phase.
        whole = self.block_tokens == 0
        decode_phase = "prefill" if whole else "decode"
        prefill = [] if whole else [i for i in range(plan.num_prompt_blocks) if i not in hit and i not in loaded]
        storage_ns += self._write(plan, prefill, bufs, "prefill", out)
        if self.handoff is not None:  # a prefill node: hand the prompt's KV to the decode nodes
            storage_ns += self._publish(req, plan, bufs)
        ttft_ns = now_ns()  # the storage part of time-to-first-token ends here
        own_ttft_ns = self.recorder.own_so_far()  # the generator's own work until then: not the storage's
        if self.handoff is None:
            storage_ns += self._write(plan, range(plan.num_prompt_blocks, len(plan.keys)), bufs, decode_phase, out)
        if donors is not None:
            self.semantic.finish(req, plan, donors, hit, loaded, out)
        self._finish(req, req.num_output_tokens, storage_ns, out, ttft_ns, own_ttft_ns)
        if self.recorder.accesses is not None and plan.chained:  # the capacity curve's input: what the cache saw
            self._log_accesses(req, plan, whole, looked_ns)

    def _finish(self, req: Request, output_tokens: int, storage_ns: int, out: RequestOutcome, ttft_ns: int,
                own_ttft_ns: int) -> None:
        """Modelled generation time (if any), then the request's record (its own work kept out of its latencies:
        Recorder.own)."""
        generation_ns = 0
        if self.gen_s_per_token:  # the sleep is timed: what the run really waited, not what was asked
            start = now_ns()
            end = start + int(output_tokens * self.gen_s_per_token * 1e9)
            while (left := end - now_ns()) > 0:  # in steps: a run's drain deadline can end it
                self._check_stop()
                time.sleep(min(left / 1e9, 0.05))
            generation_ns = now_ns() - start
        self.recorder.request(req.intended_ns, req.dequeued_ns, now_ns(), storage_ns, out, ttft_ns, req.qos,
                              generation_ns, own_ttft_ns, self.recorder.own_so_far())

    def _log_accesses(self, req: Request, plan: KVPlan, whole: bool, looked_ns: int) -> None:
        n = plan.num_prompt_blocks
        prompt = [(plan.keys[i], source_tokens(plan.cached_by_source(req, i)), plan.parent(i) or 0, plan.labels[i])
                  for i in range(n)]
        decode = [] if self.handoff is not None or whole else [(plan.keys[i], plan.parent(i) or 0, plan.labels[i])
                                                                for i in range(n, len(plan.keys))]
        self.recorder.accesses.request(prompt, plan.groups, decode, req.num_prompt_tokens, now_ns(), looked_ns,
                                       (req.intended_ns, req.dequeued_ns))

    def _pin(self, plan: KVPlan) -> list[tuple[int, object]]:
        """Pin the plan's cached prompt blocks group by group (see KVPlan.lookup); (index, entry) pairs."""
        pinned: list[tuple[int, object]] = []
        for first, end, independent in plan.groups:
            if independent:
                for i in range(first, end):
                    pinned += [(i, e) for e in self.cache.pin_prefix(plan.keys[i:i + 1])]
            else:
                pinned += list(enumerate(self.cache.pin_prefix(plan.keys[first:end]), first))
        return pinned

    def _check_stop(self) -> None:
        """Past the run's drain deadline a request stops here, between two block operations (counted)."""
        if self.stop_after.due():
            raise Abandoned

    def _read(self, e, bufs: WorkerBuffers, op: str) -> tuple[int, int, bool] | None:
        """Read one pinned block (timed), verify it, unpin it (promoting if due): (storage ns, tier, intact).

        None when another rank evicted it from shared storage first: it is a miss now. A block that
        reads back wrong (intact False) is discarded from the cache: the engine would recompute it.
        """
        parted = self.cache.parts.many(e.nbytes)
        data = bufs.view(self.cache.parts.part_bytes if parted else e.nbytes)
        checked = self.cache.verifiable[e.tier] and self.verify != "off"
        parts = PartsCheck(self.payloads, e.key, self.verify, e.digest, e.nbytes) if parted and checked else None
        self.recorder.defer_split()  # its host part: the read and its check (the reference's: the read and its copy)
        host = 0
        start = now_ns()
        try:
            try:
                tier = self.cache.read(e, data, "load", op, parts)
            except BlockVanished:
                self.cache.forget_vanished(e)
                self.recorder.count(C.SHARED_VANISHED, start_ns=start)
                return None
            read_at = now_ns()
            spent = read_at - start
            verdict = self._verdict(parts.intact(), start) if parts is not None else None
            release_ns, intact = self._judge(e, data, tier, bufs, verdict)
            if intact and not parted and self._bytes_checked(tier):
                bufs.verified(None, data)
            host = now_ns() - read_at - release_ns + (parts.ns if parts is not None else 0)
        finally:
            self.recorder.end_split(host)
        return spent + release_ns, tier, intact

    def _load(self, req: Request, plan: KVPlan, bufs: WorkerBuffers, out: RequestOutcome) -> tuple[int, set[int]]:
        """Read the cached prompt blocks; return (storage ns, indices of the blocks that hit)."""
        hits = self._pin(plan)
        out.blocks_looked_up = plan.num_prompt_blocks
        entries = [e for _, e in hits]
        read = self._read_hits_batched if self.batch else self._read_hits
        storage_ns, tiers, n = read(entries, bufs)  # the tier each hit was read from; how many hit
        hits = hits[:n]
        out.blocks_hit = len(hits)
        hit = [i for i, _ in hits]
        count_hits_by_source(plan, hit, out)
        per_block, by_source = plan.hit_tokens(req, hit)
        for t, tokens in zip(tiers, per_block):
            add_to(out.cached_tokens_by_tier, self.cache.names[t], tokens)
        for label, tokens in by_source.items():
            out.cached_tokens += tokens
            add_to(out.cached_tokens_by_source, label, tokens)
        return storage_ns, {i for i, _ in hits}

    def _read_hits(self, entries: list, bufs: WorkerBuffers) -> tuple[int, list[int], int]:
        """Read pinned entries (chain order) one at a time: (storage ns, the tier of each that hit, how many)."""
        storage_ns, tiers = 0, []
        for n, e in enumerate(entries):
            try:
                self._check_stop()
                got = self._read(e, bufs, "read")
            except BaseException:
                self.cache.unpin(entries[n + 1:])
                raise
            if got is None or not got[2]:  # the rest of the prefix is a miss (recomputed, rewritten)
                self.cache.unpin(entries[n + 1:])
                return storage_ns + (got[0] if got else 0), tiers, n
            storage_ns += got[0]
            tiers.append(got[1])
        return storage_ns, tiers, len(entries)

    def _donor_load(self, reads: dict[int, tuple[int, ...]], bufs: WorkerBuffers,
                    out: RequestOutcome) -> tuple[int, set]:
        """Read the donor blocks a donor plan names (op donor_read; batched: a window of them together); the
        recipient blocks now loaded."""
        storage_ns, got = 0, set()
        keys = list(dict.fromkeys(k for keys in reads.values() for k in keys))
        step = self.batch or 1
        for w in range(0, len(keys), step):
            pinned = [p[0] for p in (self.cache.pin_prefix([k]) for k in keys[w:w + step]) if p]
            out.donor_blocks_missing += len(keys[w:w + step]) - len(pinned)  # evicted since the donor was served
            spent, tiers = self._read_donors(pinned, bufs)
            storage_ns += spent
            for e, t in zip(pinned, tiers):
                if t is None:  # vanished or corrupt: recomputed
                    out.donor_blocks_missing += 1
                    continue
                got.add(e.key)
                add_to(out.donor_bytes_by_tier, self.cache.names[t], e.nbytes)
                add_to(out.donor_blocks_by_tier, self.cache.names[t], 1)
        return storage_ns, {r for r, keys in reads.items() if all(k in got for k in keys)}

    def _read_donors(self, pinned: list, bufs: WorkerBuffers) -> tuple[int, list]:
        """Read pinned donor blocks, each on its own (a miss ends nothing): (storage ns, per block its tier or
        None)."""
        if self.batch:
            return self._read_window(pinned, bufs, "donor_read", to_first_miss=False)
        storage_ns, tiers = 0, []
        for e in pinned:
            read = self._read(e, bufs, "donor_read")
            storage_ns += read[0] if read else 0
            tiers.append(read[1] if read and read[2] else None)
        return storage_ns, tiers

    def _check(self, key: int, data: np.ndarray, start_ns: int, digest: int | None = None) -> bool:
        """Verify a block read back; False when it is not what was written.

        NOTE: counted in warm-up too: correctness is not a statistic, a wrong block is never dropped.
        """
        if self.verify == "off":
            return True
        return self._verdict(self.payloads.check(key, data, self.verify, digest), start_ns)

    def _verdict(self, ok: bool, start_ns: int) -> bool:
        """Count a block checked, and a failure (in warm-up too) when it is not what was written."""
        self.recorder.count(C.VERIFIED)
        if ok:
            return True
        self.recorder.count(C.VERIFY_FAILED)
        if not self.recorder.in_window(start_ns):
            self.recorder.count(C.VERIFY_FAILED_IN_WARMUP)
        return False

    def _write(self, plan: KVPlan, indices, bufs: WorkerBuffers, phase: str, out: RequestOutcome) -> int:
        if self.batch:
            return self._write_batched(plan, indices, bufs, phase, out)
        storage_ns = 0
        for i in indices:
            self._check_stop()
            key = plan.keys[i]
            nbytes = self.object_bytes(plan.tokens_per_key[i])
            why: list[str] = []
            res = self.cache.reserve_write(key, nbytes, plan.labels[i], plan.parent(i), why)
            if res is None:
                out.refused(key, plan.parent(i), why[0])
                continue
            if self.cache.parts.many(nbytes):  # made part by part in the worker's buffer, hashed as it goes
                storage_ns += self._write_parts(res, key, nbytes, bufs, phase)
                continue
            made = now_ns()
            data, held = (bufs.view(nbytes), None) if self.fake_io else bufs.lend(self.payloads, key, nbytes)
            host = now_ns() - made  # the payload made and stamped: the split's host part, with its checksum
            self.recorder.defer_split()
            try:
                start = now_ns()
                self.cache.commit_write(res, data, phase, bufs.scratch)
                storage_ns += now_ns() - start
                if self.verify == "checksum":  # kept in the index: every later read of the block is checked
                    # NOTE: taken after the write, whose copy has just pulled the bytes into the shared cache
                    # (before it, from the cold pool, it cost ~2x: issue 16). A reader that meets the block
                    # before this line has no checksum to use: it compares every byte, a check as strict.
                    hashed = now_ns()
                    res.entry.digest = block_digest(data)
                    host += now_ns() - hashed
            finally:
                self.recorder.end_split(host)
                if held:
                    self.payloads.give_back(held)
        return storage_ns


    def _write_parts(self, res, key: int, nbytes: int, bufs: WorkerBuffers, phase: str) -> int:
        """Write an object larger than one I/O as parts (parts.py): each made into the worker's buffer untimed,
        its checksum taken incrementally (the same XXH3-64 as the whole object's)."""
        digest = xxhash.xxh3_64() if self.verify == "checksum" else None
        host = [0]  # each part made, stamped and hashed: the split's host part

        def produce(offset: int, out: np.ndarray) -> np.ndarray:
            made = now_ns()
            if not self.fake_io:
                self.payloads.fill(key, out, offset, whole=nbytes)
                if digest is not None:
                    digest.update(out)
            host[0] += now_ns() - made
            return out

        self.recorder.defer_split()
        start = now_ns()
        try:
            self.cache.commit_write(res, bufs.view(self.cache.parts.part_bytes), phase, bufs.scratch, produce)
        finally:
            self.recorder.end_split(host[0])
        spent = now_ns() - start
        if digest is not None:
            res.entry.digest = digest.intdigest()
        return spent
