"""The request lifecycle on real tiers: history hits, decode appends, verification, whole-request mode."""

import json
import os
from dataclasses import replace

import numpy as np
import pytest
from found import ENGINES, REGISTRY

from kv_cache import counters as C
from kv_cache.cache.cache import BlockCache
from kv_cache.cache.hashing import chain_root
from kv_cache.cache.policies.lru import LRUPolicy
from kv_cache.lifecycle import batched, executor, roles
from kv_cache.lifecycle.executor import Lifecycle, LifecycleOptions
from kv_cache.lifecycle.handoff import space
from kv_cache.lifecycle.handoff.folder import FolderLoader, FolderPublisher
from kv_cache.lifecycle.payload import PAGE, PayloadPool, block_digest
from kv_cache.lifecycle.worker import WorkerBuffers
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.cpu import CpuTier
from kv_cache.tiers.nvme import NvmeTier
from kv_cache.types import HISTORY, SYSTEM, USER, Handoff, Request

BT, BPT = 16, 4096  # 16-token blocks of 64 KiB
SHARED = REGISTRY.media.shared_files  # a file-per-block tier other processes read by name
BLOCK = BT * BPT


@pytest.fixture
def rig(tmp_path):
    rec = Recorder()
    rec.start_measuring(1)
    (tmp_path / "d").mkdir()
    tiers = [CpuTier(4 * BLOCK, BLOCK), NvmeTier(str(tmp_path / "d"), 64 * BLOCK, BLOCK, ENGINES["buffered"])]
    cache = BlockCache(tiers, LRUPolicy, True, rec)
    pool = PayloadPool(seed=1, span_bytes=1 << 20)

    def life(block_tokens=BT):
        return Lifecycle(cache, pool, rec, LifecycleOptions(block_tokens, BPT, chain_root("test"), "full"))

    yield life, cache, rec, WorkerBuffers(64 * BLOCK, False)
    for t in tiers:
        t.close()


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 1000, n, dtype=np.int32)


def request(prompt, output, spans, seq=1):
    return Request(0, seq, 1, prompt, output, spans)


def test_second_turn_reads_the_first_turns_blocks(rig):
    life, cache, rec, bufs = rig
    lc = life()
    p1, o1 = tokens(40, 1), tokens(30, 2)  # 70 tokens -> blocks 0,1 prefill (32 tok), 2,3 decode (64)
    lc.execute(request(p1, o1, ((40, USER),)), bufs)
    c = rec.counters()
    assert c["blocks.lookup"] == 2 and c.get("blocks.hit", 0) == 0
    assert c["ops.cpu.write"] + c.get("ops.nvme.write", 0) == 4
    p2 = np.concatenate([p1, o1, tokens(20, 3)])  # 90 tokens: 5 full prompt blocks, 4 already cached
    lc.execute(request(p2, tokens(10, 4), ((70, HISTORY), (90, USER)), seq=2), bufs)
    c = rec.counters()
    assert c["blocks.hit"] == 4
    assert c["tokens.cached"] == 64
    assert c["tokens.cached_by_source.history"] == 64
    assert c["verification.blocks_checked"] == 4 and "verification.failures" not in c


def _own_work_clock(monkeypatch) -> tuple[list[int], object]:
    """The clock the lifecycle (and the handoff space) reads, standing still but for the work slow(work) wraps, a
    second a call; a block's verification is wrapped already. (the clock, slow)"""
    clock = [10]
    for module in (executor, batched, roles, space):
        monkeypatch.setattr(module, "now_ns", lambda: clock[0])

    def slow(work):
        def run(*args, **kwargs):
            clock[0] += 10**9
            return work(*args, **kwargs)
        return run

    monkeypatch.setattr(Lifecycle, "_check", slow(Lifecycle._check))
    return clock, slow


@pytest.mark.parametrize("batch", [0, 4])
@pytest.mark.parametrize("verify", ["full", "checksum"])
def test_the_generators_own_payload_work_is_kept_out_of_a_requests_latencies(rig, monkeypatch, verify, batch):
    """A block's payload made and stamped, its checksum taken, a block read verified: the benchmark's work, which
    an engine does not do. Each takes a second here on the clock the lifecycle reads, the storage none: no second of
    it is in a request's storage part of TTFT or its end-to-end latency (on the default checksum a request's TTFT held
    its blocks' hashing: 791 ms against 527 of storage for llama70b at one user, 1,376 with --verify full)."""
    _life, cache, rec, _bufs = rig
    clock, slow = _own_work_clock(monkeypatch)
    monkeypatch.setattr(WorkerBuffers, "lend", slow(WorkerBuffers.lend))
    monkeypatch.setattr(WorkerBuffers, "lend_many", slow(WorkerBuffers.lend_many))
    for module in (executor, batched):
        monkeypatch.setattr(module, "block_digest", slow(module.block_digest))
    lc = Lifecycle(cache, PayloadPool(seed=1, span_bytes=1 << 20), rec,
                   LifecycleOptions(BT, BPT, chain_root("test"), verify, batch=batch))
    bufs = WorkerBuffers(BLOCK, False, batch=batch)
    p1, o1 = tokens(40, 1), tokens(30, 2)
    for req in (request(p1, o1, ((40, USER),)),
                request(np.concatenate([p1, o1, tokens(20, 3)]), tokens(10, 4), ((70, HISTORY), (90, USER)), seq=2)):
        lc.execute(replace(req, intended_ns=clock[0], dequeued_ns=clock[0]), bufs)  # each due as it starts
    c = rec.counters()
    assert c["blocks.hit"] == 4 and c["verification.blocks_checked"] == 4 and clock[0] > 8 * 10**9
    hists = rec.snapshot().hists
    for latency in ("ttft", "e2e"):
        assert hists[C.request_hist(latency)].get_max_value() < 10**9, latency


def test_a_corrupted_block_is_counted_as_a_failure(rig):
    life, cache, rec, bufs = rig
    lc = life()
    p = tokens(32, 5)
    lc.execute(request(p, tokens(1, 6), ((32, SYSTEM),)), bufs)
    e = next(iter(cache.index.values()))
    slot = cache.tiers[0].slots.lookup(e.key)[0][0]
    cache.tiers[0].arena[slot * BLOCK + 777] ^= 0xFF  # a flipped byte in RAM
    lc.execute(request(p, tokens(1, 7), ((32, SYSTEM),), seq=2), bufs)
    assert rec.counters()["verification.failures"] == 1


def test_whole_request_mode_stores_one_object_and_reloads_history(rig):
    life, cache, rec, bufs = rig
    lc = life(block_tokens=0)
    p1, o1 = tokens(40, 1), tokens(30, 2)
    lc.execute(request(p1, o1, ((40, USER),)), bufs)
    assert len(cache.index) == 1
    (e,) = cache.index.values()
    assert e.nbytes == 70 * BPT
    p2 = np.concatenate([p1, o1, tokens(20, 3)])
    lc.execute(request(p2, tokens(10, 4), ((70, HISTORY), (90, USER)), seq=2), bufs)
    c = rec.counters()
    assert c["blocks.hit"] == 1 and c["tokens.cached"] == 70
    assert len(cache.index) == 2


def test_hit_tokens_by_source_split_blocks_that_straddle_two_spans():
    """A block half system prompt, half history credits each source its own tokens: no source's
    theoretical hit rate can exceed 100 % (history showed 100.4 % when a block went wholly to its last
    token's source)."""
    from kv_cache.lifecycle.analysis import analyse
    from kv_cache.lifecycle.plan import Planner

    prompt = np.arange(64, dtype=np.int32)
    spans = ((24, SYSTEM), (56, HISTORY), (64, USER))  # blocks of 16: [0,16) [16,32) [32,48) [48,64)
    reqs = [Request(0, k, 1, prompt, np.zeros(0, np.int32), spans) for k in (1, 2)]  # the second hits all

    class Plans:
        block_tokens = BT
        plan = Planner(BT, chain_root("t")).plan

    out = analyse(iter(reqs), Plans())
    by = out["theoretical_hit_rate"]["by_source"]
    assert by == {SYSTEM: 0.5, HISTORY: 0.5, USER: 0.5}, by
    assert out["counts"]["cached_by_source"] == {SYSTEM: 24, HISTORY: 32, USER: 8}


def test_hit_accounting_in_one_pass_equals_block_by_block():
    """hit_tokens' one-pass split of a hit prefix over the sources (the hot path, in every request and in the
    pre-run analysis) gives each block's tokens and the by-source totals that adding every block's own split
    gives; a prefix that is not [0, k) or spans that stop short of the prompt take the block-by-block path.
    Random prompts, spans and hit counts."""
    from collections import Counter

    from kv_cache.lifecycle.plan import Planner

    rng = np.random.default_rng(11)
    for _ in range(200):
        bt = int(rng.integers(1, 40))
        n = int(rng.integers(bt, 600))
        cuts = sorted(set(int(c) for c in rng.integers(1, n, int(rng.integers(0, 4)))))
        ends = cuts + [n] if rng.random() < 0.9 else cuts + [n - 1] if n - 1 > (cuts[-1] if cuts else 0) else [n]
        labels = [SYSTEM, HISTORY, USER, "rag"]
        spans = tuple((e, labels[j % 4]) for j, e in enumerate(ends))
        req = Request(1, 0, 0, np.arange(n, dtype=np.int32), np.arange(5, dtype=np.int32), spans)
        plan = Planner(bt, chain_root("t")).plan(req)
        k = int(rng.integers(0, plan.num_prompt_blocks + 1))
        hits = list(range(k)) if rng.random() < 0.8 else sorted(rng.choice(plan.num_prompt_blocks, k, replace=False))
        hits = [int(i) for i in hits]
        by_source = Counter()
        expected_blocks = []
        for i in hits:
            parts = plan.cached_by_source(req, i)
            expected_blocks.append(sum(t for _, t in parts))
            for label, tokens in parts:
                by_source[label] += tokens
        got_blocks, got_source = plan.hit_tokens(req, hits)
        assert got_blocks == expected_blocks, (bt, n, spans, hits)
        assert +Counter(got_source) == +by_source, (bt, n, spans, hits)


def test_checksum_mode_keeps_each_written_blocks_checksum_and_catches_a_change(rig):
    """--verify checksum: the writer records the XXH3-64 of the bytes it wrote (taken after the write), so reads
    check it instead of comparing every byte, and a changed byte is still caught."""
    _, cache, rec, bufs = rig
    pool = PayloadPool(seed=1, span_bytes=1 << 20)
    lc = Lifecycle(cache, pool, rec, LifecycleOptions(BT, BPT, chain_root("test"), "checksum"))
    lc.execute(request(tokens(64, 5), tokens(1, 6), ((64, USER),)), bufs)
    entries = list(cache.index.values())
    assert len(entries) == 4
    for e in entries:
        expected = np.empty(e.nbytes, np.uint8)
        pool.fill(e.key, expected)
        assert e.digest == block_digest(expected)
    victim = entries[0]
    cache.tiers[victim.tier].held_view(victim.key)[PAGE + 100] ^= 1  # its bytes changed since the write
    lc.execute(request(tokens(64, 5), tokens(1, 7), ((64, USER),), seq=2), bufs)
    assert rec.counters()["verification.failures"] == 1


def test_whole_request_mode_credits_each_source_its_own_tokens_and_counts_the_reference_hits(rig):
    """The history object is the prompt's prefix: its system-prompt tokens are credited to the system prompt
    (history's hit rate read 106 % when the whole object went to history); the MLPerf hit counters count it."""
    life, cache, rec, bufs = rig
    lc = life(block_tokens=0)
    p1, o1 = tokens(40, 1), tokens(30, 2)
    lc.execute(request(p1, o1, ((10, SYSTEM), (40, USER))), bufs)
    p2 = np.concatenate([p1, o1, tokens(20, 3)])
    lc.execute(request(p2, tokens(10, 4), ((10, SYSTEM), (70, HISTORY), (90, USER)), seq=2), bufs)
    c = rec.counters()
    assert c["tokens.cached_by_source.system"] == 10 and c["tokens.cached_by_source.history"] == 60
    assert c["tokens.cached_by_source.history"] <= c["tokens.prompt_by_source.history"]
    assert c["blocks.hit_by_source.history"] == 1 and c["requests.history_hit"] == 1
    assert c["requests.prefix_hit"] == 1 and c["requests.prefix_miss"] == 1  # the first turn found nothing


def test_chained_blocks_count_hits_by_source_and_the_system_prompt_found(rig):
    life, cache, rec, bufs = rig
    lc = life()
    p = tokens(48, 8)
    spans = ((32, SYSTEM), (48, USER))
    lc.execute(request(p, tokens(1, 9), spans), bufs)
    lc.execute(request(p, tokens(1, 10), spans, seq=2), bufs)
    c = rec.counters()
    assert c["blocks.hit_by_source.system"] == 2 and c["blocks.hit_by_source.user"] == 1
    assert c["requests.system_hit"] == 1 and c["requests.system_miss"] == 1


def test_a_decode_node_checks_handed_over_blocks_against_the_digests_its_prefill_node_published(rig, tmp_path):
    """The prefill node takes each block's XXH3-64 as it publishes it, and the manifest line carries them; the
    decode node's checksum verification compares what it read with those, not with a payload it regenerates
    (a quarter of the CPU per block). A line without digests (0) falls back to comparing every byte, and so does a
    digest the bytes do not match (the key published again from another of its places in the payload pool is a
    whole payload and passes); a byte changed in the published file fails either way."""
    _, cache, rec, bufs = rig
    pool = PayloadPool(seed=1, span_bytes=1 << 20)
    opts = LifecycleOptions(BT, BPT, chain_root("test"), "checksum")
    folder = tmp_path / "shared"
    folder.mkdir()
    pre = FolderPublisher(str(folder), SHARED("buffered", BLOCK), "buffered", 16 * BLOCK, {"seed": 1})
    Lifecycle(cache, pool, rec, opts, handoff=pre).execute(request(tokens(40, 1), tokens(8, 2), ((40, USER),)), bufs)
    with open(pre.manifest) as f:
        h = Handoff.from_dict(json.loads(f.read().splitlines()[-1]))
    expected = [np.empty(n, np.uint8) for n in h.nbytes]
    for k, e in zip(h.keys, expected):
        pool.fill(k, e)
    assert len(h.keys) == 2 and h.digests == tuple(block_digest(e) for e in expected)
    dec = FolderLoader(str(folder), SHARED("buffered", BLOCK))
    other = (h.digests[0] ^ 1, h.digests[1])
    for digests, failures, damage in ((h.digests, 0, False), (other, 0, False), ((0, 0), 0, False),
                                      (h.digests, 1, True), ((0, 0), 1, False)):
        if damage:  # one byte of the first block's published file
            with open(next((folder / "kvbench-handoff" / "blocks").glob(f"{h.keys[0]:016x}*")), "r+b") as f:
                f.seek(PAGE + 100)
                byte = f.read(1)[0]
                f.seek(PAGE + 100)
                f.write(bytes([byte ^ 1]))
        drec = Recorder()
        drec.start_measuring(1)
        cache = BlockCache([CpuTier(8 * BLOCK, BLOCK)], LRUPolicy, True, drec)
        decode = Lifecycle(cache, pool, drec, opts, handoff=dec)
        decode.execute(replace(request(tokens(1, 0), tokens(1, 0), ((1, USER),)), handoff=replace(h, digests=digests)),
                       bufs)
        c = drec.counters()
        assert c["verification.blocks_checked"] == 2 and c.get("verification.failures", 0) == failures, digests
    dec.detach()
    pre.finish(0, True, print)


def test_a_handoffs_own_payload_work_is_kept_out_of_both_nodes_latencies(rig, tmp_path, monkeypatch):
    """The prefill node makes and hashes each block it publishes, the decode node verifies each it loads: a second
    each on the clock the lifecycle reads, and none of it in either node's TTFT or end-to-end latency."""
    _, cache, rec, bufs = rig
    clock, slow = _own_work_clock(monkeypatch)
    monkeypatch.setattr(space, "block_digest", slow(space.block_digest))
    pool = PayloadPool(seed=1, span_bytes=1 << 20)
    opts = LifecycleOptions(BT, BPT, chain_root("test"), "checksum")
    folder = tmp_path / "shared"
    folder.mkdir()
    pre = FolderPublisher(str(folder), SHARED("buffered", BLOCK), "buffered", 16 * BLOCK, {"seed": 1})
    due = dict(intended_ns=clock[0], dequeued_ns=clock[0])
    Lifecycle(cache, pool, rec, opts, handoff=pre).execute(
        replace(request(tokens(40, 1), tokens(8, 2), ((40, USER),)), **due), bufs)
    with open(pre.manifest) as f:
        h = Handoff.from_dict(json.loads(f.read().splitlines()[-1]))
    dec = FolderLoader(str(folder), SHARED("buffered", BLOCK))
    drec = Recorder()
    drec.start_measuring(1)
    decode = Lifecycle(BlockCache([CpuTier(8 * BLOCK, BLOCK)], LRUPolicy, True, drec), pool, drec, opts, handoff=dec)
    due = dict(intended_ns=clock[0], dequeued_ns=clock[0])
    decode.execute(replace(request(tokens(1, 0), tokens(1, 0), ((1, USER),)), handoff=h, **due), bufs)
    assert len(h.keys) == 2 and drec.counters()["verification.blocks_checked"] == 2 and clock[0] >= 4 * 10**9
    for node in (rec, drec):
        hists = node.snapshot().hists
        for latency in ("ttft", "e2e"):
            assert hists[C.request_hist(latency)].get_max_value() < 10**9, latency
    dec.detach()
    pre.finish(0, True, print)


def test_a_decode_node_never_writes_its_acknowledgements_through_a_link(tmp_path):
    """The acks file in the shared folder is this node's own new file: a link planted under its name is refused
    (a run fault naming the path), and what it points at is untouched."""
    from kv_cache.errors import RunFault
    from kv_cache.lifecycle.handoff.folder import FOLDER, FolderLoader

    (tmp_path / FOLDER / "blocks").mkdir(parents=True)
    dec = FolderLoader(str(tmp_path), SHARED("buffered", BLOCK))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / FOLDER / f"{dec.marker}.acks").symlink_to(victim)
    h = Handoff("1.1", (), (), (), (), 0, 0, BT, 0.0)
    with pytest.raises(RunFault, match="acknowledgements"):
        dec.loaded(h)
    assert victim.read_text() == "keep"
    dec.detach()


def test_a_decode_node_never_writes_its_markers_through_a_link(tmp_path, capsys):
    """Issue 52, item 2: the decode node's .done marker was opened with open(..., "w"): a link planted at its name
    truncated the file it points to, exit 0. Its .reading and .done markers are new files of its own: a link
    planted at either is refused (.reading: one sentence before the run) or said (.done: at the end), and what
    it points at is untouched."""
    from kv_cache.errors import UserError
    from kv_cache.lifecycle.handoff.folder import FOLDER, FolderLoader, mark_reading

    folder = tmp_path / FOLDER
    (folder / "blocks").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    dec = FolderLoader(str(tmp_path), SHARED("buffered", BLOCK))
    (folder / f"{dec.marker}.done").symlink_to(victim)
    dec.detach()
    assert victim.read_text() == "keep" and "planted" in capsys.readouterr().err
    (folder / f"{dec.marker}.done").unlink()
    (folder / f"{dec.marker}.reading").unlink()  # made by the loader above; now a link in its place
    (folder / f"{dec.marker}.reading").symlink_to(victim)
    with pytest.raises(UserError, match="planted at this decode node's marker"):
        mark_reading(str(folder))
    assert victim.read_text() == "keep"


@pytest.mark.parametrize("plant", ["zero", "fifo", "flood"])
def test_a_prefill_node_reads_acknowledgements_bounded_and_never_through_a_link(tmp_path, plant, capsys):
    """Issue 52, item 3: an .acks link to /dev/zero took a prefill node to 7 GiB (and a FIFO would hang its reader):
    an acks file is read from a regular file only, at most ACKS_READ bytes a poll, never through a link."""
    import resource

    from kv_cache.lifecycle.handoff.folder import ACKS_READ, FOLDER, FolderPublisher

    folder = tmp_path / "shared"
    folder.mkdir()
    pre = FolderPublisher(str(folder), SHARED("buffered", BLOCK), "buffered", 16 * BLOCK, {"seed": 1})
    acks = folder / FOLDER / "decode-x-1.acks"
    if plant == "zero":
        acks.symlink_to("/dev/zero")
    elif plant == "fifo":
        os.mkfifo(acks)
    else:
        acks.write_bytes(b"x" * (3 * ACKS_READ))  # no newline: not a decode node's lines
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(3):
        assert pre._new_acks(str(acks)) == []
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: no 7 GiB
    assert "is not a decode node's acknowledgements" in capsys.readouterr().err
    pre.finish(0, True, lambda *_: None)


def test_a_handoff_block_is_never_written_through_a_link_planted_at_its_private_name(tmp_path):
    """Issue 52, item 2: a block of the shared folder was created with O_TRUNC through whatever its private name
    was: a link planted there truncated the file it points to."""
    import threading

    from kv_cache.errors import RunFault

    blocks = SHARED("buffered", BLOCK)(str(tmp_path), 4 * BLOCK, "p1")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    key = 7
    (tmp_path / f"{key:016x}.kv.p1-{threading.get_ident()}.tmp").symlink_to(victim)
    with pytest.raises(RunFault, match="a link planted there"):
        blocks.put(key, np.zeros(BLOCK, np.uint8))
    assert victim.read_text() == "keep"
    blocks.close()
