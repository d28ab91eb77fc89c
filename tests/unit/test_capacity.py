"""The capacity curve (recorder/stack_distances.py): exact LRU stack distances, against a plain LRU stack."""

from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_cache.recorder.access_log import AccessLog
from kv_cache.recorder.stack_distances import COLUMNS, INF, curve, stack_distances


def naive(requests: list[list[int]]) -> list[int]:
    """Distances against the stack as each request found it, then its blocks moved to the top in order."""
    stack: OrderedDict[int, None] = OrderedDict()  # most recent last
    out = []
    for keys in requests:
        order = list(reversed(stack))
        for k in keys:
            out.append(order.index(k) + 1 if k in stack else INF)
        for k in keys:
            stack.pop(k, None)
            stack[k] = None
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True), min_size=1, max_size=80))
def test_stack_distances_are_those_of_an_lru_stack(requests):
    keys = np.array([k for r in requests for k in r], np.uint64)
    starts = np.cumsum([0] + [len(r) for r in requests[:-1]])
    assert list(stack_distances(keys, np.array(starts))) == naive(requests)


def test_long_traces_cross_chunks():
    rng = np.random.default_rng(1)
    requests = [list(dict.fromkeys(rng.zipf(1.3, 30) % 500)) for _ in range(200)]
    keys = np.array([k for r in requests for k in r], np.uint64)
    starts = np.cumsum([0] + [len(r) for r in requests[:-1]])
    assert list(stack_distances(keys, np.array(starts))) == naive(requests)


def test_a_prefix_hits_as_a_prefix_and_the_curve_rises_to_the_infinite_hit_rate():
    log = AccessLog()
    tok = (16,) + (0,) * (len(COLUMNS) - 1)
    for _ in range(3):
        for chain in ([1, 2, 3, 4], [1, 2, 5, 6]):  # a shared root, two branches
            prompt = [(k, tok, p, "user") for k, p in zip(chain, [0, *chain[:-1]])]
            log.request(prompt, ((0, len(chain), False),), [], 64, 1)
    a = log.arrays()
    c = curve(a, 0, np.array([0, 2, 4, 6, 100]))
    assert list(c.hit_rate) == sorted(c.hit_rate) and c.hit_rate[0] == 0
    assert c.hit_rate[-1] == c.infinite == (32 + 4 * 64) / (6 * 64)  # the 2nd request hits the shared root


def test_every_source_label_has_its_own_column_in_the_access_log():
    """Issue 50, point 4: rag_chunk and template tokens landed in the curve's "other" column (its source list was
    spelled apart from the plan's); each of types.SOURCES now has its own."""
    from kv_cache.lifecycle.by_source import source_tokens
    from kv_cache.types import OTHER, SOURCES

    for label in SOURCES:
        row = source_tokens([(label, 5)])
        assert row[COLUMNS.index(label)] == 5 and row[COLUMNS.index(OTHER)] == 0, label
    assert source_tokens([("made-up", 3)])[COLUMNS.index(OTHER)] == 3


def test_the_ceiling_counts_a_prefix_seen_before_and_stops_past_its_bound():
    """lifecycle/ceiling.py: a request's prompt blocks planned by any earlier request, up to the first miss; past its
    bound on distinct blocks it judges nothing more (None: the run's ceiling is then not reported)."""
    from kv_cache.lifecycle.ceiling import Ceiling
    from kv_cache.lifecycle.plan import Planner
    from kv_cache.types import SYSTEM, USER, Request

    planner = Planner(16, b"root")

    def req(tokens: list[int], session: int) -> Request:
        prompt = np.array(tokens, np.int32)
        return Request(0, session, 1, prompt, np.zeros(16, np.int32), ((32, SYSTEM), (prompt.size, USER)))

    first, second = req(list(range(64)), 1), req(list(range(32)) + [7] * 32, 2)
    ceiling = Ceiling(max_blocks=10)
    assert ceiling.tokens(first, planner.plan(first)) == 0
    assert ceiling.tokens(second, planner.plan(second)) == 32  # the shared 32-token system prompt: two blocks
    third = req(list(range(1000, 1200)), 3)
    assert ceiling.tokens(third, planner.plan(third)) == 0 and ceiling.full  # 13 blocks passed the bound of 10
    assert ceiling.tokens(first, planner.plan(first)) is None


def _chains(log: AccessLog, requests: int, seed: int = 3, gap_ns: int = 1) -> None:
    """requests of 8-block chains over a shared head and a long tail of distinct blocks, one every gap_ns."""
    rng = np.random.default_rng(seed)
    tok = (16,) + (0,) * (len(COLUMNS) - 1)
    for r in range(requests):
        chain = [1 + int(rng.integers(0, 4)), *(1000 + int(x) for x in rng.integers(0, 50_000, 7))]
        prompt = [(k, tok, p, "user") for k, p in zip(chain, [0, *chain[:-1]])]
        log.request(prompt, ((0, len(chain), False),), [(900_000 + r, chain[-1], "generated")], 128, r * gap_ns)


def test_the_access_log_stays_within_its_bound_as_a_shards_sample_of_the_whole():
    """Issue 52, point 7: the log grew with the run (about 30 B an access, without end). Past its bound it keeps the
    blocks SHARDS keeps (the hash sample() uses), halving its rate as it fills, and every request's lookup tokens
    whole: exactly the whole log sampled at its final rate."""
    from kv_cache.recorder.stack_distances import sample

    whole, bounded = AccessLog(), AccessLog(limit=2_000)
    _chains(whole, 3_000)
    _chains(bounded, 3_000)
    a, b = whole.arrays(), bounded.arrays()
    rate = float(b["sample_rate"])
    assert len(a["keys"]) > 26_000 and len(b["keys"]) <= 2_000 and rate < 1.0 and float(a["sample_rate"]) == 1.0
    expected = sample(a, rate)
    for k in ("keys", "parents", "lookup", "tokens"):
        assert np.array_equal(b[k], expected[k]), k
    assert len(b["plan_pos"]) == len(b["labels"]) == len(b["keys"])
    looked = np.zeros_like(a["request_tokens"])
    req_of = np.searchsorted(a["requests"][:, 0], np.arange(len(a["keys"])), side="right") - 1
    np.add.at(looked, req_of[a["lookup"]], a["tokens"][a["lookup"]])
    assert np.array_equal(a["request_tokens"], looked)
    heads = np.concatenate([[0], np.cumsum(b["request_counts"])[:-1]])  # a row: its requests, folded (the next test)
    assert np.array_equal(b["requests"][:, 2], expected["requests"][heads, 2])
    assert np.array_equal(b["request_tokens"], np.add.reduceat(looked, heads))


def test_a_sampled_log_folds_the_requests_it_keeps_no_access_of_and_its_curve_is_unchanged(monkeypatch):
    """Issue 52, point 7: past its bound the log still kept 60 B for every request (about 0.5 GiB a day at 100
    requests/s, outside the memory budget). A request none of whose blocks the sample keeps is folded into the row
    before it (never across the window's start): the rows stay within the accesses kept plus a slack, and the
    curve, its window's request count and its SHARDS adjustment are those of the whole log sampled at that rate."""
    from kv_cache.recorder import access_log
    from kv_cache.recorder.stack_distances import curve, request_counts, sample

    monkeypatch.setattr(access_log, "FOLD_SLACK", 200)
    gap = 50_000_000  # a request every 50 ms: 12,000 of them over 10 minutes
    whole, bounded = AccessLog(), AccessLog(limit=1_000)
    start = 3_000 * gap + gap // 2  # the window opens a quarter of the way in
    for log in (whole, bounded):
        log.cut(start)
    peak = 0
    rng = np.random.default_rng(5)
    tok = (16,) + (0,) * (len(COLUMNS) - 1)
    for r in range(12_000):
        chain = [1 + int(rng.integers(0, 4)), *(1000 + int(x) for x in rng.integers(0, 50_000, 3))]
        prompt = [(k, tok, p, "user") for k, p in zip(chain, [0, *chain[:-1]])]
        for log in (whole, bounded):
            log.request(prompt, ((0, len(chain), False),), [], 64, r * gap)
        peak = max(peak, len(bounded.counts) - len(bounded.keys))
    a, b = whole.arrays(), bounded.arrays()
    rate = float(b["sample_rate"])
    assert rate < 0.2 and len(b["keys"]) <= 1_000
    assert peak <= 200 + 10_000_000_000 // gap + 2  # the slack, the unsettled last 10 s, the window's side
    assert len(b["requests"]) <= len(b["keys"]) + 2 < 12_000 // 4  # folded at the end: a row per kept access
    assert int(b["request_counts"].sum()) == 12_000 and int(request_counts(a).sum()) == 12_000
    grid, window = np.arange(0, 4000, 200), (start, None)
    got = curve(b, 10, grid, window)
    want = curve(sample(a, rate) | {"request_tokens": a["request_tokens"], "sample_rate": np.array(rate)}, 10, grid,
                 window)
    assert got.requests == want.requests == 8_999  # requests 3,001 to 11,999 completed in the window
    assert np.allclose(got.hit_rate, want.hit_rate) and np.isclose(got.infinite, want.infinite)
    assert all(np.allclose(got.by_source[k], want.by_source[k]) for k in want.by_source)


def test_the_ceiling_s_key_set_answers_as_a_python_set_does():
    """lifecycle/ceiling.py's KeySet (8 bytes a key, where a set of ints took about 100): membership and an exact
    count through merges, keys added again (before and after a merge) and keys past 2^63."""
    import random

    from kv_cache.lifecycle.ceiling import KeySet

    rng = random.Random(5)
    keys, ref = KeySet(merge_at=64), set()
    for step in range(400):
        add = [rng.getrandbits(64) for _ in range(rng.randrange(0, 40))]
        add += rng.sample(sorted(ref), min(len(ref), rng.randrange(0, 6)))  # held already, merged or not
        merged = keys.update(add)
        ref.update(add)
        if merged:  # what merged is counted once, however often it was added
            assert keys._sorted.size == len(ref) and not keys._recent
        if step % 25 == 0:
            assert len(keys) == len(ref)
    assert len(keys) == len(ref) > 2000
    assert all(k in keys for k in ref)
    assert not any(rng.getrandbits(64) in keys for _ in range(5000))
    assert 2**64 - 1 not in keys and 0 not in keys
    keys.update([2**64 - 1, 0])
    assert 2**64 - 1 in keys and 0 in keys and len(keys) == len(ref) + 2


def test_the_pre_run_analysis_stops_at_its_bound_of_distinct_blocks():
    """Unbounded, the infinite cache of 5,000 synthetic users' samples took 1.3 GiB: the sample ends once the
    blocks it holds pass the bound, and says how many requests it analysed."""
    from kv_cache.lifecycle.analysis import analyse
    from kv_cache.lifecycle.plan import Planner
    from kv_cache.types import USER, Request

    class Plans:
        block_tokens = 16
        plan = Planner(16, b"root").plan

    reqs = [Request(0, k, 1, np.arange(k * 64, k * 64 + 64, dtype=np.int32), np.zeros(16, np.int32),
                    ((64, USER),)) for k in range(10)]  # 5 new blocks each (4 of the prompt, 1 of the answer)
    assert analyse(iter(reqs), Plans())["requests_analysed"] == 10
    bounded = analyse(iter(reqs), Plans(), max_blocks=12)
    assert bounded["requests_analysed"] == 3 and bounded["prompt_tokens"]["count"] == 3  # the third passed 12


def test_requests_are_taken_in_the_order_they_looked_the_cache_up():
    """A request is logged when it completes. A long request A looked up block 1 (written by an earlier one) before B
    flooded a 2-slot cache, and completed after it: taken in completion order its hit was a miss."""
    log = AccessLog()
    tok = (16,) + (0,) * (len(COLUMNS) - 1)

    def request(chain, done_ns, started_ns):
        prompt = [(k, tok, p, "user") for k, p in zip(chain, [0, *chain[:-1]])]
        log.request(prompt, ((0, len(chain), False),), [], 16 * len(chain), done_ns, started_ns)

    request([1], done_ns=10, started_ns=0)
    request([7, 8, 9], done_ns=30, started_ns=20)  # B: started after A, done first
    request([1], done_ns=40, started_ns=15)  # A
    a = log.arrays()
    assert list(a["request_started"]) == [0, 15, 20] and list(a["requests"][:, 2]) == [10, 40, 30]
    assert list(a["keys"]) == [1, 1, 9, 8, 7] and list(a["requests"][:, 0]) == [0, 1, 2]
    c = curve(a, 0, np.array([2]))
    assert c.hit_rate[0] == 16 / (16 + 16 + 48)  # A's block 1 hits at 2 slots: its lookup came before B's writes


def test_the_curve_at_the_run_s_capacity_is_held_against_what_the_run_measured():
    """4 workers over 76 slots with prompts of up to 123 blocks (31,572 tokens): the curve read 31 % where the run
    measured 48 %, and nothing said so. The summary puts them side by side, and says why where they differ by more
    than a point."""
    import dataclasses

    from found import POLICIES
    from results_fixture import results

    from kv_cache.report.capacity import capacity_lines
    from kv_cache.run.capacity_curve import section

    log = AccessLog()
    _chains(log, 40)
    meta = {"upper_slots": 0, "slot_bytes": 2 << 20, "run_slots": 16, "window_ns": [0, 0], "window_s": 1.0,
            "requests_per_s": 40.0, "policy": "lru", "wall_minus_monotonic_ns": 0}
    r = results()  # it measured 50.0 % (16 of 32 prompt tokens)
    r.capacity_curve = section(log.arrays(), meta, POLICIES)
    here = next(p for p in r.capacity_curve.points if p.slots == 16).hit_rate
    said = " ".join(" ".join(capacity_lines(r)).split())
    assert f"at this run's capacity the curve reads {here:.1%}; the run measured 50.0%" in said
    assert "points" not in said  # one worker: the curve is exact, a gap is the run's own
    r.run = dataclasses.replace(r.run, workers=4)
    said = " ".join(" ".join(capacity_lines(r)).split())
    side = "above" if here < 0.5 else "below"
    assert f"{abs(0.5 - here) * 100:.1f} points {side} it" in said and "4 workers'" in said
    assert "the run measured" not in " ".join(capacity_lines(r, own=False))  # merged runs: not this run's measure


def test_how_far_from_their_arrival_order_the_requests_were_served():
    """Mooncake's trace at --trace-speedup 1000 queued all of it, served by QoS priority: the curve (of the order the
    requests looked the cache up) put its 90 % knee at 96,549 blocks where the trace's own order needs 30,825, and
    nothing said the order was not the trace's."""
    from kv_cache.recorder.stack_distances import served_order

    tok = (16,) + (0,) * (len(COLUMNS) - 1)

    def log_of(arrivals: list[int]):
        log = AccessLog()
        for n, arrived in enumerate(arrivals):  # dequeued in this order, each at n (looked up in reverse: no matter)
            log.request([(100 + n, tok, 0, "user")], ((0, 1, False),), [], 16, 1000 + n, 99 - n, (arrived, n))
        return log.arrays()

    in_order = served_order(log_of(list(range(20))), (0, None), 4)
    assert (in_order.requests, in_order.late_requests, in_order.most_places_late) == (20, 0, 0)
    assert served_order(log_of([7] * 20), (0, None), 4).late_requests == 0  # arrived together: no order to leave
    jitter = served_order(log_of([1, 0, 3, 2, 5, 4, 6, 7]), (0, None), 4)  # workers overtaking each other
    assert jitter.late_requests == 0 and jitter.most_places_late == 1
    # the first 10 arrivals (a low priority) served after the 10 that arrived behind them
    behind = served_order(log_of(list(range(10, 20)) + list(range(10))), (0, None), 4)
    assert (behind.late_requests, behind.most_places_late) == (10, 10)
    assert served_order(log_of(list(range(10, 20)) + list(range(10))), (1015, None), 4).requests == 5  # its window


def test_the_summary_says_the_order_served_where_it_left_the_arrivals():
    from dataclasses import replace

    from results_fixture import results

    from kv_cache.recorder.stack_distances import CapacityCurve, ServedOrder
    from kv_cache.report.capacity import capacity_lines

    r = results()
    c = CapacityCurve("LRU stack distances", False, 1.0, "lru", 0, 2 << 20, 12_031, 197.9, 16, 0.373, 9, 12, "-", [])
    for order, said in ((None, False), (ServedOrder(4, 12_031, 0, 3), False), (ServedOrder(4, 12_031, 100, 40), False),
                        (ServedOrder(4, 12_031, 6_856, 5_922), True)):
        r.capacity_curve = replace(c, served_order=order)
        text = " ".join(" ".join(capacity_lines(r)).split())
        assert ("6,856 of the 12,031 requests (57%) left the queue more than 4 places" in text) == said, text
        assert ("--qos-mix batch=100" in text) == said
    r.capacity_curve = replace(c, served_order=ServedOrder(4, 12_031, 6_856, 5_922, 30_745, 83_450, 0.0459))
    text = " ".join(" ".join(capacity_lines(r)).split())
    assert ("the same requests in arrival order (LRU): 90 % of the infinite cache's hit rate from 30,745 blocks = "
            "60.05 GiB, 99 % from 83,450 blocks = 162.99 GiB, at this run's capacity 4.6%") in text, text


def test_a_curve_of_requests_served_out_of_order_gives_the_arrival_order_s_beside_it():
    """Where the queue left the arrival order, the curve in arrival order is computed beside it: exactly the curve
    of a log whose requests were served as they arrived (the README's command with one QoS class read 30,826 blocks
    at its 90 % knee, the arrival order of the three-class run's own log 30,745)."""
    from found import POLICIES

    from kv_cache.recorder.stack_distances import capacity_grid
    from kv_cache.run.capacity_curve import section

    tok = (16,) + (0,) * (len(COLUMNS) - 1)
    convs = [[1 + c * 1000 + k for k in range(6)] for c in range(30)]  # 30 conversations, a turn adds a block
    requests = [(c, t) for t in range(1, 7) for c in range(30)]  # arrival order: each round of turns in turn
    served = sorted(range(len(requests)), key=lambda n: (n % 3, n))  # a queue by priority: a third of them first

    def log_of(order: list[int]) -> dict:
        log = AccessLog()
        for pos, n in enumerate(order):
            c, t = requests[n]
            chain = convs[c][:t]
            prompt = [(k, tok, p, "user") for k, p in zip(chain, [0, *chain[:-1]])]
            log.request(prompt, ((0, t, False),), [], 16 * t, 10_000 + pos, pos, (n, pos))
        return log.arrays()

    meta = {"upper_slots": 0, "slot_bytes": 2 << 20, "run_slots": 40, "window_ns": [0, 0], "window_s": 1.0,
            "requests_per_s": 1.0, "policy": "lru", "wall_minus_monotonic_ns": 0, "workers": 1}
    out_of_order = section(log_of(served), meta, POLICIES)
    o = out_of_order.served_order
    assert o.late and o.arrival_knee_90_slots is not None
    in_arrival = log_of(list(range(len(requests))))
    grid = np.union1d(capacity_grid(in_arrival, 0), [40])
    truth = curve(in_arrival, 0, grid, (0, None), with_knees=True)
    assert (o.arrival_knee_90_slots, o.arrival_knee_99_slots) == truth.knees
    assert o.arrival_hit_rate_at_run == truth.hit_rate[np.searchsorted(truth.capacities, 40)]
    assert (out_of_order.knee_90_slots, out_of_order.knee_99_slots) != truth.knees  # the order served differs
    assert section(in_arrival, meta, POLICIES).served_order.arrival_knee_90_slots is None  # none late: no second
