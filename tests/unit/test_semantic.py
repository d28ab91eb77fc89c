"""Semantic traffic and donor discovery: SemBench's transforms against SemBlend-style alignment.

Each test serves an item's donors (registering them) and then looks up its
recipient, with the exact prefix hits computed as a block cache holding the
donors' blocks would find them.
"""

from __future__ import annotations

import numpy as np
import pytest

from kv_cache.config import ProfileSettings, SemanticSettings
from kv_cache.lifecycle.donor_search import SemanticReuse
from kv_cache.lifecycle.donors import DonorStore, Windows, block_minhash, cover, make_donor
from kv_cache.lifecycle.plan import Planner
from kv_cache.lifecycle.sketch import ShingleSketch, block_hashes, window_hashes
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.semantic_metrics import semantic_section
from kv_cache.sources.textcorpus import TextCorpus
from kv_cache.sources.tokenizer import FallbackTokenizer
from kv_cache.sources.transforms import TRANSFORMS, fuzzy, make_semantic_users
from kv_cache.types import RequestOutcome

BT, VOCAB = 16, 100_000
PROFILE = ProfileSettings().document


def users(mix: str, n: int = 1, seed: int = 3, doc_tokens=(512, 2048)):
    return make_semantic_users(n, TextCorpus(doc_tokens), mix, FallbackTokenizer(VOCAB), seed, PROFILE, VOCAB)


def item(user) -> list:
    """The next item's requests: its donors, then its recipient."""
    out = [user.next_request()]
    while out[-1].semantic.role != "recipient":
        out.append(user.next_request())
    return out


class Served:
    """A donor store and the set of cached block keys, as after serving requests."""

    def __init__(self, **over):
        self.s = SemanticSettings(enabled=True, **over)
        self.reuse = SemanticReuse(self.s, BT, ShingleSketch(), Recorder())
        self.planner = Planner(BT, b"root")
        self.cached: set[int] = set()

    def serve(self, req):
        plan = self.planner.plan(req)
        n = plan.num_prompt_blocks
        exact = set()
        for i in range(n):  # the exact prefix: chained keys hit up to the first miss
            if plan.keys[i] not in self.cached:
                break
            exact.add(i)
        dplan = self.reuse.find(req, n, exact)
        loaded = {r for r, keys in dplan.reads.items() if all(k in self.cached for k in keys)}
        self.cached.update(plan.keys[i] for i in range(n) if i not in loaded)
        self.reuse.finish(req, plan, dplan, exact, loaded, RequestOutcome(req.num_prompt_tokens, 0))
        return n, exact, dplan, loaded


def recipient_of(transform: str, **over):
    served = Served(**over)
    reqs = item(users(f"{transform}=1")[0])
    for donor in reqs[:-1]:
        served.serve(donor)
    return served.serve(reqs[-1])


def test_negative_control_stays_cold():
    n, exact, dplan, loaded = recipient_of("negative_control")
    assert dplan.semantic == 0 and not dplan.reads and not loaded
    assert not dplan.found_intended
    assert len(exact) <= 2  # at most the shared wrapper's first blocks, an exact hit of instruction text


def test_exact_repeat_is_all_exact():
    n, exact, dplan, _ = recipient_of("exact_repeat")
    assert len(exact) == n and dplan.semantic == 0


def test_rag_reorder_has_no_prefix_but_high_chunk_reuse():
    n, exact, dplan, loaded = recipient_of("rag_reorder")
    assert len(exact) <= 3  # the shared wrapper only: the first record differs
    assert dplan.semantic >= 0.7 * n and len(loaded) == dplan.semantic
    assert dplan.found_intended


@pytest.mark.parametrize("name", ["instruction_variant", "same_evidence_new_task"])
def test_reworded_or_reordered_prompts_reuse_the_evidence(name):
    n, exact, dplan, loaded = recipient_of(name)
    assert len(exact) == 0 and dplan.semantic >= 0.7 * n and dplan.found_intended


def test_leading_evidence_is_an_exact_prefix():
    n, exact, dplan, _ = recipient_of("leading_evidence_new_task")
    assert len(exact) >= 0.9 * n


def test_multi_donor_composite_assembles_several_donors():
    n, exact, dplan, loaded = recipient_of("multi_donor_composite")
    assert dplan.accepted >= 2 and dplan.semantic >= 0.5 * n and dplan.found_intended


def test_fuzzy_edit_is_found_semantically_and_fuzzy_chunks_take_blocks():
    n, exact, dplan, _ = recipient_of("fuzzy_edit")
    assert len(exact) == 0 and dplan.found_intended  # no exact block, the donor found by similarity
    n, exact, dplan, _ = recipient_of("fuzzy_edit", fuzzy=True, min_reuse=0.0)
    assert dplan.fuzzy > 0.2 * n


def test_context_gate_drops_a_lone_chunk_in_the_wrong_place():
    rng = np.random.default_rng(1)
    donor_tokens = rng.integers(0, VOCAB, 40 * BT).astype(np.int32)
    donor = make_donor("d", None, "request", donor_tokens, np.arange(40, dtype=np.uint64), BT)
    recipient = rng.integers(0, VOCAB, 20 * BT).astype(np.int32)
    recipient[5 * BT:6 * BT] = donor_tokens[30 * BT:31 * BT]        # one lone block
    recipient[10 * BT + 3:13 * BT + 3] = donor_tokens[7 * BT:10 * BT]  # a run of three, shifted by 3 tokens
    c = cover(Windows(recipient, BT), 20, BT, donor, gate=True)
    assert c.covered[5] and not c.gated[5]
    assert c.gated[11] and c.reads[11] == (7, 8)  # straddles two donor blocks at one shift
    assert cover(Windows(recipient, BT), 20, BT, donor, gate=False).gated[5]  # kept without the gate


def test_window_hashes_are_position_free():
    t = np.random.default_rng(2).integers(0, VOCAB, 3000).astype(np.int32)
    shifted = np.concatenate([np.arange(7, dtype=np.int32), t])
    assert np.array_equal(window_hashes(t, 64), window_hashes(shifted, 64)[7:])
    assert np.array_equal(block_hashes(t, 64), window_hashes(t, 64)[::64][: t.size // 64])
    assert np.unique(window_hashes(t, 16)).size == t.size - 15


def test_corpus_sources_share_no_block_and_are_deterministic():
    corpus, tok = TextCorpus((512, 4096)), FallbackTokenizer(VOCAB)
    a, b = (np.asarray(tok.encode(corpus.document(s).context), dtype=np.int32) for s in (1, 2))
    assert not np.isin(block_hashes(a, BT), window_hashes(b, BT)).any()
    assert corpus.document(9) == TextCorpus((512, 4096)).document(9)
    assert corpus.domain_of(corpus.unrelated(5)) != corpus.domain_of(5)


def test_semantic_users_are_deterministic_and_draw_every_transform():
    one, two = users(",".join(f"{t}=1" for t in TRANSFORMS), 2), users(",".join(f"{t}=1" for t in TRANSFORMS), 2)
    seen = set()
    for _ in range(40):
        for u1, u2 in zip(one, two):
            r1, r2 = u1.next_request(), u2.next_request()
            assert r1.semantic == r2.semantic and np.array_equal(r1.prompt_tokens, r2.prompt_tokens)
            seen.add(r1.semantic.transform)
    assert seen == set(TRANSFORMS)


def test_fuzzy_rewrite_changes_every_sentence_end():
    assert fuzzy("One.  Two. Three\n\nfour.") == "One.\nTwo.\nThree four."


def test_donor_store_evicts_least_recently_used_and_cleans_its_chunk_index():
    store = DonorStore(4, 2, 256)
    tokens = [np.random.default_rng(i).integers(0, VOCAB, 8192).astype(np.int32) for i in range(3)]
    for i, t in enumerate(tokens):
        store.add(np.eye(4, dtype=np.float32)[i], make_donor(str(i), None, "request", t, np.zeros(32, np.uint64), 256))
    assert store.evicted == 1 and {d.rid for d in store.donors} == {"1", "2"}
    assert set(store.chunks.values()) <= {0, 1}
    assert not store.by_chunks(window_hashes(tokens[0], 256), np.zeros(4, np.float32), set(), 5)
    assert [d.rid for d, _ in store.by_chunks(window_hashes(tokens[2], 256), np.zeros(4, np.float32), set(), 5)] \
        == ["2"]


def test_minhash_of_identical_blocks_agrees():
    t = np.tile(np.arange(32, dtype=np.int32), 2)
    sig, distinct = block_minhash(t, 32)
    assert np.array_equal(sig[0], sig[1]) and list(distinct) == [32, 32]


def test_rates_over_no_recipient_are_null_not_zero():
    rec = Recorder()
    rec.start_measuring()
    settings = {"semantic": {**SemanticSettings(enabled=True).__dict__}}
    sem = semantic_section(rec.snapshot(), settings, ["cpu"])
    assert sem["overall"]["semantic_eligible_block_rate"] is None
    assert sem["negative_control_semantic_eligible_rate"] is None


def test_memory_budget_counts_the_donor_store():
    from found import REGISTRY, SECTIONS

    from kv_cache.config import resolve
    from kv_cache.run.geometry import geometry
    from kv_cache.run.sizing import memory_budget

    off = resolve(None, [], {}, media_sections=SECTIONS)
    on = resolve(None, [], {"semantic.enabled": True}, media_sections=SECTIONS)
    def budget(x):
        return memory_budget(x, geometry(x), REGISTRY)

    # 10,000 donors of up to ~20K tokens in 256-token blocks: tens of MiB, counted before the run (semantic traffic's
    # users are texts, not synthetic users' conversations: those leave the budget)
    extra = budget(on).donor_store_bytes
    assert budget(on).total_bytes - budget(off).total_bytes == extra - budget(off).traffic_bytes
    assert 20 << 20 < extra < 200 << 20 and budget(on).traffic_bytes == 0 < budget(off).traffic_bytes


def test_a_donor_found_by_its_chunks_counts_as_recently_used():
    store = DonorStore(4, 2, 256)
    tokens = [np.random.default_rng(10 + i).integers(0, VOCAB, 8192).astype(np.int32) for i in range(3)]
    keys = np.zeros(32, np.uint64)
    for i in range(2):
        store.add(np.eye(4, dtype=np.float32)[i], make_donor(str(i), None, "r", tokens[i], keys, 256))
    assert store.by_chunks(window_hashes(tokens[0], 256), np.zeros(4, np.float32), set(), 5)  # donor 0 used now
    store.add(np.eye(4, dtype=np.float32)[2], make_donor("2", None, "r", tokens[2], keys, 256))
    assert {d.rid for d in store.donors} == {"0", "2"}  # donor 1 was the least recently used
