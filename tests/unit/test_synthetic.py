"""Synthetic users: deterministic per seed, history as a real prefix, shared system prompts."""

import numpy as np
import pytest
from found import SECTIONS

from kv_cache.config import parse_mix, resolve
from kv_cache.errors import UserError
from kv_cache.sources.synthetic import make_users

S = resolve(None, [], {}, media_sections=SECTIONS)


def schedule(seed, users=5, turns=8):
    out = []
    for u in make_users(users, S.workload, S.profiles, seed):
        for _ in range(turns):
            r = u.next_request()
            out.append((r.user_id, r.seq, r.turn, r.prompt_tokens.tobytes(), r.output_tokens.tobytes(), r.think_s))
    return out


def test_same_seed_same_schedule_other_seed_other():
    assert schedule(1) == schedule(1)
    assert schedule(1) != schedule(2)


def test_a_user_does_not_depend_on_how_many_users_exist():
    few = make_users(3, S.workload, S.profiles, 9)[2]
    many = make_users(50, S.workload, S.profiles, 9)[2]
    for _ in range(5):
        a, b = few.next_request(), many.next_request()
        assert np.array_equal(a.prompt_tokens, b.prompt_tokens)


def test_each_turn_extends_the_previous_prompt_and_answer():
    user = make_users(1, S.workload, S.profiles, 3)[0]
    prev = user.next_request()
    follow_ups = 0
    for _ in range(40):
        r = user.next_request()
        if r.turn > 1:
            history = np.concatenate([prev.prompt_tokens, prev.output_tokens])
            assert np.array_equal(r.prompt_tokens[: history.size], history)
            assert ("history" in dict((lab, end) for end, lab in r.spans))
            follow_ups += 1
        prev = r
    assert follow_ups > 5


def test_conversations_start_with_a_shared_system_prompt():
    users = make_users(20, S.workload, S.profiles, 4)
    starts = {u.next_request().prompt_tokens[:256].tobytes() for u in users}
    assert len(starts) <= S.workload.num_system_prompts


def test_profiles_bound_the_lengths():
    for u in make_users(30, S.workload, S.profiles, 5):
        p = getattr(S.profiles, u.profile_name)
        for _ in range(5):
            r = u.next_request()
            assert r.num_prompt_tokens <= p.max_context_tokens
            assert p.output_tokens[0] <= r.num_output_tokens <= p.output_tokens[1]


@pytest.mark.parametrize("text,msg", [("chatbot=x", "must be a number"), ("robot=1", "not name=weight"),
                                      ("chatbot=0", "positive weight"), ("chatbot", "not name=weight")])
def test_bad_profile_mix(text, msg):
    with pytest.raises(UserError, match=msg):
        parse_mix(text, ("chatbot", "coding", "document"), "workload.profile_mix")


def test_rag_documents_are_cut_at_block_boundaries_and_recorded():
    s = resolve(None, ["rag.request_probability=1", "rag.num_documents=50"], {"rag.enabled": True},
                media_sections=SECTIONS)
    users = make_users(5, s.workload, s.profiles, 2, rag=s.rag, block_tokens=16)
    for u in users:
        r = u.next_request()
        assert len(r.docs) == s.rag.top_k
        for start, end, doc in r.docs:
            assert (end - start) % 16 == 0 and 0 <= doc < 50
        assert ("rag" in {label for _, label in r.spans})


def test_zipf_makes_the_first_system_prompt_the_most_popular():
    import numpy as np

    from kv_cache.sources.synthetic import SystemPrompts

    sp = SystemPrompts(8, (16, 32), 1000, 1, zipf=1.5)
    rng = np.random.default_rng(0)
    ids = {id(p): i for i, p in enumerate(sp.prompts)}
    picks = [ids[id(sp.pick(rng))] for _ in range(2000)]
    counts = np.bincount(picks, minlength=8)
    assert counts[0] > counts[1] > counts[7]


@pytest.mark.parametrize("sets", [
    {},
    {"workload.profile_mix": "chatbot=1", "profiles.chatbot.max_context_tokens": "900",
     "profiles.chatbot.context_tokens": "600,800", "profiles.chatbot.message_tokens": "200,300"},
    {"workload.system_prompt_tokens": "3000,4000", "profiles.chatbot.max_context_tokens": "2000"},
    {"rag.enabled": "true", "rag.request_probability": "1", "rag.document_tokens": "6000,8000",
     "workload.profile_mix": "chatbot=1"},
])
def test_no_user_s_history_outgrows_the_budget_s_bound(sets):
    """longest_history_bytes (the memory budget's per-user conversation) holds every history users make: follow-ups
    cut at the profile's context, answers at their longest, a system prompt past the context, RAG's documents."""
    from kv_cache.sources.synthetic import longest_history_bytes

    s = resolve(None, [], sets, media_sections=SECTIONS)
    bound = longest_history_bytes(s.workload, s.profiles, s.rag, 16)
    most = 0
    for u in make_users(40, s.workload, s.profiles, 6, rag=s.rag, block_tokens=16):
        for _ in range(30):
            u.next_request()
            most = max(most, u.history.nbytes)
    assert most <= bound, (most, bound)
    assert most > bound * 0.8  # a bound near what users reach, not any large number


def test_the_pre_run_sample_takes_each_user_in_turn_and_lets_it_go():
    """Round-robin over 5,000 users held every user's conversation at once (and each follow-up missed the planner's
    chain memo): the sample takes one user's first 20 requests, then the next's, and a user done with is freed."""
    import gc
    import weakref

    from found import REGISTRY

    from kv_cache.run.traffic import SYNTHETIC_SAMPLE_TURNS, build_traffic

    s = resolve(None, [], {"workload.users": "3"}, media_sections=SECTIONS)
    items = build_traffic(s, REGISTRY).analysis_items
    first = [next(items) for _ in range(SYNTHETIC_SAMPLE_TURNS)]
    assert {r.user_id for r in first} == {0} and [r.seq for r in first] == list(range(1, SYNTHETIC_SAMPLE_TURNS + 1))
    user = weakref.ref(items.gi_frame.f_locals["user"])
    nxt = next(items)
    assert nxt.user_id == 1 and nxt.seq == 1
    assert items.gi_frame.f_locals["user"].user_id == 1  # (and the frame's snapshot of its locals is the new one)
    gc.collect()
    assert user() is None  # user 0 and its conversation are gone
    assert sum(1 for _ in items) == 2 * SYNTHETIC_SAMPLE_TURNS - 1
