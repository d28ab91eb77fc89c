"""QoS classes, the priority queue and steady-state detection."""

from __future__ import annotations

from collections import Counter

from kv_cache.config import QosSettings
from kv_cache.recorder.results import steady_state
from kv_cache.scheduler.qos import PriorityRequests, QosPolicy
from kv_cache.types import Request


def _req(qos: str, intended: int) -> Request:
    r = Request(0, 0, 0, None, None, (), qos=qos)
    r.intended_ns = intended
    return r


def test_classes_follow_the_mix_and_the_seed():
    p = QosPolicy(QosSettings(mix="interactive=1,responsive=1,batch=2", assign="request"), seed=3)
    drawn = Counter(p.classify(u, s) for u in range(100) for s in range(40))
    assert abs(drawn["batch"] / 4000 - 0.5) < 0.03 and abs(drawn["interactive"] / 4000 - 0.25) < 0.03
    again = QosPolicy(QosSettings(mix="interactive=1,responsive=1,batch=2", assign="request"), seed=3)
    assert [p.classify(u, 1) for u in range(50)] == [again.classify(u, 1) for u in range(50)]
    per_user = QosPolicy(QosSettings(assign="user"), seed=3)
    assert all(len({per_user.classify(u, s) for s in range(20)}) == 1 for u in range(20))


def test_the_queue_serves_priority_first_then_intended_start():
    q = PriorityRequests({"interactive": 3, "responsive": 2, "batch": 1})
    for qos, t in (("batch", 1), ("responsive", 5), ("interactive", 9), ("batch", 0), ("interactive", 2)):
        q.put(_req(qos, t))
    q.put(None)
    got = [q.get() for _ in range(6)]
    assert [(r.qos, r.intended_ns) for r in got[:5]] == [("interactive", 2), ("interactive", 9), ("responsive", 5),
                                                         ("batch", 0), ("batch", 1)]
    assert got[5] is None


def _rows(values):
    return [{"t_s": i, "requests": v, "tokens_prompt": 10 * v} for i, v in enumerate(values)] + [{"t_s": 99,
                                                                                                "requests": 0,
                                                                                                "tokens_prompt": 0}]


def test_steady_state_is_found_after_a_ramp_and_not_in_noise():
    st = steady_state(_rows([1, 5, 20, 50, 98, 100, 101, 99, 100, 102]), 0.05, 4)
    assert st["detected"] and st["from_s"] == 4 and abs(st["requests_per_s"] - 100) < 1.5
    assert not steady_state(_rows([10, 100, 10, 100, 10, 100]), 0.05, 3)["detected"]
    assert steady_state(_rows([1, 2, 3]), 0.0, 3) is None
